package vmmw

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"
)

func hostPool(t *testing.T) *Pool {
	t.Helper()
	p, err := NewPool(PoolOptions{Backend: BackendHost})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func mustTag(t *testing.T, name string) Tag {
	t.Helper()
	tag, err := TagID(name)
	if err != nil {
		t.Fatal(err)
	}
	return tag
}

func TestTagsAndPoolReports(t *testing.T) {
	p := hostPool(t)
	w := mustTag(t, "go-weights")
	if n, _ := w.Name(); n != "go-weights" {
		t.Fatalf("tag name %q", n)
	}
	var inScope uint64
	err := WithTag(w, func() error {
		cur, _ := CurrentTag()
		if cur != w {
			return fmt.Errorf("current tag %d, want %d", cur, w)
		}
		var err error
		inScope, err = p.Alloc(3 << 20)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	outside, err := p.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	rw, _ := p.ReportTag(w)
	rd, _ := p.ReportTag(TagDefault)
	if rw.LiveBlocks != 1 || rd.LiveBlocks != 1 {
		t.Fatalf("blocks per tag: weights %d default %d", rw.LiveBlocks, rd.LiveBlocks)
	}
	js, err := p.ReportJSON()
	if err != nil || !json.Valid([]byte(js)) || !strings.Contains(js, "go-weights") {
		t.Fatalf("report JSON %v: %s", err, js)
	}
	if err := p.Free(inScope); err != nil {
		t.Fatal(err)
	}
	if err := p.Free(inScope); !errors.Is(err, ErrUnknownPointer) {
		t.Fatalf("double free: %v", err)
	}
	p.Free(outside)
	if released, err := p.Trim(); err != nil || released == 0 {
		t.Fatalf("trim released %d, %v", released, err)
	}
}

func TestSleepWakeKeepsOffloadedBytes(t *testing.T) {
	p := hostPool(t)
	w, kv := mustTag(t, "go-sleep-w"), mustTag(t, "go-sleep-kv")
	pw, err := p.AllocTagged(4<<20, w)
	if err != nil {
		t.Fatal(err)
	}
	pkv, err := p.AllocTagged(2<<20, kv)
	if err != nil {
		t.Fatal(err)
	}
	in := bytes.Repeat([]byte("stable addresses "), 1000)
	if err := p.Write(pw+77, in); err != nil {
		t.Fatal(err)
	}
	if err := p.Sleep(TagPolicy{w, Offload}, TagPolicy{kv, Discard}); err != nil {
		t.Fatal(err)
	}
	r, _ := p.Report()
	if !r.Asleep || r.TrackedBytes != 0 || r.OffloadedBytes == 0 || r.DiscardedBytes == 0 {
		t.Fatalf("asleep report %+v", r)
	}
	if err := p.Read(pw+77, make([]byte, 8)); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("read while asleep: %v", err)
	}
	backup := make([]byte, len(in))
	if tag, err := p.ReadBackup(pw+77, backup); err != nil || tag != w || !bytes.Equal(in, backup) {
		t.Fatalf("backup read while asleep: tag %v, %v, equal=%v", tag, err, bytes.Equal(in, backup))
	}
	if _, err := p.ReadBackup(pkv, make([]byte, 8)); !errors.Is(err, ErrInvalidState) {
		t.Fatal("backup read of the discarded tag's memory succeeded")
	}
	if view, tag, err := p.BackupView(pw+77, len(in)); err != nil || tag != w || !bytes.Equal(in, unsafe.Slice((*byte)(view), len(in))) {
		t.Fatalf("backup view while asleep: tag %v, %v", tag, err)
	}
	if _, _, err := p.BackupView(pkv, 8); !errors.Is(err, ErrInvalidState) {
		t.Fatal("backup view of the discarded tag's memory succeeded")
	}
	if _, _, err := p.BackupView(pw, -1); err == nil {
		t.Fatal("backup view of a negative length succeeded")
	}
	if err := p.Sleep(TagPolicy{w, Policy(9)}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad policy: %v", err)
	}
	if err := p.Wake(context.Background()); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, len(in))
	if err := p.Read(pw+77, out); err != nil || !bytes.Equal(in, out) {
		t.Fatalf("after wake: %v, equal=%v", err, bytes.Equal(in, out))
	}
}

// writeSafetensors writes F32 tensors to path.
func writeSafetensors(t *testing.T, path string, names []string, data [][]float32) {
	t.Helper()
	hdr := map[string]any{}
	var off int
	var body bytes.Buffer
	for i, n := range names {
		hdr[n] = map[string]any{"dtype": "F32", "shape": []int{len(data[i])}, "data_offsets": []int{off, off + 4*len(data[i])}}
		for _, v := range data[i] {
			binary.Write(&body, binary.LittleEndian, math.Float32bits(v))
		}
		off += 4 * len(data[i])
	}
	h, _ := json.Marshal(hdr)
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	var f bytes.Buffer
	binary.Write(&f, binary.LittleEndian, uint64(len(h)))
	f.Write(h)
	f.Write(body.Bytes())
	if err := os.WriteFile(path, f.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoaderLoadsAndReloads(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "model.safetensors")
	a := make([]float32, 3000)
	for i := range a {
		a[i] = float32(i) / 7
	}
	writeSafetensors(t, path, []string{"x.weight", "y.bias"}, [][]float32{a, {1, 2, 3}})
	if _, err := OpenLoader(filepath.Join(dir, "missing")); !errors.Is(err, ErrIO) {
		t.Fatalf("missing checkpoint: %v", err)
	}
	p := hostPool(t)
	tag := mustTag(t, "go-loaded")
	l, err := OpenLoader(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Allocate(p, tag); err != nil {
		t.Fatal(err)
	}
	names, _ := l.DestinationNames()
	if strings.Join(names, ",") != "x.weight,y.bias" {
		t.Fatalf("destinations %v", names)
	}
	plan, err := l.Plan()
	if err != nil || plan.SrcBytes != 4*3003 {
		t.Fatalf("plan %+v %v", plan, err)
	}
	var calls, last atomic.Uint64
	res, err := l.Load(context.Background(), p, func(done, total uint64) bool { calls.Add(1); last.Store(done); return false })
	if err != nil {
		t.Fatal(err)
	}
	if res.Bytes != plan.SrcBytes || calls.Load() == 0 || last.Load() != res.Bytes {
		t.Fatalf("result %+v, %d progress calls, last %d", res, calls.Load(), last.Load())
	}
	d, err := l.Destination("x.weight")
	if err != nil || d.Dtype != "F32" || len(d.Shape) != 1 || d.Shape[0] != 3000 {
		t.Fatalf("destination %+v %v", d, err)
	}
	check := func(when string) {
		b := make([]byte, d.Bytes)
		if err := p.Read(d.Ptr, b); err != nil {
			t.Fatal(err)
		}
		for i := range a {
			if math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])) != a[i] {
				t.Fatalf("%s: element %d differs", when, i)
			}
		}
	}
	check("after load")
	staging, err := p.StagingBytes()
	if err != nil || staging == 0 {
		t.Fatalf("staging after a default load: %d %v", staging, err)
	}
	if released, err := p.ReleaseStaging(); err != nil || released != staging {
		t.Fatalf("released %d of %d: %v", released, staging, err)
	}
	if staging, err := p.StagingBytes(); err != nil || staging != 0 {
		t.Fatalf("staging after release: %d %v", staging, err)
	}
	if err := p.Sleep(TagPolicy{tag, Reload}); err != nil {
		t.Fatal(err)
	}
	if err := p.Wake(context.Background(), tag); err != nil {
		t.Fatal(err)
	}
	check("after reload")

	// A sleep asked from inside the load is refused with ErrLoadInProgress.
	var sleepErr error
	if _, err := l.Load(context.Background(), p, func(done, total uint64) bool {
		sleepErr = p.Sleep(TagPolicy{tag, Discard})
		return false
	}); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(sleepErr, ErrLoadInProgress) {
		t.Fatalf("sleep during the load: %v", sleepErr)
	}

	// The file rewritten while the tag sleeps with Reload: the wake is refused
	// and the tag stays asleep; forgetting the sources lets it wake, then the
	// new file loads.
	if err := l.SetReloadCheck(true); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Load(context.Background(), p, nil); err != nil {
		t.Fatal(err)
	}
	if err := p.Sleep(TagPolicy{tag, Reload}); err != nil {
		t.Fatal(err)
	}
	a[0] = -1
	writeSafetensors(t, path, []string{"x.weight", "y.bias"}, [][]float32{a, {1, 2, 3}})
	if err := p.Wake(context.Background(), tag); !errors.Is(err, ErrCheckpointInvalid) {
		t.Fatalf("wake after the file changed: %v", err)
	}
	if err := p.ForgetReload(tag); err != nil {
		t.Fatal(err)
	}
	if err := p.Wake(context.Background(), tag); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Load(context.Background(), p, nil); err != nil {
		t.Fatal(err)
	}
	check("after loading the rewritten file")
	if err := l.Cancel(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Load(context.Background(), p, nil); !errors.Is(err, ErrCancelled) {
		t.Fatalf("cancelled load: %v", err)
	}
}

// loadedPool is a host pool with one F32 checkpoint of n elements loaded
// under a fresh tag, and its loader.
func loadedPool(t *testing.T, tagName string, n int) (*Pool, *Loader, Tag) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "model.safetensors")
	a := make([]float32, n)
	for i := range a {
		a[i] = float32(i)
	}
	writeSafetensors(t, path, []string{"w"}, [][]float32{a})
	p := hostPool(t)
	tag := mustTag(t, tagName)
	l, err := OpenLoader(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if err := l.Allocate(p, tag); err != nil {
		t.Fatal(err)
	}
	return p, l, tag
}

