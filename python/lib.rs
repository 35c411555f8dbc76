//! The Python wheel's native library: the vmmweights crate as it is. Every
//! `#[no_mangle]` C function of the crate is exported from this cdylib, which
//! the `vmmweights` Python package opens with ctypes.

pub use vmmweights;
