package vmmw

import (
	"context"
	"reflect"
	"sync"
	"testing"
)

func TestRemapEpochAndCallbackFollowEachWake(t *testing.T) {
	p := hostPool(t)
	tag := mustTag(t, "go-remap")
	if err := p.SetTagRDMA(tag, true); err != nil {
		t.Fatal(err)
	}
	if _, err := p.AllocTagged(1<<20, tag); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []uint64
	cb, err := OnRemap(func(tg Tag, epoch uint64) {
		if tg == tag {
			mu.Lock()
			seen = append(seen, epoch)
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	for cycle := uint64(1); cycle <= 2; cycle++ {
		if err := p.Sleep(TagPolicy{tag, Offload}); err != nil {
			t.Fatal(err)
		}
		if e, _ := tag.RemapEpoch(); e != cycle-1 {
			t.Fatalf("after sleep %d: epoch %d", cycle, e)
		}
		if err := p.Wake(context.Background(), tag); err != nil {
			t.Fatal(err)
		}
		if e, _ := tag.RemapEpoch(); e != cycle {
			t.Fatalf("after wake %d: epoch %d", cycle, e)
		}
	}
	if err := p.SetTagRDMA(tag, false); !isStatus(err, StatusInvalidState) {
		t.Fatalf("turning the flag off with memory in the tag: %v", err)
	}
	if err := cb.Remove(); err != nil {
		t.Fatal(err)
	}
	if err := cb.Remove(); err != nil {
		t.Fatal("a second Remove is a no-op:", err)
	}
	if err := p.Sleep(TagPolicy{tag, Offload}); err != nil {
		t.Fatal(err)
	}
	if err := p.Wake(context.Background(), tag); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !reflect.DeepEqual(seen, []uint64{1, 2}) {
		t.Fatalf("callbacks saw %v, want [1 2] (none after Remove)", seen)
	}
}
