package vmmw

// #include <stdlib.h>
// #include "vmmweights.h"
import "C"

import (
	"errors"
	"runtime"
	"unsafe"
)

// UpdateSender is an IPC update sender: a control socket receivers connect
// to, and a ring of buffers in a pool, exported once, for tensors that do
// not lie in the pool (SendDirect needs no ring).
type UpdateSender struct {
	ptr *C.vmmw_update_sender_t
}

// SendReport says what one send did.
type SendReport struct {
	Version, Buckets, Bytes uint64
	// SetupSeconds runs from the receivers' connections to their rings attached.
	SetupSeconds, Seconds float64
}

// NewUpdateSender listens for receivers at path; its ring, slots buffers of
// slotBytes (0: 2 of 256 MiB) in pool, is allocated at the first Send.
// timeoutMs bounds each wait (0: 60 s).
func NewUpdateSender(pool *Pool, path string, slots uint32, slotBytes, timeoutMs uint64) (*UpdateSender, error) {
	cp, err := pool.live()
	if err != nil {
		return nil, err
	}
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	var p *C.vmmw_update_sender_t
	err = call(func(e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_update_sender_new(cp, cs, C.uint32_t(slots), C.uint64_t(slotBytes), C.uint64_t(timeoutMs), &p, e)
	})
	runtime.KeepAlive(pool)
	if err != nil {
		return nil, err
	}
	s := &UpdateSender{ptr: p}
	runtime.SetFinalizer(s, (*UpdateSender).Close)
	return s, nil
}

// Send waits for receivers receivers and sends them source's tensors in
// buckets through the ring (allocated at the first Send); it returns once
// every receiver committed the update.
func (s *UpdateSender) Send(source *UpdateSource, receivers uint32) (SendReport, error) {
	return s.send(source, receivers, false)
}

// SendDirect waits for receivers receivers and sends them source's tensors
// directly, without the ring: every tensor must lie in device memory of the
// sender's pool. Each receiver maps the pool segments holding them and
// copies straight out of them. It returns once every receiver committed
// the update; the tensors must not be written before then.
func (s *UpdateSender) SendDirect(source *UpdateSource, receivers uint32) (SendReport, error) {
	return s.send(source, receivers, true)
}

func (s *UpdateSender) send(source *UpdateSource, receivers uint32, direct bool) (SendReport, error) {
	if s == nil || s.ptr == nil {
		return SendReport{}, closedError("UpdateSender")
	}
	if source == nil || source.ptr == nil {
		return SendReport{}, closedError("UpdateSource")
	}
	var r C.vmmw_send_report_t
	err := call(func(e **C.vmmw_error_t) C.vmmw_status_t {
		if direct {
			return C.vmmw_update_sender_send_direct(s.ptr, source.ptr, C.uint32_t(receivers), &r, e)
		}
		return C.vmmw_update_sender_send(s.ptr, source.ptr, C.uint32_t(receivers), &r, e)
	})
	runtime.KeepAlive(s)
	runtime.KeepAlive(source)
	return SendReport{Version: uint64(r.version), Buckets: uint64(r.buckets), Bytes: uint64(r.bytes),
		SetupSeconds: float64(r.setup_seconds), Seconds: float64(r.seconds)}, err
}

// Close stops serving the ring, removes the socket and frees the ring.
func (s *UpdateSender) Close() error {
	if s.ptr != nil {
		C.vmmw_update_sender_free(s.ptr)
		s.ptr = nil
		runtime.SetFinalizer(s, nil)
	}
	return nil
}

func updateOptions(o UpdateOptions) C.vmmw_update_options_t {
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
	return C.vmmw_update_options_t{size: C.size_t(unsafe.Sizeof(C.vmmw_update_options_t{})),
		expected_version: C.uint64_t(o.ExpectedVersion), tag_set: b(o.TagSet), tag: C.uint32_t(o.Tag),
		allow_missing: b(o.AllowMissing), allow_unexpected: b(o.AllowUnexpected), staging: staging}
}

