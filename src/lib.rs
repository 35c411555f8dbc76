//! # vmmweights
//!
//! Model weights in GPU memory through CUDA virtual memory management (VMM):
//! a caching pool of VMM segments with tags, in-place safetensors loading,
//! and sleep/wake that releases the physical memory behind live tensors and
//! restores it at the same addresses.
//!
//! Layers, bottom to top; a module imports only lower layers
//! (`docs/ARCHITECTURE.md`, enforced by `scripts/check-layers.py`):
//! - [`error`], [`units`]: the error type and status numbers; page size, byte counts;
//! - [`driver`]: virtual addresses and physical memory (CUDA, or the host simulation);
//! - [`hostmem`] (pinned host buffers), [`segment`] (one VA reservation and the
//!   chunks mapped into it), [`tag`] (tag names and per-thread scopes);
//! - [`report`]: the memory quantities per tag;
//! - [`sleep`]: sleep/wake of a tag's segments, the backup arena, the reload seam;
//! - [`pool`]: the caching pool, arenas, the process-wide registry, PyTorch's entry logic,
//!   each tag's weights version;
//! - [`loader`]: checkpoints, rules, plans and the copy engine; loading into a pool;
//! - [`devices`] (beside [`share`]): work across the devices of one host: the
//!   multi-device load, replicas' sleep and wake, their peer grants;
//! - [`update`]: new weights into live destinations, through the load's rules;
//!   beside it [`control`]: the control socket of a process (status, sleep,
//!   wake), which the CUDA runtime interposer serves;
//! - [`ffi`]: the C ABI, thin over the functions above.
//!
//! Every layer runs on both backends: the host backend gives CUDA's VMM
//! semantics on host memory, so the whole library is tested without a GPU.
//!
//! ## Quick start
//!
//! Open a backend, load a checkpoint in place under a tag, sleep, wake: the
//! tensors keep their addresses and bytes. The whole program, with the
//! check, is `examples/quickstart.rs` (`cargo run --example quickstart`;
//! `VMMW_BACKEND=host` runs it without a GPU).
//!
//! ```no_run
//! use vmmweights::driver::{self, BackendChoice};
//! use vmmweights::loader::Session;
//! use vmmweights::sleep::Policy;
//! use vmmweights::{tag, Pool, PoolConfig};
//!
//! # fn main() -> vmmweights::Result<()> {
//! let opened = driver::open(BackendChoice::from_env()?, 0)?; // CUDA, or the host backend
//! let pool = Pool::new(opened.driver, PoolConfig::default())?;
//! let weights = tag::id("weights")?;
//! let session = Session::open("/models/qwen2")?; // a file, or a folder with an index
//! session.allocate(&pool, weights)?; // one destination per tensor, in the pool
//! session.load(&pool, None)?; // filled in place
//! pool.sleep(&[(weights, Policy::Offload)])?; // device memory released, addresses kept
//! pool.wake(&[weights])?; // same addresses, same bytes
//! for d in session.destinations() {
//!     println!("{} at {:#x}", d.name, d.ptr);
//! }
//! # Ok(()) }
//! ```

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod codec;
// The control channel of processes run under the CUDA runtime interposer
// (docs/PRELOAD.md); above `share`, beside `update`.
pub mod control;
pub mod devices;
pub mod driver;
pub mod error;
pub mod ffi;
#[doc(hidden)]
pub mod fuzz;
pub mod hostmem;
pub mod loader;
pub mod pool;
pub mod report;
pub mod segment;
pub mod share;
pub mod sleep;
pub mod tag;
pub mod units;
pub mod update;

pub use driver::{BackendChoice, BackendKind, DevicePtr, Driver};
pub use error::{Error, Result, Status};
pub use pool::{Block, Mode, Pool, PoolConfig};
pub use report::{Report, Timeline};
pub use segment::{Segment, SleepState};
pub use tag::TagId;
