package vmmw

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
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
