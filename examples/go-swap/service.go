package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/vmmweights/vmmweights/bindings/go/vmmw"
)

// Service keeps the configured models in their devices' pools and swaps them.
//
// Locks, always taken in this order:
//   - swapMu: one swap (or digest, or Close) at a time, so a model never
//     changes state under a request that reads it;
//   - libMu: every library call holds it for reading; Close holds it for
//     writing, so no goroutine touches a pool after Close frees it;
//   - stateMu: the models' states, the swap in flight and the history; never
//     held across a library call, so GET /models answers during a swap.
type Service struct {
	budget int
	models map[string]*Model
	order  []string
	pools  map[int]*vmmw.Pool

	swapMu sync.Mutex

	libMu  sync.RWMutex
	closed bool

	stateMu sync.Mutex
	clock   uint64
	flight  *Flight
	history []*Swap
	// pause, when set, holds every swap between its sleep and its wake until
	// closed (the test endpoints' way to keep a swap in flight).
	pause chan struct{}
}

// Flight is the swap running now.
type Flight struct {
	Model string `json:"model"`
	// Phase: "swap" (the sleep and the wake at once), or, while the test
	// hook holds swaps, "sleep", "paused" and "wake" in turn.
	Phase string `json:"phase"`
}

// historyCap bounds GET /swaps (older swaps are dropped).
const historyCap = 256

// NewService opens one pool per device named in c and loads every model.
//
// Models are loaded at start rather than on first request: a bad path or a
// checkpoint the loader refuses stops the service before it serves, and every
// request after that is a swap whose cost is known (sleep and wake), never a
// load from disk. Each model is put to sleep right after its load, so start
// needs the memory of one model at a time; the first request for a model wakes it.
func NewService(ctx context.Context, c *Config) (*Service, error) {
	backend, err := c.backend()
	if err != nil {
		return nil, err
	}
	s := &Service{budget: c.AwakeBudget, models: map[string]*Model{}, pools: map[int]*vmmw.Pool{}}
	for _, mc := range c.Models {
		pool := s.pools[mc.Device]
		if pool == nil {
			if pool, err = vmmw.NewPool(vmmw.PoolOptions{Backend: backend, Device: mc.Device}); err != nil {
				s.Close()
				return nil, fmt.Errorf("device %d: %w", mc.Device, err)
			}
			s.pools[mc.Device] = pool
		}
		m, err := loadModel(ctx, pool, mc)
		if err != nil {
			s.Close()
			return nil, err
		}
		if err := pool.Sleep(vmmw.TagPolicy{Tag: m.tag, Policy: m.policy}); err != nil {
			s.Close()
			return nil, fmt.Errorf("model %q: sleep after load: %w", mc.Name, err)
		}
		m.state = Asleep
		if err := pool.Snapshot(mc.Name + " loaded, asleep"); err != nil {
			s.Close()
			return nil, err
		}
		s.models[mc.Name] = m
		s.order = append(s.order, mc.Name)
	}
	return s, nil
}

// Close waits for the swap in flight, then frees every pool. Idempotent;
// every later request answers SHUTTING_DOWN.
func (s *Service) Close() {
	s.Resume()
	s.swapMu.Lock()
	defer s.swapMu.Unlock()
	s.libMu.Lock()
	defer s.libMu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	for _, p := range s.pools {
		p.Close()
	}
}

// Pause makes later swaps wait between their sleep and their wake until Resume.
func (s *Service) Pause() {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	if s.pause == nil {
		s.pause = make(chan struct{})
	}
}

// Resume lets paused swaps go on.
func (s *Service) Resume() {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	if s.pause != nil {
		close(s.pause)
		s.pause = nil
	}
}

