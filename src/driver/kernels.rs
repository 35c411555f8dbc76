//! PTX for the dtype-conversion kernels, generated as text and loaded by the
//! driver (`cuModuleLoadData`), so building needs no CUDA compiler.
//!
//! One kernel per (from, to) pair: `vmmw_convert_<from>_<to>(dst, src, n)`,
//! a grid-stride loop. bf16 rounding is done with integer arithmetic
//! (round to nearest even, NaN kept quiet), so the PTX targets sm_52 and runs
//! on every GPU that has the VMM API; results match `half`'s conversions,
//! which the host backend uses.

use super::ConvertType;

fn name(t: ConvertType) -> &'static str {
    match t {
        ConvertType::F16 => "f16",
        ConvertType::Bf16 => "bf16",
        ConvertType::F32 => "f32",
    }
}

/// The entry-point name of the kernel converting `from` into `to`.
pub fn kernel_name(from: ConvertType, to: ConvertType) -> String {
    format!("vmmw_convert_{}_{}", name(from), name(to))
}

/// Every pair of distinct types, in a fixed order.
pub const PAIRS: [(ConvertType, ConvertType); 6] = [
    (ConvertType::F32, ConvertType::Bf16),
    (ConvertType::F32, ConvertType::F16),
    (ConvertType::Bf16, ConvertType::F32),
    (ConvertType::F16, ConvertType::F32),
    (ConvertType::Bf16, ConvertType::F16),
    (ConvertType::F16, ConvertType::Bf16),
];

fn load(from: ConvertType) -> &'static str {
    match from {
        ConvertType::F32 => "  ld.global.f32 %f1, [%rd8];\n",
        ConvertType::F16 => "  ld.global.b16 %h1, [%rd8];\n  cvt.f32.f16 %f1, %h1;\n",
        ConvertType::Bf16 => {
            "  ld.global.u16 %rs1, [%rd8];\n  cvt.u32.u16 %r5, %rs1;\n  shl.b32 %r5, %r5, 16;\n  mov.b32 %f1, %r5;\n"
        }
    }
}

fn store(to: ConvertType) -> &'static str {
    match to {
        ConvertType::F32 => "  st.global.f32 [%rd9], %f1;\n",
        ConvertType::F16 => "  cvt.rn.f16.f32 %h1, %f1;\n  st.global.b16 [%rd9], %h1;\n",
        ConvertType::Bf16 => concat!(
            "  mov.b32 %r5, %f1;\n",
            "  and.b32 %r6, %r5, 2147483647;\n",
            "  setp.gt.u32 %p2, %r6, 2139095040;\n",
            "  shr.u32 %r7, %r5, 16;\n",
            "  and.b32 %r8, %r7, 1;\n",
            "  add.u32 %r9, %r5, 32767;\n",
            "  add.u32 %r9, %r9, %r8;\n",
            "  shr.u32 %r9, %r9, 16;\n",
            "  or.b32 %r7, %r7, 64;\n",
            "  selp.b32 %r9, %r7, %r9, %p2;\n",
            "  cvt.u16.u32 %rs1, %r9;\n",
            "  st.global.u16 [%rd9], %rs1;\n",
        ),
    }
}

fn shift(t: ConvertType) -> u32 {
    match t {
        ConvertType::F32 => 2,
        ConvertType::F16 | ConvertType::Bf16 => 1,
    }
}

/// The whole PTX module, NUL-terminated as `cuModuleLoadData` expects.
pub fn ptx() -> String {
    let mut s = String::from(".version 6.4\n.target sm_52\n.address_size 64\n\n");
    for (from, to) in PAIRS {
        s.push_str(&format!(
            ".visible .entry {}(\n  .param .u64 p_dst,\n  .param .u64 p_src,\n  .param .u64 p_n\n)\n{{\n",
            kernel_name(from, to)
        ));
        s.push_str(concat!(
            "  .reg .pred %p<3>;\n  .reg .b16 %h<2>;\n  .reg .u16 %rs<2>;\n",
            "  .reg .b32 %r<10>;\n  .reg .b64 %rd<10>;\n  .reg .f32 %f<2>;\n",
            "  ld.param.u64 %rd1, [p_dst];\n  ld.param.u64 %rd2, [p_src];\n  ld.param.u64 %rd3, [p_n];\n",
            "  cvta.to.global.u64 %rd1, %rd1;\n  cvta.to.global.u64 %rd2, %rd2;\n",
            "  mov.u32 %r1, %ctaid.x;\n  mov.u32 %r2, %ntid.x;\n  mov.u32 %r3, %tid.x;\n",
            "  mul.wide.u32 %rd4, %r1, %r2;\n  cvt.u64.u32 %rd5, %r3;\n  add.u64 %rd4, %rd4, %rd5;\n",
            "  mov.u32 %r4, %nctaid.x;\n  mul.wide.u32 %rd6, %r4, %r2;\n",
            "LOOP:\n  setp.ge.u64 %p1, %rd4, %rd3;\n  @%p1 bra DONE;\n",
        ));
        s.push_str(&format!(
            "  shl.b64 %rd7, %rd4, {};\n  add.u64 %rd8, %rd2, %rd7;\n",
            shift(from)
        ));
        s.push_str(load(from));
        s.push_str(&format!(
            "  shl.b64 %rd7, %rd4, {};\n  add.u64 %rd9, %rd1, %rd7;\n",
            shift(to)
        ));
        s.push_str(store(to));
        s.push_str("  add.u64 %rd4, %rd4, %rd6;\n  bra LOOP;\nDONE:\n  ret;\n}\n\n");
    }
    s.push('\0');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_has_every_pair_and_is_nul_terminated() {
        let p = ptx();
        for (f, t) in PAIRS {
            assert!(p.contains(&format!(".entry {}(", kernel_name(f, t))));
        }
        assert!(p.ends_with('\0'));
        assert_eq!(p.matches('\0').count(), 1);
    }
}
