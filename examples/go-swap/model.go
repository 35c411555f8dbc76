package main

import (
	"context"
	"fmt"

	"github.com/vmmweights/vmmweights/bindings/go/vmmw"
)

// State is where a model's memory is.
type State string

const (
	// Awake: mapped on its device, readable.
	Awake State = "awake"
	// Asleep: device memory released, kept by its policy.
	Asleep State = "asleep"
)

// Tensor is one destination the loader filled: where it lives in the pool.
type Tensor struct {
	Checkpoint int      `json:"checkpoint"`
	Name       string   `json:"name"`
	Ptr        uint64   `json:"ptr"`
	Bytes      uint64   `json:"bytes"`
	Dtype      string   `json:"dtype"`
	Shape      []uint64 `json:"shape"`
}

// LoadStats say what the model's load at start did.
type LoadStats struct {
	Bytes   uint64  `json:"bytes"`
	Seconds float64 `json:"seconds"`
	GBps    float64 `json:"gbps"`
}

// Model is one configured model: its tag in its device's pool and the
// tensors its checkpoints were loaded into. The fields after the line are
// guarded by Service.stateMu.
type Model struct {
	cfg     ModelConfig
	policy  vmmw.Policy
	tag     vmmw.Tag
	pool    *vmmw.Pool
	tensors []Tensor
	bytes   uint64
	load    LoadStats

	state     State
	lastUsed  uint64
	lastError *APIError
}

// loadModel loads every checkpoint of cfg into pool under the model's own
// tag, through the library's loader (which picks the format by content), and
// keeps where each tensor landed. The loaders are closed afterwards: the
// pool keeps what a Reload wake needs.
func loadModel(ctx context.Context, pool *vmmw.Pool, cfg ModelConfig) (*Model, error) {
	policy, err := cfg.policy()
	if err != nil {
		return nil, err
	}
	tag, err := vmmw.TagID("model/" + cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("model %q: tag: %w", cfg.Name, err)
	}
	m := &Model{cfg: cfg, policy: policy, tag: tag, pool: pool, state: Awake}
	for i, path := range cfg.Checkpoints {
		if err := m.loadCheckpoint(ctx, i, path); err != nil {
			return nil, fmt.Errorf("model %q: checkpoint %s: %w", cfg.Name, path, err)
		}
	}
	if m.load.Seconds > 0 {
		m.load.GBps = float64(m.load.Bytes) / m.load.Seconds / 1e9
	}
	return m, nil
}

func (m *Model) loadCheckpoint(ctx context.Context, index int, path string) error {
	l, err := vmmw.OpenLoader(path)
	if err != nil {
		return err
	}
	defer l.Close()
	if err := l.Allocate(m.pool, m.tag); err != nil {
		return err
	}
	res, err := l.Load(ctx, m.pool, nil)
	if err != nil {
		return err
	}
	m.load.Bytes += res.Bytes
	m.load.Seconds += res.Seconds
	names, err := l.DestinationNames()
	if err != nil {
		return err
	}
	for _, n := range names {
		d, err := l.Destination(n)
		if err != nil {
			return err
		}
		m.tensors = append(m.tensors, Tensor{index, n, d.Ptr, d.Bytes, d.Dtype, d.Shape})
		m.bytes += d.Bytes
	}
	return nil
}
