//! The status codes as C constants (`VMMW_OK`, ...) and their names.
//!
//! [`Status`] is the single source of the numbers and names; the constants
//! repeat the numbers as literals only because cbindgen copies literals into
//! the header, and a test checks each one against [`Status`].

use std::ffi::c_char;

use crate::error::Status;

/// A status code: `VMMW_OK` (0) or one of the `VMMW_*` error codes below.
/// Every fallible function returns one. The numbers never change; a retired
/// code keeps its number, listed here as a comment, and is never reused.
/// Treat a number this header does not define as an error (a newer library
/// may return codes added after the header was made).
pub type vmmw_status_t = i32;

/// Success.
pub const VMMW_OK: vmmw_status_t = 0;
/// An argument was out of range or malformed.
pub const VMMW_INVALID_ARGUMENT: vmmw_status_t = 1;
/// A required pointer argument was NULL.
pub const VMMW_NULL_ARGUMENT: vmmw_status_t = 2;
/// The device (or the simulated device) has not enough free memory.
pub const VMMW_OUT_OF_MEMORY: vmmw_status_t = 3;
/// Host memory (pinned backup, staging) could not be allocated or exceeds its limit.
pub const VMMW_HOST_OUT_OF_MEMORY: vmmw_status_t = 4;
/// No usable CUDA driver or device.
pub const VMMW_DRIVER_UNAVAILABLE: vmmw_status_t = 5;
/// A CUDA driver call failed; the error message names the call.
pub const VMMW_DRIVER_ERROR: vmmw_status_t = 6;
/// A pointer that this library did not hand out, or one already freed; also a
/// loader destination whose pool block was freed since it was registered
/// (its address may now belong to a new block: nothing is written there).
pub const VMMW_UNKNOWN_POINTER: vmmw_status_t = 7;
/// A tag name or id that is not registered, or (sleep, wake) not known to the pool.
pub const VMMW_UNKNOWN_TAG: vmmw_status_t = 8;
/// The operation is not valid in the current state.
pub const VMMW_INVALID_STATE: vmmw_status_t = 9;
/// A checkpoint file is truncated, corrupt or otherwise invalid.
pub const VMMW_CHECKPOINT_INVALID: vmmw_status_t = 10;
/// An operating-system I/O error.
pub const VMMW_IO: vmmw_status_t = 11;
/// The load plan does not match the destinations.
pub const VMMW_PLAN_MISMATCH: vmmw_status_t = 12;
/// The operation was cancelled by the caller.
pub const VMMW_CANCELLED: vmmw_status_t = 13;
/// A panic was caught at the C boundary; the library state may be inconsistent.
pub const VMMW_PANIC: vmmw_status_t = 14;
/// Not supported by this backend or build.
pub const VMMW_UNSUPPORTED: vmmw_status_t = 15;
/// A caller-provided buffer is too small; `*needed` holds the size required.
pub const VMMW_BUFFER_TOO_SMALL: vmmw_status_t = 16;
/// A load is writing into the tag: sleep it once the load has returned (or cancel the load).
pub const VMMW_LOAD_IN_PROGRESS: vmmw_status_t = 17;
/// Sharing across processes was refused: the peer is not allowed, the manifest
/// is malformed, or the owner refused the attach (its tag asleep); the message says which.
pub const VMMW_SHARE_REFUSED: vmmw_status_t = 18;
/// The owner revoked a share (it slept the tag under the revoke policy):
/// detach, then attach again once the owner's tag is awake.
pub const VMMW_SHARE_REVOKED: vmmw_status_t = 19;
/// An update named a base version the tag is not at: read the tag's version
/// (`vmmw_tag_version`) and send the update again. Nothing was written.
pub const VMMW_VERSION_MISMATCH: vmmw_status_t = 20;
/// An update's source failed or ended before delivering every byte: no
/// destination was written.
pub const VMMW_UPDATE_SOURCE: vmmw_status_t = 21;
/// An update wrote destinations and could not finish, also on its retry: they
/// hold a mix of versions, the tag is marked torn and its version did not
/// move. Update again to repair.
pub const VMMW_UPDATE_TORN: vmmw_status_t = 22;

// Retired codes keep their number here as a comment and are never reused
// (docs/ABI.md), e.g. `// 99: VMMW_EXAMPLE, retired in 1.3: why`. None yet.

/// The static name of a status code ("VMMW_OUT_OF_MEMORY"), or
/// "VMMW_UNKNOWN_STATUS" for a number this library does not define.
///
/// Never NULL; the string is static (never free it). Thread-safe.
///
/// Errors: none. A number this library does not define gives
/// "VMMW_UNKNOWN_STATUS".
#[no_mangle]
pub extern "C" fn vmmw_status_name(status: vmmw_status_t) -> *const c_char {
    usize::try_from(status)
        .ok()
        .and_then(|i| Status::ALL.get(i))
        .map_or(c"VMMW_UNKNOWN_STATUS", |s| s.c_name())
        .as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn constants_match_the_status_enum() {
        let consts = [
            VMMW_OK,
            VMMW_INVALID_ARGUMENT,
            VMMW_NULL_ARGUMENT,
            VMMW_OUT_OF_MEMORY,
            VMMW_HOST_OUT_OF_MEMORY,
            VMMW_DRIVER_UNAVAILABLE,
            VMMW_DRIVER_ERROR,
            VMMW_UNKNOWN_POINTER,
            VMMW_UNKNOWN_TAG,
            VMMW_INVALID_STATE,
            VMMW_CHECKPOINT_INVALID,
            VMMW_IO,
            VMMW_PLAN_MISMATCH,
            VMMW_CANCELLED,
            VMMW_PANIC,
            VMMW_UNSUPPORTED,
            VMMW_BUFFER_TOO_SMALL,
            VMMW_LOAD_IN_PROGRESS,
            VMMW_SHARE_REFUSED,
            VMMW_SHARE_REVOKED,
            VMMW_VERSION_MISMATCH,
            VMMW_UPDATE_SOURCE,
            VMMW_UPDATE_TORN,
        ];
        for (i, (c, s)) in consts.iter().zip(Status::ALL).enumerate() {
            assert_eq!(*c, s as i32, "{}", s.name());
            assert_eq!(i as i32, s as i32, "ALL must be in numeric order");
        }
    }

    #[test]
    fn names_match_the_rust_names() {
        for s in Status::ALL {
            // SAFETY: vmmw_status_name returns a static NUL-terminated string.
            let c = unsafe { CStr::from_ptr(vmmw_status_name(s as i32)) };
            assert_eq!(c.to_str().unwrap(), s.name());
        }
        for bad in [-1, 23, i32::MAX, i32::MIN] {
            // SAFETY: as above.
            let c = unsafe { CStr::from_ptr(vmmw_status_name(bad)) };
            assert_eq!(c.to_str().unwrap(), "VMMW_UNKNOWN_STATUS");
        }
    }
}
