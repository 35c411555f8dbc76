package main

// The service tested as a user runs it: the binary built with `go build`
// (with the race detector), started as a subprocess on the host backend,
// driven over HTTP. Checkpoints are safetensors files written here; the bytes
// a swap wakes are read back through GET /models/{name}/digest and compared
// with the SHA-256 of each tensor's bytes as written.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
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

var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "go-swap-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "go-swap")
	build := exec.Command("go", "build", "-race", "-o", binPath, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the service:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// tensorSpec is one tensor a test checkpoint holds; its bytes are random.
type tensorSpec struct {
	name  string
	dtype string
	shape []int
}

func (t tensorSpec) bytes() int {
	n := map[string]int{"F32": 4, "BF16": 2, "F16": 2, "U8": 1}[t.dtype]
	for _, d := range t.shape {
		n *= d
	}
	return n
}

// writeSafetensors writes specs with bytes drawn from seed; returns each
// tensor's SHA-256 by name.
func writeSafetensors(t *testing.T, path string, seed int64, specs []tensorSpec) map[string]string {
	t.Helper()
	rng := rand.New(rand.NewSource(seed))
	hdr := map[string]interface{}{"__metadata__": map[string]string{"format": "pt"}}
	var data bytes.Buffer
	sums := map[string]string{}
	for _, s := range specs {
		b := make([]byte, s.bytes())
		rng.Read(b)
		hdr[s.name] = map[string]interface{}{"dtype": s.dtype, "shape": s.shape,
			"data_offsets": []int{data.Len(), data.Len() + len(b)}}
		data.Write(b)
		h := sha256.Sum256(b)
		sums[s.name] = hex.EncodeToString(h[:])
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		t.Fatal(err)
	}
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	var out bytes.Buffer
	binary.Write(&out, binary.LittleEndian, uint64(len(js)))
	out.Write(js)
	out.Write(data.Bytes())
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return sums
}

// service is one running go-swap process.
type service struct {
	t      *testing.T
	cmd    *exec.Cmd
	url    string
	stderr *lockedBuffer
	done   chan error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// start runs the service on cfg with env added (VMMW_BACKEND=host always)
// and waits for its "listening on" line.
func start(t *testing.T, cfg interface{}, env ...string) *service {
	t.Helper()
	cfgPath := filepath.Join(t.TempDir(), "config.json")
	js, _ := json.Marshal(cfg)
	if err := os.WriteFile(cfgPath, js, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binPath, "-config", cfgPath, "-listen", "127.0.0.1:0", "-test-endpoints")
	cmd.Env = append(append(os.Environ(), "VMMW_BACKEND=host"), env...)
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
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("the service did not listen within 60 s: %s", s.stderr)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			s.stop()
		}
	})
	return s
}

// stop sends SIGTERM and requires a clean exit.
func (s *service) stop() {
	s.t.Helper()
	s.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-s.done:
		if err != nil {
			s.t.Errorf("the service exited with %v: %s", err, s.stderr)
		}
	case <-time.After(60 * time.Second):
		s.cmd.Process.Kill()
		s.t.Errorf("the service did not exit within 60 s of SIGINT: %s", s.stderr)
	}
}

// call makes one request and decodes the JSON answer into out (when not nil).
func (s *service) call(method, path string, out interface{}) int {
	s.t.Helper()
	req, _ := http.NewRequest(method, s.url+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		s.t.Fatalf("%s %s: Content-Type %q: %s", method, path, ct, body)
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			s.t.Fatalf("%s %s: %v: %s", method, path, err, body)
		}
	}
	return resp.StatusCode
}

// The answers' shapes, as a client reads them.
type cycle struct {
	Model         string  `json:"model"`
	Policy        string  `json:"policy"`
	PhysicalBytes uint64  `json:"physical_bytes"`
	CopiedBytes   uint64  `json:"copied_bytes"`
	ReloadedBytes uint64  `json:"reloaded_bytes"`
	Seconds       float64 `json:"library_seconds"`
}

