//! NCCL, opened at run time: the collective the NCCL update transport uses.
//!
//! The calls and types are cudarc's NCCL bindings (`cudarc::nccl::sys`); the
//! library is opened here rather than by cudarc because cudarc's list of names
//! lacks `libnccl.so.2`, the name PyTorch's wheels ship. The crate builds
//! without NCCL or CUDA; a missing library is an error naming it and the
//! variable that points at it (`VMMW_NCCL_LIBRARY`). Each call's result is
//! read as a plain integer, so a code this build does not know is reported,
//! never trusted as an enum.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, Mutex};

use cudarc::nccl::sys::{ncclComm_t, ncclDataType_t, ncclUniqueId};

use crate::driver::{DevicePtr, StreamId};
use crate::error::{Error, Result};

/// The names tried, in order, after `VMMW_NCCL_LIBRARY`.
pub const LIBRARY_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// Bytes of an NCCL unique id (`ncclUniqueId`, `NCCL_UNIQUE_ID_BYTES`).
pub const UNIQUE_ID_BYTES: usize = 128;

type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type GetUniqueId = unsafe extern "C" fn(*mut ncclUniqueId) -> c_int;
type CommInitRank = unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> c_int;
type CommDestroy = unsafe extern "C" fn(ncclComm_t) -> c_int;
type CommCount = unsafe extern "C" fn(ncclComm_t, *mut c_int) -> c_int;
type Broadcast = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    c_int,
    ncclComm_t,
    *mut c_void,
) -> c_int;
type CommRegister = unsafe extern "C" fn(ncclComm_t, *mut c_void, usize, *mut *mut c_void) -> c_int;
type CommDeregister = unsafe extern "C" fn(ncclComm_t, *mut c_void) -> c_int;
type GetErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type CommGetAsyncError = unsafe extern "C" fn(ncclComm_t, *mut c_int) -> c_int;

/// The loaded NCCL library and the calls this crate makes.
pub struct Nccl {
    path: String,
    version: i32,
    get_unique_id: GetUniqueId,
    comm_init_rank: CommInitRank,
    comm_destroy: CommDestroy,
    comm_abort: CommDestroy,
    comm_count: CommCount,
    comm_user_rank: CommCount,
    broadcast: Broadcast,
    comm_register: CommRegister,
    comm_deregister: CommDeregister,
    get_error_string: GetErrorString,
    comm_get_async_error: CommGetAsyncError,
    // Kept loaded for as long as the function pointers above live.
    _lib: libloading::Library,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish()
    }
}

fn sym<T: Copy>(lib: &libloading::Library, path: &str, name: &str) -> Result<T> {
    // SAFETY: `T` is the C signature NCCL documents for `name` (the types above,
    // as cudarc's bindings declare them); the library outlives the pointer (it
    // is kept in the same `Nccl`).
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| Error::Unsupported(format!("NCCL library {path} lacks `{name}`: {e}")))
}

impl Nccl {
    /// Open NCCL: `VMMW_NCCL_LIBRARY` when set, else `libnccl.so.2`, else
    /// `libnccl.so`, by the dynamic loader's search (a process that imported
    /// torch already has PyTorch's copy loaded, and it is found by that name).
    /// Opened once per process; a failure is returned every time, naming
    /// every name tried.
    pub fn open() -> Result<Arc<Nccl>> {
        static OPENED: Mutex<Option<Arc<Nccl>>> = Mutex::new(None);
        let mut g = OPENED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = g.as_ref() {
            return Ok(n.clone());
        }
        let n = Arc::new(Self::load()?);
        *g = Some(n.clone());
        Ok(n)
    }

