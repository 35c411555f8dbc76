//! Queuing one piece's host-to-device copy (1D or 2D), shared by the direct
//! and staged paths.

use crate::driver::{Driver, StreamId};
use crate::error::Result;
use crate::loader::plan::Extent;

/// Queue the copy of one piece whose rows are at `src` with `src_pitch`.
///
/// # Safety
/// `src` must stay valid until the stream passes the copy; the destination is
/// a validated plan extent.
pub(super) unsafe fn issue(
    d: &dyn Driver,
    p: &Extent,
    src: *const u8,
    src_pitch: u64,
    stream: StreamId,
) -> Result<()> {
    if p.height == 1 {
        // SAFETY: forwarded.
        unsafe { d.copy_htod_async(p.dst, src, p.width as usize, stream) }
    } else {
        // SAFETY: forwarded.
        unsafe {
            d.copy_2d_htod_async(
                p.dst,
                p.dst_pitch as usize,
                src,
                src_pitch as usize,
                p.width as usize,
                p.height as usize,
                stream,
            )
        }
    }
}
