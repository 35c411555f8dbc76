package vmmw

// #include <stdlib.h>
// #include "vmmweights.h"
import "C"

import (
	"runtime"
	"unsafe"
)

// Tag names a group of allocations that sleep and wake together.
type Tag uint32

// TagDefault is the tag of allocations made outside any scope.
const TagDefault Tag = 0

// TagID returns the id of tag name, registering it on first use.
func TagID(name string) (Tag, error) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	var t C.uint32_t
	err := call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_tag_id(cs, &t, e) })
	return Tag(t), err
}

// Name returns the tag's registered name.
func (t Tag) Name() (string, error) {
	return readString(func(b *C.char, c C.size_t, n *C.size_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_tag_name(C.uint32_t(t), b, c, n, e)
	})
}

// WithTag runs fn with tag as the current tag: allocations fn makes through
// Pool.Alloc get it. Tag scopes belong to an OS thread, so the goroutine is
// locked to its thread for the duration of fn (a goroutine started by fn does
// not inherit the scope; use Pool.AllocTagged there).
func WithTag(tag Tag, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_tag_push(C.uint32_t(tag), e) }); err != nil {
		return err
	}
	defer C.vmmw_tag_pop(nil)
	return fn()
}

// CurrentTag is the tag allocations on the calling OS thread get now
// (meaningful inside WithTag, where the goroutine is locked to its thread).
func CurrentTag() (Tag, error) {
	var t C.uint32_t
	err := call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_tag_current(&t, e) })
	return Tag(t), err
}

// SetProcessDefaultTag makes tag the tag of allocations made outside any
// WithTag scope, on every thread of the process (TagDefault restores it).
// The PyTorch entry points and Pool.Alloc use it.
func SetProcessDefaultTag(tag Tag) error {
	return call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_tag_set_process_default(C.uint32_t(tag), e) })
}
