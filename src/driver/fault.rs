//! Fault injection shared by both backends and by the loader's file reads:
//! a table of armed failures, one counter per step, checked before the step
//! does anything.
//!
//! Tests arm it through [`Testing::faults`](super::testing::Testing::faults) (or the host
//! backend's `fail_nth`, which forwards here). Nothing arms it outside tests,
//! and an unarmed table costs one relaxed atomic load per check.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::error::Error;

/// Which step an injected failure hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultOp {
    /// `reserve`.
    Reserve,
    /// `create` (fails as out-of-memory, like `CUDA_ERROR_OUT_OF_MEMORY`).
    Create,
    /// `map`.
    Map,
    /// `set_access` and `set_access_peers`.
    SetAccess,
    /// `unmap` (fails before anything is unmapped).
    Unmap,
    /// `release` (fails before the handle is released).
    Release,
    /// `copy_dtoh_async`, before any byte is copied.
    CopyDtoh,
    /// `memset_async`, before any byte is written.
    Memset,
    /// `convert_async`, before any element is written.
    Convert,
    /// `host_register` (pinning host memory).
    HostRegister,
    /// `synchronize` (as a device that refuses to synchronize).
    Synchronize,
    /// Host-to-device copies (`copy_htod_async`, `copy_2d_htod_async`), before any byte is copied.
    CopyHtod,
    /// Peer copies (`copy_peer_async`).
    CopyPeer,
    /// Copies within one device (`copy_2d_dtod_async`), before any byte is copied.
    CopyDtod,
    /// `hash_ranges`, before any byte is read.
    Hash,
    /// `codec_encode` and `codec_decode_async`, before any byte is written.
    Codec,
    /// The loader's reads of checkpoint bytes (outside the driver): each
    /// `pread` run and each copy run from the file's mapping into a staging
    /// slot, each direct window before it is registered or copied from, and
    /// each checksum read. Fails as `EIO`, before anything is read.
    FileRead,
}

#[derive(Debug, Default)]
struct Table {
    /// Op -> calls left until the armed one (1 = the next call fails).
    nth: HashMap<FaultOp, u64>,
    /// Ops that fail on every call until cleared (a device gone bad).
    always: HashSet<FaultOp>,
    /// Op -> calls left until the one that succeeds but flips a bit of what
    /// it wrote (a corrupt transfer; the host backend's copies honour it).
    corrupt: HashMap<FaultOp, u64>,
}

/// The armed failures of one driver.
#[derive(Debug, Default)]
pub struct Faults {
    /// True while anything is armed: the fast path's only read.
    armed: AtomicBool,
    table: Mutex<Table>,
}

impl Faults {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn rearm(&self, t: &Table) {
        self.armed.store(
            !t.nth.is_empty() || !t.always.is_empty() || !t.corrupt.is_empty(),
            Ordering::SeqCst,
        );
    }

    /// Make the `n`-th next call of `op` fail (1 = the very next one). 0 clears it.
    pub fn fail_nth(&self, op: FaultOp, n: u64) {
        let mut t = self.table();
        if n == 0 {
            t.nth.remove(&op);
        } else {
            t.nth.insert(op, n);
        }
        self.rearm(&t);
    }

    /// Make the `n`-th next call of `op` succeed with one bit of what it
    /// wrote flipped (1 = the very next one). 0 clears it.
    pub fn corrupt_nth(&self, op: FaultOp, n: u64) {
        let mut t = self.table();
        if n == 0 {
            t.corrupt.remove(&op);
        } else {
            t.corrupt.insert(op, n);
        }
        self.rearm(&t);
    }

    /// Count one call of `op` for [`Faults::corrupt_nth`]; true when this
    /// call must corrupt what it writes.
    pub fn take_corrupt(&self, op: FaultOp) -> bool {
        if !self.armed.load(Ordering::Relaxed) {
            return false;
        }
        let mut t = self.table();
        let fire = match t.corrupt.get_mut(&op) {
            Some(n) => {
                *n -= 1;
                *n == 0
            }
            None => false,
        };
        if fire {
            t.corrupt.remove(&op);
            self.rearm(&t);
        }
        fire
    }

    /// Make every call of `op` fail until [`Faults::clear`].
    pub fn fail_always(&self, op: FaultOp) {
        let mut t = self.table();
        t.always.insert(op);
        self.rearm(&t);
    }

    /// True while an injected failure of `op` armed with `fail_nth` has not fired yet.
    pub fn pending(&self, op: FaultOp) -> bool {
        self.table().nth.contains_key(&op)
    }

    /// Clear every injected failure.
    pub fn clear(&self) {
        let mut t = self.table();
        t.nth.clear();
        t.always.clear();
        t.corrupt.clear();
        self.rearm(&t);
    }

    /// Count one call of `op`; true when it must fail.
    #[inline]
    pub fn take(&self, op: FaultOp) -> bool {
        if !self.armed.load(Ordering::Relaxed) {
            return false;
        }
        self.take_armed(op)
    }

    #[cold]
    fn take_armed(&self, op: FaultOp) -> bool {
        let mut t = self.table();
        if t.always.contains(&op) {
            return true;
        }
        let fire = match t.nth.get_mut(&op) {
            Some(n) => {
                *n -= 1;
                *n == 0
            }
            None => false,
        };
        if fire {
            t.nth.remove(&op);
            self.rearm(&t);
        }
        fire
    }

    /// `Err(injected(call))` when this call of `op` must fail.
    #[inline]
    pub fn check(&self, op: FaultOp, call: &'static str) -> crate::error::Result<()> {
        if self.take(op) {
            Err(injected(call))
        } else {
            Ok(())
        }
    }
}

/// The error an injected driver failure returns.
pub fn injected(call: &'static str) -> Error {
    Error::Driver {
        call,
        code: -1,
        name: "injected failure".to_owned(),
        detail: ": fault injection".to_owned(),
    }
}

/// The OS error an injected file-read failure returns (`EIO`).
pub fn injected_read() -> std::io::Error {
    std::io::Error::other("injected read failure (fault injection): EIO")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nth_fires_once_then_disarms() {
        let f = Faults::default();
        assert!(!f.take(FaultOp::Map));
        f.fail_nth(FaultOp::Map, 2);
        assert!(f.pending(FaultOp::Map));
        assert!(!f.take(FaultOp::Map));
        assert!(!f.take(FaultOp::Unmap));
        assert!(f.take(FaultOp::Map));
        assert!(!f.pending(FaultOp::Map));
        assert!(!f.armed.load(Ordering::SeqCst));
        assert!(!f.take(FaultOp::Map));
    }

    #[test]
    fn always_fires_until_cleared() {
        let f = Faults::default();
        f.fail_always(FaultOp::FileRead);
        assert!(f.take(FaultOp::FileRead));
        assert!(f.take(FaultOp::FileRead));
        assert!(f.check(FaultOp::FileRead, "read").is_err());
        f.clear();
        assert!(!f.take(FaultOp::FileRead));
        assert!(!f.armed.load(Ordering::SeqCst));
    }
}
