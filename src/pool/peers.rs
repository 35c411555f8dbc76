//! Peer access per tag: a tag's memory made readable (or writable) by other
//! devices of the host. The grant is kept with the tag and with each of its
//! segments, so segments created later and chunks mapped again at wake get it
//! too.

use super::Pool;
use crate::driver::{check_peer_list, PeerAccess};
use crate::error::{Error, Result};
use crate::tag::{self, TagId};

impl Pool {
    /// Grant `peers` access to every segment of `tag`, now and later (new
    /// segments, arena growth, every wake). Peers granted before and missing
    /// from `peers` lose their access; an empty list revokes all.
    ///
    /// Checked before anything changes: no peer is this pool's device or
    /// listed twice, each can reach this device (`cuDeviceCanAccessPeer`), and
    /// each peer's granularity divides the pool's (segments are cut to the
    /// pool's granularity, so a coarser peer could not map them). On a driver
    /// failure midway the earlier grant is put back on every segment.
    pub fn set_peer_access(&self, tag: TagId, peers: &[PeerAccess]) -> Result<()> {
        tag::check(tag)?;
        let d = self.driver.as_ref();
        check_peer_list(d.device(), peers, |p| d.can_access_peer(p))?;
        for p in peers {
            let g = d.granularity_for(p.device)?;
            if g == 0 || !self.granularity.is_multiple_of(g) {
                return Err(Error::InvalidArgument(format!(
                    "peer device {} needs a mapping granularity of {g} bytes, which does not \
                     divide the pool's {} bytes on device {}",
                    p.device,
                    self.granularity,
                    d.device()
                )));
            }
        }
        let mut st = self.lock();
        let old = st
            .tags
            .get(&tag)
            .map(|t| t.peers.clone())
            .unwrap_or_default();
        let bases: Vec<_> = st
            .segs
            .iter()
            .filter(|(_, e)| e.tag == tag)
            .map(|(&b, _)| b)
            .collect();
        for (n, b) in bases.iter().enumerate() {
            let r = st
                .segs
                .get_mut(b)
                .map_or(Ok(()), |e| e.seg.set_peers(peers));
            if let Err(e) = r {
                for done in &bases[..n] {
                    if let Some(entry) = st.segs.get_mut(done) {
                        let _ = entry.seg.set_peers(&old);
                    }
                }
                return Err(e);
            }
        }
        let mut list: Vec<PeerAccess> = peers
            .iter()
            .copied()
            .filter(|p| p.mode != crate::driver::AccessMode::None)
            .collect();
        list.sort();
        st.tags.entry(tag).or_default().peers = list;
        Ok(())
    }

    /// The peers granted access to `tag`'s memory (sorted by device).
    pub fn peer_access(&self, tag: TagId) -> Vec<PeerAccess> {
        self.lock()
            .tags
            .get(&tag)
            .map(|t| t.peers.clone())
            .unwrap_or_default()
    }
}
