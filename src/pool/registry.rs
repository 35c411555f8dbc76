//! The process-wide pool registry: one pool per device, created on first use
//! with the backend `VMMW_BACKEND` names. The PyTorch entry points and
//! `vmmw_pool_default` share it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use super::{Pool, PoolConfig};
use crate::driver::{self, BackendChoice};
use crate::error::{Error, Result};

fn pools() -> &'static Mutex<HashMap<i32, Arc<Pool>>> {
    static POOLS: OnceLock<Mutex<HashMap<i32, Arc<Pool>>>> = OnceLock::new();
    POOLS.get_or_init(|| Mutex::new(HashMap::new()))
}

fn new_pool_config() -> &'static Mutex<PoolConfig> {
    static CONFIG: OnceLock<Mutex<PoolConfig>> = OnceLock::new();
    CONFIG.get_or_init(|| Mutex::new(PoolConfig::default()))
}

/// The configuration the process-global pools created from now on get (the
/// default `PoolConfig` unless set); pools already created keep theirs. A
/// program that owns the process's allocations sets it before its first one:
/// the CUDA runtime interposer cuts big segments into chunks so a sleep gives
/// memory back, and a wake takes it, chunk by chunk.
pub fn set_new_pool_config(config: PoolConfig) {
    *new_pool_config().lock().unwrap_or_else(|p| p.into_inner()) = config;
}

/// The process-global pool of `device`, created on first use with the backend
/// named by `VMMW_BACKEND` (auto by default). The PyTorch entry points and
/// `vmmw_pool_default` share it. A failed creation is not cached: the next call tries again.
pub fn global_pool(device: i32) -> Result<Arc<Pool>> {
    if device < 0 {
        return Err(Error::InvalidArgument(format!(
            "device ordinal {device} is negative"
        )));
    }
    // Map entries are inserted whole; a poisoned lock still holds a valid map.
    let mut map = pools().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = map.get(&device) {
        return Ok(p.clone());
    }
    let opened = driver::open(BackendChoice::from_env()?, device)?;
    let config = new_pool_config()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let pool = Arc::new(Pool::new(opened.driver, config)?);
    map.insert(device, pool.clone());
    Ok(pool)
}

/// The process-global pool of `device` if it was already created.
pub fn existing_pool(device: i32) -> Option<Arc<Pool>> {
    pools()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&device)
        .cloned()
}

/// Every process-global pool created so far, by device ordinal.
pub fn all_pools() -> Vec<Arc<Pool>> {
    let map = pools().lock().unwrap_or_else(|p| p.into_inner());
    let mut v: Vec<(i32, Arc<Pool>)> = map.iter().map(|(&d, p)| (d, p.clone())).collect();
    v.sort_by_key(|(d, _)| *d);
    v.into_iter().map(|(_, p)| p).collect()
}
