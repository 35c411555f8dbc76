//! The two symbols `torch.cuda.memory.CUDAPluggableAllocator` loads by name.
//! Their logic lives in [`crate::pool::torch`]; these pin the C signatures
//! `void* malloc(ssize_t size, int device, cudaStream_t stream)` and
//! `void free(void* ptr, ssize_t size, int device, cudaStream_t stream)`, and
//! hold the panic boundary: these entry points have no status to return, so
//! a panic becomes a failed call (NULL, or a free reported and counted).

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::error::{panic_message, Error, Result};
use crate::pool::torch;

/// Run `body`, turning a panic into an error.
fn no_unwind<T>(body: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(body))
        .unwrap_or_else(|p| Err(Error::Panic(panic_message(p.as_ref()))))
}

/// Allocate one segment of at least `size` bytes on `device`, tagged with the
/// calling thread's current tag. Returns NULL when out of memory or on any
/// other failure (reported on stderr). Never unwinds.
///
/// Errors: never a status. Returns NULL when `size` <= 0, `device` is
/// negative, out of memory, or on any other failure.
///
/// # Safety
/// Safe to call with any arguments; `stream` is not dereferenced.
#[no_mangle]
pub unsafe extern "C" fn vmmw_torch_malloc(
    size: isize,
    device: i32,
    stream: *mut c_void,
) -> *mut c_void {
    // `stream`: a new segment has no queued work; nothing to order against.
    let _ = stream;
    let outcome = no_unwind(|| torch::malloc(size, device));
    // Counting and reporting must not unwind into C either.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        torch::record_malloc(size, device, &outcome)
    }));
    match outcome {
        Ok(ptr) => ptr as usize as *mut c_void,
        Err(_) => std::ptr::null_mut(),
    }
}

/// Free a segment returned by [`vmmw_torch_malloc`], after the device has
/// finished all queued work. An unknown pointer is reported on stderr and
/// counted, never a crash. Never unwinds.
///
/// Errors: never a status. A NULL, unknown or already freed pointer is
/// ignored and reported on stderr.
///
/// # Safety
/// Safe to call with any arguments; `ptr` is only looked up, never
/// dereferenced, and `stream` is not dereferenced.
#[no_mangle]
pub unsafe extern "C" fn vmmw_torch_free(
    ptr: *mut c_void,
    size: isize,
    device: i32,
    stream: *mut c_void,
) {
    // `stream`: freeing synchronizes the device (see `pool::torch::free`).
    let _ = stream;
    if ptr.is_null() {
        return;
    }
    let ptr = ptr as usize as u64;
    let outcome = no_unwind(|| torch::free(ptr, device));
    // Counting and reporting must not unwind into C either.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        torch::record_free(ptr, size, device, &outcome)
    }));
}
