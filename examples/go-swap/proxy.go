package main

// The proxy mode's core: one server process per model, at most MaxAwake of
// them awake, the others asleep under the interposer (device memory, weights
// and KV cache alike, kept in host memory by their policy) or stopped.
//
// Requests and swaps:
//   - A request for an awake server that is not draining is admitted at once
//     (its in-flight count goes up until the answer has been sent).
//   - Any other request waits in one queue, in arrival order. One goroutine,
//     the swapper, takes the oldest waiting request's model and swaps it in:
//     the least recently used awake servers beyond MaxAwake are marked
//     draining (new requests for them wait in the queue, behind the swap),
//     their requests in flight finish, then they sleep while the requested
//     server wakes, both at once (the wake waits for the memory the sleep
//     releases). Every request that waited for that model is admitted
//     together when it is awake, before any other swap can take it away.
//   - Fairness: swaps are served in the order of each model's oldest waiting
//     request, and a server that is draining takes no new requests, so a
//     stream of requests for one model delays another model by at most the
//     requests already in flight when the other asked.
//   - A request waits at most SwapTimeout for its model; past that it is
//     answered 504 SWAP_TIMEOUT and nothing else changes.

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// Server states reported over HTTP.
const (
	StateCold     = "cold"     // no process: never started, or stopped
	StateStarting = "starting" // process started, not yet healthy
	StateAwake    = "awake"    // serving
	StateAsleep   = "asleep"   // process alive, its device memory released
	StateSwapping = "swapping" // going to sleep or waking (phase says which)
	StateCrashed  = "crashed"  // the process exited on its own; the next request starts it cold
)

// Counts are a server's totals since the service started.
type Counts struct {
	Requests     uint64 `json:"requests"`
	Errors       uint64 `json:"errors"`
	ColdStarts   uint64 `json:"cold_starts"`
	Sleeps       uint64 `json:"sleeps"`
	Wakes        uint64 `json:"wakes"`
	Crashes      uint64 `json:"crashes"`
	BudgetStops  uint64 `json:"budget_stops"`
	HeldRequests uint64 `json:"held_requests"`
}

// Server is one model's server. Fields after cfg are guarded by Proxy.mu.
type Server struct {
	cfg *ServerConfig
	ctl *Control

	proc *process
	// policy is how it sleeps: the configuration's, or one set over HTTP.
	policy   string
	state    string
	phase    string
	inflight int
	draining bool
	lastUsed time.Time
	// backup is the host memory its asleep process keeps (control status).
	backup uint64
	// serverPID is the server's own process id (the control status's pid).
	serverPID int
	// tracked is the device memory its tags held at the last status taken awake.
	tracked   uint64
	coldWhy   string
	lastError string
	counts    Counts
}

type waiter struct {
	srv      *Server
	since    time.Time
	ch       chan *APIError
	admitted bool
}

// Proxy runs the servers and swaps them.
type Proxy struct {
	cfg     *ProxyConfig
	log     *log.Logger
	sockDir string
	started time.Time
	servers []*Server
	byName  map[string]*Server

	// ctx is cancelled by Close: a cold start in progress gives up.
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	cond     *sync.Cond
	waiters  []*waiter
	flight   *ProxyFlight
	swaps    []*SwapRecord
	events   []TimelineEntry
	swapSeq  uint64
	closed   bool
	swapDone chan struct{}
	// pause, when set, holds each swap after its drain until closed (tests).
	pause chan struct{}
}

// ProxyFlight is the swap in progress.
type ProxyFlight struct {
	ID     uint64   `json:"id"`
	Model  string   `json:"model"`
	From   []string `json:"from"`
	Phase  string   `json:"phase"` // draining, paused, sleeping+waking, sleeping, starting
	Since  float64  `json:"since"`
	Queued int      `json:"queued"`
}

