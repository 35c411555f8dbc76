package main

// What the proxy mode reports over HTTP: each server's state and counts,
// the swaps with their times and bytes, and the memory timeline.

import (
	"context"
	"sync"
	"time"
)

// SwapRecord is one swap: who slept, who woke (or started cold), how long
// each step took and how many bytes moved.
type SwapRecord struct {
	ID uint64 `json:"id"`
	// Kind is "swap", or "ttl_sleep" for a server put to sleep after its ttl.
	Kind  string   `json:"kind"`
	Model string   `json:"model,omitempty"`
	From  []string `json:"from"`
	// Policies are the sleeping servers' policies by model.
	Policies map[string]string `json:"policies"`
	// Start is seconds since the service started.
	Start float64 `json:"start"`
	// Held is how many requests were waiting for the model when the swap began.
	Held int `json:"held_requests"`
	// DrainSeconds is the wait for the sleeping servers' requests in flight.
	DrainSeconds float64 `json:"drain_seconds"`
	// SleepSeconds is the longest sleep; WakeSeconds the wake or cold start
	// (they run at the same time); SwapSeconds from both issued to both done.
	SleepSeconds float64       `json:"sleep_seconds"`
	Slept        []SleepResult `json:"slept"`
	Wake         *WakeResult   `json:"wake"`
	// WakeFailed is a wake that found the server dead (it was then started cold).
	WakeFailed   *WakeResult `json:"wake_failed,omitempty"`
	SwapSeconds  float64     `json:"swap_seconds"`
	TotalSeconds float64     `json:"total_seconds"`
	SleepBytes   uint64      `json:"sleep_bytes"`
	// LinkSeconds is the larger of the two directions' bytes over the
	// configured link rate (linkGBps), when set.
	LinkSeconds float64      `json:"link_seconds,omitempty"`
	Stopped     []BudgetStop `json:"stopped_for_budget,omitempty"`
	Error       *APIError    `json:"error,omitempty"`
}

// BudgetStop is a server stopped to keep the host backups within budget.
type BudgetStop struct {
	Model  string `json:"model"`
	Bytes  uint64 `json:"bytes"`
	Reason string `json:"reason"`
}

// TimelineEntry is the memory at one boundary: the device as the servers'
// processes see it and the host memory the asleep ones keep.
type TimelineEntry struct {
	T               float64                `json:"t"`
	Event           string                 `json:"event"`
	Devices         []ControlDevice        `json:"devices"`
	HostBackupBytes uint64                 `json:"host_backup_bytes"`
	Servers         map[string]ServerPoint `json:"servers"`
}

// ServerPoint is one server at a timeline boundary.
type ServerPoint struct {
	State        string `json:"state"`
	TrackedBytes uint64 `json:"tracked_bytes"`
	BackupBytes  uint64 `json:"backup_bytes"`
}

// timelineCap and swapsCap bound the history kept.
const (
	timelineCap = 1024
	swapsCap    = 256
)

// event records the memory now under name: it asks every running server's
// control socket for its status. Called without mu.
func (p *Proxy) event(name string) {
	type probe struct {
		s    *Server
		st   *ControlStatus
		err  error
		live bool
	}
	p.mu.Lock()
	probes := make([]*probe, len(p.servers))
	for i, s := range p.servers {
		probes[i] = &probe{s: s, live: s.proc != nil && s.proc.alive()}
	}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, pr := range probes {
		if !pr.live {
			continue
		}
		wg.Add(1)
		go func(pr *probe) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			pr.st, pr.err = pr.s.ctl.Status(ctx)
			cancel()
		}(pr)
	}
	wg.Wait()
	e := TimelineEntry{T: time.Since(p.started).Seconds(), Event: name, Devices: []ControlDevice{}, Servers: map[string]ServerPoint{}}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pr := range probes {
		pt := ServerPoint{State: pr.s.state}
		if pr.st != nil {
			pt.TrackedBytes = pr.st.TrackedBytes()
			pt.BackupBytes = pr.st.HostBackupBytes
			e.HostBackupBytes += pt.BackupBytes
			if len(e.Devices) == 0 {
				e.Devices = append(e.Devices, pr.st.Devices...)
			}
		}
		e.Servers[pr.s.cfg.ID] = pt
	}
	p.events = append(p.events, e)
	if len(p.events) > timelineCap {
		p.events = p.events[len(p.events)-timelineCap:]
	}
}

// record keeps rec in the swap history. Caller holds mu.
func (p *Proxy) record(rec *SwapRecord) {
	p.swaps = append(p.swaps, rec)
	if len(p.swaps) > swapsCap {
		p.swaps = p.swaps[len(p.swaps)-swapsCap:]
	}
}

