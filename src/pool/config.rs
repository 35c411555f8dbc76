//! How a pool is sized and how each tag's blocks are placed, and the checks
//! a configuration passes before a pool takes it.

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::tag::TagId;

/// How a tag's blocks are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Cached segments split into blocks (small and large classes).
    #[default]
    Segments,
    /// One VA reservation of `reserve_bytes` per tag; physical memory is
    /// committed as the arena grows, in chunks of up to `grow_step` bytes
    /// (rounded to the granularity), and `trim` decommits the free tail.
    /// Requests that no longer fit fall back to `Segments`.
    Arena {
        /// VA reserved for the arena (rounded up to the granularity).
        reserve_bytes: usize,
        /// Largest physical chunk created at once; also the unit `trim` frees.
        /// 0 means the granularity.
        grow_step: usize,
    },
}

/// Sizes and policies of a pool.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Every block size is rounded up to this (a power of two).
    pub align: usize,
    /// Requests up to this size come from small segments.
    pub small_request_max: usize,
    /// Size of a small segment (rounded up to the granularity).
    pub small_segment_bytes: usize,
    /// Size of a shared large segment; requests above half of it get a segment of their own.
    pub large_segment_bytes: usize,
    /// Largest physical chunk of a `Segments` segment (0 = one chunk per segment).
    pub chunk_bytes: usize,
    /// The mode of tags without an entry in `tag_modes`.
    pub default_mode: Mode,
    /// Per-tag modes.
    pub tag_modes: HashMap<TagId, Mode>,
    /// Sleep/wake tunables (copy pieces, streams, host-memory limit, debug fill).
    pub sleep: crate::sleep::SleepOptions,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            align: 512,
            small_request_max: 1 << 20,
            small_segment_bytes: 2 << 20,
            large_segment_bytes: 20 << 20,
            chunk_bytes: 0,
            default_mode: Mode::Segments,
            tag_modes: HashMap::new(),
            sleep: crate::sleep::SleepOptions::default(),
        }
    }
}

impl PoolConfig {
    pub(super) fn validate(&self) -> Result<()> {
        if self.align == 0 || !self.align.is_power_of_two() {
            return Err(Error::InvalidArgument(format!(
                "pool align {} must be a power of two",
                self.align
            )));
        }
        if self.small_segment_bytes < self.small_request_max || self.small_segment_bytes == 0 {
            return Err(Error::InvalidArgument(format!(
                "small_segment_bytes {} must be at least small_request_max {} and non-zero",
                self.small_segment_bytes, self.small_request_max
            )));
        }
        if self.large_segment_bytes == 0 {
            return Err(Error::InvalidArgument(
                "large_segment_bytes must be non-zero".into(),
            ));
        }
        let max = crate::units::MAX_BYTES;
        for (what, n) in [
            ("align", self.align),
            ("small_request_max", self.small_request_max),
            ("small_segment_bytes", self.small_segment_bytes),
            ("large_segment_bytes", self.large_segment_bytes),
            ("chunk_bytes", self.chunk_bytes),
        ] {
            if n > max {
                return Err(Error::InvalidArgument(format!(
                    "pool {what} of {n} bytes is over the limit of {max} bytes (2^56)"
                )));
            }
        }
        self.sleep.validate()?;
        for m in std::iter::once(&self.default_mode).chain(self.tag_modes.values()) {
            check_mode(*m)?;
        }
        Ok(())
    }
}

pub(super) fn check_mode(m: Mode) -> Result<()> {
    if let Mode::Arena {
        reserve_bytes,
        grow_step,
    } = m
    {
        if reserve_bytes == 0 {
            return Err(Error::InvalidArgument(
                "arena reserve_bytes must be non-zero".into(),
            ));
        }
        let max = crate::units::MAX_BYTES;
        if reserve_bytes > max || grow_step > max {
            return Err(Error::InvalidArgument(format!(
                "arena reserve_bytes {reserve_bytes} and grow_step {grow_step} must be at most {max} bytes (2^56)"
            )));
        }
    }
    Ok(())
}
