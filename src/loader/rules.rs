//! Mapping rules as data: how checkpoint tensor names become destinations.
//!
//! The same JSON from Rust, C, Go and the command line:
//!
//! ```json
//! {
//!   "tp": {"rank": 0, "world": 2},
//!   "dtype": "BF16",
//!   "ties": [{"to": "lm_head.weight", "from": "model.embed_tokens.weight"}],
//!   "rules": [
//!     {"match": "model\\.layers\\.(\\d+)\\.self_attn\\.rotary_emb\\.inv_freq", "skip": true},
//!     {"match": "model\\.layers\\.(\\d+)\\.self_attn\\.k_proj\\.weight",
//!      "to": "model.layers.$1.self_attn.qkv_proj.weight",
//!      "fuse": {"dim": 0, "index": 1},
//!      "shard": {"dim": 0, "head_dim": 128}},
//!     {"match": "lm_head\\.weight", "shard": {"dim": 0}, "pad": {"dim": 0, "multiple_of": 64}}
//!   ]
//! }
//! ```
//!
//! - `match`: a regex that must match the whole source name; the first matching rule applies.
//!   A source no rule matches maps to the destination of the same name, whole.
//! - `skip`: the source is consumed without being loaded.
//! - `to`: the destination name, with `$1`-style captures (rename).
//! - `fuse`: the source fills a slice of the destination along `dim`; parts are
//!   concatenated in `index` order (offsets computed from the sliced sizes), or
//!   placed at an explicit `offset` (elements along `dim`).
//! - `shard`: tensor-parallel slice along `dim` for `tp.rank` of `tp.world`. With
//!   `head_dim`, the dimension is cut by whole heads, and when the world is
//!   larger than the head count each head is replicated on `world / heads` ranks
//!   (kv heads). Without `tp`, shard rules are ignored.
//! - `pad`: the destination is longer along `dim` (`to` elements, or rounded up
//!   to `multiple_of`); the extra part is zero-filled.
//! - `ties`: when the checkpoint has no tensor `to`, it is read from `from`
//!   (tied embeddings); a tie whose destination is not registered is ignored.
//! - `dtype`: the element type of destinations the loader allocates itself.

use regex::Regex;

use super::dtype::Dtype;
use crate::error::{Error, Result};

/// Tensor-parallel position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Tp {
    /// This rank, `0..world`.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
}

/// Fuse a source into a slice of its destination.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fuse {
    /// Dimension along which parts are placed.
    pub dim: usize,
    /// Position of this part among the destination's parts.
    #[serde(default)]
    pub index: usize,
    /// Explicit offset (elements along `dim`), instead of the computed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<usize>,
}

/// Tensor-parallel slicing of a source.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shard {
    /// Dimension to cut (0 = column-parallel rows, 1 = row-parallel columns).
    pub dim: usize,
    /// Cut by whole heads of this many elements; heads are replicated when the world exceeds them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
}

/// Zero-filled padding at the end of a destination dimension.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pad {
    /// The padded dimension.
    pub dim: usize,
    /// Padded length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<usize>,
    /// Round the length up to a multiple of this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiple_of: Option<usize>,
}

impl Pad {
    /// The padded length of a dimension of `len` elements; None when
    /// rounding up to `multiple_of` overflows.
    pub fn padded(&self, len: usize) -> Option<usize> {
        let mut n = len;
        if let Some(m) = self.multiple_of.filter(|&m| m > 0) {
            n = n.checked_next_multiple_of(m)?;
        }
        if let Some(t) = self.to {
            n = n.max(t);
        }
        Some(n)
    }
}

/// One mapping rule.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Regex matching the whole source name.
    #[serde(rename = "match")]
    pub pattern: String,
    /// Consume the source without loading it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skip: bool,
    /// Destination name template (`$1` captures); the source name when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Place the source in a slice of the destination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuse: Option<Fuse>,
    /// Tensor-parallel slice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
    /// Zero-filled padding of the destination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad: Option<Pad>,
}

