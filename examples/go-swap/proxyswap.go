package main

// One swap's steps: the sleeps and the wake (or cold start) issued together,
// each server's process started, stopped, or noticed exiting.

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// swap drains the victims, makes room in the host budget, then sleeps the
// victims while target wakes (or starts cold). Caller holds mu; it is
// released while the swap waits on the servers.
func (p *Proxy) swap(target *Server, victims []*Server, rec *SwapRecord) *APIError {
	t0 := time.Now()
	for _, v := range victims {
		for v.inflight > 0 && !p.closed {
			p.cond.Wait()
		}
	}
	if p.closed {
		return closedError()
	}
	rec.DrainSeconds = time.Since(t0).Seconds()
	if p.pause != nil {
		pause := p.pause
		p.flight.Phase = "paused"
		p.mu.Unlock()
		<-pause
		p.mu.Lock()
	}
	p.mu.Unlock()
	p.refresh(victims)
	p.mu.Lock()
	stopInstead := p.makeRoom(target, victims, rec)

	cold := target.proc == nil || !target.proc.alive()
	var sleeps []*Server
	for _, v := range victims {
		if stopInstead[v] || v.state != StateAwake {
			continue // stopped for the budget, or crashed while draining
		}
		v.state, v.phase = StateSwapping, "sleeping"
		sleeps = append(sleeps, v)
	}
	if cold {
		p.flight.Phase = "sleeping"
	} else {
		target.state, target.phase = StateSwapping, "waking"
		p.flight.Phase = "sleeping+waking"
	}
	p.mu.Unlock()
	p.event(fmt.Sprintf("swap %d to %s: start", rec.ID, target.cfg.ID))

	swapStart := time.Now()
	var wg sync.WaitGroup
	results := make([]SleepResult, len(sleeps))
	for i, v := range sleeps {
		wg.Add(1)
		go func(i int, v *Server) {
			defer wg.Done()
			results[i] = p.sleepServer(v)
		}(i, v)
	}
	for _, v := range victims {
		if stopInstead[v] {
			wg.Add(1)
			go func(v *Server) {
				defer wg.Done()
				p.stopServer(v, StateCold, "stopped for the host memory budget instead of sleeping")
			}(v)
		}
	}
	var wake *WakeResult
	if !cold {
		wake = p.wakeServer(target)
	}
	wg.Wait()
	rec.Slept = results
	for _, r := range results {
		rec.SleepSeconds = maxf(rec.SleepSeconds, r.Seconds)
		rec.SleepBytes += r.Bytes
	}
	if wake != nil && wake.Error != "" && wake.crashed {
		// It died asleep: start it cold now that the victims' memory is free.
		rec.WakeFailed = wake
		wake = nil
		cold = true
	}
	if cold {
		p.mu.Lock()
		p.flight.Phase = "starting"
		p.mu.Unlock()
		wake = p.coldStart(target)
	}
	rec.Wake = wake
	rec.SwapSeconds = time.Since(swapStart).Seconds()
	rec.TotalSeconds = time.Since(t0).Seconds()
	if wake.Error == "" {
		// The held requests go first; the bookkeeping below can wait.
		p.mu.Lock()
		p.admitReady()
		p.mu.Unlock()
	}
	if p.cfg.LinkBytesPerSecond > 0 {
		rec.LinkSeconds = float64(maxu(rec.SleepBytes, wake.Bytes)) / p.cfg.LinkBytesPerSecond
	}
	p.refresh(append([]*Server{target}, victims...))
	p.mu.Lock()
	p.enforceBudget(target, rec)
	p.mu.Unlock()
	p.event(fmt.Sprintf("swap %d to %s: done", rec.ID, target.cfg.ID))
	p.mu.Lock()
	if wake.Error != "" {
		return &APIError{HTTP: http.StatusBadGateway, Code: "SWAP_FAILED", Model: target.cfg.ID, Phase: wake.Kind,
			Message: fmt.Sprintf("model %q could not be made awake: %s", target.cfg.ID, wake.Error)}
	}
	return nil
}

