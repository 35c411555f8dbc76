//! Work across the devices of one host: the pools and loaders below know one
//! device each; this layer fans work out over several.
//!
//! - `threads`: one thread per device, joined in order;
//! - [`load`]: one load filling destinations on several devices (replicas or
//!   tensor-parallel ranks), and [`load_pools`] the same into pools;
//! - `peers`: the read grants devices of a group give each other;
//! - [`replicas`]: the same bytes on several devices, put to sleep on one host
//!   backup and woken from it ([`replicas::wake_from_backup`]) or from the
//!   checkpoint ([`replicas::wake_by_reload`]); `replica_frames`: that wake
//!   from a compressed backup, its frames decoded on every device;
//!   `stream_copies`: one device's share of copies on two streams.
//!
//! It reaches a tag's segments only through the pool's lease.

pub mod load;
pub mod load_pools;
mod peers;
mod replica_frames;
pub mod replicas;
mod stream_copies;
pub(crate) mod threads;

pub use load::{load_multi, DeviceLoad, MultiLoaded, MultiMode, MultiStats};
pub use load_pools::{load_multi_into_pools, PoolLoad};