type swap struct {
	ID           uint64   `json:"id"`
	Model        string   `json:"model"`
	AlreadyAwake bool     `json:"already_awake"`
	Slept        []cycle  `json:"slept"`
	Woke         *cycle   `json:"woke"`
	SleepSeconds float64  `json:"sleep_seconds"`
	WakeSeconds  float64  `json:"wake_seconds"`
	TotalSeconds float64  `json:"total_seconds"`
	SleepBytes   uint64   `json:"sleep_bytes_moved"`
	WakeBytes    uint64   `json:"wake_bytes_moved"`
	ModelBytes   uint64   `json:"model_bytes"`
	Boundaries   []string `json:"timeline_boundaries"`
}

type apiError struct {
	Code       string `json:"code"`
	Error      string `json:"error"`
	Model      string `json:"model"`
	Phase      string `json:"phase"`
	RolledBack *bool  `json:"rolled_back"`
	Swap       *swap  `json:"swap"`
}

type modelView struct {
	Name      string    `json:"name"`
	State     string    `json:"state"`
	Policy    string    `json:"policy"`
	Bytes     uint64    `json:"bytes"`
	Tensors   int       `json:"tensors"`
	LastError *apiError `json:"last_error"`
	Memory    struct {
		LiveBytes       uint64 `json:"live_bytes"`
		ReservedBytes   uint64 `json:"reserved_bytes"`
		TrackedBytes    uint64 `json:"tracked_bytes"`
		DeviceUsedBytes uint64 `json:"device_used_bytes"`
		HostBackupBytes uint64 `json:"host_backup_bytes"`
		OffloadedBytes  uint64 `json:"offloaded_bytes"`
		ReloadableBytes uint64 `json:"reloadable_bytes"`
		Asleep          bool   `json:"asleep"`
	} `json:"memory"`
}

type models struct {
	AwakeBudget int `json:"awake_budget"`
	InFlight    *struct {
		Model string `json:"model"`
		Phase string `json:"phase"`
	} `json:"swap_in_flight"`
	Models []modelView `json:"models"`
}

func (s *service) models() map[string]modelView {
	s.t.Helper()
	var ms models
	if c := s.call("GET", "/models", &ms); c != 200 {
		s.t.Fatalf("GET /models: %d", c)
	}
	out := map[string]modelView{}
	for _, m := range ms.Models {
		out[m.Name] = m
	}
	return out
}

// checkAwake requires exactly the models in awake to be awake (by the
// service's state and by the library's report), the others asleep.
func (s *service) checkAwake(awake ...string) {
	s.t.Helper()
	want := map[string]bool{}
	for _, a := range awake {
		want[a] = true
	}
	for name, m := range s.models() {
		if want[name] {
			if m.State != "awake" || m.Memory.Asleep || m.Memory.TrackedBytes < m.Bytes || m.Memory.LiveBytes < m.Bytes {
				s.t.Fatalf("%s should be awake with its bytes mapped: %+v", name, m)
			}
		} else if m.State != "asleep" || !m.Memory.Asleep || m.Memory.TrackedBytes != 0 {
			s.t.Fatalf("%s should be asleep with nothing mapped: %+v", name, m)
		}
		if m.Memory.ReservedBytes < m.Bytes {
			s.t.Fatalf("%s keeps less address space than its bytes: %+v", name, m)
		}
	}
}

// checkBytes requires the device bytes of model to hash as the file's did.
func (s *service) checkBytes(model string, sums map[string]string) {
	s.t.Helper()
	var d struct {
		Tensors []struct {
			Name   string `json:"name"`
			Bytes  uint64 `json:"bytes"`
			SHA256 string `json:"sha256"`
		} `json:"tensors"`
	}
	if c := s.call("GET", "/models/"+model+"/digest", &d); c != 200 {
		s.t.Fatalf("digest of %s: HTTP %d", model, c)
	}
	if len(d.Tensors) != len(sums) {
		s.t.Fatalf("digest of %s: %d tensors, the file has %d", model, len(d.Tensors), len(sums))
	}
	for _, tn := range d.Tensors {
		if sums[tn.Name] != tn.SHA256 {
			s.t.Fatalf("%s: tensor %s on the device hashes to %s, in the file to %s", model, tn.Name, tn.SHA256, sums[tn.Name])
		}
	}
}

func (s *service) activate(model string) swap {
	s.t.Helper()
	var sw swap
	if c := s.call("POST", "/models/"+model+"/activate", &sw); c != 200 {
		s.t.Fatalf("activate %s: HTTP %d: %s", model, c, s.stderr)
	}
	return sw
}

