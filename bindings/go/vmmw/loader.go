package vmmw

// #include <stdlib.h>
// #include "vmmweights.h"
// extern int32_t vmmwGoProgress(uint64_t done, uint64_t total, void* user);
import "C"

import (
	"context"
	"fmt"
	"runtime"
	"runtime/cgo"
	"sync"
	"unsafe"
)

// CopyStrategy says how a load moves bytes from the checkpoint to the device.
type CopyStrategy int32

// Copy strategies of LoadOptions.
const (
	// CopyAuto (the default) stages page-cached data through a pinned ring
	// sized to the CPU's last-level cache and reads cold data with pread.
	CopyAuto CopyStrategy = 0
	// CopyDirect registers mmap windows read-only and DMAs from the page cache.
	CopyDirect CopyStrategy = 1
	// CopyStaged memcpys into pinned slots, then DMAs.
	CopyStaged CopyStrategy = 2
	// CopyRead preads into pinned slots, then DMAs (cold data).
	CopyRead CopyStrategy = 3
	// CopySimple uses one thread and no pinning (the reference path).
	CopySimple CopyStrategy = 4
)

// String is the strategy's short name ("auto", "direct", ...).
func (s CopyStrategy) String() string {
	switch s {
	case CopyAuto:
		return "auto"
	case CopyDirect:
		return "direct"
	case CopyStaged:
		return "staged"
	case CopyRead:
		return "read"
	case CopySimple:
		return "simple"
	}
	return fmt.Sprintf("CopyStrategy(%d)", int32(s))
}

// LoadOptions tune a load; zero values mean defaults.
type LoadOptions struct {
	// AllowMissing leaves destinations no source fills untouched instead of failing.
	AllowMissing bool
	// AllowUnexpected skips checkpoint tensors with no destination instead of failing.
	AllowUnexpected bool
	// Strategy picks the copy path (CopyAuto by default).
	Strategy CopyStrategy
	// Threads is the number of worker threads (0: one per CPU, at most 16).
	Threads uint32
	// WindowBytes is the file span registered per direct window (0: default).
	WindowBytes uint64
	// SlotBytes is the size of each pinned staging slot (0: sized to the CPU's cache).
	SlotBytes uint64
}

// Destination is one parameter the loader fills.
type Destination struct {
	Ptr, Bytes uint64
	Dtype      string
	Shape      []uint64
}

// PlanSummary says what a load will do.
type PlanSummary struct {
	Extents, Fills, SrcBytes, DstBytes, Sources, Skipped, Missing, Unexpected, Destinations uint64
}

// LoadResult says what a load did.
type LoadResult struct {
	Bytes                                            uint64
	Seconds, GBps                                    float64
	DirectBytes, StagedBytes, ReadBytes, FilledBytes uint64
	Threads                                          uint32
}

// Loader loads a safetensors checkpoint in place into device memory.
type Loader struct {
	ptr *C.vmmw_loader_t

	// cancelMu orders a context's cancellation against the end of a load, so
	// a cancel never reaches the C loader after the load it was meant for has
	// passed its last cancellation point (it would stop the next load).
	cancelMu sync.Mutex
	loading  bool
}

// OpenLoader opens a checkpoint file or folder; headers are validated now.
func OpenLoader(path string) (*Loader, error) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	var p *C.vmmw_loader_t
	if err := call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_loader_open(cs, &p, e) }); err != nil {
		return nil, err
	}
	l := &Loader{ptr: p}
	runtime.SetFinalizer(l, (*Loader).Close)
	return l, nil
}

// Close frees the loader (destinations it allocated stay in their pool). Idempotent.
func (l *Loader) Close() error {
	if l.ptr != nil {
		C.vmmw_loader_free(l.ptr)
		l.ptr = nil
		runtime.SetFinalizer(l, nil)
	}
	return nil
}

func (l *Loader) do(f func(cl *C.vmmw_loader_t, e **C.vmmw_error_t) C.vmmw_status_t) error {
	if l == nil || l.ptr == nil {
		return closedError("Loader")
	}
	cl := l.ptr
	err := call(func(e **C.vmmw_error_t) C.vmmw_status_t { return f(cl, e) })
	runtime.KeepAlive(l)
	return err
}

// SetRulesJSON replaces the mapping rules with their JSON form.
func (l *Loader) SetRulesJSON(json string) error {
	cs := C.CString(json)
	defer C.free(unsafe.Pointer(cs))
	return l.do(func(cl *C.vmmw_loader_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_loader_set_rules_json(cl, cs, e)
	})
}

// SetRulesPreset uses a Hugging Face family preset ("llama", "qwen", ...).
func (l *Loader) SetRulesPreset(family string, tpRank, tpWorld, headDim uint32) error {
	cs := C.CString(family)
	defer C.free(unsafe.Pointer(cs))
	return l.do(func(cl *C.vmmw_loader_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_loader_set_rules_preset(cl, cs, C.uint32_t(tpRank), C.uint32_t(tpWorld), C.uint32_t(headDim), e)
	})
}

