package vmmw

import (
	"context"
	"encoding/binary"
	"math"
	"path/filepath"
	"testing"
)

// An update through the IPC transport from a sender on another goroutine
// (the Rust and Python tests run it across processes): new bytes, version
// 1 -> 2, staged; a missing sender is an I/O error; NCCL from a NULL
// communicator is refused.
func TestReceiveIPCFromASender(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "model.safetensors")
	a := make([]float32, 2000)
	for i := range a {
		a[i] = float32(i)
	}
	writeSafetensors(t, path, []string{"x.weight"}, [][]float32{a})
	p := hostPool(t)
	tag := mustTag(t, "go-transport")
	l, err := OpenLoader(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Allocate(p, tag); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Load(context.Background(), p, nil); err != nil {
		t.Fatal(err)
	}
	newA := make([]byte, 4*len(a))
	for i := range a {
		binary.LittleEndian.PutUint32(newA[4*i:], math.Float32bits(float32(-i)))
	}
	src, err := p.Alloc(uint64(len(newA)))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Write(src, newA); err != nil {
		t.Fatal(err)
	}
	s, err := NewUpdateSource()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Add("x.weight", "F32", []uint64{2000}, src, MemoryDevice); err != nil {
		t.Fatal(err)
	}
	tx, err := NewUpdateSender(hostPool(t), filepath.Join(dir, "tx.sock"), 2, 1000, 20000)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	sent := make(chan SendReport, 1)
	go func() {
		r, err := tx.Send(s, 1)
		if err != nil {
			t.Error(err)
		}
		sent <- r
	}()
	r, err := ReceiveIPC(l, p, filepath.Join(dir, "tx.sock"), UpdateOptions{ExpectedVersion: 1}, 20000)
	if err != nil {
		t.Fatal(err)
	}
	report := <-sent
	if r.Version != 2 || !r.Staged || report.Version != 2 || report.Buckets != 8 {
		t.Fatalf("result %+v, report %+v", r, report)
	}
	d, _ := l.Destination("x.weight")
	got := make([]byte, len(newA))
	if err := p.Read(d.Ptr, got); err != nil {
		t.Fatal(err)
	}
	if string(got) != string(newA) {
		t.Fatal("the destination does not hold the sent bytes")
	}
	// Directly out of the sender's pool memory: no ring, no staging.
	for i := range a {
		binary.LittleEndian.PutUint32(newA[4*i:], math.Float32bits(float32(2*i)))
	}
	if err := p.Write(src, newA); err != nil {
		t.Fatal(err)
	}
	direct, err := NewUpdateSender(p, filepath.Join(dir, "direct.sock"), 0, 0, 20000)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	go func() {
		r, err := direct.SendDirect(s, 1)
		if err != nil {
			t.Error(err)
		}
		sent <- r
	}()
	r, err = ReceiveIPC(l, p, filepath.Join(dir, "direct.sock"), UpdateOptions{ExpectedVersion: 2}, 20000)
	if err != nil {
		t.Fatal(err)
	}
	report = <-sent
	if r.Version != 3 || r.Staged || report.Version != 3 || report.Buckets != 0 {
		t.Fatalf("direct: result %+v, report %+v", r, report)
	}
	if err := p.Read(d.Ptr, got); err != nil || string(got) != string(newA) {
		t.Fatalf("direct: the destination does not hold the sent bytes (%v)", err)
	}
	// A receiver that keeps its imports: the second direct update attaches nothing.
	rx, err := NewUpdateReceiver(p, filepath.Join(dir, "direct.sock"), 20000, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	for round, want := range []uint32{1, 0} {
		for i := range a {
			binary.LittleEndian.PutUint32(newA[4*i:], math.Float32bits(float32(3*i+round)))
		}
		if err := p.Write(src, newA); err != nil {
			t.Fatal(err)
		}
		go func() {
			r, err := direct.SendDirect(s, 1)
			if err != nil {
				t.Error(err)
			}
			sent <- r
		}()
		v := uint64(4 + round)
		r, err = rx.Receive(l, p, UpdateOptions{ExpectedVersion: v - 1})
		if err != nil {
			t.Fatal(err)
		}
		<-sent
		st, err := rx.Stats()
		if err != nil || r.Version != v || !st.Direct || st.Attached != want || st.Reused != 1-want ||
			st.KeptImports != 1 || st.KeptBytes == 0 {
			t.Fatalf("round %d: result %+v, stats %+v (%v)", round, r, st, err)
		}
		if err := p.Read(d.Ptr, got); err != nil || string(got) != string(newA) {
			t.Fatalf("round %d: the destination does not hold the sent bytes (%v)", round, err)
		}
	}
	if err := rx.DropImports(); err != nil {
		t.Fatal(err)
	}
	if st, _ := rx.Stats(); st.KeptImports != 0 || st.KeptBytes != 0 {
		t.Fatalf("dropped imports still kept: %+v", st)
	}
	if _, err := ReceiveIPC(l, p, filepath.Join(dir, "none.sock"), UpdateOptions{ExpectedVersion: 5}, 1000); !isStatus(err, StatusIO) {
		t.Fatalf("no sender: %v", err)
	}
	none, err := NewUpdateReceiver(p, filepath.Join(dir, "none.sock"), 1000, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer none.Close()
	if _, err := none.Receive(l, p, UpdateOptions{ExpectedVersion: 5}); !isStatus(err, StatusIO) {
		t.Fatalf("no sender: %v", err)
	}
	none.Close()
	if _, err := none.Receive(l, p, UpdateOptions{ExpectedVersion: 5}); err == nil {
		t.Fatal("a closed receiver received")
	}
	if _, err := NcclCommFromRaw(nil); err == nil {
		t.Fatal("a NULL communicator was accepted")
	}
	var closed *NcclComm
	if _, err := closed.BroadcastLoad(l, p, BroadcastLoadOptions{Readers: []uint32{0}}); err == nil {
		t.Fatal("a broadcast load on no communicator was accepted")
	}
}
