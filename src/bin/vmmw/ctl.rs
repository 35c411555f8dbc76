//! `vmmw ctl SOCKET status|sleep|wake`: drive a process serving a control
//! socket (one run with `vmmw exec`, or any process that serves its pools):
//! its memory status, a sleep, a wake. Exit code 1 when the process refuses
//! (the refusal's code and reason on stderr, and in `--json`'s document).

use std::path::PathBuf;

use serde_json::Value;
use vmmweights::control::{Client, CycleAnswer, StatusAnswer, WirePolicy};
use vmmweights::report::human_bytes;

use crate::exit::{CliError, CliResult};
use crate::lib;
use crate::output::escape_name;

/// Options of `vmmw ctl`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The control socket (printed by `vmmw exec`, or VMMW_CONTROL_SOCKET of the process).
    socket: PathBuf,
    #[command(subcommand)]
    op: Op,
    /// Print the process's answer as one JSON document on stdout.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(clap::Subcommand, Debug)]
enum Op {
    /// What the process holds: its state, each tag of each device, each
    /// device's memory, the host backup, the last sleep or wake.
    Status,
    /// Synchronize every device the process used, then sleep its tags.
    Sleep {
        /// offload (to host memory), offload-compressed (smaller host
        /// backup, lossless), or discard (contents undefined at wake).
        #[arg(long, default_value = "offload", value_parser = ["offload", "offload-compressed", "discard"])]
        policy: String,
        /// Only this tag (repeatable; every tag when absent).
        #[arg(long = "tag", value_name = "NAME")]
        tags: Vec<String>,
    },
    /// Wake the tags asleep; every backup stays intact when it fails.
    Wake {
        /// Wait up to this many milliseconds for device memory being
        /// released elsewhere instead of refusing at once.
        #[arg(long, value_name = "MS")]
        wait_memory: Option<u64>,
        /// Only this tag (repeatable; every asleep tag when absent).
        #[arg(long = "tag", value_name = "NAME")]
        tags: Vec<String>,
    },
}

fn tags(v: Vec<String>) -> Option<Vec<String>> {
    (!v.is_empty()).then_some(v)
}

pub fn run(a: Args) -> CliResult<Value> {
    // Input the user can fix is refused before the socket is touched.
    let request = match &a.op {
        Op::Status => vmmweights::control::Request::Status {},
        Op::Sleep { policy, tags: t } => vmmweights::control::Request::Sleep {
            policy: match policy.as_str() {
                "offload-compressed" => WirePolicy::OffloadCompressed,
                "discard" => WirePolicy::Discard,
                _ => WirePolicy::Offload,
            },
            tags: tags(t.clone()),
        },
        Op::Wake {
            wait_memory,
            tags: t,
        } => vmmweights::control::Request::Wake {
            tags: tags(t.clone()),
            wait_memory_ms: *wait_memory,
        },
    };
    request
        .check()
        .map_err(|e| CliError::bad_input(crate::backend::strip_kind(&e)))?;
    let mut client = lib(Client::connect(&a.socket))?;
    let answer = lib(client.request(&request))?;
    if !a.json {
        print_answer(&answer)?;
    }
    Ok(answer)
}

fn typed<T: serde::de::DeserializeOwned>(v: &Value) -> CliResult<T> {
    serde_json::from_value(v.clone())
        .map_err(|e| CliError::failure(format!("the answer lacks a field: {e}")))
}

fn print_answer(v: &Value) -> CliResult<()> {
    if v.get("op").is_some() {
        print_cycle(&typed(v)?);
    } else {
        print_status(&typed(v)?);
    }
    Ok(())
}

fn print_cycle(c: &CycleAnswer) {
    let verb = if c.op == "sleep" { "slept" } else { "woke" };
    let how = c
        .policy
        .map(|p| format!(" ({})", p.name().replace('_', "-")))
        .unwrap_or_default();
    outln!(
        "{verb}{how} {} in {:.3} s ({:.3} s synchronizing, {:.3} s waiting for memory); host backup {}",
        human_bytes(c.bytes),
        c.seconds,
        c.sync_seconds,
        c.wait_seconds,
        human_bytes(c.backup_bytes)
    );
    for t in &c.tags {
        outln!(
            "  device {} tag {}: {} in {:.3} s, {} copied",
            t.device,
            escape_name(&t.tag),
            human_bytes(t.bytes),
            t.seconds,
            human_bytes(t.copied_bytes)
        );
    }
}

fn print_status(s: &StatusAnswer) {
    let state = serde_json::to_value(s.state).unwrap_or(Value::Null);
    outln!("pid {}: {}", s.pid, state.as_str().unwrap_or("?"));
    if let Some(note) = s.extra.get("note").and_then(Value::as_str) {
        outln!("  {note}");
    }
    for d in &s.devices {
        outln!(
            "device {}: ours {} ({} cached), free {} of {}",
            d.device,
            human_bytes(d.ours),
            human_bytes(d.cached),
            human_bytes(d.free),
            human_bytes(d.total)
        );
        for t in s.tags.iter().filter(|t| t.device == d.device) {
            outln!(
                "  tag {}: {}, live {}, backed {}, backup {}",
                escape_name(&t.tag),
                if t.asleep { "asleep" } else { "awake" },
                human_bytes(t.live_bytes),
                human_bytes(t.tracked_bytes),
                human_bytes(t.backup_bytes)
            );
        }
    }
    outln!("host backup: {}", human_bytes(s.host_backup_bytes));
    if let Some(i) = s.extra.get("interposer") {
        outln!("interposer: {}", escape_name(&i.to_string()));
    }
    if let Some(last) = &s.last {
        outln!("last: {}", escape_name(&last.to_string()));
    }
}
