//! Helpers shared by the integration tests, one file per area: `backend`
//! (the backends a backend-parametric test runs on), `loader`
//! (generated checkpoints, destinations, device reads), `cli` (running the
//! built `vmmw`, parsing its charts), `fault` (the driver steps the fault
//! tests fail) and `pool` (a small
//! host driver and pool sizes, a deterministic RNG, byte patterns). Each test
//! file includes this module with `mod common;` and uses what it needs.
#![allow(dead_code)]

pub mod backend;
#[cfg(feature = "cli")]
pub mod cli;
pub mod fault;
pub mod loader;
pub mod pool;
