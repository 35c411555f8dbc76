//! Element types: safetensors' names as they appear in headers, ggml's
//! block-quantized types from GGUF files, sizes, and the subset the copy
//! engine can convert between.
//!
//! A quantized type's unit is a block: [`Dtype::size`] is bytes per block and
//! [`Dtype::block`] elements per block (1 for every other type), so a tensor
//! of such a type exists only where its last (fastest) dimension is a whole
//! number of blocks ([`Dtype::bytes`]).

use std::fmt;

use super::ggml_type::GgmlType;
use crate::driver::ConvertType;

/// An element type as named in a safetensors header ("BF16", "F32", ...), or
/// a ggml block-quantized type ("Q8_0", "Q4_K", ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// Boolean, one byte.
    Bool,
    /// Unsigned byte.
    U8,
    /// Signed byte.
    I8,
    /// 8-bit float, e4m3.
    F8E4M3,
    /// 8-bit float, e5m2.
    F8E5M2,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// IEEE single.
    F32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
    /// IEEE double.
    F64,
    /// A ggml block-quantized type, copied as raw blocks (never converted).
    Ggml(GgmlType),
}

const ALL: [Dtype; 15] = [
    Dtype::Bool,
    Dtype::U8,
    Dtype::I8,
    Dtype::F8E4M3,
    Dtype::F8E5M2,
    Dtype::I16,
    Dtype::U16,
    Dtype::F16,
    Dtype::Bf16,
    Dtype::I32,
    Dtype::U32,
    Dtype::F32,
    Dtype::I64,
    Dtype::U64,
    Dtype::F64,
];

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 | Dtype::F8E4M3 | Dtype::F8E5M2 => 1,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::I64 | Dtype::U64 | Dtype::F64 => 8,
            Dtype::Ggml(q) => q.type_size(),
        }
    }

    /// Elements per unit of [`Dtype::size`] bytes: a quantized type's block
    /// size, 1 for every other type.
    pub fn block(self) -> usize {
        match self {
            Dtype::Ggml(q) => q.block(),
            _ => 1,
        }
    }

    /// The element type of tensors of ggml type `t`: the safetensors type of
    /// the same bits for the plain types, [`Dtype::Ggml`] otherwise.
    pub fn from_ggml(t: GgmlType) -> Dtype {
        match t {
            GgmlType::F32 => Dtype::F32,
            GgmlType::F16 => Dtype::F16,
            GgmlType::BF16 => Dtype::Bf16,
            GgmlType::F64 => Dtype::F64,
            GgmlType::I8 => Dtype::I8,
            GgmlType::I16 => Dtype::I16,
            GgmlType::I32 => Dtype::I32,
            GgmlType::I64 => Dtype::I64,
            q => Dtype::Ggml(q),
        }
    }

    /// The ggml type of this element type, where ggml has one.
    pub fn ggml(self) -> Option<GgmlType> {
        Some(match self {
            Dtype::F32 => GgmlType::F32,
            Dtype::F16 => GgmlType::F16,
            Dtype::Bf16 => GgmlType::BF16,
            Dtype::F64 => GgmlType::F64,
            Dtype::I8 => GgmlType::I8,
            Dtype::I16 => GgmlType::I16,
            Dtype::I32 => GgmlType::I32,
            Dtype::I64 => GgmlType::I64,
            Dtype::Ggml(q) => q,
            _ => return None,
        })
    }

    /// True for ggml block-quantized types.
    pub fn is_quantized(self) -> bool {
        self.block() > 1
    }

    /// Bytes of a contiguous tensor of `shape` (row-major, the last dimension
    /// fastest). None when the size overflows, or for a quantized type when
    /// the last dimension is not a whole number of blocks (or there is none).
    pub fn bytes(self, shape: &[u64]) -> Option<u64> {
        self.bytes_of(shape.iter().copied())
    }

    /// [`Dtype::bytes`] of a shape given as its dimensions in order.
    pub fn bytes_of(self, mut shape: impl DoubleEndedIterator<Item = u64>) -> Option<u64> {
        let b = self.block() as u64;
        let Some(last) = shape.next_back() else {
            return (b == 1).then_some(self.size() as u64);
        };
        if !last.is_multiple_of(b) {
            return None;
        }
        shape.try_fold((last / b).checked_mul(self.size() as u64)?, |a, d| {
            a.checked_mul(d)
        })
    }

    /// The header name ("BF16").
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::Bf16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
            Dtype::F64 => "F64",
            Dtype::Ggml(q) => q.name(),
        }
    }

    /// Parse a header name; case-insensitive, also accepts torch-style
    /// "bfloat16", "float16", "float32".
    pub fn parse(s: &str) -> Option<Dtype> {
        let up = s.trim().to_ascii_uppercase();
        let alias = match up.as_str() {
            "BFLOAT16" => Some(Dtype::Bf16),
            "FLOAT16" | "HALF" => Some(Dtype::F16),
            "FLOAT32" | "FLOAT" => Some(Dtype::F32),
            _ => None,
        };
        alias
            .or_else(|| ALL.iter().copied().find(|d| d.name() == up))
            .or_else(|| {
                GgmlType::parse(&up)
                    .filter(|q| q.is_quantized())
                    .map(Dtype::Ggml)
            })
    }

    /// Every known name, for error messages.
    pub fn known_names() -> String {
        ALL.iter()
            .map(|d| d.name())
            .chain(
                GgmlType::ALL
                    .iter()
                    .filter(|q| q.is_quantized())
                    .map(|q| q.name()),
            )
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The conversion type, for the floating types the copy engine converts.
    pub fn convert_type(self) -> Option<ConvertType> {
        match self {
            Dtype::F16 => Some(ConvertType::F16),
            Dtype::Bf16 => Some(ConvertType::Bf16),
            Dtype::F32 => Some(ConvertType::F32),
            _ => None,
        }
    }
}

