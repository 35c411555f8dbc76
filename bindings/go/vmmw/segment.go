package vmmw

// #include "vmmweights.h"
import "C"

import "runtime"

// Segment is one raw VMM allocation: a VA reservation backed by physical chunks.
type Segment struct {
	ptr *C.vmmw_segment_t
}

// SegmentInfo holds a segment's address and sizes.
type SegmentInfo struct {
	Ptr, Reserved, Committed, Mapped, Chunks uint64
}

// NewSegment reserves and backs size bytes on d, in chunks of at most chunkSize (0 = one).
func NewSegment(d *Device, size, chunkSize uint64) (*Segment, error) {
	dp, err := d.live()
	if err != nil {
		return nil, err
	}
	var p *C.vmmw_segment_t
	err = call(func(e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_segment_new(dp, C.uint64_t(size), C.uint64_t(chunkSize), &p, e)
	})
	runtime.KeepAlive(d)
	if err != nil {
		return nil, err
	}
	s := &Segment{ptr: p}
	runtime.SetFinalizer(s, (*Segment).Close)
	return s, nil
}

// Close unmaps and releases the segment's memory and VA. Idempotent.
func (s *Segment) Close() error {
	if s.ptr != nil {
		C.vmmw_segment_free(s.ptr)
		s.ptr = nil
		runtime.SetFinalizer(s, nil)
	}
	return nil
}

func (s *Segment) live() (*C.vmmw_segment_t, error) {
	if s == nil || s.ptr == nil {
		return nil, closedError("Segment")
	}
	return s.ptr, nil
}

// Info returns the segment's address and sizes.
func (s *Segment) Info() (SegmentInfo, error) {
	p, err := s.live()
	if err != nil {
		return SegmentInfo{}, err
	}
	var i C.vmmw_segment_info_t
	err = call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_segment_info(p, &i, e) })
	runtime.KeepAlive(s)
	return SegmentInfo{uint64(i.ptr), uint64(i.reserved), uint64(i.committed), uint64(i.mapped), uint64(i.chunks)}, err
}

// Write copies b into the segment at offset (synchronous).
func (s *Segment) Write(offset uint64, b []byte) error {
	p, err := s.live()
	if err != nil {
		return err
	}
	err = call(func(e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_segment_write(p, C.uint64_t(offset), bytesPtr(b), C.size_t(len(b)), e)
	})
	runtime.KeepAlive(s)
	runtime.KeepAlive(b)
	return err
}

// Read copies len(b) bytes of the segment at offset into b (synchronous).
func (s *Segment) Read(offset uint64, b []byte) error {
	p, err := s.live()
	if err != nil {
		return err
	}
	err = call(func(e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_segment_read(p, C.uint64_t(offset), bytesPtr(b), C.size_t(len(b)), e)
	})
	runtime.KeepAlive(s)
	runtime.KeepAlive(b)
	return err
}
