//! `vmmw exec [--socket PATH] [--tag NAME] [--scope all|region] [--backend B]
//! -- CMD ...`: run a CUDA program under the interposer (libvmmw_preload.so,
//! docs/PRELOAD.md) with a control socket, so `vmmw ctl` can sleep and wake
//! it.
//!
//! The command runs as a child: `vmmw` prints the socket path on stderr,
//! passes on the signals other processes send it (those a terminal sends
//! reach the child from the terminal itself), waits, removes the socket and
//! its directory, and ends as the child did (its exit code, or its signal).
//! The child gets SIGTERM if `vmmw` dies first.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::exit::{CliError, CliResult};

/// The file name `vmmw exec` looks for.
const LIB_NAME: &str = "libvmmw_preload.so";
/// Longest path a Unix socket address holds (sun_path, with its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Options of `vmmw exec`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The control socket's path (must not exist; removed when the command
    /// ends) [default: control.sock in a new private directory under
    /// $XDG_RUNTIME_DIR, else the temporary directory].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// The tag the command's allocations get [default: $VMMW_PRELOAD_TAG,
    /// else process].
    #[arg(long, value_name = "NAME")]
    tag: Option<String>,
    /// all: every cudaMalloc is ours (llama-server); region: only those of
    /// threads inside a region the program enters (torch_memory_saver)
    /// [default: $VMMW_PRELOAD_SCOPE, else all].
    #[arg(long, value_parser = ["all", "region"])]
    scope: Option<String>,
    /// The pools' backend: cuda, host (only under the tests' stand-in
    /// runtime) or auto [default: $VMMW_BACKEND, else auto].
    #[arg(long, value_parser = ["host", "cuda", "auto"])]
    backend: Option<String>,
    /// The interposer [default: $VMMW_PRELOAD_LIB, else libvmmw_preload.so
    /// next to vmmw, or in ../lib].
    #[arg(long, value_name = "PATH")]
    lib: Option<PathBuf>,
    /// The command and its arguments, after `--`.
    #[arg(required = true, last = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// Where the interposer is: the first of `--lib`, `$VMMW_PRELOAD_LIB`, next
/// to this executable, `../lib` from it.
fn find_lib(given: Option<&Path>) -> CliResult<PathBuf> {
    let mut tried = Vec::new();
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = given {
        candidates.push(p.to_path_buf());
    } else if let Some(p) = std::env::var_os("VMMW_PRELOAD_LIB").filter(|p| !p.is_empty()) {
        candidates.push(PathBuf::from(p));
    } else if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            candidates.push(dir.join(LIB_NAME));
            candidates.push(dir.join("../lib").join(LIB_NAME));
        }
    }
    for c in candidates {
        if c.is_file() {
            let abs = std::fs::canonicalize(&c)
                .map_err(|e| CliError::bad_input(format!("{}: {e}", c.display())))?;
            let bytes = abs.as_os_str().as_bytes();
            if bytes.iter().any(|b| *b == b':' || b.is_ascii_whitespace()) {
                return Err(CliError::bad_input(format!(
                    "{}: LD_PRELOAD cannot name a path with a colon or a space; copy the library elsewhere",
                    abs.display()
                )));
            }
            return Ok(abs);
        }
        tried.push(c.display().to_string());
    }
    Err(CliError::bad_input(format!(
        "cannot find {LIB_NAME} (looked at {}); build it with `cargo build -p vmmw-preload`, \
         or name it with --lib or VMMW_PRELOAD_LIB",
        if tried.is_empty() {
            "nothing".to_owned()
        } else {
            tried.join(", ")
        }
    )))
}

/// The socket to serve: the one asked for (which must not exist), or
/// `control.sock` in a new private directory (returned for removal).
fn socket_path(given: Option<&Path>) -> CliResult<(PathBuf, Option<PathBuf>)> {
    let (path, dir) = match given {
        Some(p) => {
            if p.symlink_metadata().is_ok() {
                return Err(CliError::bad_input(format!(
                    "--socket {}: the path exists; remove it or choose another",
                    p.display()
                )));
            }
            // Absolute: a program that changes directory before it serves
            // binds where this command says and cleans up.
            let p = std::path::absolute(p)
                .map_err(|e| CliError::bad_input(format!("--socket {}: {e}", p.display())))?;
            (p, None)
        }
        None => {
            let base = std::env::var_os("XDG_RUNTIME_DIR")
                .map(PathBuf::from)
                .filter(|d| d.is_dir())
                .unwrap_or_else(std::env::temp_dir);
            let dir = make_private_dir(&base)?;
            (dir.join("control.sock"), Some(dir))
        }
    };
    if path.as_os_str().len() > MAX_SOCKET_PATH {
        if let Some(d) = &dir {
            let _ = std::fs::remove_dir(d);
        }
        return Err(CliError::bad_input(format!(
            "{}: a socket path holds at most {MAX_SOCKET_PATH} bytes; choose a shorter --socket",
            path.display()
        )));
    }
    Ok((path, dir))
}

