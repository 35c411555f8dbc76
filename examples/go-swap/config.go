package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/vmmweights/vmmweights/bindings/go/vmmw"
)

// Config is the service's JSON configuration file.
type Config struct {
	// Backend is "auto" (VMMW_BACKEND, else CUDA), "cuda" or "host".
	Backend string `json:"backend"`
	// AwakeBudget is how many models of one device may be awake at once (default 1).
	AwakeBudget int `json:"awake_budget"`
	// Models are the models served, each under its own tag.
	Models []ModelConfig `json:"models"`
}

// ModelConfig is one model of the configuration.
type ModelConfig struct {
	// Name is the model's name in URLs and its tag's name ("model/<name>").
	Name string `json:"name"`
	// Checkpoints are the files or folders the library's loader opens, in order.
	Checkpoints []string `json:"checkpoints"`
	// Policy is "offload" (host backup, restored byte for byte) or "reload"
	// (re-read from the checkpoint at wake; a changed file is refused).
	Policy string `json:"policy"`
	// Device is the device ordinal (default 0).
	Device int `json:"device"`
}

var modelName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// readConfig reads and checks path; every error names the field at fault.
func readConfig(path string) (*Config, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var c Config
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return &c, nil
}

func (c *Config) check() error {
	if _, err := c.backend(); err != nil {
		return err
	}
	if c.AwakeBudget == 0 {
		c.AwakeBudget = 1
	}
	if c.AwakeBudget < 0 {
		return fmt.Errorf("awake_budget %d: must be at least 1", c.AwakeBudget)
	}
	if len(c.Models) == 0 {
		return fmt.Errorf("models: none configured")
	}
	seen := map[string]bool{}
	for i, m := range c.Models {
		if !modelName.MatchString(m.Name) {
			return fmt.Errorf("models[%d].name %q: use 1 to 64 of A-Z a-z 0-9 . _ - (it appears in URLs)", i, m.Name)
		}
		if seen[m.Name] {
			return fmt.Errorf("models[%d].name %q: configured twice", i, m.Name)
		}
		seen[m.Name] = true
		if len(m.Checkpoints) == 0 {
			return fmt.Errorf("model %q: checkpoints: none given", m.Name)
		}
		for j, p := range m.Checkpoints {
			if p == "" {
				return fmt.Errorf("model %q: checkpoints[%d] is empty", m.Name, j)
			}
		}
		if _, err := m.policy(); err != nil {
			return fmt.Errorf("model %q: %w", m.Name, err)
		}
		if m.Device < 0 {
			return fmt.Errorf("model %q: device %d: must be 0 or more", m.Name, m.Device)
		}
	}
	return nil
}

func (c *Config) backend() (vmmw.Backend, error) {
	switch strings.ToLower(c.Backend) {
	case "", "auto":
		return vmmw.BackendAuto, nil
	case "host":
		return vmmw.BackendHost, nil
	case "cuda":
		return vmmw.BackendCuda, nil
	}
	return 0, fmt.Errorf("backend %q: use auto, cuda or host", c.Backend)
}

func (m *ModelConfig) policy() (vmmw.Policy, error) {
	switch strings.ToLower(m.Policy) {
	case "offload":
		return vmmw.Offload, nil
	case "reload":
		return vmmw.Reload, nil
	}
	return 0, fmt.Errorf("policy %q: use offload or reload", m.Policy)
}