// fixture is three models: a (offload), b (reload), c (offload, two files).
type fixture struct {
	cfg  map[string]interface{}
	sums map[string]map[string]string
	path map[string][]string
}

func threeModels(t *testing.T, budget int) *fixture {
	dir := t.TempDir()
	f := &fixture{sums: map[string]map[string]string{}, path: map[string][]string{}}
	write := func(model, file string, seed int64, specs []tensorSpec) {
		p := filepath.Join(dir, file)
		if f.sums[model] == nil {
			f.sums[model] = map[string]string{}
		}
		for k, v := range writeSafetensors(t, p, seed, specs) {
			f.sums[model][k] = v
		}
		f.path[model] = append(f.path[model], p)
	}
	write("a", "a.safetensors", 1, []tensorSpec{
		{"embed.weight", "BF16", []int{512, 384}}, {"norm.weight", "F32", []int{384}}, {"head.weight", "F16", []int{300, 384}}})
	write("b", "b.safetensors", 2, []tensorSpec{
		{"layers.0.w", "F32", []int{256, 512}}, {"layers.1.w", "F32", []int{256, 512}}, {"bias", "U8", []int{7}}})
	write("c", "c-00001-of-00002.safetensors", 3, []tensorSpec{{"part1.weight", "BF16", []int{1024, 256}}})
	write("c", "c-00002-of-00002.safetensors", 4, []tensorSpec{{"part2.weight", "BF16", []int{640, 256}}})
	f.cfg = map[string]interface{}{"backend": "host", "awake_budget": budget, "models": []map[string]interface{}{
		{"name": "a", "checkpoints": f.path["a"], "policy": "offload"},
		{"name": "b", "checkpoints": f.path["b"], "policy": "reload"},
		{"name": "c", "checkpoints": f.path["c"], "policy": "offload"},
	}}
	return f
}

// timeline is GET /timeline: each device's boundaries.
type timeline map[string]struct {
	Boundaries []struct {
		Name   string  `json:"name"`
		AtS    float64 `json:"at_s"`
		Report struct {
			Tags []struct {
				Tag          string `json:"tag"`
				TrackedBytes uint64 `json:"tracked_bytes"`
				Asleep       bool   `json:"asleep"`
			} `json:"tags"`
		} `json:"report"`
	} `json:"boundaries"`
}

