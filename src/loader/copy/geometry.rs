//! The staging ring's shape: slot size, slots per worker, and how slots are
//! filled, chosen so the slots in use stay in the CPU's last-level cache.
//!
//! Why: a page-cached load moves every byte three times through host memory
//! when the slots live in DRAM (read the page cache, write the slot, the DMA
//! reads the slot), and that traffic, not the link, was the limit. When the
//! slots in use fit in the last-level cache, the fill writes into the cache and
//! the DMA reads them from there: one DRAM pass per byte. Measured on the H200
//! box (300 MiB L3, 16 threads, 16.4 GB page-cached, same runs,
//! bench/results/load.md): rings of 64-150 MiB filled with
//! plain stores ran at 0.90-0.93 of the link; 256 MiB rings at 0.83-0.84;
//! 768 MiB rings at 0.72 (plain stores) and 0.80 (streaming stores, which were
//! the best choice while the ring could not fit).

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How a staging worker fills a slot from page-cached data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CachedFill {
    /// Plain stores, in pieces small enough that `memcpy` keeps them temporal:
    /// the slot stays in the cache for the DMA to read.
    CacheResident,
    /// Streaming (non-temporal) stores: the slot goes straight to DRAM, saving
    /// the read-for-ownership of lines the cache could not keep anyway.
    Streaming,
}

/// Slot size, slots per worker and fill for one execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes per slot (a multiple of 4 KiB).
    pub slot_bytes: usize,
    /// Slots per worker.
    pub depth: usize,
    /// How page-cached slots are filled.
    pub fill: CachedFill,
}

const MIB: usize = 1 << 20;

/// Smallest slot worth a transfer of its own: below ~2 MiB per copy the
/// per-transfer cost showed (1 MiB slots: 0.84 of the link, 256 KiB: 0.61).
const MIN_CACHED_SLOT: usize = 2 * MIB;
/// Largest slot used in cache-resident mode (bigger copies gained nothing).
const MAX_CACHED_SLOT: usize = 8 * MIB;
/// Slots per worker in cache-resident mode: one filling, one in flight.
const CACHED_DEPTH: usize = 2;
/// The shape used when the ring cannot fit in the cache, or for cold data
/// (large reads keep the disk busy).
pub const LARGE: Geometry = Geometry {
    slot_bytes: 16 * MIB,
    depth: 3,
    fill: CachedFill::Streaming,
};

/// The geometry for `workers` staging workers when they can fill `llc_bytes`
/// of last-level cache (None: unknown; see [`usable_cache_bytes`]). The ring in use gets at most half the cache,
/// since the page-cache reads stream through it too.
pub fn for_cache(llc_bytes: Option<u64>, workers: usize) -> Geometry {
    let Some(llc) = llc_bytes else {
        return LARGE;
    };
    let budget = usize::try_from(llc / 2).unwrap_or(usize::MAX);
    let per_slot = budget / (workers.max(1) * CACHED_DEPTH);
    let slot = (per_slot.min(MAX_CACHED_SLOT) / MIB) * MIB;
    if slot < MIN_CACHED_SLOT {
        return LARGE;
    }
    Geometry {
        slot_bytes: slot,
        depth: CACHED_DEPTH,
        fill: CachedFill::CacheResident,
    }
}

/// [`for_cache`], with the caller's slot size and depth where given (0 or None:
/// chosen). The fill stays cache-resident only while `workers * depth * slot`
/// fits the same budget (half the cache); a slot size given alone then gets
/// the cache-resident depth, or the large shape's depth when it does not fit.
pub fn with_overrides(
    llc_bytes: Option<u64>,
    workers: usize,
    slot_bytes: Option<usize>,
    depth: Option<usize>,
) -> Geometry {
    let (slot_bytes, depth) = (slot_bytes.filter(|&v| v > 0), depth.filter(|&v| v > 0));
    let g = for_cache(llc_bytes, workers);
    let Some(slot) = slot_bytes else {
        let Some(depth) = depth else {
            return g;
        };
        return fitted(llc_bytes, workers, g.slot_bytes, depth, depth);
    };
    // A slot size alone keeps the cache-resident depth while that fits, else
    // the large shape's depth.
    match depth {
        Some(d) => fitted(llc_bytes, workers, slot, d, d),
        None => fitted(llc_bytes, workers, slot, CACHED_DEPTH, LARGE.depth),
    }
}