// Cycle is what one library sleep or wake did to one tag
// (vmmw_pool_last_cycle_json), with the model it belongs to.
type Cycle struct {
	Model         string  `json:"model"`
	Policy        string  `json:"policy,omitempty"`
	Segments      uint64  `json:"segments"`
	PhysicalBytes uint64  `json:"physical_bytes"`
	CopiedBytes   uint64  `json:"copied_bytes"`
	ReloadedBytes uint64  `json:"reloaded_bytes"`
	ChangedBytes  uint64  `json:"changed_bytes"`
	NewlyPinned   uint64  `json:"newly_pinned_bytes"`
	Seconds       float64 `json:"library_seconds"`
}

// Swap is one request's swap: what slept, what woke, how long each took and
// how many bytes moved. Seconds are wall time around the library calls.
type Swap struct {
	ID           uint64  `json:"id"`
	Model        string  `json:"model"`
	Device       int     `json:"device"`
	AlreadyAwake bool    `json:"already_awake"`
	Slept        []Cycle `json:"slept"`
	Woke         *Cycle  `json:"woke,omitempty"`
	SleepSeconds float64 `json:"sleep_seconds"`
	WakeSeconds  float64 `json:"wake_seconds"`
	TotalSeconds float64 `json:"total_seconds"`
	// SleepBytes and WakeBytes are the bytes copied between device and host
	// (and, for a Reload wake, read from the checkpoint).
	SleepBytes uint64 `json:"sleep_bytes_moved"`
	WakeBytes  uint64 `json:"wake_bytes_moved"`
	// ModelBytes is the woken model's tensor bytes.
	ModelBytes uint64 `json:"model_bytes"`
	// Boundaries are the names this swap recorded in its pool's timeline.
	Boundaries []string  `json:"timeline_boundaries"`
	Error      *APIError `json:"error,omitempty"`
}

func (s *Service) model(name string) (*Model, *APIError) {
	m := s.models[name]
	if m == nil {
		return nil, &APIError{HTTP: http.StatusNotFound, Code: CodeUnknownModel, Message: fmt.Sprintf("no model named %q is configured", name), Model: name}
	}
	return m, nil
}

func closedError() *APIError {
	return &APIError{HTTP: http.StatusServiceUnavailable, Code: CodeClosed, Message: "the service is shutting down"}
}

