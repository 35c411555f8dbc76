//! `vmmw demo`: the smallest end-to-end run of the library on whichever backend
//! is available. Allocates a few segments, writes and verifies them, unmaps and
//! remaps one (as sleep/wake will) to show its pointer is stable, frees
//! everything and reports. Any error or mismatch exits non-zero.

use std::sync::Arc;

use vmmweights::driver::StreamId;
use vmmweights::{DevicePtr, Driver, Error, Result, Segment};

use crate::backend::BackendArgs;

/// Options of `vmmw demo`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    backend: BackendArgs,
}

const MIB: usize = 1 << 20;

/// (name, bytes asked for, chunk size; 0 = one chunk)
const SEGMENTS: [(&str, usize, usize); 3] = [
    ("small", MIB + 1, 0),
    ("medium", 20 * MIB, 0),
    ("chunked", 64 * MIB, 8 * MIB),
];

pub fn run(args: Args) -> Result<()> {
    let opened = args.backend.open()?;
    let d = opened.driver;
    println!("backend: {} ({})", d.kind(), d.describe());
    println!("  why:   {}", opened.reason);
    let free_before = d.mem_info()?.free;

    let mut segs = Vec::new();
    let mut verified = 0usize;
    for (i, &(name, size, chunk)) in SEGMENTS.iter().enumerate() {
        let seg = Segment::allocate(d.clone(), size, chunk)?;
        write_and_verify(&d, name, seg.ptr(), seg.reserved(), i as u64 + 1)?;
        verified += seg.reserved();
        println!(
            "segment {name:8} asked {size:>9} B -> {:>4} MiB at {:#x} in {} chunk(s), written and read back",
            seg.reserved() / MIB,
            seg.ptr(),
            seg.chunks().len()
        );
        segs.push(seg);
    }

    // A sleep-like cycle on the chunked segment: release its memory, keep its VA.
    let seg = segs.last_mut().expect("SEGMENTS is not empty");
    let ptr = seg.ptr();
    d.synchronize()?; // nothing queued may touch memory being unmapped
    let free_awake = d.mem_info()?.free;
    seg.unmap_all()?;
    let free_asleep = d.mem_info()?.free;
    println!(
        "unmap_all: {} MiB mapped, device free memory +{} MiB, pointer kept at {ptr:#x}",
        seg.mapped_bytes() / MIB,
        free_asleep.saturating_sub(free_awake) >> 20
    );
    seg.map_all()?;
    if seg.ptr() != ptr {
        return Err(Error::InvalidState(format!(
            "pointer moved across unmap/map: {ptr:#x} -> {:#x}",
            seg.ptr()
        )));
    }
    // Contents after a remap are undefined (discard): write and verify again.
    write_and_verify(&d, "chunked (remapped)", ptr, seg.reserved(), 99)?;
    verified += seg.reserved();
    println!(
        "map_all:   {} MiB mapped again at the same pointer {ptr:#x}, written and read back",
        seg.mapped_bytes() / MIB
    );

    let reserved: usize = segs.iter().map(|s| s.reserved()).sum();
    let count = segs.len();
    drop(segs);
    let free_after = d.mem_info()?.free;
    if let Some(h) = d.as_host() {
        let c = h.counts();
        if c.reservations + c.handles + c.mappings != 0 {
            return Err(Error::InvalidState(format!(
                "host backend objects left after freeing every segment: {c:?}"
            )));
        }
    }
    println!("report:");
    println!("  backend            {}", d.kind());
    println!(
        "  segments           {count}, {} MiB reserved and mapped",
        reserved / MIB
    );
    println!(
        "  verified           {} MiB written and read back",
        verified / MIB
    );
    println!("  pointer stable     yes, across unmap_all/map_all");
    println!(
        "  device free memory {} MiB before, {} MiB after ({})",
        free_before >> 20,
        free_after >> 20,
        if free_after == free_before {
            "all returned".to_owned()
        } else {
            format!("{:+} B", free_after as i128 - free_before as i128)
        }
    );
    println!("demo: OK");
    Ok(())
}

/// Deterministic bytes, different per seed.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = vec![0u8; len.next_multiple_of(8)];
    for w in v.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

fn write_and_verify(
    d: &Arc<dyn Driver>,
    name: &str,
    ptr: DevicePtr,
    len: usize,
    seed: u64,
) -> Result<()> {
    let data = pattern(len, seed);
    let mut back = vec![0u8; len];
    // SAFETY: [ptr, ptr+len) is a mapped, accessible segment; both host buffers
    // live until the stream is synchronized below.
    unsafe {
        d.copy_htod_async(ptr, data.as_ptr(), len, StreamId::DEFAULT)?;
        d.copy_dtoh_async(back.as_mut_ptr(), ptr, len, StreamId::DEFAULT)?;
    }
    d.stream_synchronize(StreamId::DEFAULT)?;
    if let Some(i) = data.iter().zip(&back).position(|(a, b)| a != b) {
        return Err(Error::InvalidState(format!(
            "segment {name}: byte {i} at {:#x} reads {:#04x}, wrote {:#04x}",
            ptr + i as u64,
            back[i],
            data[i]
        )));
    }
    Ok(())
}
