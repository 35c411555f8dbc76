package vmmw

// #include <stdlib.h>
// #include "vmmweights.h"
import "C"

import "unsafe"

// PackOptions are the options of Pack and Unpack (docs/PACKED.md); the zero
// value is the defaults.
type PackOptions struct {
	// FrameBytes is the raw bytes per frame (0: 16 MiB), a multiple of
	// 64 KiB up to 256 MiB.
	FrameBytes uint64
	// Threads reading, writing and coding (0: the CPUs, at most 16).
	Threads uint32
	// CPU encodes with the reference encoder on CPU threads even where a
	// GPU is present (Pack only).
	CPU bool
	// Force replaces an existing output file (a folder is never replaced).
	Force bool
	// Device is the CUDA device that encodes (Pack only).
	Device int32
}

// PackReport is what a Pack or Unpack wrote.
type PackReport struct {
	OriginalBytes uint64  // bytes of the original files
	PackedBytes   uint64  // bytes of the packed files
	Files         uint64  // files written (a folder's index not counted)
	Tensors       uint64  // tensors in the checkpoint
	Seconds       float64 // reading, coding and writing
	SyncSeconds   float64 // syncing to disk and renaming into place
}

func (o PackOptions) c() C.vmmw_pack_options_t {
	var c C.vmmw_pack_options_t
	c.size = C.size_t(unsafe.Sizeof(c))
	c.frame_bytes = C.uint64_t(o.FrameBytes)
	c.threads = C.uint32_t(o.Threads)
	if o.CPU {
		c.cpu = 1
	}
	if o.Force {
		c.force = 1
	}
	c.device = C.int32_t(o.Device)
	return c
}

func packCall(f func(src, dst *C.char, o *C.vmmw_pack_options_t, r *C.vmmw_pack_report_t, e **C.vmmw_error_t) C.vmmw_status_t,
	src, dst string, opts PackOptions) (PackReport, error) {
	cs, cd := C.CString(src), C.CString(dst)
	defer C.free(unsafe.Pointer(cs))
	defer C.free(unsafe.Pointer(cd))
	co := opts.c()
	var r C.vmmw_pack_report_t
	if err := call(func(e **C.vmmw_error_t) C.vmmw_status_t { return f(cs, cd, &co, &r, e) }); err != nil {
		return PackReport{}, err
	}
	return PackReport{
		OriginalBytes: uint64(r.original_bytes),
		PackedBytes:   uint64(r.packed_bytes),
		Files:         uint64(r.files),
		Tensors:       uint64(r.tensors),
		Seconds:       float64(r.seconds),
		SyncSeconds:   float64(r.sync_seconds),
	}, nil
}

// Pack writes the checkpoint at src (a safetensors file, a folder with its
// index, or a GGUF file) as a packed checkpoint at dst (a folder for a
// folder, else a file): the same tensors, header and metadata, each
// tensor's bytes losslessly compressed. Encodes on the GPU where one opens,
// on CPU threads otherwise; nothing is left at dst when it fails. Loading
// needs nothing new: OpenLoader reads packed checkpoints.
func Pack(src, dst string, opts PackOptions) (PackReport, error) {
	return packCall(func(s, d *C.char, o *C.vmmw_pack_options_t, r *C.vmmw_pack_report_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_pack(s, d, o, nil, nil, r, e)
	}, src, dst, opts)
}

// Unpack writes the original files of the packed checkpoint at src to dst,
// bit for bit (every frame's checksums checked).
func Unpack(src, dst string, opts PackOptions) (PackReport, error) {
	return packCall(func(s, d *C.char, o *C.vmmw_pack_options_t, r *C.vmmw_pack_report_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_unpack(s, d, o, nil, nil, r, e)
	}, src, dst, opts)
}
