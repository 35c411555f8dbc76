//! The driver contract: each clause of the `Driver` trait (src/driver/mod.rs)
//! as a test, run on every backend (see `common::backend`): the host twin in
//! CI, the CUDA driver with `VMMW_BACKEND=cuda` on a GPU
//! (scripts/gpu.d/15-contract.sh). Every method is called with the arguments
//! its callers use (segments, the pool, the sleep engine, the loader's copy
//! engine, sharing), and every check reads the bytes back: an `Ok` alone
//! proves nothing.
//!
//! A new driver method gets its clause here, and a new driver struct its
//! builder in src/driver/cuda/structs.rs with a unit test there.

use crate::common;

use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use common::backend::{on_each_backend, skip, Backend};
use vmmweights::driver::convert::convert_on_cpu;
use vmmweights::driver::host::HostCounts;
use vmmweights::driver::{
    kernels, round_up, AccessMode, ConvertType, CreateFlags, PeerAccess, PhysHandle, StreamId,
};
use vmmweights::{DevicePtr, Driver, Error};

// ---------------------------------------------------------------- helpers

/// Device memory mapped with the raw trait calls: a reservation, one physical
/// handle per part (so copies cross mappings), read/write access granted per
/// mapping as segments grant it. Dropped in the order the callers tear
/// down: unmap, release, free the VA.
struct Mapped {
    d: Arc<dyn Driver>,
    va: DevicePtr,
    size: usize,
    parts: Vec<(DevicePtr, usize, PhysHandle)>,
}

impl Mapped {
    /// `parts` granules each: `[1, 2]` maps one granule then two.
    fn new(d: &Arc<dyn Driver>, parts: &[usize]) -> Mapped {
        let g = d.granularity();
        let size = parts.iter().sum::<usize>() * g;
        let va = d.reserve(size, 0).expect("reserve");
        let mut m = Mapped {
            d: d.clone(),
            va,
            size,
            parts: Vec::new(),
        };
        let mut at = va;
        for &n in parts {
            let h = d.create(n * g).expect("create");
            d.map(at, n * g, h).expect("map");
            d.set_access(at, n * g).expect("set_access");
            m.parts.push((at, n * g, h));
            at += (n * g) as u64;
        }
        m
    }

    /// Grant `peers` on every mapping, as `Segment::set_peers` does.
    fn grant(&self, peers: &[PeerAccess]) -> vmmweights::Result<()> {
        for &(at, len, _) in &self.parts {
            self.d.set_access_peers(at, len, peers)?;
        }
        Ok(())
    }

    fn at(&self, off: usize) -> DevicePtr {
        self.va + off as u64
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        let r: vmmweights::Result<()> = (|| {
            for &(at, len, h) in &self.parts {
                self.d.unmap(at, len)?;
                self.d.release(h)?;
            }
            self.d.free_va(self.va, self.size)
        })();
        if !std::thread::panicking() {
            r.expect("unmap, release, free_va");
        }
    }
}

/// Deterministic bytes that differ per seed and per position.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = vec![0u8; len.next_multiple_of(8)];
    // Whole words at a time: tests run unoptimized in CI.
    for w in v.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

fn write(d: &dyn Driver, dst: DevicePtr, bytes: &[u8]) {
    // SAFETY: callers pass a mapped, accessible range of bytes.len() bytes;
    // the synchronize below keeps `bytes` alive past the copy.
    unsafe { d.copy_htod_async(dst, bytes.as_ptr(), bytes.len(), StreamId::DEFAULT) }
        .expect("copy_htod_async");
    d.stream_synchronize(StreamId::DEFAULT).expect("sync");
}

fn read(d: &dyn Driver, src: DevicePtr, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // SAFETY: callers pass a mapped, accessible range of `len` bytes; `out`
    // outlives the synchronize below.
    unsafe { d.copy_dtoh_async(out.as_mut_ptr(), src, len, StreamId::DEFAULT) }
        .expect("copy_dtoh_async");
    d.stream_synchronize(StreamId::DEFAULT).expect("sync");
    out
}

fn fill(d: &dyn Driver, dst: DevicePtr, value: u8, len: usize) {
    // SAFETY: callers pass a mapped, accessible range of `len` bytes.
    unsafe { d.memset_async(dst, value, len, StreamId::DEFAULT) }.expect("memset_async");
    d.stream_synchronize(StreamId::DEFAULT).expect("sync");
}

fn assert_same(what: &str, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if got == want {
        return; // a memcmp; the byte-wise search below runs only on a mismatch
    }
    let i = got.iter().zip(want).position(|(x, y)| x != y).unwrap();
    panic!(
        "{what}: byte {i} of {} reads {:#04x}, expected {:#04x}",
        got.len(),
        got[i],
        want[i]
    );
}

/// Every object the test made is gone (host backend; CUDA has no counters).
fn assert_no_leaks(b: &Backend, what: &str) {
    if let Some(h) = b.host() {
        assert_eq!(h.counts(), HostCounts::default(), "{what}: objects leaked");
    }
}

/// Page-locked host memory from the driver's own allocator, freed on drop.
struct HostAlloc {
    d: Arc<dyn Driver>,
    ptr: *mut u8,
    len: usize,
}

