//! torch_memory_saver's C symbols (`tms_*`) over the interposer's own calls
//! (`inproc`), for programs that call upstream's preloaded library by name:
//! its test suite binds `tms_pause` and `tms_resume` from the process's
//! global scope, and its Python layer sets each thread's region with
//! `tms_set_*`. They carry upstream's names, not the `vmmw_` prefix, on
//! purpose: programs find them by those names.
//!
//! Each thread's settings (tag, whether its allocations are pauseable at
//! all, CPU backup, its backend, disk backup) start from the environment
//! upstream reads (`TMS_INIT_ENABLE`, `TMS_INIT_ENABLE_CPU_BACKUP`,
//! `TMS_INIT_CPU_BACKUP_BACKEND`) and choose the interposer tag the thread
//! allocates under, `tms:<tag>/<cpu|none>`, and its region. `tms_pause`
//! sleeps the tags that keep a CPU backup with Offload and every other one
//! with Discard (the process's own tag keeps a backup when
//! `TMS_INIT_ENABLE_CPU_BACKUP` says so); `tms_resume` wakes them. Both
//! return 0 or the status number of `vmmweights.h`, never unwind.
//!
//! Not here: disk backups (`tms_set_enable_disk_backup` is recorded and
//! read back, the bytes of such a region are discarded at pause as any
//! region without a CPU backup) and `tms_get_cpu_backup_pointer`.

#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use vmmweights::control::WirePolicy;
use vmmweights::{Error, Result, Status};

use crate::inproc;

/// One thread's region settings, as upstream's C library keeps them.
#[derive(Debug, Clone)]
struct Settings {
    tag: CString,
    interesting: bool,
    cpu_backup: bool,
    backend: CString,
    disk_backup: bool,
}

fn truthy(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes" | "on"))
}

impl Settings {
    fn from_env() -> Settings {
        let backend = std::env::var("TMS_INIT_CPU_BACKUP_BACKEND")
            .ok()
            .filter(|b| b == "mmap")
            .unwrap_or_else(|| "pinned".into());
        Settings {
            tag: CString::new("default").expect("no NUL"),
            interesting: truthy("TMS_INIT_ENABLE"),
            cpu_backup: truthy("TMS_INIT_ENABLE_CPU_BACKUP"),
            backend: CString::new(backend).unwrap_or_default(),
            disk_backup: truthy("TMS_INIT_ENABLE_DISK_BACKUP"),
        }
    }

    /// The interposer tag these settings allocate under.
    fn interposer_tag(&self) -> String {
        let kind = if self.cpu_backup { "cpu" } else { "none" };
        format!("tms:{}/{kind}", self.tag.to_string_lossy())
    }
}

thread_local! {
    static SETTINGS: RefCell<Option<Settings>> = const { RefCell::new(None) };
}

static RETAIN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn with<T>(f: impl FnOnce(&mut Settings) -> T) -> T {
    SETTINGS.with(|s| f(s.borrow_mut().get_or_insert_with(Settings::from_env)))
}

/// Change this thread's settings and tell the interposer its tag and region.
fn change(f: impl FnOnce(&mut Settings)) -> i32 {
    status(|| {
        let (tag, interesting) = with(|s| {
            f(s);
            (s.interposer_tag(), s.interesting)
        });
        inproc::set_tag(Some(&tag))?;
        inproc::set_region(interesting);
        Ok(())
    })
}

fn status(body: impl FnOnce() -> Result<()>) -> i32 {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => Status::Ok as i32,
        Ok(Err(e)) => e.status() as i32,
        Err(_) => Status::Panic as i32,
    }
}

/// A C string argument; NULL is `None`.
///
/// # Safety
/// `p` is NULL or NUL-terminated.
unsafe fn text(p: *const c_char) -> Result<Option<CString>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's contract.
    let s = unsafe { CStr::from_ptr(p) };
    if s.to_bytes().is_empty() {
        return Err(Error::InvalidArgument("an empty tag".into()));
    }
    Ok(Some(s.to_owned()))
}

/// The interposer tags a pause or resume of `tag` (None: every tag) acts
/// on, split into those keeping a CPU backup and the others.
fn tags_of(tag: Option<&CStr>) -> Result<(Vec<String>, Vec<String>)> {
    let process_backup = truthy("TMS_INIT_ENABLE_CPU_BACKUP");
    let mut cpu = Vec::new();
    let mut other = Vec::new();
    for t in inproc::status()?.tags {
        let mine = match tag {
            None => true,
            Some(want) => {
                let want = want.to_string_lossy();
                t.tag == format!("tms:{want}/cpu") || t.tag == format!("tms:{want}/none")
            }
        };
        if !mine || cpu.contains(&t.tag) || other.contains(&t.tag) {
            continue;
        }
        let backed = t.tag.ends_with("/cpu") || (!t.tag.starts_with("tms:") && process_backup);
        if backed {
            cpu.push(t.tag);
        } else {
            other.push(t.tag);
        }
    }
    Ok((cpu, other))
}

