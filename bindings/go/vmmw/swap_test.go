//go:build vmmw_testing

package vmmw

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestSwapAndWaitingWake: a swap puts one tag to sleep while another wakes,
// a refusal changes nothing, a device too small for both makes the wake wait
// for the sleep, a wake failing midway keeps its tag asleep while the sleep
// side is reported apart, and a waiting wake fails at its deadline naming
// the tag, then wakes once there is room.
func TestSwapAndWaitingWake(t *testing.T) {
	d := hostDevice(t)
	p, err := NewPool(PoolOptions{DeviceHandle: d})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	a, b := mustTag(t, "go-swap-a"), mustTag(t, "go-swap-b")
	const model = 16 << 20
	pa, err := p.AllocTagged(model, a)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := p.AllocTagged(model, b)
	if err != nil {
		t.Fatal(err)
	}
	in := bytes.Repeat([]byte("swap me"), 1000)
	if err := p.Write(pa+100, in); err != nil {
		t.Fatal(err)
	}
	if err := p.Write(pb+100, in); err != nil {
		t.Fatal(err)
	}
	same := func(ptr uint64, what string) {
		t.Helper()
		out := make([]byte, len(in))
		if err := p.Read(ptr+100, out); err != nil || !bytes.Equal(out, in) {
			t.Fatalf("%s: bytes differ (%v)", what, err)
		}
	}
	if err := p.Sleep(TagPolicy{b, Offload}); err != nil {
		t.Fatal(err)
	}
	r, err := p.Swap(ctx, []TagPolicy{{a, Offload}}, []Tag{a}, SwapOptions{})
	if !errors.Is(err, ErrInvalidArgument) || r != (SwapResult{}) {
		t.Fatalf("a tag in both lists: %+v, %v", r, err)
	}
	if _, err := p.Swap(ctx, nil, nil, SwapOptions{WaitForMemory: -time.Second}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("negative wait: %v", err)
	}
	r, err = p.Swap(ctx, []TagPolicy{{a, Offload}}, []Tag{b}, SwapOptions{})
	if err != nil || r.SleepStatus != StatusOK || r.WakeStatus != StatusOK || r.SleptTags != 1 || r.WokenTags != 1 {
		t.Fatalf("swap: %+v, %v", r, err)
	}
	if r.ReleasedBytes < model || r.MappedBytes < model || r.Seconds <= 0 {
		t.Fatalf("swap result %+v", r)
	}
	same(pb, "b after the swap")

	// Room for one model and a half: the wake waits for the sleep.
	c, err := d.HostCounts()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.HostSetMemoryLimit(c.PhysicalBytes + model/2); err != nil {
		t.Fatal(err)
	}
	if err := p.Wake(ctx, a); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("plain wake without room: %v", err)
	}
	if _, err := p.Swap(ctx, []TagPolicy{{b, Offload}}, []Tag{a}, SwapOptions{}); err != nil {
		t.Fatalf("swap on a small device: %v", err)
	}
	same(pa, "a after the swap on a small device")

	// A wake failing midway.
	if err := d.HostSetMemoryLimit(1 << 30); err != nil {
		t.Fatal(err)
	}
	if err := d.HostFailNth(FaultMap, 1); err != nil {
		t.Fatal(err)
	}
	r, err = p.Swap(ctx, []TagPolicy{{a, Offload}}, []Tag{b}, SwapOptions{})
	var e *Error
	if !errors.As(err, &e) || e.Status != r.WakeStatus || r.SleepStatus != StatusOK || r.WokenTags != 0 {
		t.Fatalf("swap with a failing wake: %+v, %v", r, err)
	}

	// A waiting wake: fails at its deadline naming the tag, then wakes.
	if err := p.Wake(ctx, a); err != nil {
		t.Fatal(err)
	}
	c, _ = d.HostCounts()
	if err := d.HostSetMemoryLimit(c.PhysicalBytes + model/2); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = p.WakeWith(ctx, WakeOptions{WaitForMemory: 30 * time.Millisecond}, b)
	if !errors.Is(err, ErrOutOfMemory) || !strings.Contains(err.Error(), "go-swap-b") || time.Since(start) < 30*time.Millisecond {
		t.Fatalf("waiting wake without room: %v after %v", err, time.Since(start))
	}
	if err := d.HostSetMemoryLimit(1 << 30); err != nil {
		t.Fatal(err)
	}
	if err := p.WakeWith(ctx, WakeOptions{WaitForMemory: time.Second}, b); err != nil {
		t.Fatal(err)
	}
	same(pb, "b after the waiting wake")
	if err := p.WakeWith(ctx, WakeOptions{}, a); err != nil {
		t.Fatal(err)
	}
	same(pa, "a")
	if err := p.WakeWith(ctx, WakeOptions{}, Tag(0xfffffff0)); err == nil {
		t.Fatal("an unknown tag woke")
	}
}