// Activate makes name awake, putting to sleep (each with its policy) the
// least recently used awake models of its device beyond the awake budget.
// wait false refuses with SWAP_IN_FLIGHT instead of queueing behind a swap.
//
// A swap is all or nothing: when a sleep or the wake fails, the models put
// to sleep for it are woken again and the requested one stays asleep (a
// library wake is transactional), so the states are the ones before the
// request; the error carries the library's status name.
func (s *Service) Activate(name string, wait bool) (*Swap, *APIError) {
	m, aerr := s.model(name)
	if aerr != nil {
		return nil, aerr
	}
	if wait {
		s.swapMu.Lock()
	} else if !s.swapMu.TryLock() {
		s.stateMu.Lock()
		busy := ""
		if s.flight != nil {
			busy = fmt.Sprintf(" (to %q, %s)", s.flight.Model, s.flight.Phase)
		}
		s.stateMu.Unlock()
		return nil, &APIError{HTTP: http.StatusConflict, Code: CodeSwapInFlight, Message: "another swap or digest is in flight" + busy + "; retry, or ask with wait=true to queue", Model: name}
	}
	defer s.swapMu.Unlock()
	s.libMu.RLock()
	defer s.libMu.RUnlock()
	if s.closed {
		return nil, closedError()
	}

	s.stateMu.Lock()
	s.clock++
	sw := &Swap{ID: s.clock, Model: name, Device: m.cfg.Device, ModelBytes: m.bytes, Slept: []Cycle{}}
	if m.state == Awake {
		m.lastUsed = s.clock
		sw.AlreadyAwake = true
		s.record(sw)
		s.stateMu.Unlock()
		return sw, nil
	}
	victims := s.victims(m)
	s.flight = &Flight{Model: name, Phase: "sleep"}
	pause := s.pause
	s.stateMu.Unlock()
	defer func() {
		s.stateMu.Lock()
		s.flight = nil
		s.stateMu.Unlock()
	}()

	mark := func(what string) {
		b := fmt.Sprintf("swap %d to %s: %s", sw.ID, name, what)
		if m.pool.Snapshot(b) == nil {
			sw.Boundaries = append(sw.Boundaries, b)
		}
	}
	mark("start")
	start := time.Now()
	var slept []*Model
	if pause != nil {
		// The test hook holds the swap between its halves, which then run
		// one after the other.
		for _, v := range victims {
			t := time.Now()
			err := m.pool.Sleep(vmmw.TagPolicy{Tag: v.tag, Policy: v.policy})
			sw.SleepSeconds += time.Since(t).Seconds()
			if err != nil {
				return s.fail(sw, libraryError(err, v.cfg.Name, "sleep"), append(slept, v), mark)
			}
			s.setState(v, Asleep)
			slept = append(slept, v)
			s.noteSlept(sw, m.pool, v)
		}
		mark(fmt.Sprintf("%d asleep", len(slept)))
		s.setPhase("paused")
		<-pause
		s.setPhase("wake")
		t := time.Now()
		err := m.pool.Wake(context.Background(), m.tag)
		sw.WakeSeconds = time.Since(t).Seconds()
		if err != nil {
			return s.fail(sw, libraryError(err, name, "wake"), slept, mark)
		}
	} else {
		// One library swap: the victims' copies out and m's copies in share
		// the link's two directions, and m's memory is mapped as theirs is
		// released, so the swap costs about one model's link time.
		items := make([]vmmw.TagPolicy, len(victims))
		for i, v := range victims {
			items[i] = vmmw.TagPolicy{Tag: v.tag, Policy: v.policy}
		}
		s.setPhase("swap")
		r, err := m.pool.Swap(context.Background(), items, []vmmw.Tag{m.tag}, vmmw.SwapOptions{})
		sw.SleepSeconds, sw.WakeSeconds = r.SleepSeconds, r.WakeSeconds
		for _, v := range victims[:r.SleptTags] {
			s.setState(v, Asleep)
			slept = append(slept, v)
			s.noteSlept(sw, m.pool, v)
		}
		mark(fmt.Sprintf("%d asleep", len(slept)))
		if err != nil && r.SleepStatus != vmmw.StatusOK {
			// All or nothing: m goes back to sleep if it woke, the
			// victims slept (and the one that failed) wake again.
			if r.WakeStatus == vmmw.StatusOK && r.WokenTags == 1 {
				if serr := m.pool.Sleep(vmmw.TagPolicy{Tag: m.tag, Policy: m.policy}); serr != nil {
					s.setState(m, s.stateFromLibrary(m))
				}
			}
			return s.fail(sw, libraryError(err, victims[r.SleptTags].cfg.Name, "sleep"), append(slept, victims[r.SleptTags]), mark)
		}
		if err != nil {
			return s.fail(sw, libraryError(err, name, "wake"), slept, mark)
		}
	}
	if c, ok := s.lastCycle(m.pool, m); ok {
		sw.Woke = &c
		sw.WakeBytes = c.CopiedBytes + c.ReloadedBytes
	}
	sw.TotalSeconds = time.Since(start).Seconds()
	mark("awake")

	s.stateMu.Lock()
	m.state = Awake
	m.lastUsed = sw.ID
	m.lastError = nil
	s.record(sw)
	s.stateMu.Unlock()
	return sw, nil
}

// noteSlept records v's sleep cycle in sw (from the pool's last cycle).
func (s *Service) noteSlept(sw *Swap, pool *vmmw.Pool, v *Model) {
	if c, ok := s.lastCycle(pool, v); ok {
		sw.Slept = append(sw.Slept, c)
		sw.SleepBytes += c.CopiedBytes
	}
}

