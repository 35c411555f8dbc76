//! The PyTorch entry points on the host backend: one segment per call under
//! the current tag, NULL on out of memory, unknown pointers reported not fatal.
//!
//! One test function: the global pool and `VMMW_BACKEND` are process-wide.

use std::ffi::c_void;
use std::ptr::null_mut;

use vmmweights::driver::testing::Testing;
use vmmweights::ffi::torch::{vmmw_torch_free, vmmw_torch_malloc};
use vmmweights::pool::torch;
use vmmweights::tag;

#[test]
fn torch_entry_points_on_the_host_backend() {
    std::env::set_var("VMMW_BACKEND", "host");
    let pool = vmmweights::pool::registry::global_pool(0).unwrap();
    assert!(std::sync::Arc::ptr_eq(
        &pool,
        &vmmweights::pool::registry::global_pool(0).unwrap()
    ));
    let host = || {
        pool.driver()
            .as_host()
            .expect("host backend")
            .counts()
            .physical_bytes
    };
    let g = pool.driver().granularity();

    // SAFETY (all calls below): the entry points accept any arguments.
    let p = unsafe { vmmw_torch_malloc(3 << 20, 0, null_mut()) };
    assert!(!p.is_null());
    let seg = pool.segment_of(p as u64).unwrap();
    assert_eq!(seg.tag, tag::TagId::DEFAULT);
    assert_eq!(
        seg.reserved_bytes,
        (3usize << 20).div_ceil(g) * g,
        "one segment, rounded to the granularity"
    );

    let w = tag::id("weights").unwrap();
    let q = {
        let _s = tag::scope(w).unwrap();
        unsafe { vmmw_torch_malloc(1000, 0, null_mut()) }
    };
    assert!(!q.is_null());
    let r = pool.report();
    let u = r.tag("weights").unwrap();
    assert_eq!((u.segments, u.live_blocks), (1, 1), "{r}");
    assert_eq!(u.live_bytes, g as u64);
    assert_eq!(u.tracked_bytes, g as u64);

    // Freeing releases the segment at once (PyTorch caches on its side).
    unsafe { vmmw_torch_free(q, 1000, 0, null_mut()) };
    assert!(pool.report().tag("weights").is_none());
    let before = torch::counters();
    unsafe { vmmw_torch_free(q, 1000, 0, null_mut()) }; // double free
    unsafe { vmmw_torch_free(0x1234 as *mut c_void, 8, 0, null_mut()) };
    unsafe { vmmw_torch_free(p, 8, 7, null_mut()) }; // a device with no pool
    unsafe { vmmw_torch_free(null_mut(), 0, 0, null_mut()) }; // NULL: nothing to do
    assert_eq!(torch::counters().unknown_frees, before.unknown_frees + 3);
    assert!(
        pool.segment_of(p as u64).is_some(),
        "bad frees changed nothing"
    );

    // Out of memory: NULL, nothing leaks.
    let physical = host();
    pool.driver()
        .as_host()
        .unwrap()
        .set_memory_limit(physical + 4 * g as u64);
    let failed = torch::counters().failed_mallocs;
    let big = unsafe { vmmw_torch_malloc((5 * g) as isize, 0, null_mut()) };
    assert!(big.is_null());
    assert_eq!(torch::counters().failed_mallocs, failed + 1);
    assert_eq!(
        host(),
        physical,
        "a failed malloc leaves no physical memory behind"
    );
    let fits = unsafe { vmmw_torch_malloc((4 * g) as isize, 0, null_mut()) };
    assert!(!fits.is_null());
    unsafe { vmmw_torch_free(fits, 0, 0, null_mut()) };

    // Bad sizes: NULL, no crash.
    assert!(unsafe { vmmw_torch_malloc(0, 0, null_mut()) }.is_null());
    assert!(unsafe { vmmw_torch_malloc(-5, 0, null_mut()) }.is_null());
    assert!(unsafe { vmmw_torch_malloc(16, -1, null_mut()) }.is_null());

    unsafe { vmmw_torch_free(p, 3 << 20, 0, null_mut()) };
    let c = pool.driver().as_host().unwrap().counts();
    assert_eq!(
        (c.reservations, c.handles, c.physical_bytes),
        (0, 0, 0),
        "{c:?}"
    );
}
