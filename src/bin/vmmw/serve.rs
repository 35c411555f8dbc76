//! `vmmw serve`: load a checkpoint into pool memory and share it with other
//! processes on a Unix socket until SIGINT or SIGTERM; SIGHUP loads the
//! checkpoint again into the same tensors and publishes a new version (an RL
//! rollout engine attached to it then reads the new weights in place).
//!
//! Signals are taken synchronously: they are blocked before any thread starts
//! (threads inherit the mask) and `sigwait` receives them on the main thread,
//! so no handler runs at an arbitrary point and the stop is an ordinary return.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{json, Value};
use vmmweights::loader::*;
use vmmweights::share::{ServeOptions, Server, SleepPolicy};
use vmmweights::{tag, Pool, PoolConfig};

use crate::backend::BackendArgs;
use crate::exit::{CliError, CliResult};
use crate::inspect::RuleArgs;
use crate::lib;

/// Options of `vmmw serve`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    backend: BackendArgs,
    /// Checkpoint file or folder.
    checkpoint: PathBuf,
    #[command(flatten)]
    rules: RuleArgs,
    /// The Unix socket path to serve on (must not exist; removed at exit).
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// What a sleep of the shared tag does while importers are attached:
    /// refuse (the owner waits for them to detach; `wait` is the same) or
    /// revoke (importers' next call fails with VMMW_SHARE_REVOKED).
    #[arg(long, default_value = "refuse", value_parser = ["refuse", "wait", "revoke"])]
    policy: String,
    /// Let importers map the weights read-write when they ask (default: read-only).
    #[arg(long)]
    allow_write: bool,
    /// A user id allowed to attach besides the owner's own (repeatable).
    #[arg(long = "allow-uid", value_name = "UID")]
    allow_uid: Vec<u32>,
    /// A group id whose members may attach (primary or supplementary group;
    /// repeatable).
    #[arg(long = "allow-gid", value_name = "GID")]
    allow_gid: Vec<u32>,
    /// Most connections served at once, handshaking and attached; past it a
    /// peer is refused with the reason.
    #[arg(long, default_value_t = vmmweights::share::options::DEFAULT_MAX_CONNECTIONS as u32,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// One deadline per handshake, in seconds (a silent peer is cut after it).
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    handshake_timeout: f64,
    /// The pool tag the weights are loaded under.
    #[arg(long, default_value = "weights")]
    tag: String,
    /// Copy strategy: auto, direct, staged, read, simple, populate, hybrid, stream.
    #[arg(long, default_value = "auto", value_parser = crate::parse::strategy)]
    strategy: Strategy,
}

