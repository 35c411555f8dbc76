//! The control channel's messages: one JSON object per line each way.
//!
//! Requests are parsed strictly (an unknown field or operation is refused
//! with the reason, so a client never believes an option took effect that
//! this process does not know); answers carry fields clients may ignore, so
//! a newer process can add some.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result, Status};
use crate::sleep::Policy;
use crate::tag;

/// Longest request line, in bytes, without its newline.
pub const MAX_LINE: usize = 64 << 10;
/// Most tags one request may name.
pub const MAX_TAGS: usize = 1024;
/// Longest wait for memory a wake may ask for (one hour).
pub const MAX_WAIT_MEMORY_MS: u64 = 3_600_000;

/// A sleep policy as the wire spells it. Reload is not offered: a process
/// under the interposer has no checkpoint the library loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WirePolicy {
    /// Copied to a pinned host backup, then released.
    #[default]
    Offload,
    /// As Offload, the backup losslessly compressed on the device.
    OffloadCompressed,
    /// Released; contents undefined after wake.
    Discard,
}

impl WirePolicy {
    /// The sleep engine's policy.
    pub fn policy(self) -> Policy {
        match self {
            WirePolicy::Offload => Policy::Offload,
            WirePolicy::OffloadCompressed => Policy::OffloadCompressed,
            WirePolicy::Discard => Policy::Discard,
        }
    }

    /// The wire policy of an engine policy; Reload has none.
    pub fn from_policy(p: Policy) -> Result<WirePolicy> {
        match p {
            Policy::Offload => Ok(WirePolicy::Offload),
            Policy::OffloadCompressed => Ok(WirePolicy::OffloadCompressed),
            Policy::Discard => Ok(WirePolicy::Discard),
            Policy::Reload => Err(Error::InvalidArgument(
                "the reload policy needs a checkpoint loaded by this library; a controlled \
                 process sleeps with offload, offload_compressed or discard"
                    .into(),
            )),
        }
    }

    /// The name on the wire ("offload_compressed").
    pub fn name(self) -> &'static str {
        match self {
            WirePolicy::Offload => "offload",
            WirePolicy::OffloadCompressed => "offload_compressed",
            WirePolicy::Discard => "discard",
        }
    }
}

/// One request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// What the process holds and in which state. (A struct variant, so an
    /// unknown field beside it is refused like any other.)
    Status {},
    /// Synchronize every device the process used, then sleep its tags.
    Sleep {
        /// How (offload unless given).
        #[serde(default)]
        policy: WirePolicy,
        /// Only these tags (every tag of the process when absent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tags: Option<Vec<String>>,
    },
    /// Wake the tags asleep (or those listed).
    Wake {
        /// Only these tags (every asleep tag when absent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tags: Option<Vec<String>>,
        /// Wait up to this long for device memory another process or tag is
        /// releasing, instead of refusing at once when free memory is short.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_memory_ms: Option<u64>,
    },
}

impl Request {
    /// Parse one request line (without its newline) and check its values.
    pub fn parse(line: &[u8]) -> Result<Request> {
        let text = std::str::from_utf8(line).map_err(|e| {
            Error::InvalidArgument(format!(
                "the request is not UTF-8 ({e}): send one JSON object per line"
            ))
        })?;
        let r: Request = serde_json::from_str(text).map_err(|e| {
            Error::InvalidArgument(format!(
                "bad request ({e}); expected one JSON object per line with \"op\" one of \
                 \"status\", \"sleep\", \"wake\""
            ))
        })?;
        r.check()?;
        Ok(r)
    }

    /// Check the values a well-formed request carries.
    pub fn check(&self) -> Result<()> {
        let tags = match self {
            Request::Status {} => None,
            Request::Sleep { tags, .. } => tags.as_ref(),
            Request::Wake {
                tags,
                wait_memory_ms,
            } => {
                if let Some(ms) = wait_memory_ms {
                    if *ms > MAX_WAIT_MEMORY_MS {
                        return Err(Error::InvalidArgument(format!(
                            "wait_memory_ms {ms} is over the limit of {MAX_WAIT_MEMORY_MS} (one hour)"
                        )));
                    }
                }
                tags.as_ref()
            }
        };
        if let Some(tags) = tags {
            if tags.is_empty() {
                return Err(Error::InvalidArgument(
                    "tags: an empty list names nothing; leave \"tags\" out to act on every tag"
                        .into(),
                ));
            }
            if tags.len() > MAX_TAGS {
                return Err(Error::InvalidArgument(format!(
                    "tags: {} names, at most {MAX_TAGS}",
                    tags.len()
                )));
            }
            for t in tags {
                if t.is_empty() || t.len() > tag::MAX_NAME_LEN || t.chars().any(char::is_control) {
                    return Err(Error::InvalidArgument(format!(
                        "tags: {t:?} is not a tag name (1 to {} bytes, no control characters)",
                        tag::MAX_NAME_LEN
                    )));
                }
            }
        }
        Ok(())
    }

