package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/vmmweights/vmmweights/bindings/go/vmmw"
)

// Memory is a model's tag in the library's report: the four quantities
// (live, reserved, tracked, device used) and the sleep states' bytes.
type Memory struct {
	LiveBytes        uint64 `json:"live_bytes"`
	ReservedBytes    uint64 `json:"reserved_bytes"`
	TrackedBytes     uint64 `json:"tracked_bytes"`
	DeviceUsedBytes  uint64 `json:"device_used_bytes"`
	DeviceTotalBytes uint64 `json:"device_total_bytes"`
	AwakeBytes       uint64 `json:"awake_bytes"`
	OffloadedBytes   uint64 `json:"offloaded_bytes"`
	ReloadableBytes  uint64 `json:"reloadable_bytes"`
	HostBackupBytes  uint64 `json:"host_backup_bytes"`
	Asleep           bool   `json:"asleep"`
}

// ModelView is one model in GET /models.
type ModelView struct {
	Name        string    `json:"name"`
	State       State     `json:"state"`
	Policy      string    `json:"policy"`
	Device      int       `json:"device"`
	Checkpoints []string  `json:"checkpoints"`
	Tensors     int       `json:"tensors"`
	Bytes       uint64    `json:"bytes"`
	Load        LoadStats `json:"load"`
	LastUsed    uint64    `json:"last_used"`
	LastError   *APIError `json:"last_error,omitempty"`
	Memory      Memory    `json:"memory"`
}

// Models is GET /models.
type Models struct {
	AwakeBudget int         `json:"awake_budget"`
	InFlight    *Flight     `json:"swap_in_flight"`
	Models      []ModelView `json:"models"`
}

// Models says each model's state and memory; it answers during a swap.
func (s *Service) Models() (*Models, *APIError) {
	s.libMu.RLock()
	defer s.libMu.RUnlock()
	if s.closed {
		return nil, closedError()
	}
	out := &Models{AwakeBudget: s.budget, Models: []ModelView{}}
	for _, n := range s.order {
		v, err := s.view(s.models[n])
		if err != nil {
			return nil, err
		}
		out.Models = append(out.Models, *v)
	}
	s.stateMu.Lock()
	if s.flight != nil {
		f := *s.flight
		out.InFlight = &f
	}
	s.stateMu.Unlock()
	return out, nil
}

// Model is GET /models/{name}.
func (s *Service) Model(name string) (*ModelView, *APIError) {
	m, aerr := s.model(name)
	if aerr != nil {
		return nil, aerr
	}
	s.libMu.RLock()
	defer s.libMu.RUnlock()
	if s.closed {
		return nil, closedError()
	}
	return s.view(m)
}

// view reads m's report from the library. Caller holds libMu.
func (s *Service) view(m *Model) (*ModelView, *APIError) {
	r, err := m.pool.ReportTag(m.tag)
	if err != nil {
		return nil, libraryError(err, m.cfg.Name, "")
	}
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	return &ModelView{
		Name: m.cfg.Name, State: m.state, Policy: m.policy.String(), Device: m.cfg.Device,
		Checkpoints: m.cfg.Checkpoints, Tensors: len(m.tensors), Bytes: m.bytes, Load: m.load,
		LastUsed: m.lastUsed, LastError: m.lastError,
		Memory: Memory{r.LiveBytes, r.ReservedBytes, r.TrackedBytes, r.DeviceUsedBytes, r.DeviceTotalBytes,
			r.AwakeBytes, r.OffloadedBytes, r.ReloadableBytes, r.HostBackupBytes, r.Asleep},
	}, nil
}

// TensorDigest is one tensor's SHA-256 as read back from device memory.
type TensorDigest struct {
	Tensor
	SHA256 string `json:"sha256"`
}

// digestChunk bounds the host buffer a digest reads device memory through.
const digestChunk = 16 << 20

// Digest reads an awake model's tensors back from its device and hashes
// each, so a client can check them against the checkpoint. It waits for the
// swap in flight and holds off others while it reads.
func (s *Service) Digest(name string) ([]TensorDigest, *APIError) {
	m, aerr := s.model(name)
	if aerr != nil {
		return nil, aerr
	}
	s.swapMu.Lock()
	defer s.swapMu.Unlock()
	s.libMu.RLock()
	defer s.libMu.RUnlock()
	if s.closed {
		return nil, closedError()
	}
	s.stateMu.Lock()
	st := m.state
	s.stateMu.Unlock()
	if st != Awake {
		return nil, &APIError{HTTP: http.StatusConflict, Code: CodeModelAsleep, Message: fmt.Sprintf("model %q is asleep: activate it first", name), Model: name}
	}
	out := make([]TensorDigest, 0, len(m.tensors))
	buf := make([]byte, digestChunk)
	for _, t := range m.tensors {
		h := sha256.New()
		for off := uint64(0); off < t.Bytes; off += digestChunk {
			n := t.Bytes - off
			if n > digestChunk {
				n = digestChunk
			}
			if err := m.pool.Read(t.Ptr+off, buf[:n]); err != nil {
				return nil, libraryError(err, name, "")
			}
			h.Write(buf[:n])
		}
		out = append(out, TensorDigest{t, hex.EncodeToString(h.Sum(nil))})
	}
	return out, nil
}

// Swaps is the history of swaps, oldest first (the last historyCap).
func (s *Service) Swaps() []*Swap {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	return append([]*Swap{}, s.history...)
}

// poolJSON is one library JSON document per device, keyed by ordinal.
func (s *Service) poolJSON(f func(*vmmw.Pool) (string, error)) (map[string]json.RawMessage, *APIError) {
	s.libMu.RLock()
	defer s.libMu.RUnlock()
	if s.closed {
		return nil, closedError()
	}
	out := map[string]json.RawMessage{}
	for d, p := range s.pools {
		j, err := f(p)
		if err != nil {
			return nil, libraryError(err, "", "")
		}
		out[strconv.Itoa(d)] = json.RawMessage(j)
	}
	return out, nil
}

// Timeline is each device pool's memory timeline (vmmw_pool_timeline_json):
// the report at every boundary the loads and swaps recorded.
func (s *Service) Timeline() (map[string]json.RawMessage, *APIError) {
	return s.poolJSON((*vmmw.Pool).TimelineJSON)
}

// Report is each device pool's full memory report (vmmw_pool_report_json).
func (s *Service) Report() (map[string]json.RawMessage, *APIError) {
	return s.poolJSON((*vmmw.Pool).ReportJSON)
}
