//! Every integration test in one binary: linking one executable instead of
//! one per file is most of what a test build costs. Each file here is a module
//! named as its test area, so `cargo test --test all loader_load::` runs one.
//!
//! A few test files stay binaries of their own under `tests/` because they
//! rely on having the process to themselves: `pool_torch` (the process-global
//! pool and its counters), `concurrency` and `ffi_loader_asleep` (they set
//! `VMMW_BACKEND` for the process), `loader_geometry` (loads in one process
//! share the cache budget), `share_attacks` (counts the process's threads) and
//! `share_processes` (counts its open descriptors).

#[path = "../common/mod.rs"]
mod common;

#[cfg(feature = "cli")]
mod cli_bench_swap;
#[cfg(feature = "cli")]
mod cli_chart;
#[cfg(feature = "cli")]
mod cli_ctl;
#[cfg(feature = "cli")]
mod cli_errors;
#[cfg(feature = "cli")]
mod cli_json;
#[cfg(feature = "cli")]
mod cli_pipe;
#[cfg(feature = "cli")]
mod cli_serve;
mod codec;
mod control_attacks;
mod control_channel;
mod device_reliability;
mod driver_contract;
mod fault_device;
mod fault_file_read;
mod fault_table;
mod fuzz_corpus;
mod gpu_hazards;
mod gpu_peers;
mod gpu_replica_wake;
mod loader_alias;
#[cfg(feature = "cli")]
mod loader_cli;
mod loader_convert;
mod loader_errors;
mod loader_gguf;
mod loader_hostile;
mod loader_identity;
mod loader_into_pool;
mod loader_load;
mod loader_multi;
mod loader_not_checkpoint;
mod loader_tp;
mod packed;
#[cfg(feature = "cli")]
mod packed_cli;
mod packed_integrity;
mod pool_arena;
mod pool_backups;
mod pool_errors;
mod pool_free_faults;
mod pool_model;
mod pool_random;
mod pool_rdma;
mod pool_reload;
mod pool_remap;
mod pool_sleep;
mod pool_swap;
mod pool_tags;
mod reload_writes;
mod replica_wake;
mod replica_wake_compressed;
mod segment;
mod share_attach_bench;
mod sleep_compressed;
mod sleep_engine;
mod sleep_hazards;
mod sleep_limits;
mod sleep_stale;
mod swap_attacks;
mod swap_panics;
mod swap_room;
mod update;
#[cfg(feature = "cli")]
mod update_cli;
mod update_repeat;
mod update_tp;
mod update_transport_broadcast;
mod update_transport_broadcast_load;
mod update_transport_direct;
mod update_transport_direct_cache;
mod update_transport_processes;
mod update_transport_ranks;
