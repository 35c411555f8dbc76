//! The seam between sleep's Reload policy and the loader: something that can
//! write a tensor's bytes back into device memory from where they came from.

use crate::driver::{DevicePtr, Driver};
use crate::error::Result;

/// Restores device bytes from their source (the loader's executed plan).
///
/// Sleep with the Reload policy keeps in the host backup only the bytes that
/// no registered source covers (buffers a model computes itself, later
/// allocations, padding); at wake, [`ReloadSource::check`] runs for every
/// source before any memory is mapped, then, once the memory is mapped again,
/// every source restores the parts of `ranges` it still covers. A source's
/// coverage shrinks as the blocks it wrote are freed (the engine tracks that,
/// not the source); a source left with no coverage is dropped and
/// [`ReloadSource::retire`] is called.
pub trait ReloadSource: Send + Sync + std::fmt::Debug {
    /// Re-copy every byte this source originally wrote that falls inside one of
    /// `ranges` (`(address, length)` pairs), clipped to them. Returns the bytes
    /// written. Must have completed (device synchronized) when it returns.
    fn reload(&self, driver: &dyn Driver, ranges: &[(DevicePtr, usize)]) -> Result<u64>;

    /// The device ranges this source writes, so sleep can tell which bytes of a
    /// tag are restorable and which would come back undefined.
    fn covered_ranges(&self) -> Vec<(DevicePtr, usize)>;

    /// What this source wrote, piece by piece (the loader: one piece per
    /// copy, a tensor or a slice of one), each inside
    /// [`ReloadSource::covered_ranges`]. A Reload sleep proves each piece
    /// unchanged on its own (see [`crate::sleep::proof`]), so a write into
    /// one tensor never costs its neighbours their proof.
    fn pieces(&self) -> Vec<(DevicePtr, usize)> {
        self.covered_ranges()
    }

    /// Check, before any byte is touched, that `reload` can restore exactly
    /// what was loaded (the loader checks each file's identity, size and
    /// modification time, and the optional content checksums). An error here
    /// leaves the tag asleep with its backup intact.
    fn check(&self) -> Result<()> {
        Ok(())
    }

    /// Called when the engine drops its last registration of this source:
    /// release what only replays needed (pinned page cache, mappings).
    fn retire(&self) {}

    /// Called once the tag has gone to sleep with Reload: start whatever makes
    /// the next `reload` faster (the loader pins the checkpoint's page cache in
    /// the background). Must return at once.
    fn prepare(&self) {}

    /// Block until the work `prepare` started is done (for benchmarks and
    /// callers who want a predictable wake). `reload` never needs it: it uses
    /// the prepared path only when ready.
    fn wait_prepared(&self) {}
}
