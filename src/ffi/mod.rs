//! The C ABI: every `vmmw_*` function of `include/vmmweights.h`.
//!
//! Conventions every function here follows (the header repeats them):
//! - it returns an `int32_t` status, one of the `VMMW_*` codes (the numbers of
//!   [`crate::error::Status`], which never change); the few exceptions are
//!   infallible accessors (`vmmw_status_name`, `vmmw_error_message`,
//!   `vmmw_version_string`) and `_free` functions;
//! - a panic inside the library is caught at the boundary and becomes
//!   `VMMW_PANIC`; nothing unwinds into C and nothing aborts the process;
//! - every pointer argument is checked for NULL (`VMMW_NULL_ARGUMENT`);
//! - out-parameters are written only on success (the documented exceptions:
//!   `*needed` on `VMMW_BUFFER_TOO_SMALL`, and `vmmw_pool_swap`'s `*result`,
//!   written whenever the swap ran so each side's outcome is told apart);
//! - fallible functions take a last argument `vmmw_error_t** error` (may be
//!   NULL): on failure, when non-NULL, `*error` receives an owned error object
//!   that the caller frees with `vmmw_error_free`. No thread-local "last error",
//!   so callers whose threads migrate (Go goroutines) read the right message.
//!
//! The module is the only source cbindgen reads (`scripts/gen-header.sh`), so
//! everything C sees is declared in these files.

#![allow(non_camel_case_types)]

pub(crate) mod boundary;
pub mod broadcast_load;
pub mod buffer;
pub mod destinations;
pub mod device;
pub mod error;
pub mod loader;
pub mod metadata;
pub mod multi;
mod numbers;
mod options;
pub mod pack;
pub mod pool;
pub mod remap;
pub mod replicas;
pub mod report;
pub mod segment;
pub mod share;
pub mod sleep;
pub mod status;
pub mod swap;
pub mod tag;
pub mod testing;
pub mod torch;
pub mod transport;
pub mod update;
pub mod update_receiver;
pub mod version;

// The control channel's client and server (docs/PRELOAD.md).
pub mod control;
