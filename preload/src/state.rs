//! The interposer's state, made at its first intercepted call once the
//! process has a CUDA runtime loaded (from any thread; the others wait for
//! it): the settings, the backend the pools run on, and counts for the
//! status. When it cannot be made (a bad variable, no driver, the host
//! backend under a real runtime), every call passes to the runtime from
//! then on, and why is said once on stderr.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use vmmweights::driver::BackendKind;
use vmmweights::pool::registry;
use vmmweights::{Error, Pool, PoolConfig, Result};

use crate::config::Config;
use crate::{context, real};

/// The interposer, once made.
#[derive(Debug)]
pub struct State {
    /// The settings.
    pub config: Config,
    /// The pools' backend.
    pub backend: BackendKind,
    served: AtomicU64,
    passed: AtomicU64,
    refused: AtomicU64,
    last_refusal: Mutex<Option<String>>,
}

/// Where the making of the state stands.
#[derive(Debug)]
pub enum Made {
    /// Ready: our allocations go to the pools.
    Ready(State),
    /// Failed: everything passes to the runtime, for this reason.
    Failed(String),
}

static STATE: OnceLock<Made> = OnceLock::new();

/// The state, made now if it is not yet; `None` when it failed, or while
/// the process has no CUDA runtime loaded: a call before it loads one (a
/// layer asking for its region at import, before Python imports torch)
/// decides nothing, and the first call after it makes the state.
pub fn get() -> Option<&'static State> {
    if STATE.get().is_none() && !real::runtime_present() {
        return None;
    }
    match STATE.get_or_init(make) {
        Made::Ready(s) => Some(s),
        Made::Failed(_) => None,
    }
}

/// The state if it was made, without making it.
pub fn existing() -> Option<&'static Made> {
    STATE.get()
}

fn make() -> Made {
    // Opening a device's pool may change the thread's context.
    let _kept = context::Kept::now();
    match try_make() {
        Ok(s) => Made::Ready(s),
        Err(e) => {
            let why = e.to_string();
            crate::say::once(&format!(
                "every CUDA call of this process goes to the CUDA runtime unchanged: {why}"
            ));
            Made::Failed(why)
        }
    }
}

fn try_make() -> Result<State> {
    let config = Config::from_env()?;
    if !real::runtime_present() {
        return Err(Error::DriverUnavailable(
            "no CUDA runtime (cudaGetDevice) is loaded in this process".into(),
        ));
    }
    let device = real::current_device().map_err(|rc| {
        Error::DriverUnavailable(format!("cudaGetDevice failed: {}", real::error_string(rc)))
    })?;
    registry::set_new_pool_config(PoolConfig {
        chunk_bytes: config.chunk_bytes,
        ..PoolConfig::default()
    });
    let backend = registry::global_pool(device)?.driver().kind();
    if backend == BackendKind::Host {
        context::no_driver_contexts();
        if !standin_runtime() {
            return Err(Error::Unsupported(
                "the pools would run on the host backend (VMMW_BACKEND, or no usable CUDA \
                 driver), whose memory this process's CUDA runtime cannot use; the host backend \
                 serves the stand-in runtime of the tests only (docs/PRELOAD.md)"
                    .into(),
            ));
        }
    }
    Ok(State {
        config,
        backend,
        served: AtomicU64::new(0),
        passed: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        last_refusal: Mutex::new(None),
    })
}

/// Whether the process's runtime is the stand-in of the tests
/// (`tests/preload/standin_cudart.c`), which declares itself.
fn standin_runtime() -> bool {
    // SAFETY: RTLD_DEFAULT lookup of a NUL-terminated name.
    !unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"vmmw_standin_runtime".as_ptr()) }.is_null()
}

impl State {
    /// The pool of `device`.
    pub fn pool(&self, device: i32) -> Result<Arc<Pool>> {
        registry::global_pool(device)
    }

    /// Count an allocation served from the pools.
    pub fn count_served(&self) {
        self.served.fetch_add(1, Ordering::Relaxed);
    }

    /// Count an allocation passed to the runtime.
    pub fn count_passed(&self) {
        self.passed.fetch_add(1, Ordering::Relaxed);
    }

    /// Count a refused allocation and keep why (the status shows the last).
    pub fn count_refused(&self, size: usize, device: i32, e: &Error) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        *self.last_refusal.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!(
            "cudaMalloc of {size} bytes on device {device}: {e}"
        ));
    }

    /// The counts and the last refusal, for the status.
    pub fn counts(&self) -> (u64, u64, u64, Option<String>) {
        (
            self.served.load(Ordering::Relaxed),
            self.passed.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
            self.last_refusal
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}
