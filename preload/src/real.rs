//! The CUDA runtime's own functions, found once each.
//!
//! `dlsym(RTLD_NEXT, name)` finds the definition after this library in the
//! process's global scope: the runtime a program or its libraries link
//! (llama-server through libggml-cuda), or one loaded with `RTLD_GLOBAL`
//! (PyTorch's). A runtime loaded with `RTLD_LOCAL` is not in that scope;
//! then the loaded objects are searched for a `libcudart` and the name is
//! looked up in it. A function found is kept; one not found yet is looked
//! for again at the next call (the runtime may be loaded later).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::cuda::{cudaError_t, ERROR_INITIALIZATION};

/// Look `name` up after this library, or in a loaded `libcudart`.
fn find(name: &CStr) -> *mut c_void {
    // SAFETY: RTLD_NEXT with a NUL-terminated name; dlsym only reads it.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    if !p.is_null() {
        return p;
    }
    in_loaded_runtime(name)
}

/// `name` in a loaded object whose file name contains `libcudart`.
fn in_loaded_runtime(name: &CStr) -> *mut c_void {
    let mut found: Vec<std::ffi::CString> = Vec::new();
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info for the duration of
        // the call and `data` is the Vec passed below.
        let (info, found) = unsafe { (&*info, &mut *(data as *mut Vec<std::ffi::CString>)) };
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: a NUL-terminated path owned by the loader.
        let path = unsafe { CStr::from_ptr(info.dlpi_name) };
        if path.to_bytes().windows(9).any(|w| w == b"libcudart") {
            found.push(path.to_owned());
        }
        0
    }
    // SAFETY: the callback only reads each entry and pushes to `found`.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut found as *mut Vec<_>).cast()) };
    for path in found {
        // SAFETY: RTLD_NOLOAD only returns a handle to an object already
        // loaded (adding a reference that is dropped right after the lookup).
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if h.is_null() {
            continue;
        }
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(h, name.as_ptr()) };
        // SAFETY: the handle came from dlopen above; the object stays
        // loaded (the process holds its own reference).
        unsafe { libc::dlclose(h) };
        if !p.is_null() {
            return p;
        }
    }
    null_mut()
}

/// The address of `name`, from `slot` or found now (null while not found).
fn resolve(slot: &AtomicPtr<c_void>, name: &CStr) -> *mut c_void {
    let p = slot.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    let p = find(name);
    if !p.is_null() {
        slot.store(p, Ordering::Release);
    }
    p
}

/// Whether the process has a CUDA runtime this library can forward to.
pub fn runtime_present() -> bool {
    static SLOT: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
    !resolve(&SLOT, c"cudaGetDevice").is_null()
}

/// Define a forwarding function per runtime function: it calls the real one,
/// or returns `ERROR_INITIALIZATION` when the process has none.
macro_rules! forward {
    ($(#[$doc:meta])* $name:ident = $sym:literal ($($arg:ident: $t:ty),*)) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The arguments are valid for the CUDA runtime function of that name.
        pub unsafe fn $name($($arg: $t),*) -> cudaError_t {
            static SLOT: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
            let p = resolve(&SLOT, $sym);
            if p.is_null() {
                return ERROR_INITIALIZATION;
            }
            // SAFETY: `p` is the runtime's function of that name, whose C
            // prototype is the one written here.
            let f: unsafe extern "C" fn($($t),*) -> cudaError_t = unsafe { std::mem::transmute(p) };
            // SAFETY: forwarded under the caller's contract.
            unsafe { f($($arg),*) }
        }
    };
}

forward!(
    /// `cudaMalloc`.
    malloc = c"cudaMalloc" (ptr: *mut *mut c_void, size: usize)
);
forward!(
    /// `cudaFree`.
    free = c"cudaFree" (ptr: *mut c_void)
);
forward!(
    /// `cudaMallocPitch`.
    malloc_pitch = c"cudaMallocPitch" (ptr: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize)
);
forward!(
    /// `cudaMemGetInfo`.
    mem_get_info = c"cudaMemGetInfo" (free: *mut usize, total: *mut usize)
);
forward!(
    /// `cudaGetDevice`.
    get_device = c"cudaGetDevice" (device: *mut c_int)
);
forward!(
    /// `cudaSetDevice`.
    set_device = c"cudaSetDevice" (device: c_int)
);
forward!(
    /// `cudaDeviceSynchronize`.
    device_synchronize = c"cudaDeviceSynchronize" ()
);

/// The runtime's name for `code` ("out of memory"), or the number.
pub fn error_string(code: cudaError_t) -> String {
    static SLOT: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
    let p = resolve(&SLOT, c"cudaGetErrorString");
    if p.is_null() {
        return format!("CUDA runtime error {code}");
    }
    // SAFETY: cudaGetErrorString's prototype.
    let f: unsafe extern "C" fn(cudaError_t) -> *const c_char = unsafe { std::mem::transmute(p) };
    // SAFETY: any code is accepted; the result is a static string or NULL.
    let s = unsafe { f(code) };
    if s.is_null() {
        return format!("CUDA runtime error {code}");
    }
    // SAFETY: a NUL-terminated static string of the runtime's.
    let name = unsafe { CStr::from_ptr(s) };
    format!("{} ({code})", name.to_string_lossy())
}

/// The calling thread's current device, through the runtime.
pub fn current_device() -> Result<i32, cudaError_t> {
    let mut d: c_int = 0;
    // SAFETY: `d` is writable.
    let rc = unsafe { get_device(&mut d) };
    if rc == 0 {
        Ok(d)
    } else {
        Err(rc)
    }
}
