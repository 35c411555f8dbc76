//! Reservations and mappings: `mmap(PROT_NONE)` reservations, memfds mapped
//! `MAP_FIXED` into them, `mprotect` for access (recorded in the simulated
//! interconnect with the peers granted), and unmapping back to `PROT_NONE`.

use super::interconnect::{interconnect, range_allows, Mapped};
use super::state::State;
use super::{errno_error, host_device_count, injected, HostDriver};
use crate::driver::fault::FaultOp;
use crate::driver::{AccessMode, DevicePtr, Driver, PeerAccess, PhysHandle};
use crate::error::{Error, Result};

impl HostDriver {
    fn check_aligned(&self, what: &str, va: u64, size: usize) -> Result<()> {
        if size == 0
            || !size.is_multiple_of(self.granularity)
            || !va.is_multiple_of(self.granularity as u64)
        {
            return Err(Error::InvalidArgument(format!(
                "{what}: address {va:#x} and size {size} must be non-zero multiples of the granularity {}",
                self.granularity
            )));
        }
        Ok(())
    }

    fn inside_reservation(s: &State, va: u64, size: usize) -> bool {
        s.reservations
            .range(..=va)
            .next_back()
            .is_some_and(|(&base, &len)| va + size as u64 <= base + len as u64)
    }

    fn overlaps_mapping(s: &State, va: u64, size: usize) -> bool {
        let end = va + size as u64;
        s.mappings
            .range(..end)
            .next_back()
            .is_some_and(|(&m, &(len, _))| m + len as u64 > va)
    }

    /// `mprotect` a fully mapped range (set_access and its read-only twin)
    /// and record it, with the peers granted,
    /// in the interconnect table (per mapping).
    fn protect(
        &self,
        va: DevicePtr,
        size: usize,
        prot: libc::c_int,
        peers: &[PeerAccess],
    ) -> Result<()> {
        self.check_aligned("set_access", va, size)?;
        let s = self.state();
        if self.faults.take(FaultOp::SetAccess) {
            return Err(injected("set_access"));
        }
        // Every byte must be mapped, as cuMemSetAccess requires.
        let end = va + size as u64;
        let mut cursor = va;
        let mut covered = Vec::new();
        for (&m, &(len, _)) in s.mappings.range(..end) {
            let m_end = m + len as u64;
            if m_end <= cursor {
                continue;
            }
            if m > cursor {
                break;
            }
            covered.push((m, m_end));
            cursor = m_end;
        }
        if cursor < end {
            return Err(Error::InvalidState(format!(
                "set_access: [{va:#x}, +{size}) is not fully mapped"
            )));
        }
        // SAFETY: the range is fully mapped by us (checked above).
        let rc = unsafe { libc::mprotect(va as *mut libc::c_void, size, prot) };
        if rc != 0 {
            return Err(errno_error("mprotect", format!("[{va:#x}, +{size})")));
        }
        let granted: Vec<PeerAccess> = peers
            .iter()
            .copied()
            .filter(|p| p.mode != AccessMode::None)
            .collect();
        let mut table = interconnect();
        for (m, m_end) in covered {
            table.insert(
                m,
                Mapped {
                    end: m_end,
                    driver: self.id,
                    device: self.device,
                    peers: granted.clone(),
                },
            );
        }
        Ok(())
    }
}

pub(super) fn reserve(d: &HostDriver, size: usize, alignment: usize) -> Result<DevicePtr> {
    let align = if alignment == 0 {
        d.granularity
    } else {
        alignment.max(d.granularity)
    };
    if size == 0 || !size.is_multiple_of(d.granularity) || !align.is_power_of_two() {
        return Err(Error::InvalidArgument(format!(
            "reserve: size {size} must be a non-zero multiple of the granularity {} and alignment {align} a power of two",
            d.granularity
        )));
    }
    let mut s = d.state();
    if d.faults.take(FaultOp::Reserve) {
        return Err(injected("reserve"));
    }
    let total = size
        .checked_add(align)
        .ok_or_else(|| Error::InvalidArgument(format!("reserve: size {size} too large")))?;
    // SAFETY: a fresh anonymous PROT_NONE mapping; no existing memory is touched.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(errno_error("mmap", format!("reserving {size} bytes of VA")));
    }
    let start = raw as usize;
    let aligned = start.div_ceil(align) * align;
    let head = aligned - start;
    let tail = total - head - size;
    // SAFETY: both ranges lie inside the mapping just created and are not
    // part of the aligned range we keep.
    unsafe {
        if head > 0 {
            libc::munmap(raw, head);
        }
        if tail > 0 {
            libc::munmap((aligned + size) as *mut libc::c_void, tail);
        }
    }
    s.reservations.insert(aligned as u64, size);
    Ok(aligned as u64)
}

pub(super) fn free_va(d: &HostDriver, va: DevicePtr, size: usize) -> Result<()> {
    let mut s = d.state();
    match s.reservations.get(&va) {
        Some(&len) if len == size => {}
        Some(&len) => {
            return Err(Error::InvalidArgument(format!(
                "free_va: reservation at {va:#x} has {len} bytes, not {size}"
            )))
        }
        None => {
            return Err(Error::InvalidArgument(format!(
                "free_va: {va:#x} is not a reservation"
            )))
        }
    }
    if HostDriver::overlaps_mapping(&s, va, size) {
        return Err(Error::InvalidState(format!(
            "free_va: reservation at {va:#x} still has mapped ranges; unmap them first"
        )));
    }
    // SAFETY: the range is a reservation we made and nothing is mapped in it.
    let rc = unsafe { libc::munmap(va as *mut libc::c_void, size) };
    if rc != 0 {
        return Err(errno_error("munmap", format!("freeing VA {va:#x}")));
    }
    s.reservations.remove(&va);
    Ok(())
}

