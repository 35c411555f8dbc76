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
	p.event("start", nil)
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
	p.event(fmt.Sprintf("swap %d to %s: start", rec.ID, target.cfg.ID), nil)

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
	p.event(fmt.Sprintf("swap %d to %s: done", rec.ID, target.cfg.ID), nil)
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
	p.event(fmt.Sprintf("%s %s", s.cfg.ID, why), nil)
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

// makeRoom stops least recently used asleep servers (never target) until
// the asleep servers' backups after this swap fit the host budget, counting
// each victim's device bytes as its backup (its policy may keep less). It
// returns the victims that do not fit even alone: they are stopped instead
// of slept. Caller holds mu; it is released while servers stop.
func (p *Proxy) makeRoom(target *Server, victims []*Server, rec *SwapRecord) map[*Server]bool {
	instead := map[*Server]bool{}
	budget := p.cfg.HostMemoryBudget
	if budget == 0 {
		return instead
	}
	var need uint64
	for _, v := range victims {
		if v.policy != "discard" {
			need += v.tracked
		}
	}
	for {
		asleep := p.asleepExcept(target)
		var kept uint64
		for _, s := range asleep {
			kept += s.backup
		}
		if kept+need <= budget {
			return instead
		}
		if len(asleep) == 0 {
			// The victims alone are over the budget: stop the largest.
			sort.Slice(victims, func(i, j int) bool { return victims[i].tracked > victims[j].tracked })
			for _, v := range victims {
				if need <= budget || instead[v] {
					break
				}
				instead[v] = true
				need -= v.tracked
				rec.Stopped = append(rec.Stopped, BudgetStop{Model: v.cfg.ID, Bytes: v.tracked,
					Reason: fmt.Sprintf("its %d device bytes would not fit the host memory budget of %d bytes; stopped instead of slept", v.tracked, budget)})
				v.counts.BudgetStops++
			}
			return instead
		}
		lru := asleep[0]
		rec.Stopped = append(rec.Stopped, BudgetStop{Model: lru.cfg.ID, Bytes: lru.backup,
			Reason: fmt.Sprintf("least recently used asleep server; the asleep backups would be %d bytes, over the host memory budget of %d", kept+need, budget)})
		lru.counts.BudgetStops++
		backup := lru.backup
		p.mu.Unlock()
		p.log.Printf("go-swap: stopping %s for the host memory budget (%d backup bytes); its next request starts it cold", lru.cfg.ID, backup)
		p.stopServer(lru, StateCold, "stopped for the host memory budget")
		p.event(fmt.Sprintf("%s stopped for the host memory budget", lru.cfg.ID), nil)
		p.mu.Lock()
	}
}

// enforceBudget stops least recently used asleep servers while the
// backups measured after a swap are over the budget (a policy's estimate
// can be off). Caller holds mu.
func (p *Proxy) enforceBudget(target *Server, rec *SwapRecord) {
	budget := p.cfg.HostMemoryBudget
	for budget > 0 {
		asleep := p.asleepExcept(target)
		var kept uint64
		for _, s := range asleep {
			kept += s.backup
		}
		if kept <= budget || len(asleep) == 0 {
			return
		}
		lru := asleep[0]
		rec.Stopped = append(rec.Stopped, BudgetStop{Model: lru.cfg.ID, Bytes: lru.backup,
			Reason: fmt.Sprintf("least recently used asleep server; the asleep backups were %d bytes, over the host memory budget of %d", kept, budget)})
		lru.counts.BudgetStops++
		p.mu.Unlock()
		p.stopServer(lru, StateCold, "stopped for the host memory budget")
		p.event(fmt.Sprintf("%s stopped for the host memory budget", lru.cfg.ID), nil)
		p.mu.Lock()
	}
}

// asleepExcept lists the asleep servers other than s, least recently used
// first. Caller holds mu.
func (p *Proxy) asleepExcept(s *Server) []*Server {
	var out []*Server
	for _, o := range p.servers {
		if o != s && o.state == StateAsleep {
			out = append(out, o)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].lastUsed.Before(out[j].lastUsed) })
	return out
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

// ttlTicker wakes the swapper when an awake server has been idle past its
// ttl (llama-swap's key: there it stops the server; here it goes to sleep,
// so the device memory is free and the next request is a wake).
func (p *Proxy) ttlTicker() {
	var shortest time.Duration
	for _, s := range p.servers {
		if s.cfg.TTL > 0 && (shortest == 0 || s.cfg.TTL < shortest) {
			shortest = s.cfg.TTL
		}
	}
	if shortest == 0 {
		return
	}
	tick := time.NewTicker(minDuration(shortest/4, time.Second))
	defer tick.Stop()
	for {
		select {
		case <-p.swapDone:
			return
		case <-tick.C:
			p.mu.Lock()
			if p.idleServer() != nil {
				p.cond.Broadcast()
			}
			p.mu.Unlock()
		}
	}
}

func minDuration(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}

// idleServer is an awake server idle past its ttl, if any. Caller holds mu.
func (p *Proxy) idleServer() *Server {
	for _, s := range p.servers {
		if s.cfg.TTL > 0 && s.state == StateAwake && s.inflight == 0 && !s.lastUsed.IsZero() && time.Since(s.lastUsed) > s.cfg.TTL {
			return s
		}
	}
	return nil
}

// sleepIdle puts s to sleep for its ttl, within the host budget. Caller
// holds mu (released while the server sleeps).
func (p *Proxy) sleepIdle(s *Server) {
	p.swapSeq++
	rec := &SwapRecord{ID: p.swapSeq, Kind: "ttl_sleep", From: []string{s.cfg.ID}, Policies: map[string]string{s.cfg.ID: s.policy},
		Start: time.Since(p.started).Seconds()}
	p.flight = &ProxyFlight{ID: rec.ID, From: rec.From, Phase: "sleeping", Since: rec.Start}
	s.draining = true
	p.mu.Unlock()
	p.refresh([]*Server{s})
	p.mu.Lock()
	if p.makeRoom(nil, []*Server{s}, rec)[s] {
		p.mu.Unlock()
		p.stopServer(s, StateCold, "stopped for the host memory budget instead of sleeping")
	} else {
		s.state, s.phase = StateSwapping, "sleeping"
		p.mu.Unlock()
		r := p.sleepServer(s)
		rec.Slept = []SleepResult{r}
		rec.SleepSeconds, rec.SleepBytes, rec.SwapSeconds = r.Seconds, r.Bytes, r.Seconds
	}
	if len(rec.Slept) == 1 && rec.Slept[0].Error != "" {
		p.log.Printf("go-swap: %s idle for its ttl (%s): its sleep failed: %s", s.cfg.ID, s.cfg.TTL, rec.Slept[0].Error)
	} else {
		p.log.Printf("go-swap: %s idle for its ttl (%s): put to sleep", s.cfg.ID, s.cfg.TTL)
	}
	p.event(fmt.Sprintf("%s asleep after its ttl", s.cfg.ID), nil)
	p.mu.Lock()
	s.draining = false
	p.record(rec)
	p.flight = nil
	p.cond.Broadcast()
}
