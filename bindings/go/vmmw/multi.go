package vmmw

// #include <stdlib.h>
// #include "vmmweights.h"
import "C"

import (
	"errors"
	"runtime"
)

// AccessMode is what a peer device may do with a tag's memory.
type AccessMode int32

// Peer access modes (VMMW_ACCESS_*).
const (
	AccessNone      AccessMode = C.VMMW_ACCESS_NONE
	AccessRead      AccessMode = C.VMMW_ACCESS_READ
	AccessReadWrite AccessMode = C.VMMW_ACCESS_READWRITE
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
	MultiReplicas MultiMode = C.VMMW_MULTI_REPLICAS
	// MultiRanks loads each loader's own plan on its device (tensor-parallel ranks).
	MultiRanks MultiMode = C.VMMW_MULTI_RANKS
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
	if len(loaders) != len(pools) {
		return MultiResult{}, errors.New("vmmw: LoadDevices needs one pool per loader")
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
		return C.vmmw_loader_load_devices(lp, pp, C.size_t(len(ls)), C.int32_t(mode), &r, e)
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