func TestSwapsAmongThreeModels(t *testing.T) {
	f := threeModels(t, 1)
	s := start(t, f.cfg)
	s.checkAwake()

	prev := ""
	for i, name := range []string{"a", "b", "c", "a", "c", "b", "a", "b"} {
		sw := s.activate(name)
		if sw.AlreadyAwake || sw.Model != name || sw.Woke == nil || sw.Woke.Model != name {
			t.Fatalf("swap %d to %s: %+v", i, name, sw)
		}
		// The sleep and the wake run at once: the swap takes as long as the longer.
		if sw.WakeSeconds <= 0 || sw.TotalSeconds < math.Max(sw.WakeSeconds, sw.SleepSeconds) || sw.Woke.PhysicalBytes < sw.ModelBytes {
			t.Fatalf("swap %d to %s: times or mapped bytes wrong: %+v", i, name, sw)
		}
		// The woken model's bytes came back from the host backup (offload) or
		// from the checkpoint (reload).
		moved := sw.Woke.CopiedBytes
		if name == "b" {
			moved = sw.Woke.ReloadedBytes
		}
		if moved < sw.ModelBytes || sw.WakeBytes < sw.ModelBytes {
			t.Fatalf("swap %d to %s: woke %d bytes of a %d-byte model: %+v", i, name, moved, sw.ModelBytes, sw.Woke)
		}
		if prev == "" {
			if len(sw.Slept) != 0 || sw.SleepSeconds != 0 {
				t.Fatalf("first swap slept something: %+v", sw)
			}
		} else {
			if len(sw.Slept) != 1 || sw.Slept[0].Model != prev || sw.SleepSeconds <= 0 || sw.Slept[0].PhysicalBytes == 0 {
				t.Fatalf("swap %d to %s should have slept %s: %+v", i, name, prev, sw)
			}
			if prev != "b" && sw.SleepBytes < f.modelBytes(s, prev) {
				t.Fatalf("swap %d: offloading %s moved %d bytes", i, prev, sw.SleepBytes)
			}
		}
		if len(sw.Boundaries) != 3 || !strings.HasSuffix(sw.Boundaries[2], name+": awake") {
			t.Fatalf("swap %d boundaries: %q", i, sw.Boundaries)
		}
		s.checkAwake(name)
		s.checkBytes(name, f.sums[name])
		prev = name
	}
	if again := s.activate("b"); !again.AlreadyAwake || len(again.Slept) != 0 {
		t.Fatalf("activating the awake model swapped: %+v", again)
	}

	// Every swap is in the history, and its boundaries in the library's
	// timeline, in order, with the woken tag mapped and the slept one not.
	var hist struct {
		Swaps []swap `json:"swaps"`
	}
	s.call("GET", "/swaps", &hist)
	if len(hist.Swaps) != 9 {
		t.Fatalf("history holds %d swaps, want 9", len(hist.Swaps))
	}
	var tl timeline
	if c := s.call("GET", "/timeline", &tl); c != 200 {
		t.Fatalf("GET /timeline: %d", c)
	}
	bs := tl["0"].Boundaries
	at := map[string]int{}
	for i, b := range bs {
		at[b.Name] = i
	}
	last := -1
	for _, sw := range hist.Swaps[:8] {
		for _, name := range sw.Boundaries {
			i, ok := at[name]
			if !ok || i <= last {
				t.Fatalf("boundary %q missing from the timeline or out of order", name)
			}
			last = i
		}
		awake := bs[at[sw.Boundaries[2]]]
		seen := 0
		for _, tg := range awake.Report.Tags {
			if tg.Tag == "model/"+sw.Model {
				seen++
			}
			if tg.Tag == "model/"+sw.Model && (tg.Asleep || tg.TrackedBytes < sw.ModelBytes) {
				t.Fatalf("timeline at %q: %s not mapped: %+v", sw.Boundaries[2], sw.Model, tg)
			}
			if len(sw.Slept) == 1 && tg.Tag == "model/"+sw.Slept[0].Model && (!tg.Asleep || tg.TrackedBytes != 0) {
				t.Fatalf("timeline at %q: %s still mapped: %+v", sw.Boundaries[2], sw.Slept[0].Model, tg)
			}
		}
		if seen != 1 {
			t.Fatalf("timeline at %q: no tag model/%s in %+v", sw.Boundaries[2], sw.Model, awake.Report.Tags)
		}
	}
	var rep map[string]json.RawMessage
	if c := s.call("GET", "/report", &rep); c != 200 || len(rep["0"]) == 0 {
		t.Fatalf("GET /report: %d %v", c, rep)
	}
	s.stop()
}

func (f *fixture) modelBytes(s *service, name string) uint64 {
	return s.models()[name].Bytes
}

func TestConcurrentRequestsAreSerialised(t *testing.T) {
	f := threeModels(t, 1)
	s := start(t, f.cfg)
	names := []string{"a", "b", "c"}
	var wg sync.WaitGroup
	var mu sync.Mutex
	ids := map[uint64]bool{}
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				name := names[(g+i)%3]
				req, _ := http.NewRequest("POST", s.url+"/models/"+name+"/activate", nil)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				var sw swap
				json.NewDecoder(resp.Body).Decode(&sw)
				resp.Body.Close()
				mu.Lock()
				if resp.StatusCode != 200 || sw.Model != name || ids[sw.ID] {
					t.Errorf("activate %s: HTTP %d, %+v", name, resp.StatusCode, sw)
				}
				ids[sw.ID] = true
				mu.Unlock()
			}
		}(g)
	}
	wg.Wait()
	var awake []string
	for n, m := range s.models() {
		if m.State == "awake" {
			awake = append(awake, n)
		}
	}
	if len(awake) != 1 {
		t.Fatalf("after concurrent swaps %d models are awake: %v", len(awake), awake)
	}
	s.checkAwake(awake[0])
	s.checkBytes(awake[0], f.sums[awake[0]])
	s.stop()
}