func resultOf(r *C.vmmw_update_result_t) UpdateResult {
	return UpdateResult{Tag: Tag(r.tag), Staged: r.staged != 0, Retried: r.retried != 0,
		Version: uint64(r.version), Bytes: uint64(r.bytes), Destinations: uint64(r.destinations),
		Copies: uint64(r.copies), Seconds: float64(r.seconds), GBps: float64(r.gbps),
		PlanSeconds: float64(r.plan_seconds), IssueSeconds: float64(r.issue_seconds),
		WaitSeconds: float64(r.wait_seconds), BookkeepingSeconds: float64(r.bookkeeping_seconds)}
}

// ReceiveIPC receives one update from the sender at path into loader's
// destinations in pool, through its rules (a tensor-parallel rank keeps its
// slices). On failure every destination keeps its last version.
func ReceiveIPC(loader *Loader, pool *Pool, path string, o UpdateOptions, timeoutMs uint64) (UpdateResult, error) {
	cp, err := pool.live()
	if err != nil {
		return UpdateResult{}, err
	}
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	c := updateOptions(o)
	var r C.vmmw_update_result_t
	err = loader.do(func(cl *C.vmmw_loader_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_update_receive_ipc(cl, cp, cs, C.uint64_t(timeoutMs), &c, &r, e)
	})
	runtime.KeepAlive(pool)
	if err != nil {
		return UpdateResult{}, err
	}
	return resultOf(&r), nil
}

// UpdateReceiver receives updates from one IPC sender and keeps the shares
// of its direct updates imported between updates, so a later update from
// the same sender over the same memory attaches nothing. The kept imports
// keep the sender's memory allocated (also memory it freed or put to sleep
// since) until they are dropped: DropImports, a failed update, Close.
type UpdateReceiver struct {
	ptr *C.vmmw_update_receiver_t
}

// ReceiveStats says what a receiver's last receive did and what it keeps.
type ReceiveStats struct {
	// Direct is true for a direct update, false for one through the ring.
	Direct bool
	// Attached and Reused count the shares attached and the kept imports
	// reused by the last receive; Chunks the physical chunks it imported.
	Attached, Reused uint32
	Chunks           uint64
	// SetupSeconds runs from connecting to every share imported and checked.
	SetupSeconds, Seconds float64
	// KeptImports and KeptBytes: what is kept imported now (and so kept
	// allocated on the device).
	KeptImports, KeptBytes uint64
}

// NewUpdateReceiver makes a receiver for the sender at path, importing on
// pool's device; it connects at each Receive. timeoutMs bounds each wait
// (0: 60 s); at most maxKeptImports shares (0: 64) and maxKeptBytes bytes
// (0: no byte bound) stay imported between updates.
func NewUpdateReceiver(pool *Pool, path string, timeoutMs, maxKeptImports, maxKeptBytes uint64) (*UpdateReceiver, error) {
	cp, err := pool.live()
	if err != nil {
		return nil, err
	}
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	var p *C.vmmw_update_receiver_t
	err = call(func(e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_update_receiver_new(cp, cs, C.uint64_t(timeoutMs), C.uint64_t(maxKeptImports),
			C.uint64_t(maxKeptBytes), &p, e)
	})
	runtime.KeepAlive(pool)
	if err != nil {
		return nil, err
	}
	r := &UpdateReceiver{ptr: p}
	runtime.SetFinalizer(r, (*UpdateReceiver).Close)
	return r, nil
}

// Receive receives one update into loader's destinations in pool, as
// ReceiveIPC, reusing the imports kept from the sender's earlier direct
// updates where the sender says the memory is the same. On failure every
// destination keeps its last version and the kept imports are dropped.
func (r *UpdateReceiver) Receive(loader *Loader, pool *Pool, o UpdateOptions) (UpdateResult, error) {
	if r == nil || r.ptr == nil {
		return UpdateResult{}, closedError("UpdateReceiver")
	}
	cp, err := pool.live()
	if err != nil {
		return UpdateResult{}, err
	}
	c := updateOptions(o)
	var out C.vmmw_update_result_t
	err = loader.do(func(cl *C.vmmw_loader_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_update_receiver_receive(r.ptr, cl, cp, &c, &out, e)
	})
	runtime.KeepAlive(pool)
	runtime.KeepAlive(r)
	if err != nil {
		return UpdateResult{}, err
	}
	return resultOf(&out), nil
}

