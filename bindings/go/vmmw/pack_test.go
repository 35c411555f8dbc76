package vmmw

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// Pack and Unpack give the file back byte for byte, and the packed file
// loads through OpenLoader with the original's bytes.
func TestPackUnpackAndLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "model.safetensors")
	a := make([]float32, 50000)
	for i := range a {
		a[i] = float32(i%97) / 64
	}
	writeSafetensors(t, path, []string{"x.weight"}, [][]float32{a})
	packed := filepath.Join(dir, "model.packed")
	rep, err := Pack(path, packed, PackOptions{FrameBytes: 64 << 10, CPU: true, Threads: 2})
	if err != nil || rep.Files != 1 || rep.Tensors != 1 || rep.PackedBytes == 0 {
		t.Fatalf("pack: %+v %v", rep, err)
	}
	if _, err := Pack(path, packed, PackOptions{CPU: true}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("pack onto an existing output: %v", err)
	}
	back := filepath.Join(dir, "back.safetensors")
	if _, err := Unpack(packed, back, PackOptions{}); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(path)
	got, _ := os.ReadFile(back)
	if !bytes.Equal(want, got) {
		t.Fatal("the unpacked file differs from the original")
	}
	p := hostPool(t)
	l, err := OpenLoader(packed)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Allocate(p, mustTag(t, "go-packed")); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Load(context.Background(), p, nil); err != nil {
		t.Fatal(err)
	}
	d, err := l.Destination("x.weight")
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, d.Bytes)
	if err := p.Read(d.Ptr, b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, want[len(want)-len(b):]) {
		t.Fatal("the packed load differs from the file's tensor bytes")
	}
}