impl serde::Serialize for Dtype {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Dtype {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        // Exact names only: the aliases `parse` accepts are for people, not files.
        ALL.iter()
            .copied()
            .find(|t| t.name() == s)
            .or_else(|| {
                GgmlType::ALL
                    .iter()
                    .find(|q| q.is_quantized() && q.name() == s)
                    .map(|&q| Dtype::Ggml(q))
            })
            .ok_or_else(|| {
                serde::de::Error::custom(format!("unknown dtype `{}`", s.escape_debug()))
            })
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sizes() {
        for d in ALL {
            assert_eq!(Dtype::parse(d.name()), Some(d));
            let json = serde_json::to_string(&d).unwrap();
            assert_eq!(json, format!("\"{}\"", d.name()));
        }
        assert_eq!(Dtype::parse("bfloat16"), Some(Dtype::Bf16));
        assert_eq!(Dtype::parse("Q4_K"), Some(Dtype::Ggml(GgmlType::Q4_K)));
        assert_eq!(Dtype::parse("F32_K"), None);
        let q = Dtype::Ggml(GgmlType::Q8_0);
        assert_eq!(serde_json::to_string(&q).unwrap(), "\"Q8_0\"");
        assert_eq!(serde_json::from_str::<Dtype>("\"Q8_0\"").unwrap(), q);
        assert_eq!(q.bytes(&[3, 64]), Some(3 * 2 * 34));
        assert_eq!(q.bytes(&[3, 48]), None);
        assert_eq!(q.bytes(&[]), None);
        assert_eq!(Dtype::F32.bytes(&[]), Some(4));
        for &t in GgmlType::ALL {
            assert_eq!(Dtype::from_ggml(t).ggml(), Some(t));
        }
        assert_eq!(Dtype::Bf16.size(), 2);
        assert_eq!(Dtype::F64.size(), 8);
    }
}