// ServerView is one server in GET /models.
type ServerView struct {
	Name     string   `json:"name"`
	Aliases  []string `json:"aliases"`
	State    string   `json:"state"`
	Phase    string   `json:"phase,omitempty"`
	Draining bool     `json:"draining"`
	Policy   string   `json:"policy"`
	// PID is the server's process; ExecPID its parent, `vmmw exec`.
	PID      int      `json:"pid,omitempty"`
	ExecPID  int      `json:"exec_pid,omitempty"`
	Proxy    string   `json:"proxy"`
	Cmd      []string `json:"cmd"`
	InFlight int      `json:"in_flight"`
	Queued   int      `json:"queued"`
	LastUsed float64  `json:"last_used"`
	// DeviceBytes is the device memory its tags held when last seen awake.
	DeviceBytes uint64 `json:"device_bytes"`
	// BackupBytes is the host memory its sleep keeps (0 awake).
	BackupBytes uint64 `json:"backup_bytes"`
	// NextStart says why the next start is cold, when the server has no process.
	NextStart string `json:"next_start,omitempty"`
	LastError string `json:"last_error,omitempty"`
	Counts    Counts `json:"counts"`
}

// ProxyModels is GET /models in the proxy mode.
type ProxyModels struct {
	MaxAwake         int          `json:"max_awake"`
	HostMemoryBudget uint64       `json:"host_memory_budget"`
	HostBackupBytes  uint64       `json:"host_backup_bytes"`
	SwapInFlight     *ProxyFlight `json:"swap_in_flight"`
	Queued           int          `json:"queued"`
	Models           []ServerView `json:"models"`
}

// Models says each server's state, memory and counts.
func (p *Proxy) Models() *ProxyModels {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := &ProxyModels{MaxAwake: p.cfg.MaxAwake, HostMemoryBudget: p.cfg.HostMemoryBudget, Queued: len(p.waiters), Models: []ServerView{}}
	if p.flight != nil {
		f := *p.flight
		f.Queued = len(p.waiters)
		out.SwapInFlight = &f
	}
	for _, s := range p.servers {
		v := p.viewLocked(s)
		if s.state == StateAsleep {
			out.HostBackupBytes += s.backup
		}
		out.Models = append(out.Models, v)
	}
	return out
}

// Model is one server's view.
func (p *Proxy) Model(name string) (*ServerView, *APIError) {
	s, aerr := p.lookup(name)
	if aerr != nil {
		return nil, aerr
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	v := p.viewLocked(s)
	return &v, nil
}

func (p *Proxy) viewLocked(s *Server) ServerView {
	v := ServerView{Name: s.cfg.ID, Aliases: append([]string{}, s.cfg.Aliases...), State: s.state, Phase: s.phase,
		Draining: s.draining, Policy: s.policy, Proxy: s.cfg.Proxy.String(), Cmd: s.cfg.Args,
		InFlight: s.inflight, DeviceBytes: s.tracked, BackupBytes: s.backup, LastError: s.lastError, Counts: s.counts}
	for _, w := range p.waiters {
		if w.srv == s {
			v.Queued++
		}
	}
	if !s.lastUsed.IsZero() {
		v.LastUsed = s.lastUsed.Sub(p.started).Seconds()
	}
	if s.proc != nil {
		v.ExecPID = s.proc.pid()
		v.PID = s.serverPID
	} else {
		v.NextStart = "cold: " + s.coldWhy
	}
	return v
}

// Swaps is the swap history, oldest first.
func (p *Proxy) Swaps() []*SwapRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*SwapRecord{}, p.swaps...)
}

// Timeline is the memory timeline, oldest first.
func (p *Proxy) Timeline() []TimelineEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]TimelineEntry{}, p.events...)
}

// Report is each running server's control status as its interposer
// answers it (GET /report); a server with no process, or one that did not
// answer, has an error in its place.
func (p *Proxy) Report() map[string]any {
	p.mu.Lock()
	type probe struct {
		s    *Server
		live bool
	}
	var probes []probe
	for _, s := range p.servers {
		probes = append(probes, probe{s, s.proc != nil && s.proc.alive()})
	}
	p.mu.Unlock()
	out := map[string]any{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, pr := range probes {
		if !pr.live {
			out[pr.s.cfg.ID] = map[string]string{"error": "no process"}
			continue
		}
		wg.Add(1)
		go func(s *Server) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			raw, err := s.ctl.StatusRaw(ctx)
			cancel()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				out[s.cfg.ID] = map[string]string{"error": err.Error()}
				return
			}
			out[s.cfg.ID] = raw
		}(pr.s)
	}
	wg.Wait()
	return out
}
