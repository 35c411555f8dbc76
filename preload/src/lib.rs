//! # libvmmw_preload.so: the CUDA runtime interposer
//!
//! Loaded with `LD_PRELOAD` (`vmmw exec` does it) into a CUDA program we did
//! not write, it puts the program's `cudaMalloc`'d memory into vmmweights
//! pools, one per device, so another process can sleep and wake the program
//! through its control socket (`VMMW_CONTROL_SOCKET`; `vmmw ctl`, the
//! `vmmw_control_*` C API) while every pointer it holds stays valid.
//! docs/PRELOAD.md is the user's guide.
//!
//! What is ours: `cudaMalloc` and `cudaMallocPitch` of the process (scope
//! `all`), or of threads inside a region (scope `region`); `cudaFree` of
//! those pointers; `cudaMemGetInfo`, answered from the pools' driver. The
//! rest passes to the runtime unchanged (`entry.rs` lists it).
//!
//! Files, bottom to top:
//! - `cuda.rs`: the runtime's error values; `real.rs`: the runtime's own
//!   functions, found once; `context.rs`: the thread's context and device,
//!   put back after each call that reaches the pools;
//! - `config.rs`: the environment, read once; `thread.rs`: each thread's
//!   tag and region; `owned.rs`: the pointers we handed out; `say.rs`: the
//!   few lines on stderr;
//! - `state.rs`: the interposer made at the first intercepted call;
//! - `alloc.rs`: what each entry point does; `served.rs`: the control
//!   socket and the object it serves; `inproc.rs`: the calls from inside;
//! - `entry.rs`: the CUDA entry points; `api.rs`: the `vmmw_preload_*` C
//!   functions; `tms.rs`: torch_memory_saver's `tms_*` C functions, a thin
//!   layer over `inproc.rs`. These three hold the only exported symbols.

#![deny(unsafe_op_in_unsafe_fn)]

mod alloc;
pub mod api;
mod config;
mod context;
mod cuda;
pub mod entry;
mod inproc;
mod owned;
mod real;
mod say;
mod served;
mod state;
mod thread;
pub mod tms;
