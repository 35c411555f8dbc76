package vmmw

// #include <stdlib.h>
// #include "vmmweights.h"
import "C"

import (
	"math"
	"runtime"
	"time"
	"unsafe"
)

// What the owner's sleep of a shared tag does to attached importers.
const (
	// ShareSleepRefuse: the sleep fails (ErrInvalidState) while importers are attached.
	ShareSleepRefuse = 0
	// ShareSleepRevoke: importers' next call fails with ErrShareRevoked; their
	// mapping stays valid until they detach.
	ShareSleepRevoke = 1
)

// ShareOptions tune a share; the zero value refuses sleep while attached,
// shares read-only and accepts only this process's user.
type ShareOptions struct {
	SleepPolicy int
	AllowWrite  bool
	// AllowedUID, when non-nil, is the one user id allowed to attach.
	AllowedUID *uint32
	// AllowedGID, when non-nil, admits the members of this group too.
	AllowedGID *uint32
	// MaxConnections bounds the connections served at once; 0: 256.
	MaxConnections uint32
	// HandshakeTimeout is one deadline per handshake; 0: 10 s.
	HandshakeTimeout time.Duration
}

// ShareServer serves a loader's destinations (in one tag of a pool) to other
// processes on a Unix socket path.
type ShareServer struct {
	ptr *C.vmmw_share_server_t
}

// Serve starts serving the destinations registered in loader, which lie in
// tag's memory in pool, on a new Unix socket at path.
func Serve(pool *Pool, tag Tag, loader *Loader, path string, o ShareOptions) (*ShareServer, error) {
	cp, err := pool.live()
	if err != nil {
		return nil, err
	}
	if loader == nil || loader.ptr == nil {
		return nil, closedError("Loader")
	}
	c := C.vmmw_share_options_t{size: C.size_t(unsafe.Sizeof(C.vmmw_share_options_t{})),
		sleep_policy: C.vmmw_share_sleep_policy_t(o.SleepPolicy)}
	if o.AllowWrite {
		c.allow_write = 1
	}
	if o.AllowedUID != nil {
		c.use_allowed_uid, c.allowed_uid = 1, C.uint32_t(*o.AllowedUID)
	}
	if o.AllowedGID != nil {
		c.use_allowed_gid, c.allowed_gid = 1, C.uint32_t(*o.AllowedGID)
	}
	c.max_connections = C.uint32_t(o.MaxConnections)
	if ms := o.HandshakeTimeout.Milliseconds(); ms > math.MaxUint32 {
		c.handshake_timeout_ms = math.MaxUint32
	} else if ms > 0 {
		c.handshake_timeout_ms = C.uint32_t(ms)
	}
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	var p *C.vmmw_share_server_t
	cl := loader.ptr
	err = call(func(e **C.vmmw_error_t) C.int32_t {
		return C.vmmw_share_serve(cp, C.uint32_t(tag), cl, cs, &c, &p, e)
	})
	runtime.KeepAlive(pool)
	runtime.KeepAlive(loader)
	if err != nil {
		return nil, err
	}
	s := &ShareServer{ptr: p}
	runtime.SetFinalizer(s, (*ShareServer).Close)
	return s, nil
}

// Close stops serving and removes the socket; importers keep their mappings. Idempotent.
func (s *ShareServer) Close() error {
	if s.ptr != nil {
		C.vmmw_share_server_free(s.ptr)
		s.ptr = nil
		runtime.SetFinalizer(s, nil)
	}
	return nil
}

func (s *ShareServer) u64(f func(p *C.vmmw_share_server_t, out *C.uint64_t, e **C.vmmw_error_t) C.int32_t) (uint64, error) {
	if s == nil || s.ptr == nil {
		return 0, closedError("ShareServer")
	}
	p := s.ptr
	var v C.uint64_t
	err := call(func(e **C.vmmw_error_t) C.int32_t { return f(p, &v, e) })
	runtime.KeepAlive(s)
	return uint64(v), err
}

// Attached is the number of importers attached now.
func (s *ShareServer) Attached() (uint64, error) {
	return s.u64(func(p *C.vmmw_share_server_t, out *C.uint64_t, e **C.vmmw_error_t) C.int32_t {
		return C.vmmw_share_server_attached(p, out, e)
	})
}

// Publish announces weights written in place and returns the new version.
func (s *ShareServer) Publish() (uint64, error) {
	return s.u64(func(p *C.vmmw_share_server_t, out *C.uint64_t, e **C.vmmw_error_t) C.int32_t {
		return C.vmmw_share_server_publish(p, out, e)
	})
}