/// `slot` bytes x `depth_if_fits` per worker, cache-resident when that fits in
/// half the cache; else streaming with `depth_else`.
fn fitted(
    llc_bytes: Option<u64>,
    workers: usize,
    slot: usize,
    depth_if_fits: usize,
    depth_else: usize,
) -> Geometry {
    let ring = (workers.max(1) as u128) * (depth_if_fits as u128) * (slot as u128);
    if llc_bytes.is_some_and(|llc| ring <= (llc / 2) as u128) {
        Geometry {
            slot_bytes: slot,
            depth: depth_if_fits,
            fill: CachedFill::CacheResident,
        }
    } else {
        Geometry {
            slot_bytes: slot,
            depth: depth_else,
            fill: CachedFill::Streaming,
        }
    }
}

/// Staging workers of the executions running now in this process (several
/// devices loading at once): they share one last-level cache.
static ACTIVE_WORKERS: AtomicUsize = AtomicUsize::new(0);

/// Counts an execution's staging workers as active until dropped, so a load
/// that starts meanwhile sizes its slots for its share of the cache by worker
/// count ([`cache_share`]). Loads already running keep the slots they chose:
/// first come, first sized; two 16-worker loads started together on a
/// 300 MiB L3 take 128 + 64 MiB, and a third streams.
#[derive(Debug)]
pub struct ActiveWorkers(usize);

impl ActiveWorkers {
    /// Count `workers` in; returns the guard and how many were active before.
    pub fn enter(workers: usize) -> (ActiveWorkers, usize) {
        let before = ACTIVE_WORKERS.fetch_add(workers, Ordering::SeqCst);
        (ActiveWorkers(workers), before)
    }
}

impl Drop for ActiveWorkers {
    fn drop(&mut self) {
        ACTIVE_WORKERS.fetch_sub(self.0, Ordering::SeqCst);
    }
}

/// The part of the last-level cache our `workers` may fill while `others`
/// staging workers of other executions run: what all of them can use
/// together ([`usable_cache_bytes`]), split by worker count.
pub fn cache_share(caches: &[u64], workers: usize, others: usize) -> Option<u64> {
    let mine = workers.max(1);
    let all = mine + others;
    usable_cache_bytes(caches, all).map(|b| (b as u128 * mine as u128 / all as u128) as u64)
}

/// The caches at the highest level sysfs describes for the CPUs this process
/// may run on (read once): one size per distinct cache. Empty when sysfs does
/// not say.
pub fn last_level_caches() -> &'static [u64] {
    static LLC: std::sync::OnceLock<Vec<u64>> = std::sync::OnceLock::new();
    LLC.get_or_init(|| llc_from_sysfs(Path::new("/sys/devices/system/cpu"), &allowed_cpus()))
}

/// Bytes of last-level cache `workers` threads can fill: the `workers`
/// largest of `caches` together (a thread uses the cache of the CPU it runs
/// on, so per-core caches count once per worker, not once per CPU). None when
/// `caches` is empty.
pub fn usable_cache_bytes(caches: &[u64], workers: usize) -> Option<u64> {
    if caches.is_empty() {
        return None;
    }
    let mut v = caches.to_vec();
    v.sort_unstable_by(|a, b| b.cmp(a));
    Some(v.iter().take(workers.max(1)).sum())
}

/// CPUs in this thread's affinity mask (all CPUs `0..1024` when it cannot be read).
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `cpu_set_t` is plain data; all-zero is a valid empty set.
    #[allow(clippy::disallowed_methods)] // a plain libc struct: all-zero is valid
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; `set` is writable for its full size.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    let limit = 8 * std::mem::size_of::<libc::cpu_set_t>();
    if rc != 0 {
        return (0..limit).collect();
    }
    // SAFETY: `CPU_ISSET` only reads the set filled above; `c` is below its capacity.
    (0..limit)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// The sizes of the distinct highest-level caches of `cpus`, as described
/// under `root` (`cpuN/cache/indexK/{level,type,size,shared_cpu_list}`). A
/// cache shared by several CPUs is listed once (keyed by its CPU list).
pub(crate) fn llc_from_sysfs(root: &Path, cpus: &[usize]) -> Vec<u64> {
    let mut best_level = 0u32;
    let mut seen: Vec<(u32, String, u64)> = Vec::new();
    for &cpu in cpus {
        let dir = root.join(format!("cpu{cpu}/cache"));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let read = |f: &str| std::fs::read_to_string(p.join(f)).ok();
            let Some(level) = read("level").and_then(|s| s.trim().parse::<u32>().ok()) else {
                continue;
            };
            if read("type").is_some_and(|t| t.trim() == "Instruction") {
                continue;
            }
            let Some(size) = read("size").and_then(|s| parse_cache_size(&s)) else {
                continue;
            };
            let shared = read("shared_cpu_list").unwrap_or_else(|| format!("cpu{cpu}"));
            let key = shared.trim().to_string();
            best_level = best_level.max(level);
            if !seen.iter().any(|(l, k, _)| *l == level && *k == key) {
                seen.push((level, key, size));
            }
        }
    }
    seen.into_iter()
        .filter(|(l, _, _)| *l == best_level)
        .map(|(_, _, s)| s)
        .collect()
}

