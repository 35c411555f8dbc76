//! What the transport tests share: an engine rank (a Llama-shaped checkpoint
//! loaded through the llama preset, tensor-parallel when the world is above
//! one) and the trainer's new tensors; what each rank must hold after an
//! update is sliced from the full tensors by `loader_tp::expected`, not by
//! the library.

use crate::common;
use crate::loader_tp::{expected, models, tensors, Model};

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use common::loader::*;
use vmmweights::driver::host::{HostConfig, HostDriver};
use vmmweights::loader::{Dtype, Session, Tp};
use vmmweights::update::transport::{receive, BucketSource, SendData, SendTensor};
use vmmweights::update::{UpdateOptions, UpdateResult};
use vmmweights::{tag, Driver, Pool, PoolConfig};

/// The llama-shaped model of `loader_tp` (4 kv heads: cut up to world 4,
/// replicated at 8).
pub fn model() -> Model {
    models().into_iter().next().unwrap()
}

/// The trainer's values: the checkpoint's tensors with other bytes.
pub fn new_values(m: &Model, seed: u64) -> Tensors {
    tensors(m)
        .into_iter()
        .enumerate()
        .map(|(i, (n, (sh, b)))| (n, (sh, values(seed + i as u64, b.len() / 2, Dtype::Bf16))))
        .collect()
}

/// The trainer's tensors as a sender takes them (host memory).
pub fn send_tensors(new: &Tensors) -> Vec<SendTensor<'_>> {
    new.iter()
        .map(|(name, (shape, bytes))| SendTensor {
            name: name.clone(),
            dtype: Dtype::Bf16,
            shape: shape.clone(),
            data: SendData::Host(bytes),
        })
        .collect()
}

/// Write the model's checkpoint into `dir`.
pub fn write_checkpoint(dir: &Path, m: &Model) {
    write_sharded(dir, &tensors(m), Dtype::Bf16, 3);
}

pub fn host_driver() -> Arc<dyn Driver> {
    Arc::new(HostDriver::new(HostConfig {
        granularity: 64 << 10,
        memory_limit: 1 << 30,
    }))
}

/// One engine rank with the checkpoint in `dir` loaded.
pub struct Rank {
    pub pool: Arc<Pool>,
    pub session: Session,
    pub tag: tag::TagId,
    pub rank: usize,
    pub world: usize,
}

impl Rank {
    pub fn load(dir: &Path, m: &Model, name: &str, rank: usize, world: usize) -> Rank {
        Rank::load_on(host_driver(), dir, m, name, rank, world)
    }

    /// [`Rank::load`] on `driver`'s device.
    pub fn load_on(
        driver: Arc<dyn Driver>,
        dir: &Path,
        m: &Model,
        name: &str,
        rank: usize,
        world: usize,
    ) -> Rank {
        let pool = Arc::new(Pool::new(driver, PoolConfig::default()).unwrap());
        let t = tag::id(&format!("{name}-{world}-{rank}")).unwrap();
        let session = Session::open(dir).unwrap();
        let tp = (world > 1).then_some(Tp { rank, world });
        session.set_preset(m.preset, tp, m.shape.head_dim).unwrap();
        session.allocate(&pool, t).unwrap();
        session.load(&pool, None).unwrap();
        Rank {
            pool,
            session,
            tag: t,
            rank,
            world,
        }
    }

    pub fn version(&self) -> u64 {
        self.pool.tag_version(self.tag).unwrap()
    }

    /// Every destination's bytes, by name.
    pub fn snapshot(&self) -> BTreeMap<String, Vec<u8>> {
        self.session
            .destinations()
            .into_iter()
            .map(|x| {
                (
                    x.name.clone(),
                    read(self.pool.driver().as_ref(), x.ptr, x.bytes()),
                )
            })
            .collect()
    }

    /// What this rank must hold of `full` (the model's tensors of some version).
    pub fn expected(&self, m: &Model, full: &Tensors) -> BTreeMap<String, Vec<u8>> {
        self.session
            .destinations()
            .into_iter()
            .map(|x| {
                let want = expected(full, &m.shape, &x.name, self.rank, self.world);
                (x.name.clone(), want)
            })
            .collect()
    }

    /// Run one update from `source` at this rank's version.
    pub fn receive(&self, source: &mut dyn BucketSource) -> vmmweights::Result<UpdateResult> {
        let opts = UpdateOptions::from_version(self.version());
        receive(source, &self.session, &self.pool, &opts)
    }
}
