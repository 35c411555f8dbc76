//! The control socket of a process under the interposer.
//!
//! `VMMW_CONTROL_SOCKET` names it. The first process that serves it takes
//! the variable out of its environment, so the programs it runs (a shell,
//! a forked worker) do not fight over the path. A process that has a CUDA
//! runtime loaded when this library is (llama-server, whose libggml-cuda
//! links libcudart) serves it from the library's constructor, so `vmmw ctl
//! status` answers before the first `cudaMalloc` ("no allocations yet"); a
//! process that loads the runtime later (Python) serves it from its first
//! intercepted call, and a process that never does (the shell `vmmw exec`
//! may start) leaves the variable for its children. The socket file is
//! removed when the process exits normally.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use vmmweights::control::{
    ControlLog, ControlOptions, Controlled, CycleAnswer, DeviceSync, ProcessPools, Server,
    StatusAnswer, WirePolicy,
};
use vmmweights::{Error, Result};

use crate::context::Kept;
use crate::state::{self, Made};
use crate::{alloc, owned, real};

/// The variable naming the socket.
pub const SOCKET_VAR: &str = "VMMW_CONTROL_SOCKET";

/// Synchronizes devices through the process's own runtime.
struct RuntimeSync;

impl DeviceSync for RuntimeSync {
    fn synchronize(&self, devices: &[i32]) -> Result<()> {
        let _kept = Kept::now();
        for &d in devices {
            alloc::synchronize(d).map_err(|rc| Error::Driver {
                call: "cudaDeviceSynchronize",
                code: rc,
                name: real::error_string(rc),
                detail: format!(" on device {d}"),
            })?;
        }
        Ok(())
    }
}

/// The process's pools as the control socket and the in-process calls see
/// them, with the interposer's own figures in the status.
pub struct Interposed {
    pools: ProcessPools,
}

impl Interposed {
    fn new() -> Interposed {
        Interposed {
            pools: ProcessPools::registry(Some(Box::new(RuntimeSync))),
        }
    }

    fn refuse_if_passing_through(&self) -> Result<()> {
        match state::existing() {
            Some(Made::Failed(why)) => Err(Error::InvalidState(format!(
                "this process's CUDA calls all go to the runtime ({why}): it holds no memory of ours"
            ))),
            _ => Ok(()),
        }
    }

    fn interposer_figures(&self) -> Value {
        let (live, bytes) = owned::totals();
        match state::existing() {
            None => json!({ "state": "waiting for the first intercepted CUDA call" }),
            Some(Made::Failed(why)) => {
                json!({ "state": "passing everything to the runtime", "why": why })
            }
            Some(Made::Ready(s)) => {
                let (served, passed, refused, last_refusal) = s.counts();
                json!({
                    "state": "ready",
                    "scope": s.config.scope.name(),
                    "tag": vmmweights::tag::name_of(s.config.tag),
                    "backend": s.backend.to_string(),
                    "allocations": live,
                    "allocated_bytes": bytes,
                    "served": served,
                    "passed_to_runtime": passed,
                    "refused": refused,
                    "last_refusal": last_refusal,
                })
            }
        }
    }
}

impl Controlled for Interposed {
    fn status(&self) -> Result<StatusAnswer> {
        let mut s = self.pools.status()?;
        s.extra
            .insert("interposer".into(), self.interposer_figures());
        Ok(s)
    }

    fn sleep(&self, policy: WirePolicy, tags: Option<&[String]>) -> Result<CycleAnswer> {
        self.refuse_if_passing_through()?;
        self.pools.sleep(policy, tags)
    }

    fn wake(&self, tags: Option<&[String]>, wait: Option<Duration>) -> Result<CycleAnswer> {
        self.refuse_if_passing_through()?;
        self.pools.wake(tags, wait)
    }
}

/// The one controlled object of this process (the socket and the
/// in-process calls share it, so one sleep or wake runs at a time).
pub fn interposed() -> &'static Arc<Interposed> {
    static I: std::sync::OnceLock<Arc<Interposed>> = std::sync::OnceLock::new();
    I.get_or_init(|| Arc::new(Interposed::new()))
}

/// The server, once started; kept for the life of the process.
static SERVER: Mutex<Option<Server>> = Mutex::new(None);

/// Serve the socket `VMMW_CONTROL_SOCKET` names, if it names one and this
/// process has not taken it yet. Says once why when it cannot.
pub fn serve_if_asked() {
    let mut server = SERVER.lock().unwrap_or_else(|p| p.into_inner());
    if server.is_some() {
        return;
    }
    let Some(path) = std::env::var_os(SOCKET_VAR).filter(|p| !p.is_empty()) else {
        return;
    };
    // Taken: the programs this process runs do not serve it too.
    std::env::remove_var(SOCKET_VAR);
    let options = ControlOptions {
        log: ControlLog::stderr("vmmw preload: control socket "),
        ..ControlOptions::default()
    };
    match Server::start(&path, interposed().clone(), options) {
        Ok(s) => *server = Some(s),
        Err(e) => crate::say::once(&format!(
            "no control socket: {e} (the process runs on without one)"
        )),
    }
}

/// At load: serve now when the process already has its CUDA runtime.
extern "C" fn on_load() {
    let _ = std::panic::catch_unwind(|| {
        if std::env::var_os(SOCKET_VAR).is_some() && real::runtime_present() {
            serve_if_asked();
        }
    });
}

/// At a normal exit: remove the socket file, so no stale path is left.
extern "C" fn on_unload() {
    let _ = std::panic::catch_unwind(|| {
        if let Ok(s) = SERVER.try_lock() {
            if let Some(s) = s.as_ref() {
                s.remove_socket_file();
            }
        }
    });
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

#[used]
#[link_section = ".fini_array"]
static ON_UNLOAD: extern "C" fn() = on_unload;

/// Serve the socket at the process's first intercepted call (a process that
/// loaded its CUDA runtime after this library: Python). Checks once.
pub fn serve_on_first_call() {
    static CHECKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !CHECKED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        serve_if_asked();
    }
}
