package vmmw

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
)

// The progress contract (docs/ABI.md): returning false continues and never
// cancels, whenever the callback is called; true while bytes are still to
// come cancels (unless the copies in flight were the last: then the load
// succeeds). 32 MiB, so the callback is called during the copy and not
// only at its end, where a reversed reading of the result would not show.
func TestProgressContract(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.safetensors")
	w := make([]float32, 8<<20)
	for i := range w {
		w[i] = 1.5
	}
	writeSafetensors(t, path, []string{"w.weight"}, [][]float32{w})
	p := hostPool(t)
	l, err := OpenLoader(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Allocate(p, mustTag(t, "go-progress")); err != nil {
		t.Fatal(err)
	}

	midway := 0
	for i := 0; i < 20 && midway == 0; i++ {
		calls := 0
		res, err := l.Load(context.Background(), p, func(done, total uint64) bool {
			calls++
			if done < total {
				midway++
			}
			return false
		})
		if err != nil || res.Bytes != uint64(len(w))*4 || calls == 0 {
			t.Fatalf("a callback returning false: %+v, %d calls, %v", res, calls, err)
		}
	}
	if midway == 0 {
		t.Fatal("no call came before the end in 20 loads: the test proved nothing")
	}

	for i := 0; i < 20; i++ {
		calledMidway := false
		_, err := l.Load(context.Background(), p, func(done, total uint64) bool {
			calledMidway = calledMidway || done < total
			return true
		})
		if errors.Is(err, ErrCancelled) {
			if !calledMidway {
				t.Fatal("cancelled without a call before the end")
			}
			return
		}
		if err != nil { // nil: asked after the last copies, nothing left to cancel
			t.Fatalf("a callback returning true: %v, want ErrCancelled or success", err)
		}
	}
	t.Fatal("a callback returning true never cancelled in 20 loads")
}