func TestLoadContextCancelStopsOnlyThatLoad(t *testing.T) {
	p, l, _ := loadedPool(t, "go-ctx", 4<<20)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Load(done, p, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("load with a done context: %v", err)
	}
	if _, err := l.Result(); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("a load ran despite the done context: %v", err)
	}
	// A context cancelled once the load is under way reaches the loader
	// through vmmw_loader_cancel: the hooks cancel just before the C load
	// starts and wait until the cancellation was forwarded, so the loader
	// sees it at its first cancellation point.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	forwarded := make(chan struct{})
	testHookCancelForwarded = func() { close(forwarded) }
	testHookBeforeLoad = func() { cancel(); <-forwarded }
	_, err := l.Load(ctx, p, nil)
	testHookBeforeLoad, testHookCancelForwarded = nil, nil
	if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrCancelled) {
		t.Fatalf("load cancelled through its context: %v", err)
	}
	// Whatever the race, the next load is not cancelled by the old context.
	for i := 0; i < 20; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		_, err := l.Load(ctx, p, nil)
		cancel()
		if err != nil {
			t.Fatalf("load %d after a cancelled one: %v", i, err)
		}
	}
	js, err := l.ResultJSON()
	var parsed map[string]any
	if err != nil || json.Unmarshal([]byte(js), &parsed) != nil || parsed["src_bytes"] != float64(16<<20) {
		t.Fatalf("ResultJSON %v: %s", err, js)
	}
}

