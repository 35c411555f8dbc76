//! What the environment asks of the interposer, read once at its first
//! intercepted call.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `VMMW_PRELOAD_SCOPE` | `all`: every device allocation is ours; `region`: only those of threads inside a region (`vmmw_preload_set_region`) | `all` |
//! | `VMMW_PRELOAD_TAG` | the tag allocations get when their thread set none | `process` |
//! | `VMMW_PRELOAD_REGION_DEFAULT` | `1`: in `region` scope, threads start inside a region | `0` |
//! | `VMMW_PRELOAD_CHUNK` | the largest physical chunk of a big allocation: a sleep gives memory back, and a wake (of this or another process) takes it, chunk by chunk | `512M` |
//! | `VMMW_BACKEND` | the pools' backend (`cuda`, `host`, `auto`) | `auto` |
//! | `VMMW_CONTROL_SOCKET` | the control socket's path (`served.rs`) | none |

use vmmweights::tag::{self, TagId};
use vmmweights::{Error, Result};

/// Which allocations are ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every `cudaMalloc` of the process (llama-server).
    All,
    /// Only those of threads inside a region (torch_memory_saver's preload mode).
    Region,
}

impl Scope {
    /// The name `VMMW_PRELOAD_SCOPE` uses.
    pub fn name(self) -> &'static str {
        match self {
            Scope::All => "all",
            Scope::Region => "region",
        }
    }
}

/// The interposer's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Which allocations are ours.
    pub scope: Scope,
    /// The tag of threads that set none.
    pub tag: TagId,
    /// Whether threads start inside a region (`region` scope).
    pub region_default: bool,
    /// The largest physical chunk of a segment (the pools' `chunk_bytes`).
    pub chunk_bytes: usize,
}

/// The default chunk: 32 chunks for 16 GiB keep the driver's create and map
/// calls few, while a sleep releases memory a waking process can take long
/// before the whole buffer is copied out.
pub const DEFAULT_CHUNK_BYTES: usize = 512 << 20;

/// The default tag's name.
pub const DEFAULT_TAG: &str = "process";

fn var(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) if v.is_empty() => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(Error::InvalidArgument(format!("{name} is not valid UTF-8")))
        }
    }
}

impl Config {
    /// The settings the environment names; an error says which variable is wrong.
    pub fn from_env() -> Result<Config> {
        let scope = match var("VMMW_PRELOAD_SCOPE")?.as_deref() {
            None | Some("all") => Scope::All,
            Some("region") => Scope::Region,
            Some(other) => {
                return Err(Error::InvalidArgument(format!(
                    "VMMW_PRELOAD_SCOPE=`{}`: expected `all` or `region`",
                    other.escape_debug()
                )))
            }
        };
        let name = var("VMMW_PRELOAD_TAG")?.unwrap_or_else(|| DEFAULT_TAG.to_owned());
        let tag = tag::id(&name).map_err(|e| {
            Error::InvalidArgument(format!("VMMW_PRELOAD_TAG=`{}`: {e}", name.escape_debug()))
        })?;
        let region_default = match var("VMMW_PRELOAD_REGION_DEFAULT")?.as_deref() {
            None | Some("0") => false,
            Some("1") => true,
            Some(other) => {
                return Err(Error::InvalidArgument(format!(
                    "VMMW_PRELOAD_REGION_DEFAULT=`{}`: expected 0 or 1",
                    other.escape_debug()
                )))
            }
        };
        let chunk_bytes = match var("VMMW_PRELOAD_CHUNK")? {
            None => DEFAULT_CHUNK_BYTES,
            Some(v) => vmmweights::units::parse_bytes(&v)
                .ok()
                .and_then(|b| usize::try_from(b).ok())
                .filter(|&b| b > 0)
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "VMMW_PRELOAD_CHUNK=`{}`: expected a size such as 512M",
                        v.escape_debug()
                    ))
                })?,
        };
        Ok(Config {
            scope,
            tag,
            region_default,
            chunk_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test sets the variables, so no other test sees them change.
    #[test]
    fn the_environment_is_read_and_checked() {
        let set = |k: &str, v: Option<&str>| match v {
            Some(v) => std::env::set_var(k, v),
            None => std::env::remove_var(k),
        };
        for k in [
            "VMMW_PRELOAD_SCOPE",
            "VMMW_PRELOAD_TAG",
            "VMMW_PRELOAD_REGION_DEFAULT",
            "VMMW_PRELOAD_CHUNK",
        ] {
            set(k, None);
        }
        let c = Config::from_env().unwrap();
        assert_eq!(c.chunk_bytes, DEFAULT_CHUNK_BYTES);
        set("VMMW_PRELOAD_CHUNK", Some("64M"));
        assert_eq!(Config::from_env().unwrap().chunk_bytes, 64 << 20);
        set("VMMW_PRELOAD_CHUNK", None);
        assert_eq!(c.scope, Scope::All);
        assert_eq!(tag::name_of(c.tag), DEFAULT_TAG);
        assert!(!c.region_default);
        set("VMMW_PRELOAD_SCOPE", Some("region"));
        set("VMMW_PRELOAD_TAG", Some("llama"));
        set("VMMW_PRELOAD_REGION_DEFAULT", Some("1"));
        let c = Config::from_env().unwrap();
        assert_eq!(
            (c.scope, tag::name_of(c.tag).as_str(), c.region_default),
            (Scope::Region, "llama", true)
        );
        for (k, v, says) in [
            (
                "VMMW_PRELOAD_SCOPE",
                "everything",
                "expected `all` or `region`",
            ),
            ("VMMW_PRELOAD_REGION_DEFAULT", "yes", "expected 0 or 1"),
            ("VMMW_PRELOAD_CHUNK", "lots", "expected a size"),
            ("VMMW_PRELOAD_CHUNK", "0", "expected a size"),
            ("VMMW_PRELOAD_TAG", "a\u{1}b", "control characters"),
        ] {
            let old = std::env::var(k).ok();
            set(k, Some(v));
            let e = Config::from_env().unwrap_err().to_string();
            assert!(e.contains(k) && e.contains(says), "{e}");
            set(k, old.as_deref());
        }
        for k in [
            "VMMW_PRELOAD_SCOPE",
            "VMMW_PRELOAD_TAG",
            "VMMW_PRELOAD_REGION_DEFAULT",
        ] {
            set(k, None);
        }
    }
}
