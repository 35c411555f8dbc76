package main

// The proxy mode tested as a user runs it: the service binary (built with
// the race detector by TestMain) started as a process on a llama-swap YAML
// configuration, fronting real child processes: the stand-in llama-server
// (standin/standin_server.py) whose weights and KV cache live in CUDA
// memory served by the interposer under `vmmw exec`. Clients speak the
// OpenAI API to it, streaming and not, concurrently.

import (
	"bufio"
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

// TestProxyAPIKeys: with apiKeys, every endpoint but /health needs a key,
// as a bearer token, a Basic password or x-api-key.
func TestProxyAPIKeys(t *testing.T) {
	k := standinKit(t)
	s := proxyService(t, fmt.Sprintf("vmmw: %s\napiKeys: [sk-one, sk-two]\nmodels:\n  m:\n    cmd: srv\n", k.vmmw))
	get := func(path string, set func(*http.Request)) int {
		req, _ := http.NewRequest("GET", s.url+path, nil)
		set(req)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	none := func(*http.Request) {}
	for _, c := range []struct {
		path string
		set  func(*http.Request)
		want int
	}{
		{"/health", none, 200},
		{"/v1/models", none, 401},
		{"/models", none, 401},
		{"/upstream/m/health", none, 401},
		{"/v1/models", func(r *http.Request) { r.Header.Set("Authorization", "Bearer sk-wrong") }, 401},
		{"/v1/models", func(r *http.Request) { r.Header.Set("Authorization", "Bearer sk-two") }, 200},
		{"/models", func(r *http.Request) { r.Header.Set("x-api-key", "sk-one") }, 200},
		{"/swaps", func(r *http.Request) { r.SetBasicAuth("anyone", "sk-one") }, 200},
	} {
		if got := get(c.path, c.set); got != c.want {
			t.Errorf("GET %s: %d, want %d", c.path, got, c.want)
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
		{good("apiKeys: ['sk one']", "    cmd: srv\n"), "apiKeys[0]: empty, or with a space"},
	} {
		path := filepath.Join(t.TempDir(), "bad.yaml")
		os.WriteFile(path, []byte(c.cfg), 0o644)
		out, err := exec.Command(binPath, "-config", path, "-listen", "127.0.0.1:0").CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), c.says) {
			t.Errorf("config:\n%s\nexit %v, said %s; want exit 2 and %q", c.cfg, err, out, c.says)
		}
	}
}
