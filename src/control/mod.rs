//! The control channel: a Unix socket through which another process asks
//! this one for its memory status, to sleep, or to wake (docs/PRELOAD.md).
//!
//! The CUDA runtime interposer (`libvmmw_preload.so`) serves it inside
//! processes we did not write (llama-server, SGLang's workers); a process
//! that uses the library directly can serve its default pools the same way
//! (`vmmw_control_serve`). `vmmw ctl`, the C API (`vmmw_control_*`) and the
//! bindings are clients.
//!
//! The protocol: each request is one JSON object on one line of at most
//! [`protocol::MAX_LINE`] bytes, each answer one JSON object on one line; a
//! connection may carry several requests in turn.
//!
//! | request | answer |
//! |---|---|
//! | `{"op":"status"}` | [`protocol::StatusAnswer`] |
//! | `{"op":"sleep","policy":"offload"}` (`offload_compressed`, `discard`; optional `"tags":[..]`) | [`protocol::CycleAnswer`] |
//! | `{"op":"wake"}` (optional `"tags":[..]`, `"wait_memory_ms":N`) | [`protocol::CycleAnswer`] |
//! | anything refused | `{"ok":false,"code":"VMMW_...","error":"why"}` |
//!
//! Who may connect: the peer's `SO_PEERCRED` against the rule every socket
//! of this library applies (this process's user unless others are listed).
//!
//! - [`protocol`]: the messages and their checks;
//! - [`line`]: bounded line reads under a deadline;
//! - [`target`]: the [`Controlled`] trait a server serves;
//! - [`pools`]: [`ProcessPools`], a process's pools controlled as one;
//! - [`room`]: a wake's room on each device and its wait for memory;
//! - [`server`]: the socket, its threads and bounds;
//! - [`client`]: the client;
//! - [`log`]: the server's bounded, non-blocking log.

pub mod client;
pub mod line;
pub mod log;
pub mod pools;
pub mod protocol;
pub mod room;
pub mod server;
pub mod target;

pub use client::Client;
pub use log::ControlLog;
pub use pools::{DeviceSync, PoolSource, ProcessPools};
pub use protocol::{CycleAnswer, Phase, Request, StatusAnswer, WirePolicy};
pub use server::{ControlOptions, Server};
pub use target::Controlled;
