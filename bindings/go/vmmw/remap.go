package vmmw

// #include <stdlib.h>
// #include "vmmweights.h"
// extern void vmmwGoRemap(void* user, uint32_t tag, uint64_t epoch);
import "C"

import (
	"runtime/cgo"
	"sync"
	"unsafe"
)

// RemapEpoch returns how many times the tag's memory was mapped anew in this
// process (each wake). Register RDMA buffers of the tag (NCCL, NIXL, UCX)
// again when it changed.
func (t Tag) RemapEpoch() (uint64, error) {
	var out C.uint64_t
	err := call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_tag_remap_epoch(C.uint32_t(t), &out, e) })
	return uint64(out), err
}

// RemapCallback is a registered remap callback; Remove stops it.
type RemapCallback struct {
	mu     sync.Mutex
	id     uint64
	handle cgo.Handle
	user   unsafe.Pointer
}

//export vmmwGoRemap
func vmmwGoRemap(user unsafe.Pointer, tag C.uint32_t, epoch C.uint64_t) {
	// user points to C memory holding the cgo.Handle: no Go pointer crossed into C.
	h := cgo.Handle(*(*C.uintptr_t)(user))
	fn := h.Value().(func(Tag, uint64))
	defer func() {
		// A panic must not unwind into the C library; it is dropped here.
		_ = recover()
	}()
	fn(Tag(tag), uint64(epoch))
}

// OnRemap calls fn(tag, epoch) after every remap of any tag, on the thread
// that woke the tag (inside Pool.Wake), after the wake, with no library lock
// held: fn may call the library, including Remove on its own callback. A
// panic in fn is recovered and dropped.
func OnRemap(fn func(tag Tag, epoch uint64)) (*RemapCallback, error) {
	h := cgo.NewHandle(fn)
	user := C.malloc(C.size_t(unsafe.Sizeof(C.uintptr_t(0))))
	*(*C.uintptr_t)(user) = C.uintptr_t(h)
	var id C.uint64_t
	err := call(func(e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_remap_callback_add(C.vmmw_remap_fn(C.vmmwGoRemap), user, &id, e)
	})
	if err != nil {
		h.Delete()
		C.free(user)
		return nil, err
	}
	return &RemapCallback{id: uint64(id), handle: h, user: user}, nil
}

// Remove stops the callback: when it returns no call starts again and calls
// running on other threads have finished. Removing twice is a no-op.
func (r *RemapCallback) Remove() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.user == nil {
		return nil
	}
	err := call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_remap_callback_remove(C.uint64_t(r.id), e) })
	if err != nil {
		return err
	}
	r.handle.Delete()
	C.free(r.user)
	r.user = nil
	return nil
}