pub(super) fn map(d: &HostDriver, va: DevicePtr, size: usize, handle: PhysHandle) -> Result<()> {
    d.check_aligned("map", va, size)?;
    let mut s = d.state();
    if d.faults.take(FaultOp::Map) {
        return Err(injected("map"));
    }
    if !HostDriver::inside_reservation(&s, va, size) {
        return Err(Error::InvalidArgument(format!(
            "map: [{va:#x}, +{size}) is not inside one reservation"
        )));
    }
    if HostDriver::overlaps_mapping(&s, va, size) {
        return Err(Error::InvalidState(format!(
            "map: [{va:#x}, +{size}) overlaps a mapped range"
        )));
    }
    let fd = match s.handles.get(&handle.0) {
        Some(p) if !p.released && p.size >= size => p.fd,
        Some(p) if !p.released => {
            return Err(Error::InvalidArgument(format!(
                "map: handle {} has {} bytes, cannot map {size}",
                handle.0, p.size
            )))
        }
        _ => {
            return Err(Error::InvalidArgument(format!(
                "map: unknown or released handle {}",
                handle.0
            )))
        }
    };
    // SAFETY: the range lies inside a reservation of ours (checked above) and
    // holds no other mapping, so MAP_FIXED replaces only our PROT_NONE placeholder.
    let rc = unsafe {
        libc::mmap(
            va as *mut libc::c_void,
            size,
            libc::PROT_NONE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0,
        )
    };
    if rc == libc::MAP_FAILED {
        return Err(errno_error("mmap", format!("mapping handle at {va:#x}")));
    }
    s.mappings.insert(va, (size, handle.0));
    if let Some(p) = s.handles.get_mut(&handle.0) {
        p.maps += 1;
    }
    Ok(())
}

pub(super) fn set_access(d: &HostDriver, va: DevicePtr, size: usize) -> Result<()> {
    d.set_access_peers(va, size, &[])
}

pub(super) fn set_access_peers(
    d: &HostDriver,
    va: DevicePtr,
    size: usize,
    peers: &[PeerAccess],
) -> Result<()> {
    crate::driver::check_peer_list(d.device, peers, |p| d.can_access_peer(p))?;
    d.protect(va, size, libc::PROT_READ | libc::PROT_WRITE, peers)
}

pub(super) fn set_access_read_only(d: &HostDriver, va: DevicePtr, size: usize) -> Result<()> {
    d.protect(va, size, libc::PROT_READ, &[])
}

pub(super) fn peer_readable(
    d: &HostDriver,
    va: DevicePtr,
    len: usize,
    reader: i32,
) -> Result<bool> {
    Ok(range_allows(va, len, d.device, reader, AccessMode::Read))
}

pub(super) fn can_access_peer(d: &HostDriver, peer: i32) -> Result<bool> {
    let count = host_device_count()?;
    if !(0..count).contains(&peer) {
        return Err(Error::InvalidArgument(format!(
            "peer device {peer} does not exist: the host backend simulates {count} devices"
        )));
    }
    Ok(peer != d.device)
}

pub(super) fn unmap(d: &HostDriver, va: DevicePtr, size: usize) -> Result<()> {
    d.check_aligned("unmap", va, size)?;
    let mut s = d.state();
    if d.faults.take(FaultOp::Unmap) {
        return Err(injected("unmap"));
    }
    // cuMemUnmap requires the range to cover whole mappings.
    let end = va + size as u64;
    let covered: Vec<(u64, usize, u64)> = s
        .mappings
        .range(va..end)
        .map(|(&m, &(len, h))| (m, len, h))
        .collect();
    if covered.is_empty() || covered.iter().any(|&(m, len, _)| m + len as u64 > end) {
        return Err(Error::InvalidArgument(format!(
            "unmap: [{va:#x}, +{size}) does not cover whole mapped ranges"
        )));
    }
    if HostDriver::overlaps_mapping(&s, va, 0) && !s.mappings.contains_key(&va) {
        return Err(Error::InvalidArgument(format!(
            "unmap: {va:#x} is inside a mapping, not at its start"
        )));
    }
    // SAFETY: the range is inside our reservation; replacing it with a
    // PROT_NONE anonymous mapping keeps the VA reserved and drops the memfd pages.
    let rc = unsafe {
        libc::mmap(
            va as *mut libc::c_void,
            size,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if rc == libc::MAP_FAILED {
        return Err(errno_error("mmap", format!("unmapping [{va:#x}, +{size})")));
    }
    {
        let mut table = interconnect();
        for &(m, _, _) in &covered {
            table.remove(&m);
        }
    }
    for (m, _, h) in covered {
        s.mappings.remove(&m);
        if let Some(p) = s.handles.get_mut(&h) {
            p.maps -= 1;
        }
        State::drop_phys_if_done(&mut s, h);
    }
    Ok(())
}
