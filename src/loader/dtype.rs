//! Safetensors element types: names as they appear in headers, sizes, and the
//! subset the copy engine can convert between.

use std::fmt;

use crate::driver::ConvertType;

/// An element type as named in a safetensors header ("BF16", "F32", ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Dtype {
    /// Boolean, one byte.
    #[serde(rename = "BOOL")]
    Bool,
    /// Unsigned byte.
    #[serde(rename = "U8")]
    U8,
    /// Signed byte.
    #[serde(rename = "I8")]
    I8,
    /// 8-bit float, e4m3.
    #[serde(rename = "F8_E4M3")]
    F8E4M3,
    /// 8-bit float, e5m2.
    #[serde(rename = "F8_E5M2")]
    F8E5M2,
    /// Signed 16-bit integer.
    #[serde(rename = "I16")]
    I16,
    /// Unsigned 16-bit integer.
    #[serde(rename = "U16")]
    U16,
    /// IEEE half.
    #[serde(rename = "F16")]
    F16,
    /// bfloat16.
    #[serde(rename = "BF16")]
    Bf16,
    /// Signed 32-bit integer.
    #[serde(rename = "I32")]
    I32,
    /// Unsigned 32-bit integer.
    #[serde(rename = "U32")]
    U32,
    /// IEEE single.
    #[serde(rename = "F32")]
    F32,
    /// Signed 64-bit integer.
    #[serde(rename = "I64")]
    I64,
    /// Unsigned 64-bit integer.
    #[serde(rename = "U64")]
    U64,
    /// IEEE double.
    #[serde(rename = "F64")]
    F64,
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
        }
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
        alias.or_else(|| ALL.iter().copied().find(|d| d.name() == up))
    }

    /// Every known header name, for error messages.
    pub fn known_names() -> String {
        ALL.iter().map(|d| d.name()).collect::<Vec<_>>().join(", ")
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
        assert_eq!(Dtype::parse("Q4_K"), None);
        assert_eq!(Dtype::Bf16.size(), 2);
        assert_eq!(Dtype::F64.size(), 8);
    }
}
