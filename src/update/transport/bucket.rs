//! Buckets: contiguous byte ranges that carry pieces of named tensors, and
//! the manifest that says which piece of which tensor lies where.
//!
//! The sender cuts the tensors of one update into buckets in a fixed order
//! ([`plan_buckets`]); the receiver checks every manifest before it reads a
//! byte of the bucket ([`Coverage::admit`]): in order, inside the ring's
//! slot, packed without gaps or overlaps, naming only announced tensors, each
//! tensor's pieces arriving in order and exactly once. A sender that breaks
//! any rule is refused with the rule it broke.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Most tensors one update may announce (a bound on what a hostile header makes the receiver hold).
pub const MAX_TENSORS: usize = 1 << 20;
/// Longest tensor name accepted from a sender.
pub const MAX_NAME_BYTES: usize = 4096;

/// One tensor of an update as the sender announces it before any bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnnouncedTensor {
    /// Checkpoint name.
    pub name: String,
    /// Element type as safetensors spells it (`BF16`, `F32`, ...).
    pub dtype: String,
    /// Shape of the full tensor.
    pub shape: Vec<u64>,
    /// Bytes of the full tensor.
    pub bytes: u64,
}

/// One piece of one tensor inside a bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketEntry {
    /// Index of the tensor in the update's announced list.
    pub tensor: u32,
    /// Byte offset of the piece within the full tensor.
    pub offset: u64,
    /// Bytes of the piece.
    pub len: u64,
    /// Byte offset of the piece within the bucket.
    pub at: u64,
}

/// Which pieces a bucket holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketManifest {
    /// Position of the bucket in the update, from 0.
    pub seq: u64,
    /// Bytes the bucket carries (the sum of its entries).
    pub bytes: u64,
    /// Its pieces, by increasing `at`.
    pub entries: Vec<BucketEntry>,
}

fn invalid(what: impl Into<String>) -> Error {
    Error::InvalidArgument(what.into())
}

