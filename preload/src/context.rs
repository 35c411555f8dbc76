//! The calling thread's CUDA context and device, kept as the process had
//! them.
//!
//! The pool's CUDA backend makes a device's primary context current on the
//! thread that calls it (the driver API needs one), and a free synchronizes
//! the pointer's device, which may not be the thread's current one. Both
//! would change what the process's next runtime call on that thread acts
//! on, so every call that reaches the pool from a thread of the process
//! runs inside a [`Kept`]: it notes the current context (`cuCtxGetCurrent`,
//! when the CUDA driver is loaded) and the runtime's current device, and
//! puts both back when dropped.

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::real;

type CtxGet = unsafe extern "C" fn(*mut *mut c_void) -> i32;
type CtxSet = unsafe extern "C" fn(*mut c_void) -> i32;

static CTX_GET: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
static CTX_SET: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

/// `cuCtxGetCurrent` and `cuCtxSetCurrent` of the loaded CUDA driver, if
/// it is loaded (never loads it).
fn ctx_api() -> Option<(CtxGet, CtxSet)> {
    let (mut g, mut s) = (
        CTX_GET.load(Ordering::Acquire),
        CTX_SET.load(Ordering::Acquire),
    );
    if g.is_null() || s.is_null() {
        // SAFETY: RTLD_NOLOAD only returns a handle to an object already loaded.
        let h =
            unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if h.is_null() {
            return None;
        }
        // SAFETY: a live handle and NUL-terminated names.
        unsafe {
            g = libc::dlsym(h, c"cuCtxGetCurrent".as_ptr());
            s = libc::dlsym(h, c"cuCtxSetCurrent".as_ptr());
            // The driver stays loaded: the runtime and the pool hold it.
            libc::dlclose(h);
        }
        if g.is_null() || s.is_null() {
            return None;
        }
        CTX_GET.store(g, Ordering::Release);
        CTX_SET.store(s, Ordering::Release);
    }
    // SAFETY: the driver's functions of those names, with these prototypes.
    Some(unsafe {
        (
            std::mem::transmute::<*mut c_void, CtxGet>(g),
            std::mem::transmute::<*mut c_void, CtxSet>(s),
        )
    })
}

/// Whether to look for the driver at all: false once the pools are known
/// to run on the host backend (the stand-in runtime of the tests).
static LOOK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Stop looking for the CUDA driver (the host backend never changes contexts).
pub fn no_driver_contexts() {
    LOOK.store(false, Ordering::Relaxed);
}

/// The thread's context and device as they were; restored on drop.
pub struct Kept {
    ctx: Option<(*mut c_void, CtxSet)>,
    device: Option<i32>,
}

impl Kept {
    /// Note the calling thread's current context and device.
    pub fn now() -> Kept {
        let ctx = if LOOK.load(Ordering::Relaxed) {
            ctx_api().and_then(|(get, set)| {
                let mut c = null_mut();
                // SAFETY: `c` is writable; cuCtxGetCurrent only writes it.
                (unsafe { get(&mut c) } == 0).then_some((c, set))
            })
        } else {
            None
        };
        Kept {
            ctx,
            device: real::current_device().ok(),
        }
    }

    /// The device that was current.
    pub fn device(&self) -> Option<i32> {
        self.device
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        if let Some(d) = self.device {
            if real::current_device().ok() != Some(d) {
                // SAFETY: a device ordinal the runtime reported for this thread.
                unsafe { real::set_device(d) };
            }
        }
        if let Some((c, set)) = self.ctx {
            // SAFETY: the context current on this thread when noted (or
            // NULL), still alive: the process did not destroy it meanwhile.
            unsafe { set(c) };
        }
    }
}