/// The signals `serve` waits for, blocked on every thread.
fn blocked_signals() -> CliResult<libc::sigset_t> {
    // SAFETY: sigemptyset/sigaddset initialise and fill a set we own;
    // pthread_sigmask changes this thread's mask, which threads started later
    // inherit (none has started yet: this runs first).
    unsafe {
        #[allow(clippy::disallowed_methods)] // a plain libc struct: all-zero is valid
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(CliError::failure(format!(
                "cannot block SIGINT/SIGTERM/SIGHUP: {}",
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        Ok(set)
    }
}

fn wait_signal(set: &libc::sigset_t) -> CliResult<i32> {
    let mut sig = 0;
    // SAFETY: `set` is an initialised set and `sig` is writable.
    let rc = unsafe { libc::sigwait(set, &mut sig) };
    if rc != 0 {
        return Err(CliError::failure(format!(
            "sigwait failed: {}",
            std::io::Error::from_raw_os_error(rc)
        )));
    }
    Ok(sig)
}

/// Load the session's checkpoint (reopened at each load) into its
/// destinations; the bytes copied.
fn load(session: &Session, pool: &Pool) -> vmmweights::Result<u64> {
    Ok(session.load(pool, None)?.stats.bytes)
}

pub fn run(a: Args) -> CliResult<Value> {
    // Everything the user wrote is checked before the device is opened.
    a.backend.check()?;
    let rules = a.rules.rules()?;
    if a.socket.exists() || a.socket.symlink_metadata().is_ok() {
        return Err(CliError::bad_input(format!(
            "--socket {}: the path exists; remove it or choose another",
            a.socket.display()
        )));
    }
    let weights = tag::id(&a.tag).map_err(|e| CliError::bad_input(format!("--tag: {e}")))?;
    let handshake_timeout = std::time::Duration::try_from_secs_f64(a.handshake_timeout)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            CliError::bad_input(format!(
                "--handshake-timeout {}: expected a positive number of seconds",
                a.handshake_timeout
            ))
        })?;
    // Before anything starts a thread (the log's writer among them), so
    // every thread inherits the mask and the signals reach `sigwait` here.
    let signals = blocked_signals()?;
    let options = ServeOptions {
        sleep_policy: if a.policy == "revoke" {
            SleepPolicy::Revoke
        } else {
            SleepPolicy::Refuse
        },
        allow_write: a.allow_write,
        allowed_uids: (!a.allow_uid.is_empty()).then(|| {
            let mut uids = a.allow_uid.clone();
            uids.push(vmmweights::share::wire::own_uid());
            uids
        }),
        allowed_gids: a.allow_gid.clone(),
        max_connections: a.max_connections as usize,
        handshake_timeout,
        // One audit line per attach, refusal, eviction and detach, on stderr.
        log: vmmweights::share::LogSink::default(),
    };
    let session = lib(Session::open(&a.checkpoint))?;
    lib(session.set_rules(rules))?;
    lib(session.destination_specs())?;

    let opened = lib(a.backend.open())?;
    let d = opened.driver.clone();
    let pool = Arc::new(lib(Pool::new(d.clone(), PoolConfig::default()))?);
    lib(session.allocate(&pool, weights))?;
    let copy = CopyOptions {
        strategy: a.strategy,
        ..Default::default()
    };
    lib(session.set_options(PlanOptions::default(), copy))?;
    let bytes = lib(load(&session, &pool))?;
    let tensors: Vec<Destination> = session.destinations();
    let count = tensors.len();
    let mut server = lib(Server::start(
        pool.clone(),
        weights,
        tensors,
        &a.socket,
        options,
    ))?;
    // Status lines only: a server outlives a reader that went away (a closed
    // stdout is ignored), and stops on its signals alone.
    let _ = writeln!(
        std::io::stdout(),
        "serving {} tensors={} bytes={} version={} policy={} backend={}",
        a.socket.display(),
        count,
        bytes,
        server.version(),
        a.policy,
        d.describe()
    );
    let _ = std::io::stdout().flush();

    let mut reloads = 0u64;
    let stopped_by = loop {
        match wait_signal(&signals)? {
            libc::SIGHUP => match load(&session, &pool) {
                Ok(b) => {
                    lib(pool.driver().synchronize())?;
                    reloads += 1;
                    let version = lib(server.publish())?;
                    let _ = writeln!(std::io::stdout(), "reloaded bytes={b} version={version}");
                    let _ = std::io::stdout().flush();
                }
                // The version does not change. A load checks every tensor
                // before writing, so a changed shape or a missing file writes
                // nothing; a read error part way can leave tensors partly new.
                Err(e) => {
                    eprintln!(
                        "vmmw serve: reload of {} failed, version stays {} (a failure part way \
                         may have rewritten some tensors: fix the checkpoint and send SIGHUP again): {e}",
                        a.checkpoint.display(),
                        server.version()
                    );
                }
            },
            s => {
                break if s == libc::SIGINT {
                    "SIGINT"
                } else {
                    "SIGTERM"
                }
            }
        }
    };
    let version = server.version();
    let attached = server.attached();
    server.stop();
    let _ = writeln!(
        std::io::stdout(),
        "stopped ({stopped_by}): socket {} removed, version {version}, {attached} importer(s) were attached",
        a.socket.display()
    );
    Ok(json!({
        "socket": a.socket.display().to_string(),
        "backend": d.kind().to_string(),
        "tensors": count,
        "bytes": bytes,
        "version": version,
        "reloads": reloads,
        "stopped_by": stopped_by,
    }))
}
