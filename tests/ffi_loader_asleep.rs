//! Through the C ABI: loading into destinations whose tag is asleep is refused
//! with VMMW_INVALID_STATE naming the destination (it would write to unmapped
//! memory), and works again once the tag is awake.

mod common;

use std::ffi::{CStr, CString};
use std::ptr;

use common::loader::*;
use vmmweights::ffi::destinations::vmmw_loader_allocate;
use vmmweights::ffi::error::{vmmw_error_free, vmmw_error_message, vmmw_error_t};
use vmmweights::ffi::loader::{vmmw_loader_free, vmmw_loader_load, vmmw_loader_open};
use vmmweights::ffi::pool::{vmmw_pool_free, vmmw_pool_new};
use vmmweights::ffi::sleep::{
    vmmw_pool_sleep, vmmw_pool_wake, vmmw_tag_policy_t, VMMW_POLICY_DISCARD,
};
use vmmweights::loader::Dtype;
use vmmweights::{tag, Status};

#[test]
fn load_into_an_asleep_tag_is_refused_then_works_after_wake() {
    std::env::set_var("VMMW_BACKEND", "host");
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &generate(&SMALL, Dtype::Bf16), Dtype::Bf16, 2);
    let path = CString::new(dir.path().to_str().unwrap()).unwrap();
    let t = tag::id("test-ffi-asleep-load").unwrap();
    // SAFETY: every pointer passed is valid for the call; handles are freed once.
    unsafe {
        let mut pool = ptr::null_mut();
        assert_eq!(vmmw_pool_new(ptr::null(), &mut pool, ptr::null_mut()), 0);
        let mut loader = ptr::null_mut();
        assert_eq!(
            vmmw_loader_open(path.as_ptr(), &mut loader, ptr::null_mut()),
            0
        );
        assert_eq!(vmmw_loader_allocate(loader, pool, t.0, ptr::null_mut()), 0);
        let items = [vmmw_tag_policy_t {
            tag: t.0,
            policy: VMMW_POLICY_DISCARD,
        }];
        assert_eq!(vmmw_pool_sleep(pool, items.as_ptr(), 1, ptr::null_mut()), 0);

        let mut err: *mut vmmw_error_t = ptr::null_mut();
        let rc = vmmw_loader_load(loader, pool, None, ptr::null_mut(), &mut err);
        assert_eq!(rc, Status::InvalidState as i32);
        let msg = CStr::from_ptr(vmmw_error_message(err))
            .to_string_lossy()
            .into_owned();
        vmmw_error_free(err);
        assert!(
            msg.contains("destination `") && msg.contains("test-ffi-asleep-load"),
            "{msg}"
        );

        assert_eq!(vmmw_pool_wake(pool, ptr::null(), 0, ptr::null_mut()), 0);
        assert_eq!(
            vmmw_loader_load(loader, pool, None, ptr::null_mut(), ptr::null_mut()),
            0
        );
        vmmw_loader_free(loader);
        vmmw_pool_free(pool);
    }
}
