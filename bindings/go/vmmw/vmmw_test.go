package vmmw

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func hostDevice(t *testing.T) *Device {
	t.Helper()
	d, err := OpenDevice(BackendHost, 0)
	if err != nil {
		t.Fatalf("OpenDevice(host): %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestVersionMatchesHeader(t *testing.T) {
	if Version() != HeaderVersion {
		t.Fatalf("library %q, header %q", Version(), HeaderVersion)
	}
	major, minor, patch := VersionParts()
	if fmt.Sprintf("%d.%d.%d", major, minor, patch) != Version() {
		t.Fatalf("VersionParts %d.%d.%d, Version %q", major, minor, patch, Version())
	}
}

func TestErrorsCarryStatusAndMessage(t *testing.T) {
	_, err := OpenDevice(Backend(9), 0)
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("want *Error, got %T %v", err, err)
	}
	if e.Status != StatusInvalidArgument || !strings.Contains(e.Message, "backend 9") {
		t.Fatalf("unexpected error %v", e)
	}
	if !errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("errors.Is does not follow the status: %v", err)
	}
	if StatusOutOfMemory.String() != "VMMW_OUT_OF_MEMORY" {
		t.Fatalf("status name %q", StatusOutOfMemory.String())
	}
}

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

// Error messages are per call, so goroutines that migrate between OS threads
// read their own message (the race detector also watches the handles here).
func TestConcurrentCallsReadTheirOwnErrors(t *testing.T) {
	d := hostDevice(t)
	g, _ := d.Granularity()
	s, err := NewSegment(d, 2*g, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			buf := make([]byte, 64)
			for i := 0; i < 200; i++ {
				if i%2 == 0 {
					_, err := OpenDevice(Backend(100+w), 0)
					var e *Error
					if !errors.As(err, &e) || !strings.Contains(e.Message, "backend "+strconv.Itoa(100+w)) {
						errs <- err
						return
					}
				} else {
					off := uint64(w) * 64
					for j := range buf {
						buf[j] = byte(w + j)
					}
					if err := s.Write(off, buf); err != nil {
						errs <- err
						return
					}
				}
				runtime.Gosched()
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("goroutine saw a wrong error: %v", err)
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
