package vmmw

// #include "vmmweights.h"
import "C"

import (
	"fmt"
	"runtime"
)

// Backend selects the implementation behind a Device.
type Backend int32

const (
	// BackendAuto: the VMMW_BACKEND environment variable when set, else CUDA
	// when a driver and the device are present, else host.
	BackendAuto Backend = C.VMMW_BACKEND_AUTO
	// BackendHost is the host simulation of CUDA VMM (no GPU needed).
	BackendHost Backend = C.VMMW_BACKEND_HOST
	// BackendCuda is the CUDA driver.
	BackendCuda Backend = C.VMMW_BACKEND_CUDA
)

// String is the backend's short name ("auto", "host", "cuda").
func (b Backend) String() string {
	switch b {
	case BackendAuto:
		return "auto"
	case BackendHost:
		return "host"
	case BackendCuda:
		return "cuda"
	}
	return fmt.Sprintf("Backend(%d)", int32(b))
}

// FaultPoint is a host-backend driver step that HostFailNth can make fail (testing).
type FaultPoint int32

// Fault injection points of the host backend (testing).
const (
	FaultReserve   FaultPoint = C.VMMW_FAULT_RESERVE
	FaultCreate    FaultPoint = C.VMMW_FAULT_CREATE
	FaultMap       FaultPoint = C.VMMW_FAULT_MAP
	FaultSetAccess FaultPoint = C.VMMW_FAULT_SET_ACCESS
)

// Device is an opened backend for one device.
type Device struct {
	ptr *C.vmmw_device_t
}

// OpenDevice opens backend for device ordinal `ordinal`.
func OpenDevice(backend Backend, ordinal int) (*Device, error) {
	var p *C.vmmw_device_t
	if err := call(func(e **C.vmmw_error_t) C.int32_t {
		return C.vmmw_device_open(C.int32_t(backend), C.int32_t(ordinal), &p, e)
	}); err != nil {
		return nil, err
	}
	d := &Device{ptr: p}
	runtime.SetFinalizer(d, (*Device).Close)
	return d, nil
}

// Close frees the handle; pools and segments made from it stay valid. Idempotent.
func (d *Device) Close() error {
	if d.ptr != nil {
		C.vmmw_device_free(d.ptr)
		d.ptr = nil
		runtime.SetFinalizer(d, nil)
	}
	return nil
}

func (d *Device) live() (*C.vmmw_device_t, error) {
	if d == nil || d.ptr == nil {
		return nil, closedError("Device")
	}
	return d.ptr, nil
}

// Backend is the backend actually opened (BackendHost or BackendCuda).
func (d *Device) Backend() (Backend, error) {
	p, err := d.live()
	if err != nil {
		return 0, err
	}
	var b C.int32_t
	err = call(func(e **C.vmmw_error_t) C.int32_t { return C.vmmw_device_backend(p, &b, e) })
	runtime.KeepAlive(d)
	return Backend(b), err
}

// Granularity is the mapping granularity in bytes.
func (d *Device) Granularity() (uint64, error) {
	p, err := d.live()
	if err != nil {
		return 0, err
	}
	var g C.uint64_t
	err = call(func(e **C.vmmw_error_t) C.int32_t { return C.vmmw_device_granularity(p, &g, e) })
	runtime.KeepAlive(d)
	return uint64(g), err
}

// MemInfo returns free and total device memory in bytes.
func (d *Device) MemInfo() (free, total uint64, err error) {
	p, err := d.live()
	if err != nil {
		return 0, 0, err
	}
	var f, t C.uint64_t
	err = call(func(e **C.vmmw_error_t) C.int32_t { return C.vmmw_device_mem_info(p, &f, &t, e) })
	runtime.KeepAlive(d)
	return uint64(f), uint64(t), err
}

// Describe is a human-readable description of the device.
func (d *Device) Describe() (string, error) {
	p, err := d.live()
	if err != nil {
		return "", err
	}
	s, err := readString(func(b *C.char, c C.size_t, n *C.size_t, e **C.vmmw_error_t) C.int32_t {
		return C.vmmw_device_describe(p, b, c, n, e)
	})
	runtime.KeepAlive(d)
	return s, err
}

// ChoiceReason says why this backend was chosen.
func (d *Device) ChoiceReason() (string, error) {
	p, err := d.live()
	if err != nil {
		return "", err
	}
	s, err := readString(func(b *C.char, c C.size_t, n *C.size_t, e **C.vmmw_error_t) C.int32_t {
		return C.vmmw_device_choice_reason(p, b, c, n, e)
	})
	runtime.KeepAlive(d)
	return s, err
}

// Synchronize waits for all work queued on the device.
func (d *Device) Synchronize() error {
	p, err := d.live()
	if err != nil {
		return err
	}
	err = call(func(e **C.vmmw_error_t) C.int32_t { return C.vmmw_device_synchronize(p, e) })
	runtime.KeepAlive(d)
	return err
}

// HostCounts are the host backend's live objects (testing).
type HostCounts struct {
	Reservations, Handles, Mappings, PhysicalBytes, Streams, Events uint64
}

// HostCounts returns the host backend's live objects, for leak checks.
func (d *Device) HostCounts() (HostCounts, error) {
	p, err := d.live()
	if err != nil {
		return HostCounts{}, err
	}
	var c C.vmmw_host_counts_t
	err = call(func(e **C.vmmw_error_t) C.int32_t { return C.vmmw_host_counts(p, &c, e) })
	runtime.KeepAlive(d)
	return HostCounts{uint64(c.reservations), uint64(c.handles), uint64(c.mappings),
		uint64(c.physical_bytes), uint64(c.streams), uint64(c.events)}, err
}

// HostSetMemoryLimit sets the host backend's simulated device memory (testing).
func (d *Device) HostSetMemoryLimit(bytes uint64) error {
	p, err := d.live()
	if err != nil {
		return err
	}
	err = call(func(e **C.vmmw_error_t) C.int32_t { return C.vmmw_host_set_memory_limit(p, C.uint64_t(bytes), e) })
	runtime.KeepAlive(d)
	return err
}

// HostFailNth makes the n-th next call of a Fault* primitive fail (testing); n = 0 clears.
func (d *Device) HostFailNth(op FaultPoint, n uint64) error {
	p, err := d.live()
	if err != nil {
		return err
	}
	err = call(func(e **C.vmmw_error_t) C.int32_t { return C.vmmw_host_fail_nth(p, C.int32_t(op), C.uint64_t(n), e) })
	runtime.KeepAlive(d)
	return err
}