    fn load() -> Result<Nccl> {
        let mut tried = Vec::new();
        let names: Vec<String> = match std::env::var("VMMW_NCCL_LIBRARY") {
            Ok(p) if !p.trim().is_empty() => vec![p],
            _ => LIBRARY_NAMES.iter().map(|s| s.to_string()).collect(),
        };
        for name in &names {
            // SAFETY: loading NCCL runs its initialisers, which only set up
            // its own state; nothing else of this process is touched.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => return Self::resolve(lib, name.clone()),
                Err(e) => tried.push(format!("{name} ({e})")),
            }
        }
        Err(Error::Unsupported(format!(
            "NCCL library not found: tried {}; install NCCL (PyTorch's CUDA wheels ship libnccl.so.2 under site-packages/nvidia/nccl/lib) or set VMMW_NCCL_LIBRARY to its path",
            tried.join(", ")
        )))
    }

    fn resolve(lib: libloading::Library, path: String) -> Result<Nccl> {
        let get_version: GetVersion = sym(&lib, &path, "ncclGetVersion")?;
        let mut version: c_int = 0;
        // SAFETY: `version` is a valid out pointer.
        let rc = unsafe { get_version(&mut version) };
        if rc != 0 {
            return Err(Error::Unsupported(format!(
                "NCCL library {path}: ncclGetVersion returned {rc}"
            )));
        }
        Ok(Nccl {
            get_unique_id: sym(&lib, &path, "ncclGetUniqueId")?,
            comm_init_rank: sym(&lib, &path, "ncclCommInitRank")?,
            comm_destroy: sym(&lib, &path, "ncclCommDestroy")?,
            comm_abort: sym(&lib, &path, "ncclCommAbort")?,
            comm_count: sym(&lib, &path, "ncclCommCount")?,
            comm_user_rank: sym(&lib, &path, "ncclCommUserRank")?,
            broadcast: sym(&lib, &path, "ncclBroadcast")?,
            comm_register: sym(&lib, &path, "ncclCommRegister")?,
            comm_deregister: sym(&lib, &path, "ncclCommDeregister")?,
            get_error_string: sym(&lib, &path, "ncclGetErrorString")?,
            comm_get_async_error: sym(&lib, &path, "ncclCommGetAsyncError")?,
            path,
            version,
            _lib: lib,
        })
    }

    /// Where the library was opened from (the name or path given to the loader).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// NCCL's version code (`NCCL_VERSION_CODE`: 22703 for 2.27.3).
    pub fn version(&self) -> i32 {
        self.version
    }

    fn check(&self, call: &'static str, rc: c_int) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static string for any code.
        let text = unsafe {
            let p = (self.get_error_string)(rc);
            if p.is_null() {
                "unknown".to_string()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Err(Error::Driver {
            call,
            code: rc,
            name: result_name(rc).into(),
            detail: format!(": {text}"),
        })
    }

    /// A new unique id (rank 0 makes it and shares its bytes with the others).
    pub fn unique_id(&self) -> Result<[u8; UNIQUE_ID_BYTES]> {
        let mut id = ncclUniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        // SAFETY: `id` is a valid out pointer of the declared type.
        self.check("ncclGetUniqueId", unsafe { (self.get_unique_id)(&mut id) })?;
        Ok(id.internal.map(|c| c as u8))
    }
}

/// The symbolic name of an `ncclResult_t` code.
pub fn result_name(code: i32) -> &'static str {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        _ => "unknown NCCL result",
    }
}

/// A communicator: one this crate created from a unique id (destroyed on
/// drop) or one the caller lent (left alone on drop).
#[derive(Debug)]
pub struct Comm {
    nccl: Arc<Nccl>,
    raw: ncclComm_t,
    owned: bool,
    rank: usize,
    world: usize,
}

// SAFETY: an NCCL communicator may be used from any thread as long as calls on
// it are not concurrent; `Comm` takes `&mut self` for every collective.
unsafe impl Send for Comm {}