/// "307200K", "2048K", "32M", "512" (bytes) as sysfs writes cache sizes.
fn parse_cache_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1u64 << 10),
        b'M' | b'm' => (&s[..s.len() - 1], 1 << 20),
        b'G' | b'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_resident_when_two_slots_of_two_mib_per_worker_fit_half_the_cache() {
        // The H200 box: 300 MiB L3, 16 workers -> 150 MiB budget, 4 MiB slots.
        let g = for_cache(Some(300 << 20), 16);
        assert_eq!(
            g,
            Geometry {
                slot_bytes: 4 * MIB,
                depth: 2,
                fill: CachedFill::CacheResident
            }
        );
        // Fewer workers get bigger slots, capped at 8 MiB.
        assert_eq!(for_cache(Some(300 << 20), 4).slot_bytes, 8 * MIB);
        assert_eq!(for_cache(Some(300 << 20), 12).slot_bytes, 6 * MIB);
        // Exactly the minimum still fits: 16 workers * 2 * 2 MiB = 64 MiB = half of 128.
        assert_eq!(for_cache(Some(128 << 20), 16).slot_bytes, 2 * MIB);
    }

    #[test]
    fn large_slots_with_streaming_stores_when_the_cache_is_small_or_unknown() {
        assert_eq!(for_cache(None, 16), LARGE);
        assert_eq!(for_cache(Some(32 << 20), 16), LARGE);
        assert_eq!(for_cache(Some((128 << 20) - 1), 16), LARGE);
        assert_eq!(for_cache(Some(0), 0), LARGE);
    }

    #[test]
    fn overrides_keep_the_cache_fill_only_while_the_ring_still_fits() {
        let llc = Some(300 << 20);
        assert_eq!(with_overrides(llc, 16, None, None), for_cache(llc, 16));
        // 16 * 2 * 4 MiB = 128 MiB <= 150 MiB.
        let g = with_overrides(llc, 16, Some(4 * MIB), None);
        assert_eq!(
            (g.slot_bytes, g.depth, g.fill),
            (4 * MIB, 2, CachedFill::CacheResident)
        );
        // 16 * 3 * 16 MiB = 768 MiB: streaming.
        let g = with_overrides(llc, 16, Some(16 * MIB), Some(3));
        assert_eq!(
            (g.slot_bytes, g.depth, g.fill),
            (16 * MIB, 3, CachedFill::Streaming)
        );
        // A slot alone that does not fit gets the large shape's depth, as before
        // cache-sized slots existed; one that fits gets two.
        let g = with_overrides(llc, 16, Some(16 * MIB), None);
        assert_eq!(
            (g.slot_bytes, g.depth, g.fill),
            (16 * MIB, 3, CachedFill::Streaming)
        );
        let g = with_overrides(llc, 4, Some(16 * MIB), None);
        assert_eq!(
            (g.slot_bytes, g.depth, g.fill),
            (16 * MIB, 2, CachedFill::CacheResident)
        );
        // Depth alone, on a cache too small for the default: the large slot stays.
        let g = with_overrides(Some(32 << 20), 16, None, Some(2));
        assert_eq!(
            (g.slot_bytes, g.depth, g.fill),
            (16 * MIB, 2, CachedFill::Streaming)
        );
        // Depth alone that no longer fits the cache-sized slots: streaming.
        let g = with_overrides(llc, 16, None, Some(4));
        assert_eq!(
            (g.slot_bytes, g.depth, g.fill),
            (4 * MIB, 4, CachedFill::Streaming)
        );
        // Unknown cache: never cache-resident; 0 means chosen, as in CopyOptions.
        let g = with_overrides(None, 1, Some(4096), Some(0));
        assert_eq!(
            (g.slot_bytes, g.depth, g.fill),
            (4096, 3, CachedFill::Streaming)
        );
        assert_eq!(
            with_overrides(llc, 16, Some(0), Some(0)),
            for_cache(llc, 16)
        );
    }

    #[test]
    fn parses_sysfs_cache_sizes() {
        assert_eq!(parse_cache_size("307200K\n"), Some(300 << 20));
        assert_eq!(parse_cache_size("32M"), Some(32 << 20));
        assert_eq!(parse_cache_size("1G"), Some(1 << 30));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("K"), None);
        assert_eq!(parse_cache_size(""), None);
        assert_eq!(parse_cache_size("lots"), None);
    }

    fn write_cache(
        root: &Path,
        cpu: usize,
        index: usize,
        level: u32,
        ty: &str,
        size: &str,
        shared: &str,
    ) {
        let d = root.join(format!("cpu{cpu}/cache/index{index}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("level"), format!("{level}\n")).unwrap();
        std::fs::write(d.join("type"), format!("{ty}\n")).unwrap();
        std::fs::write(d.join("size"), format!("{size}\n")).unwrap();
        std::fs::write(d.join("shared_cpu_list"), format!("{shared}\n")).unwrap();
    }

    #[test]
    fn sums_distinct_last_level_caches_of_the_allowed_cpus() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        // Two L3 slices of 32 MiB (CPUs 0-1 and 2-3), private L2s and L1s.
        for cpu in 0..4 {
            write_cache(root, cpu, 0, 1, "Data", "48K", &cpu.to_string());
            write_cache(root, cpu, 1, 1, "Instruction", "32K", &cpu.to_string());
            write_cache(root, cpu, 2, 2, "Unified", "2048K", &cpu.to_string());
            let shared = if cpu < 2 { "0-1" } else { "2-3" };
            write_cache(root, cpu, 3, 3, "Unified", "32768K", shared);
        }
        assert_eq!(
            llc_from_sysfs(root, &[0, 1, 2, 3]),
            vec![32 << 20, 32 << 20]
        );
        assert_eq!(llc_from_sysfs(root, &[0, 1]), vec![32 << 20]);
        assert_eq!(llc_from_sysfs(root, &[3]), vec![32 << 20]);
        // CPUs sysfs does not describe are ignored; none at all is unknown.
        assert_eq!(llc_from_sysfs(root, &[3, 99]), vec![32 << 20]);
        assert_eq!(llc_from_sysfs(root, &[99]), Vec::<u64>::new());
    }

    #[test]
    fn per_core_caches_count_once_per_worker() {
        // 64 CPUs with private 2 MiB L2s and no L3 (common on Arm servers):
        // 16 workers can fill 32 MiB, not 128, which is too small for
        // cache-resident slots.
        let caches = vec![2u64 << 20; 64];
        assert_eq!(usable_cache_bytes(&caches, 16), Some(32 << 20));
        assert_eq!(for_cache(usable_cache_bytes(&caches, 16), 16), LARGE);
        // One shared L3 serves every worker; of two slices, a lone worker uses one.
        assert_eq!(usable_cache_bytes(&[300 << 20], 16), Some(300 << 20));
        assert_eq!(usable_cache_bytes(&[32 << 20, 64 << 20], 1), Some(64 << 20));
        assert_eq!(usable_cache_bytes(&[32 << 20, 64 << 20], 0), Some(64 << 20));
        assert_eq!(usable_cache_bytes(&[], 16), None);
    }

    #[test]
    fn concurrent_loads_split_the_cache_by_workers() {
        let l3 = [300u64 << 20];
        assert_eq!(cache_share(&l3, 16, 0), Some(300 << 20));
        assert_eq!(cache_share(&l3, 16, 16), Some(150 << 20));
        // Two 16-worker loads at once still get 2 MiB slots; a third streams.
        assert_eq!(for_cache(cache_share(&l3, 16, 16), 16).slot_bytes, 2 * MIB);
        assert_eq!(for_cache(cache_share(&l3, 16, 32), 16), LARGE);
        // Per-core caches: other loads' workers bring their own cores' caches.
        let l2 = vec![2u64 << 20; 64];
        assert_eq!(cache_share(&l2, 16, 16), Some(32 << 20));
        assert_eq!(cache_share(&[], 16, 0), None);
    }

    #[test]
    fn active_workers_count_until_dropped() {
        // Other tests in this process may load at the same time, so only
        // lower bounds hold: what this test itself keeps active.
        let (a, _) = ActiveWorkers::enter(1000);
        let (b, before_b) = ActiveWorkers::enter(7);
        assert!(before_b >= 1000, "{before_b}");
        drop(a);
        let (_c, before_c) = ActiveWorkers::enter(1);
        assert!(before_c >= 7, "{before_c}");
        assert!(
            before_c < 1000,
            "the dropped 1000 still counted: {before_c}"
        );
        drop(b);
    }

    #[test]
    fn without_an_l3_the_highest_level_present_counts() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        for cpu in 0..2 {
            write_cache(root, cpu, 0, 1, "Data", "32K", &cpu.to_string());
            write_cache(root, cpu, 1, 2, "Unified", "1024K", &cpu.to_string());
        }
        assert_eq!(llc_from_sysfs(root, &[0, 1]), vec![1 << 20, 1 << 20]);
    }

    #[test]
    fn this_machine_reports_some_cache_or_none_without_failing() {
        // Whatever the CI machine has; the point is that reading real sysfs works.
        for &b in last_level_caches() {
            assert!(b >= 4096, "implausible last-level cache of {b} bytes");
        }
    }
}