func TestWakeWithDoneContextChangesNothing(t *testing.T) {
	p, _, tag := loadedPool(t, "go-wake-ctx", 4096)
	if err := p.Sleep(TagPolicy{tag, Offload}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Wake(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("wake with a done context: %v", err)
	}
	if r, _ := p.ReportTag(tag); !r.Asleep {
		t.Fatalf("tag woke despite the done context: %+v", r)
	}
	if err := p.Wake(context.Background(), tag); err != nil {
		t.Fatal(err)
	}
	js, err := p.LastCycleJSON()
	if err != nil || !json.Valid([]byte(js)) || !strings.Contains(js, "go-wake-ctx") {
		t.Fatalf("LastCycleJSON %v: %s", err, js)
	}
}

func TestSleepOptionsTimelineAndTagModes(t *testing.T) {
	p := hostPool(t)
	w := mustTag(t, "go-opts")
	if _, err := p.AllocTagged(8<<20, w); err != nil {
		t.Fatal(err)
	}
	// A host memory limit below the tag's size refuses the offload up front.
	if err := p.SetSleepOptions(SleepOptions{HostMemoryLimit: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if err := p.Sleep(TagPolicy{w, Offload}); !errors.Is(err, ErrHostOutOfMemory) {
		t.Fatalf("offload over the host limit: %v", err)
	}
	if err := p.SetSleepOptions(SleepOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := p.Snapshot("go before sleep"); err != nil {
		t.Fatal(err)
	}
	if err := p.Sleep(TagPolicy{w, Offload}); err != nil {
		t.Fatal(err)
	}
	if err := p.Snapshot("go asleep"); err != nil {
		t.Fatal(err)
	}
	js, err := p.TimelineJSON()
	if err != nil || !json.Valid([]byte(js)) || !strings.Contains(js, "go before sleep") || !strings.Contains(js, "go asleep") {
		t.Fatalf("TimelineJSON %v: %s", err, js)
	}
	if err := p.Wake(context.Background()); err != nil {
		t.Fatal(err)
	}
	a := mustTag(t, "go-arena")
	if err := p.SetTagArena(a, 64<<20, 2<<20); err != nil {
		t.Fatal(err)
	}
	if err := p.SetTagSegments(a); err != nil {
		t.Fatal(err)
	}
	if err := p.SetTagSegments(Tag(1 << 30)); !errors.Is(err, ErrUnknownTag) {
		t.Fatalf("unknown tag: %v", err)
	}
}

func TestProcessDefaultTag(t *testing.T) {
	d := mustTag(t, "go-process-default")
	if err := SetProcessDefaultTag(d); err != nil {
		t.Fatal(err)
	}
	defer SetProcessDefaultTag(TagDefault)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if cur, err := CurrentTag(); err != nil || cur != d {
		t.Fatalf("current tag %d %v, want %d", cur, err, d)
	}
	if err := SetProcessDefaultTag(Tag(1 << 30)); !errors.Is(err, ErrUnknownTag) {
		t.Fatalf("unknown tag: %v", err)
	}
}

func TestLoadDevicesFillsReplicasOverPeers(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "model.safetensors")
	a := make([]float32, 512)
	for i := range a {
		a[i] = float32(i) * 0.5
	}
	writeSafetensors(t, path, []string{"w"}, [][]float32{a})
	tag := mustTag(t, "go-multi")
	var pools []*Pool
	var loaders []*Loader
	for d := 0; d < 2; d++ {
		p, err := NewPool(PoolOptions{Backend: BackendHost, Device: d})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if ok, err := p.CanAccessPeer(1 - d); err != nil || !ok {
			t.Fatalf("device %d cannot reach its peer: %v", d, err)
		}
		l, err := OpenLoader(path)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if err := l.Allocate(p, tag); err != nil {
			t.Fatal(err)
		}
		pools, loaders = append(pools, p), append(loaders, l)
	}
	r, err := LoadDevices(loaders, pools, MultiReplicas)
	if err != nil {
		t.Fatal(err)
	}
	if r.HostBytes != 4*512 || r.PeerBytes != 4*512 || r.DeliveredBytes != 2*4*512 {
		t.Fatalf("result %+v", r)
	}
	for d, p := range pools {
		dst, _ := loaders[d].Destination("w")
		b := make([]byte, dst.Bytes)
		if err := p.Read(dst.Ptr, b); err != nil {
			t.Fatal(err)
		}
		for i := range a {
			if math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])) != a[i] {
				t.Fatalf("device %d element %d differs", d, i)
			}
		}
	}
	peers, err := pools[0].PeerAccess(tag)
	if err != nil || len(peers) != 1 || peers[0] != (PeerAccess{1, AccessRead}) {
		t.Fatalf("peers %+v %v", peers, err)
	}
	if err := pools[0].SetPeerAccess(tag, PeerAccess{0, AccessRead}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("own device as a peer: %v", err)
	}
	if _, err := LoadDevices([]*Loader{loaders[0], loaders[0]}, pools, MultiRanks); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("loader listed twice: %v", err)
	}
	// Replicas slept without backups wake by one checkpoint fan-out.
	for _, p := range pools {
		if err := p.Sleep(TagPolicy{tag, Discard}); err != nil {
			t.Fatal(err)
		}
	}
	w, err := WakeReplicasByReload(loaders, pools)
	if err != nil || w.HostBytes != 4*512 || w.PeerBytes != 4*512 {
		t.Fatalf("wake from the checkpoint: %+v %v", w, err)
	}
	dst, _ := loaders[1].Destination("w")
	b := make([]byte, dst.Bytes)
	if err := pools[1].Read(dst.Ptr, b); err != nil {
		t.Fatal(err)
	}
	if math.Float32frombits(binary.LittleEndian.Uint32(b[4*7:])) != a[7] {
		t.Fatal("device 1 differs after the wake")
	}
}