// NewProxy prepares the servers (none is started unless loadAtStart) and
// the control sockets' private directory.
func NewProxy(cfg *ProxyConfig, logger *log.Logger) (*Proxy, error) {
	dir, err := os.MkdirTemp("", "go-swap-ctl-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p := &Proxy{cfg: cfg, log: logger, sockDir: dir, started: time.Now(), byName: map[string]*Server{}, swapDone: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	p.ctx, p.cancel = context.WithCancel(context.Background())
	for _, sc := range cfg.Models {
		s := &Server{cfg: sc, ctl: &Control{Socket: filepath.Join(dir, sc.ID+".sock")}, state: StateCold, coldWhy: "first request", policy: sc.Policy}
		p.servers = append(p.servers, s)
		p.byName[sc.ID] = s
		for _, a := range sc.Aliases {
			p.byName[a] = s
		}
	}
	p.event("start")
	go p.swapper()
	go p.ttlTicker()
	return p, nil
}

// LoadAll starts every server in turn and puts each to sleep once healthy,
// so that every later request is a wake, not a cold start. The last one
// stays awake.
func (p *Proxy) LoadAll(ctx context.Context) error {
	for _, s := range p.servers {
		release, aerr := p.admit(ctx, s, false)
		if aerr != nil {
			return fmt.Errorf("model %s: %s", s.cfg.ID, aerr.Message)
		}
		release()
	}
	return nil
}

// lookup finds a model by ID or alias.
func (p *Proxy) lookup(name string) (*Server, *APIError) {
	if s := p.byName[name]; s != nil {
		return s, nil
	}
	return nil, &APIError{HTTP: http.StatusNotFound, Code: CodeUnknownModel, Message: fmt.Sprintf("no model named %q is configured", name), Model: name}
}

// acquire holds the caller until s is awake and admits it: the returned
// release must be called once the request's answer is done.
func (p *Proxy) acquire(ctx context.Context, s *Server) (func(), *APIError) {
	return p.admit(ctx, s, true)
}

// admit is acquire; counted false keeps the service's own uses (loadAtStart)
// out of the server's request counts.
func (p *Proxy) admit(ctx context.Context, s *Server, counted bool) (func(), *APIError) {
	release := func() {
		p.mu.Lock()
		s.inflight--
		s.lastUsed = time.Now()
		p.cond.Broadcast()
		p.mu.Unlock()
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, closedError()
	}
	if counted {
		s.counts.Requests++
	}
	if s.state == StateAwake && !s.draining {
		s.inflight++
		p.mu.Unlock()
		return release, nil
	}
	if counted {
		s.counts.HeldRequests++
	}
	w := &waiter{srv: s, since: time.Now(), ch: make(chan *APIError, 1)}
	p.waiters = append(p.waiters, w)
	p.cond.Broadcast()
	p.mu.Unlock()

	timer := time.NewTimer(p.cfg.SwapTimeout)
	defer timer.Stop()
	var why *APIError
	select {
	case e := <-w.ch:
		if e != nil {
			p.countError(s)
			return nil, e
		}
		return release, nil
	case <-ctx.Done():
		why = &APIError{HTTP: 499, Code: "CLIENT_GONE", Message: "the client went away while its request was held", Model: s.cfg.ID}
	case <-timer.C:
		why = &APIError{HTTP: http.StatusGatewayTimeout, Code: "SWAP_TIMEOUT", Model: s.cfg.ID,
			Message: fmt.Sprintf("model %q was not awake within swapTimeout (%s); the request was not sent", s.cfg.ID, p.cfg.SwapTimeout)}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if w.admitted {
		if e := <-w.ch; e != nil {
			s.counts.Errors++
			return nil, e
		}
		if ctx.Err() == nil {
			return release, nil // admitted as the timer fired: serve it
		}
		s.inflight--
		p.cond.Broadcast()
	} else {
		p.dropWaiter(w)
	}
	s.counts.Errors++
	return nil, why
}

func (p *Proxy) countError(s *Server) {
	p.mu.Lock()
	s.counts.Errors++
	p.mu.Unlock()
}

// dropWaiter removes w from the queue. Caller holds mu.
func (p *Proxy) dropWaiter(w *waiter) {
	for i, o := range p.waiters {
		if o == w {
			p.waiters = append(p.waiters[:i], p.waiters[i+1:]...)
			return
		}
	}
}

// admitReady admits every waiter whose server is awake and not draining.
// Caller holds mu.
func (p *Proxy) admitReady() {
	kept := p.waiters[:0]
	for _, w := range p.waiters {
		if w.srv.state == StateAwake && !w.srv.draining {
			w.srv.inflight++
			w.admitted = true
			w.ch <- nil
			continue
		}
		kept = append(kept, w)
	}
	p.waiters = kept
}

// failWaiters answers every waiter for s with e. Caller holds mu.
func (p *Proxy) failWaiters(s *Server, e *APIError) {
	kept := p.waiters[:0]
	for _, w := range p.waiters {
		if s == nil || w.srv == s {
			w.admitted = true
			w.ch <- e
			continue
		}
		kept = append(kept, w)
	}
	p.waiters = kept
}

// swapper serves the queue: one swap at a time, for the model of the
// oldest waiting request.
func (p *Proxy) swapper() {
	defer close(p.swapDone)
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		p.admitReady()
		for !p.closed && len(p.waiters) == 0 && p.idleServer() == nil {
			p.cond.Wait()
			p.admitReady()
		}
		if p.closed {
			p.failWaiters(nil, closedError())
			return
		}
		if len(p.waiters) == 0 {
			p.sleepIdle(p.idleServer())
			continue
		}
		target := p.waiters[0].srv
		victims := p.victims(target)
		for _, v := range victims {
			v.draining = true
		}
		p.swapSeq++
		rec := &SwapRecord{ID: p.swapSeq, Kind: "swap", Model: target.cfg.ID, From: []string{}, Policies: map[string]string{},
			Start: time.Since(p.started).Seconds(), Held: p.countWaiting(target)}
		for _, v := range victims {
			rec.From = append(rec.From, v.cfg.ID)
			rec.Policies[v.cfg.ID] = v.policy
		}
		p.flight = &ProxyFlight{ID: rec.ID, Model: target.cfg.ID, From: rec.From, Phase: "draining", Since: rec.Start}
		aerr := p.swap(target, victims, rec)
		for _, v := range victims {
			v.draining = false
		}
		if aerr != nil {
			rec.Error = aerr
			target.lastError = aerr.Message
			p.failWaiters(target, aerr)
		}
		p.record(rec)
		p.flight = nil
		p.cond.Broadcast()
	}
}

func (p *Proxy) countWaiting(s *Server) int {
	n := 0
	for _, w := range p.waiters {
		if w.srv == s {
			n++
		}
	}
	return n
}

// victims are the awake servers to put to sleep so that target fits
// MaxAwake: those with nothing in flight first, then least recently used.
// Caller holds mu.
func (p *Proxy) victims(target *Server) []*Server {
	var awake []*Server
	for _, s := range p.servers {
		if s != target && s.state == StateAwake {
			awake = append(awake, s)
		}
	}
	n := len(awake) - (p.cfg.MaxAwake - 1)
	if n <= 0 {
		return nil
	}
	sort.SliceStable(awake, func(i, j int) bool {
		bi, bj := awake[i].inflight > 0, awake[j].inflight > 0
		if bi != bj {
			return !bi
		}
		return awake[i].lastUsed.Before(awake[j].lastUsed)
	})
	return awake[:n]
}

// Close stops taking requests, lets the swap in flight finish, answers the
// held requests SHUTTING_DOWN and stops every server.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.cancel()
	if p.pause != nil {
		close(p.pause)
		p.pause = nil
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	<-p.swapDone
	var wg sync.WaitGroup
	for _, s := range p.servers {
		wg.Add(1)
		go func(s *Server) {
			defer wg.Done()
			p.stopServer(s, StateCold, "the service stopped")
		}(s)
	}
	wg.Wait()
	os.RemoveAll(p.sockDir)
}

// SetPolicy changes how name sleeps from its next sleep on.
func (p *Proxy) SetPolicy(name, policy string) (*ServerView, *APIError) {
	s, aerr := p.lookup(name)
	if aerr != nil {
		return nil, aerr
	}
	if !validPolicy(policy) {
		return nil, &APIError{HTTP: http.StatusBadRequest, Code: CodeBadRequest, Model: s.cfg.ID,
			Message: fmt.Sprintf("policy %q: use one of %s", policy, strings.Join(proxyPolicies, ", "))}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s.policy = policy
	v := p.viewLocked(s)
	return &v, nil
}

// Pause holds later swaps after their drain until Resume (test endpoints).
func (p *Proxy) Pause() {
	p.mu.Lock()
	if p.pause == nil {
		p.pause = make(chan struct{})
	}
	p.mu.Unlock()
}

// Resume lets paused swaps go on.
func (p *Proxy) Resume() {
	p.mu.Lock()
	if p.pause != nil {
		close(p.pause)
		p.pause = nil
	}
	p.mu.Unlock()
}
