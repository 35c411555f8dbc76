//! Physical memory: each handle is a `memfd` sealed at its size and counted
//! against the simulated memory limit; export is a `dup` of it and import
//! maps a received one, so every process sees the same pages.

use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};

use super::state::{Phys, State};
use super::{errno_error, injected, HostDriver};
use crate::driver::fault::FaultOp;
use crate::driver::{MemInfo, PhysHandle};
use crate::error::{Error, Result};

pub(super) fn create(d: &HostDriver, size: usize) -> Result<PhysHandle> {
    if size == 0 || !size.is_multiple_of(d.granularity) {
        return Err(Error::InvalidArgument(format!(
            "create: size {size} must be a non-zero multiple of the granularity {}",
            d.granularity
        )));
    }
    let mut s = d.state();
    let free = s.memory_limit.saturating_sub(s.physical_bytes);
    if d.faults.take(FaultOp::Create) || size as u64 > free {
        return Err(Error::OutOfMemory {
            what: format!("physical allocation of {size} bytes"),
            requested: size as u64,
            free,
        });
    }
    // SAFETY: the name is a valid NUL-terminated string.
    let fd = unsafe {
        libc::memfd_create(
            c"vmmw-phys".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(errno_error("memfd_create", format!("{size} bytes")));
    }
    // Sealed at its size, as device memory is: no process it is shared
    // with can truncate it under another's mapping (SIGBUS) or grow it.
    // SAFETY: fd is the memfd just created.
    let sized = unsafe { libc::ftruncate(fd, size as libc::off_t) } == 0;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    // SAFETY: fd is the memfd just created, with sealing allowed.
    if !sized || unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) } != 0 {
        let e = errno_error(
            "memfd",
            format!("sizing and sealing a memfd of {size} bytes"),
        );
        // SAFETY: fd is ours and closed once.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    let id = if s.reuse_handle_ids {
        let id = (1..)
            .find(|id| !s.handles.contains_key(id))
            .expect("a free id");
        // Ids past every one given out stay new for the next import.
        s.next_handle = s.next_handle.max(id + 1);
        id
    } else {
        let id = s.next_handle;
        s.next_handle += 1;
        id
    };
    s.handles.insert(
        id,
        Phys {
            fd,
            size,
            released: false,
            maps: 0,
            counted: true,
        },
    );
    s.physical_bytes += size as u64;
    Ok(PhysHandle(id))
}

pub(super) fn release(d: &HostDriver, handle: PhysHandle) -> Result<()> {
    let mut s = d.state();
    if d.faults.take(FaultOp::Release) {
        return Err(injected("release"));
    }
    let p = match s.handles.get_mut(&handle.0) {
        Some(p) if !p.released => p,
        _ => {
            return Err(Error::InvalidArgument(format!(
                "release: unknown or already released handle {}",
                handle.0
            )))
        }
    };
    p.released = true;
    // SAFETY: the fd belongs to this handle and is closed exactly once; existing
    // MAP_SHARED mappings keep the memory alive until they are unmapped.
    unsafe { libc::close(p.fd) };
    p.fd = -1;
    State::drop_phys_if_done(&mut s, handle.0);
    Ok(())
}

pub(super) fn export_fd(d: &HostDriver, handle: PhysHandle) -> Result<OwnedFd> {
    let s = d.state();
    let fd = match s.handles.get(&handle.0) {
        Some(p) if !p.released => p.fd,
        _ => {
            return Err(Error::InvalidArgument(format!(
                "export_fd: unknown or released handle {}",
                handle.0
            )))
        }
    };
    // SAFETY: fd is an open memfd owned by a live handle (checked under the lock).
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(errno_error(
            "fcntl",
            format!("duplicating handle {}", handle.0),
        ));
    }
    // SAFETY: `dup` is a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(dup) })
}

pub(super) fn import_fd(d: &HostDriver, fd: OwnedFd, size: usize) -> Result<PhysHandle> {
    if size == 0 || !size.is_multiple_of(d.granularity) {
        return Err(Error::InvalidArgument(format!(
            "import_fd: size {size} must be a non-zero multiple of the granularity {}",
            d.granularity
        )));
    }
    // SAFETY: an all-zero `stat` is a valid value for fstat to overwrite.
    #[allow(clippy::disallowed_methods)] // a plain libc struct: all-zero is valid
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open (owned) and `st` is writable.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(errno_error("fstat", "an imported descriptor".into()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || (st.st_size as u64) < size as u64 {
        return Err(Error::InvalidArgument(format!(
            "import_fd: the descriptor is not physical memory of {size} bytes (a file of {} bytes, mode {:o})",
            st.st_size, st.st_mode
        )));
    }
    let mut s = d.state();
    let id = s.next_handle;
    s.next_handle += 1;
    s.handles.insert(
        id,
        Phys {
            fd: fd.into_raw_fd(),
            size,
            released: false,
            maps: 0,
            counted: false,
        },
    );
    Ok(PhysHandle(id))
}

pub(super) fn mem_info(d: &HostDriver) -> Result<MemInfo> {
    let s = d.state();
    Ok(MemInfo {
        free: s.memory_limit.saturating_sub(s.physical_bytes),
        total: s.memory_limit,
    })
}
