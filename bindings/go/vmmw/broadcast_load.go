package vmmw

// #include <stdlib.h>
// #include "vmmweights.h"
import "C"

import (
	"runtime"
	"unsafe"
)

// BroadcastLoadResult says what one broadcast load did on this rank.
type BroadcastLoadResult struct {
	// Update is the destinations' side: the tag, its new version, bytes written.
	Update UpdateResult
	// Buckets and Bytes broadcast, by every reader.
	Buckets, Bytes uint64
	// FilesRead and BytesRead by this rank.
	FilesRead, BytesRead uint64
}

// BroadcastLoadOptions shape a broadcast load; every rank passes the same.
type BroadcastLoadOptions struct {
	// Readers are the ranks that read the checkpoint's files, each a
	// contiguous run of them.
	Readers []uint32
	// SlotBytes is the ring's bucket size (0: 256 MiB).
	SlotBytes uint64
	// TimeoutMs bounds each broadcast (0: 300 s).
	TimeoutMs uint64
	// Stage lands buckets in scratch device memory first, so a failed load
	// leaves the destinations untouched; otherwise they are written as
	// buckets land and a failed load leaves the tag torn.
	Stage bool
}

// BroadcastLoad loads the checkpoint loader opened into its destinations in
// pool (allocated first, as for Load): the readers stream its files into the
// broadcast ring and every rank applies each bucket through its rules.
func (c *NcclComm) BroadcastLoad(loader *Loader, pool *Pool, o BroadcastLoadOptions) (BroadcastLoadResult, error) {
	if c == nil || c.ptr == nil {
		return BroadcastLoadResult{}, closedError("NcclComm")
	}
	cp, err := pool.live()
	if err != nil {
		return BroadcastLoadResult{}, err
	}
	var readers *C.uint32_t
	if len(o.Readers) > 0 {
		readers = (*C.uint32_t)(C.malloc(C.size_t(len(o.Readers)) * 4))
		defer C.free(unsafe.Pointer(readers))
		copy(unsafe.Slice((*uint32)(unsafe.Pointer(readers)), len(o.Readers)), o.Readers)
	}
	var stage C.uint32_t
	if o.Stage {
		stage = 1
	}
	var r C.vmmw_broadcast_load_result_t
	err = loader.do(func(cl *C.vmmw_loader_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_load_broadcast(c.ptr, cl, cp, readers, C.size_t(len(o.Readers)),
			C.uint64_t(o.SlotBytes), C.uint64_t(o.TimeoutMs), stage, &r, e)
	})
	runtime.KeepAlive(c)
	runtime.KeepAlive(pool)
	if err != nil {
		return BroadcastLoadResult{}, err
	}
	return BroadcastLoadResult{Update: resultOf(&r.update), Buckets: uint64(r.buckets),
		Bytes: uint64(r.bytes), FilesRead: uint64(r.files_read), BytesRead: uint64(r.bytes_read)}, nil
}
