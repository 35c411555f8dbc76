//! Copies of one device's share of a wake of replicas, queued on two streams
//! of that device and waited for before they return (the raw backup's spans
//! here; the compressed backup's frames are decoded by the member's engine).

use crate::driver::{DevicePtr, Driver, StreamId};
use crate::error::Result;
use crate::sleep::HostSpan;

/// Queue copies on two streams of `driver`, wait for them, destroy the streams.
pub(super) fn with_streams(
    driver: &dyn Driver,
    f: impl FnOnce(&[StreamId; 2]) -> Result<u64>,
) -> Result<u64> {
    let a = driver.stream_create()?;
    let b = match driver.stream_create() {
        Ok(b) => b,
        Err(e) => {
            let _ = driver.stream_destroy(a);
            return Err(e);
        }
    };
    let streams = [a, b];
    let r = f(&streams);
    // Wait even after an error: queued copies read the backup and write memory
    // that may be unmapped next.
    let synced = streams
        .iter()
        .map(|&s| driver.stream_synchronize(s))
        .collect::<Result<Vec<()>>>();
    for s in streams {
        let _ = driver.stream_destroy(s);
    }
    let n = r?;
    synced?;
    Ok(n)
}

/// Copy `spans` of segment bytes from host memory into the segment at `dst`.
///
/// # Safety
/// The segment is mapped for every span; each span's host bytes are pinned
/// backup memory kept (busy) until the streams are synchronized.
pub(super) unsafe fn copy_spans(
    driver: &dyn Driver,
    dsts: &[DevicePtr],
    spans: &[(usize, HostSpan)],
    streams: &[StreamId; 2],
) -> Result<u64> {
    let mut n = 0u64;
    for (i, &(seg, s)) in spans.iter().enumerate() {
        // SAFETY: forwarded contract.
        unsafe {
            driver.copy_htod_async(
                dsts[seg] + s.offset as u64,
                s.host as *const u8,
                s.len,
                streams[i % 2],
            )?
        };
        n += s.len as u64;
    }
    Ok(n)
}
