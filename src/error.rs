//! One error type for the whole library, and the stable status codes the C ABI
//! returns for it.
//!
//! Every variant carries what a user needs to act: which file, which tensor,
//! which sizes. `Error::status()` maps each variant to a [`Status`] whose numbers
//! never change once released (they are part of the C ABI).

use std::path::PathBuf;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The text of a caught panic payload.
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_owned()
    }
}

/// Stable status codes returned by every `vmmw_*` C function.
///
/// The numbers are part of the ABI: never renumber, only append.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// An argument was out of range or malformed.
    InvalidArgument = 1,
    /// A required pointer argument was NULL.
    NullArgument = 2,
    /// The device (or the simulated device) has not enough free memory.
    OutOfMemory = 3,
    /// Host memory (pinned backup, staging) could not be allocated or exceeds its limit.
    HostOutOfMemory = 4,
    /// No usable CUDA driver or device: library missing, no device, driver too old.
    DriverUnavailable = 5,
    /// A CUDA driver call failed; the message names the call and the CUDA error.
    DriverError = 6,
    /// A pointer that this library did not hand out, or one already freed;
    /// also a destination whose pool block was freed since it was registered
    /// (its address may now belong to a new block).
    UnknownPointer = 7,
    /// A tag name or id that is not registered, or (sleep, wake) not known to the pool.
    UnknownTag = 8,
    /// The operation is not valid in the current state (e.g. allocating in a sleeping tag).
    InvalidState = 9,
    /// A checkpoint file is truncated, corrupt or otherwise invalid.
    CheckpointInvalid = 10,
    /// An operating-system I/O error (open, read, mmap).
    Io = 11,
    /// The load plan does not match the destinations (missing, unexpected, shape, dtype).
    PlanMismatch = 12,
    /// The operation was cancelled by the caller.
    Cancelled = 13,
    /// An internal panic was caught at the C boundary; the library state may be inconsistent.
    Panic = 14,
    /// The operation is not supported by this backend or build.
    Unsupported = 15,
    /// A caller-provided buffer is too small; the required size was written where documented.
    BufferTooSmall = 16,
    /// A load is writing into the tag: sleep it once the load has returned (or cancel the load).
    LoadInProgress = 17,
    /// Sharing across processes refused: a peer not allowed, a malformed or
    /// hostile manifest, a protocol violation, or the owner refusing the attach.
    ShareRefused = 18,
    /// The owner revoked a share (it slept the tag under the revoke policy):
    /// detach, and attach again once it is awake.
    ShareRevoked = 19,
    /// An update named a base version the tag is not at (another update ran
    /// first): read the tag's version and send the update again. Nothing was written.
    VersionMismatch = 20,
    /// An update's source failed or ended before delivering every byte (a
    /// transport error, a short bucket): no destination was written.
    UpdateSource = 21,
    /// An update wrote destinations and could not finish, also on its retry
    /// (a device that fails every copy): they hold a mix of versions, the tag
    /// is marked torn and its version did not move. Update again to repair.
    UpdateTorn = 22,
}

impl Status {
    /// Every status, in numeric order.
    pub const ALL: [Status; 23] = [
        Status::Ok,
        Status::InvalidArgument,
        Status::NullArgument,
        Status::OutOfMemory,
        Status::HostOutOfMemory,
        Status::DriverUnavailable,
        Status::DriverError,
        Status::UnknownPointer,
        Status::UnknownTag,
        Status::InvalidState,
        Status::CheckpointInvalid,
        Status::Io,
        Status::PlanMismatch,
        Status::Cancelled,
        Status::Panic,
        Status::Unsupported,
        Status::BufferTooSmall,
        Status::LoadInProgress,
        Status::ShareRefused,
        Status::ShareRevoked,
        Status::VersionMismatch,
        Status::UpdateSource,
        Status::UpdateTorn,
    ];

