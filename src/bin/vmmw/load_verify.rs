//! Checking a finished load against its files: the first and last row of
//! every unconverted extent read back from the device and compared with the
//! shard's bytes. Shared by the single- and multi-device load benchmarks.

use vmmweights::loader::ExecutedPlan;
use vmmweights::{Driver, Error, Result};

/// How many rows were read back; an error names the first row that differs.
pub fn verify(d: &dyn Driver, ex: &ExecutedPlan) -> Result<usize> {
    let ck = ex.checkpoint();
    let mut n = 0;
    // A packed file's rows are decoded on the host, a whole frame for each:
    // every 16th extent of one (`bench-load --same-as` compares every byte).
    let step = if ck.is_packed() { 16 } else { 1 };
    for e in ex
        .plan()
        .extents
        .iter()
        .filter(|e| e.convert.is_none())
        .step_by(step)
    {
        let shard = &ck.shards[e.shard as usize];
        for r in [0, e.height - 1] {
            let len = e.width.min(1 << 16) as usize;
            let src = (e.src + r * e.src_pitch) as usize;
            let mut got = vec![0u8; len];
            // SAFETY: a row of a loaded destination; `got` has `len` bytes.
            unsafe {
                d.copy_dtoh_async(
                    got.as_mut_ptr(),
                    e.dst + r * e.dst_pitch,
                    len,
                    vmmweights::driver::StreamId::DEFAULT,
                )
            }?;
            d.synchronize()?;
            // The file's bytes (a packed file's decoded on the host).
            let mut want = vec![0u8; len];
            shard.read_original(src as u64, &mut want)?;
            if got != want {
                return Err(Error::InvalidState(format!(
                    "verify: device bytes at {:#x} differ from {} byte {src}",
                    e.dst + r * e.dst_pitch,
                    shard.path.display()
                )));
            }
            n += 1;
        }
    }
    Ok(n)
}
