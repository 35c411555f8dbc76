//! What the ranks of a broadcast load exchange and agree on: the header
//! (each reader's files and tensors), how the files are cut between readers,
//! what differs between two ranks' headers, and the status messages (a
//! rank's verdict, a bucket's trailer).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::super::bucket::AnnouncedTensor;
use crate::error::{Error, Result};
use crate::loader::{Checkpoint, TensorInfo};

/// Bytes after each bucket that carry its reader's status.
pub const TRAILER_BYTES: usize = 1024;

/// One reader's share of the load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Part {
    pub(super) reader: u64,
    /// File names (within the checkpoint), in checkpoint order.
    pub(super) files: Vec<String>,
    /// Their tensors, by file and offset.
    pub(super) tensors: Vec<AnnouncedTensor>,
}

/// What every rank must agree on before a byte moves (besides the slot
/// size, agreed on first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Header {
    pub(super) parts: Vec<Part>,
}

/// The local view of the load: the header this rank expects, and where
/// each announced tensor's bytes are in its checkpoint.
pub(super) struct Local {
    pub(super) header: Header,
    pub(super) infos: Vec<TensorInfo>,
    pub(super) ckpt: Checkpoint,
}

pub(super) fn file_name(ckpt: &Checkpoint, shard: usize) -> String {
    let p = &ckpt.shards[shard].path;
    p.strip_prefix(&ckpt.root)
        .ok()
        .filter(|r| !r.as_os_str().is_empty())
        .unwrap_or_else(|| p.file_name().map_or(p.as_path(), std::path::Path::new))
        .display()
        .to_string()
}

/// Cut files of `per_shard` bytes into one contiguous run per reader (of
/// `readers`), about the same bytes each: a file goes to the reader whose
/// share of the total its middle byte falls in.
pub(super) fn assign(per_shard: &[u64], readers: usize) -> Vec<Vec<usize>> {
    let total: u128 = per_shard.iter().map(|&b| b as u128).sum::<u128>().max(1);
    let n = readers as u128;
    let mut parts = vec![Vec::new(); readers];
    let mut before = 0u128;
    for (i, &b) in per_shard.iter().enumerate() {
        let mid = before + b as u128 / 2;
        let r = ((mid * n) / total).min(n - 1) as usize;
        parts[r].push(i);
        before += b as u128;
    }
    parts
}

/// Bytes of tensor data in each of `ckpt`'s files.
pub(super) fn shard_bytes(ckpt: &Checkpoint) -> Vec<u64> {
    let mut per_shard = vec![0u64; ckpt.shards.len()];
    for t in ckpt.tensors.values() {
        per_shard[t.shard] += t.len;
    }
    per_shard
}

pub(super) fn check_readers(readers: &[usize], world: usize) -> Result<()> {
    if readers.is_empty() {
        return Err(Error::InvalidArgument(
            "a broadcast load needs at least one reader rank".into(),
        ));
    }
    if readers.len() > world {
        return Err(Error::InvalidArgument(format!(
            "{} reader ranks for a world of {world}",
            readers.len()
        )));
    }
    for (i, &r) in readers.iter().enumerate() {
        if r >= world {
            return Err(Error::InvalidArgument(format!(
                "reader rank {r} of a world of {world}"
            )));
        }
        if readers[..i].contains(&r) {
            return Err(Error::InvalidArgument(format!(
                "reader rank {r} is listed twice"
            )));
        }
    }
    Ok(())
}

impl Local {
    pub(super) fn new(ckpt: Checkpoint, readers: &[usize]) -> Local {
        let mut parts = Vec::with_capacity(readers.len());
        let mut infos = Vec::new();
        for (&reader, shards) in readers
            .iter()
            .zip(assign(&shard_bytes(&ckpt), readers.len()))
        {
            let mut tensors: Vec<&TensorInfo> = ckpt
                .tensors
                .values()
                .filter(|t| shards.contains(&t.shard))
                .collect();
            tensors.sort_by_key(|t| (t.shard, t.offset));
            parts.push(Part {
                reader: reader as u64,
                files: shards.iter().map(|&s| file_name(&ckpt, s)).collect(),
                tensors: tensors
                    .iter()
                    .map(|t| AnnouncedTensor {
                        name: t.name.clone(),
                        dtype: t.dtype.name().to_string(),
                        shape: t.shape.iter().map(|&d| d as u64).collect(),
                        bytes: t.len,
                    })
                    .collect(),
            });
            infos.extend(tensors.into_iter().cloned());
        }
        Local {
            header: Header { parts },
            infos,
            ckpt,
        }
    }
}