// Stats says what the last successful Receive did (zero before the first)
// and what is kept imported now.
func (r *UpdateReceiver) Stats() (ReceiveStats, error) {
	if r == nil || r.ptr == nil {
		return ReceiveStats{}, closedError("UpdateReceiver")
	}
	var s C.vmmw_receive_stats_t
	err := call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_update_receiver_stats(r.ptr, &s, e) })
	runtime.KeepAlive(r)
	return ReceiveStats{Direct: s.direct != 0, Attached: uint32(s.attached), Reused: uint32(s.reused),
		Chunks: uint64(s.chunks), SetupSeconds: float64(s.setup_seconds), Seconds: float64(s.seconds),
		KeptImports: uint64(s.kept_imports), KeptBytes: uint64(s.kept_bytes)}, err
}

// DropImports drops every kept import: the sender's memory they kept
// allocated goes, and the next Receive attaches again.
func (r *UpdateReceiver) DropImports() error {
	if r == nil || r.ptr == nil {
		return closedError("UpdateReceiver")
	}
	err := call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_update_receiver_drop_imports(r.ptr, e) })
	runtime.KeepAlive(r)
	return err
}

// Close frees the receiver and drops its kept imports.
func (r *UpdateReceiver) Close() error {
	if r.ptr != nil {
		C.vmmw_update_receiver_free(r.ptr)
		r.ptr = nil
		runtime.SetFinalizer(r, nil)
	}
	return nil
}

// NcclComm is an NCCL communicator for broadcast updates.
type NcclComm struct {
	ptr *C.vmmw_nccl_comm_t
}

// NcclUniqueID returns a new NCCL unique id (128 bytes) for NewNcclComm.
func NcclUniqueID() ([]byte, error) {
	id := make([]byte, 128)
	buf := (*C.uint8_t)(C.malloc(128))
	defer C.free(unsafe.Pointer(buf))
	err := call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_nccl_unique_id(buf, e) })
	if err != nil {
		return nil, err
	}
	copy(id, unsafe.Slice((*byte)(unsafe.Pointer(buf)), 128))
	return id, nil
}

// NewNcclComm joins the communicator of world ranks named by id as rank, on
// pool's device; it blocks until every rank joined.
func NewNcclComm(pool *Pool, id []byte, world, rank uint32) (*NcclComm, error) {
	if len(id) != 128 {
		return nil, errors.New("vmmw: an NCCL unique id is 128 bytes")
	}
	cp, err := pool.live()
	if err != nil {
		return nil, err
	}
	buf := (*C.uint8_t)(C.CBytes(id))
	defer C.free(unsafe.Pointer(buf))
	var p *C.vmmw_nccl_comm_t
	err = call(func(e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_nccl_comm_new(cp, buf, C.uint32_t(world), C.uint32_t(rank), &p, e)
	})
	runtime.KeepAlive(pool)
	if err != nil {
		return nil, err
	}
	c := &NcclComm{ptr: p}
	runtime.SetFinalizer(c, (*NcclComm).Close)
	return c, nil
}

// NcclCommFromRaw uses an ncclComm_t the caller has; Close leaves it alone.
func NcclCommFromRaw(comm unsafe.Pointer) (*NcclComm, error) {
	var p *C.vmmw_nccl_comm_t
	err := call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_nccl_comm_from_raw(comm, &p, e) })
	if err != nil {
		return nil, err
	}
	c := &NcclComm{ptr: p}
	runtime.SetFinalizer(c, (*NcclComm).Close)
	return c, nil
}