// SetOptions sets the load options.
func (l *Loader) SetOptions(o LoadOptions) error {
	b := func(v bool) C.uint32_t {
		if v {
			return 1
		}
		return 0
	}
	c := C.vmmw_load_options_t{allow_missing: b(o.AllowMissing), allow_unexpected: b(o.AllowUnexpected),
		size: C.size_t(unsafe.Sizeof(C.vmmw_load_options_t{})), strategy: C.vmmw_copy_strategy_t(o.Strategy), threads: C.uint32_t(o.Threads),
		window_bytes: C.uint64_t(o.WindowBytes), slot_bytes: C.uint64_t(o.SlotBytes)}
	return l.do(func(cl *C.vmmw_loader_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_loader_set_options(cl, &c, e)
	})
}

// SetReloadCheck makes the next loads keep a checksum of every loaded extent,
// so each wake of a tag asleep with PolicyReload proves, before restoring
// anything, that the checkpoint still holds those bytes (StatusCheckpointInvalid
// otherwise, also for a rewrite that kept size and modification time).
func (l *Loader) SetReloadCheck(enable bool) error {
	var v C.uint32_t
	if enable {
		v = 1
	}
	return l.do(func(cl *C.vmmw_loader_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_loader_set_reload_check(cl, v, e)
	})
}

// Register adds a destination of your own at device address ptr.
func (l *Loader) Register(name string, ptr uint64, dtype string, shape []uint64) error {
	cn, cd := C.CString(name), C.CString(dtype)
	defer C.free(unsafe.Pointer(cn))
	defer C.free(unsafe.Pointer(cd))
	cs := make([]C.uint64_t, len(shape))
	for i, s := range shape {
		cs[i] = C.uint64_t(s)
	}
	var first *C.uint64_t
	if len(cs) > 0 {
		first = &cs[0]
	}
	err := l.do(func(cl *C.vmmw_loader_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_loader_register(cl, cn, C.uint64_t(ptr), cd, first, C.size_t(len(cs)), e)
	})
	runtime.KeepAlive(cs)
	return err
}

// DeclareForeign declares [ptr, ptr+bytes) as device memory you own outside
// the pool loads run on; destinations inside it are not checked against the pool.
func (l *Loader) DeclareForeign(ptr, bytes uint64) error {
	return l.do(func(cl *C.vmmw_loader_t, e **C.vmmw_error_t) C.int32_t {
		return C.vmmw_loader_declare_foreign(cl, C.uint64_t(ptr), C.uint64_t(bytes), e)
	})
}

// Allocate allocates every destination the plan needs from pool under tag.
func (l *Loader) Allocate(pool *Pool, tag Tag) error {
	cp, err := pool.live()
	if err != nil {
		return err
	}
	err = l.do(func(cl *C.vmmw_loader_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_loader_allocate(cl, cp, C.uint32_t(tag), e)
	})
	runtime.KeepAlive(pool)
	return err
}

// DestinationNames lists the registered destinations, in name order.
func (l *Loader) DestinationNames() ([]string, error) {
	var n C.size_t
	if err := l.do(func(cl *C.vmmw_loader_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_loader_destination_count(cl, &n, e)
	}); err != nil {
		return nil, err
	}
	names := make([]string, 0, int(n))
	for i := C.size_t(0); i < n; i++ {
		cl := l.ptr
		s, err := readString(func(b *C.char, c C.size_t, nd *C.size_t, e **C.vmmw_error_t) C.vmmw_status_t {
			return C.vmmw_loader_destination_name(cl, i, b, c, nd, e)
		})
		runtime.KeepAlive(l)
		if err != nil {
			return nil, err
		}
		names = append(names, s)
	}
	return names, nil
}

// Destination returns the destination registered under name.
func (l *Loader) Destination(name string) (Destination, error) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	var d C.vmmw_destination_t
	if err := l.do(func(cl *C.vmmw_loader_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_loader_destination(cl, cs, &d, e)
	}); err != nil {
		return Destination{}, err
	}
	shape := make([]uint64, int(d.ndim))
	for i := range shape {
		shape[i] = uint64(d.shape[i])
	}
	return Destination{uint64(d.ptr), uint64(d.bytes), C.GoString(&d.dtype[0]), shape}, nil
}

// Plan checks the plan without writing anything.
func (l *Loader) Plan() (PlanSummary, error) {
	var s C.vmmw_plan_summary_t
	err := l.do(func(cl *C.vmmw_loader_t, e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_loader_plan(cl, &s, e) })
	return PlanSummary{uint64(s.extents), uint64(s.fills), uint64(s.src_bytes), uint64(s.dst_bytes),
		uint64(s.sources), uint64(s.skipped), uint64(s.missing), uint64(s.unexpected), uint64(s.destinations)}, err
}

