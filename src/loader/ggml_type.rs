//! Every ggml tensor type a GGUF file may name: its number in the file, its
//! name, and its block geometry (elements per block, bytes per block). The
//! table follows ggml's `type_traits` (ggml/src/ggml.c) and the `gguf`
//! package's `GGML_QUANT_SIZES`; numbers ggml retired (4, 5, 31-33, 36-38)
//! and numbers past the table are refused, never guessed.

use std::fmt;

macro_rules! ggml_types {
    ($($(#[$doc:meta])* $variant:ident = $id:literal, $name:literal, $block:expr, $size:expr;)*) => {
        /// A ggml tensor type.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(non_camel_case_types)]
        pub enum GgmlType {
            $($(#[$doc])* $variant,)*
        }

        impl GgmlType {
            /// Every type, in the order of their numbers.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$variant,)*];

            /// The type numbered `id` in a GGUF file, if ggml defines it.
            pub fn from_id(id: u32) -> Option<GgmlType> {
                match id {
                    $($id => Some(GgmlType::$variant),)*
                    _ => None,
                }
            }

            /// The type's number in GGUF files.
            pub fn id(self) -> u32 {
                match self {
                    $(GgmlType::$variant => $id,)*
                }
            }

            /// The type's name as ggml and the `gguf` package print it
            /// ("Q8_0", "BF16").
            pub fn name(self) -> &'static str {
                match self {
                    $(GgmlType::$variant => $name,)*
                }
            }

            /// Elements per block (1 for the plain types).
            pub fn block(self) -> usize {
                match self {
                    $(GgmlType::$variant => $block,)*
                }
            }

            /// Bytes per block.
            pub fn type_size(self) -> usize {
                match self {
                    $(GgmlType::$variant => $size,)*
                }
            }
        }
    };
}

/// Elements per K-quant super-block.
const QK_K: usize = 256;

ggml_types! {
    /// IEEE single.
    F32 = 0, "F32", 1, 4;
    /// IEEE half.
    F16 = 1, "F16", 1, 2;
    /// 4-bit, one f16 scale per 32.
    Q4_0 = 2, "Q4_0", 32, 2 + 16;
    /// 4-bit, f16 scale and min per 32.
    Q4_1 = 3, "Q4_1", 32, 2 + 2 + 16;
    /// 5-bit, one f16 scale per 32.
    Q5_0 = 6, "Q5_0", 32, 2 + 4 + 16;
    /// 5-bit, f16 scale and min per 32.
    Q5_1 = 7, "Q5_1", 32, 2 + 2 + 4 + 16;
    /// 8-bit, one f16 scale per 32.
    Q8_0 = 8, "Q8_0", 32, 2 + 32;
    /// 8-bit, f32 scale and sum per 32.
    Q8_1 = 9, "Q8_1", 32, 4 + 4 + 32;
    /// K-quant, 2-bit.
    Q2_K = 10, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4;
    /// K-quant, 3-bit.
    Q3_K = 11, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12;
    /// K-quant, 4-bit.
    Q4_K = 12, "Q4_K", QK_K, 2 + 2 + QK_K / 2 + 12;
    /// K-quant, 5-bit.
    Q5_K = 13, "Q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12;
    /// K-quant, 6-bit.
    Q6_K = 14, "Q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16;
    /// K-quant, 8-bit (intermediate).
    Q8_K = 15, "Q8_K", QK_K, 4 + QK_K + QK_K / 8;
    /// i-quant, 2.06 bits.
    IQ2_XXS = 16, "IQ2_XXS", QK_K, 2 + QK_K / 4;
    /// i-quant, 2.31 bits.
    IQ2_XS = 17, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32;
    /// i-quant, 3.06 bits.
    IQ3_XXS = 18, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8;
    /// i-quant, 1.56 bits.
    IQ1_S = 19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16;
    /// i-quant, 4.5 bits, non-linear.
    IQ4_NL = 20, "IQ4_NL", 32, 2 + 16;
    /// i-quant, 3.44 bits.
    IQ3_S = 21, "IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4;
    /// i-quant, 2.5 bits.
    IQ2_S = 22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16;
    /// i-quant, 4.25 bits.
    IQ4_XS = 23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64;
    /// Signed byte.
    I8 = 24, "I8", 1, 1;
    /// Signed 16-bit integer.
    I16 = 25, "I16", 1, 2;
    /// Signed 32-bit integer.
    I32 = 26, "I32", 1, 4;
    /// Signed 64-bit integer.
    I64 = 27, "I64", 1, 8;
    /// IEEE double.
    F64 = 28, "F64", 1, 8;
    /// i-quant, 1.75 bits.
    IQ1_M = 29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32;
    /// bfloat16.
    BF16 = 30, "BF16", 1, 2;
    /// Ternary, 1.69 bits.
    TQ1_0 = 34, "TQ1_0", QK_K, 2 + 4 * 13;
    /// Ternary, 2.06 bits.
    TQ2_0 = 35, "TQ2_0", QK_K, 2 + 64;
    /// MXFP4: e2m1 values, one e8m0 scale per 32.
    MXFP4 = 39, "MXFP4", 32, 1 + 16;
    /// NVFP4: e2m1 values, four e4m3 scales per 64.
    NVFP4 = 40, "NVFP4", 64, 4 + 32;
    /// 1-bit, one f16 scale per 128.
    Q1_0 = 41, "Q1_0", 128, 2 + 16;
    /// 2-bit, one f16 scale per 64.
    Q2_0 = 42, "Q2_0", 64, 2 + 16;
}

impl GgmlType {
    /// The type named `name` (case-insensitive: "q8_0", "Q4_K").
    pub fn parse(name: &str) -> Option<GgmlType> {
        Self::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(name.trim()))
    }

    /// True for block-quantized types (more than one element per block).
    pub fn is_quantized(self) -> bool {
        self.block() > 1
    }

    /// Why number `id` is refused, for error messages.
    pub fn refusal(id: u32) -> String {
        let retired = match id {
            4 => Some("Q4_2"),
            5 => Some("Q4_3"),
            31 => Some("Q4_0_4_4"),
            32 => Some("Q4_0_4_8"),
            33 => Some("Q4_0_8_8"),
            36 => Some("IQ4_NL_4_4"),
            37 => Some("IQ4_NL_4_8"),
            38 => Some("IQ4_NL_8_8"),
            _ => None,
        };
        match retired {
            Some(n) => format!("ggml type {id} ({n}) was removed from ggml and GGUF files"),
            None => format!(
                "unknown ggml type {id} (known: {})",
                Self::ALL
                    .iter()
                    .map(|t| format!("{}={}", t.name(), t.id()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_ggml() {
        // Spot values from ggml-common.h's static_asserts.
        assert_eq!(GgmlType::Q4_0.type_size(), 18);
        assert_eq!(GgmlType::Q8_0.type_size(), 34);
        assert_eq!(GgmlType::Q2_K.type_size(), 84);
        assert_eq!(GgmlType::Q3_K.type_size(), 110);
        assert_eq!(GgmlType::Q4_K.type_size(), 144);
        assert_eq!(GgmlType::Q5_K.type_size(), 176);
        assert_eq!(GgmlType::Q6_K.type_size(), 210);
        assert_eq!(GgmlType::Q8_K.type_size(), 292);
        assert_eq!(GgmlType::TQ1_0.type_size(), 54);
        assert_eq!(GgmlType::IQ1_M.type_size(), 56);
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(*t));
            assert_eq!(GgmlType::parse(t.name()), Some(*t));
        }
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 43, u32::MAX] {
            assert_eq!(GgmlType::from_id(id), None);
        }
        assert!(GgmlType::refusal(31).contains("Q4_0_4_4"));
    }
}
