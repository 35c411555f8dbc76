package vmmw

// #include <stdlib.h>
// #include "vmmweights.h"
import "C"

import (
	"encoding/json"
	"runtime"
	"time"
	"unsafe"
)

// ControlResult is what a sleep or wake through a control socket did
// (vmmw_control_result_t).
type ControlResult struct {
	// Seconds is the call's wall time in the process.
	Seconds float64
	// SyncSeconds is, of it, the synchronization of every device before a sleep.
	SyncSeconds float64
	// WaitSeconds is, of it, a wake's wait for memory.
	WaitSeconds float64
	// Bytes is the physical device memory released (sleep) or mapped again (wake).
	Bytes uint64
	// BackupBytes is what the host backups hold after a sleep, or gave back at a wake.
	BackupBytes uint64
}

// ControlStatus is the status of the process serving the control socket at
// path, as its JSON (vmmw_control_status; docs/PRELOAD.md lists the fields):
// decode it with encoding/json, or use ControlStatusMap.
func ControlStatus(path string) (string, error) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	return readString(func(buf *C.char, capacity C.size_t, needed *C.size_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_control_status(cs, buf, capacity, needed, e)
	})
}

// ControlStatusMap is ControlStatus decoded.
func ControlStatusMap(path string) (map[string]any, error) {
	s, err := ControlStatus(path)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, &Error{Status: StatusInvalidState, Message: "the status is not JSON: " + err.Error()}
	}
	return m, nil
}

// cNames is a C array of the tag names (nil for none), freed by free.
func cNames(tags []string) (ptr **C.char, free func()) {
	if len(tags) == 0 {
		return nil, func() {}
	}
	mem := C.malloc(C.size_t(len(tags)) * C.size_t(unsafe.Sizeof((*C.char)(nil))))
	arr := unsafe.Slice((**C.char)(mem), len(tags))
	for i, t := range tags {
		arr[i] = C.CString(t)
	}
	return &arr[0], func() {
		for _, p := range arr {
			C.free(unsafe.Pointer(p))
		}
		C.free(unsafe.Pointer(&arr[0]))
	}
}

func controlResult(r C.vmmw_control_result_t) ControlResult {
	return ControlResult{
		Seconds:     float64(r.seconds),
		SyncSeconds: float64(r.sync_seconds),
		WaitSeconds: float64(r.wait_seconds),
		Bytes:       uint64(r.bytes),
		BackupBytes: uint64(r.backup_bytes),
	}
}

// ControlSleep asks the process serving path to synchronize every device it
// used and sleep its tags (those named, or every tag) with policy: Offload,
// OffloadCompressed or Discard (vmmw_control_sleep). A refusal is an *Error
// with the status the process named.
func ControlSleep(path string, policy Policy, tags ...string) (ControlResult, error) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	names, free := cNames(tags)
	defer free()
	var r C.vmmw_control_result_t
	err := call(func(e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_control_sleep(cs, C.vmmw_policy_t(policy), names, C.size_t(len(tags)), &r, e)
	})
	return controlResult(r), err
}

// ControlWake asks the process serving path to wake its asleep tags (those
// named, or every asleep tag), waiting up to waitMemory for device memory
// being released elsewhere (0: refuse at once when it is short)
// (vmmw_control_wake). A failed wake leaves every backup intact.
func ControlWake(path string, waitMemory time.Duration, tags ...string) (ControlResult, error) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	names, free := cNames(tags)
	defer free()
	ms := waitMemory.Milliseconds()
	if ms < 0 {
		ms = 0
	}
	var r C.vmmw_control_result_t
	err := call(func(e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_control_wake(cs, C.uint64_t(ms), names, C.size_t(len(tags)), &r, e)
	})
	return controlResult(r), err
}

// ControlServer serves this process's default pools (those of GlobalPool)
// on a control socket, so vmmw ctl and ControlSleep reach them.
type ControlServer struct {
	ptr *C.vmmw_control_server_t
}

// ServeControl starts serving on a new Unix socket at path (vmmw_control_serve).
func ServeControl(path string) (*ControlServer, error) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	var p *C.vmmw_control_server_t
	if err := call(func(e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_control_serve(cs, &p, e)
	}); err != nil {
		return nil, err
	}
	s := &ControlServer{ptr: p}
	runtime.SetFinalizer(s, (*ControlServer).Close)
	return s, nil
}

// Close stops serving and removes the socket; a second Close does nothing.
func (s *ControlServer) Close() {
	if s.ptr != nil {
		C.vmmw_control_server_free(s.ptr)
		s.ptr = nil
		runtime.SetFinalizer(s, nil)
	}
}