impl HostAlloc {
    fn new(d: &Arc<dyn Driver>, len: usize) -> HostAlloc {
        let ptr = d.host_alloc(len).expect("host_alloc");
        assert!(!ptr.is_null(), "host_alloc returned NULL");
        HostAlloc {
            d: d.clone(),
            ptr,
            len,
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `host_alloc` gave `len` writable bytes, ours until drop.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for HostAlloc {
    fn drop(&mut self) {
        // SAFETY: allocated by `host_alloc` with this length; every copy using it
        // was synchronized by the test.
        let r = unsafe { self.d.host_free(self.ptr, self.len) };
        if !std::thread::panicking() {
            r.expect("host_free");
        }
    }
}

/// A read-only shared mapping of a file holding `bytes`, as the loader maps
/// checkpoint shards.
fn file_mapping(bytes: &[u8]) -> (tempfile::NamedTempFile, memmap2::Mmap) {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(bytes).unwrap();
    f.flush().unwrap();
    // SAFETY: the temporary file is ours and nobody truncates it while mapped.
    let map = unsafe { memmap2::Mmap::map(f.as_file()) }.unwrap();
    (f, map)
}

/// `len` rounded up to whole pages: what the loader registers of a mapping
/// whose file ends inside its last page.
fn page_rounded(len: usize) -> usize {
    round_up(len, vmmweights::units::page_size())
}

// ---------------------------------------------------------------- identity, sizes

#[test]
fn identity_and_granularity() {
    on_each_backend("identity_and_granularity", |b| {
        let d = &b.driver;
        assert_eq!(d.device(), 0);
        assert!(
            d.describe().contains(&d.kind().to_string()),
            "describe names the backend: {}",
            d.describe()
        );
        let g = d.granularity();
        assert!(
            g.is_power_of_two() && g >= 4096,
            "granularity {g}: a power of two of at least a page"
        );
        assert_eq!(d.granularity_for(0).unwrap(), g, "own device");
        if let Ok(peer) = b.device(1) {
            let gp = d.granularity_for(peer.device()).unwrap();
            assert!(
                gp >= g && gp % g == 0,
                "granularity for a peer ({gp}) is a multiple of ours ({g})"
            );
        }
    });
}

#[test]
fn mem_info_counts_created_memory() {
    on_each_backend("mem_info_counts_created_memory", |b| {
        let d = &b.driver;
        let size = 16 * d.granularity();
        let before = d.mem_info().unwrap();
        assert!(
            before.total > 0 && before.free <= before.total,
            "{before:?}"
        );
        let h = d.create(size).unwrap();
        let during = d.mem_info().unwrap();
        let taken = before.free.saturating_sub(during.free);
        // CUDA: other processes may move the free count a little meanwhile.
        let slack = if b.is_cuda() { size as u64 / 8 } else { 0 };
        assert!(
            taken + slack >= size as u64,
            "create({size}) took {taken} bytes of free memory ({before:?} -> {during:?})"
        );
        d.release(h).unwrap();
        let after = d.mem_info().unwrap();
        assert!(
            after.free + slack >= before.free,
            "release gives the memory back ({before:?} -> {after:?})"
        );
        assert_no_leaks(b, "mem_info");
    });
}

#[test]
fn create_with_rdma_follows_the_reported_support() {
    on_each_backend("create_with_rdma_follows_the_reported_support", |b| {
        let d = &b.driver;
        let g = d.granularity();
        let flags = CreateFlags { rdma: true };
        if d.rdma_supported().unwrap() {
            // RDMA-capable memory maps and holds bytes as any other.
            let va = d.reserve(2 * g, 0).unwrap();
            let h = d.create_with(2 * g, flags).unwrap();
            d.map(va, 2 * g, h).unwrap();
            d.set_access(va, 2 * g).unwrap();
            let p = pattern(2 * g, 41);
            write(d.as_ref(), va, &p);
            assert_same("rdma-capable memory", &read(d.as_ref(), va, 2 * g), &p);
            d.unmap(va, 2 * g).unwrap();
            d.release(h).unwrap();
            d.free_va(va, 2 * g).unwrap();
        } else {
            let e = d.create_with(2 * g, flags).unwrap_err();
            assert!(matches!(e, Error::Unsupported(_)), "{e}");
            assert!(e.to_string().contains("RDMA"), "{e}");
            skip(
                "create_with_rdma_follows_the_reported_support",
                "the device reports no GPUDirect RDMA for VMM memory: only the refusal was checked",
            );
        }
        assert_no_leaks(b, "create_with rdma");
    });
}

// ---------------------------------------------------------------- reserve, map, access

#[test]
fn reserve_honours_alignment_and_is_inaccessible() {
    on_each_backend("reserve_honours_alignment_and_is_inaccessible", |b| {
        let d = &b.driver;
        let g = d.granularity();
        for align in [0, g, 4 * g, 16 * g] {
            let size = 3 * g;
            let a = d.reserve(size, align).unwrap();
            let c = d.reserve(size, align).unwrap();
            let want = align.max(g) as u64;
            assert!(
                a % want == 0 && c % want == 0,
                "reserve({size}, {align}): {a:#x}, {c:#x} not aligned to {want}"
            );
            assert!(
                a + size as u64 <= c || c + size as u64 <= a,
                "two live reservations overlap: {a:#x}, {c:#x}"
            );
            assert!(
                !d.peer_readable(a, g, d.device()).unwrap(),
                "reserved, unmapped memory is not readable"
            );
            d.free_va(a, size).unwrap();
            d.free_va(c, size).unwrap();
        }
        assert_no_leaks(b, "reserve");
    });
}

#[test]
fn mapped_memory_keeps_bytes_across_unmap_and_remap_of_a_neighbour() {
    on_each_backend(
        "mapped_memory_keeps_bytes_across_unmap_and_remap_of_a_neighbour",
        |b| {
            let d = &b.driver;
            let g = d.granularity();
            let va = d.reserve(3 * g, 0).unwrap();
            let h1 = d.create(g).unwrap();
            let h2 = d.create(2 * g).unwrap();
            d.map(va, g, h1).unwrap();
            d.map(va + g as u64, 2 * g, h2).unwrap();
            assert!(
                !d.peer_readable(va, 3 * g, d.device()).unwrap(),
                "mapped without access is not readable"
            );
            // Access per mapping, as a segment grants each chunk.
            d.set_access(va, g).unwrap();
            d.set_access(va + g as u64, 2 * g).unwrap();
            assert!(d.peer_readable(va, 3 * g, d.device()).unwrap());
            let first = pattern(3 * g, 1);
            write(d.as_ref(), va, &first);
            assert_same("written", &read(d.as_ref(), va, 3 * g), &first);

            // Unmap the second mapping: the VA stays reserved, the first keeps its bytes.
            d.unmap(va + g as u64, 2 * g).unwrap();
            assert!(!d.peer_readable(va + g as u64, 2 * g, d.device()).unwrap());
            assert_same(
                "first mapping after its neighbour's unmap",
                &read(d.as_ref(), va, g),
                &first[..g],
            );
            // Remap fresh memory at the same address.
            let h3 = d.create(2 * g).unwrap();
            d.map(va + g as u64, 2 * g, h3).unwrap();
            d.set_access(va + g as u64, 2 * g).unwrap();
            let second = pattern(2 * g, 2);
            write(d.as_ref(), va + g as u64, &second);
            let mut want = first[..g].to_vec();
            want.extend_from_slice(&second);
            assert_same("after the remap", &read(d.as_ref(), va, 3 * g), &want);

            // Released while mapped: the memory lives until it is unmapped.
            d.release(h1).unwrap();
            assert_same(
                "released while mapped",
                &read(d.as_ref(), va, g),
                &first[..g],
            );
            d.unmap(va, g).unwrap();
            d.unmap(va + g as u64, 2 * g).unwrap();
            d.release(h2).unwrap();
            d.release(h3).unwrap();
            d.free_va(va, 3 * g).unwrap();
            assert_no_leaks(b, "map");
        },
    );
}

#[test]
fn read_only_access_keeps_bytes_readable() {
    on_each_backend("read_only_access_keeps_bytes_readable", |b| {
        let d = &b.driver;
        let size = 2 * d.granularity();
        // The owner's read/write mapping.
        let m = Mapped::new(d, &[2]);
        let h = m.parts[0].2;
        let bytes = pattern(size, 3);
        write(d.as_ref(), m.va, &bytes);
        // A second mapping of the same memory, read-only, as an importer maps
        // shared weights.
        let ro = d.reserve(size, 0).unwrap();
        d.map(ro, size, h).unwrap();
        d.set_access_read_only(ro, size).unwrap();
        assert!(d.peer_readable(ro, size, d.device()).unwrap());
        assert_same("read-only view", &read(d.as_ref(), ro, size), &bytes);
        // Writes through the owner's mapping show through the read-only one.
        let newer = pattern(size, 4);
        write(d.as_ref(), m.va, &newer);
        assert_same(
            "read-only view after a write",
            &read(d.as_ref(), ro, size),
            &newer,
        );
        d.unmap(ro, size).unwrap();
        d.free_va(ro, size).unwrap();
        drop(m);
        assert_no_leaks(b, "read-only");
    });
}

/// The second device of the backend, or `None` after a skip line.
fn peer_device(b: &Backend, test: &str) -> Option<Arc<dyn Driver>> {
    let p = match b.device(1) {
        Ok(p) => p,
        Err(why) if b.is_cuda() => {
            skip(test, &format!("needs two CUDA devices: {why}"));
            return None;
        }
        Err(why) => panic!("the host backend simulates a second device: {why}"),
    };
    for (x, y) in [(&b.driver, &p), (&p, &b.driver)] {
        if !x.can_access_peer(y.device()).unwrap() {
            assert!(b.is_cuda(), "simulated devices reach each other");
            skip(
                test,
                &format!(
                    "device {} cannot access device {} (no peer path)",
                    x.device(),
                    y.device()
                ),
            );
            return None;
        }
    }
    Some(p)
}

#[test]
fn peer_access_is_granted_checked_and_revoked() {
    let test = "peer_access_is_granted_checked_and_revoked";
    on_each_backend(test, |b| {
        let d = &b.driver;
        assert!(
            !d.can_access_peer(d.device()).unwrap(),
            "a device is not its own peer"
        );
        assert!(
            d.can_access_peer(4096).is_err(),
            "a device that does not exist is an error"
        );
        let Some(p) = peer_device(b, test) else {
            return;
        };
        let (me, peer) = (d.device(), p.device());
        let g = d.granularity_for(peer).unwrap();
        let pages = g / d.granularity();
        let m = Mapped::new(d, &[pages, pages]);
        let size = 2 * g;
        let bytes = pattern(size, 4);
        write(d.as_ref(), m.va, &bytes);
        assert!(
            !d.peer_readable(m.va, size, peer).unwrap(),
            "not granted yet"
        );

        let read_only = [PeerAccess {
            device: peer,
            mode: AccessMode::Read,
        }];
        m.grant(&read_only).unwrap();
        assert!(d.peer_readable(m.va, size, peer).unwrap(), "granted");
        assert!(
            d.peer_readable(m.va, size, me).unwrap(),
            "owner keeps access"
        );

        // Bad lists are refused and change nothing.
        let own = [PeerAccess {
            device: me,
            mode: AccessMode::Read,
        }];
        let twice = [read_only[0], read_only[0]];
        let missing = [PeerAccess {
            device: 4096,
            mode: AccessMode::Read,
        }];
        for (what, list) in [
            ("the owner", &own[..]),
            ("one device twice", &twice[..]),
            ("a device that does not exist", &missing[..]),
        ] {
            let e = m.grant(list).unwrap_err();
            assert!(
                matches!(e, Error::InvalidArgument(_)),
                "a list naming {what}: {e}"
            );
            assert!(d.peer_readable(m.va, size, peer).unwrap(), "{what}: kept");
        }

        m.grant(&[PeerAccess {
            device: peer,
            mode: AccessMode::ReadWrite,
        }])
        .unwrap();
        assert!(d.peer_readable(m.va, size, peer).unwrap());
        m.grant(&[PeerAccess {
            device: peer,
            mode: AccessMode::None,
        }])
        .unwrap();
        assert!(!d.peer_readable(m.va, size, peer).unwrap(), "revoked");
        assert!(
            d.peer_readable(m.va, size, me).unwrap(),
            "owner keeps access"
        );
        assert_same(
            "owner's bytes after the grants",
            &read(d.as_ref(), m.va, size),
            &bytes,
        );
        drop(m);
        assert_no_leaks(b, "peer access");
    });
}

// ---------------------------------------------------------------- streams, events

#[test]
fn streams_and_events_order_work() {
    on_each_backend("streams_and_events_order_work", |b| {
        let d = &b.driver;
        let len = if b.is_cuda() { 32 << 20 } else { 4 << 20 };
        let parts = round_up(len, d.granularity()) / d.granularity();
        let m = Mapped::new(d, &[parts]);
        let mut host = HostAlloc::new(d, len);
        let s = d.stream_create().unwrap();
        let s2 = d.stream_create().unwrap();
        assert!(s != StreamId::DEFAULT && s2 != StreamId::DEFAULT && s != s2);
        let e = d.event_create().unwrap();
        let e2 = d.event_create().unwrap();
        assert!(
            d.event_query(e).unwrap(),
            "an event never recorded has completed"
        );

        // Work on one stream, an event after it: once the event completes, so has the work.
        // SAFETY (this block and the ones below): `m` is mapped for `len`
        // bytes; `host` holds `len` bytes and outlives every synchronize below.
        unsafe {
            d.memset_async(m.va, 0x5A, len, s).unwrap();
            d.copy_dtoh_async(host.ptr, m.va, len, s).unwrap();
        }
        d.event_record(e, s).unwrap();
        d.event_synchronize(e).unwrap();
        assert!(
            d.event_query(e).unwrap(),
            "synchronized event has completed"
        );
        assert!(
            host.bytes().iter().all(|&x| x == 0x5A),
            "event_synchronize waits for the stream's work"
        );

        // stream_synchronize on a second stream; an event recorded again.
        // SAFETY: as above.
        unsafe {
            d.memset_async(m.va, 0x11, len, s2).unwrap();
            d.copy_dtoh_async(host.ptr, m.va, len, s2).unwrap();
        }
        d.event_record(e2, s2).unwrap();
        d.stream_synchronize(s2).unwrap();
        assert!(
            d.event_query(e2).unwrap(),
            "event before a synchronized point"
        );
        assert!(
            host.bytes().iter().all(|&x| x == 0x11),
            "stream_synchronize"
        );
        d.event_record(e, s2).unwrap();
        d.event_synchronize(e).unwrap();

        // synchronize waits for every stream.
        // SAFETY: as above.
        unsafe {
            d.memset_async(m.va, 0x22, len / 2, s).unwrap();
            d.memset_async(m.va + (len / 2) as u64, 0x33, len - len / 2, s2)
                .unwrap();
        }
        d.synchronize().unwrap();
        // SAFETY: as above.
        unsafe { d.copy_dtoh_async(host.ptr, m.va, len, StreamId::DEFAULT) }.unwrap();
        d.stream_synchronize(StreamId::DEFAULT).unwrap();
        let half = len / 2;
        assert!(host.bytes()[..half].iter().all(|&x| x == 0x22));
        assert!(host.bytes()[half..].iter().all(|&x| x == 0x33));

        // A stream waits on the device for an event of another: the second
        // stream's copy sees the first stream's memset, queued behind a
        // whole copy to the host, though only the second is synchronized.
        let mut slow = HostAlloc::new(d, len);
        // SAFETY: as above; `slow` holds `len` bytes and outlives the
        // synchronize at the end of this block.
        unsafe {
            d.copy_dtoh_async(slow.ptr, m.va, len, s).unwrap();
            d.memset_async(m.va, 0x44, len, s).unwrap();
        }
        d.event_record(e, s).unwrap();
        d.stream_wait_event(s2, e).unwrap();
        // SAFETY: as above.
        unsafe { d.copy_dtoh_async(host.ptr, m.va, len, s2) }.unwrap();
        d.stream_synchronize(s2).unwrap();
        assert!(
            host.bytes().iter().all(|&x| x == 0x44),
            "stream_wait_event orders a second stream after the event"
        );
        d.synchronize().unwrap();
        assert!(slow.bytes()[..half].iter().all(|&x| x == 0x22));
        drop(slow);
        // An event never recorded does not hold a stream back.
        let fresh = d.event_create().unwrap();
        d.stream_wait_event(s2, fresh).unwrap();
        d.stream_synchronize(s2).unwrap();
        d.event_destroy(fresh).unwrap();

        assert!(
            matches!(
                d.stream_destroy(StreamId::DEFAULT),
                Err(Error::InvalidArgument(_))
            ),
            "the default stream cannot be destroyed"
        );
        for ev in [e, e2] {
            d.event_destroy(ev).unwrap();
        }
        for st in [s, s2] {
            d.stream_destroy(st).unwrap();
        }
        drop(host);
        drop(m);
        assert_no_leaks(b, "streams and events");
    });
}

// ---------------------------------------------------------------- copies

#[test]
fn copies_to_and_from_the_device_move_exact_bytes() {
    on_each_backend("copies_to_and_from_the_device_move_exact_bytes", |b| {
        let d = &b.driver;
        let g = d.granularity();
        // Two mappings: copies cross from one to the other.
        let m = Mapped::new(d, &[1, 2]);
        let total = 3 * g;
        let cases = [
            (0, 1),
            (1, 7),
            (4095, 4097),
            (g - 5, 10),
            (g + 3, 2 * g - 3),
            (0, total),
        ];
        let mut pinned_src = HostAlloc::new(d, total + 1);
        let mut pinned_dst = HostAlloc::new(d, total + 1);
        let s = d.stream_create().unwrap();
        for (k, &(off, len)) in cases.iter().enumerate() {
            let bytes = pattern(len + 1, 10 + k as u64);
            pinned_src.bytes()[..len + 1].copy_from_slice(&bytes);
            let sources: [(&str, *const u8); 2] = [
                // Offset by one byte: the host side need not be aligned.
                ("pageable", bytes[1..].as_ptr()),
                ("pinned", pinned_src.ptr.wrapping_add(1)),
            ];
            for (src_kind, src) in sources {
                let what = format!("{}: {len} bytes at +{off} from {src_kind}", b.kind());
                fill(d.as_ref(), m.va, 0xEE, total);
                // SAFETY: the source holds `len` bytes past it and lives past
                // the synchronize; the range is inside `m`.
                unsafe { d.copy_htod_async(m.at(off), src, len, s) }.expect(&what);
                d.stream_synchronize(s).unwrap();
                let mut want = vec![0xEE; total];
                want[off..off + len].copy_from_slice(&bytes[1..]);
                assert_same(&what, &read(d.as_ref(), m.va, total), &want);

                // Back into pageable and pinned memory, at an odd host offset.
                let mut page = vec![0u8; len + 1];
                pinned_dst.bytes().fill(0);
                // SAFETY: both destinations hold `len` bytes past the offset and
                // outlive the synchronize.
                unsafe {
                    d.copy_dtoh_async(page.as_mut_ptr().add(1), m.at(off), len, s)
                        .unwrap();
                    d.copy_dtoh_async(pinned_dst.ptr.add(1), m.at(off), len, s)
                        .unwrap();
                }
                d.stream_synchronize(s).unwrap();
                assert_same(
                    &format!("{what}, read to pageable"),
                    &page[1..],
                    &bytes[1..],
                );
                assert_same(
                    &format!("{what}, read to pinned"),
                    &pinned_dst.bytes()[1..len + 1],
                    &bytes[1..],
                );
            }
        }
        d.stream_destroy(s).unwrap();
        drop((pinned_src, pinned_dst, m));
        assert_no_leaks(b, "1D copies");
    });
}

/// One 2D copy: `height` rows of `width` bytes, rows `src_pitch` apart in
/// host memory starting `src_off` bytes in, `dst_pitch` apart on the device.
#[derive(Debug, Clone, Copy)]
struct Copy2d {
    what: &'static str,
    width: usize,
    height: usize,
    src_pitch: usize,
    src_off: usize,
    dst_pitch: usize,
}

/// A row-parallel weight of `rows` x `cols` bf16 cut into `world` column
/// slices: rank `rank` takes its columns (what the TP loader copies for
/// o_proj and down_proj).
fn column_slice(what: &'static str, rows: usize, cols: usize, world: usize, rank: usize) -> Copy2d {
    let per = cols / world * 2;
    Copy2d {
        what,
        width: per,
        height: rows,
        src_pitch: cols * 2,
        src_off: rank * per,
        dst_pitch: per,
    }
}

fn copy_2d_cases() -> Vec<Copy2d> {
    let c = |what, width, height, src_pitch, src_off, dst_pitch| Copy2d {
        what,
        width,
        height,
        src_pitch,
        src_off,
        dst_pitch,
    };
    vec![
        c("contiguous rows", 256, 64, 256, 0, 256),
        c("one row", 4097, 1, 4097, 0, 4097),
        c("wider destination rows", 100, 33, 100, 0, 384),
        c("odd pitches both sides", 3, 1000, 7, 1, 5),
        c("unaligned host rows", 1000, 17, 1003, 5, 1000),
        c("rows across mappings", 65536, 40, 65536, 0, 65536),
        column_slice("o_proj 4096 cols, rank 1 of 2", 96, 4096, 2, 1),
        column_slice("o_proj 4096 cols, rank 3 of 4", 96, 4096, 4, 3),
        column_slice("o_proj 4096 cols, rank 7 of 8", 96, 4096, 8, 7),
        column_slice("down_proj 11008 cols, rank 5 of 8", 64, 11008, 8, 5),
        column_slice("down_proj 1376 cols, rank 0 of 4", 512, 1376, 4, 0),
    ]
}

/// Run one 2D copy from `src` (holding the case's source bytes) into fresh
/// device memory prefilled with 0xEE, and compare every byte, gaps included.
fn check_copy_2d(b: &Backend, c: &Copy2d, src: *const u8, source: &[u8], from: &str) {
    let d = &b.driver;
    let g = d.granularity();
    let dst_len = (c.height - 1) * c.dst_pitch + c.width;
    let granules = round_up(dst_len, g) / g;
    // Two mappings when there is room: rows cross from one into the other.
    let m = if granules > 1 {
        Mapped::new(d, &[1, granules - 1])
    } else {
        Mapped::new(d, &[1])
    };
    fill(d.as_ref(), m.va, 0xEE, dst_len);
    let s = d.stream_create().unwrap();
    let what = format!("{}: {} ({c:?}) from {from}", b.kind(), c.what);
    // SAFETY: `src` holds the case's rows and outlives the synchronize; the
    // destination rows lie inside `m`.
    unsafe {
        d.copy_2d_htod_async(
            m.va,
            c.dst_pitch,
            src.wrapping_add(c.src_off),
            c.src_pitch,
            c.width,
            c.height,
            s,
        )
    }
    .expect(&what);
    d.stream_synchronize(s).unwrap();
    d.stream_destroy(s).unwrap();
    let mut want = vec![0xEE; dst_len];
    for r in 0..c.height {
        let from = c.src_off + r * c.src_pitch;
        want[r * c.dst_pitch..r * c.dst_pitch + c.width]
            .copy_from_slice(&source[from..from + c.width]);
    }
    assert_same(&what, &read(d.as_ref(), m.va, dst_len), &want);
}

fn source_len(c: &Copy2d) -> usize {
    c.src_off + (c.height - 1) * c.src_pitch + c.width
}

#[test]
fn copy_2d_places_each_row_at_its_pitch() {
    on_each_backend("copy_2d_places_each_row_at_its_pitch", |b| {
        for (k, c) in copy_2d_cases().iter().enumerate() {
            let bytes = pattern(source_len(c), 100 + k as u64);
            check_copy_2d(b, c, bytes.as_ptr(), &bytes, "pageable memory");
        }
        assert_no_leaks(b, "2D copies");
    });
}

#[test]
fn copy_2d_from_pinned_and_registered_memory() {
    on_each_backend("copy_2d_from_pinned_and_registered_memory", |b| {
        let d = &b.driver;
        for (k, c) in copy_2d_cases().iter().enumerate() {
            let bytes = pattern(source_len(c), 200 + k as u64);
            // The staged path: a pinned slot.
            let mut pinned = HostAlloc::new(d, bytes.len());
            pinned.bytes().copy_from_slice(&bytes);
            check_copy_2d(b, c, pinned.ptr, &bytes, "driver-pinned memory");
            drop(pinned);
            // The direct path: a checkpoint's read-only mapping, registered read-only.
            let (_file, map) = file_mapping(&bytes);
            let base = map.as_ptr() as *mut u8;
            // SAFETY: the mapping is live (its last page whole) until after the
            // unregister below.
            unsafe { d.host_register(base, page_rounded(map.len()), true) }
                .expect("host_register read-only");
            check_copy_2d(b, c, base, &bytes, "a registered file mapping");
            // SAFETY: registered above; the copy was synchronized.
            unsafe { d.host_unregister(base) }.expect("host_unregister");
        }
        assert_no_leaks(b, "2D copies from pinned memory");
    });
}

#[test]
fn peer_copies_pull_exact_bytes() {
    let test = "peer_copies_pull_exact_bytes";
    on_each_backend(test, |b| {
        let Some(p) = peer_device(b, test) else {
            return;
        };
        let d = &b.driver;
        let g = d.granularity_for(p.device()).unwrap();
        let pages = |dr: &Arc<dyn Driver>| g / dr.granularity();
        // Memory on both devices, each readable by the other, in two mappings.
        let on_d = Mapped::new(d, &[pages(d), pages(d)]);
        let on_p = Mapped::new(&p, &[pages(&p), pages(&p)]);
        for (m, other) in [(&on_d, &p), (&on_p, d)] {
            m.grant(&[PeerAccess {
                device: other.device(),
                mode: AccessMode::Read,
            }])
            .unwrap();
        }
        let total = 2 * g;
        let cases = [(0, total), (1, 4095), (g - 3, 7), (g + 1, g - 1)];
        for (k, &(off, len)) in cases.iter().enumerate() {
            // Both directions: each device pulls from the other.
            for (puller, dst, src, src_dev) in [
                (&p, &on_p, &on_d, d.device()),
                (d, &on_d, &on_p, p.device()),
            ] {
                let what = format!(
                    "{}: device {} pulls {len} bytes at +{off} from device {src_dev}",
                    b.kind(),
                    puller.device()
                );
                let bytes = pattern(total, 300 + k as u64);
                let owner = if src_dev == d.device() { d } else { &p };
                write(owner.as_ref(), src.va, &bytes);
                fill(puller.as_ref(), dst.va, 0xEE, total);
                let s = puller.stream_create().unwrap();
                // SAFETY: both ranges are mapped, the source readable by the puller.
                unsafe { puller.copy_peer_async(dst.at(off), src.at(off), src_dev, len, s) }
                    .expect(&what);
                puller.stream_synchronize(s).unwrap();
                puller.stream_destroy(s).unwrap();
                let mut want = vec![0xEE; total];
                want[off..off + len].copy_from_slice(&bytes[off..off + len]);
                assert_same(&what, &read(puller.as_ref(), dst.va, total), &want);
            }
        }
        drop((on_d, on_p));
        assert_no_leaks(b, "peer copies");
    });
}

#[test]
fn memset_fills_only_its_range() {
    on_each_backend("memset_fills_only_its_range", |b| {
        let d = &b.driver;
        let g = d.granularity();
        let m = Mapped::new(d, &[1, 1]);
        let total = 2 * g;
        let mut model = pattern(total, 5);
        write(d.as_ref(), m.va, &model);
        let s = d.stream_create().unwrap();
        for (off, len, value) in [
            (1, 1, 0xFF),
            (g - 1, 2, 0x7F),
            (4096, 12345, 0x80),
            (g + 7, g - 7, 0x01),
            (0, total, 0x00),
            (3, 5, 0xC3),
        ] {
            // SAFETY: inside `m`.
            unsafe { d.memset_async(m.at(off), value, len, s) }.unwrap();
            d.stream_synchronize(s).unwrap();
            model[off..off + len].fill(value);
            assert_same(
                &format!("{}: memset {len} bytes at +{off} to {value:#x}", b.kind()),
                &read(d.as_ref(), m.va, total),
                &model,
            );
        }
        d.stream_destroy(s).unwrap();
        drop(m);
        assert_no_leaks(b, "memset");
    });
}

#[test]
fn copies_within_the_device_move_exact_rows() {
    // Updates copy a trainer's tensors into destinations on the same device:
    // one row (plain), or rows at two pitches (a tensor-parallel column
    // slice), across two mappings; nothing outside the rows changes.
    on_each_backend("copies_within_the_device_move_exact_rows", |b| {
        let d = &b.driver;
        let g = d.granularity();
        let src = Mapped::new(d, &[1, 1]);
        let dst = Mapped::new(d, &[1, 1]);
        let total = 2 * g;
        let bytes = pattern(total, 21);
        write(d.as_ref(), src.va, &bytes);
        let s = d.stream_create().unwrap();
        // (dst offset, dst pitch, src offset, src pitch, width, height)
        for (doff, dp, soff, sp, w, h) in [
            (0, total, 0, total, total, 1),
            (3, 100, 5, 100, 77, 1),
            (g - 10, 64, g - 20, 64, 64, 1), // across the mappings
            (1, 48, 17, 256, 48, 40),        // a column slice into a packed block
            (128, 512, 0, 96, 96, 300),      // rows spread out
            (g - 4096, 4096, 7, 8192, 2048, 3),
        ] {
            fill(d.as_ref(), dst.va, 0xEE, total);
            // SAFETY: every row lies inside `src` and `dst`, which do not overlap.
            unsafe { d.copy_2d_dtod_async(dst.at(doff), dp, src.at(soff), sp, w, h, s) }.unwrap();
            d.stream_synchronize(s).unwrap();
            let mut want = vec![0xEE; total];
            for r in 0..h {
                want[doff + r * dp..doff + r * dp + w]
                    .copy_from_slice(&bytes[soff + r * sp..soff + r * sp + w]);
            }
            assert_same(
                &format!("{}: {h} rows of {w} (pitches {dp}/{sp})", b.kind()),
                &read(d.as_ref(), dst.va, total),
                &want,
            );
        }
        if let Some(h) = b.host() {
            // The twin refuses what a GPU would fault on, and fails as armed.
            // SAFETY: the ranges are checked by the host twin and refused.
            let e = unsafe { d.copy_2d_dtod_async(dst.at(total - 8), 16, src.va, 16, 16, 1, s) };
            assert!(e.is_err(), "a copy past the mapping is refused");
            h.fail_nth(vmmweights::driver::fault::FaultOp::CopyDtod, 1);
            fill(d.as_ref(), dst.va, 0x11, total);
            // SAFETY: inside both mappings.
            let e = unsafe { d.copy_2d_dtod_async(dst.va, 64, src.va, 64, 64, 1, s) };
            assert!(e.is_err(), "the armed failure fires");
            assert!(
                read(d.as_ref(), dst.va, 64).iter().all(|&x| x == 0x11),
                "before any byte"
            );
        }
        d.stream_destroy(s).unwrap();
        drop((src, dst));
        assert_no_leaks(b, "copies within the device");
    });
}

#[test]
fn hash_ranges_equals_the_reference() {
    // Reload trusts these hashes to tell loaded bytes from written ones: on
    // cuda they come from the PTX kernel, here they must equal the host
    // reference bit for bit, at every alignment and length, across mappings
    // and over more than one tile.
    use vmmweights::driver::hash;
    on_each_backend("hash_ranges_equals_the_reference", |b| {
        let d = &b.driver;
        let g = d.granularity();
        let parts = (2 * hash::TILE_BYTES + 3 * g).div_ceil(g).div_ceil(2);
        let m = Mapped::new(d, &[parts, parts]);
        let total = 2 * parts * g;
        let bytes = pattern(total, 11);
        write(d.as_ref(), m.va, &bytes);
        let mut ranges = vec![(0usize, total), (0, 0), (1, 7), (3, total - 3), (8, 9)];
        ranges.push((g - 5, 10)); // across the two mappings
        ranges.push((5, hash::TILE_BYTES + 11)); // unaligned, over a tile edge
        for len in [1usize, 8, 15, 16, 17, 4095, 4096, 65_537, hash::TILE_BYTES] {
            ranges.push((total - len, len));
        }
        let dev: Vec<(DevicePtr, usize)> = ranges.iter().map(|&(o, l)| (m.at(o), l)).collect();
        // SAFETY: every range lies in `m`, mapped and readable; the write above is synchronous.
        let got = unsafe { d.hash_ranges(&dev) }.unwrap();
        assert_eq!(got.len(), ranges.len());
        for (&(o, l), h) in ranges.iter().zip(got) {
            assert_eq!(
                h,
                hash::hash(&bytes[o..o + l]),
                "{}: {l} bytes at +{o}",
                b.kind()
            );
        }
        // SAFETY: no ranges at all.
        assert!(unsafe { d.hash_ranges(&[]) }.unwrap().is_empty());
        // One byte changed anywhere changes its range's hash.
        let at = total / 2 + 3;
        fill(d.as_ref(), m.at(at), bytes[at] ^ 0x40, 1);
        // SAFETY: as above.
        let changed = unsafe { d.hash_ranges(&[(m.va, total)]) }.unwrap();
        assert_ne!(
            changed[0],
            hash::hash(&bytes),
            "{}: a changed byte",
            b.kind()
        );
        drop(m);
        assert_no_leaks(b, "hash_ranges");
    });
}

#[test]
fn codec_frames_equal_the_reference() {
    // Sleep's compressed backups are encoded and decoded on the device: the
    // frame must be the reference codec's byte for byte (on cuda it comes
    // from kernels/codec.cu), decode must give the raw bytes back, and a
    // corrupt frame must be refused without a write outside the output.
    use crate::codec::{normal_bf16, normal_f32};
    use vmmweights::codec::{self, format, Layout};
    let test = "codec_frames_equal_the_reference";
    on_each_backend(test, |b| {
        let d = &b.driver;
        let mut inputs: Vec<(&str, Vec<u8>, Layout, usize)> = vec![
            (
                "bf16 normal",
                normal_bf16(100_003, 0.02, 31),
                Layout::Half,
                0,
            ),
            (
                "bf16 normal, unaligned",
                normal_bf16(70_000, 0.02, 32),
                Layout::Half,
                3,
            ),
            (
                "fp32 normal",
                normal_f32(40_001, 0.02, 33),
                Layout::Single,
                0,
            ),
            (
                "random bytes",
                pattern(3 * format::BLOCK_BYTES + 11, 34),
                Layout::Bytes,
                0,
            ),
            (
                "random as bf16",
                pattern(format::BLOCK_BYTES + 1, 35),
                Layout::Half,
                5,
            ),
            ("zeros", vec![0; 4096], Layout::Half, 0),
            ("one byte", vec![0x42], Layout::Single, 0),
            ("empty", vec![], Layout::Half, 0),
        ];
        inputs.push((
            "every 16-bit value",
            (0..=0xFFFFu16).flat_map(|v| v.to_le_bytes()).collect(),
            Layout::Half,
            0,
        ));
        let most = inputs.iter().map(|i| i.1.len() + 8).max().unwrap();
        let frame_room = format::max_frame_bytes(most).next_multiple_of(256);
        let scratch_room = format::encode_scratch_bytes(most).next_multiple_of(256);
        let raw_room = most.next_multiple_of(256);
        let guard = 4096;
        let total = raw_room + frame_room + scratch_room + raw_room + guard + 256;
        let g = d.granularity();
        let granules = total.div_ceil(g).max(2);
        let m = Mapped::new(d, &[granules / 2, granules - granules / 2]);
        let (raw_at, frame_at) = (0, raw_room);
        let scratch_at = frame_at + frame_room;
        let out_at = scratch_at + scratch_room;
        let status_at = out_at + raw_room + guard;
        let s = d.stream_create().unwrap();
        for (what, raw, layout, shift) in &inputs {
            let what = format!("{}: {what} ({} bytes, {layout:?})", b.kind(), raw.len());
            write(d.as_ref(), m.at(raw_at + shift), raw);
            // SAFETY: every range lies inside `m` with the room the contract
            // asks; nothing else is queued on them.
            let got = unsafe {
                d.codec_encode(
                    m.at(raw_at + shift),
                    raw.len(),
                    *layout,
                    m.at(frame_at),
                    m.at(scratch_at),
                    s,
                )
            };
            let n = match got {
                Err(Error::Unsupported(why)) if b.is_cuda() => {
                    skip(test, &why);
                    break;
                }
                r => r.unwrap_or_else(|e| panic!("{what}: codec_encode: {e}")),
            };
            let want = codec::encode(raw, *layout);
            assert_same(
                &format!("{what}: frame"),
                &read(d.as_ref(), m.at(frame_at), n),
                &want,
            );
            // The queued encode makes the same frame and leaves its length
            // at the word given, once the stream has passed it.
            fill(d.as_ref(), m.at(frame_at), 0xEE, frame_room);
            // SAFETY: as above; the length word lies inside `m` after the
            // status word, apart from the other ranges.
            unsafe {
                d.codec_encode_async(
                    m.at(raw_at + shift),
                    raw.len(),
                    *layout,
                    m.at(frame_at),
                    m.at(scratch_at),
                    m.at(status_at + 8),
                    s,
                )
            }
            .unwrap_or_else(|e| panic!("{what}: codec_encode_async: {e}"));
            d.stream_synchronize(s).unwrap();
            let len =
                u64::from_le_bytes(read(d.as_ref(), m.at(status_at + 8), 8).try_into().unwrap());
            assert_eq!(
                len as usize,
                want.len(),
                "{what}: codec_encode_async's length"
            );
            assert_same(
                &format!("{what}: queued frame"),
                &read(d.as_ref(), m.at(frame_at), n),
                &want,
            );
            // The length word may lie in host memory from `host_alloc`: the
            // host reads it there once an event after the encode completed.
            let word = d.host_alloc(8).unwrap();
            // SAFETY: `word` holds 8 bytes from host_alloc, freed below after
            // the event was synchronized; the other ranges as above.
            unsafe {
                std::ptr::write_volatile(word.cast::<u64>(), u64::MAX);
                d.codec_encode_async(
                    m.at(raw_at + shift),
                    raw.len(),
                    *layout,
                    m.at(frame_at),
                    m.at(scratch_at),
                    word as DevicePtr,
                    s,
                )
            }
            .unwrap_or_else(|e| panic!("{what}: codec_encode_async into host memory: {e}"));
            let e = d.event_create().unwrap();
            d.event_record(e, s).unwrap();
            d.event_synchronize(e).unwrap();
            // SAFETY: the encode that writes the word has completed.
            let host_len = u64::from_le(unsafe { std::ptr::read_volatile(word.cast::<u64>()) });
            d.event_destroy(e).unwrap();
            // SAFETY: from host_alloc above; nothing queued uses it any more.
            unsafe { d.host_free(word, 8) }.unwrap();
            assert_eq!(
                host_len as usize,
                want.len(),
                "{what}: codec_encode_async's length in host memory"
            );
            let decode = |status: u32| {
                fill(d.as_ref(), m.at(out_at), 0xEE, raw_room + guard);
                write(d.as_ref(), m.at(status_at), &status.to_le_bytes());
                // SAFETY: frame, output and status lie inside `m`, apart.
                unsafe {
                    d.codec_decode_async(
                        m.at(frame_at),
                        n,
                        m.at(out_at),
                        raw.len(),
                        m.at(status_at),
                        s,
                    )
                }
                .unwrap_or_else(|e| panic!("{what}: codec_decode_async: {e}"));
                d.stream_synchronize(s).unwrap();
                let st =
                    u32::from_le_bytes(read(d.as_ref(), m.at(status_at), 4).try_into().unwrap());
                let after = read(
                    d.as_ref(),
                    m.at(out_at + raw.len()),
                    raw_room + guard - raw.len(),
                );
                assert!(
                    after.iter().all(|&x| x == 0xEE),
                    "{what}: decode wrote past its output"
                );
                st
            };
            assert_eq!(decode(u32::MAX), u32::MAX, "{what}: a good frame refused");
            assert_same(
                &format!("{what}: decoded"),
                &read(d.as_ref(), m.at(out_at), raw.len()),
                raw,
            );
            // A corrupt byte in the header, the index, a block header and a body.
            for at in [
                5usize,
                format::FRAME_HEADER_BYTES + 1,
                n.saturating_sub(1),
                n / 2,
            ] {
                if at >= n {
                    continue;
                }
                let mut bad = want.clone();
                bad[at] ^= 0x24;
                let mut out = vec![0u8; raw.len()];
                let reference = codec::decode(&bad, &mut out);
                write(d.as_ref(), m.at(frame_at + at), &bad[at..at + 1]);
                let st = decode(u32::MAX);
                assert_eq!(
                    st == u32::MAX,
                    reference.is_ok(),
                    "{what}: byte {at} changed: device status {st}, reference {reference:?}"
                );
                if let Err(e) = reference {
                    assert_eq!(
                        st as usize,
                        e.block.unwrap_or(0),
                        "{what}: byte {at}: status names block {st}, the reference: {e}"
                    );
                }
                write(d.as_ref(), m.at(frame_at + at), &want[at..at + 1]);
            }
        }
        d.stream_destroy(s).unwrap();
        drop(m);
        assert_no_leaks(b, "codec");
    });
}

// ---------------------------------------------------------------- conversion

/// Source bits for `t`: every value class (zeros, subnormals, halfway cases,
/// overflow, infinities, NaN), every 16-bit pattern for 16-bit types, then
/// pseudo-random bits.
fn conversion_source(t: ConvertType, count: usize, seed: u64) -> Vec<u8> {
    let mut v: Vec<u8> = match t {
        ConvertType::F32 => [
            0u32,
            0x8000_0000,
            1,           // smallest subnormal
            0x0080_0000, // smallest normal
            0x3F80_8000, // bf16 halfway, even below
            0x3F81_8000, // bf16 halfway, odd below
            0x3380_0000, // 2^-24: smallest f16 subnormal
            0x3300_0000, // 2^-25: f16 halfway to zero
            0x477F_F000, // 65520: rounds to f16 infinity
            0x477F_E000, // 65504: f16 max
            0x7F7F_FFFF, // f32 max: bf16 overflow to infinity
            0x7F80_0000, // +inf
            0xFF80_0000, // -inf
            0x7FC0_0001, // NaN
        ]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect(),
        ConvertType::F16 | ConvertType::Bf16 => {
            (0..=u16::MAX).flat_map(|x| x.to_le_bytes()).collect()
        }
    };
    let want = count * t.size();
    v.extend(pattern(want.saturating_sub(v.len()), seed));
    v.truncate(want);
    v
}

fn is_nan(t: ConvertType, bytes: &[u8]) -> bool {
    match t {
        ConvertType::F32 => f32::from_le_bytes(bytes.try_into().unwrap()).is_nan(),
        ConvertType::F16 => half::f16::from_le_bytes(bytes.try_into().unwrap()).is_nan(),
        ConvertType::Bf16 => half::bf16::from_le_bytes(bytes.try_into().unwrap()).is_nan(),
    }
}

#[test]
fn convert_matches_the_cpu_reference_for_every_pair() {
    on_each_backend("convert_matches_the_cpu_reference_for_every_pair", |b| {
        let d = &b.driver;
        let g = d.granularity();
        // On CUDA more elements than one launch has threads, so the kernel's
        // grid-stride loop and its tail run; on host (the reference itself,
        // unoptimized) enough for every 16-bit pattern.
        let count: usize = if b.is_cuda() { 3_000_017 } else { 66_001 };
        let same = [ConvertType::F32, ConvertType::Bf16, ConvertType::F16].map(|t| (t, t));
        let s = d.stream_create().unwrap();
        for (n, (from, to)) in kernels::PAIRS.into_iter().chain(same).enumerate() {
            let what = format!("{}: {from:?} -> {to:?}", b.kind());
            let src = conversion_source(from, count, n as u64 + 1);
            let mut want = vec![0u8; count * to.size()];
            // SAFETY: both buffers are sized for `count` elements of their types.
            unsafe { convert_on_cpu(want.as_mut_ptr(), to, src.as_ptr(), from, count) };
            // Element-aligned offsets inside the mappings, guard bytes around
            // the destination, as the loader's scratch and destinations are.
            let (src_off, dst_off) = (8, 4);
            let src_m = Mapped::new(d, &[round_up(src_off + src.len(), g) / g]);
            let dst_len = dst_off + want.len() + 4;
            let dst_m = Mapped::new(d, &[round_up(dst_len, g) / g]);
            write(d.as_ref(), src_m.at(src_off), &src);
            fill(d.as_ref(), dst_m.va, 0xEE, dst_len);
            // SAFETY: both ranges are mapped and sized for `count` elements, and disjoint.
            unsafe { d.convert_async(dst_m.at(dst_off), to, src_m.at(src_off), from, count, s) }
                .expect(&what);
            d.stream_synchronize(s).unwrap();
            let all = read(d.as_ref(), dst_m.va, dst_len);
            assert!(
                all[..dst_off]
                    .iter()
                    .chain(&all[dst_off + want.len()..])
                    .all(|&x| x == 0xEE),
                "{what}: wrote outside its range"
            );
            let got = &all[dst_off..dst_off + want.len()];
            let (ss, ts) = (from.size(), to.size());
            // Bits may differ only where the source is NaN (payloads are not
            // specified); the per-element walk runs only when something differs.
            let elements = if got == want { 0 } else { count };
            for i in 0..elements {
                let (gv, wv) = (&got[i * ts..(i + 1) * ts], &want[i * ts..(i + 1) * ts]);
                if is_nan(from, &src[i * ss..(i + 1) * ss]) {
                    assert!(is_nan(to, gv), "{what}: element {i}: NaN in, {gv:02x?} out");
                    continue;
                }
                assert_eq!(
                    gv,
                    wv,
                    "{what}: element {i}, source {:02x?}",
                    &src[i * ss..(i + 1) * ss]
                );
            }
            // Zero elements: nothing written.
            // SAFETY: as above, for no element.
            unsafe { d.convert_async(dst_m.va, to, src_m.va, from, 0, s) }.expect(&what);
            d.stream_synchronize(s).unwrap();
            assert!(read(d.as_ref(), dst_m.va, dst_off)
                .iter()
                .all(|&x| x == 0xEE));
        }
        d.stream_destroy(s).unwrap();
        assert_no_leaks(b, "conversion");
    });
}

// ---------------------------------------------------------------- host memory

#[test]
fn registered_host_memory_serves_copies_both_ways() {
    on_each_backend("registered_host_memory_serves_copies_both_ways", |b| {
        let d = &b.driver;
        let g = d.granularity();
        let len = 2 * g;
        let m = Mapped::new(d, &[2]);
        // A staging buffer or host backup: anonymous memory registered read/write.
        let mut anon = memmap2::MmapMut::map_anon(len).unwrap();
        let base = anon.as_mut_ptr();
        for round in 0..2u64 {
            // SAFETY: `anon` is a live mapping of `len` bytes, unregistered
            // below before it is unmapped; registered again in the next round.
            unsafe { d.host_register(base, len, false) }.expect("host_register");
            let bytes = pattern(len, 400 + round);
            anon.copy_from_slice(&bytes);
            let s = d.stream_create().unwrap();
            // SAFETY: `anon` and `m` hold `len` bytes; synchronized before use.
            unsafe { d.copy_htod_async(m.va, base, len, s) }.unwrap();
            d.stream_synchronize(s).unwrap();
            assert_same(
                "from registered memory",
                &read(d.as_ref(), m.va, len),
                &bytes,
            );
            anon.fill(0);
            // SAFETY: as above.
            unsafe { d.copy_dtoh_async(base, m.va, len, s) }.unwrap();
            d.stream_synchronize(s).unwrap();
            d.stream_destroy(s).unwrap();
            assert_same("into registered memory", &anon, &bytes);
            // SAFETY: registered above; no copy uses it any more.
            unsafe { d.host_unregister(base) }.expect("host_unregister");
        }

        // A checkpoint's read-only file mapping, registered read-only (Direct
        // windows and Reload pins): 1D copies from it at page offsets.
        let bytes = pattern(len + 12345, 402);
        let (_file, map) = file_mapping(&bytes);
        let fbase = map.as_ptr() as *mut u8;
        // SAFETY: the mapping (its last page whole) lives past the unregister below.
        unsafe { d.host_register(fbase, page_rounded(map.len()), true) }
            .expect("host_register read-only");
        for (off, n) in [(0, len), (4096, 12345), (8192 + 3, len - 8192)] {
            fill(d.as_ref(), m.va, 0xEE, len);
            // SAFETY: `[off, off+n)` is inside the mapping and `m`.
            unsafe { d.copy_htod_async(m.va, fbase.wrapping_add(off), n, StreamId::DEFAULT) }
                .unwrap();
            d.stream_synchronize(StreamId::DEFAULT).unwrap();
            let mut want = vec![0xEE; len];
            want[..n].copy_from_slice(&bytes[off..off + n]);
            assert_same(
                &format!("{n} bytes at +{off} of a registered file"),
                &read(d.as_ref(), m.va, len),
                &want,
            );
        }
        // SAFETY: registered above; the copies were synchronized.
        unsafe { d.host_unregister(fbase) }.expect("host_unregister");
        drop(m);
        assert_no_leaks(b, "registered host memory");
    });
}

#[test]
fn driver_allocated_host_memory_serves_copies_both_ways() {
    on_each_backend(
        "driver_allocated_host_memory_serves_copies_both_ways",
        |b| {
            let d = &b.driver;
            let m = Mapped::new(d, &[4]);
            for (k, len) in [12345usize, 4 * d.granularity()].into_iter().enumerate() {
                let bytes = pattern(len, 500 + k as u64);
                let mut src = HostAlloc::new(d, len);
                let mut dst = HostAlloc::new(d, len);
                src.bytes().copy_from_slice(&bytes);
                let s = d.stream_create().unwrap();
                // SAFETY: both host buffers and `m` hold `len` bytes; synchronized below.
                unsafe {
                    d.copy_htod_async(m.va, src.ptr, len, s).unwrap();
                    d.copy_dtoh_async(dst.ptr, m.va, len, s).unwrap();
                }
                d.stream_synchronize(s).unwrap();
                d.stream_destroy(s).unwrap();
                assert_same(
                    &format!("{len} bytes through driver-pinned memory"),
                    dst.bytes(),
                    &bytes,
                );
            }
            drop(m);
            assert_no_leaks(b, "host_alloc");
        },
    );
}

// ---------------------------------------------------------------- sharing

#[test]
fn exported_memory_imports_as_the_same_bytes() {
    let test = "exported_memory_imports_as_the_same_bytes";
    on_each_backend(test, |b| {
        let d = &b.driver;
        if !d.shareable() {
            assert!(b.is_cuda(), "the host backend always shares (memfd)");
            skip(
                test,
                "this device's memory is not created shareable (no POSIX fd handles, or VMMW_CUDA_SHAREABLE=0)",
            );
            return;
        }
        let g = d.granularity();
        let size = 2 * g;
        let va1 = d.reserve(size, 0).unwrap();
        let h1 = d.create(size).unwrap();
        d.map(va1, size, h1).unwrap();
        d.set_access(va1, size).unwrap();
        let first = pattern(size, 600);
        write(d.as_ref(), va1, &first);

        let fd = d.export_fd(h1).expect("export_fd");
        // SAFETY: F_GETFD reads the flags of a descriptor we own.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
        assert!(
            flags >= 0 && flags & libc::FD_CLOEXEC != 0,
            "an exported descriptor is close-on-exec"
        );
        let h2 = d.import_fd(fd, size).expect("import_fd");
        let va2 = d.reserve(size, 0).unwrap();
        d.map(va2, size, h2).unwrap();
        d.set_access(va2, size).unwrap();
        assert_same("imported", &read(d.as_ref(), va2, size), &first);
        // One physical memory: a write through either address shows in the other.
        let second = pattern(size, 601);
        write(d.as_ref(), va2, &second);
        assert_same(
            "written through the import",
            &read(d.as_ref(), va1, size),
            &second,
        );

        d.unmap(va2, size).unwrap();
        d.release(h2).unwrap();
        d.free_va(va2, size).unwrap();
        assert_same(
            "export after the import is gone",
            &read(d.as_ref(), va1, size),
            &second,
        );
        d.unmap(va1, size).unwrap();
        d.release(h1).unwrap();
        d.free_va(va1, size).unwrap();
        assert_no_leaks(b, "export/import");
    });
}
