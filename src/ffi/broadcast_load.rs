//! A checkpoint load across the ranks of an NCCL communicator from C:
//! reader ranks stream the files into the broadcast ring, every rank
//! applies through its loader's rules (`update::transport::broadcast_load`).

use super::boundary::{arg, call_out, slice_arg};
use super::error::vmmw_error_t;
use super::loader::vmmw_loader_t;
use super::pool::vmmw_pool_t;
use super::status::vmmw_status_t;
use super::transport::{ring_options, vmmw_nccl_comm_t};
use super::update::vmmw_update_result_t;
use crate::error::Error;
use crate::update::transport::broadcast::{BroadcastOptions, Ring};
use crate::update::transport::broadcast_load::{
    self, BroadcastLoad, BroadcastLoadReport, LOAD_SLOTS,
};

/// What a broadcast load did on this rank (from `vmmw_load_broadcast`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct vmmw_broadcast_load_result_t {
    /// The destinations' side: the tag, its new version, bytes written.
    pub update: vmmw_update_result_t,
    /// Buckets broadcast, by every reader.
    pub buckets: u64,
    /// Bytes of checkpoint data broadcast, by every reader.
    pub bytes: u64,
    /// Files this rank read.
    pub files_read: u64,
    /// Bytes this rank read from them.
    pub bytes_read: u64,
}

impl From<&BroadcastLoadReport> for vmmw_broadcast_load_result_t {
    fn from(r: &BroadcastLoadReport) -> Self {
        vmmw_broadcast_load_result_t {
            update: vmmw_update_result_t::from(&r.update),
            buckets: r.buckets,
            bytes: r.bytes,
            files_read: r.files_read,
            bytes_read: r.bytes_read,
        }
    }
}

/// Load the checkpoint `loader` opened into its destinations in `pool`
/// (allocated and registered first, as for `vmmw_loader_load`), its files
/// read by the `n_readers` ranks at `readers` (each a contiguous run of the
/// files, about the same bytes each) and broadcast to every rank of `comm`
/// in buckets of `slot_bytes` (0 = 256 MiB) through a ring of three buffers
/// in `pool` (a reader reads one bucket while the one before is broadcast). Every rank calls it with the same readers and `slot_bytes`; each
/// applies every bucket through its loader's rules (a tensor-parallel rank
/// keeps its slices). Every rank opens the checkpoint; only readers read
/// its tensor data. Each broadcast is waited for at most `timeout_ms`
/// (0 = 300 s). The tag's version moves by one; the load becomes the
/// loader's last result (`vmmw_loader_result_json`) and the checkpoint the
/// tag's reload source, as after `vmmw_loader_load`.
///
/// `stage` = 0: destinations are written as buckets land; a load that fails
/// midway leaves them partly written, the tag marked torn
/// (`vmmw_pool_tag_torn`) and its version unchanged (`VMMW_UPDATE_TORN`).
/// `stage` = 1: buckets land in scratch device memory the size of the
/// destinations first; a failed load leaves them untouched.
///
/// Errors (on every rank alike, the ranks' problems listed in one message):
/// - `VMMW_NULL_ARGUMENT`: `comm`, `loader`, `pool` or `out` is NULL, or
///   `readers` is NULL with `n_readers` above 0.
/// - `VMMW_INVALID_ARGUMENT`: `stage` is not 0 or 1; `slot_bytes` of 1024
///   or less (each bucket carries its reader's status in 1024 bytes).
/// - `VMMW_UPDATE_SOURCE`: refused before any byte moved (no reader, a
///   reader not in the world or listed twice, ranks whose checkpoints,
///   readers or slot sizes differ, a plan that does not match a rank's
///   destinations); a reader could not read its files; the broadcast failed
///   (NCCL's error, a rank gone, a timeout). Nothing written when staged or
///   before the first bucket.
/// - `VMMW_UPDATE_TORN`: not staged, it failed once buckets had landed.
/// - `VMMW_OUT_OF_MEMORY`: the ring does not fit.
///
/// # Safety
/// `comm`, `loader` and `pool` are live handles; `readers` is readable for
/// `n_readers` elements; `out` is writable; `error` is NULL or writable.
/// The communicator is used by one call at a time (calls serialize on it).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn vmmw_load_broadcast(
    comm: *mut vmmw_nccl_comm_t,
    loader: *mut vmmw_loader_t,
    pool: *mut vmmw_pool_t,
    readers: *const u32,
    n_readers: usize,
    slot_bytes: u64,
    timeout_ms: u64,
    stage: u32,
    out: *mut vmmw_broadcast_load_result_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let c = unsafe { arg(comm.cast_const(), "comm") }?;
        // SAFETY: forwarded contract.
        let l = unsafe { arg(loader.cast_const(), "loader") }?;
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool.cast_const(), "pool") }?;
        // SAFETY: forwarded contract.
        let readers = unsafe { slice_arg(readers, n_readers, "readers") }?;
        let stage = match stage {
            0 => false,
            1 => true,
            s => {
                return Err(Error::InvalidArgument(format!(
                    "stage {s} (0 or 1 accepted)"
                )))
            }
        };
        let shape = BroadcastOptions {
            slots: LOAD_SLOTS,
            ..ring_options(slot_bytes, timeout_ms)?
        };
        let ring = Ring::new(p.pool.clone(), &shape)?;
        let opts = BroadcastLoad {
            readers: readers.iter().map(|&r| r as usize).collect(),
            stage,
        };
        let mut coll = c.coll.lock().unwrap_or_else(|p| p.into_inner());
        let r = broadcast_load::load(&mut *coll, &ring, &l.session, &p.pool, &opts)?;
        Ok(vmmw_broadcast_load_result_t::from(&r))
    })
}
