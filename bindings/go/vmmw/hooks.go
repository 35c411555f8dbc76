//go:build vmmw_testing

package vmmw

// The host backend's testing hooks, from include/vmmweights_testing.h: that
// header is not installed and the hooks are not part of the stable API, so
// they build only with -tags vmmw_testing against a source tree (the
// repository's test command does this).

// #include "vmmweights_testing.h"
import "C"

import "runtime"

// FaultPoint is a host-backend driver step that HostFailNth can make fail (testing).
type FaultPoint int32

// Fault injection points of the host backend (testing).
const (
	FaultReserve   FaultPoint = C.VMMW_FAULT_RESERVE
	FaultCreate    FaultPoint = C.VMMW_FAULT_CREATE
	FaultMap       FaultPoint = C.VMMW_FAULT_MAP
	FaultSetAccess FaultPoint = C.VMMW_FAULT_SET_ACCESS
)

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
	err = call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_host_counts(p, &c, e) })
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
	err = call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_host_set_memory_limit(p, C.uint64_t(bytes), e) })
	runtime.KeepAlive(d)
	return err
}

// HostFailNth makes the n-th next call of a Fault* primitive fail (testing); n = 0 clears.
func (d *Device) HostFailNth(op FaultPoint, n uint64) error {
	p, err := d.live()
	if err != nil {
		return err
	}
	err = call(func(e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_host_fail_nth(p, C.vmmw_fault_point_t(op), C.uint64_t(n), e)
	})
	runtime.KeepAlive(d)
	return err
}
