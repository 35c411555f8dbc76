// Command go-swap is an HTTP service that keeps several models in one GPU's
// pool, each under its own tag, and swaps them on request: the awake model
// (or the least recently used, beyond the awake budget) goes to sleep with
// its policy and the requested one wakes at its old addresses, at the
// link's rate instead of a reload from disk. README.md has the API.
//
//	go-swap -config models.json [-listen 127.0.0.1:8077]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	configPath := flag.String("config", "", "the configuration: llama-swap's YAML (proxy mode) or the library models' JSON (README.md)")
	listen := flag.String("listen", "127.0.0.1:8077", "address to serve on (port 0: any free port, printed at start)")
	testEndpoints := flag.Bool("test-endpoints", false, "serve /test/pause and /test/resume (tests hold swaps in flight with them)")
	shutdownWait := flag.Duration("shutdown-wait", 30*time.Second, "how long a shutdown waits for requests in flight")
	flag.Parse()
	if *configPath == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: go-swap -config models.json [-listen ADDR]")
		os.Exit(2)
	}
	if err := run(*configPath, *listen, *testEndpoints, *shutdownWait); err != nil {
		log.Printf("go-swap: %v", err)
		var ce configError
		if errors.As(err, &ce) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func run(configPath, listen string, testEndpoints bool, shutdownWait time.Duration) error {
	if raw, err := os.ReadFile(configPath); err == nil && isProxyConfig(raw) {
		return runProxy(configPath, listen, testEndpoints, shutdownWait)
	}
	cfg, err := readConfig(configPath)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	svc, err := NewService(ctx, cfg)
	if err != nil {
		return err
	}
	defer svc.Close()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: Handler(svc, testEndpoints), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	// Clients (and the tests) wait for this line: the models are loaded.
	fmt.Printf("go-swap: %d models loaded, listening on http://%s\n", len(cfg.Models), ln.Addr())

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	log.Printf("go-swap: shutting down")
	// A paused swap (test endpoints) would hold the shutdown: let it finish.
	svc.Resume()
	sctx, cancel := context.WithTimeout(context.Background(), shutdownWait)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	// Handlers still running past the wait find the service closed once
	// their library call returns: Close waits for it.
	svc.Close()
	log.Printf("go-swap: closed")
	return nil
}
