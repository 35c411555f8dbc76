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
	BackendAuto Backend = 0
	// BackendHost is the host simulation of CUDA VMM (no GPU needed).
	BackendHost Backend = 1
	// BackendCuda is the CUDA driver.
	BackendCuda Backend = 2
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

// Device is an opened backend for one device.
type Device struct {
	ptr *C.vmmw_device_t
}

// OpenDevice opens backend for device ordinal `ordinal`.
func OpenDevice(backend Backend, ordinal int) (*Device, error) {
	var p *C.vmmw_device_t
	if err := call(func(e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_device_open(C.vmmw_backend_t(backend), C.int32_t(ordinal), &p, e)
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
	var b C.vmmw_backend_t
	err = call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_device_backend(p, &b, e) })
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
	err = call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_device_granularity(p, &g, e) })
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
	err = call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_device_mem_info(p, &f, &t, e) })
	runtime.KeepAlive(d)
	return uint64(f), uint64(t), err
}

// Describe is a human-readable description of the device.
func (d *Device) Describe() (string, error) {
	p, err := d.live()
	if err != nil {
		return "", err
	}
	s, err := readString(func(b *C.char, c C.size_t, n *C.size_t, e **C.vmmw_error_t) C.vmmw_status_t {
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
	s, err := readString(func(b *C.char, c C.size_t, n *C.size_t, e **C.vmmw_error_t) C.vmmw_status_t {
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
	err = call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_device_synchronize(p, e) })
	runtime.KeepAlive(d)
	return err
}
