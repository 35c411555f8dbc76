package vmmw

// #include <stdlib.h>
// #include "vmmweights.h"
import "C"

import (
	"context"
	"fmt"
	"runtime"
	"time"
	"unsafe"
)

// WakeOptions tunes WakeWith; the zero value makes it Wake.
type WakeOptions struct {
	// WaitForMemory, when positive: instead of failing at once when free
	// device memory is short, map each chunk as the device has room, waiting
	// up to this long in all for memory another process or pool releases
	// (process A puts its model to sleep while process B wakes its own). At
	// the deadline the wake fails with StatusOutOfMemory naming the tag and
	// the bytes; the tag stays asleep with its backup. Rounded up to whole
	// milliseconds.
	WaitForMemory time.Duration
}

// SwapOptions tunes Swap; the zero value is the default.
type SwapOptions struct {
	// WaitForMemory: once the sleep side has ended, how long the wake side
	// may still wait for device memory released elsewhere. Zero: the swap is
	// refused up front when the waking tags need more than the free memory
	// plus what the sleeping tags hold, and the wake fails as soon as the
	// sleep has ended without making room.
	WaitForMemory time.Duration
}

// SwapResult is what Swap did, each side on its own (vmmw_swap_result_t).
type SwapResult struct {
	// SleepStatus is StatusOK, or why the sleep side stopped.
	SleepStatus Status
	// WakeStatus is StatusOK, or why the wake side stopped (that tag and
	// the ones after it are asleep with their backups intact).
	WakeStatus Status
	// SleptTags and WokenTags count the tags of each list done.
	SleptTags, WokenTags int
	// ReleasedBytes and MappedBytes: physical bytes released by the sleep
	// side and mapped by the wake side.
	ReleasedBytes, MappedBytes uint64
	// CopiedOutBytes (device to host) and CopiedInBytes (host to device and
	// restored from checkpoints).
	CopiedOutBytes, CopiedInBytes uint64
	// Wall times in seconds: each side, and the whole swap.
	SleepSeconds, WakeSeconds, Seconds float64
}

// millis converts a wait to whole milliseconds, rounding up; a negative
// wait is refused.
func millis(what string, d time.Duration) (C.uint64_t, error) {
	if d < 0 {
		return 0, &Error{Status: StatusInvalidArgument, Message: fmt.Sprintf("%s: negative wait %v", what, d)}
	}
	return C.uint64_t((d + time.Millisecond - 1) / time.Millisecond), nil
}

// tagArray copies tags to C memory (nil for none); free it with C.free.
func tagArray(tags []Tag) *C.uint32_t {
	if len(tags) == 0 {
		return nil
	}
	arr := unsafe.Slice((*C.uint32_t)(C.malloc(C.size_t(len(tags))*C.size_t(unsafe.Sizeof(C.uint32_t(0))))), len(tags))
	for i, t := range tags {
		arr[i] = C.uint32_t(t)
	}
	return &arr[0]
}

// WakeWith wakes the listed tags as Wake does (every sleeping tag when none
// is given), with options (vmmw_pool_wake_with): with WaitForMemory, a wake
// short of free device memory waits for memory being released instead of
// failing at once. ctx is checked before the wake starts, not during it.
func (p *Pool) WakeWith(ctx context.Context, o WakeOptions, tags ...Tag) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("wake not started: %w", err)
	}
	ms, err := millis("WakeWith", o.WaitForMemory)
	if err != nil {
		return err
	}
	ids := tagArray(tags)
	defer C.free(unsafe.Pointer(ids))
	var c C.vmmw_wake_options_t
	c.size = C.size_t(unsafe.Sizeof(c))
	c.wait_memory_ms = ms
	return p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_wake_with(cp, ids, C.size_t(len(tags)), &c, e)
	})
}

// Swap puts the tags of sleep to sleep (each with its policy) and wakes the
// tags of wake at once (vmmw_pool_swap): the sleep's device-to-host copies
// and the wake's host-to-device copies share the link's two directions, and
// each chunk of the waking tags is mapped as soon as the sleeping ones free
// room for it, so a swap takes about the link time of the larger side.
//
// The error is nil when both sides succeeded. A refusal (unknown tag, a tag
// listed twice or in both lists, a sleeping tag a load writes into, not
// enough memory without a wait) changes nothing and returns a zero
// SwapResult. When a side failed, the *Error is the wake side's (else the
// sleep side's) and the SwapResult tells both. ctx is checked before the
// swap starts, not during it.
func (p *Pool) Swap(ctx context.Context, sleep []TagPolicy, wake []Tag, o SwapOptions) (SwapResult, error) {
	if err := ctx.Err(); err != nil {
		return SwapResult{}, fmt.Errorf("swap not started: %w", err)
	}
	ms, err := millis("Swap", o.WaitForMemory)
	if err != nil {
		return SwapResult{}, err
	}
	var items *C.vmmw_tag_policy_t
	if len(sleep) > 0 {
		arr := unsafe.Slice((*C.vmmw_tag_policy_t)(C.malloc(C.size_t(len(sleep))*C.size_t(unsafe.Sizeof(C.vmmw_tag_policy_t{})))), len(sleep))
		for i, it := range sleep {
			arr[i] = C.vmmw_tag_policy_t{tag: C.uint32_t(it.Tag), policy: C.vmmw_policy_t(it.Policy)}
		}
		items = &arr[0]
	}
	defer C.free(unsafe.Pointer(items))
	ids := tagArray(wake)
	defer C.free(unsafe.Pointer(ids))
	var c C.vmmw_swap_options_t
	c.size = C.size_t(unsafe.Sizeof(c))
	c.wait_memory_ms = ms
	// Written by the library only when the swap ran: a status it never
	// writes tells the two cases apart.
	r := (*C.vmmw_swap_result_t)(C.calloc(1, C.size_t(unsafe.Sizeof(C.vmmw_swap_result_t{}))))
	defer C.free(unsafe.Pointer(r))
	r.sleep_status = -1
	err = p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_swap(cp, items, C.size_t(len(sleep)), ids, C.size_t(len(wake)), &c, r, e)
	})
	runtime.KeepAlive(sleep)
	if r.sleep_status == -1 {
		return SwapResult{}, err
	}
	return SwapResult{
		SleepStatus:    Status(r.sleep_status),
		WakeStatus:     Status(r.wake_status),
		SleptTags:      int(r.slept_tags),
		WokenTags:      int(r.woken_tags),
		ReleasedBytes:  uint64(r.released_bytes),
		MappedBytes:    uint64(r.mapped_bytes),
		CopiedOutBytes: uint64(r.copied_out_bytes),
		CopiedInBytes:  uint64(r.copied_in_bytes),
		SleepSeconds:   float64(r.sleep_seconds),
		WakeSeconds:    float64(r.wake_seconds),
		Seconds:        float64(r.seconds),
	}, err
}
