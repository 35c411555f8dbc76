//! The backends a backend-parametric test runs on: the host backend always;
//! the CUDA backend when `VMMW_BACKEND=cuda` (a driver that does not open is
//! then a failure, not a skip) or when `VMMW_BACKEND` is `auto`/unset and a
//! CUDA device opens. Otherwise each test prints `SKIP cuda: <test>: <why>`.
//!
//! The GPU scripts count lines: a test that finished its CUDA part prints
//! `RAN cuda: <test>` ([`ran`]); a part that could not run there prints a
//! `SKIP cuda:` line ([`skip`]). A skip is never counted as a pass.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use vmmweights::driver::cuda::CudaDriver;
use vmmweights::driver::host::{HostConfig, HostDriver};
use vmmweights::driver::testing::Testing;
use vmmweights::{BackendChoice, BackendKind, Driver};

/// One backend a test runs on.
pub struct Backend {
    pub driver: Arc<dyn Driver>,
    /// Held while the test uses the CUDA devices, so memory checks are not
    /// disturbed by other tests of the binary allocating at the same time.
    _serial: Option<MutexGuard<'static, ()>>,
}

impl Backend {
    pub fn kind(&self) -> BackendKind {
        self.driver.kind()
    }

    pub fn is_cuda(&self) -> bool {
        self.kind() == BackendKind::Cuda
    }

    pub fn host(&self) -> Option<&HostDriver> {
        self.driver.as_host()
    }

    /// Device `ordinal` of the same backend: a simulated peer on host (a
    /// fresh driver), the CUDA device otherwise; `Err` says why there is none.
    pub fn device(&self, ordinal: i32) -> Result<Arc<dyn Driver>, String> {
        match self.kind() {
            BackendKind::Host => HostDriver::for_device(host_config(), ordinal)
                .map(|d| Arc::new(d) as Arc<dyn Driver>)
                .map_err(|e| e.to_string()),
            BackendKind::Cuda => cuda_device(ordinal),
        }
    }
}

/// The host configuration of these tests: the H200's 2 MiB granularity (memfd
/// pages cost nothing until touched) and 4 GiB of simulated memory.
pub fn host_config() -> HostConfig {
    HostConfig {
        memory_limit: 4 << 30,
        ..HostConfig::default()
    }
}

fn cuda_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether the CUDA backend is wanted: `Err` with the reason when it is not.
fn cuda_wanted() -> Result<bool, String> {
    match BackendChoice::from_env().map_err(|e| e.to_string())? {
        BackendChoice::Host => Err("VMMW_BACKEND=host".to_owned()),
        BackendChoice::Cuda => Ok(true),
        BackendChoice::Auto => Ok(false),
    }
}

/// Each CUDA device opened so far, or why it did not open.
type Opened = HashMap<i32, Result<Arc<CudaDriver>, String>>;

/// The process-wide CUDA driver of `ordinal`, or why there is none. Shared so
/// primary contexts are not torn down and rebuilt between tests.
pub fn cuda_device(ordinal: i32) -> Result<Arc<dyn Driver>, String> {
    static OPEN: OnceLock<Mutex<Opened>> = OnceLock::new();
    let required = cuda_wanted()?;
    let mut open = OPEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let r = open
        .entry(ordinal)
        .or_insert_with(|| {
            CudaDriver::open(ordinal)
                .map(Arc::new)
                .map_err(|e| format!("CUDA device {ordinal} did not open ({e})"))
        })
        .clone();
    match r {
        Ok(d) => Ok(d as Arc<dyn Driver>),
        // Asked for explicitly: device 0 not opening is a failure, not a skip.
        Err(e) if required && ordinal == 0 => {
            panic!("VMMW_BACKEND=cuda but the CUDA driver did not open: {e}")
        }
        Err(e) => Err(e),
    }
}

/// Print a notice the harness does not capture (it captures the print
/// macros, not direct writes to the stderr handle).
fn notice(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

thread_local! {
    /// Set by [`skip`]: the test running on this thread skipped its CUDA part.
    static SKIPPED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `SKIP cuda: <test>: <why>`: `test` did not run (all of) its CUDA part;
/// [`ran`] then prints nothing for it.
pub fn skip(test: &str, why: &str) {
    SKIPPED.with(|s| s.set(true));
    notice(&format!("SKIP cuda: {test}: {why}"));
}

/// `RAN cuda: <test>` once `test` finished its CUDA part without a skip
/// (nothing on host).
pub fn ran(test: &str, b: &Backend) {
    if b.is_cuda() && !SKIPPED.with(|s| s.replace(false)) {
        notice(&format!("RAN cuda: {test}"));
    }
}

/// A fresh host backend (its counters belong to the test) and, when
/// available, the CUDA backend; prints why CUDA is skipped.
pub fn backends(test: &str) -> Vec<Backend> {
    let mut v = vec![Backend {
        driver: Arc::new(
            HostDriver::for_device(host_config(), 0).expect("simulated device 0 exists"),
        ),
        _serial: None,
    }];
    // The lock first: the driver of another test must not be opened meanwhile.
    let serial = cuda_lock();
    match cuda_device(0) {
        Ok(d) => v.push(Backend {
            driver: d,
            _serial: Some(serial),
        }),
        Err(why) => skip(test, &why),
    }
    v
}

/// Run `f` on every backend, naming the backend in the output, and print
/// `RAN cuda: <test>` after its CUDA run returns.
pub fn on_each_backend(test: &str, mut f: impl FnMut(&Backend)) {
    for b in backends(test) {
        println!("{test}: running on {} ({})", b.kind(), b.driver.describe());
        f(&b);
        ran(test, &b);
    }
}
