//! How the ranks of a collective agree before any bucket moves, so that a
//! problem on any rank fails every rank together. A rank that returned
//! alone would leave the others waiting in their next broadcast until
//! their timeout (NCCL has no way to tell them). Three steps, each a few
//! small broadcasts through `exchange` (a ring's first slot):
//!
//! 1. [`shapes`]: each rank's slot size and slot count. Every rank sees
//!    the same list, so [`same_shapes`] refuses alike everywhere, before
//!    anything is broadcast in slot-sized pieces (which must match).
//! 2. [`from_root`]: the root's header, or why it has none.
//! 3. [`verdicts`]: each rank's problems with it, so a refusal anywhere is
//!    an error on every rank, listing every refusing rank's problems.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{Error, Result};

/// Broadcast `len` bytes of the buffer (meaningful on the root, given
/// first) to every rank; the buffer holds them after.
pub(super) type Exchange<'a> = &'a mut dyn FnMut(usize, &mut Vec<u8>, u64) -> Result<()>;

/// Bytes of one rank's verdict: its status and the start of its message.
pub(super) const VERDICT_BYTES: usize = 1024;

/// `(ok, msg)` as `len` bytes: a status byte, the message's length, then
/// as much of the message as fits, cut at a character.
pub(super) fn encode_message(ok: bool, msg: &str, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    out[0] = if ok { 0 } else { 1 };
    let mut end = msg.len().min(len - 8);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    out[4..8].copy_from_slice(&(end as u32).to_le_bytes());
    out[8..8 + end].copy_from_slice(&msg.as_bytes()[..end]);
    out
}

/// (ok, message) of an encoded status; a malformed one (a status byte
/// other than 0 or 1, a length past the buffer) reads as a failure.
pub(super) fn decode_message(b: &[u8]) -> (bool, String) {
    let n = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")) as usize;
    match (b[0], b.get(8..8 + n)) {
        (s @ (0 | 1), Some(m)) => (s == 0, String::from_utf8_lossy(m).into_owned()),
        _ => (false, "a malformed status".into()),
    }
}

/// Every rank's `(slot bytes, slots)`, in rank order; `mine` is this rank's.
pub(super) fn shapes(
    world: usize,
    mine: (u64, u64),
    exchange: Exchange<'_>,
) -> Result<Vec<(u64, u64)>> {
    let mut out = Vec::with_capacity(world);
    for r in 0..world {
        let mut ring = mine.0.to_le_bytes().to_vec();
        ring.extend(mine.1.to_le_bytes());
        exchange(r, &mut ring, 16)?;
        let word = |i: usize| u64::from_le_bytes(ring[i..i + 8].try_into().expect("8 bytes"));
        out.push((word(0), word(8)));
    }
    Ok(out)
}