func TestSwapInFlight(t *testing.T) {
	f := threeModels(t, 1)
	s := start(t, f.cfg)
	s.activate("a")
	s.call("POST", "/test/pause", nil)
	first := make(chan swap, 1)
	go func() {
		var sw swap
		s.call("POST", "/models/b/activate", &sw)
		first <- sw
	}()
	waitFor(t, func() bool {
		var ms models
		s.call("GET", "/models", &ms)
		return ms.InFlight != nil && ms.InFlight.Model == "b" && ms.InFlight.Phase == "paused"
	})
	// Mid-swap, a is asleep and b not yet awake: GET /models says so.
	s.checkAwake()
	var e apiError
	if c := s.call("POST", "/models/c/activate?wait=false", &e); c != http.StatusConflict || e.Code != "SWAP_IN_FLIGHT" || !strings.Contains(e.Error, `"b"`) {
		t.Fatalf("activate during a swap: HTTP %d %+v", c, e)
	}
	queued := make(chan swap, 1)
	go func() {
		var sw swap
		s.call("POST", "/models/c/activate", &sw)
		queued <- sw
	}()
	time.Sleep(100 * time.Millisecond)
	s.call("POST", "/test/resume", nil)
	if sw := <-first; sw.Model != "b" || sw.Woke == nil {
		t.Fatalf("the paused swap: %+v", sw)
	}
	if sw := <-queued; sw.Model != "c" || len(sw.Slept) != 1 || sw.Slept[0].Model != "b" {
		t.Fatalf("the queued swap: %+v", sw)
	}
	s.checkAwake("c")
	s.checkBytes("c", f.sums["c"])
	s.stop()
}

func TestBadRequests(t *testing.T) {
	f := threeModels(t, 1)
	s := start(t, f.cfg)
	var e apiError
	for _, r := range []struct{ method, path string }{
		{"POST", "/models/nope/activate"}, {"GET", "/models/nope/digest"}, {"GET", "/models/nope"},
	} {
		if c := s.call(r.method, r.path, &e); c != 404 || e.Code != "UNKNOWN_MODEL" || e.Model != "nope" {
			t.Fatalf("%s %s: HTTP %d %+v", r.method, r.path, c, e)
		}
	}
	if c := s.call("GET", "/models/a/digest", &e); c != 409 || e.Code != "MODEL_ASLEEP" {
		t.Fatalf("digest of an asleep model: HTTP %d %+v", c, e)
	}
	if c := s.call("GET", "/models/a/activate", &e); c != 405 {
		t.Fatalf("GET activate: HTTP %d %+v", c, e)
	}
	if c := s.call("POST", "/models/a/activate?wait=maybe", &e); c != 400 || e.Code != "BAD_REQUEST" {
		t.Fatalf("wait=maybe: HTTP %d %+v", c, e)
	}
	if c := s.call("GET", "/models/a/bogus", &e); c != 404 || e.Code != "NOT_FOUND" {
		t.Fatalf("unknown endpoint: HTTP %d %+v", c, e)
	}
	// Nothing of that changed a state.
	s.checkAwake()
	s.stop()
}

func TestReloadCheckpointChangedOnDisk(t *testing.T) {
	f := threeModels(t, 1)
	s := start(t, f.cfg)
	s.activate("b")
	s.activate("a")
	// b sleeps with Reload; its file changes under it (same size, new bytes).
	path := f.path["b"][0]
	writeSafetensors(t, path, 99, []tensorSpec{
		{"layers.0.w", "F32", []int{256, 512}}, {"layers.1.w", "F32", []int{256, 512}}, {"bias", "U8", []int{7}}})
	later := time.Now().Add(time.Hour)
	os.Chtimes(path, later, later)
	for attempt := 0; attempt < 2; attempt++ {
		var e apiError
		c := s.call("POST", "/models/b/activate", &e)
		if c != http.StatusConflict || e.Code != "VMMW_CHECKPOINT_INVALID" || e.Phase != "wake" || e.RolledBack == nil || !*e.RolledBack {
			t.Fatalf("waking b after its file changed: HTTP %d %+v", c, e)
		}
		if e.Swap == nil || len(e.Swap.Slept) != 1 || e.Swap.Slept[0].Model != "a" {
			t.Fatalf("the failed swap should show a slept then woken again: %+v", e.Swap)
		}
		// b is still asleep, a (slept for the swap) awake again with its bytes.
		s.checkAwake("a")
		s.checkBytes("a", f.sums["a"])
		if b := s.models()["b"]; b.LastError == nil || b.LastError.Code != "VMMW_CHECKPOINT_INVALID" {
			t.Fatalf("b's last error: %+v", b.LastError)
		}
	}
	// The service still serves the others.
	s.activate("c")
	s.checkAwake("c")
	s.checkBytes("c", f.sums["c"])
	s.activate("a")
	s.checkBytes("a", f.sums["a"])
	s.stop()
}

