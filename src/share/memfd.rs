//! What the share enforces on the host backend's descriptors, which are
//! memfds, beyond what the driver does.
//!
//! Owner, for a read-only importer: the memfd is sealed against new writable
//! mappings and writes (`F_SEAL_FUTURE_WRITE`; the owner's own mapping, made
//! before, stays writable), and the importer receives a read-only reopen of it
//! (`O_RDONLY`), so `mmap(PROT_WRITE, MAP_SHARED)` fails on what it holds and
//! on any reopen of it through `/proc` (a memfd's mode is 0777, so a reopen
//! alone would not hold).
//!
//! Importer: a memfd must carry `F_SEAL_SHRINK`, so its owner cannot truncate
//! it under this process's mapping (reading it would raise SIGBUS).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Seal `fd`'s memfd against new writers and return a read-only reopen of it.
pub fn read_only(fd: &OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: `fd` is an open descriptor; F_ADD_SEALS only reads its argument.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_FUTURE_WRITE) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let path = format!("/proc/self/fd/{}\0", fd.as_raw_fd());
    // SAFETY: `path` is NUL-terminated and lives across the call.
    let ro = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if ro < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `ro` was just opened and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(ro) })
}

/// Why `fd` cannot be mapped safely: its size is not sealed against shrinking.
pub fn check_sealed(fd: &OwnedFd) -> Result<(), String> {
    // SAFETY: `fd` is an open descriptor; F_GET_SEALS takes no argument.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 {
        return Err(format!(
            "the descriptor is not a sealable memfd ({})",
            io::Error::last_os_error()
        ));
    }
    if seals & libc::F_SEAL_SHRINK == 0 {
        return Err(
            "the memfd is not sealed against shrinking (F_SEAL_SHRINK): its owner could truncate \
             it under this process's mapping"
                .into(),
        );
    }
    Ok(())
}