/// Check the announced tensors of one update: names present, unique and
/// bounded, sizes consistent with shape and element size when the element
/// type is known.
pub fn check_announced(tensors: &[AnnouncedTensor]) -> Result<()> {
    if tensors.is_empty() {
        return Err(invalid("update announces no tensors"));
    }
    if tensors.len() > MAX_TENSORS {
        return Err(invalid(format!(
            "update announces {} tensors, more than the {MAX_TENSORS} accepted",
            tensors.len()
        )));
    }
    let mut seen = HashMap::with_capacity(tensors.len());
    let mut problems = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        if t.name.is_empty() || t.name.len() > MAX_NAME_BYTES {
            problems.push(format!(
                "tensor {i}: name of {} bytes (1 to {MAX_NAME_BYTES} accepted)",
                t.name.len()
            ));
            continue;
        }
        if seen.insert(t.name.as_str(), i).is_some() {
            problems.push(format!(
                "tensor `{}` announced twice",
                t.name.escape_debug()
            ));
        }
        let dtype = crate::loader::dtype::Dtype::parse(&t.dtype);
        // An empty tensor (a dimension of 0) is a checkpoint's right, as in
        // a load: it carries no bytes and fills a destination of none. Its
        // size is checked against its shape below; one of a dtype this
        // library does not know cannot be checked.
        if t.bytes == 0 && dtype.is_none() {
            problems.push(format!("tensor `{}` has 0 bytes", t.name.escape_debug()));
        }
        if let Some(dtype) = dtype {
            // Quantized types count whole blocks of the last dimension.
            let want = dtype.bytes(&t.shape);
            if want != Some(t.bytes) {
                problems.push(format!(
                    "tensor `{}`: {} bytes announced, shape {:?} of {} is {}",
                    t.name.escape_debug(),
                    t.bytes,
                    t.shape,
                    t.dtype,
                    want.map_or("too large".to_string(), |w| w.to_string())
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(invalid(format!(
            "update header refused:\n  {}",
            problems.join("\n  ")
        )))
    }
}

/// Cut `sizes` (the bytes of each announced tensor, in order) into buckets of
/// at most `bucket_bytes`: tensors are packed back to back, a tensor larger
/// than what is left of a bucket continues in the next one.
pub fn plan_buckets(sizes: &[u64], bucket_bytes: u64) -> Result<Vec<BucketManifest>> {
    if bucket_bytes == 0 {
        return Err(invalid("bucket size must be at least 1 byte"));
    }
    let mut out = Vec::new();
    let mut cur = BucketManifest {
        seq: 0,
        bytes: 0,
        entries: Vec::new(),
    };
    for (i, &size) in sizes.iter().enumerate() {
        let tensor = u32::try_from(i).map_err(|_| invalid("more than 2^32 tensors"))?;
        let mut offset = 0;
        while offset < size {
            let len = (size - offset).min(bucket_bytes - cur.bytes);
            cur.entries.push(BucketEntry {
                tensor,
                offset,
                len,
                at: cur.bytes,
            });
            cur.bytes += len;
            offset += len;
            if cur.bytes == bucket_bytes {
                let seq = cur.seq + 1;
                out.push(std::mem::replace(
                    &mut cur,
                    BucketManifest {
                        seq,
                        bytes: 0,
                        entries: Vec::new(),
                    },
                ));
            }
        }
    }
    if cur.bytes > 0 {
        out.push(cur);
    }
    Ok(out)
}

/// The receiver's account of one update: which bucket comes next and how far
/// each tensor has arrived.
#[derive(Debug)]
pub struct Coverage {
    sizes: Vec<u64>,
    arrived: Vec<u64>,
    next_seq: u64,
    slot_bytes: u64,
}

impl Coverage {
    /// Expect the tensors `sizes` in buckets of at most `slot_bytes`.
    pub fn new(sizes: Vec<u64>, slot_bytes: u64) -> Coverage {
        let arrived = vec![0; sizes.len()];
        Coverage {
            sizes,
            arrived,
            next_seq: 0,
            slot_bytes,
        }
    }

    /// Buckets admitted so far.
    pub fn buckets(&self) -> u64 {
        self.next_seq
    }

    /// Check `m` against every rule and count its pieces as arrived. A
    /// refused manifest changes nothing.
    pub fn admit(&mut self, m: &BucketManifest) -> Result<()> {
        let bad = |why: String| invalid(format!("bucket {}: {why}", m.seq));
        if m.seq != self.next_seq {
            return Err(bad(format!(
                "out of order: bucket {} expected",
                self.next_seq
            )));
        }
        if m.bytes == 0 || m.entries.is_empty() {
            return Err(bad("empty bucket".into()));
        }
        if m.bytes > self.slot_bytes {
            return Err(bad(format!(
                "{} bytes, past the ring's slot of {} bytes",
                m.bytes, self.slot_bytes
            )));
        }
        let mut at = 0u64;
        let mut arrived: Vec<(usize, u64)> = Vec::new();
        for (k, e) in m.entries.iter().enumerate() {
            let i = e.tensor as usize;
            let Some(&size) = self.sizes.get(i) else {
                return Err(bad(format!(
                    "entry {k} names tensor {i}; the update announced {}",
                    self.sizes.len()
                )));
            };
            if e.at != at {
                return Err(bad(format!(
                    "entry {k} at byte {} of the bucket, {at} expected (entries are packed in order)",
                    e.at
                )));
            }
            let end = e.at.checked_add(e.len).filter(|&end| end <= m.bytes);
            let Some(end) = end.filter(|_| e.len > 0) else {
                return Err(bad(format!(
                    "entry {k} ({} bytes at {}) does not lie inside the bucket's {} bytes",
                    e.len, e.at, m.bytes
                )));
            };
            let so_far = arrived
                .iter()
                .rev()
                .find(|(t, _)| *t == i)
                .map_or(self.arrived[i], |&(_, a)| a);
            if e.offset != so_far {
                return Err(bad(format!(
                    "entry {k}: tensor {i} piece at byte {}, byte {so_far} expected (pieces arrive in order, once)",
                    e.offset
                )));
            }
            match e.offset.checked_add(e.len) {
                Some(t_end) if t_end <= size => arrived.push((i, t_end)),
                _ => {
                    return Err(bad(format!(
                        "entry {k}: tensor {i} piece {}..+{} runs past its {size} bytes",
                        e.offset, e.len
                    )))
                }
            }
            at = end;
        }
        if at != m.bytes {
            return Err(bad(format!(
                "entries cover {at} bytes, the bucket says {}",
                m.bytes
            )));
        }
        for (i, a) in arrived {
            self.arrived[i] = a;
        }
        self.next_seq += 1;
        Ok(())
    }

    /// Check that every tensor arrived whole: an update that ends early is
    /// refused, naming the first tensor short of its bytes.
    pub fn finish(&self) -> Result<()> {
        let short: Vec<String> = self
            .sizes
            .iter()
            .zip(&self.arrived)
            .enumerate()
            .filter(|(_, (s, a))| a != s)
            .take(8)
            .map(|(i, (s, a))| format!("tensor {i}: {a} of {s} bytes"))
            .collect();
        if short.is_empty() {
            Ok(())
        } else {
            Err(invalid(format!(
                "update ended after {} buckets with tensors short: {}",
                self.next_seq,
                short.join("; ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_packs_and_splits_in_order() {
        let b = plan_buckets(&[10, 3, 25], 8).unwrap();
        let total: u64 = b.iter().map(|m| m.bytes).sum();
        assert_eq!(total, 38);
        assert_eq!(b.len(), 5);
        assert!(b.iter().all(|m| m.bytes <= 8));
        let mut cov = Coverage::new(vec![10, 3, 25], 8);
        for m in &b {
            cov.admit(m).unwrap();
        }
        cov.finish().unwrap();
    }

    #[test]
    fn coverage_refuses_each_broken_rule() {
        let b = plan_buckets(&[10, 3], 8).unwrap();
        let mut cov = Coverage::new(vec![10, 3], 8);
        assert!(cov.admit(&b[1]).is_err(), "out of order");
        let mut big = b[0].clone();
        big.bytes = 9;
        big.entries[0].len = 9;
        assert!(cov.admit(&big).is_err(), "past the slot");
        let mut gap = b[0].clone();
        gap.entries[0].at = 1;
        assert!(cov.admit(&gap).is_err(), "gap");
        let mut unknown = b[0].clone();
        unknown.entries[0].tensor = 7;
        assert!(cov.admit(&unknown).is_err(), "unknown tensor");
        let mut skip = b[0].clone();
        skip.entries[0].offset = 2;
        assert!(cov.admit(&skip).is_err(), "piece out of order");
        cov.admit(&b[0]).unwrap();
        assert!(cov.admit(&b[0]).is_err(), "repeat");
        assert!(cov.finish().is_err(), "short");
    }

    proptest::proptest! {
        #[test]
        fn any_plan_is_admitted_whole_and_any_tampering_never_panics(
            sizes in proptest::collection::vec(1u64..5000, 1..12),
            slot in 1u64..3000,
            victim in 0usize..64,
            field in 0u8..5,
            value in proptest::prelude::any::<u64>(),
        ) {
            let plan = plan_buckets(&sizes, slot).unwrap();
            let mut cov = Coverage::new(sizes.clone(), slot);
            for m in &plan {
                cov.admit(m).unwrap();
            }
            cov.finish().unwrap();
            // One field of one bucket changed: admitted only when the
            // change keeps every rule, and never a panic or an overflow.
            let mut cov = Coverage::new(sizes, slot);
            let k = victim % plan.len();
            for (i, m) in plan.iter().enumerate() {
                let mut m = m.clone();
                if i == k {
                    let e = m.entries.len() - 1;
                    match field {
                        0 => m.bytes = value,
                        1 => m.entries[e].len = value,
                        2 => m.entries[e].offset = value,
                        3 => m.entries[e].at = value,
                        _ => m.entries[e].tensor = value as u32,
                    }
                }
                if cov.admit(&m).is_err() {
                    break;
                }
            }
        }
    }
}
