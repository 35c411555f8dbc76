//! Helpers shared by the integration tests, one file per area: `backend`
//! (the backends a backend-parametric test runs on), `loader`
//! (generated checkpoints, destinations, device reads), `cli` (running the
//! built `vmmw`, parsing its charts), `fault` (the driver steps the fault
//! tests fail), `gguf` (GGUF files written byte by byte) and `pool` (a small
//! host driver and pool sizes, a deterministic RNG, byte patterns) and `swap`
//! (the swap tests' pool, tags and bytes).
//! `tests/all/main.rs` declares it once for its modules; a test binary of its
//! own includes it with `mod common;`.
#![allow(dead_code)]

pub mod backend;
#[cfg(feature = "cli")]
pub mod cli;
pub mod fault;
pub mod gguf;
pub mod loader;
pub mod pool;
pub mod swap;
