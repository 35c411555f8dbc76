package vmmw

// #include <stdlib.h>
// #include "vmmweights.h"
import "C"

import (
	"runtime"
	"unsafe"
)

// Memory says where an update source tensor's bytes lie.
type Memory int32

// Kinds of Memory.
const (
	// MemoryDevice is memory the pool's device can read (its own memory from
	// any allocator: a trainer's tensors, a pool block).
	MemoryDevice Memory = 0
	// MemoryHost is host memory of this process allocated outside Go's heap
	// (C.malloc, mmap): the library keeps the address past the call, which
	// cgo's rules forbid for Go memory.
	MemoryHost Memory = 1
)

// UpdateSource is a set of whole tensors, by checkpoint name, that Update
// reads (docs/UPDATES.md). The tensors stay the caller's and must stay valid
// while updates read them.
type UpdateSource struct {
	ptr *C.vmmw_update_source_t
}

// NewUpdateSource returns an empty source.
func NewUpdateSource() (*UpdateSource, error) {
	var p *C.vmmw_update_source_t
	if err := call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_update_source_new(&p, e) }); err != nil {
		return nil, err
	}
	s := &UpdateSource{ptr: p}
	runtime.SetFinalizer(s, (*UpdateSource).Close)
	return s, nil
}

// Close frees the source (not the tensors it names). Idempotent.
func (s *UpdateSource) Close() error {
	if s.ptr != nil {
		C.vmmw_update_source_free(s.ptr)
		s.ptr = nil
		runtime.SetFinalizer(s, nil)
	}
	return nil
}

// Add adds tensor name (its checkpoint name) of dtype and shape lying
// contiguously at ptr in mem.
func (s *UpdateSource) Add(name, dtype string, shape []uint64, ptr uint64, mem Memory) error {
	if s == nil || s.ptr == nil {
		return closedError("UpdateSource")
	}
	cn, cd := C.CString(name), C.CString(dtype)
	defer C.free(unsafe.Pointer(cn))
	defer C.free(unsafe.Pointer(cd))
	cs := make([]C.uint64_t, len(shape))
	for i, v := range shape {
		cs[i] = C.uint64_t(v)
	}
	var first *C.uint64_t
	if len(cs) > 0 {
		first = &cs[0]
	}
	sp := s.ptr
	err := call(func(e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_update_source_add(sp, cn, cd, first, C.size_t(len(cs)), C.uint64_t(ptr), C.vmmw_update_memory_t(mem), e)
	})
	runtime.KeepAlive(cs)
	runtime.KeepAlive(s)
	return err
}

// UpdateOptions are the options of one update.
type UpdateOptions struct {
	// ExpectedVersion is the tag version the update replaces (Pool.TagVersion); required.
	ExpectedVersion uint64
	// TagSet versions Tag instead of the one pool tag the destinations lie in.
	TagSet bool
	Tag    Tag
	// AllowMissing updates only the destinations the source fills.
	AllowMissing bool
	// AllowUnexpected skips source tensors no destination receives.
	AllowUnexpected bool
	// Staged always copies through scratch device memory first.
	Staged bool
}

// UpdateResult says what an update did.
type UpdateResult struct {
	Tag                                  Tag
	Staged, Retried                      bool
	Version, Bytes, Destinations, Copies uint64
	Seconds, GBps                        float64
	// Where the call's time went, in seconds: checks and plan up to the
	// first copy, queuing the copies, waiting for them, and bookkeeping
	// (Reload retirement while the device copies, version publish).
	PlanSeconds, IssueSeconds, WaitSeconds, BookkeepingSeconds float64
}

// Update writes source into the destinations loader registered, through its
// rules, on pool's device; the tag's version moves to o.ExpectedVersion+1.
// Every destination ends untouched or wholly new (docs/UPDATES.md).
func Update(loader *Loader, pool *Pool, source *UpdateSource, o UpdateOptions) (UpdateResult, error) {
	if source == nil || source.ptr == nil {
		return UpdateResult{}, closedError("UpdateSource")
	}
	cp, err := pool.live()
	if err != nil {
		return UpdateResult{}, err
	}
	b := func(v bool) C.uint32_t {
		if v {
			return 1
		}
		return 0
	}
	staging := C.vmmw_staging_t(C.VMMW_STAGING_AUTO)
	if o.Staged {
		staging = C.VMMW_STAGING_ALWAYS
	}
	c := C.vmmw_update_options_t{size: C.size_t(unsafe.Sizeof(C.vmmw_update_options_t{})),
		expected_version: C.uint64_t(o.ExpectedVersion), tag_set: b(o.TagSet), tag: C.uint32_t(o.Tag),
		allow_missing: b(o.AllowMissing), allow_unexpected: b(o.AllowUnexpected), staging: staging}
	var r C.vmmw_update_result_t
	sp := source.ptr
	err = loader.do(func(cl *C.vmmw_loader_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_update(cl, cp, sp, &c, &r, e)
	})
	runtime.KeepAlive(pool)
	runtime.KeepAlive(source)
	if err != nil {
		return UpdateResult{}, err
	}
	return resultOf(&r), nil
}

// TagVersion is the weights version of tag in this pool (1 until an update
// or a publish moves it).
func (p *Pool) TagVersion(tag Tag) (uint64, error) {
	var out C.uint64_t
	err := p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_tag_version(cp, C.uint32_t(tag), &out, e)
	})
	return uint64(out), err
}

// TagTorn reports whether an update of tag failed midway and left its
// destinations holding a mix of versions (cleared by the next update).
func (p *Pool) TagTorn(tag Tag) (bool, error) {
	var out C.int32_t
	err := p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_tag_torn(cp, C.uint32_t(tag), &out, e)
	})
	return out != 0, err
}

// Publish announces weights of tag rewritten in place by other means than
// Update: the version moves by one (returned) and importers see it.
func (p *Pool) Publish(tag Tag) (uint64, error) {
	var out C.uint64_t
	err := p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_publish(cp, C.uint32_t(tag), &out, e)
	})
	return uint64(out), err
}