/// A destination fed from another tensor's data when the checkpoint lacks it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tie {
    /// The missing source name (e.g. `lm_head.weight`); rules then apply to it.
    pub to: String,
    /// The tensor whose data it takes (e.g. `model.embed_tokens.weight`).
    pub from: String,
}

/// A whole rule set.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rules {
    /// Tensor-parallel position; shard rules apply only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp: Option<Tp>,
    /// Element type for destinations the loader allocates (default: the source's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<Dtype>,
    /// Tied tensors.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ties: Vec<Tie>,
    /// Rules, first match wins.
    #[serde(default)]
    pub rules: Vec<Rule>,
}

/// What a rule decides for one source name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mapping {
    /// Consumed, not loaded.
    Skip,
    /// Loaded into `dest`.
    Load {
        /// Destination name.
        dest: String,
        /// Fuse placement.
        fuse: Option<Fuse>,
        /// Tensor-parallel slice.
        shard: Option<Shard>,
        /// Destination padding.
        pad: Option<Pad>,
    },
}

/// Rules with their regexes compiled.
#[derive(Debug, Clone)]
pub struct CompiledRules {
    /// The source rules.
    pub rules: Rules,
    regexes: Vec<Regex>,
}

impl Rules {
    /// Parse the JSON form.
    pub fn from_json(text: &str) -> Result<Rules> {
        serde_json::from_str(text)
            .map_err(|e| Error::InvalidArgument(format!("mapping rules JSON is invalid: {e}")))
    }

    /// The JSON form.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("rules always serialize")
    }

    /// Check and compile (regexes, tp position).
    pub fn compile(&self) -> Result<CompiledRules> {
        if let Some(tp) = self.tp {
            if tp.world == 0 || tp.rank >= tp.world {
                return Err(Error::InvalidArgument(format!(
                    "tensor-parallel rank {} is not in 0..{}",
                    tp.rank, tp.world
                )));
            }
        }
        let regexes = self
            .rules
            .iter()
            .map(|r| {
                Regex::new(&format!("^(?:{})$", r.pattern)).map_err(|e| {
                    Error::InvalidArgument(format!("rule regex `{}` is invalid: {e}", r.pattern))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(CompiledRules {
            rules: self.clone(),
            regexes,
        })
    }

    /// A preset for a Hugging Face family: `llama`, `mistral`, `qwen2`, `qwen3`
    /// (`qwen` = both). q/k/v fuse into `self_attn.qkv_proj`, gate/up into
    /// `mlp.gate_up_proj`; with `tp`, attention and MLP are sharded Megatron
    /// style (q/k/v/gate/up by rows, o/down by columns, embeddings and lm_head
    /// by vocabulary rows, norms replicated), kv heads cut by `head_dim`.
    pub fn preset(family: &str, tp: Option<Tp>, head_dim: usize) -> Result<Rules> {
        match family.to_ascii_lowercase().as_str() {
            "llama" | "mistral" | "qwen" | "qwen2" | "qwen3" => {}
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unknown preset `{other}`: expected llama, mistral, qwen, qwen2 or qwen3"
                )))
            }
        }
        let l = r"model\.layers\.(\d+)";
        let heads = Some(head_dim);
        let rows = |head_dim| Some(Shard { dim: 0, head_dim });
        let fused = |pattern: String, to: &str, index, shard| Rule {
            pattern,
            skip: false,
            to: Some(to.to_owned()),
            fuse: Some(Fuse {
                dim: 0,
                index,
                offset: None,
            }),
            shard,
            pad: None,
        };
        let plain = |pattern: String, shard| Rule {
            pattern,
            skip: false,
            to: None,
            fuse: None,
            shard,
            pad: None,
        };
        let qkv = "model.layers.$1.self_attn.qkv_proj.";
        let mut rules = vec![Rule {
            pattern: format!(r"{l}\.self_attn\.rotary_emb\.inv_freq"),
            skip: true,
            to: None,
            fuse: None,
            shard: None,
            pad: None,
        }];
        for (i, p) in ["q", "k", "v"].iter().enumerate() {
            for kind in ["weight", "bias"] {
                rules.push(fused(
                    format!(r"{l}\.self_attn\.{p}_proj\.{kind}"),
                    &format!("{qkv}{kind}"),
                    i,
                    rows(heads),
                ));
            }
        }
        for (i, p) in ["gate", "up"].iter().enumerate() {
            rules.push(fused(
                format!(r"{l}\.mlp\.{p}_proj\.weight"),
                "model.layers.$1.mlp.gate_up_proj.weight",
                i,
                rows(None),
            ));
        }
        rules.push(plain(
            format!(r"{l}\.self_attn\.o_proj\.weight"),
            Some(Shard {
                dim: 1,
                head_dim: None,
            }),
        ));
        rules.push(plain(
            format!(r"{l}\.mlp\.down_proj\.weight"),
            Some(Shard {
                dim: 1,
                head_dim: None,
            }),
        ));
        rules.push(plain(r"model\.embed_tokens\.weight".into(), rows(None)));
        rules.push(plain(r"lm_head\.weight".into(), rows(None)));
        Ok(Rules {
            tp,
            dtype: None,
            ties: vec![Tie {
                to: "lm_head.weight".into(),
                from: "model.embed_tokens.weight".into(),
            }],
            rules,
        })
    }
}

