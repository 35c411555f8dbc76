//! # vmmweights
//!
//! Model weights in GPU memory through CUDA virtual memory management (VMM):
//! a caching pool of VMM segments with tags, in-place safetensors loading,
//! and sleep/wake that releases the physical memory behind live tensors and
//! restores it at the same addresses.
//!
//! Layers, kept apart in code and names:
//! - [`driver`]: virtual addresses and physical memory (CUDA, or the host simulation);
//! - [`segment`]: one VA reservation and the chunks mapped into it;
//! - the pool, tags, sleep/wake, the loader and the C ABI above them.
//!
//! Every layer runs on both backends: the host backend gives CUDA's VMM
//! semantics on host memory, so the whole library is tested without a GPU.

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod driver;
pub mod error;
pub mod ffi;
pub mod hostmem;
pub mod loader;
pub mod pool;
pub mod report;
pub mod segment;
pub mod share;
pub mod sleep;
pub mod tag;
pub mod units;

pub use driver::{BackendChoice, BackendKind, DevicePtr, Driver};
pub use error::{Error, Result, Status};
pub use pool::{Block, Mode, Pool, PoolConfig};
pub use report::{Report, Timeline};
pub use segment::{Segment, SleepState};
pub use tag::TagId;

/// The text of a caught panic payload.
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_owned()
    }
}