// victims are the awake models of m's device to put to sleep so that m fits
// the budget, least recently used first. Caller holds stateMu.
func (s *Service) victims(m *Model) []*Model {
	var awake []*Model
	for _, n := range s.order {
		o := s.models[n]
		if o != m && o.state == Awake && o.cfg.Device == m.cfg.Device {
			awake = append(awake, o)
		}
	}
	sort.SliceStable(awake, func(i, j int) bool { return awake[i].lastUsed < awake[j].lastUsed })
	n := len(awake) - (s.budget - 1)
	if n <= 0 {
		return nil
	}
	return awake[:n]
}

// fail undoes a swap: the models slept for it wake again. Their states are
// then read back from the library, so what GET /models says is what the pool
// holds even when the undo itself fails.
func (s *Service) fail(sw *Swap, e *APIError, slept []*Model, mark func(string)) (*Swap, *APIError) {
	rolledBack := true
	if len(slept) > 0 {
		tags := make([]vmmw.Tag, len(slept))
		for i, v := range slept {
			tags[i] = v.tag
		}
		if err := slept[0].pool.Wake(context.Background(), tags...); err != nil {
			rolledBack = false
			e.Message += "; waking the models slept for this swap failed too: " + err.Error()
		}
		for _, v := range slept {
			s.setState(v, s.stateFromLibrary(v))
		}
	}
	e.RolledBack = &rolledBack
	mark("failed (" + e.Code + "), rolled back")
	sw.Error = e
	s.stateMu.Lock()
	if m := s.models[e.Model]; m != nil {
		m.lastError = e
	}
	s.record(sw)
	s.stateMu.Unlock()
	return sw, e
}

func (s *Service) stateFromLibrary(m *Model) State {
	r, err := m.pool.ReportTag(m.tag)
	if err == nil && !r.Asleep {
		return Awake
	}
	return Asleep
}

func (s *Service) setState(m *Model, st State) {
	s.stateMu.Lock()
	m.state = st
	s.stateMu.Unlock()
}

func (s *Service) setPhase(p string) {
	s.stateMu.Lock()
	if s.flight != nil {
		s.flight.Phase = p
	}
	s.stateMu.Unlock()
}

// record appends sw to the history. Caller holds stateMu.
func (s *Service) record(sw *Swap) {
	s.history = append(s.history, sw)
	if len(s.history) > historyCap {
		s.history = s.history[len(s.history)-historyCap:]
	}
}

// lastCycle reads what the pool's last sleep or wake did to m's tag.
func (s *Service) lastCycle(pool *vmmw.Pool, m *Model) (Cycle, bool) {
	raw, err := pool.LastCycleJSON()
	if err != nil {
		return Cycle{}, false
	}
	var cycles []struct {
		Tag    uint32          `json:"tag"`
		Policy json.RawMessage `json:"policy"`
		Report struct {
			Segments         uint64  `json:"segments"`
			PhysicalBytes    uint64  `json:"physical_bytes"`
			CopiedBytes      uint64  `json:"copied_bytes"`
			ReloadedBytes    uint64  `json:"reloaded_bytes"`
			ChangedBytes     uint64  `json:"changed_bytes"`
			NewlyPinnedBytes uint64  `json:"newly_pinned_bytes"`
			Seconds          float64 `json:"seconds"`
		} `json:"report"`
	}
	if json.Unmarshal([]byte(raw), &cycles) != nil {
		return Cycle{}, false
	}
	for _, c := range cycles {
		if c.Tag != uint32(m.tag) {
			continue
		}
		out := Cycle{Model: m.cfg.Name, Segments: c.Report.Segments, PhysicalBytes: c.Report.PhysicalBytes,
			CopiedBytes: c.Report.CopiedBytes, ReloadedBytes: c.Report.ReloadedBytes, ChangedBytes: c.Report.ChangedBytes,
			NewlyPinned: c.Report.NewlyPinnedBytes, Seconds: c.Report.Seconds}
		var p string
		if json.Unmarshal(c.Policy, &p) == nil {
			out.Policy = p
		}
		return out, true
	}
	return Cycle{}, false
}
