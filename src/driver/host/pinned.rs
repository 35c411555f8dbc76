//! Page-locked host memory: on the host backend nothing needs locking, so
//! `host_alloc` is a private anonymous mapping and `host_free` unmaps it.

use crate::error::{Error, Result};

pub(super) fn host_alloc(len: usize) -> Result<*mut u8> {
    // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len.max(1),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::HostOutOfMemory {
            what: format!("host_alloc: {}", std::io::Error::last_os_error()),
            requested: len as u64,
            limit: u64::MAX,
            in_use: 0,
        });
    }
    Ok(p as *mut u8)
}

pub(super) unsafe fn host_free(ptr: *mut u8, len: usize) -> Result<()> {
    // SAFETY: forwarded from the caller's contract (our own mapping of `len`).
    unsafe { libc::munmap(ptr as *mut libc::c_void, len.max(1)) };
    Ok(())
}