    /// A short, stable, human-readable name ("VMMW_OUT_OF_MEMORY").
    pub fn name(self) -> &'static str {
        self.c_name().to_str().expect("status names are ASCII")
    }

    /// The status named `name` ("VMMW_OUT_OF_MEMORY"), as [`Status::name`]
    /// spells it; `None` for a name this library does not know.
    pub fn from_name(name: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.name() == name)
    }

    /// [`Status::name`] as a static NUL-terminated string (what
    /// `vmmw_status_name` returns to C).
    pub fn c_name(self) -> &'static std::ffi::CStr {
        match self {
            Status::Ok => c"VMMW_OK",
            Status::InvalidArgument => c"VMMW_INVALID_ARGUMENT",
            Status::NullArgument => c"VMMW_NULL_ARGUMENT",
            Status::OutOfMemory => c"VMMW_OUT_OF_MEMORY",
            Status::HostOutOfMemory => c"VMMW_HOST_OUT_OF_MEMORY",
            Status::DriverUnavailable => c"VMMW_DRIVER_UNAVAILABLE",
            Status::DriverError => c"VMMW_DRIVER_ERROR",
            Status::UnknownPointer => c"VMMW_UNKNOWN_POINTER",
            Status::UnknownTag => c"VMMW_UNKNOWN_TAG",
            Status::InvalidState => c"VMMW_INVALID_STATE",
            Status::CheckpointInvalid => c"VMMW_CHECKPOINT_INVALID",
            Status::Io => c"VMMW_IO",
            Status::PlanMismatch => c"VMMW_PLAN_MISMATCH",
            Status::Cancelled => c"VMMW_CANCELLED",
            Status::Panic => c"VMMW_PANIC",
            Status::Unsupported => c"VMMW_UNSUPPORTED",
            Status::BufferTooSmall => c"VMMW_BUFFER_TOO_SMALL",
            Status::LoadInProgress => c"VMMW_LOAD_IN_PROGRESS",
            Status::ShareRefused => c"VMMW_SHARE_REFUSED",
            Status::ShareRevoked => c"VMMW_SHARE_REVOKED",
            Status::VersionMismatch => c"VMMW_VERSION_MISMATCH",
            Status::UpdateSource => c"VMMW_UPDATE_SOURCE",
            Status::UpdateTorn => c"VMMW_UPDATE_TORN",
        }
    }
}