// A wake that does not fit the device fails with the library's status and
// puts back the model slept for it: budget 2, a and b awake, then c (larger
// than what a's sleep frees) is refused and a is awake again.
func TestWakeOutOfMemoryRollsBack(t *testing.T) {
	dir := t.TempDir()
	sums := map[string]map[string]string{}
	for i, m := range []struct {
		name string
		rows int
	}{{"a", 6 * 1024}, {"b", 6 * 1024}, {"c", 10 * 1024}} {
		p := filepath.Join(dir, m.name+".safetensors")
		sums[m.name] = writeSafetensors(t, p, int64(i), []tensorSpec{{"w", "F32", []int{m.rows, 1024}}})
	}
	// 24 MiB for a and b each, 40 MiB for c (each over the pool's 20 MiB
	// segments, so each in its own): a and b fit together, c alone, c with b not.
	cfg := map[string]interface{}{"backend": "host", "awake_budget": 2, "models": []map[string]interface{}{
		{"name": "a", "checkpoints": []string{filepath.Join(dir, "a.safetensors")}, "policy": "offload"},
		{"name": "b", "checkpoints": []string{filepath.Join(dir, "b.safetensors")}, "policy": "offload"},
		{"name": "c", "checkpoints": []string{filepath.Join(dir, "c.safetensors")}, "policy": "reload"},
	}}
	s := start(t, cfg, "VMMW_HOST_MEMORY=56M", "VMMW_HOST_GRANULARITY=2M")
	s.activate("a")
	s.activate("b")
	s.checkAwake("a", "b")
	var e apiError
	c := s.call("POST", "/models/c/activate", &e)
	if c != http.StatusInsufficientStorage || e.Code != "VMMW_OUT_OF_MEMORY" || e.Phase != "wake" || e.RolledBack == nil || !*e.RolledBack {
		t.Fatalf("waking c beyond device memory: HTTP %d %+v", c, e)
	}
	// The swap was refused before anything moved: the waking model needs
	// more than the free memory plus what a (the least recently used) holds.
	if e.Swap == nil || len(e.Swap.Slept) != 0 || !strings.Contains(e.Error, "sleeping tags free") {
		t.Fatalf("the failed swap should have been refused with nothing slept: %+v %+v", e, e.Swap)
	}
	s.checkAwake("a", "b")
	s.checkBytes("a", sums["a"])
	s.checkBytes("b", sums["b"])
	// With budget 2 and a and b awake, nothing else happened: the pool still serves.
	s.activate("b")
	s.checkAwake("a", "b")
	s.stop()
}

