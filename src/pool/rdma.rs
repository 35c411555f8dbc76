//! RDMA-capable tags: memory that NICs and collectives (NCCL's
//! `ncclCommRegister`, NIXL, UCX) can register, created with the driver's
//! `gpuDirectRDMACapable` flag, again at every wake. A wake maps new physical
//! pages, so registrations go stale: `pool::remap` says when.

use super::Pool;
use crate::driver::CreateFlags;
use crate::error::{Error, Result};
use crate::tag::{self, TagId};

impl Pool {
    /// Create `tag`'s memory in this pool RDMA-capable (`rdma`) or not, from
    /// its first allocation on. Refused, changing nothing, when the device
    /// cannot create RDMA-capable VMM memory (the driver's
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`), and
    /// when the tag already holds segments here (they were created the other
    /// way; free them and trim first).
    pub fn set_tag_rdma(&self, tag: TagId, rdma: bool) -> Result<()> {
        tag::check(tag)?;
        if rdma && !self.driver.rdma_supported()? {
            return Err(Error::Unsupported(format!(
                "tag {tag}: {} cannot create RDMA-capable memory (the driver reports no GPUDirect RDMA for VMM allocations)",
                self.driver.describe()
            )));
        }
        let mut st = self.lock();
        let segments = st.segs.values().filter(|e| e.tag == tag).count();
        let ts = st.tags.entry(tag).or_default();
        if ts.create.rdma == rdma {
            return Ok(());
        }
        if segments > 0 {
            return Err(Error::InvalidState(format!(
                "tag {tag} already holds {segments} segment(s) created {} the RDMA flag in this pool; set the flag before its first allocation (or free its blocks and trim)",
                if ts.create.rdma { "with" } else { "without" }
            )));
        }
        ts.create = CreateFlags { rdma };
        Ok(())
    }

    /// Whether `tag`'s memory in this pool is created RDMA-capable.
    pub fn tag_rdma(&self, tag: TagId) -> bool {
        self.lock().tags.get(&tag).is_some_and(|t| t.create.rdma)
    }
}