/// A new directory only this user can enter (`mkdtemp`: mode 0700, a fresh name).
fn make_private_dir(base: &Path) -> CliResult<PathBuf> {
    let mut template = base.join("vmmw-exec-XXXXXX").into_os_string().into_vec();
    template.push(0);
    // SAFETY: `template` is a writable NUL-terminated buffer ending in XXXXXX.
    let p = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
    if p.is_null() {
        return Err(CliError::failure(format!(
            "cannot make a directory for the control socket under {}: {}",
            base.display(),
            std::io::Error::last_os_error()
        )));
    }
    template.pop();
    Ok(PathBuf::from(std::ffi::OsString::from_vec(template)))
}

/// The signals passed on to the child (and SIGCHLD, which ends the wait).
const FORWARDED: [libc::c_int; 7] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
];

fn signal_set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a set we own.
    unsafe {
        #[allow(clippy::disallowed_methods)] // a plain libc struct: all-zero is valid
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in FORWARDED.iter().chain(&[libc::SIGCHLD]) {
            libc::sigaddset(&mut set, *s);
        }
        set
    }
}

pub fn run(a: Args) -> CliResult<Value> {
    // Everything the user wrote is checked before anything runs.
    if let Some(t) = &a.tag {
        vmmweights::tag::id(t).map_err(|e| {
            CliError::bad_input(format!("--tag: {}", crate::backend::strip_kind(&e)))
        })?;
    }
    let lib = find_lib(a.lib.as_deref())?;
    let (socket, dir) = socket_path(a.socket.as_deref())?;
    let preload = match std::env::var_os("LD_PRELOAD").filter(|p| !p.is_empty()) {
        Some(old) => {
            let mut v = lib.clone().into_os_string();
            v.push(":");
            v.push(old);
            v
        }
        None => lib.clone().into_os_string(),
    };
    let mut cmd = Command::new(&a.command[0]);
    cmd.args(&a.command[1..])
        .env("LD_PRELOAD", preload)
        .env("VMMW_CONTROL_SOCKET", &socket);
    if let Some(t) = &a.tag {
        cmd.env("VMMW_PRELOAD_TAG", t);
    }
    if let Some(s) = &a.scope {
        cmd.env("VMMW_PRELOAD_SCOPE", s);
    }
    if let Some(b) = &a.backend {
        cmd.env("VMMW_BACKEND", b);
    }
    let set = signal_set();
    // SAFETY: `old` is written by pthread_sigmask before it is read.
    #[allow(clippy::disallowed_methods)] // a plain libc struct: all-zero is valid
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: blocks the listed signals on this thread (the only one: the
    // command line starts none); they are then received with sigwaitinfo.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) };
    // SAFETY: between fork and exec the closure only makes async-signal-safe
    // calls (restore the signal mask, ask for SIGTERM when the parent dies).
    unsafe {
        cmd.pre_exec(move || {
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            cleanup(&socket, dir.as_deref());
            return Err(CliError::bad_input(format!(
                "cannot run `{}`: {e}",
                crate::output::escape_name(&a.command[0].to_string_lossy())
            )));
        }
    };
    eprintln!(
        "vmmw exec: pid {} under {}; control socket {} (vmmw ctl {} status)",
        child.id(),
        lib.display(),
        socket.display(),
        socket.display()
    );
    let status = loop {
        #[allow(clippy::disallowed_methods)] // a plain libc struct: all-zero is valid
        // SAFETY: an all-zero siginfo_t is a valid value to be overwritten.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is initialised and `info` writable.
        let sig = unsafe { libc::sigwaitinfo(&set, &mut info) };
        if sig < 0 {
            continue; // EINTR
        }
        if sig == libc::SIGCHLD {
            match child.try_wait() {
                Ok(Some(s)) => break Ok(s),
                Ok(None) => continue,
                Err(e) => break Err(e),
            }
        }
        // Sent by a process (kill, sigqueue): pass it on. A terminal's
        // signals (SI_KERNEL) reach the child's process group themselves.
        if info.si_code <= 0 {
            // SAFETY: signalling our own child, still unreaped.
            unsafe { libc::kill(child.id() as libc::pid_t, sig) };
        }
    };
    cleanup(&socket, dir.as_deref());
    let status = status.map_err(|e| CliError::failure(format!("waiting for the command: {e}")))?;
    if let Some(code) = status.code() {
        std::process::exit(code);
    }
    let sig = status.signal().unwrap_or(libc::SIGTERM);
    if [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGPIPE,
        libc::SIGKILL,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
    ]
    .contains(&sig)
    {
        // End as the child did, so a shell sees the same signal.
        // SAFETY: default disposition, unblocked, then raised on ourselves.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            #[allow(clippy::disallowed_methods)] // a plain libc struct: all-zero is valid
            let mut one: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut one);
            libc::sigaddset(&mut one, sig);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &one, std::ptr::null_mut());
            libc::raise(sig);
        }
    }
    std::process::exit(128 + sig);
}

/// Remove the socket (when the command left it) and the directory made for it.
fn cleanup(socket: &Path, dir: Option<&Path>) {
    use std::os::unix::fs::FileTypeExt;
    if socket
        .symlink_metadata()
        .is_ok_and(|m| m.file_type().is_socket())
    {
        let _ = std::fs::remove_file(socket);
    }
    if let Some(d) = dir {
        let _ = std::fs::remove_dir(d);
    }
}