// BroadcastSend broadcasts source from this rank (the root) to every rank,
// in buckets of slotBytes (0: 256 MiB; every rank passes the same).
func (c *NcclComm) BroadcastSend(pool *Pool, source *UpdateSource, slotBytes, timeoutMs uint64) error {
	if c == nil || c.ptr == nil {
		return closedError("NcclComm")
	}
	if source == nil || source.ptr == nil {
		return closedError("UpdateSource")
	}
	cp, err := pool.live()
	if err != nil {
		return err
	}
	err = call(func(e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_update_broadcast_send(c.ptr, cp, source.ptr, C.uint64_t(slotBytes), C.uint64_t(timeoutMs), e)
	})
	runtime.KeepAlive(c)
	runtime.KeepAlive(pool)
	runtime.KeepAlive(source)
	return err
}

// BroadcastReceive receives one update broadcast from root into loader's
// destinations in pool, through its rules (each rank its slices).
func (c *NcclComm) BroadcastReceive(loader *Loader, pool *Pool, root uint32, o UpdateOptions, slotBytes, timeoutMs uint64) (UpdateResult, error) {
	if c == nil || c.ptr == nil {
		return UpdateResult{}, closedError("NcclComm")
	}
	cp, err := pool.live()
	if err != nil {
		return UpdateResult{}, err
	}
	opts := updateOptions(o)
	var r C.vmmw_update_result_t
	err = loader.do(func(cl *C.vmmw_loader_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_update_broadcast_receive(c.ptr, cl, cp, C.uint32_t(root), C.uint64_t(slotBytes), C.uint64_t(timeoutMs), &opts, &r, e)
	})
	runtime.KeepAlive(c)
	runtime.KeepAlive(pool)
	if err != nil {
		return UpdateResult{}, err
	}
	return resultOf(&r), nil
}

// BroadcastRoot broadcasts source from this rank (the root) and applies it
// here too, into loader's destinations in pool.
func (c *NcclComm) BroadcastRoot(loader *Loader, pool *Pool, source *UpdateSource, o UpdateOptions, slotBytes, timeoutMs uint64) (UpdateResult, error) {
	if c == nil || c.ptr == nil {
		return UpdateResult{}, closedError("NcclComm")
	}
	if source == nil || source.ptr == nil {
		return UpdateResult{}, closedError("UpdateSource")
	}
	cp, err := pool.live()
	if err != nil {
		return UpdateResult{}, err
	}
	opts := updateOptions(o)
	var r C.vmmw_update_result_t
	err = loader.do(func(cl *C.vmmw_loader_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_update_broadcast_root(c.ptr, cl, cp, source.ptr, C.uint64_t(slotBytes), C.uint64_t(timeoutMs), &opts, &r, e)
	})
	runtime.KeepAlive(c)
	runtime.KeepAlive(pool)
	runtime.KeepAlive(source)
	if err != nil {
		return UpdateResult{}, err
	}
	return resultOf(&r), nil
}

// Register registers device memory with the communicator (ncclCommRegister);
// the handle goes to Deregister. Register again when the tag's RemapEpoch moved.
func (c *NcclComm) Register(ptr, length uint64) (unsafe.Pointer, error) {
	if c == nil || c.ptr == nil {
		return nil, closedError("NcclComm")
	}
	var h unsafe.Pointer
	err := call(func(e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_nccl_register(c.ptr, C.uint64_t(ptr), C.uint64_t(length), &h, e)
	})
	runtime.KeepAlive(c)
	return h, err
}

// Deregister drops a registration made by Register.
func (c *NcclComm) Deregister(handle unsafe.Pointer) error {
	if c == nil || c.ptr == nil {
		return closedError("NcclComm")
	}
	err := call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_nccl_deregister(c.ptr, handle, e) })
	runtime.KeepAlive(c)
	return err
}

// Close frees the handle (destroying a communicator NewNcclComm created).
func (c *NcclComm) Close() error {
	if c.ptr != nil {
		C.vmmw_nccl_comm_free(c.ptr)
		c.ptr = nil
		runtime.SetFinalizer(c, nil)
	}
	return nil
}