/// What differs between rank 0's header and this rank's, at most a few
/// lines of each kind.
pub(super) fn differences(theirs: &Header, ours: &Header) -> Vec<String> {
    let mut out = Vec::new();
    let readers = |h: &Header| h.parts.iter().map(|p| p.reader).collect::<Vec<_>>();
    if readers(theirs) != readers(ours) {
        out.push(format!(
            "readers {:?} on rank 0, {:?} here",
            readers(theirs),
            readers(ours)
        ));
    } else {
        for (a, b) in theirs.parts.iter().zip(&ours.parts) {
            if a.files != b.files {
                out.push(format!(
                    "reader {} owns files {:?} on rank 0, {:?} here",
                    a.reader, a.files, b.files
                ));
            }
        }
    }
    let index = |h: &Header| -> BTreeMap<String, AnnouncedTensor> {
        h.parts
            .iter()
            .flat_map(|p| p.tensors.iter().map(|t| (t.name.clone(), t.clone())))
            .collect()
    };
    let (a, b) = (index(theirs), index(ours));
    let mut tensors = Vec::new();
    for (name, t) in &a {
        match b.get(name) {
            None => tensors.push(format!("`{}` only on rank 0", name.escape_debug())),
            Some(u) if u != t => tensors.push(format!(
                "`{}`: {} {:?} on rank 0, {} {:?} here",
                name.escape_debug(),
                t.dtype,
                t.shape,
                u.dtype,
                u.shape
            )),
            Some(_) => {}
        }
    }
    for name in b.keys().filter(|n| !a.contains_key(*n)) {
        tensors.push(format!("`{}` only here", name.escape_debug()));
    }
    let n = tensors.len();
    out.extend(tensors.into_iter().take(8));
    if n > 8 {
        out.push(format!("{} more tensors differ", n - 8));
    }
    if out.is_empty() && theirs != ours {
        out.push("the tensors' order differs from rank 0's".into());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn announced(name: &str, shape: &[u64]) -> AnnouncedTensor {
        AnnouncedTensor {
            name: name.into(),
            dtype: "BF16".into(),
            shape: shape.to_vec(),
            bytes: shape.iter().product::<u64>() * 2,
        }
    }

    #[test]
    fn differences_name_each_kind_of_disagreement() {
        let part = |reader, files: &[&str], tensors| Part {
            reader,
            files: files.iter().map(|f| f.to_string()).collect(),
            tensors,
        };
        let ours = Header {
            parts: vec![
                part(
                    0,
                    &["a"],
                    vec![announced("x", &[2, 2]), announced("y", &[4])],
                ),
                part(1, &["b"], vec![announced("z", &[8])]),
            ],
        };
        assert!(differences(&ours, &ours).is_empty());
        let mut theirs = ours.clone();
        theirs.parts[0].tensors[1] = announced("y", &[2, 2]);
        theirs.parts[1].tensors.push(announced("w", &[1]));
        theirs.parts[1].files = vec!["c".into()];
        let d = differences(&theirs, &ours).join("\n");
        assert!(
            d.contains("`y`: BF16 [2, 2] on rank 0, BF16 [4] here"),
            "{d}"
        );
        assert!(d.contains("`w` only on rank 0"), "{d}");
        assert!(
            d.contains(r#"reader 1 owns files ["c"] on rank 0, ["b"] here"#),
            "{d}"
        );
        let mut reordered = ours.clone();
        reordered.parts[0].tensors.swap(0, 1);
        assert_eq!(
            differences(&reordered, &ours),
            vec!["the tensors' order differs from rank 0's".to_string()]
        );
        let mut readers = ours.clone();
        readers.parts[1].reader = 2;
        assert!(differences(&readers, &ours)[0].contains("readers [0, 2] on rank 0, [0, 1] here"));
    }

    proptest::proptest! {
        #[test]
        fn readers_own_contiguous_runs_of_every_file_about_evenly(
            sizes in proptest::collection::vec(0u64..1000, 1..12),
            n in 1usize..6,
        ) {
            let parts = assign(&sizes, n);
            proptest::prop_assert_eq!(parts.len(), n);
            // In order, each file once: contiguous runs.
            let flat: Vec<usize> = parts.iter().flatten().copied().collect();
            proptest::prop_assert_eq!(flat, (0..sizes.len()).collect::<Vec<_>>());
            // No reader reads more than its share and one file.
            let total: u64 = sizes.iter().sum();
            let largest = sizes.iter().copied().max().unwrap_or(0);
            for p in &parts {
                let mine: u64 = p.iter().map(|&i| sizes[i]).sum();
                proptest::prop_assert!(mine <= total / n as u64 + largest);
            }
        }
    }
}
