//! Pinned host staging memory for the copy engine.
//!
//! Allocated as anonymous memory advised to use huge pages, touched by the
//! worker that will use it, then registered with the driver. DESIGN.md: this
//! pins at ~20 GB/s end to end where `cudaHostAlloc` manages ~1.9 GB/s.

use crate::driver::Driver;
use crate::error::{Error, Result};

/// One registered, page-locked host buffer. Unregistered and unmapped on drop.
#[derive(Debug)]
pub struct Pinned<'d> {
    driver: &'d dyn Driver,
    ptr: *mut u8,
    len: usize,
    registered: bool,
}

// SAFETY: the buffer is plain memory owned by this value; access to its bytes is
// coordinated by the copy engine (one worker fills a slot, the device reads it
// only after the fill, events guard reuse).
unsafe impl Send for Pinned<'_> {}
// SAFETY: as above; shared references only expose the raw pointer.
unsafe impl Sync for Pinned<'_> {}

impl<'d> Pinned<'d> {
    /// Map `len` bytes, advise huge pages, touch every page, register them.
    pub fn new(driver: &'d dyn Driver, len: usize) -> Result<Pinned<'d>> {
        let len = len.max(1).div_ceil(2 << 20) * (2 << 20);
        // SAFETY: an anonymous private mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::HostOutOfMemory {
                what: "pinned staging buffer".into(),
                requested: len as u64,
                limit: u64::MAX,
                in_use: 0,
            });
        }
        let mut me = Pinned {
            driver,
            ptr: p as *mut u8,
            len,
            registered: false,
        };
        // SAFETY: advising our own fresh mapping; failure only loses huge pages.
        unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
        let page = 4096;
        let mut off = 0;
        while off < len {
            // SAFETY: inside our mapping; writing populates the page.
            unsafe { me.ptr.add(off).write_volatile(0) };
            off += page;
        }
        // SAFETY: the mapping is valid and outlives the registration (unregistered in drop).
        unsafe { driver.host_register(me.ptr, len, false) }?;
        me.registered = true;
        Ok(me)
    }

    /// Start of the buffer.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (a buffer has at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        if self.registered {
            // SAFETY: registered in `new`; the engine synchronizes every copy from
            // this buffer before dropping it.
            let _ = unsafe { self.driver.host_unregister(self.ptr) };
        }
        // SAFETY: our own mapping of `len` bytes.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// Fraction of the pages of `[ptr, ptr+len)` resident in memory (page cache), via `mincore`.
pub fn resident_fraction(ptr: *const u8, len: usize) -> f64 {
    if len == 0 || ptr.is_null() {
        return 1.0;
    }
    let page = 4096usize;
    let start = (ptr as usize) & !(page - 1);
    let end = (ptr as usize + len).div_ceil(page) * page;
    let pages = (end - start) / page;
    let mut vec = vec![0u8; pages];
    // SAFETY: `start..end` lies within a mapping the caller holds (a shard's mmap);
    // `vec` has one byte per page as mincore requires.
    let rc = unsafe {
        libc::mincore(
            start as *mut libc::c_void,
            end - start,
            vec.as_mut_ptr() as *mut libc::c_uchar,
        )
    };
    if rc != 0 {
        return 0.0;
    }
    vec.iter().filter(|&&b| b & 1 != 0).count() as f64 / pages as f64
}