    /// The request as one line (with its newline).
    pub fn to_line(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).expect("requests serialize");
        v.push(b'\n');
        v
    }
}

/// The wake's wait for memory, as a duration (`None`: refuse at once).
pub fn wait_of(wait_memory_ms: Option<u64>) -> Option<Duration> {
    wait_memory_ms
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
}

/// Where a controlled process stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Every tag is awake (or nothing is allocated yet).
    Awake,
    /// At least one tag is asleep: the process must not touch its memory.
    Asleep,
    /// A sleep is running.
    Sleeping,
    /// A wake is running.
    Waking,
}

/// One tag of one device, in a status answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TagStatus {
    /// The device ordinal.
    pub device: i32,
    /// The tag's name.
    pub tag: String,
    /// Whether it is asleep.
    pub asleep: bool,
    /// Bytes of blocks the process holds.
    pub live_bytes: u64,
    /// Bytes physically backed now.
    pub tracked_bytes: u64,
    /// Bytes of host memory holding its backup.
    pub backup_bytes: u64,
}

/// One device, in a status answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStatus {
    /// The device ordinal.
    pub device: i32,
    /// Free bytes the driver reports (every process).
    pub free: u64,
    /// The device's total bytes.
    pub total: u64,
    /// Bytes physically backed by this process's pool.
    pub ours: u64,
    /// Of `ours`, bytes of segments no block uses: given back on demand
    /// (the interposer's `cudaMemGetInfo` counts them as free).
    pub cached: u64,
}

/// The answer to `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusAnswer {
    /// Always true.
    pub ok: bool,
    /// The process's id.
    pub pid: u32,
    /// Where it stands.
    pub state: Phase,
    /// Each tag of each device, by device then tag.
    pub tags: Vec<TagStatus>,
    /// Each device the process allocated on.
    pub devices: Vec<DeviceStatus>,
    /// Host memory holding backups, over every tag.
    pub host_backup_bytes: u64,
    /// The last sleep or wake answer (a refusal too), or null.
    pub last: Option<Value>,
    /// Fields the serving process adds (the interposer's scope, counts, a note).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// What one sleep or wake did to one tag of one device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TagCycleAnswer {
    /// The device ordinal.
    pub device: i32,
    /// The tag's name.
    pub tag: String,
    /// Physical bytes released (sleep) or mapped (wake).
    pub bytes: u64,
    /// Bytes copied between the device and the host backup.
    pub copied_bytes: u64,
    /// Wall time of this tag's step.
    pub seconds: f64,
}

/// The answer to `sleep` and `wake`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CycleAnswer {
    /// Always true.
    pub ok: bool,
    /// "sleep" or "wake".
    pub op: String,
    /// The policy of a sleep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<WirePolicy>,
    /// Wall time of the whole call.
    pub seconds: f64,
    /// Of it, the device synchronization before a sleep (0 for a wake).
    pub sync_seconds: f64,
    /// Of it, a wake's wait for memory (0 for a sleep).
    #[serde(default)]
    pub wait_seconds: f64,
    /// The devices synchronized before a sleep.
    #[serde(default)]
    pub synced_devices: Vec<i32>,
    /// Physical bytes released (sleep) or mapped (wake).
    pub bytes: u64,
    /// Bytes the backups hold after a sleep, or restored from them by a wake.
    pub backup_bytes: u64,
    /// Each tag acted on.
    pub tags: Vec<TagCycleAnswer>,
}

/// The line a refusal is sent as: `{"ok":false,"code":...,"error":...}`.
pub fn refusal(e: &Error) -> Value {
    refusal_with(e.status(), &e.to_string())
}