/// Release the memory of `tag` (NULL: every tag) on every device, keeping
/// every pointer: tags with a CPU backup offloaded, the rest discarded.
///
/// # Safety
/// `tag` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tms_pause(tag: *const c_char) -> i32 {
    status(|| {
        // SAFETY: forwarded contract.
        let tag = unsafe { text(tag) }?;
        let (cpu, other) = tags_of(tag.as_deref())?;
        if !cpu.is_empty() {
            inproc::sleep(WirePolicy::Offload, Some(&cpu))?;
        }
        if !other.is_empty() {
            inproc::sleep(WirePolicy::Discard, Some(&other))?;
        }
        Ok(())
    })
}

/// Map the memory of `tag` (NULL: every asleep tag) again at the same
/// addresses; offloaded bytes come back.
///
/// # Safety
/// `tag` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tms_resume(tag: *const c_char) -> i32 {
    status(|| {
        // SAFETY: forwarded contract.
        let tag = unsafe { text(tag) }?;
        let (mut tags, other) = tags_of(tag.as_deref())?;
        tags.extend(other);
        if tag.is_none() {
            inproc::wake(None, None)?;
        } else if !tags.is_empty() {
            inproc::wake(Some(&tags), None)?;
        }
        Ok(())
    })
}

/// This thread's allocations go under `tag` from now on.
///
/// # Safety
/// `tag` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tms_set_current_tag(tag: *const c_char) -> i32 {
    // SAFETY: forwarded contract.
    match unsafe { text(tag) } {
        Ok(t) => change(|s| s.tag = t.unwrap_or_else(|| CString::new("default").expect("no NUL"))),
        Err(e) => e.status() as i32,
    }
}

/// This thread's tag (valid until the thread changes it).
#[no_mangle]
pub extern "C" fn tms_get_current_tag() -> *const c_char {
    catch_unwind(|| with(|s| s.tag.as_ptr())).unwrap_or(c"default".as_ptr())
}

/// Whether this thread's allocations are pauseable at all (a region).
#[no_mangle]
pub extern "C" fn tms_set_interesting_region(on: bool) -> i32 {
    change(|s| s.interesting = on)
}

/// See `tms_set_interesting_region`.
#[no_mangle]
pub extern "C" fn tms_get_interesting_region() -> bool {
    catch_unwind(|| with(|s| s.interesting)).unwrap_or(false)
}

/// Whether this thread's allocations keep a CPU backup over a pause.
#[no_mangle]
pub extern "C" fn tms_set_enable_cpu_backup(on: bool) -> i32 {
    change(|s| s.cpu_backup = on)
}

/// See `tms_set_enable_cpu_backup`.
#[no_mangle]
pub extern "C" fn tms_get_enable_cpu_backup() -> bool {
    catch_unwind(|| with(|s| s.cpu_backup)).unwrap_or(false)
}

/// The host memory a CPU backup lives in, "pinned" or "mmap" (recorded:
/// this interposer's backups are pinned either way).
///
/// # Safety
/// `backend` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tms_set_cpu_backup_backend(backend: *const c_char) -> i32 {
    // SAFETY: forwarded contract.
    match unsafe { text(backend) } {
        Ok(Some(b)) if matches!(b.to_bytes(), b"pinned" | b"mmap") => change(|s| s.backend = b),
        Ok(_) => Status::InvalidArgument as i32,
        Err(e) => e.status() as i32,
    }
}

/// See `tms_set_cpu_backup_backend`.
#[no_mangle]
pub extern "C" fn tms_get_cpu_backup_backend() -> *const c_char {
    catch_unwind(|| with(|s| s.backend.as_ptr())).unwrap_or(c"pinned".as_ptr())
}

/// Whether this thread's allocations keep a disk backup (recorded; see the
/// module docs).
#[no_mangle]
pub extern "C" fn tms_set_enable_disk_backup(on: bool) -> i32 {
    change(|s| s.disk_backup = on)
}

/// See `tms_set_enable_disk_backup`.
#[no_mangle]
pub extern "C" fn tms_get_enable_disk_backup() -> bool {
    catch_unwind(|| with(|s| s.disk_backup)).unwrap_or(false)
}

/// Whether a resume keeps the backup (recorded for callers that read it
/// back; the interposer's backups stay pinned for the next pause).
#[no_mangle]
pub extern "C" fn tms_set_retain_cpu_backup(on: bool) {
    RETAIN.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// See `tms_set_retain_cpu_backup`.
#[no_mangle]
pub extern "C" fn tms_get_retain_cpu_backup() -> bool {
    RETAIN.load(std::sync::atomic::Ordering::Relaxed)
}
