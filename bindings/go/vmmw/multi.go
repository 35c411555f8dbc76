package vmmw

// #include <stdlib.h>
// #include "vmmweights.h"
import "C"

import (
	"errors"
	"runtime"
	"unsafe"
)

// AccessMode is what a peer device may do with a tag's memory.
type AccessMode int32

// Peer access modes (VMMW_ACCESS_*).
const (
	AccessNone      AccessMode = 0
	AccessRead      AccessMode = 1
	AccessReadWrite AccessMode = 2
)

// PeerAccess is one peer device's access to a tag's memory.
type PeerAccess struct {
	Device int
	Access AccessMode
}

// SetPeerAccess grants the listed peers access to every segment of tag, kept
// across sleep/wake and for segments made later; peers missing from the list
// lose their access (no peers revokes all).
func (p *Pool) SetPeerAccess(tag Tag, peers ...PeerAccess) error {
	arr := make([]C.vmmw_peer_access_t, len(peers))
	for i, a := range peers {
		arr[i] = C.vmmw_peer_access_t{device: C.int32_t(a.Device), access: C.int32_t(a.Access)}
	}
	return p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.int32_t {
		var first *C.vmmw_peer_access_t
		if len(arr) > 0 {
			first = &arr[0]
		}
		return C.vmmw_pool_set_peer_access(cp, C.uint32_t(tag), first, C.size_t(len(arr)), e)
	})
}

// PeerAccess lists the peers granted access to tag, sorted by device.
func (p *Pool) PeerAccess(tag Tag) ([]PeerAccess, error) {
	var n C.size_t
	if err := p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.int32_t {
		return C.vmmw_pool_peer_access_count(cp, C.uint32_t(tag), &n, e)
	}); err != nil {
		return nil, err
	}
	out := make([]PeerAccess, 0, int(n))
	for i := C.size_t(0); i < n; i++ {
		var a C.vmmw_peer_access_t
		if err := p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.int32_t {
			return C.vmmw_pool_peer_access_at(cp, C.uint32_t(tag), i, &a, e)
		}); err != nil {
			return nil, err
		}
		out = append(out, PeerAccess{int(a.device), AccessMode(a.access)})
	}
	return out, nil
}

// CanAccessPeer says whether this pool's device can reach memory of device peer.
func (p *Pool) CanAccessPeer(peer int) (bool, error) {
	var can C.int32_t
	err := p.do(func(cp *C.vmmw_pool_t, e **C.vmmw_error_t) C.int32_t {
		return C.vmmw_pool_can_access_peer(cp, C.int32_t(peer), &can, e)
	})
	return can != 0, err
}

// MultiMode is how LoadDevices divides the work.
type MultiMode int32

// Multi-device load modes (VMMW_MULTI_*).
const (
	// MultiReplicas puts all of the checkpoint on every device: each loads a
	// share from host memory and pulls the others over peer copies.
	MultiReplicas MultiMode = 0
	// MultiRanks loads each loader's own plan on its device (tensor-parallel ranks).
	MultiRanks MultiMode = 1
)

// MultiResult is what LoadDevices did.
type MultiResult struct {
	HostBytes, PeerBytes, DeliveredBytes uint64
	Seconds, HostSeconds, PeerSeconds    float64
	GBps                                 float64
	RecoveredDevices                     uint32
}

// LoadDevices loads one checkpoint into loaders[i]'s destinations on
// pools[i]'s device, for every i at once (vmmw_loader_load_devices).
// loaders[0].Cancel() stops it.
func LoadDevices(loaders []*Loader, pools []*Pool, mode MultiMode) (MultiResult, error) {
	return onDevices("LoadDevices", loaders, pools, func(lp **C.vmmw_loader_t, pp **C.vmmw_pool_t, n C.size_t, r *C.vmmw_multi_result_t, e **C.vmmw_error_t) C.int32_t {
		return C.vmmw_loader_load_devices(lp, pp, n, C.int32_t(mode), r, e)
	})
}

