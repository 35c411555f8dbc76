package vmmw

// #include <stdlib.h>
// #include "vmmweights.h"
import "C"

import (
	"context"
	"fmt"
	"runtime"
	"unsafe"
)

// PoolOptions configure NewPool; zero values mean defaults.
type PoolOptions struct {
	// Backend and Device pick the device the pool opens (BackendAuto, 0 by default).
	Backend Backend
	Device  int
	// DeviceHandle, when set, is used instead of Backend and Device; pools
	// made from one Device share its driver and staging cache.
	DeviceHandle *Device
	// Align is the alignment of every block (0: 512 bytes).
	Align uint64
	// SmallRequestMax is the largest request served from small segments.
	SmallRequestMax uint64
	// SmallSegmentBytes and LargeSegmentBytes size new segments.
	SmallSegmentBytes uint64
	LargeSegmentBytes uint64
	// ChunkBytes is the physical chunk size a segment is mapped in.
	ChunkBytes uint64
}

// Pool is a caching pool of VMM memory on one device. Safe for concurrent use.
type Pool struct {
	ptr    *C.vmmw_pool_t
	global bool
}

// Report holds a pool's memory, for all tags or one.
type Report struct {
	LiveBytes, LiveBlocks, ReservedBytes, TrackedBytes, Segments uint64
	AwakeBytes, OffloadedBytes, DiscardedBytes, ReloadableBytes  uint64
	HostBackupBytes, DeviceUsedBytes, DeviceTotalBytes           uint64
	Asleep                                                       bool
	Tags                                                         uint32
}

// Policy says what sleep does with a tag's memory.
type Policy int32

// String is the policy's short name ("offload", "discard", "reload",
// "offload_compressed").
func (p Policy) String() string {
	switch p {
	case Offload:
		return "offload"
	case Discard:
		return "discard"
	case Reload:
		return "reload"
	case OffloadCompressed:
		return "offload_compressed"
	}
	return fmt.Sprintf("Policy(%d)", int32(p))
}

const (
	// Offload copies to a pinned host backup, restored byte for byte at wake.
	Offload Policy = 0
	// Discard drops the contents (undefined after wake).
	Discard Policy = 1
	// Reload restores the contents from the checkpoint they were loaded from.
	Reload Policy = 2
	// OffloadCompressed is Offload with the host backup held losslessly
	// compressed: encoded and decoded on the GPU, checked by block checksums.
	OffloadCompressed Policy = 3
)

// TagPolicy pairs a tag with its sleep policy.
type TagPolicy struct {
	Tag    Tag
	Policy Policy
}

// NewPool creates a pool.
func NewPool(o PoolOptions) (*Pool, error) {
	c := C.vmmw_pool_options_t{
		size:                C.size_t(unsafe.Sizeof(C.vmmw_pool_options_t{})),
		backend:             C.vmmw_backend_t(o.Backend),
		device:              C.int32_t(o.Device),
		align:               C.uint64_t(o.Align),
		small_request_max:   C.uint64_t(o.SmallRequestMax),
		small_segment_bytes: C.uint64_t(o.SmallSegmentBytes),
		large_segment_bytes: C.uint64_t(o.LargeSegmentBytes),
		chunk_bytes:         C.uint64_t(o.ChunkBytes),
	}
	if o.DeviceHandle != nil {
		dp, err := o.DeviceHandle.live()
		if err != nil {
			return nil, err
		}
		c.device_handle = dp
	}
	var p *C.vmmw_pool_t
	err := call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_pool_new(&c, &p, e) })
	runtime.KeepAlive(o.DeviceHandle)
	if err != nil {
		return nil, err
	}
	pool := &Pool{ptr: p}
	runtime.SetFinalizer(pool, (*Pool).Close)
	return pool, nil
}

// GlobalPool returns the process-global pool of device (shared with the
// PyTorch entry points). Close on it does nothing.
func GlobalPool(device int) (*Pool, error) {
	var p *C.vmmw_pool_t
	if err := call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_pool_default(C.int32_t(device), &p, e) }); err != nil {
		return nil, err
	}
	return &Pool{ptr: p, global: true}, nil
}

// Close frees the pool and every block still in it. Idempotent.
func (p *Pool) Close() error {
	if p.ptr != nil {
		if !p.global {
			C.vmmw_pool_free(p.ptr)
		}
		p.ptr = nil
		runtime.SetFinalizer(p, nil)
	}
	return nil
}

