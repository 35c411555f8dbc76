package main

// The proxy tests' harness: the stand-in servers' kit (vmmw, the
// interposer, the stand-in runtime and model), the service started on a
// llama-swap configuration, and an OpenAI client that reads streamed and
// plain answers alike.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// kit is what the children need: the vmmw command (for `vmmw exec`), the
// interposer, and the stand-in model library linked against the stand-in
// CUDA runtime (tests/preload/).
type kit struct {
	dir, modelLib, vmmw, preloadLib string
	err                             error
}

var (
	kitOnce sync.Once
	theKit  kit
)

func standinKit(t *testing.T) kit {
	t.Helper()
	kitOnce.Do(func() { theKit = buildKit() })
	if theKit.err != nil {
		t.Fatal(theKit.err)
	}
	return theKit
}

// buildKit takes vmmw and the interposer from VMMW_BIN and
// VMMW_PRELOAD_LIB (scripts/test.d/50-go.sh builds them), else builds them
// with cargo; scripts/build-preload-standin.sh compiles the stand-in
// runtime and model here.
func buildKit() kit {
	dir, err := os.MkdirTemp("", "go-swap-standin-")
	if err != nil {
		return kit{err: err}
	}
	here, _ := os.Getwd()
	root := filepath.Join(here, "..", "..")
	run := func(where, name string, args ...string) error {
		cmd := exec.Command(name, args...)
		cmd.Dir = where
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
		return nil
	}
	k := kit{dir: dir, modelLib: filepath.Join(dir, "standin_model.so"), vmmw: os.Getenv("VMMW_BIN"), preloadLib: os.Getenv("VMMW_PRELOAD_LIB")}
	if k.vmmw == "" || k.preloadLib == "" {
		if err := run(root, "cargo", "build", "--quiet", "-p", "vmmweights", "-p", "vmmw-preload", "--features", "vmmweights/cli"); err != nil {
			return kit{err: err}
		}
		k.vmmw = filepath.Join(root, "target", "debug", "vmmw")
		k.preloadLib = filepath.Join(root, "target", "debug", "libvmmw_preload.so")
	}
	if err := run(root, "bash", "scripts/build-preload-standin.sh", dir); err != nil {
		return kit{err: err}
	}
	return k
}

// proxyService starts the service on the YAML text cfg and waits for its
// "listening on" line.
func proxyService(t *testing.T, cfg string) *service {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binPath, "-config", path, "-listen", "127.0.0.1:0", "-test-endpoints", "-shutdown-wait", "10s")
	k := standinKit(t)
	// The servers run on the host backend (no GPU here), their cudaMalloc
	// served by the interposer that `vmmw exec` finds through VMMW_PRELOAD_LIB.
	cmd.Env = append(os.Environ(), "VMMW_BACKEND=host", "VMMW_PRELOAD_LIB="+k.preloadLib)
	s := &service{t: t, cmd: cmd, stderr: &lockedBuffer{}, done: make(chan error, 1)}
	cmd.Stderr = s.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if i := strings.Index(sc.Text(), "listening on "); i >= 0 {
				lines <- strings.TrimSpace(sc.Text()[i+len("listening on "):])
			}
		}
		close(lines)
		s.done <- cmd.Wait()
	}()
	select {
	case u, ok := <-lines:
		if !ok {
			t.Fatalf("the service exited before listening: %s", s.stderr)
		}
		s.url = u
	case <-time.After(90 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("the service did not listen within 90 s: %s", s.stderr)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			s.stop()
		}
		if t.Failed() {
			t.Logf("service log:\n%s", s.stderr)
		}
	})
	return s
}

// standinConfig is a three-model configuration in llama-swap's form.
func standinConfig(k kit, extra string) string {
	return fmt.Sprintf(`# llama-swap's keys, and ours (policy, hostMemoryBudget, maxAwake, vmmw)
vmmw: %s
startPort: 0
healthCheckTimeout: 30
swapTimeout: 60
%s
macros:
  server: >-
    python3 standin/standin_server.py --lib %s --weights-mb 4 --ctx-size 2048
models:
  alpha:
    cmd: |
      # the stand-in takes llama-server's --model, --port and --ctx-size
      ${server} --model alpha
      --port ${PORT} --token-delay-ms 2
    aliases: [gpt-4o-mini]
    policy: offload
  beta:
    cmd: ${server} --model ${MODEL_ID} --port ${PORT} --token-delay-ms 2
    checkEndpoint: /health
    policy: offload_compressed
  gamma:
    cmd: ${server} --model gamma --port ${PORT} --token-delay-ms 2
    proxy: http://127.0.0.1:${PORT}
    env: ["STANDIN_NOTE=gamma"]
    ttl: 0
`, k.vmmw, extra, k.modelLib)
}

// completion is what a client reads of one answer, streamed or not.
type completion struct {
	Status   int
	Text     string
	PromptN  int
	CacheN   int
	Chunks   int
	Model    string
	Held     string
	Error    string
	ErrCode  string
	Finished bool
}

type askOpts struct {
	chat, stream bool
	maxTokens    int
}