// Share is an attached share: the owner's tensors at this process's addresses.
type Share struct {
	ptr *C.vmmw_share_t
}

// Attach attaches to the share at path on device, read-only unless readWrite
// (which the owner must allow).
func Attach(device *Device, path string, readWrite bool) (*Share, error) {
	cd, err := device.live()
	if err != nil {
		return nil, err
	}
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	rw := C.uint32_t(0)
	if readWrite {
		rw = 1
	}
	var p *C.vmmw_share_t
	err = call(func(e **C.vmmw_error_t) C.int32_t { return C.vmmw_share_attach(cd, cs, rw, &p, e) })
	runtime.KeepAlive(device)
	if err != nil {
		return nil, err
	}
	s := &Share{ptr: p}
	runtime.SetFinalizer(s, func(s *Share) { s.Detach() })
	return s, nil
}

func (s *Share) do(f func(p *C.vmmw_share_t, e **C.vmmw_error_t) C.int32_t) error {
	if s == nil || s.ptr == nil {
		return closedError("Share")
	}
	p := s.ptr
	err := call(func(e **C.vmmw_error_t) C.int32_t { return f(p, e) })
	runtime.KeepAlive(s)
	return err
}

// Names lists the tensors, in the owner's order.
func (s *Share) Names() ([]string, error) {
	var n C.size_t
	if err := s.do(func(p *C.vmmw_share_t, e **C.vmmw_error_t) C.int32_t { return C.vmmw_share_count(p, &n, e) }); err != nil {
		return nil, err
	}
	names := make([]string, 0, int(n))
	for i := C.size_t(0); i < n; i++ {
		p := s.ptr
		name, err := readString(func(b *C.char, c C.size_t, nd *C.size_t, e **C.vmmw_error_t) C.int32_t {
			return C.vmmw_share_tensor_name(p, i, b, c, nd, e)
		})
		runtime.KeepAlive(s)
		if err != nil {
			return nil, err
		}
		names = append(names, name)
	}
	return names, nil
}

// Tensor is the tensor called name at this process's address; ErrShareRevoked once revoked.
func (s *Share) Tensor(name string) (Destination, error) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	var d C.vmmw_destination_t
	if err := s.do(func(p *C.vmmw_share_t, e **C.vmmw_error_t) C.int32_t { return C.vmmw_share_tensor(p, cs, &d, e) }); err != nil {
		return Destination{}, err
	}
	shape := make([]uint64, int(d.ndim))
	for i := range shape {
		shape[i] = uint64(d.shape[i])
	}
	return Destination{uint64(d.ptr), uint64(d.bytes), C.GoString(&d.dtype[0]), shape}, nil
}

// Version is the weights version, the owner's tag version (it changes when the
// owner updates or publishes).
func (s *Share) Version() (uint64, error) {
	var v C.uint64_t
	err := s.do(func(p *C.vmmw_share_t, e **C.vmmw_error_t) C.int32_t { return C.vmmw_share_version(p, &v, e) })
	return uint64(v), err
}

// OwnerConnected is false once the owner stopped serving or exited; the memory stays valid.
func (s *Share) OwnerConnected() (bool, error) {
	var c C.uint32_t
	err := s.do(func(p *C.vmmw_share_t, e **C.vmmw_error_t) C.int32_t { return C.vmmw_share_owner_connected(p, &c, e) })
	return c != 0, err
}

// Read copies len(dst) bytes of the share at this process's address src into dst.
func (s *Share) Read(src uint64, dst []byte) error {
	if len(dst) == 0 {
		return s.do(func(p *C.vmmw_share_t, e **C.vmmw_error_t) C.int32_t {
			return C.vmmw_share_read(p, C.uint64_t(src), nil, 0, e)
		})
	}
	err := s.do(func(p *C.vmmw_share_t, e **C.vmmw_error_t) C.int32_t {
		return C.vmmw_share_read(p, C.uint64_t(src), unsafe.Pointer(&dst[0]), C.size_t(len(dst)), e)
	})
	runtime.KeepAlive(dst)
	return err
}

// Detach unmaps and releases; every pointer from the share becomes invalid. Idempotent.
func (s *Share) Detach() error {
	if s == nil || s.ptr == nil {
		return nil
	}
	p := s.ptr
	s.ptr = nil
	runtime.SetFinalizer(s, nil)
	return call(func(e **C.vmmw_error_t) C.int32_t { return C.vmmw_share_detach(p, e) })
}