func (p *Pool) live() (*C.vmmw_pool_t, error) {
	if p == nil || p.ptr == nil {
		return nil, closedError("Pool")
	}
	return p.ptr, nil
}

// do runs one C call on the live pool and keeps the pool reachable until it returns.
func (p *Pool) do(f func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t) error {
	cp, err := p.live()
	if err != nil {
		return err
	}
	err = call(func(e **C.vmmw_error_t) C.vmmw_status_t { return f(cp, e) })
	runtime.KeepAlive(p)
	return err
}

// Alloc allocates size bytes under the calling OS thread's current tag (see
// WithTag); returns the device address.
func (p *Pool) Alloc(size uint64) (uint64, error) {
	var out C.uint64_t
	err := p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_alloc(cp, C.uint64_t(size), &out, e)
	})
	return uint64(out), err
}

// AllocTagged allocates size bytes under tag.
func (p *Pool) AllocTagged(size uint64, tag Tag) (uint64, error) {
	var out C.uint64_t
	err := p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_alloc_tagged(cp, C.uint64_t(size), C.uint32_t(tag), &out, e)
	})
	return uint64(out), err
}

// Free returns a block to the pool.
func (p *Pool) Free(ptr uint64) error {
	return p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_dealloc(cp, C.uint64_t(ptr), e)
	})
}

// MarkWritten says [ptr, ptr+n) was written since a load filled it: a Reload
// sleep keeps it in the host backup instead of restoring the checkpoint's
// bytes (optional: such a sleep also finds changed bytes by hashing them).
func (p *Pool) MarkWritten(ptr, n uint64) error {
	return p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_mark_written(cp, C.uint64_t(ptr), C.uint64_t(n), e)
	})
}

// Trim returns cached memory to the driver; the bytes released.
func (p *Pool) Trim() (uint64, error) {
	var out C.uint64_t
	err := p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_pool_trim(cp, &out, e) })
	return uint64(out), err
}

// SetTagArena places tag's future blocks in one arena of reserveBytes of VA.
func (p *Pool) SetTagArena(tag Tag, reserveBytes, growStep uint64) error {
	return p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_set_tag_arena(cp, C.uint32_t(tag), C.uint64_t(reserveBytes), C.uint64_t(growStep), e)
	})
}

// SetTagSegments places tag's future blocks in cached, split segments (the
// default; undoes SetTagArena for blocks allocated from now on).
func (p *Pool) SetTagSegments(tag Tag) error {
	return p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_set_tag_segments(cp, C.uint32_t(tag), e)
	})
}

// SetTagRDMA creates tag's memory RDMA-capable (registrable by NCCL, NIXL,
// UCX), from its first allocation on and at every wake; a wake maps new pages
// (Tag.RemapEpoch, OnRemap say when to register again).
func (p *Pool) SetTagRDMA(tag Tag, rdma bool) error {
	v := C.int32_t(0)
	if rdma {
		v = 1
	}
	return p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_set_tag_rdma(cp, C.uint32_t(tag), v, e)
	})
}

func reportOf(r *C.vmmw_report_t) Report {
	return Report{uint64(r.live_bytes), uint64(r.live_blocks), uint64(r.reserved_bytes), uint64(r.tracked_bytes),
		uint64(r.segments), uint64(r.awake_bytes), uint64(r.offloaded_bytes), uint64(r.discarded_bytes),
		uint64(r.reloadable_bytes), uint64(r.host_backup_bytes), uint64(r.device_used_bytes),
		uint64(r.device_total_bytes), r.asleep != 0, uint32(r.tags)}
}

// Report returns the pool's memory summed over all tags.
func (p *Pool) Report() (Report, error) {
	var r C.vmmw_report_t
	err := p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_pool_report(cp, &r, e) })
	return reportOf(&r), err
}

// ReportTag returns the pool's memory of one tag.
func (p *Pool) ReportTag(tag Tag) (Report, error) {
	var r C.vmmw_report_t
	err := p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_report_tag(cp, C.uint32_t(tag), &r, e)
	})
	return reportOf(&r), err
}

// ReportJSON returns the full report (per tag and total) as JSON.
func (p *Pool) ReportJSON() (string, error) {
	cp, err := p.live()
	if err != nil {
		return "", err
	}
	s, err := readString(func(b *C.char, c C.size_t, n *C.size_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_report_json(cp, b, c, n, e)
	})
	runtime.KeepAlive(p)
	return s, err
}