// ask sends one OpenAI request to model and reads the whole answer.
func (s *service) ask(model, prompt string, o askOpts) completion {
	s.t.Helper()
	c, err := s.tryAsk(model, prompt, o)
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

func (s *service) tryAsk(model, prompt string, o askOpts) (completion, error) {
	if o.maxTokens == 0 {
		o.maxTokens = 8
	}
	path := "/v1/completions"
	req := map[string]any{"model": model, "max_tokens": o.maxTokens, "stream": o.stream}
	if o.chat {
		path = "/v1/chat/completions"
		req["messages"] = []map[string]string{{"role": "user", "content": prompt}}
	} else {
		req["prompt"] = prompt
	}
	body, _ := json.Marshal(req)
	resp, err := http.Post(s.url+path, "application/json", bytes.NewReader(body))
	if err != nil {
		return completion{}, fmt.Errorf("POST %s %s: %v", path, model, err)
	}
	defer resp.Body.Close()
	c := completion{Status: resp.StatusCode, Held: resp.Header.Get("X-Go-Swap-Held-Seconds")}
	if resp.StatusCode != 200 {
		var e struct {
			Error struct {
				Message string `json:"message"`
				Code    any    `json:"code"`
			} `json:"error"`
		}
		raw, _ := io.ReadAll(resp.Body)
		json.Unmarshal(raw, &e)
		c.Error, c.ErrCode = e.Error.Message, fmt.Sprint(e.Error.Code)
		if c.Error == "" {
			c.Error = string(raw)
		}
		return c, nil
	}
	type choice struct {
		Text    string `json:"text"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		Finish *string `json:"finish_reason"`
	}
	type answer struct {
		Model   string   `json:"model"`
		Choices []choice `json:"choices"`
		Timings *struct {
			PromptN int `json:"prompt_n"`
			CacheN  int `json:"cache_n"`
		} `json:"timings"`
	}
	take := func(a answer) {
		for _, ch := range a.Choices {
			c.Text += ch.Text + ch.Message.Content + ch.Delta.Content
			if ch.Finish != nil {
				c.Finished = true
			}
		}
		if a.Timings != nil {
			c.PromptN, c.CacheN = a.Timings.PromptN, a.Timings.CacheN
		}
		if a.Model != "" {
			c.Model = a.Model
		}
	}
	if !o.stream {
		var a answer
		if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
			return c, fmt.Errorf("%s: decoding: %v", model, err)
		}
		take(a)
		return c, nil
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		return c, fmt.Errorf("%s: streamed answer with Content-Type %q", model, ct)
	}
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		data := strings.TrimPrefix(line, "data: ")
		if data == "[DONE]" {
			done = true
			io.Copy(io.Discard, resp.Body) // to the end, as clients read it
			break
		}
		var a answer
		if err := json.Unmarshal([]byte(data), &a); err != nil {
			return c, fmt.Errorf("%s: event %q: %v", model, data, err)
		}
		c.Chunks++
		take(a)
	}
	if !done {
		return c, fmt.Errorf("%s: the stream ended without [DONE] (%v)", model, sc.Err())
	}
	return c, nil
}

// proxyModels is GET /models of the proxy mode, by name.
type proxyServer struct {
	Name        string `json:"name"`
	State       string `json:"state"`
	Phase       string `json:"phase"`
	Draining    bool   `json:"draining"`
	PID         int    `json:"pid"`
	ExecPID     int    `json:"exec_pid"`
	InFlight    int    `json:"in_flight"`
	Queued      int    `json:"queued"`
	DeviceBytes uint64 `json:"device_bytes"`
	BackupBytes uint64 `json:"backup_bytes"`
	NextStart   string `json:"next_start"`
	LastError   string `json:"last_error"`
	Counts      Counts `json:"counts"`
}

type proxyModelsView struct {
	SwapInFlight *ProxyFlight  `json:"swap_in_flight"`
	Queued       int           `json:"queued"`
	Backup       uint64        `json:"host_backup_bytes"`
	Models       []proxyServer `json:"models"`
}

func (s *service) servers() (proxyModelsView, map[string]proxyServer) {
	s.t.Helper()
	var v proxyModelsView
	if c := s.call("GET", "/models", &v); c != 200 {
		s.t.Fatalf("GET /models: %d", c)
	}
	out := map[string]proxyServer{}
	for _, m := range v.Models {
		out[m.Name] = m
	}
	return v, out
}

// settled waits until no swap is in flight and no request is queued or in
// flight: a held request is answered as soon as its model is awake, before
// the swap's record is complete.
func (s *service) settled() {
	s.t.Helper()
	waitFor(s.t, func() bool {
		v, ms := s.servers()
		n := v.Queued
		for _, m := range ms {
			n += m.InFlight
		}
		return n == 0 && v.SwapInFlight == nil
	})
}

func (s *service) swaps() []SwapRecord {
	s.t.Helper()
	var v struct {
		Swaps []SwapRecord `json:"swaps"`
	}
	if c := s.call("GET", "/swaps", &v); c != 200 {
		s.t.Fatalf("GET /swaps: %d", c)
	}
	return v.Swaps
}

func words(rng *rand.Rand, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("w%d", rng.Intn(500))
	}
	return strings.Join(w, " ")
}