// SleepResult is one victim's sleep in a swap.
type SleepResult struct {
	Model       string  `json:"model"`
	Policy      string  `json:"policy"`
	Seconds     float64 `json:"seconds"`
	SyncSeconds float64 `json:"sync_seconds"`
	Bytes       uint64  `json:"bytes"`
	CopiedBytes uint64  `json:"copied_bytes"`
	BackupBytes uint64  `json:"backup_bytes"`
	Error       string  `json:"error,omitempty"`
}

// WakeResult is the target's wake (or cold start) in a swap.
type WakeResult struct {
	Model   string  `json:"model"`
	Kind    string  `json:"kind"` // wake or cold_start
	Reason  string  `json:"reason,omitempty"`
	Seconds float64 `json:"seconds"`
	// WaitSeconds is the wake's wait for memory the sleep was releasing.
	WaitSeconds float64 `json:"wait_seconds"`
	Bytes       uint64  `json:"bytes"`
	CopiedBytes uint64  `json:"copied_bytes"`
	Error       string  `json:"error,omitempty"`
	crashed     bool
}

func (p *Proxy) sleepServer(v *Server) SleepResult {
	p.mu.Lock()
	r := SleepResult{Model: v.cfg.ID, Policy: v.policy}
	proc := v.proc
	p.mu.Unlock()
	t := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.SwapTimeout)
	ans, err := v.ctl.Sleep(ctx, r.Policy)
	cancel()
	r.Seconds = time.Since(t).Seconds()
	p.mu.Lock()
	defer p.mu.Unlock()
	v.phase = ""
	if err != nil {
		r.Error = err.Error()
		v.lastError = "sleep: " + r.Error
		if proc == nil || !proc.alive() || v.proc != proc {
			return r // onExit has marked it crashed
		}
		// A refused sleep leaves the process as the interposer says it is.
		v.state = StateAwake
		if st, serr := p.statusLocked(v); serr == nil && st.State == "asleep" {
			v.state = StateAsleep
		}
		return r
	}
	r.SyncSeconds, r.Bytes, r.CopiedBytes, r.BackupBytes = ans.SyncSeconds, ans.Bytes, ans.CopiedBytes(), ans.BackupBytes
	v.counts.Sleeps++
	if v.proc == proc && proc.alive() {
		v.state = StateAsleep
		v.backup = ans.BackupBytes
	}
	return r
}

func (p *Proxy) wakeServer(s *Server) *WakeResult {
	r := &WakeResult{Model: s.cfg.ID, Kind: "wake"}
	p.mu.Lock()
	proc := s.proc
	p.mu.Unlock()
	t := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.SwapTimeout)
	ans, err := s.ctl.Wake(ctx, p.cfg.SwapTimeout)
	cancel()
	r.Seconds = time.Since(t).Seconds()
	p.mu.Lock()
	defer p.mu.Unlock()
	s.phase = ""
	if err != nil {
		r.Error = err.Error()
		if proc == nil || !proc.alive() || s.proc != proc {
			r.crashed = true
			return r
		}
		s.state = StateAsleep
		if st, serr := p.statusLocked(s); serr == nil && st.State == "awake" {
			s.state = StateAwake
		}
		return r
	}
	r.Bytes, r.CopiedBytes, r.WaitSeconds = ans.Bytes, ans.CopiedBytes(), ans.WaitSeconds
	s.counts.Wakes++
	if s.proc == proc && proc.alive() {
		s.state = StateAwake
		s.backup = 0
		s.lastError = ""
	} else {
		r.Error, r.crashed = "the server exited right after its wake", true
	}
	return r
}

