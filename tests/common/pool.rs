//! Helpers shared by the pool tests: a host driver with small sizes, a tiny
//! deterministic RNG, and a byte pattern to prove blocks do not overlap in memory.
#![allow(dead_code)]

use std::sync::Arc;

use vmmweights::driver::host::{HostConfig, HostDriver};
use vmmweights::{BackendChoice, Driver, Pool, PoolConfig};

/// Granularity used by these tests: 64 KiB, so segments stay small.
pub const G: usize = 64 << 10;

pub fn host(limit: u64) -> Arc<HostDriver> {
    Arc::new(HostDriver::new(HostConfig {
        granularity: G,
        memory_limit: limit,
    }))
}

pub fn dyn_driver(h: &Arc<HostDriver>) -> Arc<dyn Driver> {
    h.clone()
}

/// Small segment sizes matching `G`.
pub fn small_config() -> PoolConfig {
    PoolConfig {
        small_request_max: 8 << 10,
        small_segment_bytes: G,
        large_segment_bytes: 4 * G,
        ..PoolConfig::default()
    }
}

/// Pools on several devices for the tests that run on GPUs with
/// `VMMW_BACKEND=cuda` and on simulated devices otherwise. On cuda: every
/// device that opens, at most `max`, default pool sizes; `None` after a SKIP
/// line naming `test` when fewer than two open or two cannot reach each
/// other. Otherwise `simulated` host devices with [`small_config`]. The flag
/// says which backend it is.
pub fn device_pools(test: &str, max: usize, simulated: usize) -> Option<(Vec<Pool>, bool)> {
    if BackendChoice::from_env().unwrap() == BackendChoice::Cuda {
        let open = |k| vmmweights::driver::open(BackendChoice::Cuda, k).map(|o| o.driver);
        let mut drivers =
            vec![open(0).expect("VMMW_BACKEND=cuda but the CUDA driver did not open")];
        while drivers.len() < max {
            match open(drivers.len() as i32) {
                Ok(d) => drivers.push(d),
                Err(_) => break,
            }
        }
        if drivers.len() < 2 {
            eprintln!("SKIP: {test} needs two CUDA devices; device 1 did not open");
            return None;
        }
        for a in &drivers {
            for b in &drivers {
                if a.device() != b.device() && !a.can_access_peer(b.device()).unwrap() {
                    eprintln!(
                        "SKIP: {test}: device {} cannot reach device {}",
                        a.device(),
                        b.device()
                    );
                    return None;
                }
            }
        }
        let pools = drivers
            .into_iter()
            .map(|d| Pool::new(d, PoolConfig::default()).unwrap())
            .collect();
        return Some((pools, true));
    }
    eprintln!(
        "{test}: host backend, {simulated} simulated devices (VMMW_BACKEND=cuda for the GPU run)"
    );
    let pools = (0..simulated)
        .map(|k| {
            let cfg = HostConfig {
                granularity: G,
                memory_limit: 1 << 30,
            };
            let d: Arc<dyn Driver> = Arc::new(HostDriver::for_device(cfg, k as i32).unwrap());
            Pool::new(d, small_config()).unwrap()
        })
        .collect();
    Some((pools, false))
}

/// xorshift64*: deterministic, dependency-free.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Write `tag_byte` into the block's first and last bytes (all of it when small).
pub fn fill(ptr: u64, size: usize, tag_byte: u8) {
    for (off, len) in spans(size) {
        // SAFETY: the pool handed out [ptr, ptr+size), mapped read/write on the host backend.
        unsafe { std::ptr::write_bytes((ptr as usize + off) as *mut u8, tag_byte, len) };
    }
}

/// Check the bytes written by `fill` are still there.
pub fn verify(ptr: u64, size: usize, tag_byte: u8) {
    for (off, len) in spans(size) {
        // SAFETY: as in `fill`; the block is still live.
        let s = unsafe { std::slice::from_raw_parts((ptr as usize + off) as *const u8, len) };
        assert!(
            s.iter().all(|&b| b == tag_byte),
            "block {ptr:#x}+{size}: bytes at +{off} were overwritten (another block overlaps it)"
        );
    }
}

fn spans(size: usize) -> Vec<(usize, usize)> {
    if size <= 8192 {
        vec![(0, size)]
    } else {
        vec![(0, 4096), (size - 4096, 4096)]
    }
}