// WakeReplicasByReload wakes replicas that slept without backups
// (PolicyDiscard) by one checkpoint fan-out (vmmw_replicas_wake_by_reload):
// the tags owning loaders[i]'s destinations in pools[i] are woken, then the
// checkpoint is read from host memory once and exchanged over peer copies.
// For replicas asleep on one host backup, see WakeReplicasFromBackup.
func WakeReplicasByReload(loaders []*Loader, pools []*Pool) (MultiResult, error) {
	return onDevices("WakeReplicasByReload", loaders, pools, func(lp **C.vmmw_loader_t, pp **C.vmmw_pool_t, n C.size_t, r *C.vmmw_multi_result_t, e **C.vmmw_error_t) C.int32_t {
		return C.vmmw_replicas_wake_by_reload(lp, pp, n, r, e)
	})
}

// WakeReplicasFromCheckpoint is the former name of WakeReplicasByReload.
//
// Deprecated: use WakeReplicasByReload; kept through 0.x.
func WakeReplicasFromCheckpoint(loaders []*Loader, pools []*Pool) (MultiResult, error) {
	return WakeReplicasByReload(loaders, pools)
}

func onDevices(what string, loaders []*Loader, pools []*Pool,
	f func(**C.vmmw_loader_t, **C.vmmw_pool_t, C.size_t, *C.vmmw_multi_result_t, **C.vmmw_error_t) C.int32_t) (MultiResult, error) {
	if len(loaders) != len(pools) {
		return MultiResult{}, errors.New("vmmw: " + what + " needs one pool per loader")
	}
	ls := make([]*C.vmmw_loader_t, len(loaders))
	ps := make([]*C.vmmw_pool_t, len(pools))
	for i := range loaders {
		if loaders[i] == nil || loaders[i].ptr == nil {
			return MultiResult{}, closedError("Loader")
		}
		cp, err := pools[i].live()
		if err != nil {
			return MultiResult{}, err
		}
		ls[i], ps[i] = loaders[i].ptr, cp
	}
	var r C.vmmw_multi_result_t
	var lp **C.vmmw_loader_t
	var pp **C.vmmw_pool_t
	if len(ls) > 0 {
		lp, pp = &ls[0], &ps[0]
	}
	err := call(func(e **C.vmmw_error_t) C.int32_t {
		return f(lp, pp, C.size_t(len(ls)), &r, e)
	})
	runtime.KeepAlive(loaders)
	runtime.KeepAlive(pools)
	if err != nil {
		return MultiResult{}, err
	}
	return MultiResult{uint64(r.host_bytes), uint64(r.peer_bytes), uint64(r.delivered_bytes),
		float64(r.seconds), float64(r.host_seconds), float64(r.peer_seconds), float64(r.gbps),
		uint32(r.recovered_devices)}, nil
}

// Replica is one member of a replica group: Tag in Pool (one pool per device).
type Replica struct {
	Pool *Pool
	Tag  Tag
}

// ReplicaSleepResult is what SleepReplicas did.
type ReplicaSleepResult struct {
	BackupBytes, ReleasedBytes uint64
	Seconds                    float64
}

// ReplicaWakeOptions says how WakeReplicas moves the bytes; the zero value
// is the default (parts exchanged over peer copies, 64 MiB copy pieces).
type ReplicaWakeOptions struct {
	// NoPeerCopies makes every device copy all of the backup from host memory.
	NoPeerCopies bool
	// CopyPieceBytes is one copy on one stream; 0 = 64 MiB.
	CopyPieceBytes uint64
}

// ReplicaWakeResult is what WakeReplicas did.
type ReplicaWakeResult struct {
	HostBytes, PeerBytes, DeliveredBytes                uint64
	Seconds, MapSeconds, HostSeconds, PeerSeconds, GBps float64
	DirectPairs                                         uint32
}

func replicaArgs(rs []Replica) ([]*C.vmmw_pool_t, []C.uint32_t, error) {
	ps := make([]*C.vmmw_pool_t, len(rs))
	ts := make([]C.uint32_t, len(rs))
	for i, r := range rs {
		if r.Pool == nil {
			return nil, nil, closedError("Pool")
		}
		cp, err := r.Pool.live()
		if err != nil {
			return nil, nil, err
		}
		ps[i], ts[i] = cp, C.uint32_t(r.Tag)
	}
	return ps, ts, nil
}

