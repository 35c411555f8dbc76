//! Copies, fills, conversions and hashes: done at once with `memcpy` and the
//! CPU reference code, so every "async" call has completed when it returns.
//! Each `unsafe fn` has the safety contract of the `Driver` method it backs.

use super::interconnect::range_allows;
use super::HostDriver;
use crate::codec::{self, Layout};
use crate::driver::fault::FaultOp;
use crate::driver::{hash, AccessMode, ConvertType, DevicePtr};
use crate::error::{Error, Result};

pub(super) unsafe fn copy_htod_async(
    d: &HostDriver,
    dst: DevicePtr,
    src: *const u8,
    len: usize,
) -> Result<()> {
    d.copy_fault(FaultOp::CopyHtod, "copy_htod")?;
    // SAFETY: the caller guarantees both ranges are valid for `len` bytes.
    unsafe { std::ptr::copy_nonoverlapping(src, dst as *mut u8, len) };
    if len > 0 && d.faults.take_corrupt(FaultOp::CopyHtod) {
        // SAFETY: inside the destination just written.
        unsafe { *(dst as *mut u8).add(len / 2) ^= 0x10 };
    }
    Ok(())
}

pub(super) unsafe fn copy_peer_async(
    d: &HostDriver,
    dst: DevicePtr,
    src: DevicePtr,
    src_device: i32,
    len: usize,
) -> Result<()> {
    d.copy_fault(FaultOp::CopyPeer, "copy_peer")?;
    if !range_allows(dst, len, d.device, d.device, AccessMode::ReadWrite) {
        return Err(Error::InvalidArgument(format!(
            "copy_peer: destination [{dst:#x}, +{len}) is not mapped memory of device {}",
            d.device
        )));
    }
    if !range_allows(src, len, src_device, d.device, AccessMode::Read) {
        return Err(Error::InvalidState(format!(
            "copy_peer: device {} may not read [{src:#x}, +{len}) of device {src_device}: \
             grant it access first (set_access_peers / Pool::set_peer_access)",
            d.device
        )));
    }
    // SAFETY: both ranges are mapped and accessible (checked above), and
    // distinct devices' memory never overlaps.
    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) };
    Ok(())
}

pub(super) unsafe fn copy_dtoh_async(
    d: &HostDriver,
    dst: *mut u8,
    src: DevicePtr,
    len: usize,
) -> Result<()> {
    d.copy_fault(FaultOp::CopyDtoh, "copy_dtoh")?;
    // SAFETY: the caller guarantees both ranges are valid for `len` bytes.
    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst, len) };
    if len > 0 && d.faults.take_corrupt(FaultOp::CopyDtoh) {
        // SAFETY: inside the destination just written.
        unsafe { *dst.add(len / 2) ^= 0x10 };
    }
    Ok(())
}

pub(super) unsafe fn hash_ranges(
    d: &HostDriver,
    ranges: &[(DevicePtr, usize)],
) -> Result<Vec<u64>> {
    d.copy_fault(FaultOp::Hash, "hash_ranges")?;
    // Tile by tile, as the kernel sums them.
    let mut sums = vec![0u64; ranges.len()];
    for t in hash::tiles(ranges) {
        // SAFETY: the caller guarantees every range is mapped and readable.
        let bytes = unsafe { std::slice::from_raw_parts(t.ptr as *const u8, t.len as usize) };
        let s = &mut sums[t.out as usize];
        *s = s.wrapping_add(hash::sum(bytes, t.word0));
    }
    Ok(sums
        .iter()
        .zip(ranges)
        .map(|(&s, &(_, len))| hash::finish(s, len))
        .collect())
}

pub(super) unsafe fn copy_2d_htod_async(
    d: &HostDriver,
    dst: DevicePtr,
    dst_pitch: usize,
    src: *const u8,
    src_pitch: usize,
    width: usize,
    height: usize,
) -> Result<()> {
    d.copy_fault(FaultOp::CopyHtod, "copy_2d_htod")?;
    if width > dst_pitch || width > src_pitch {
        return Err(Error::InvalidArgument(format!(
            "copy_2d: width {width} exceeds a pitch (dst {dst_pitch}, src {src_pitch})"
        )));
    }
    for row in 0..height {
        // SAFETY: the caller guarantees every row is valid in both ranges.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.add(row * src_pitch),
                (dst as *mut u8).add(row * dst_pitch),
                width,
            )
        };
    }
    Ok(())
}

/// The bytes `[start, start + (height - 1) * pitch + width)` a 2D copy
/// touches on one side; None when it overflows.
fn span_2d(start: u64, pitch: usize, width: usize, height: usize) -> Option<(u64, usize)> {
    let len = (height.checked_sub(1)?)
        .checked_mul(pitch)?
        .checked_add(width)?;
    start.checked_add(len as u64)?;
    Some((start, len))
}