impl Comm {
    /// Join the communicator of `world` ranks named by `id` as `rank`, on the
    /// CUDA device current on this thread. Blocks until every rank joined.
    pub fn init_rank(
        nccl: Arc<Nccl>,
        id: &[u8; UNIQUE_ID_BYTES],
        world: usize,
        rank: usize,
    ) -> Result<Comm> {
        if world == 0 || rank >= world || world > c_int::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "NCCL communicator: rank {rank} of a world of {world}"
            )));
        }
        let uid = ncclUniqueId {
            internal: id.map(|b| b as c_char),
        };
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer; the id is passed by value.
        let rc = unsafe { (nccl.comm_init_rank)(&mut raw, world as c_int, uid, rank as c_int) };
        nccl.check("ncclCommInitRank", rc)?;
        Ok(Comm {
            nccl,
            raw,
            owned: true,
            rank,
            world,
        })
    }

    /// Use a communicator the caller already has (an `ncclComm_t`).
    ///
    /// # Safety
    /// `raw` must be a live communicator that outlives the returned `Comm` and
    /// that no other thread uses while this crate runs a collective on it.
    pub unsafe fn from_raw(nccl: Arc<Nccl>, raw: *mut c_void) -> Result<Comm> {
        if raw.is_null() {
            return Err(Error::NullArgument("comm"));
        }
        let raw = raw as ncclComm_t;
        let (mut count, mut rank) = (0, 0);
        // SAFETY: the caller vouches `raw` is live; the out pointers are valid.
        nccl.check("ncclCommCount", unsafe {
            (nccl.comm_count)(raw, &mut count)
        })?;
        // SAFETY: as above.
        nccl.check("ncclCommUserRank", unsafe {
            (nccl.comm_user_rank)(raw, &mut rank)
        })?;
        if count <= 0 || rank < 0 || rank >= count {
            return Err(Error::InvalidArgument(format!(
                "NCCL communicator reports rank {rank} of {count}"
            )));
        }
        Ok(Comm {
            nccl,
            raw,
            owned: false,
            rank: rank as usize,
            world: count as usize,
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The library it runs on.
    pub fn nccl(&self) -> &Arc<Nccl> {
        &self.nccl
    }

    /// Queue a broadcast of `len` bytes at `buf` from rank `root` to every
    /// rank, in place, on `stream` (a CUDA stream of the communicator's device).
    ///
    /// # Safety
    /// `buf..buf+len` must be device memory of the communicator's device,
    /// mapped read-write, not freed before the stream reaches this point.
    pub unsafe fn broadcast(
        &mut self,
        buf: DevicePtr,
        len: usize,
        root: usize,
        stream: StreamId,
    ) -> Result<()> {
        if root >= self.world {
            return Err(Error::InvalidArgument(format!(
                "NCCL broadcast: root {root} of a world of {}",
                self.world
            )));
        }
        let p = buf as usize as *mut c_void;
        // SAFETY: the caller vouches for `buf` and `stream`; the communicator is live.
        let rc = unsafe {
            (self.nccl.broadcast)(
                p,
                p,
                len,
                ncclDataType_t::ncclUint8,
                root as c_int,
                self.raw,
                stream.0 as usize as *mut c_void,
            )
        };
        self.nccl.check("ncclBroadcast", rc)
    }

    /// The communicator's asynchronous error, if any (a peer died, a network
    /// failed): polled while waiting on a collective so a failure is reported
    /// instead of waited on forever.
    pub fn async_error(&self) -> Result<()> {
        let mut e: c_int = 0;
        // SAFETY: the communicator is live; `e` is a valid out pointer.
        let rc = unsafe { (self.nccl.comm_get_async_error)(self.raw, &mut e) };
        self.nccl.check("ncclCommGetAsyncError", rc)?;
        if e == 0 || e == 7 {
            Ok(())
        } else {
            self.nccl.check("NCCL communicator (asynchronous error)", e)
        }
    }

    /// Register `len` bytes at `buf` with the communicator for zero-copy
    /// transfers (`ncclCommRegister`). The memory must have been created
    /// RDMA-capable when NCCL's network transport is to use it.
    ///
    /// # Safety
    /// `buf..buf+len` must be mapped device memory of the communicator's
    /// device until the registration is dropped.
    pub unsafe fn register(&self, buf: DevicePtr, len: usize) -> Result<Registration<'_>> {
        let mut handle: *mut c_void = std::ptr::null_mut();
        // SAFETY: the caller vouches for the range; `handle` is a valid out pointer.
        let rc = unsafe {
            (self.nccl.comm_register)(self.raw, buf as usize as *mut c_void, len, &mut handle)
        };
        self.nccl.check("ncclCommRegister", rc)?;
        Ok(Registration { comm: self, handle })
    }
}

impl Comm {
    /// [`Comm::register`] for callers that keep the handle themselves (the C
    /// API): deregister it with [`Comm::deregister_raw`] before the memory
    /// goes or is remapped.
    ///
    /// # Safety
    /// As [`Comm::register`], until the handle is deregistered.
    pub unsafe fn register_raw(&self, buf: DevicePtr, len: usize) -> Result<*mut c_void> {
        // SAFETY: forwarded from the caller's contract.
        let r = unsafe { self.register(buf, len) }?;
        let h = r.handle;
        std::mem::forget(r);
        Ok(h)
    }

    /// Drop a registration made by [`Comm::register_raw`].
    ///
    /// # Safety
    /// `handle` came from `register_raw` on this communicator and is not used again.
    pub unsafe fn deregister_raw(&self, handle: *mut c_void) -> Result<()> {
        // SAFETY: forwarded from the caller's contract.
        let rc = unsafe { (self.nccl.comm_deregister)(self.raw, handle) };
        self.nccl.check("ncclCommDeregister", rc)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if self.owned {
            // A communicator with an asynchronous error cannot be destroyed
            // cleanly; abort it instead.
            let f = if self.async_error().is_err() {
                self.nccl.comm_abort
            } else {
                self.nccl.comm_destroy
            };
            // SAFETY: this `Comm` created the communicator and is its last user.
            let _ = unsafe { f(self.raw) };
        }
    }
}

/// A buffer registered with a communicator; deregistered on drop.
#[derive(Debug)]
pub struct Registration<'a> {
    comm: &'a Comm,
    handle: *mut c_void,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle came from ncclCommRegister on this live communicator.
        let _ = unsafe { (self.comm.nccl.comm_deregister)(self.comm.raw, self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_id_is_the_size_nccl_declares() {
        assert_eq!(std::mem::size_of::<ncclUniqueId>(), UNIQUE_ID_BYTES);
    }

    #[test]
    fn result_names_cover_nccl_codes() {
        assert_eq!(result_name(0), "ncclSuccess");
        assert_eq!(result_name(6), "ncclRemoteError");
        assert_eq!(result_name(99), "unknown NCCL result");
    }
}
