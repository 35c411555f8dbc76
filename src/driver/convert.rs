//! Element-type conversion on the CPU (the host backend's `convert_async`, and
//! the reference the GPU kernel is tested against).

use crate::driver::ConvertType;
use half::{bf16, f16};

impl ConvertType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            ConvertType::F16 | ConvertType::Bf16 => 2,
            ConvertType::F32 => 4,
        }
    }
}

fn load(src: *const u8, from: ConvertType, i: usize) -> f32 {
    // SAFETY (for each arm): the caller of `convert_on_cpu` guarantees `src` holds
    // `count > i` elements of `from`; unaligned reads make no alignment demand.
    unsafe {
        match from {
            ConvertType::F32 => (src as *const f32).add(i).read_unaligned(),
            ConvertType::F16 => {
                f16::from_bits((src as *const u16).add(i).read_unaligned()).to_f32()
            }
            ConvertType::Bf16 => {
                bf16::from_bits((src as *const u16).add(i).read_unaligned()).to_f32()
            }
        }
    }
}

fn store(dst: *mut u8, to: ConvertType, i: usize, v: f32) {
    // SAFETY (for each arm): the caller guarantees `dst` holds `count > i` elements of `to`.
    unsafe {
        match to {
            ConvertType::F32 => (dst as *mut f32).add(i).write_unaligned(v),
            ConvertType::F16 => (dst as *mut u16)
                .add(i)
                .write_unaligned(f16::from_f32(v).to_bits()),
            ConvertType::Bf16 => (dst as *mut u16)
                .add(i)
                .write_unaligned(bf16::from_f32(v).to_bits()),
        }
    }
}

/// Convert `count` elements from `src` (of `from`) to `dst` (of `to`),
/// rounding to nearest even, NaN and infinities preserved.
///
/// # Safety
/// `src` must be readable for `count * from.size()` bytes, `dst` writable for
/// `count * to.size()` bytes, and the two ranges must not overlap.
pub unsafe fn convert_on_cpu(
    dst: *mut u8,
    to: ConvertType,
    src: *const u8,
    from: ConvertType,
    count: usize,
) {
    if to == from {
        // SAFETY: forwarded from the caller's guarantees.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, count * to.size()) };
        return;
    }
    for i in 0..count {
        store(dst, to, i, load(src, from, i));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_f32_round_trip_is_exact() {
        let vals: Vec<u16> = (0..=u16::MAX).step_by(7).collect();
        let mut f = vec![0f32; vals.len()];
        let mut back = vec![0u16; vals.len()];
        // SAFETY: buffers are sized for `vals.len()` elements of each type.
        unsafe {
            convert_on_cpu(
                f.as_mut_ptr() as *mut u8,
                ConvertType::F32,
                vals.as_ptr() as *const u8,
                ConvertType::Bf16,
                vals.len(),
            );
            convert_on_cpu(
                back.as_mut_ptr() as *mut u8,
                ConvertType::Bf16,
                f.as_ptr() as *const u8,
                ConvertType::F32,
                vals.len(),
            );
        }
        for (a, b) in vals.iter().zip(&back) {
            let nan = bf16::from_bits(*a).is_nan();
            assert!(nan || a == b, "{a:#x} -> {b:#x}");
        }
    }

    #[test]
    fn f32_to_f16_rounds_to_nearest_even() {
        let src = [1.0f32, 65504.0, 1e-8, -2.5, f32::INFINITY];
        let mut dst = [0u16; 5];
        // SAFETY: buffers are sized for 5 elements.
        unsafe {
            convert_on_cpu(
                dst.as_mut_ptr() as *mut u8,
                ConvertType::F16,
                src.as_ptr() as *const u8,
                ConvertType::F32,
                5,
            )
        };
        let want: Vec<u16> = src.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
        assert_eq!(dst.to_vec(), want);
    }
}
