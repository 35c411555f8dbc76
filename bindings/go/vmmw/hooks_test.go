//go:build vmmw_testing

package vmmw

import (
	"bytes"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestDeviceAndSegmentRoundTrip(t *testing.T) {
	d := hostDevice(t)
	if b, err := d.Backend(); err != nil || b != BackendHost {
		t.Fatalf("Backend = %v, %v", b, err)
	}
	g, err := d.Granularity()
	if err != nil || g == 0 {
		t.Fatalf("Granularity = %d, %v", g, err)
	}
	desc, err := d.Describe()
	if err != nil || !strings.Contains(desc, "host") {
		t.Fatalf("Describe = %q, %v", desc, err)
	}
	before, _ := d.HostCounts()
	s, err := NewSegment(d, 3*g, g)
	if err != nil {
		t.Fatal(err)
	}
	in := make([]byte, 5000)
	for i := range in {
		in[i] = byte(i*31 + 7)
	}
	if err := s.Write(g-2500, in); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, len(in))
	if err := s.Read(g-2500, out); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(in, out) {
		t.Fatal("read back differs")
	}
	if err := s.Read(3*g, out[:1]); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("out-of-range read: %v", err)
	}
	s.Close()
	s.Close() // idempotent
	if _, err := s.Info(); !errors.Is(err, ErrNullArgument) {
		t.Fatalf("use after Close: %v", err)
	}
	after, _ := d.HostCounts()
	if after != before {
		t.Fatalf("leak: before %+v after %+v", before, after)
	}
}

func TestOutOfMemoryIsAnErrorAndLeavesNothing(t *testing.T) {
	d := hostDevice(t)
	g, _ := d.Granularity()
	before, _ := d.HostCounts()
	if err := d.HostSetMemoryLimit(g); err != nil {
		t.Fatal(err)
	}
	if _, err := NewSegment(d, 4*g, g); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("want out of memory, got %v", err)
	}
	if err := d.HostFailNth(FaultMap, 1); err != nil {
		t.Fatal(err)
	}
	if after, _ := d.HostCounts(); after != before {
		t.Fatalf("leak: before %+v after %+v", before, after)
	}
}

// Dropped handles are freed by their finalizers.
func TestFinalizersFreeDroppedHandles(t *testing.T) {
	d := hostDevice(t)
	g, _ := d.Granularity()
	before, _ := d.HostCounts()
	for i := 0; i < 16; i++ {
		if _, err := NewSegment(d, g, 0); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		after, _ := d.HostCounts()
		if after == before {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("finalizers did not free the segments: before %+v after %+v", before, after)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A driver error carries the driver's own code; other errors carry 0.
func TestDriverErrorCarriesTheDriverCode(t *testing.T) {
	d := hostDevice(t)
	g, _ := d.Granularity()
	if err := d.HostFailNth(FaultMap, 1); err != nil {
		t.Fatal(err)
	}
	_, err := NewSegment(d, g, 0)
	var e *Error
	if !errors.As(err, &e) || e.Status != StatusDriverError || e.DriverCode != -1 {
		t.Fatalf("want a driver error with code -1 (the host's injected failure), got %#v", err)
	}
	_, err = NewSegment(d, 0, 0)
	if !errors.As(err, &e) || e.Status != StatusInvalidArgument || e.DriverCode != 0 {
		t.Fatalf("want an invalid argument with driver code 0, got %#v", err)
	}
}
