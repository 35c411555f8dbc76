//! The seam between sleep's Reload policy and the loader: something that can
//! write a tensor's bytes back into device memory from where they came from.

use crate::driver::{DevicePtr, Driver};
use crate::error::Result;

/// Restores device bytes from their source (the loader's executed plan).
///
/// Sleep with the Reload policy keeps no host backup; at wake, after the
/// memory is mapped again, every registered source for the tag is asked to
/// restore the parts of `ranges` it wrote at load time.
pub trait ReloadSource: Send + Sync + std::fmt::Debug {
    /// Re-copy every byte this source originally wrote that falls inside one of
    /// `ranges` (`(address, length)` pairs), clipped to them. Returns the bytes
    /// written. Must have completed (device synchronized) when it returns.
    fn reload(&self, driver: &dyn Driver, ranges: &[(DevicePtr, usize)]) -> Result<u64>;

    /// The device ranges this source writes, so sleep can tell which bytes of a
    /// tag are restorable and which would come back undefined.
    fn covered_ranges(&self) -> Vec<(DevicePtr, usize)>;

    /// Called once the tag has gone to sleep with Reload: start whatever makes
    /// the next `reload` faster (the loader pins the checkpoint's page cache in
    /// the background). Must return at once.
    fn prepare(&self) {}

    /// Block until the work `prepare` started is done (for benchmarks and
    /// callers who want a predictable wake). `reload` never needs it: it uses
    /// the prepared path only when ready.
    fn wait_prepared(&self) {}
}
