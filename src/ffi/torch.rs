//! The two symbols `torch.cuda.memory.CUDAPluggableAllocator` loads by name.
//! Their logic lives in [`crate::pool::torch`]; these only pin the C signatures:
//! `void* malloc(ssize_t size, int device, cudaStream_t stream)` and
//! `void free(void* ptr, ssize_t size, int device, cudaStream_t stream)`.

use std::ffi::c_void;

/// Allocate one segment of at least `size` bytes on `device`, tagged with the
/// calling thread's current tag. Returns NULL when out of memory or on any
/// other failure (reported on stderr). Never unwinds.
///
/// Bad input: returns NULL (size <= 0, negative device, out of memory, any
/// failure); never a status.
///
/// # Safety
/// Safe to call with any arguments; `stream` is not dereferenced.
#[no_mangle]
pub unsafe extern "C" fn vmmw_torch_malloc(
    size: isize,
    device: i32,
    stream: *mut c_void,
) -> *mut c_void {
    crate::pool::torch::malloc_entry(size, device, stream)
}

/// Free a segment returned by [`vmmw_torch_malloc`], after the device has
/// finished all queued work. An unknown pointer is reported on stderr and
/// counted, never a crash. Never unwinds.
///
/// Bad input: ignored and reported on stderr (NULL, unknown or already freed
/// pointer).
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
    crate::pool::torch::free_entry(ptr, size, device, stream)
}