/// A refusal with a status and a message of the server's own.
pub fn refusal_with(status: Status, message: &str) -> Value {
    serde_json::json!({ "ok": false, "code": status.name(), "error": message })
}

/// A value as one line (with its newline).
pub fn line_of(v: &impl Serialize) -> Vec<u8> {
    let mut out = serde_json::to_vec(v).unwrap_or_else(|e| {
        serde_json::to_vec(&refusal_with(
            Status::Panic,
            &format!("the answer could not be written as JSON: {e}"),
        ))
        .expect("a refusal serializes")
    });
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad(line: &str) -> String {
        let e = Request::parse(line.as_bytes()).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        e.to_string()
    }

    #[test]
    fn requests_parse_with_their_defaults() {
        assert_eq!(
            Request::parse(br#"{"op":"status"}"#).unwrap(),
            Request::Status {}
        );
        assert_eq!(
            Request::parse(br#"{"op":"sleep"}"#).unwrap(),
            Request::Sleep {
                policy: WirePolicy::Offload,
                tags: None
            }
        );
        assert_eq!(
            Request::parse(br#"{"op":"sleep","policy":"offload_compressed","tags":["a"]}"#)
                .unwrap(),
            Request::Sleep {
                policy: WirePolicy::OffloadCompressed,
                tags: Some(vec!["a".into()])
            }
        );
        assert_eq!(
            Request::parse(br#"{"wait_memory_ms":5,"op":"wake"}"#).unwrap(),
            Request::Wake {
                tags: None,
                wait_memory_ms: Some(5)
            }
        );
        for r in [
            Request::Status {},
            Request::Wake {
                tags: Some(vec!["x".into()]),
                wait_memory_ms: Some(3),
            },
        ] {
            let line = r.to_line();
            assert_eq!(line.last(), Some(&b'\n'));
            assert_eq!(Request::parse(&line[..line.len() - 1]).unwrap(), r);
        }
    }

    #[test]
    fn bad_requests_are_refused_with_the_reason() {
        assert!(bad(r#"{"op":"explode"}"#).contains("unknown variant"));
        assert!(bad(r#"{"op":"sleep","policy":"reload"}"#).contains("unknown variant"));
        assert!(bad(r#"{"op":"status","extra":1}"#).contains("unknown field"));
        assert!(bad(r#"{"op":"wake","wait":1}"#).contains("unknown field"));
        assert!(bad(r#"{"policy":"offload"}"#).contains("op"));
        assert!(bad("not json").contains("one JSON object per line"));
        assert!(bad(r#"{"op":"sleep","tags":[]}"#).contains("empty list"));
        assert!(bad(r#"{"op":"wake","wait_memory_ms":3600001}"#).contains("one hour"));
        assert!(bad(r#"{"op":"wake","wait_memory_ms":-1}"#).contains("bad request"));
        let long = "x".repeat(tag::MAX_NAME_LEN + 1);
        assert!(bad(&format!(r#"{{"op":"sleep","tags":["{long}"]}}"#)).contains("not a tag name"));
        assert!(bad("{\"op\":\"sleep\",\"tags\":[\"a\\nb\"]}").contains("not a tag name"));
        let e = Request::parse(&[0xff, 0xfe]).unwrap_err();
        assert!(e.to_string().contains("not UTF-8"), "{e}");
    }

    #[test]
    fn refusals_name_the_status() {
        let v = refusal(&Error::UnknownTag("'kv' is unknown".into()));
        assert_eq!(v["ok"], false);
        assert_eq!(v["code"], "VMMW_UNKNOWN_TAG");
        assert!(v["error"].as_str().unwrap().contains("'kv' is unknown"));
        assert_eq!(
            Status::from_name("VMMW_UNKNOWN_TAG"),
            Some(Status::UnknownTag)
        );
        assert_eq!(Status::from_name("VMMW_NOPE"), None);
    }

    #[test]
    fn policies_map_both_ways() {
        for w in [
            WirePolicy::Offload,
            WirePolicy::OffloadCompressed,
            WirePolicy::Discard,
        ] {
            assert_eq!(WirePolicy::from_policy(w.policy()).unwrap(), w);
            let json = serde_json::to_string(&w).unwrap();
            assert_eq!(json, format!("\"{}\"", w.name()));
        }
        assert!(WirePolicy::from_policy(Policy::Reload).is_err());
    }
}
