//! How a share is served: the sleep policy toward importers, who may
//! attach, and the bounds on connections and handshakes.

use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::log::LogSink;
use super::wire::{self, PeerCred};

/// What the owner's sleep of a shared tag does to attached importers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SleepPolicy {
    /// The sleep fails (`InvalidState`) while any importer is attached.
    #[default]
    Refuse,
    /// The sleep proceeds; every attached importer is told, and its next call
    /// through the API fails with `ShareRevoked`. Its mapping stays valid (the
    /// memory lives until it detaches), so nothing faults.
    Revoke,
}

/// Connections served at once (handshaking and attached) unless set.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Longest handshake (request, manifest, descriptors) unless set.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How a share is served.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// What the owner's sleep of the tag does to importers.
    pub sleep_policy: SleepPolicy,
    /// Allow importers to map read-write (default: read-only).
    pub allow_write: bool,
    /// User ids allowed to attach; `None` allows only this process's user.
    pub allowed_uids: Option<Vec<u32>>,
    /// Group ids whose members may attach too (the peer's primary group or
    /// one of its supplementary groups).
    pub allowed_gids: Vec<u32>,
    /// Most connections served at once, handshaking and attached; past it a
    /// peer is refused with the reason. At least 1.
    pub max_connections: usize,
    /// One deadline for each handshake, from accept to the last descriptor sent.
    pub handshake_timeout: Duration,
    /// Where audit lines (every attach, refusal, eviction and detach, with the
    /// peer's pid, uid and gid) and warnings go; standard error by default.
    pub log: LogSink,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            sleep_policy: SleepPolicy::default(),
            allow_write: false,
            allowed_uids: None,
            allowed_gids: Vec::new(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            log: LogSink::default(),
        }
    }
}

/// The admission rule of every socket this library serves (shares and the
/// control channel): a peer is allowed when its uid is listed (`None`
/// lists only this process's own user), or when `allowed_gids` names its
/// primary group or one of its supplementary groups (`SO_PEERGROUPS`).
pub fn peer_allowed(
    allowed_uids: Option<&[u32]>,
    allowed_gids: &[u32],
    cred: &PeerCred,
    sock: &UnixStream,
) -> bool {
    let by_uid = match allowed_uids {
        None => cred.uid == wire::own_uid(),
        Some(uids) => uids.contains(&cred.uid),
    };
    by_uid
        || (!allowed_gids.is_empty()
            && (allowed_gids.contains(&cred.gid)
                || wire::peer_groups(sock)
                    .iter()
                    .any(|g| allowed_gids.contains(g))))
}

/// Whom [`peer_allowed`] accepts, in words for a refusal ("uid 1000 (the
/// owner's)", "uids [1000, 1001] and gids [27]").
pub fn peers_accepted(allowed_uids: Option<&[u32]>, allowed_gids: &[u32]) -> String {
    let uids = match allowed_uids {
        None => format!("uid {} (the owner's)", wire::own_uid()),
        Some(u) => format!("uids {u:?}"),
    };
    if allowed_gids.is_empty() {
        uids
    } else {
        format!("{uids} and gids {allowed_gids:?}")
    }
}
