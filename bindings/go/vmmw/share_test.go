package vmmw

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"
)

// Owner and importer in one process (tests/share_processes.rs covers
// separate ones): same bytes at other addresses, version, refused sleep.
func TestShareServeAttachDetach(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "model.safetensors")
	a := []float32{1.5, -2, 3.25, 4}
	writeSafetensors(t, path, []string{"w.weight"}, [][]float32{a})
	p := hostPool(t)
	tag := mustTag(t, "go-shared")
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
	sock := filepath.Join(dir, "w.sock")
	if _, err := Serve(p, tag, l, sock, ShareOptions{SleepPolicy: 9}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad policy: %v", err)
	}
	srv, err := Serve(p, tag, l, sock, ShareOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dev := hostDevice(t)
	if _, err := Attach(dev, sock, true); !errors.Is(err, ErrShareRefused) {
		t.Fatalf("read-write on a read-only share: %v", err)
	}
	s, err := Attach(dev, sock, false)
	if err != nil {
		t.Fatal(err)
	}
	names, err := s.Names()
	if err != nil || strings.Join(names, ",") != "w.weight" {
		t.Fatalf("names %v %v", names, err)
	}
	d, err := s.Tensor("w.weight")
	if err != nil || d.Bytes != 16 || d.Dtype != "F32" {
		t.Fatalf("tensor %+v %v", d, err)
	}
	// Host backend: the imported memory is readable here (an address from C,
	// reinterpreted without a uintptr conversion vet would flag).
	addr := *(*unsafe.Pointer)(unsafe.Pointer(&d.Ptr))
	got := unsafe.Slice((*float32)(addr), 4)
	for i := range a {
		if got[i] != a[i] {
			t.Fatalf("element %d: %v, want %v", i, got[i], a[i])
		}
	}
	b := make([]byte, d.Bytes)
	if err := s.Read(d.Ptr, b); err != nil || math.Float32frombits(binary.LittleEndian.Uint32(b[4:])) != a[1] {
		t.Fatalf("read %v %v", b, err)
	}
	if err := s.Read(d.Ptr+(64<<20), b); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("read outside the share: %v", err)
	}
	if v, err := srv.Publish(); err != nil || v != 2 {
		t.Fatalf("publish %d %v", v, err)
	}
	if v, err := s.Version(); err != nil || v != 2 {
		t.Fatalf("version %d %v", v, err)
	}
	if n, err := srv.Attached(); err != nil || n != 1 {
		t.Fatalf("attached %d %v", n, err)
	}
	if err := p.Sleep(TagPolicy{tag, Offload}); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("sleep while attached: %v", err)
	}
	if err := s.Detach(); err != nil {
		t.Fatal(err)
	}
	if err := s.Detach(); err != nil {
		t.Fatalf("second detach: %v", err)
	}
	if _, err := s.Version(); !errors.Is(err, ErrNullArgument) {
		t.Fatalf("use after detach: %v", err)
	}
}
