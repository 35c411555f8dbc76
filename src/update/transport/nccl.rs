//! NCCL as the broadcast transport's collective: a communicator the caller
//! lends (an `ncclComm_t`, as torch.distributed's `ProcessGroupNCCL` holds)
//! or one created from a unique id the caller shares between its ranks (the
//! way torch.distributed and vLLM bootstrap NCCL). NCCL itself is opened at
//! run time ([`crate::driver::nccl`]).

use std::ffi::c_void;
use std::sync::Arc;

use super::broadcast::Collective;
use crate::driver::nccl::{Comm, Nccl, UNIQUE_ID_BYTES};
use crate::driver::{DevicePtr, Driver, StreamId};
use crate::error::Result;

/// An NCCL communicator used as a [`Collective`].
#[derive(Debug)]
pub struct NcclCollective {
    comm: Comm,
}

impl NcclCollective {
    /// Join the communicator of `world` ranks named by `id` as `rank`, on
    /// `driver`'s device. Every rank must call this; it returns when all did.
    pub fn from_unique_id(
        driver: &Arc<dyn Driver>,
        id: &[u8; UNIQUE_ID_BYTES],
        world: usize,
        rank: usize,
    ) -> Result<Self> {
        let nccl = Nccl::open()?;
        // NCCL takes the device current on this thread; creating a stream
        // makes the driver's context current here.
        let s = driver.stream_create()?;
        let comm = Comm::init_rank(nccl, id, world, rank);
        let _ = driver.stream_destroy(s);
        Ok(NcclCollective { comm: comm? })
    }

    /// Use a communicator the caller already has.
    ///
    /// # Safety
    /// `comm` must be a live `ncclComm_t` of this process that outlives the
    /// returned value and that nothing else uses during an update.
    pub unsafe fn from_raw(comm: *mut c_void) -> Result<Self> {
        let nccl = Nccl::open()?;
        // SAFETY: forwarded from the caller's contract.
        Ok(NcclCollective {
            comm: unsafe { Comm::from_raw(nccl, comm)? },
        })
    }

    /// A new unique id: rank 0 makes it and shares its bytes with the others.
    pub fn unique_id() -> Result<[u8; UNIQUE_ID_BYTES]> {
        Nccl::open()?.unique_id()
    }

    /// The communicator.
    pub fn comm(&self) -> &Comm {
        &self.comm
    }
}

impl Collective for NcclCollective {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn world(&self) -> usize {
        self.comm.world()
    }

    unsafe fn broadcast(
        &mut self,
        buf: DevicePtr,
        len: usize,
        root: usize,
        stream: StreamId,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.comm.broadcast(buf, len, root, stream) }
    }

    fn check(&self) -> Result<()> {
        self.comm.async_error()
    }
}
