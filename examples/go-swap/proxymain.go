package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// configError is a configuration the proxy mode refuses: the service exits 2.
type configError struct{ error }

func (e configError) Unwrap() error { return e.error }

// runProxy serves the proxy mode: one server process per configured model,
// under the interposer, swapped by sleep and wake.
func runProxy(configPath, listen string, testEndpoints bool, shutdownWait time.Duration) error {
	cfg, err := readProxyConfig(configPath)
	if err != nil {
		return configError{err}
	}
	if _, err := exec.LookPath(cfg.Vmmw); err != nil {
		return configError{fmt.Errorf("config %s: vmmw %q: %w (set the vmmw key or VMMW_BIN to the vmmw command)", configPath, cfg.Vmmw, err)}
	}
	logger := log.New(os.Stderr, "", log.LstdFlags|log.Lmicroseconds)
	if len(cfg.Ignored) > 0 {
		logger.Printf("go-swap: %s: not acted on here: %s", configPath, strings.Join(cfg.Ignored, ", "))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	p, err := NewProxy(cfg, logger)
	if err != nil {
		return err
	}
	defer p.Close()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	if cfg.LoadAtStart {
		loaded := make(chan error, 1)
		go func() { loaded <- p.LoadAll(ctx) }()
		select {
		case err := <-loaded:
			if err != nil {
				ln.Close()
				return fmt.Errorf("loadAtStart: %w", err)
			}
		case <-ctx.Done():
			ln.Close()
			return nil
		}
	}
	srv := &http.Server{Handler: ProxyHandler(p, testEndpoints), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	// Clients (and the tests) wait for this line.
	fmt.Printf("go-swap: proxy for %d models, listening on http://%s\n", len(cfg.Models), ln.Addr())

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	logger.Printf("go-swap: shutting down")
	p.Resume()
	sctx, cancel := context.WithTimeout(context.Background(), shutdownWait)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	p.Close()
	logger.Printf("go-swap: closed")
	return nil
}