// Write copies b to pool memory at device address dst (synchronous, range-checked).
func (p *Pool) Write(dst uint64, b []byte) error {
	err := p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_write(cp, C.uint64_t(dst), bytesPtr(b), C.size_t(len(b)), e)
	})
	runtime.KeepAlive(b)
	return err
}

// Read copies len(b) bytes of pool memory at device address src into b.
func (p *Pool) Read(src uint64, b []byte) error {
	err := p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_read(cp, C.uint64_t(src), bytesPtr(b), C.size_t(len(b)), e)
	})
	runtime.KeepAlive(b)
	return err
}

// ReadBackup copies len(b) bytes of asleep pool memory at device address ptr
// out of the host backup its sleep kept, without waking it (the tag must
// sleep with a backup holding the whole range). It returns the tag whose
// backup was read.
func (p *Pool) ReadBackup(ptr uint64, b []byte) (Tag, error) {
	var tag C.uint32_t
	err := p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_read_backup(cp, C.uint64_t(ptr), bytesPtr(b), C.size_t(len(b)), &tag, e)
	})
	runtime.KeepAlive(b)
	return Tag(tag), err
}

// BackupView returns the pinned host address of the backup bytes of n bytes
// at device address ptr, without copying (an asleep tag's backup, or one kept
// after wake), and their tag. The pool owns the bytes: read them through
// unsafe.Slice, never free them; the address is valid until the segment is
// freed, the pool's unused backups are released, or a sleep of the tag needs
// a backup of another shape.
func (p *Pool) BackupView(ptr uint64, n int) (unsafe.Pointer, Tag, error) {
	if n < 0 {
		return nil, 0, fmt.Errorf("vmmw: BackupView of %d bytes: the length is never negative", n)
	}
	var host unsafe.Pointer
	var tag C.uint32_t
	err := p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_backup_view(cp, C.uint64_t(ptr), C.size_t(n), &host, &tag, e)
	})
	return host, Tag(tag), err
}

// Sleep releases the device memory of the listed tags; pointers stay valid.
func (p *Pool) Sleep(items ...TagPolicy) error {
	if len(items) == 0 {
		return nil
	}
	// C memory: the array is only read during the call, but keeping it off the
	// Go heap makes the no-Go-pointers rule obvious.
	n := len(items)
	arr := unsafe.Slice((*C.vmmw_tag_policy_t)(C.malloc(C.size_t(n)*C.size_t(unsafe.Sizeof(C.vmmw_tag_policy_t{})))), n)
	defer C.free(unsafe.Pointer(&arr[0]))
	for i, it := range items {
		arr[i] = C.vmmw_tag_policy_t{tag: C.uint32_t(it.Tag), policy: C.vmmw_policy_t(it.Policy)}
	}
	return p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_sleep(cp, &arr[0], C.size_t(n), e)
	})
}

// Wake brings the listed tags back (every sleeping tag when none is given).
//
// A wake is transactional: it either maps every listed tag again, or it
// returns each to its asleep state with its backup intact. It has no
// cancellation point of its own, so ctx is checked before the wake starts
// (a done ctx returns its error and changes nothing) and not during it.
func (p *Pool) Wake(ctx context.Context, tags ...Tag) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("wake not started: %w", err)
	}
	ids := make([]C.uint32_t, len(tags))
	for i, t := range tags {
		ids[i] = C.uint32_t(t)
	}
	var first *C.uint32_t
	if len(ids) > 0 {
		first = &ids[0]
	}
	err := p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_wake(cp, first, C.size_t(len(ids)), e)
	})
	runtime.KeepAlive(ids)
	return err
}

// ForgetReload drops tag's reload sources: a tag asleep with PolicyReload
// whose checkpoint changed (Wake fails with StatusCheckpointInvalid) then
// wakes with its backed-up bytes restored and the loaded bytes undefined;
// load the new file after the wake.
func (p *Pool) ForgetReload(tag Tag) error {
	return p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.int32_t {
		return C.vmmw_pool_forget_reload(cp, C.uint32_t(tag), e)
	})
}

// ReserveBackup pins bytes of host backup memory ahead of time.
func (p *Pool) ReserveBackup(bytes uint64) error {
	return p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_reserve_backup(cp, C.uint64_t(bytes), e)
	})
}

// StagingBytes is the pinned host staging the loader keeps cached for this
// pool's driver (loads and Reload wakes pin a ring once and reuse it; pools
// made from one Device share it).
func (p *Pool) StagingBytes() (uint64, error) {
	var out C.uint64_t
	err := p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_staging_bytes(cp, &out, e)
	})
	return uint64(out), err
}

