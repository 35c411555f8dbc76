//! How a share is served: the sleep policy toward importers, who may
//! attach, and the bounds on connections and handshakes.

use std::time::Duration;

use super::log::LogSink;

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