#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn copy_2d_dtod_async(
    d: &HostDriver,
    dst: DevicePtr,
    dst_pitch: usize,
    src: DevicePtr,
    src_pitch: usize,
    width: usize,
    height: usize,
) -> Result<()> {
    d.copy_fault(FaultOp::CopyDtod, "copy_2d_dtod")?;
    if height == 0 || width == 0 {
        return Ok(());
    }
    if height > 1 && (width > dst_pitch || width > src_pitch) {
        return Err(Error::InvalidArgument(format!(
            "copy_2d_dtod: width {width} exceeds a pitch (dst {dst_pitch}, src {src_pitch})"
        )));
    }
    let (Some((d0, dl)), Some((s0, sl))) = (
        span_2d(dst, dst_pitch, width, height),
        span_2d(src, src_pitch, width, height),
    ) else {
        return Err(Error::InvalidArgument(format!(
            "copy_2d_dtod: {height} rows of {width} bytes overflow the address space"
        )));
    };
    // A GPU faults on unmapped memory; the twin refuses it instead.
    if !range_allows(d0, dl, d.device, d.device, AccessMode::ReadWrite) {
        return Err(Error::InvalidArgument(format!(
            "copy_2d_dtod: destination [{d0:#x}, +{dl}) is not mapped memory of device {}",
            d.device
        )));
    }
    if !range_allows(s0, sl, d.device, d.device, AccessMode::Read) {
        return Err(Error::InvalidArgument(format!(
            "copy_2d_dtod: source [{s0:#x}, +{sl}) is not mapped memory of device {}",
            d.device
        )));
    }
    for row in 0..height as u64 {
        // SAFETY: both spans are mapped memory of this device (checked
        // above); the caller guarantees they do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (src + row * src_pitch as u64) as *const u8,
                (dst + row * dst_pitch as u64) as *mut u8,
                width,
            )
        };
    }
    Ok(())
}

pub(super) unsafe fn memset_async(
    d: &HostDriver,
    dst: DevicePtr,
    value: u8,
    len: usize,
) -> Result<()> {
    d.copy_fault(FaultOp::Memset, "memset")?;
    // SAFETY: the caller guarantees the range is mapped and writable.
    unsafe { std::ptr::write_bytes(dst as *mut u8, value, len) };
    Ok(())
}

pub(super) unsafe fn convert_async(
    d: &HostDriver,
    dst: DevicePtr,
    to: ConvertType,
    src: DevicePtr,
    from: ConvertType,
    count: usize,
) -> Result<()> {
    d.copy_fault(FaultOp::Convert, "convert")?;
    // SAFETY: the caller guarantees both ranges are valid, sized for `count`
    // elements of their types, and do not overlap.
    unsafe {
        crate::driver::convert::convert_on_cpu(dst as *mut u8, to, src as *const u8, from, count)
    };
    Ok(())
}

pub(super) unsafe fn codec_encode(
    d: &HostDriver,
    src: DevicePtr,
    len: usize,
    layout: Layout,
    dst: DevicePtr,
) -> Result<usize> {
    d.copy_fault(FaultOp::Codec, "codec_encode")?;
    // SAFETY: the caller guarantees `src..+len` is mapped and readable.
    let raw = unsafe { std::slice::from_raw_parts(src as *const u8, len) };
    let frame = codec::encode(raw, layout);
    debug_assert!(frame.len() <= codec::format::max_frame_bytes(len));
    // SAFETY: the caller guarantees room for the largest frame at `dst`,
    // which overlaps neither `src` nor anything else.
    unsafe { std::ptr::copy_nonoverlapping(frame.as_ptr(), dst as *mut u8, frame.len()) };
    Ok(frame.len())
}

pub(super) unsafe fn codec_decode(
    d: &HostDriver,
    frame: DevicePtr,
    frame_len: usize,
    dst: DevicePtr,
    raw_len: usize,
    status: DevicePtr,
) -> Result<()> {
    d.copy_fault(FaultOp::Codec, "codec_decode")?;
    // SAFETY: the caller guarantees the three ranges are mapped, the frame
    // readable, the output and status writable, none overlapping.
    let (frame, out) = unsafe {
        (
            std::slice::from_raw_parts(frame as *const u8, frame_len),
            std::slice::from_raw_parts_mut(dst as *mut u8, raw_len),
        )
    };
    if let Err(e) = codec::decode(frame, out) {
        let bad = e.block.unwrap_or(0) as u32;
        // SAFETY: the status word is mapped, writable and 4-aligned (the
        // caller's contract); no other thread writes it during the call.
        unsafe {
            let s = status as *mut u32;
            *s = (*s).min(bad);
        }
    }
    Ok(())
}
