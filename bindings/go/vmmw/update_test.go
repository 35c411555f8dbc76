package vmmw

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"path/filepath"
	"testing"
)

// An update from device tensors (pool blocks): new bytes, version 1 -> 2,
// the wrong base version refused with nothing written, a Reload wake keeping
// the update, publish moving the version.
func TestUpdateWritesNewWeightsAndMovesTheVersion(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "model.safetensors")
	a := make([]float32, 3000)
	for i := range a {
		a[i] = float32(i) / 7
	}
	writeSafetensors(t, path, []string{"x.weight", "y.bias"}, [][]float32{a, {1, 2, 3}})
	p := hostPool(t)
	tag := mustTag(t, "go-updated")
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
	d, _ := l.Destination("x.weight")
	bias, _ := l.Destination("y.bias")
	// The trainer's tensors, in device memory (blocks of the pool, untagged).
	newA := make([]byte, 4*len(a))
	for i := range a {
		binary.LittleEndian.PutUint32(newA[4*i:], math.Float32bits(float32(-i)))
	}
	newB := make([]byte, 12)
	srcA, err := p.Alloc(uint64(len(newA)))
	if err != nil {
		t.Fatal(err)
	}
	srcB, _ := p.Alloc(uint64(len(newB)))
	if err := p.Write(srcA, newA); err != nil {
		t.Fatal(err)
	}
	if err := p.Write(srcB, newB); err != nil {
		t.Fatal(err)
	}
	s, err := NewUpdateSource()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Add("x.weight", "F32", []uint64{3000}, srcA, MemoryDevice); err != nil {
		t.Fatal(err)
	}
	if err := s.Add("x.weight", "F32", []uint64{3000}, srcA, MemoryDevice); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a duplicate name: %v", err)
	}
	if v, err := p.TagVersion(tag); err != nil || v != 1 {
		t.Fatalf("version %d %v", v, err)
	}
	// The bias is missing and the version wrong: both listed, nothing written.
	_, err = Update(l, p, s, UpdateOptions{ExpectedVersion: 9})
	var e *Error
	if !errors.As(err, &e) || e.Status != StatusPlanMismatch {
		t.Fatalf("want a plan mismatch, got %v", err)
	}
	if err := s.Add("y.bias", "F32", []uint64{3}, srcB, MemoryDevice); err != nil {
		t.Fatal(err)
	}
	if _, err := Update(l, p, s, UpdateOptions{ExpectedVersion: 9}); !errors.Is(err, ErrVersionMismatch) {
		t.Fatalf("want a version mismatch, got %v", err)
	}
	got := make([]byte, d.Bytes)
	if err := p.Read(d.Ptr, got); err != nil {
		t.Fatal(err)
	}
	if math.Float32frombits(binary.LittleEndian.Uint32(got[4:])) != a[1] {
		t.Fatal("a refused update wrote bytes")
	}
	r, err := Update(l, p, s, UpdateOptions{ExpectedVersion: 1})
	if err != nil || r.Version != 2 || r.Destinations != 2 || r.Tag != tag || r.Staged {
		t.Fatalf("update %+v %v", r, err)
	}
	if r.PlanSeconds <= 0 || r.IssueSeconds <= 0 || r.BookkeepingSeconds <= 0 ||
		r.Seconds > r.PlanSeconds+r.IssueSeconds+r.WaitSeconds+r.BookkeepingSeconds {
		t.Fatalf("phases %+v", r)
	}
	if err := p.Sleep(TagPolicy{tag, Reload}); err != nil {
		t.Fatal(err)
	}
	if err := p.Wake(context.Background(), tag); err != nil {
		t.Fatal(err)
	}
	for _, dst := range []struct {
		ptr  uint64
		want []byte
	}{{d.Ptr, newA}, {bias.Ptr, newB}} {
		b := make([]byte, len(dst.want))
		if err := p.Read(dst.ptr, b); err != nil {
			t.Fatal(err)
		}
		if string(b) != string(dst.want) {
			t.Fatal("the update did not survive a Reload sleep")
		}
	}
	if r, err := Update(l, p, s, UpdateOptions{ExpectedVersion: 2, Staged: true}); err != nil || !r.Staged || r.Version != 3 {
		t.Fatalf("staged update %+v %v", r, err)
	}
	if torn, err := p.TagTorn(tag); err != nil || torn {
		t.Fatalf("torn %v %v", torn, err)
	}
	if v, err := p.Publish(tag); err != nil || v != 4 {
		t.Fatalf("publish %d %v", v, err)
	}
	s.Close()
	if _, err := Update(l, p, s, UpdateOptions{ExpectedVersion: 4}); !errors.Is(err, ErrNullArgument) {
		t.Fatalf("a closed source: %v", err)
	}
}