// ReplicaSleepOptions says how SleepReplicasWith keeps the one host backup;
// the zero value is the default (the holder offloaded raw).
type ReplicaSleepOptions struct {
	// HolderPolicy is Offload (raw bytes) or OffloadCompressed (codec
	// frames, decoded on every device at wake); any other is
	// ErrInvalidArgument and nothing sleeps.
	HolderPolicy Policy
}

// SleepReplicas puts replicas to sleep on one raw host backup taken from
// replicas[0]; the others release their memory without a copy
// (vmmw_replicas_sleep). The caller asserts they hold the same bytes.
func SleepReplicas(replicas ...Replica) (ReplicaSleepResult, error) {
	return SleepReplicasWith(ReplicaSleepOptions{}, replicas...)
}

// SleepReplicasWith puts replicas to sleep on one host backup taken from
// replicas[0] with o.HolderPolicy; the others release their memory without
// a copy (vmmw_replicas_sleep_with). The caller asserts they hold the same
// bytes.
func SleepReplicasWith(o ReplicaSleepOptions, replicas ...Replica) (ReplicaSleepResult, error) {
	ps, ts, err := replicaArgs(replicas)
	if err != nil {
		return ReplicaSleepResult{}, err
	}
	var pp **C.vmmw_pool_t
	var tp *C.uint32_t
	if len(ps) > 0 {
		pp, tp = &ps[0], &ts[0]
	}
	var c C.vmmw_replica_sleep_options_t
	c.size = C.size_t(unsafe.Sizeof(c))
	c.holder_policy = C.vmmw_policy_t(o.HolderPolicy)
	var r C.vmmw_replica_sleep_result_t
	err = call(func(e **C.vmmw_error_t) C.int32_t {
		return C.vmmw_replicas_sleep_with(pp, tp, C.size_t(len(ps)), &c, &r, e)
	})
	runtime.KeepAlive(replicas)
	if err != nil {
		return ReplicaSleepResult{}, err
	}
	return ReplicaSleepResult{uint64(r.backup_bytes), uint64(r.released_bytes), float64(r.seconds)}, nil
}

// WakeReplicas is the former name of WakeReplicasFromBackup.
//
// Deprecated: use WakeReplicasFromBackup; kept through 0.x.
func WakeReplicas(o ReplicaWakeOptions, replicas ...Replica) (ReplicaWakeResult, error) {
	return WakeReplicasFromBackup(o, replicas...)
}

// WakeReplicasFromBackup wakes replicas slept by SleepReplicas or
// SleepReplicasWith on every device from the one backup, host memory read
// once (vmmw_replicas_wake_from_backup); a compressed backup is decoded on
// every device, each a share of its frames. On an error every replica stays asleep
// with the backup intact; waking again can succeed.
func WakeReplicasFromBackup(o ReplicaWakeOptions, replicas ...Replica) (ReplicaWakeResult, error) {
	ps, ts, err := replicaArgs(replicas)
	if err != nil {
		return ReplicaWakeResult{}, err
	}
	var pp **C.vmmw_pool_t
	var tp *C.uint32_t
	if len(ps) > 0 {
		pp, tp = &ps[0], &ts[0]
	}
	var c C.vmmw_replica_wake_options_t
	c.size = C.size_t(unsafe.Sizeof(c))
	c.copy_piece_bytes = C.uint64_t(o.CopyPieceBytes)
	if o.NoPeerCopies {
		c.no_peer_copies = 1
	}
	var r C.vmmw_replica_wake_result_t
	err = call(func(e **C.vmmw_error_t) C.int32_t {
		return C.vmmw_replicas_wake_from_backup(pp, tp, C.size_t(len(ps)), &c, &r, e)
	})
	runtime.KeepAlive(replicas)
	if err != nil {
		return ReplicaWakeResult{}, err
	}
	return ReplicaWakeResult{uint64(r.host_bytes), uint64(r.peer_bytes), uint64(r.delivered_bytes),
		float64(r.seconds), float64(r.map_seconds), float64(r.host_seconds), float64(r.peer_seconds),
		float64(r.gbps), uint32(r.direct_pairs)}, nil
}
