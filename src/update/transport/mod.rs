//! Transports: how the bytes of an update travel from a sender to the
//! receiver that applies them.
//!
//! Every transport moves *buckets* (contiguous byte ranges with a manifest of
//! which tensor pieces they hold, [`bucket`]) in order, through a ring of a
//! few slots, so the receiver applies bucket k while bucket k+1 lands. The
//! receiver's side is a [`BucketSource`]; [`TransportSource`] makes one the
//! update's [`crate::update::Source`] (a batch per bucket, every manifest
//! checked before a byte is read) and [`receive`] runs the update from it:
//! the update stages what lands, so a transport that fails midway leaves
//! every destination at its last whole version.
//!
//! - [`ipc`]: another process on the same host writes buckets into a ring it
//!   exports once through [`crate::share`]; one handshake per ring. When
//!   its tensors already lie in its pool, it sends them [`direct`]ly
//!   instead: the receiver maps the pool segments that hold them and the
//!   update copies straight out of them, unstaged (a resident source).
//! - [`broadcast`]: one root rank to every rank of a
//!   [`broadcast::Collective`]: NCCL on the GPU ([`nccl`], loaded at run
//!   time), a thread-backed [`test_collective`] in CI. The same path loads
//!   a checkpoint across ranks ([`broadcast_load`]): reader ranks stream
//!   its files into the ring.
//!
//! On the host backend the IPC transport runs between real processes over
//! memfd-backed memory; CI uses it and the test collective to exercise the
//! bucketing, ordering and failure paths the GPU transports share
//! (docs/UPDATE-TRANSPORTS.md).

mod agreement;
pub mod broadcast;
pub mod broadcast_load;
pub mod bucket;
pub mod control;
pub mod direct;
mod direct_shares;
pub mod import_cache;
pub mod ipc;
pub mod nccl;
mod receive;
pub mod receiver;
pub mod send;
pub mod test_collective;

pub use bucket::{AnnouncedTensor, BucketEntry, BucketManifest};
pub use receive::{drain, receive, BucketSource, TransportSource};
pub use send::{SendData, SendTensor};

/// Ring slots unless set: two, so one bucket is applied while the next lands.
pub const DEFAULT_SLOTS: usize = 2;

/// Most receivers one IPC send waits for: the ranks of one engine, each
/// attaching the sender's ring, which serves at most this many importers
/// ([`crate::share::options::DEFAULT_MAX_CONNECTIONS`]).
pub const MAX_RECEIVERS: usize = crate::share::options::DEFAULT_MAX_CONNECTIONS;

/// Bytes of one ring slot (one bucket) unless set, chosen for memory, not
/// speed: two slots of it are 512 MiB per sender and per rank. A larger
/// bucket is faster through the IPC ring (on the H200, 0.12 of torch
/// `copy_` at 256 MiB, 0.17 at 1 GiB, `scripts/gpu.d/86-update-ipc.sh`),
/// but no size brings the ring near a copy: each byte is copied three times
/// and each bucket costs a round trip, so the direct mode, one copy out of
/// the sender's own memory, is the fast path (docs/UPDATE-TRANSPORTS.md).
pub const DEFAULT_BUCKET_BYTES: usize = 256 << 20;