// SIGTERM during a swap: the swap finishes and answers, the process exits 0.
func TestGracefulShutdown(t *testing.T) {
	f := threeModels(t, 1)
	s := start(t, f.cfg)
	s.activate("a")
	s.call("POST", "/test/pause", nil)
	got := make(chan int, 1)
	go func() {
		var sw swap
		req, _ := http.NewRequest("POST", s.url+"/models/c/activate", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			got <- -1
			return
		}
		json.NewDecoder(resp.Body).Decode(&sw)
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	waitFor(t, func() bool {
		var ms models
		s.call("GET", "/models", &ms)
		return ms.InFlight != nil && ms.InFlight.Phase == "paused"
	})
	s.stop()
	if c := <-got; c != 200 {
		t.Fatalf("the swap in flight at shutdown answered %d: %s", c, s.stderr)
	}
	if !strings.Contains(s.stderr.String(), "go-swap: closed") {
		t.Fatalf("no clean close: %s", s.stderr)
	}
	if _, err := http.Get(s.url + "/healthz"); err == nil {
		t.Fatal("the service still answers after exiting")
	}
}

// A configuration the service cannot serve stops it at start, naming the fault.
func TestBadConfigStopsStart(t *testing.T) {
	f := threeModels(t, 1)
	missing := filepath.Join(t.TempDir(), "missing.safetensors")
	notCkpt := filepath.Join(t.TempDir(), "junk.safetensors")
	os.WriteFile(notCkpt, []byte("not a checkpoint at all"), 0o644)
	for _, c := range []struct {
		edit func(m map[string]interface{})
		says string
	}{
		{func(m map[string]interface{}) { m["checkpoints"] = []string{missing} }, "missing.safetensors"},
		{func(m map[string]interface{}) { m["checkpoints"] = []string{notCkpt} }, "junk.safetensors"},
		{func(m map[string]interface{}) { m["policy"] = "discard" }, `policy "discard"`},
		{func(m map[string]interface{}) { m["name"] = "a/b" }, `name "a/b"`},
		{func(m map[string]interface{}) { m["name"] = "b" }, `"b": configured twice`},
		{func(m map[string]interface{}) { m["checkpoints"] = []string{} }, "checkpoints: none given"},
		{func(m map[string]interface{}) { m["device"] = -1 }, "device -1"},
		{func(m map[string]interface{}) { m["polcy"] = "reload" }, `unknown field "polcy"`},
		{func(m map[string]interface{}) { m["device"] = 9 }, "device 9"},
	} {
		ms := f.cfg["models"].([]map[string]interface{})
		m := map[string]interface{}{}
		for k, v := range ms[0] {
			m[k] = v
		}
		c.edit(m)
		cfg := map[string]interface{}{"backend": "host", "models": []map[string]interface{}{m, ms[1]}}
		p := filepath.Join(t.TempDir(), "config.json")
		js, _ := json.Marshal(cfg)
		os.WriteFile(p, js, 0o644)
		cmd := exec.Command(binPath, "-config", p, "-listen", "127.0.0.1:0")
		cmd.Env = append(os.Environ(), "VMMW_BACKEND=host")
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), c.says) {
			t.Fatalf("config %v: exit %v, output %s (want it to name %s)", m, err, out, c.says)
		}
	}
}

// Settings of the whole configuration, refused the same way.
func TestBadSettingsStopStart(t *testing.T) {
	f := threeModels(t, 1)
	for _, c := range []struct {
		key  string
		val  interface{}
		says string
	}{
		{"awake_budget", -1, "awake_budget -1"},
		{"backend", "tpu", `backend "tpu"`},
		{"models", []interface{}{}, "models: none configured"},
	} {
		cfg := map[string]interface{}{}
		for k, v := range f.cfg {
			cfg[k] = v
		}
		cfg[c.key] = c.val
		p := filepath.Join(t.TempDir(), "config.json")
		js, _ := json.Marshal(cfg)
		os.WriteFile(p, js, 0o644)
		out, err := exec.Command(binPath, "-config", p).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), c.says) {
			t.Fatalf("%s = %v: exit %v, output %s (want it to name %s)", c.key, c.val, err, out, c.says)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Each device has its own pool and budget: a swap on one never sleeps a
// model of another.
func TestDevicesSwapApart(t *testing.T) {
	f := threeModels(t, 1)
	ms := f.cfg["models"].([]map[string]interface{})
	ms[2]["device"] = 1
	s := start(t, f.cfg, "VMMW_HOST_DEVICES=2")
	s.activate("a")
	if sw := s.activate("c"); len(sw.Slept) != 0 {
		t.Fatalf("waking c on device 1 slept a model: %+v", sw)
	}
	s.checkAwake("a", "c")
	if sw := s.activate("b"); len(sw.Slept) != 1 || sw.Slept[0].Model != "a" {
		t.Fatalf("waking b on device 0 should sleep a only: %+v", sw)
	}
	s.checkAwake("b", "c")
	s.checkBytes("b", f.sums["b"])
	s.checkBytes("c", f.sums["c"])
	var tl timeline
	s.call("GET", "/timeline", &tl)
	if len(tl["0"].Boundaries) == 0 || len(tl["1"].Boundaries) == 0 {
		t.Fatalf("a timeline per device expected, got devices %d", len(tl))
	}
	s.stop()
}