/// Everything that can go wrong in vmmweights.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An argument is out of range or malformed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A required pointer argument was NULL (C ABI only).
    #[error("argument `{0}` must not be NULL")]
    NullArgument(&'static str),

    /// Device memory exhausted (real or simulated).
    #[error("out of device memory: {what} needs {requested} bytes, device has {free} bytes free")]
    OutOfMemory {
        /// What was being done ("segment of 4 MiB", "wake of tag 'weights'").
        what: String,
        /// Bytes that were needed.
        requested: u64,
        /// Bytes the device reported free at that moment.
        free: u64,
    },

    /// Host memory for backups or staging exhausted or over its configured limit.
    #[error("out of host memory: {what} needs {requested} bytes; limit {}, in use {in_use} bytes", limit_text(*limit))]
    HostOutOfMemory {
        /// What was being done.
        what: String,
        /// Bytes that were needed.
        requested: u64,
        /// Configured limit (u64::MAX when unlimited).
        limit: u64,
        /// Bytes already in use under that limit.
        in_use: u64,
    },

    /// No usable driver: the CUDA library is missing, no device, or the driver is too old.
    #[error("CUDA driver unavailable: {0}")]
    DriverUnavailable(String),

    /// A driver call failed.
    #[error("{call} failed: {name} ({code}){detail}")]
    Driver {
        /// The driver function that failed ("cuMemCreate").
        call: &'static str,
        /// Numeric CUDA error code (or errno on the host backend).
        code: i32,
        /// Symbolic name of the code ("CUDA_ERROR_OUT_OF_MEMORY", "ENOMEM").
        name: String,
        /// Extra context, starting with ": " when present.
        detail: String,
    },

    /// A pointer that was never handed out by this library, or was already freed.
    #[error("unknown pointer {ptr:#x}: {why}")]
    UnknownPointer {
        /// The address passed in.
        ptr: u64,
        /// "never allocated here" or "already freed".
        why: &'static str,
    },

    /// A destination's memory changed hands since it was recorded: the pool
    /// block it lay in was freed (the address is free or someone else's
    /// now), or memory outside every pool became a pool block.
    /// C status [`Status::UnknownPointer`]; nothing was written.
    #[error("{what} at {ptr:#x} changed hands since it was registered (then: {recorded}; now: {now}): nothing is written there; register the destination again to load into its new owner")]
    DestinationChanged {
        /// The destination ("destination `w`").
        what: String,
        /// Its address.
        ptr: u64,
        /// The owner recorded at registration ("block #7").
        recorded: String,
        /// The owner now ("block #9", "no pool block").
        now: String,
    },

    /// A tag that is not registered.
    #[error("unknown tag {0}")]
    UnknownTag(String),

    /// The operation is not valid in the current state.
    #[error("invalid state: {0}")]
    InvalidState(String),

    /// A checkpoint is invalid. Names the file and, where known, the tensor.
    #[error("invalid checkpoint {}{}: {reason}", file.display(), tensor.as_ref().map(|t| format!(" (tensor `{}`)", t.escape_debug())).unwrap_or_default())]
    Checkpoint {
        /// The file that is wrong.
        file: PathBuf,
        /// The tensor concerned, when one is.
        tensor: Option<String>,
        /// What is wrong, with expected and actual values.
        reason: String,
    },

    /// An I/O error on a named path.
    #[error("I/O error on {}: {source}", path.display())]
    Io {
        /// The path being read.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// The load plan does not match the destinations. The message lists every problem.
    #[error("load plan does not match the destinations:\n{0}")]
    Plan(String),

    /// The operation was cancelled by the caller.
    #[error("cancelled after {done} of {total} bytes")]
    Cancelled {
        /// Bytes completed before the cancellation was seen.
        done: u64,
        /// Bytes the operation would have moved.
        total: u64,
    },

    /// Not supported on this backend or build.
    #[error("unsupported: {0}")]
    Unsupported(String),

    /// A panic caught at the C boundary.
    #[error("internal error (panic caught at the C boundary): {0}")]
    Panic(String),

    /// A sleep was asked for a tag that a load is writing into.
    #[error("tag `{tag}` has {loads} load(s) in progress: sleep it once the load has returned, or cancel the load first (nothing was changed)")]
    LoadInProgress {
        /// The tag's name.
        tag: String,
        /// Loads writing into it.
        loads: usize,
    },

    /// A caller buffer is too small.
    #[error("buffer too small: need {needed} bytes, got {got}")]
    BufferTooSmall {
        /// Bytes needed, including any terminating NUL.
        needed: usize,
        /// Bytes provided.
        got: usize,
    },

    /// Sharing with another process was refused (see [`Status::ShareRefused`]).
    #[error("share {}: {reason}", path.display())]
    ShareRefused {
        /// The share's socket path.
        path: PathBuf,
        /// What was refused and why, with the values involved.
        reason: String,
    },

    /// The owner revoked the share (see [`Status::ShareRevoked`]).
    #[error("share {}: revoked by the owner ({reason}); detach and attach again once the owner's tag is awake", path.display())]
    ShareRevoked {
        /// The share's socket path.
        path: PathBuf,
        /// Why the owner revoked it.
        reason: String,
    },

    /// An update expected the tag at another version (see [`Status::VersionMismatch`]).
    #[error("update of tag {tag} expects version {expected}, the tag is at version {current}: nothing was written")]
    VersionMismatch {
        /// The tag's name.
        tag: String,
        /// The base version the update named.
        expected: u64,
        /// The tag's version.
        current: u64,
    },

    /// An update's source failed or ended short (see [`Status::UpdateSource`]).
    #[error("update source failed: {0}")]
    UpdateSource(String),

    /// An update left destinations mixed (see [`Status::UpdateTorn`]).
    #[error("update of tag {tag} could not finish and left its destinations holding a mix of versions (the tag is marked torn, its version stays {version}): {reason}")]
    UpdateTorn {
        /// The tag's name.
        tag: String,
        /// The version it stays at.
        version: u64,
        /// The failure, with its retry's.
        reason: String,
    },

    /// A process serving a control socket (docs/PRELOAD.md) refused a
    /// request; `status` is the code it answered with.
    #[error("control socket {}: {message}", socket.display())]
    ControlRefused {
        /// The socket the request went to.
        socket: PathBuf,
        /// The status the process named (`Status::c_name` on the wire).
        status: Status,
        /// Its reason, as it wrote it.
        message: String,
    },
}

/// A configured limit as text: "none" for `u64::MAX`.
fn limit_text(limit: u64) -> String {
    if limit == u64::MAX {
        "none".to_owned()
    } else {
        format!("{limit} bytes")
    }
}

impl Error {
    /// This error with `what` appended to its message. Its kind, and so its
    /// C status, is always kept (a device that failed stays `DriverError`, a
    /// backup over its limit `HostOutOfMemory`, a load in progress
    /// `LoadInProgress`); the few kinds without a free-text part (a
    /// cancellation, an I/O error, an unknown pointer, a load in progress, a
    /// short buffer) are returned as they are.
    pub(crate) fn with_context(self, what: &str) -> Error {
        match self {
            Error::Driver {
                call,
                code,
                name,
                detail,
            } => Error::Driver {
                call,
                code,
                name,
                detail: format!("{detail}{what}"),
            },
            Error::OutOfMemory {
                what: w,
                requested,
                free,
            } => Error::OutOfMemory {
                what: format!("{w}{what}"),
                requested,
                free,
            },
            Error::HostOutOfMemory {
                what: w,
                requested,
                limit,
                in_use,
            } => Error::HostOutOfMemory {
                what: format!("{w}{what}"),
                requested,
                limit,
                in_use,
            },
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("{m}{what}")),
            Error::InvalidState(m) => Error::InvalidState(format!("{m}{what}")),
            Error::DriverUnavailable(m) => Error::DriverUnavailable(format!("{m}{what}")),
            Error::UnknownTag(m) => Error::UnknownTag(format!("{m}{what}")),
            Error::Plan(m) => Error::Plan(format!("{m}{what}")),
            Error::Unsupported(m) => Error::Unsupported(format!("{m}{what}")),
            Error::Panic(m) => Error::Panic(format!("{m}{what}")),
            Error::Checkpoint {
                file,
                tensor,
                reason,
            } => Error::Checkpoint {
                file,
                tensor,
                reason: format!("{reason}{what}"),
            },
            Error::ShareRefused { path, reason } => Error::ShareRefused {
                path,
                reason: format!("{reason}{what}"),
            },
            Error::ShareRevoked { path, reason } => Error::ShareRevoked {
                path,
                reason: format!("{reason}{what}"),
            },
            Error::UpdateSource(m) => Error::UpdateSource(format!("{m}{what}")),
            Error::UpdateTorn {
                tag,
                version,
                reason,
            } => Error::UpdateTorn {
                tag,
                version,
                reason: format!("{reason}{what}"),
            },
            Error::ControlRefused {
                socket,
                status,
                message,
            } => Error::ControlRefused {
                socket,
                status,
                message: format!("{message}{what}"),
            },
            e @ (Error::NullArgument(_)
            | Error::UnknownPointer { .. }
            | Error::DestinationChanged { .. }
            | Error::Io { .. }
            | Error::Cancelled { .. }
            | Error::LoadInProgress { .. }
            | Error::BufferTooSmall { .. }
            | Error::VersionMismatch { .. }) => e,
        }
    }

    /// The stable C status code for this error.
    pub fn status(&self) -> Status {
        match self {
            Error::InvalidArgument(_) => Status::InvalidArgument,
            Error::NullArgument(_) => Status::NullArgument,
            Error::OutOfMemory { .. } => Status::OutOfMemory,
            Error::HostOutOfMemory { .. } => Status::HostOutOfMemory,
            Error::DriverUnavailable(_) => Status::DriverUnavailable,
            Error::Driver { .. } => Status::DriverError,
            Error::UnknownPointer { .. } | Error::DestinationChanged { .. } => {
                Status::UnknownPointer
            }
            Error::UnknownTag(_) => Status::UnknownTag,
            Error::InvalidState(_) => Status::InvalidState,
            Error::Checkpoint { .. } => Status::CheckpointInvalid,
            Error::Io { .. } => Status::Io,
            Error::Plan(_) => Status::PlanMismatch,
            Error::Cancelled { .. } => Status::Cancelled,
            Error::Unsupported(_) => Status::Unsupported,
            Error::Panic(_) => Status::Panic,
            Error::BufferTooSmall { .. } => Status::BufferTooSmall,
            Error::LoadInProgress { .. } => Status::LoadInProgress,
            Error::ShareRefused { .. } => Status::ShareRefused,
            Error::ShareRevoked { .. } => Status::ShareRevoked,
            Error::VersionMismatch { .. } => Status::VersionMismatch,
            // A refusal never carries success; a peer that sent VMMW_OK in
            // a refusal broke the protocol.
            Error::ControlRefused { status, .. } if *status == Status::Ok => Status::InvalidState,
            Error::ControlRefused { status, .. } => *status,
            Error::UpdateSource(_) => Status::UpdateSource,
            Error::UpdateTorn { .. } => Status::UpdateTorn,
        }
    }

    /// Shorthand for a checkpoint error.
    pub fn checkpoint(
        file: impl Into<PathBuf>,
        tensor: Option<&str>,
        reason: impl Into<String>,
    ) -> Error {
        Error::Checkpoint {
            file: file.into(),
            tensor: tensor.map(str::to_owned),
            reason: reason.into(),
        }
    }

    /// Shorthand for an I/O error on a path.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// True when the error means "not enough device memory" (real or simulated).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::OutOfMemory { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_numbers_are_stable() {
        // These numbers are ABI. Changing one breaks every compiled caller.
        assert_eq!(Status::Ok as i32, 0);
        assert_eq!(Status::OutOfMemory as i32, 3);
        assert_eq!(Status::DriverUnavailable as i32, 5);
        assert_eq!(Status::UnknownPointer as i32, 7);
        assert_eq!(Status::CheckpointInvalid as i32, 10);
        assert_eq!(Status::PlanMismatch as i32, 12);
        assert_eq!(Status::Panic as i32, 14);
        assert_eq!(Status::BufferTooSmall as i32, 16);
        assert_eq!(Status::LoadInProgress as i32, 17);
        assert_eq!(Status::ShareRefused as i32, 18);
        assert_eq!(Status::ShareRevoked as i32, 19);
        assert_eq!(Status::VersionMismatch as i32, 20);
        assert_eq!(Status::UpdateSource as i32, 21);
        assert_eq!(Status::UpdateTorn as i32, 22);
    }

    #[test]
    fn checkpoint_error_names_file_and_tensor() {
        let e = Error::checkpoint(
            "/m/model.safetensors",
            Some("lm_head.weight"),
            "shape [4, 2] expected [4, 3]",
        );
        let s = e.to_string();
        assert!(s.contains("/m/model.safetensors"), "{s}");
        assert!(s.contains("lm_head.weight"), "{s}");
        assert!(s.contains("expected [4, 3]"), "{s}");
        assert_eq!(e.status(), Status::CheckpointInvalid);
    }

    #[test]
    fn context_is_appended_and_the_kind_kept() {
        let e = Error::Driver {
            call: "cuMemMap",
            code: 2,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
            detail: ": 4 MiB".into(),
        }
        .with_context(" (device 1)");
        assert_eq!(e.status(), Status::DriverError);
        assert!(e.to_string().ends_with(": 4 MiB (device 1)"), "{e}");
        let e = Error::Plan("tensor `w`".into()).with_context(" (device 1)");
        assert_eq!(e.status(), Status::PlanMismatch);
        assert!(e.to_string().ends_with("(device 1)"), "{e}");
        let busy = Error::LoadInProgress {
            tag: "weights".into(),
            loads: 1,
        };
        let e = busy.with_context(" (device 1)");
        assert_eq!(e.status(), Status::LoadInProgress);
        let e = Error::Cancelled { done: 1, total: 2 }.with_context(" (device 1)");
        assert_eq!(e.status(), Status::Cancelled);
    }
}