func TestReplicasWakeFromOneBackup(t *testing.T) {
	tag := mustTag(t, "go-replicas-one-backup")
	data := make([]byte, 300000)
	for i := range data {
		data[i] = byte(i*31 + 7)
	}
	var group []Replica
	var ptrs []uint64
	for d := 0; d < 2; d++ {
		p, err := NewPool(PoolOptions{Backend: BackendHost, Device: d})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		ptr, err := p.AllocTagged(uint64(len(data)), tag)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Write(ptr, data); err != nil {
			t.Fatal(err)
		}
		group, ptrs = append(group, Replica{p, tag}), append(ptrs, ptr)
	}
	if _, err := SleepReplicas(group[0], group[0]); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a device twice: %v", err)
	}
	if _, err := SleepReplicas(); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("no replicas: %v", err)
	}
	s, err := SleepReplicas(group...)
	if err != nil || s.BackupBytes < uint64(len(data)) || s.ReleasedBytes != 2*s.BackupBytes {
		t.Fatalf("sleep: %+v %v", s, err)
	}
	if err := group[1].Pool.Read(ptrs[1], make([]byte, 8)); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("read while asleep: %v", err)
	}
	w, err := WakeReplicasFromBackup(ReplicaWakeOptions{}, group...)
	if err != nil || w.HostBytes != s.BackupBytes || w.PeerBytes != s.BackupBytes || w.DirectPairs != 0 {
		t.Fatalf("wake: %+v %v", w, err)
	}
	for d, r := range group {
		back := make([]byte, len(data))
		if err := r.Pool.Read(ptrs[d], back); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(back, data) {
			t.Fatalf("device %d differs after the wake", d)
		}
	}
	if _, err := WakeReplicasFromBackup(ReplicaWakeOptions{}, group...); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("wake of awake replicas: %v", err)
	}
	// The former names still work through 0.x.
	if _, err := WakeReplicas(ReplicaWakeOptions{}, group...); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("WakeReplicas of awake replicas: %v", err)
	}
	if _, err := WakeReplicasFromCheckpoint([]*Loader{nil}, []*Pool{nil}); err == nil {
		t.Fatal("WakeReplicasFromCheckpoint accepted a nil loader")
	}
	if _, err := SleepReplicas(group...); err != nil {
		t.Fatal(err)
	}
	w, err = WakeReplicasFromBackup(ReplicaWakeOptions{NoPeerCopies: true}, group...)
	if err != nil || w.HostBytes != 2*s.BackupBytes || w.DirectPairs != 2 {
		t.Fatalf("wake without peer copies: %+v %v", w, err)
	}
	// The holder's backup compressed: every device decodes a share of its frames.
	if _, err := SleepReplicasWith(ReplicaSleepOptions{HolderPolicy: Reload}, group...); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a Reload holder: %v", err)
	}
	c, err := SleepReplicasWith(ReplicaSleepOptions{HolderPolicy: OffloadCompressed}, group...)
	if err != nil || c.BackupBytes == 0 || c.ReleasedBytes != s.ReleasedBytes {
		t.Fatalf("compressed sleep: %+v %v", c, err)
	}
	w, err = WakeReplicasFromBackup(ReplicaWakeOptions{}, group...)
	if err != nil || w.HostBytes != c.BackupBytes || w.DeliveredBytes != c.ReleasedBytes {
		t.Fatalf("wake from the compressed backup: %+v %v", w, err)
	}
	for d, r := range group {
		back := make([]byte, len(data))
		if err := r.Pool.Read(ptrs[d], back); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(back, data) {
			t.Fatalf("device %d differs after the wake from the compressed backup", d)
		}
	}
}
