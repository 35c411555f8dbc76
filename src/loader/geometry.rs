//! The staging ring's shape: slot size, slots per worker, and how slots are
//! filled, chosen so the slots in use stay in the CPU's last-level cache.
//!
//! Why: a page-cached load moves every byte three times through host memory
//! when the slots live in DRAM (read the page cache, write the slot, the DMA
//! reads the slot), and that traffic, not the link, was the limit. When the
//! slots in use fit in the last-level cache, the fill writes into the cache and
//! the DMA reads them from there: one DRAM pass per byte. Measured on the H200
//! box (300 MiB L3, 16 threads, 16.4 GB page-cached, same runs,
//! bench/results/2026-11-29-load-bench-v5.md): rings of 64-150 MiB filled with
//! plain stores ran at 0.90-0.93 of the link; 256 MiB rings at 0.83-0.84;
//! 768 MiB rings at 0.72 (plain stores) and 0.80 (streaming stores, which were
//! the best choice while the ring could not fit).

use std::path::Path;

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

/// The geometry for `workers` staging workers when the last-level cache holds
/// `llc_bytes` (None: unknown). The ring in use gets at most half the cache,
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

/// [`for_cache`], with the caller's slot size and depth where given. The fill
/// stays cache-resident only while `workers * depth * slot` fits the same
/// budget (half the cache).
pub fn with_overrides(
    llc_bytes: Option<u64>,
    workers: usize,
    slot_bytes: Option<usize>,
    depth: Option<usize>,
) -> Geometry {
    let mut g = for_cache(llc_bytes, workers);
    if slot_bytes.is_none() && depth.is_none() {
        return g;
    }
    g.slot_bytes = slot_bytes.unwrap_or(g.slot_bytes);
    g.depth = depth.unwrap_or(g.depth).max(1);
    let ring = (workers.max(1) as u128) * (g.depth as u128) * (g.slot_bytes as u128);
    let fits = llc_bytes.is_some_and(|llc| ring <= (llc / 2) as u128);
    g.fill = if fits {
        CachedFill::CacheResident
    } else {
        CachedFill::Streaming
    };
    g
}

/// Total bytes of last-level cache shared by the CPUs this process may run on,
/// from sysfs (read once). None when sysfs does not say.
pub fn last_level_cache_bytes() -> Option<u64> {
    static LLC: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *LLC.get_or_init(|| llc_from_sysfs(Path::new("/sys/devices/system/cpu"), &allowed_cpus()))
}

/// CPUs in this thread's affinity mask (all CPUs `0..1024` when it cannot be read).
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `cpu_set_t` is plain data; all-zero is a valid empty set.
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

/// Sum of the distinct highest-level caches of `cpus`, as described under
/// `root` (`cpuN/cache/indexK/{level,type,size,shared_cpu_list}`). A cache
/// shared by several CPUs counts once (keyed by its CPU list).
pub(crate) fn llc_from_sysfs(root: &Path, cpus: &[usize]) -> Option<u64> {
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
    let total: u64 = seen
        .iter()
        .filter(|(l, _, _)| *l == best_level)
        .map(|(_, _, s)| s)
        .sum();
    (total > 0).then_some(total)
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
        // Depth alone, on a cache too small for the default: the large slot stays.
        let g = with_overrides(Some(32 << 20), 16, None, Some(2));
        assert_eq!(
            (g.slot_bytes, g.depth, g.fill),
            (16 * MIB, 2, CachedFill::Streaming)
        );
        // Unknown cache: never cache-resident; depth 0 means 1.
        let g = with_overrides(None, 1, Some(4096), Some(0));
        assert_eq!(
            (g.slot_bytes, g.depth, g.fill),
            (4096, 1, CachedFill::Streaming)
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
        assert_eq!(llc_from_sysfs(root, &[0, 1, 2, 3]), Some(64 << 20));
        assert_eq!(llc_from_sysfs(root, &[0, 1]), Some(32 << 20));
        assert_eq!(llc_from_sysfs(root, &[3]), Some(32 << 20));
        // CPUs sysfs does not describe are ignored; none at all is unknown.
        assert_eq!(llc_from_sysfs(root, &[3, 99]), Some(32 << 20));
        assert_eq!(llc_from_sysfs(root, &[99]), None);
    }

    #[test]
    fn without_an_l3_the_highest_level_present_counts() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        for cpu in 0..2 {
            write_cache(root, cpu, 0, 1, "Data", "32K", &cpu.to_string());
            write_cache(root, cpu, 1, 2, "Unified", "1024K", &cpu.to_string());
        }
        assert_eq!(llc_from_sysfs(root, &[0, 1]), Some(2 << 20));
    }

    #[test]
    fn this_machine_reports_some_cache_or_none_without_failing() {
        // Whatever the CI machine has; the point is that reading real sysfs works.
        if let Some(b) = last_level_cache_bytes() {
            assert!(b >= 4096, "implausible last-level cache of {b} bytes");
        }
    }
}
