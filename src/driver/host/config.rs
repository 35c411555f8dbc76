//! The host backend's configuration: granularity, simulated memory and the
//! number of simulated devices, with their environment overrides.

use crate::error::{Error, Result};
use crate::units::{page_size, parse_bytes};

/// Default simulated granularity: 2 MiB, as on an H200.
pub const DEFAULT_GRANULARITY: usize = 2 << 20;
/// Default simulated device memory: 64 GiB (memfd pages cost nothing until touched).
pub const DEFAULT_MEMORY_LIMIT: u64 = 64 << 30;

/// Default number of simulated devices.
pub const DEFAULT_DEVICE_COUNT: i32 = 8;

/// How many devices the host backend simulates: `VMMW_HOST_DEVICES`, else 8.
pub fn host_device_count() -> Result<i32> {
    match std::env::var("VMMW_HOST_DEVICES") {
        Ok(v) => match v.trim().parse::<i32>() {
            Ok(n) if (1..=1024).contains(&n) => Ok(n),
            _ => Err(Error::InvalidArgument(format!(
                "VMMW_HOST_DEVICES=`{v}`: expected a device count from 1 to 1024"
            ))),
        },
        Err(_) => Ok(DEFAULT_DEVICE_COUNT),
    }
}

/// Configuration of the host backend.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Mapping granularity; a multiple of the OS page size.
    pub granularity: usize,
    /// Simulated device memory: `create` fails with out-of-memory beyond it.
    pub memory_limit: u64,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            granularity: DEFAULT_GRANULARITY,
            memory_limit: DEFAULT_MEMORY_LIMIT,
        }
    }
}

impl HostConfig {
    /// Defaults, overridden by `VMMW_HOST_GRANULARITY` and `VMMW_HOST_MEMORY`
    /// (byte counts as [`crate::units::parse_bytes`] reads them: 64M, 1GiB).
    pub fn from_env() -> Result<HostConfig> {
        let mut c = HostConfig::default();
        if let Ok(v) = std::env::var("VMMW_HOST_GRANULARITY") {
            c.granularity = parse_bytes(&v)
                .map_err(|e| Error::InvalidArgument(format!("VMMW_HOST_GRANULARITY=`{v}`: {e}")))?
                as usize;
        }
        if let Ok(v) = std::env::var("VMMW_HOST_MEMORY") {
            c.memory_limit = parse_bytes(&v)
                .map_err(|e| Error::InvalidArgument(format!("VMMW_HOST_MEMORY=`{v}`: {e}")))?;
        }
        c.validate()
            .map_err(|e| match (e, std::env::var("VMMW_HOST_GRANULARITY")) {
                (Error::InvalidArgument(m), Ok(v)) => {
                    Error::InvalidArgument(format!("VMMW_HOST_GRANULARITY=`{v}`: {m}"))
                }
                (e, _) => e,
            })?;
        Ok(c)
    }

    pub(super) fn validate(&self) -> Result<()> {
        let page = page_size();
        // Reservations align to the granularity, and an alignment is a power
        // of two (as every CUDA granularity is).
        if !self.granularity.is_power_of_two() || !self.granularity.is_multiple_of(page) {
            return Err(Error::InvalidArgument(format!(
                "host granularity {} must be a power of two and a multiple of the page size {page}",
                self.granularity
            )));
        }
        Ok(())
    }
}
