package main

// The proxy mode tested as a user runs it: the service binary (built with
// the race detector by TestMain) started as a process on a llama-swap YAML
// configuration, fronting real child processes: the stand-in llama-server
// (standin/standin_server.py) whose weights and KV cache live in CUDA
// memory served by the interposer under `vmmw exec`. Clients speak the
// OpenAI API to it, streaming and not, concurrently.

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
	"syscall"
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
// with cargo; the stand-in runtime and model are compiled here.
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
		if err := run(root, "cargo", "build", "--quiet", "--features", "cli", "--bin", "vmmw"); err != nil {
			return kit{err: err}
		}
		if err := run(root, "cargo", "build", "--quiet", "-p", "vmmw-preload"); err != nil {
			return kit{err: err}
		}
		k.vmmw = filepath.Join(root, "target", "debug", "vmmw")
		k.preloadLib = filepath.Join(root, "target", "debug", "libvmmw_preload.so")
	}
	if err := run(root, "bash", "scripts/build-preload-standin.sh", dir); err != nil {
		return kit{err: err}
	}
	if err := run(here, "cc", "-std=c11", "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-I", filepath.Join(root, "tests", "preload"),
		"-o", k.modelLib, "standin/standin_model.c", "-L"+dir, "-lvmmw_standin_cudart", "-Wl,-rpath,"+dir); err != nil {
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

// TestProxyServesAndSwapsConcurrentClients: every answer, streamed or not,
// chat or plain, equals the same request's answer before any swap, while
// many clients ask for the three models at once.
func TestProxyServesAndSwapsConcurrentClients(t *testing.T) {
	k := standinKit(t)
	s := proxyService(t, standinConfig(k, ""))
	rng := rand.New(rand.NewSource(1))
	type q struct {
		model, prompt string
		o             askOpts
	}
	var qs []q
	for i := 0; i < 6; i++ {
		for _, m := range []string{"alpha", "beta", "gamma"} {
			qs = append(qs, q{m, words(rng, 5+rng.Intn(20)), askOpts{chat: i%2 == 0, maxTokens: 4 + rng.Intn(8)}})
		}
	}
	// The reference: each model's answers asked in one go, so each model
	// is started and swapped in once.
	want := map[int]string{}
	for _, m := range []string{"alpha", "beta", "gamma"} {
		for i, x := range qs {
			if x.model == m {
				c := s.ask(x.model, x.prompt, x.o)
				if c.Status != 200 || c.Text == "" {
					t.Fatalf("%s: %+v", m, c)
				}
				want[i] = c.Text
			}
		}
	}
	// The same requests, shuffled, streamed and not, from 8 clients at once.
	var wg sync.WaitGroup
	errs := make(chan error, len(qs)*2)
	order := rng.Perm(len(qs) * 2)
	work := make(chan int, len(order))
	for _, i := range order {
		work <- i
	}
	close(work)
	for c := 0; c < 8; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				x := qs[i%len(qs)]
				o := x.o
				o.stream = i >= len(qs)
				model := x.model
				if model == "alpha" && i%3 == 0 {
					model = "gpt-4o-mini" // the alias
				}
				got, err := s.tryAsk(model, x.prompt, o)
				if err != nil {
					errs <- err
					continue
				}
				if got.Status != 200 || got.Text != want[i%len(qs)] {
					errs <- fmt.Errorf("%s (stream %v, chat %v): got %d %q %s, want %q", model, o.stream, o.chat, got.Status, got.Text, got.Error, want[i%len(qs)])
				}
				if o.stream && got.Chunks < o.maxTokens {
					errs <- fmt.Errorf("%s: %d events for %d tokens", model, got.Chunks, o.maxTokens)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// A handler lets go of its server just after its client has read the end.
	s.settled()
	v, ms := s.servers()
	awake := 0
	for _, m := range ms {
		if m.State == "awake" {
			awake++
		} else if m.State != "asleep" {
			t.Errorf("%s: state %s, want awake or asleep", m.Name, m.State)
		}
		if m.Counts.ColdStarts != 1 || m.Counts.Crashes != 0 || m.InFlight != 0 || m.Counts.Errors != 0 {
			t.Errorf("%s: %+v", m.Name, m)
		}
		if m.State == "asleep" && (m.BackupBytes == 0 || m.DeviceBytes < 4<<20) {
			t.Errorf("%s asleep keeps %d backup bytes of %d tracked", m.Name, m.BackupBytes, m.DeviceBytes)
		}
	}
	if awake != 1 || v.Queued != 0 || v.SwapInFlight != nil {
		t.Errorf("after the clients: %d awake, %d queued, flight %+v", awake, v.Queued, v.SwapInFlight)
	}
	s.settled()
	sw := s.swaps()
	warm := 0
	for _, r := range sw {
		if r.Error != nil {
			t.Errorf("swap %d failed: %+v", r.ID, r.Error)
		}
		if r.Wake != nil && r.Wake.Kind == "wake" {
			warm++
			if len(r.Slept) != 1 || r.Slept[0].Bytes < 4<<20 || r.Wake.Bytes < 4<<20 || r.SwapSeconds <= 0 || r.Slept[0].Error != "" {
				t.Errorf("swap %d: %+v %+v", r.ID, r.Slept, r.Wake)
			}
		}
	}
	if warm < 2 {
		t.Errorf("%d swaps woke a sleeping server, want at least 2: %+v", warm, sw)
	}
	var rep map[string]struct {
		PID   int    `json:"pid"`
		State string `json:"state"`
		Tags  []struct {
			Tag string `json:"tag"`
		} `json:"tags"`
	}
	s.call("GET", "/report", &rep)
	for _, m := range []string{"alpha", "beta", "gamma"} {
		if r := rep[m]; r.PID != ms[m].PID || r.State != ms[m].State || len(r.Tags) == 0 || r.Tags[0].Tag != m {
			t.Errorf("GET /report for %s: %+v; /models says %+v", m, r, ms[m])
		}
	}
	var tl struct {
		Timeline []TimelineEntry `json:"timeline"`
	}
	s.call("GET", "/timeline", &tl)
	if len(tl.Timeline) < 2*len(sw) {
		t.Errorf("%d timeline entries for %d swaps", len(tl.Timeline), len(sw))
	}
	sawBackup := false
	for _, e := range tl.Timeline {
		if e.HostBackupBytes > 0 && len(e.Devices) > 0 {
			sawBackup = true
		}
	}
	if !sawBackup {
		t.Errorf("no timeline entry shows host backups and a device: %+v", tl.Timeline)
	}
}

// TestProxyPromptCacheSurvivesSwap: a long prompt asked again after the
// model was put to sleep and woken is served from its KV cache.
func TestProxyPromptCacheSurvivesSwap(t *testing.T) {
	k := standinKit(t)
	s := proxyService(t, standinConfig(k, ""))
	prompt := words(rand.New(rand.NewSource(2)), 300)
	for _, m := range []string{"alpha", "beta"} { // offload, offload_compressed
		first := s.ask(m, prompt, askOpts{})
		if first.PromptN != 300 {
			t.Fatalf("%s: first ask computed %d prompt positions, want 300", m, first.PromptN)
		}
		s.ask("gamma", "something else", askOpts{}) // m goes to sleep
		if _, ms := s.servers(); ms[m].State != "asleep" {
			t.Fatalf("%s is %s, want asleep", m, ms[m].State)
		}
		again := s.ask(m, prompt, askOpts{stream: true})
		if again.Text != first.Text || again.PromptN > 1 || again.CacheN != 299 {
			t.Fatalf("%s after a swap: prompt_n %d cache_n %d %q, want 1, 299, %q", m, again.PromptN, again.CacheN, again.Text, first.Text)
		}
	}
}

// TestProxyStandinSeesLostBytes: the stand-in's answers depend on every
// byte of its memory, so a sleep that keeps nothing (discard) changes what
// it says after its wake; the tests above would see any loss the same way.
func TestProxyStandinSeesLostBytes(t *testing.T) {
	k := standinKit(t)
	s := proxyService(t, standinConfig(k, ""))
	before := s.ask("alpha", "remember this", askOpts{})
	var v struct {
		Policy string `json:"policy"`
	}
	if c := s.call("POST", "/models/alpha/policy", nil); c != 400 {
		t.Fatalf("a policy request without a body: %d", c)
	}
	resp, err := http.Post(s.url+"/models/alpha/policy", "application/json", strings.NewReader(`{"policy":"reload"}`))
	if err != nil || resp.StatusCode != 400 {
		t.Fatalf("policy reload: %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = http.Post(s.url+"/models/alpha/policy", "application/json", strings.NewReader(`{"policy":"discard"}`))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("policy discard: %v %v", resp, err)
	}
	json.NewDecoder(resp.Body).Decode(&v)
	resp.Body.Close()
	if v.Policy != "discard" {
		t.Fatalf("alpha's policy after the change: %q", v.Policy)
	}
	s.ask("beta", "x", askOpts{})
	s.settled()
	sw := s.swaps()
	if last := sw[len(sw)-1]; len(last.Slept) != 1 || last.Slept[0].Policy != "discard" || last.Slept[0].BackupBytes != 0 {
		t.Fatalf("alpha's discard sleep: %+v", last.Slept)
	}
	after, err := s.tryAsk("alpha", "remember this", askOpts{})
	if err == nil && after.Status == 200 && after.Text == before.Text && after.PromptN == 1 {
		t.Fatalf("alpha answered as before after its memory was discarded: %+v", after)
	}
}

// TestProxyClientGoesAwayMidStream: the upstream request is cancelled, the
// server's in-flight count drops, and the next swap is not held by it.
func TestProxyClientGoesAwayMidStream(t *testing.T) {
	k := standinKit(t)
	s := proxyService(t, strings.Replace(standinConfig(k, ""), "--token-delay-ms 2\n    aliases", "--token-delay-ms 50\n    aliases", 1))
	body := `{"model":"alpha","prompt":"tell me a long story","max_tokens":400,"stream":true}`
	resp, err := http.Post(s.url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(resp.Body)
	for events := 0; events < 3; {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data: ") {
			events++
		}
	}
	if _, ms := s.servers(); ms["alpha"].InFlight != 1 {
		t.Fatalf("alpha mid-stream: in flight %d", ms["alpha"].InFlight)
	}
	resp.Body.Close() // the client goes away
	waitFor(t, func() bool { _, ms := s.servers(); return ms["alpha"].InFlight == 0 })
	waitFor(t, func() bool {
		return strings.Contains(s.stderr.String(), "[alpha] stream cancelled by the client after")
	})
	// Well before the 400 tokens' 20 s: the swap is not waiting for the stream.
	t0 := time.Now()
	if c := s.ask("beta", "hello", askOpts{}); c.Status != 200 {
		t.Fatalf("beta after the disconnect: %+v", c)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Fatalf("beta took %s after alpha's client went away", d)
	}
	if c := s.ask("alpha", "hello", askOpts{}); c.Status != 200 {
		t.Fatalf("alpha after the disconnect: %+v", c)
	}
}

// TestProxySwapWaitsForRequestInFlight: a swap asked for while a request is
// in flight waits for it; the request completes whole, then the swap; a
// request for the old model that comes during the drain waits for the next
// swap; nothing is lost.
func TestProxySwapWaitsForRequestInFlight(t *testing.T) {
	k := standinKit(t)
	s := proxyService(t, strings.Replace(standinConfig(k, ""), "--token-delay-ms 2\n    aliases", "--token-delay-ms 40\n    aliases", 1))
	ref := s.ask("alpha", "a slow answer", askOpts{maxTokens: 60})
	refBeta := s.ask("beta", "quick", askOpts{})
	refAlpha2 := s.ask("alpha", "second", askOpts{})

	type result struct {
		c    completion
		err  error
		done time.Time
	}
	slow := make(chan result, 1)
	go func() {
		c, err := s.tryAsk("alpha", "a slow answer", askOpts{stream: true, maxTokens: 60})
		slow <- result{c, err, time.Now()}
	}()
	waitFor(t, func() bool { _, ms := s.servers(); return ms["alpha"].InFlight == 1 })
	beta := make(chan result, 1)
	go func() {
		c, err := s.tryAsk("beta", "quick", askOpts{})
		beta <- result{c, err, time.Now()}
	}()
	waitFor(t, func() bool { v, _ := s.servers(); return v.SwapInFlight != nil && v.SwapInFlight.Phase == "draining" })
	_, ms := s.servers()
	if !ms["alpha"].Draining || ms["alpha"].State != "awake" || ms["beta"].Queued != 1 {
		t.Fatalf("during the drain: alpha %+v, beta %+v", ms["alpha"], ms["beta"])
	}
	alpha2 := make(chan result, 1)
	go func() {
		c, err := s.tryAsk("alpha", "second", askOpts{})
		alpha2 <- result{c, err, time.Now()}
	}()
	waitFor(t, func() bool { _, ms := s.servers(); return ms["alpha"].Queued == 1 })
	a, b, a2 := <-slow, <-beta, <-alpha2
	for _, r := range []result{a, b, a2} {
		if r.err != nil || r.c.Status != 200 {
			t.Fatalf("a request was lost: %+v %v", r.c, r.err)
		}
	}
	if a.c.Text != ref.Text || b.c.Text != refBeta.Text || a2.c.Text != refAlpha2.Text {
		t.Fatalf("answers changed: %q/%q %q/%q %q/%q", a.c.Text, ref.Text, b.c.Text, refBeta.Text, a2.c.Text, refAlpha2.Text)
	}
	if !b.done.After(a.done) || !a2.done.After(b.done) {
		t.Fatalf("order: slow alpha %s, beta %s, alpha again %s", a.done, b.done, a2.done)
	}
	if b.c.Held == "" {
		t.Fatalf("beta's answer does not say it was held")
	}
	s.settled()
	sw := s.swaps()
	var drained bool
	for _, r := range sw {
		if r.Model == "beta" && len(r.From) == 1 && r.From[0] == "alpha" && r.DrainSeconds > 0.3 {
			drained = true
		}
	}
	if !drained {
		t.Fatalf("no swap to beta drained alpha: %+v", sw)
	}
}

// TestProxyChildCrashesAsleep: a server killed while asleep is reported
// crashed; its next request starts it cold, says why, and answers as before.
func TestProxyChildCrashesAsleep(t *testing.T) {
	k := standinKit(t)
	s := proxyService(t, standinConfig(k, ""))
	ref := s.ask("alpha", "before the crash", askOpts{})
	s.ask("beta", "x", askOpts{})
	_, ms := s.servers()
	if ms["alpha"].State != "asleep" || ms["alpha"].PID == 0 {
		t.Fatalf("alpha: %+v", ms["alpha"])
	}
	if err := syscall.Kill(ms["alpha"].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, ms := s.servers(); return ms["alpha"].State == "crashed" })
	_, ms = s.servers()
	if ms["alpha"].Counts.Crashes != 1 || !strings.Contains(ms["alpha"].NextStart, "crashed while asleep") {
		t.Fatalf("alpha after the kill: %+v", ms["alpha"])
	}
	got := s.ask("alpha", "before the crash", askOpts{})
	if got.Status != 200 || got.Text != ref.Text || got.PromptN != ref.PromptN {
		t.Fatalf("alpha after its crash: %+v, want %q computed whole", got, ref.Text)
	}
	s.settled()
	sw := s.swaps()
	last := sw[len(sw)-1]
	if last.Wake == nil || last.Wake.Kind != "cold_start" || !strings.Contains(last.Wake.Reason, "crashed while asleep") {
		t.Fatalf("the swap to alpha after the crash: %+v", last)
	}
	if _, ms := s.servers(); ms["alpha"].Counts.ColdStarts != 2 || ms["alpha"].State != "awake" {
		t.Fatalf("alpha: %+v", ms["alpha"])
	}
	if !strings.Contains(s.stderr.String(), "alpha crashed while asleep") {
		t.Fatalf("the log does not report the crash")
	}
}

// TestProxyHostBudgetStopsLRU: when the asleep servers' backups would pass
// hostMemoryBudget, the least recently used asleep server is stopped, the
// swap reports it, and its next request is a cold start.
func TestProxyHostBudgetStopsLRU(t *testing.T) {
	k := standinKit(t)
	// Each stand-in keeps a little over 4 MiB: room for one asleep, not two.
	s := proxyService(t, standinConfig(k, "hostMemoryBudget: 7MiB"))
	ref := map[string]string{}
	for _, m := range []string{"alpha", "beta"} {
		ref[m] = s.ask(m, "budget "+m, askOpts{}).Text
	}
	if _, ms := s.servers(); ms["alpha"].State != "asleep" {
		t.Fatalf("alpha: %+v", ms["alpha"])
	}
	ref["gamma"] = s.ask("gamma", "budget gamma", askOpts{}).Text
	v, ms := s.servers()
	if ms["alpha"].State != "cold" || !strings.Contains(ms["alpha"].NextStart, "host memory budget") || ms["alpha"].Counts.BudgetStops != 1 {
		t.Fatalf("alpha should be stopped for the budget: %+v", ms["alpha"])
	}
	if ms["beta"].State != "asleep" || v.Backup > 7<<20 {
		t.Fatalf("beta %+v; asleep backups %d", ms["beta"], v.Backup)
	}
	s.settled()
	sw := s.swaps()
	last := sw[len(sw)-1]
	if len(last.Stopped) != 1 || last.Stopped[0].Model != "alpha" || !strings.Contains(last.Stopped[0].Reason, "least recently used") {
		t.Fatalf("the swap to gamma: %+v", last)
	}
	got := s.ask("alpha", "budget alpha", askOpts{})
	if got.Text != ref["alpha"] {
		t.Fatalf("alpha cold again: %q, want %q", got.Text, ref["alpha"])
	}
	s.settled()
	sw = s.swaps()
	if w := sw[len(sw)-1].Wake; w.Kind != "cold_start" || !strings.Contains(w.Reason, "host memory budget") {
		t.Fatalf("alpha's start after the budget stop: %+v", w)
	}
}

// TestProxyBadRequests: unknown models, bodies without a model, wrong
// methods, a server that cannot start; each answered with a clear error,
// and the service goes on serving.
func TestProxyBadRequests(t *testing.T) {
	k := standinKit(t)
	s := proxyService(t, standinConfig(k, "")+`  broken:
    cmd: python3 -c "import sys; print('no GPU here'); sys.exit(3)"
    proxy: http://127.0.0.1:9
`)
	post := func(path, body string) (int, string) {
		resp, err := http.Post(s.url+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct {
		path, body string
		code       int
		says       string
	}{
		{"/v1/completions", `{"model":"nope","prompt":"x"}`, 404, "UNKNOWN_MODEL"},
		{"/v1/completions", `{"prompt":"x"}`, 400, `no \"model\"`},
		{"/v1/chat/completions", `not json`, 400, "not a JSON object"},
		{"/v1/completions", `{"model":"broken","prompt":"x"}`, 502, "exited during its start"},
	} {
		code, body := post(c.path, c.body)
		if code != c.code || !strings.Contains(body, c.says) {
			t.Errorf("POST %s %s: %d %s, want %d with %q", c.path, c.body, code, body, c.code, c.says)
		}
	}
	if !strings.Contains(s.stderr.String(), "[broken] no GPU here") {
		t.Errorf("the child's output is not in the service log")
	}
	resp, err := http.Get(s.url + "/v1/completions")
	if err != nil || resp.StatusCode != 405 {
		t.Fatalf("GET /v1/completions: %v %v", resp, err)
	}
	resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	s.call("GET", "/v1/models", &list)
	if len(list.Data) != 4 || list.Data[0].ID != "alpha" {
		t.Fatalf("/v1/models: %+v", list)
	}
	// Passed through to the model's own endpoints.
	var props struct {
		ModelPath string `json:"model_path"`
	}
	r2, err := http.Get(s.url + "/upstream/beta/props")
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(r2.Body).Decode(&props)
	r2.Body.Close()
	if r2.StatusCode != 200 || props.ModelPath != "beta" {
		t.Fatalf("/upstream/beta/props: %d %+v", r2.StatusCode, props)
	}
	if c := s.ask("gamma", "still serving", askOpts{}); c.Status != 200 {
		t.Fatalf("gamma after the errors: %+v", c)
	}
}

// TestProxyTTLSleeps: a server idle past its ttl goes to sleep on its own;
// its next request wakes it with its memory intact.
func TestProxyTTLSleeps(t *testing.T) {
	k := standinKit(t)
	s := proxyService(t, strings.Replace(standinConfig(k, ""), "    ttl: 0\n", "    ttl: 1\n", 1))
	first := s.ask("gamma", "idle soon", askOpts{})
	// The record is kept once the sleep and its timeline entry are done.
	waitFor(t, func() bool { sw := s.swaps(); return sw[len(sw)-1].Kind == "ttl_sleep" })
	s.settled()
	sw := s.swaps()
	last := sw[len(sw)-1]
	if _, ms := s.servers(); ms["gamma"].State != "asleep" {
		t.Fatalf("gamma after its ttl: %+v", ms["gamma"])
	}
	if last.Kind != "ttl_sleep" || len(last.Slept) != 1 || last.Slept[0].Model != "gamma" || last.Slept[0].Error != "" {
		t.Fatalf("gamma's ttl sleep: %+v", last)
	}
	again := s.ask("gamma", "idle soon", askOpts{})
	if again.Text != first.Text || again.PromptN != 1 {
		t.Fatalf("gamma after its ttl sleep: %+v, want %q from its cache", again, first.Text)
	}
	if _, ms := s.servers(); ms["gamma"].Counts.Wakes != 1 || ms["gamma"].Counts.ColdStarts != 1 {
		t.Fatalf("gamma: %+v", ms["gamma"])
	}
}

// TestProxyHeldRequestTimesOut: a request whose model does not become
// awake within swapTimeout is answered 504 SWAP_TIMEOUT, not sent; the
// service shuts down with the start still in progress.
func TestProxyHeldRequestTimesOut(t *testing.T) {
	k := standinKit(t)
	s := proxyService(t, fmt.Sprintf(`vmmw: %s
swapTimeout: 2
models:
  slow:
    cmd: python3 -c "import time; print('loading forever', flush=True); time.sleep(120)"
    proxy: http://127.0.0.1:9
`, k.vmmw))
	t0 := time.Now()
	c := s.ask("slow", "anyone there", askOpts{})
	if c.Status != 504 || c.ErrCode != "SWAP_TIMEOUT" || !strings.Contains(c.Error, "swapTimeout (2s)") {
		t.Fatalf("a request held past swapTimeout: %+v", c)
	}
	if d := time.Since(t0); d < 2*time.Second || d > 20*time.Second {
		t.Fatalf("answered after %s, want about 2 s", d)
	}
	_, ms := s.servers()
	if ms["slow"].State != "starting" || ms["slow"].Counts.Errors != 1 {
		t.Fatalf("slow: %+v", ms["slow"])
	}
	s.stop()
}

// TestProxyShutdownStopsChildren: SIGINT stops every server process.
func TestProxyShutdownStopsChildren(t *testing.T) {
	k := standinKit(t)
	s := proxyService(t, standinConfig(k, "loadAtStart: true"))
	_, ms := s.servers()
	var pids []int
	for _, m := range ms {
		if m.PID == 0 || m.ExecPID == 0 {
			t.Fatalf("loadAtStart left %s without a process: %+v", m.Name, m)
		}
		pids = append(pids, m.PID, m.ExecPID)
	}
	if ms["gamma"].State != "awake" || ms["alpha"].State != "asleep" || ms["beta"].State != "asleep" {
		t.Fatalf("after loadAtStart: %+v", ms)
	}
	s.stop()
	for _, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("server process %d still runs after the service stopped", pid)
		}
	}
}

// TestProxyBadConfig: configurations the proxy mode refuses, each with a
// message naming the key, and exit status 2.
func TestProxyBadConfig(t *testing.T) {
	k := standinKit(t)
	good := func(extra, model string) string {
		return fmt.Sprintf("vmmw: %s\nstartPort: 0\n%s\nmodels:\n  m:\n%s", k.vmmw, extra, model)
	}
	os.Unsetenv("GO_SWAP_TEST_UNSET")
	for _, c := range []struct{ cfg, says string }{
		{good("", "    proxy: http://127.0.0.1:1\n"), "models.m: cmd: missing"},
		{good("", "    cmd: srv\n    policy: reload\n"), `policy "reload": use one of offload, offload_compressed, discard`},
		{good("policy: swap", "    cmd: srv\n"), `policy "swap"`},
		{good("", "    cmd: srv --model ${nope}\n"), "${nope}: no such macro"},
		{good("", "    cmd: srv ${env.GO_SWAP_TEST_UNSET}\n"), "${env.GO_SWAP_TEST_UNSET}: the environment variable is not set"},
		{good("hostMemoryBudget: lots", "    cmd: srv\n"), `hostMemoryBudget "lots"`},
		{good("maxAwake: -1", "    cmd: srv\n"), "maxAwake -1"},
		{good("", "    cmd: srv\n    aliases: [m]\n"), `"m" is already the ID or an alias of m`},
		{good("", "    cmd: srv\n    checkEndpoint: health\n"), `checkEndpoint "health"`},
		{good("", "    cmd: srv\n    env: [NOEQUALS]\n"), `env[0] "NOEQUALS": use NAME=value`},
		{good("", "    cmd: srv\n    proxy: ftp://x\n"), `proxy "ftp://x": not an http:// URL`},
		{good("", "    cmd: 'srv \"unclosed'\n"), "models.m: cmd:"},
		{good("macros:\n  PORT: 1", "    cmd: srv\n"), `"PORT" is reserved`},
		{good("healthCheckTimeout: 1", "    cmd: srv\n    ttl: -5\n"), "ttl -5"},
		{"vmmw: /nonexistent/vmmw\nmodels:\n  m:\n    cmd: srv\n", `vmmw "/nonexistent/vmmw"`},
		{"models: {}\nvmmw: x\n", "models: none configured"},
		{"models:\n  m: [1, 2]\n", "models.m:"},
		{"models:\n  'bad name':\n    cmd: x\n", `"bad name": use 1 to 64`},
	} {
		path := filepath.Join(t.TempDir(), "bad.yaml")
		os.WriteFile(path, []byte(c.cfg), 0o644)
		out, err := exec.Command(binPath, "-config", path, "-listen", "127.0.0.1:0").CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), c.says) {
			t.Errorf("config:\n%s\nexit %v, said %s; want exit 2 and %q", c.cfg, err, out, c.says)
		}
	}
}