// ReleaseStaging unpins the loader's cached staging ring for this pool's
// driver; the bytes unpinned. The next load pins a new one.
func (p *Pool) ReleaseStaging() (uint64, error) {
	var out C.uint64_t
	err := p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_release_staging(cp, &out, e)
	})
	return uint64(out), err
}

// ReleaseBackup unpins backup memory holding no sleeping tag; the bytes unpinned.
func (p *Pool) ReleaseBackup() (uint64, error) {
	var out C.uint64_t
	err := p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_release_backup(cp, &out, e)
	})
	return uint64(out), err
}

// Snapshot records the current report in the pool's timeline as boundary
// name ("after load", "asleep", ...).
func (p *Pool) Snapshot(name string) error {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	return p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_snapshot(cp, cs, e)
	})
}

// TimelineJSON is every snapshot so far, as JSON.
func (p *Pool) TimelineJSON() (string, error) {
	return p.readString(func(cp *C.vmmw_pool_t, b *C.char, c C.size_t, n *C.size_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_timeline_json(cp, b, c, n, e)
	})
}

// LastCycleJSON says what the last successful Sleep or Wake on this pool did,
// per tag (segments, bytes released or mapped, bytes copied, seconds), as JSON.
func (p *Pool) LastCycleJSON() (string, error) {
	return p.readString(func(cp *C.vmmw_pool_t, b *C.char, c C.size_t, n *C.size_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_last_cycle_json(cp, b, c, n, e)
	})
}

func (p *Pool) readString(f func(cp *C.vmmw_pool_t, b *C.char, c C.size_t, n *C.size_t, e **C.vmmw_error_t) C.vmmw_status_t) (string, error) {
	cp, err := p.live()
	if err != nil {
		return "", err
	}
	s, err := readString(func(b *C.char, c C.size_t, n *C.size_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return f(cp, b, c, n, e)
	})
	runtime.KeepAlive(p)
	return s, err
}

// SleepOptions tune a pool's sleep engine; zero values mean defaults.
type SleepOptions struct {
	// CopyPieceBytes is the size of one copy on one stream (0: 64 MiB).
	CopyPieceBytes uint64
	// Streams is the number of streams copies are spread over (0: 2).
	Streams uint32
	// DebugFill fills discarded memory with DebugFillByte at wake, so stale reads show.
	DebugFill     bool
	DebugFillByte uint8
	// WakeCoalesceBytes re-cuts unmapped runs into chunks of this size at wake (0: 256 MiB).
	WakeCoalesceBytes uint64
	// BackupSlabBytes is the size of each pinned backup slab (0: default).
	BackupSlabBytes uint64
	// HostMemoryLimit caps pinned backup memory (0: unlimited); an offload
	// beyond it fails with ErrHostOutOfMemory before anything moves.
	HostMemoryLimit uint64
	// FreeBackupAfterWake frees a segment's backup once it is awake again.
	FreeBackupAfterWake bool
	// ReleasePinnedAfterWake also unpins backup slabs that hold nothing after wake.
	ReleasePinnedAfterWake bool
	// CodecElementBytes is the element width OffloadCompressed codes by:
	// 2 (bf16, fp16; 0 means 2), 4 (fp32) or 1 (anything else).
	CodecElementBytes uint32
}

// SetSleepOptions replaces the pool's sleep options; the host memory limit
// applies to future pinning.
func (p *Pool) SetSleepOptions(o SleepOptions) error {
	b := func(v bool) C.uint32_t {
		if v {
			return 1
		}
		return 0
	}
	c := C.vmmw_sleep_options_t{
		size:                      C.size_t(unsafe.Sizeof(C.vmmw_sleep_options_t{})),
		copy_piece_bytes:          C.uint64_t(o.CopyPieceBytes),
		streams:                   C.uint32_t(o.Streams),
		debug_fill:                b(o.DebugFill),
		wake_coalesce_bytes:       C.uint64_t(o.WakeCoalesceBytes),
		backup_slab_bytes:         C.uint64_t(o.BackupSlabBytes),
		host_memory_limit:         C.uint64_t(o.HostMemoryLimit),
		free_backup_after_wake:    b(o.FreeBackupAfterWake),
		release_pinned_after_wake: b(o.ReleasePinnedAfterWake),
		debug_fill_byte:           C.uint8_t(o.DebugFillByte),
		codec_element_bytes:       C.uint32_t(o.CodecElementBytes),
	}
	return p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pool_set_sleep_options(cp, &c, e)
	})
}