//export vmmwGoProgress
func vmmwGoProgress(done, total C.uint64_t, user unsafe.Pointer) C.vmmw_status_t {
	// user points to C memory holding the cgo.Handle: no Go pointer crossed into C.
	h := cgo.Handle(*(*C.uintptr_t)(user))
	if fn := h.Value().(func(done, total uint64) bool); fn(uint64(done), uint64(total)) {
		return 1
	}
	return 0
}

// Load loads the checkpoint into the destinations on pool's device.
//
// progress (may be nil) is called on the loading thread with the bytes done
// and the total, and returns whether to cancel: false continues, true asks
// the load to stop, as a non-zero return does in C and a truthy one in
// Python (docs/ABI.md). Cancelling ctx cancels too (through
// the loader's Cancel, from another goroutine, so a load waiting on the disk
// stops at once): copies in flight finish, then Load returns an error that
// matches both ctx.Err() and ErrCancelled under errors.Is; the destinations
// are then partly written. A ctx already done returns before anything is
// written. A load whose copies all completed succeeds even if ctx is
// cancelled at its very end.
func (l *Loader) Load(ctx context.Context, pool *Pool, progress func(done, total uint64) (cancel bool)) (LoadResult, error) {
	if err := ctx.Err(); err != nil {
		return LoadResult{}, fmt.Errorf("load not started: %w", err)
	}
	cp, err := pool.live()
	if err != nil {
		return LoadResult{}, err
	}
	if l == nil || l.ptr == nil {
		return LoadResult{}, closedError("Loader")
	}
	// The callback also closes the window for context cancellation once every
	// byte is done (done == total), the loader's last cancellation point.
	cb := func(done, total uint64) bool {
		if done >= total {
			l.cancelMu.Lock()
			l.loading = false
			l.cancelMu.Unlock()
		}
		return progress != nil && progress(done, total)
	}
	h := cgo.NewHandle(cb)
	defer h.Delete()
	user := C.malloc(C.size_t(unsafe.Sizeof(C.uintptr_t(0))))
	defer C.free(user)
	*(*C.uintptr_t)(user) = C.uintptr_t(h)

	l.cancelMu.Lock()
	l.loading = true
	l.cancelMu.Unlock()
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-ctx.Done():
			l.cancelMu.Lock()
			if l.loading {
				C.vmmw_loader_cancel(l.ptr, nil)
			}
			l.cancelMu.Unlock()
			if testHookCancelForwarded != nil {
				testHookCancelForwarded()
			}
		case <-stop:
		}
	}()
	if testHookBeforeLoad != nil {
		testHookBeforeLoad()
	}
	err = l.do(func(cl *C.vmmw_loader_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_loader_load(cl, cp, C.vmmw_progress_fn(C.vmmwGoProgress), user, e)
	})
	l.cancelMu.Lock()
	l.loading = false
	l.cancelMu.Unlock()
	close(stop)
	<-watched
	runtime.KeepAlive(pool)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil && isStatus(err, StatusCancelled) {
			return LoadResult{}, &contextError{ctx: ctxErr, lib: err}
		}
		return LoadResult{}, err
	}
	return l.Result()
}

// Test hooks (nil outside tests): testHookBeforeLoad runs just before the C
// load starts; testHookCancelForwarded runs after a context's cancellation
// reached the loader.
var testHookBeforeLoad, testHookCancelForwarded func()

// contextError is a library error caused by a cancelled context: it matches
// both under errors.Is.
type contextError struct {
	ctx, lib error
}

func (e *contextError) Error() string   { return e.ctx.Error() + ": " + e.lib.Error() }
func (e *contextError) Unwrap() []error { return []error{e.ctx, e.lib} }

// Cancel asks a running load (or the next one) to stop with ErrCancelled.
func (l *Loader) Cancel() error {
	return l.do(func(cl *C.vmmw_loader_t, e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_loader_cancel(cl, e) })
}

// Result says what the last successful load did.
func (l *Loader) Result() (LoadResult, error) {
	var r C.vmmw_load_result_t
	err := l.do(func(cl *C.vmmw_loader_t, e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_loader_result(cl, &r, e) })
	return LoadResult{uint64(r.bytes), float64(r.seconds), float64(r.gbps), uint64(r.direct_bytes),
		uint64(r.staged_bytes), uint64(r.read_bytes), uint64(r.filled_bytes), uint32(r.threads)}, err
}

// ResultJSON is the last load's statistics and plan summary as JSON.
// ErrInvalidState before a load has completed.
func (l *Loader) ResultJSON() (string, error) {
	if l == nil || l.ptr == nil {
		return "", closedError("Loader")
	}
	cl := l.ptr
	s, err := readString(func(b *C.char, c C.size_t, n *C.size_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_loader_result_json(cl, b, c, n, e)
	})
	runtime.KeepAlive(l)
	return s, err
}