impl CompiledRules {
    /// The mapping for one source name.
    pub fn map(&self, source: &str) -> Mapping {
        for (rule, re) in self.rules.rules.iter().zip(&self.regexes) {
            if let Some(caps) = re.captures(source) {
                if rule.skip {
                    return Mapping::Skip;
                }
                let dest = match &rule.to {
                    Some(t) => {
                        let mut out = String::new();
                        caps.expand(t, &mut out);
                        out
                    }
                    None => source.to_owned(),
                };
                return Mapping::Load {
                    dest,
                    fuse: rule.fuse.clone(),
                    shard: if self.rules.tp.is_some() {
                        rule.shard.clone()
                    } else {
                        None
                    },
                    pad: rule.pad.clone(),
                };
            }
        }
        Mapping::Load {
            dest: source.to_owned(),
            fuse: None,
            shard: None,
            pad: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip_and_rename_with_captures() {
        let r = Rules::preset("llama", Some(Tp { rank: 1, world: 2 }), 128).unwrap();
        let back = Rules::from_json(&r.to_json()).unwrap();
        assert_eq!(r, back);
        let c = back.compile().unwrap();
        match c.map("model.layers.7.self_attn.v_proj.weight") {
            Mapping::Load {
                dest, fuse, shard, ..
            } => {
                assert_eq!(dest, "model.layers.7.self_attn.qkv_proj.weight");
                assert_eq!(fuse.unwrap().index, 2);
                assert_eq!(shard.unwrap().head_dim, Some(128));
            }
            m => panic!("{m:?}"),
        }
        assert_eq!(
            c.map("model.layers.0.self_attn.rotary_emb.inv_freq"),
            Mapping::Skip
        );
        // Whole-name match only: a suffix does not match.
        assert!(
            matches!(c.map("xmodel.norm.weight"), Mapping::Load { dest, .. } if dest == "xmodel.norm.weight")
        );
    }

    #[test]
    fn bad_rules_are_rejected_with_the_reason() {
        let e = Rules::from_json(r#"{"rules":[{"match":"a","fuze":{}}]}"#).unwrap_err();
        assert!(e.to_string().contains("fuze"), "{e}");
        let r = Rules::from_json(r#"{"rules":[{"match":"a("}]}"#).unwrap();
        assert!(r.compile().unwrap_err().to_string().contains("a("));
        let r = Rules::from_json(r#"{"tp":{"rank":2,"world":2}}"#).unwrap();
        assert!(r.compile().is_err());
        assert!(Rules::preset("gpt9", None, 128).is_err());
    }
}
