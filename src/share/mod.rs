//! Weights shared across processes: one copy in device memory, mapped by many.
//!
//! The owner serves a tag's tensors on a Unix socket ([`Server`]); an importer
//! attaches by the socket path ([`Attachment`]), receives a [`Manifest`] and
//! one file descriptor per physical chunk (`SCM_RIGHTS`), imports them
//! (`cuMemImportFromShareableHandle`, or the memfd itself on the host
//! backend), maps them at its own addresses and grants itself read-only
//! access unless the owner allows writes and it asks.
//!
//! Lifetime rules (docs/SHARING.md has the long form):
//! - an importer that detaches, exits or dies releases what it held: its
//!   descriptors, handles and mappings go with it, and the owner stops counting it;
//! - an owner that stops serving or dies leaves importers' mappings valid: the
//!   driver keeps physical memory alive while any process maps it;
//! - the owner's sleep of a shared tag follows the share's [`SleepPolicy`]:
//!   refused while importers are attached, or revoked with notice (importers'
//!   next call fails with `ShareRevoked`; their mapping stays valid until they
//!   detach, so nothing faults);
//! - an importer that leaves its notices unread is evicted, never dropped
//!   silently: its next call fails with `ShareRevoked`, and the owner counts
//!   it until it detaches;
//! - the manifest's version is the tag's weights version
//!   ([`crate::Pool::tag_version`]): it goes up when the owner updates the
//!   weights ([`crate::update`]), publishes new ones ([`Server::publish`]) or
//!   revokes, and attached importers see it on their next call.

pub(crate) mod accept;
pub mod client;
mod connections;
pub mod export;
mod handshake;
pub mod log;
pub mod manifest;
mod memfd;
pub mod options;
pub mod server;
mod watch;
pub mod wire;

pub use client::{AttachOptions, Attachment, ImportedTensor};
pub use log::LogSink;
pub use manifest::{Manifest, SharedTensor};
pub use options::{ServeOptions, SleepPolicy};
pub use server::Server;