// statusLocked asks s's process for its status with mu released around the
// call (it is held on entry and on return).
func (p *Proxy) statusLocked(s *Server) (*ControlStatus, error) {
	p.mu.Unlock()
	defer p.mu.Lock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.ctl.Status(ctx)
}

func (p *Proxy) coldStart(s *Server) *WakeResult {
	p.mu.Lock()
	r := &WakeResult{Model: s.cfg.ID, Kind: "cold_start", Reason: s.coldWhy}
	s.state, s.phase = StateStarting, ""
	p.mu.Unlock()
	p.log.Printf("go-swap: starting %s cold (%s)", s.cfg.ID, r.Reason)
	t := time.Now()
	proc, err := startProcess(p.cfg.Vmmw, s.ctl.Socket, s.cfg, p.log, func(pr *process, requested bool) { p.exited(s, pr, requested) })
	if err == nil {
		p.mu.Lock()
		s.proc = proc
		p.mu.Unlock()
		err = waitHealthy(p.ctx, proc, s.cfg, s.ctl, p.cfg.HealthCheckTimeout)
		if err != nil {
			proc.stop(s.cfg.UnloadTimeout)
		}
	}
	r.Seconds = time.Since(t).Seconds()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		r.Error = err.Error()
		s.proc = nil
		s.state = StateCold
		s.coldWhy = "its last start failed: " + r.Error
		s.lastError = "cold start: " + r.Error
		return r
	}
	s.counts.ColdStarts++
	s.state = StateAwake
	s.backup = 0
	s.coldWhy = ""
	s.lastError = ""
	if st, serr := p.statusLocked(s); serr == nil {
		r.Bytes = st.TrackedBytes()
		s.tracked = r.Bytes
		s.serverPID = st.PID
	}
	return r
}

// exited is a process's end: a crash unless the service stopped it.
func (p *Proxy) exited(s *Server, pr *process, requested bool) {
	p.mu.Lock()
	if s.proc != pr {
		p.mu.Unlock()
		return
	}
	s.proc = nil
	s.serverPID = 0
	if requested {
		p.mu.Unlock()
		return
	}
	was := s.state
	if s.phase != "" {
		was = s.phase
	}
	s.state, s.phase = StateCrashed, ""
	s.backup = 0
	s.counts.Crashes++
	s.coldWhy = fmt.Sprintf("crashed while %s (%s)", was, pr.exitText())
	s.lastError = s.coldWhy
	why := s.coldWhy
	p.cond.Broadcast()
	p.mu.Unlock()
	p.log.Printf("go-swap: %s %s; its next request starts it cold", s.cfg.ID, why)
	p.event(fmt.Sprintf("%s %s", s.cfg.ID, why))
}

// stopServer stops s's process and leaves it in state (cold) with why as
// the reason its next start is cold.
func (p *Proxy) stopServer(s *Server, state, why string) {
	p.mu.Lock()
	proc := s.proc
	s.state, s.phase = StateSwapping, "stopping"
	p.mu.Unlock()
	if proc != nil {
		proc.stop(s.cfg.UnloadTimeout)
	}
	p.mu.Lock()
	s.proc = nil
	s.serverPID = 0
	s.state, s.phase = state, ""
	s.backup = 0
	s.coldWhy = why
	p.mu.Unlock()
}

// refresh reads each server's status (tracked and backup bytes).
func (p *Proxy) refresh(servers []*Server) {
	for _, s := range servers {
		p.mu.Lock()
		alive := s.proc != nil && s.proc.alive()
		p.mu.Unlock()
		if !alive {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := s.ctl.Status(ctx)
		cancel()
		if err != nil {
			continue
		}
		p.mu.Lock()
		if st.State == "awake" {
			s.tracked = st.TrackedBytes()
		}
		s.serverPID = st.PID
		s.backup = st.HostBackupBytes
		p.mu.Unlock()
	}
}

func maxf(a, b float64) float64 {
	if a > b {
		return a
	}
	return b
}

func maxu(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}
