//! The few CUDA runtime values the interposer returns (`cudaError_t`, from
//! the runtime's `driver_types.h`; stable across releases).

#![allow(non_camel_case_types)]

/// `cudaError_t`.
pub type cudaError_t = i32;

/// `cudaSuccess`.
pub const SUCCESS: cudaError_t = 0;
/// `cudaErrorInvalidValue`: a NULL out-pointer, a pointer freed twice.
pub const ERROR_INVALID_VALUE: cudaError_t = 1;
/// `cudaErrorMemoryAllocation`: what every refused allocation returns
/// (out of memory, or its tag asleep), so callers take their usual path
/// (PyTorch frees its cache and retries, ggml reports the buffer).
pub const ERROR_MEMORY_ALLOCATION: cudaError_t = 2;
/// `cudaErrorInitializationError`: the process has no CUDA runtime to forward to.
pub const ERROR_INITIALIZATION: cudaError_t = 3;