/// Refuse `shapes` unless every rank has the same slot size (and, with
/// `counts`, the same slot count), naming each rank's; `what` names the
/// operation in the error.
pub(super) fn same_shapes(shapes: &[(u64, u64)], counts: bool, what: &str) -> Result<()> {
    let each = |part: &dyn Fn(&(u64, u64)) -> String| {
        shapes
            .iter()
            .enumerate()
            .map(|(r, x)| format!("rank {r}: {}", part(x)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if shapes.iter().any(|x| x.0 != shapes[0].0) {
        return Err(Error::InvalidArgument(format!(
            "{what} refused before any byte moved: ring slots of different sizes ({} bytes); every rank must use the same bucket size",
            each(&|x| x.0.to_string())
        )));
    }
    if counts && shapes.iter().any(|x| x.1 != shapes[0].1) {
        return Err(Error::InvalidArgument(format!(
            "{what} refused before any byte moved: rings of different lengths ({}); every rank must use the same ring",
            each(&|x| format!("{} slots", x.1))
        )));
    }
    Ok(())
}

/// What the root sent.
pub(super) enum FromRoot<T> {
    /// Its header.
    Value(T),
    /// It has none (why, as it sent it); its verdict says so.
    Refused(String),
    /// This rank could not read what it sent.
    Unreadable(String),
}

/// The root's header (`mine` on the root: its header, or why it has none),
/// as JSON of at most `max` bytes; a header past that is sent as a refusal.
/// An error is the collective's (or a length no root sends): the ranks
/// may no longer be in step.
pub(super) fn from_root<T: Serialize + DeserializeOwned>(
    root: usize,
    mine: Option<std::result::Result<T, String>>,
    max: u64,
    exchange: Exchange<'_>,
) -> Result<FromRoot<T>> {
    let encode = |h: &std::result::Result<T, String>| {
        serde_json::to_vec(h).map_err(|e| Error::InvalidState(format!("encoding a header: {e}")))
    };
    let mut body = Vec::new();
    if let Some(mine) = mine {
        body = encode(&mine)?;
        if body.len() as u64 > max {
            body = encode(&Err(format!(
                "a header of {} bytes, past the {max} accepted",
                body.len()
            )))?;
        }
    }
    let mut len = (body.len() as u64).to_le_bytes().to_vec();
    exchange(root, &mut len, 8)?;
    let len = u64::from_le_bytes(len.try_into().expect("8 bytes"));
    if len == 0 || len > max {
        return Err(Error::InvalidArgument(format!(
            "a header of {len} bytes from rank {root} (1 to {max} accepted)"
        )));
    }
    exchange(root, &mut body, len)?;
    Ok(
        match serde_json::from_slice::<std::result::Result<T, String>>(&body) {
            Ok(Ok(h)) => FromRoot::Value(h),
            Ok(Err(why)) => FromRoot::Refused(why),
            Err(e) => FromRoot::Unreadable(format!("unreadable header from rank {root}: {e}")),
        },
    )
}

/// Every rank's verdict: each broadcasts `mine` (its problems; none to
/// accept) in turn. Returns the refusing ranks and their problems (this
/// rank's in full, the others' as far as a verdict holds them).
pub(super) fn verdicts(
    world: usize,
    me: usize,
    mine: &[String],
    exchange: Exchange<'_>,
) -> Result<Vec<(usize, String)>> {
    let mut refusals = Vec::new();
    for r in 0..world {
        let mut verdict = Vec::new();
        if r == me {
            verdict = encode_message(mine.is_empty(), &mine.join("; "), VERDICT_BYTES);
        }
        exchange(r, &mut verdict, VERDICT_BYTES as u64)?;
        if let (false, msg) = decode_message(&verdict) {
            let msg = if r == me { mine.join("; ") } else { msg };
            refusals.push((r, msg));
        }
    }
    Ok(refusals)
}

/// The refusals [`verdicts`] found as one message under `heading`, each
/// rank's on a line.
pub(super) fn refusals(heading: &str, refusals: &[(usize, String)]) -> String {
    let lines: Vec<String> = refusals
        .iter()
        .map(|(r, m)| {
            format!(
                "rank {r}: {}",
                m.split_whitespace().collect::<Vec<_>>().join(" ")
            )
        })
        .collect();
    format!("{heading}:\n  {}", lines.join("\n  "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_round_trips_and_a_long_message_is_cut_at_a_character() {
        let (ok, msg) = decode_message(&encode_message(true, "", 64));
        assert!(ok && msg.is_empty());
        let long = "é".repeat(100);
        let b = encode_message(false, &long, 64);
        let (ok, msg) = decode_message(&b);
        assert!(!ok);
        assert_eq!(msg, "é".repeat(28), "56 bytes of 2-byte characters");
        // A length past the buffer, or another status byte, reads as a
        // failure, never a panic.
        let mut bad = encode_message(true, "x", 64);
        bad[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode_message(&bad), (false, "a malformed status".into()));
        let mut bad = encode_message(true, "x", 64);
        bad[0] = 7;
        assert_eq!(decode_message(&bad), (false, "a malformed status".into()));
    }
}
