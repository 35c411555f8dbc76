package main

// One model server's process: started under `vmmw exec` with its control
// socket in the service's private directory, its output prefixed into the
// service's log, health-checked, and stopped with SIGTERM then SIGKILL.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// process is one running server. exited is closed once it has exited and
// err says how; stopping is set before the service stops it on purpose.
type process struct {
	cmd      *exec.Cmd
	exited   chan struct{}
	err      error
	mu       sync.Mutex
	stopping bool
}

// startProcess runs cfg's command under `vmmw exec` with its control socket
// at socket; onExit is called once when it exits (with whether the service
// asked it to).
func startProcess(vmmwBin, socket string, cfg *ServerConfig, logger *log.Logger, onExit func(p *process, requested bool)) (*process, error) {
	os.Remove(socket) // a socket left by an earlier run of the same server
	args := append([]string{"exec", "--socket", socket, "--tag", cfg.ID, "--"}, cfg.Args...)
	cmd := exec.Command(vmmwBin, args...)
	cmd.Env = append(os.Environ(), cfg.Env...)
	// Its own process group: SIGTERM and SIGKILL reach the server and
	// anything it started, and a Ctrl-C at the terminal reaches only the service.
	// Pdeathsig: a service killed outright (SIGKILL, OOM) takes its servers
	// with it rather than leaving them holding device memory.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", vmmwBin, err)
	}
	p := &process{cmd: cmd, exited: make(chan struct{})}
	var copied sync.WaitGroup
	copied.Add(2)
	go prefixLines(logger, cfg.ID, stdout, &copied)
	go prefixLines(logger, cfg.ID, stderr, &copied)
	go func() {
		copied.Wait()
		p.err = cmd.Wait()
		close(p.exited)
		p.mu.Lock()
		requested := p.stopping
		p.mu.Unlock()
		onExit(p, requested)
	}()
	return p, nil
}

func prefixLines(logger *log.Logger, id string, r io.Reader, done *sync.WaitGroup) {
	defer done.Done()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		logger.Printf("[%s] %s", id, sc.Text())
	}
	// A line past 1 MiB stops the scanner; keep draining so the child never blocks.
	io.Copy(io.Discard, r)
}

// pid is the process the service started: `vmmw exec`, the server's parent.
func (p *process) pid() int { return p.cmd.Process.Pid }

// alive says whether the process has not exited.
func (p *process) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// exitText says how the process ended.
func (p *process) exitText() string {
	if p.err == nil {
		return "exited with status 0"
	}
	return p.err.Error()
}

// stop sends SIGTERM to the process group, and SIGKILL after grace.
func (p *process) stop(grace time.Duration) {
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
	pgid := p.cmd.Process.Pid
	if !p.alive() {
		return
	}
	// SIGTERM to `vmmw exec` alone: it passes it on to the server once (a
	// second SIGTERM makes llama-server exit at once, skipping its cleanup).
	syscall.Kill(pgid, syscall.SIGTERM)
	select {
	case <-p.exited:
		return
	case <-time.After(grace):
	}
	syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.exited
}

// errExited is a cold start's failure when the process ended before it was healthy.
var errExited = errors.New("the server exited")

// waitHealthy polls cfg's checkEndpoint until it answers 200, then waits
// for the control socket to answer a status. It fails when the process
// exits or timeout passes.
func waitHealthy(ctx context.Context, p *process, cfg *ServerConfig, ctl *Control, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: 5 * time.Second}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	healthy := cfg.CheckEndpoint == ""
	last := "no answer yet"
	for {
		if !healthy {
			u := *cfg.Proxy
			u.Path = cfg.CheckEndpoint
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
			if resp, err := client.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				healthy = resp.StatusCode == http.StatusOK
				last = fmt.Sprintf("%s answered %s", cfg.CheckEndpoint, resp.Status)
			} else {
				last = err.Error()
			}
		}
		if healthy {
			cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := ctl.Status(cctx)
			ccancel()
			if err == nil {
				return nil
			}
			last = "the control socket: " + err.Error()
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%w during its start (%s)", errExited, p.exitText())
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return fmt.Errorf("start abandoned: the service is shutting down")
			}
			return fmt.Errorf("not healthy within %s: %s", timeout, last)
		case <-tick.C:
		}
	}
}
