//! What the environment asks of the interposer, read once at its first
//! intercepted call.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `VMMW_PRELOAD_SCOPE` | `all`: every device allocation is ours; `region`: only those of threads inside a region (`vmmw_preload_set_region`) | `all` |
//! | `VMMW_PRELOAD_TAG` | the tag allocations get when their thread set none | `process` |
//! | `VMMW_PRELOAD_REGION_DEFAULT` | `1`: in `region` scope, threads start inside a region | `0` |
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
}

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
        Ok(Config {
            scope,
            tag,
            region_default,
        })
    }
}
