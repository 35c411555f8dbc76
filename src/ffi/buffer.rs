//! Copying strings into caller-provided buffers (`buf`, `cap`, `*needed`).
//!
//! The contract every such function shares: `*needed` (when `needed` is not
//! NULL) receives the bytes required including the terminating NUL, on success
//! and on `VMMW_BUFFER_TOO_SMALL`; `buf` may be NULL when `cap` is 0, to ask
//! for the size first. On `VMMW_BUFFER_TOO_SMALL` nothing is written to `buf`.
//! A NULL `buf` with a non-zero `cap` is `VMMW_NULL_ARGUMENT`, and then
//! nothing is written at all (not `*needed` either).

use std::ffi::c_char;

use crate::error::{Error, Result};

/// Copy `text` and a NUL into `buf[..cap]`, reporting the size through `needed`.
/// Public for the CUDA runtime interposer's own C functions, which keep
/// the same contract.
///
/// # Safety
/// `buf` is NULL or writable for `cap` bytes; `needed` is NULL or writable.
pub unsafe fn write_str(
    text: &str,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
) -> Result<()> {
    if buf.is_null() && cap != 0 {
        return Err(Error::NullArgument("buf"));
    }
    let need = text.len() + 1;
    if !needed.is_null() {
        // SAFETY: non-NULL and writable per the contract.
        unsafe { needed.write(need) };
    }
    if cap < need {
        return Err(Error::BufferTooSmall {
            needed: need,
            got: cap,
        });
    }
    // SAFETY: `buf` is non-NULL here (a NULL `buf` has `cap` 0 < `need`) and writable for `cap >= need` bytes and cannot overlap `text`
    // (a Rust-owned string).
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
        buf.add(text.len()).write(0);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_buffer_reports_size_and_writes_nothing() {
        let mut buf = [b'x' as c_char; 4];
        let mut needed = 0usize;
        // SAFETY: buf has 4 bytes; needed is a local.
        let r = unsafe { write_str("hello", buf.as_mut_ptr(), buf.len(), &mut needed) };
        assert!(matches!(
            r,
            Err(Error::BufferTooSmall { needed: 6, got: 4 })
        ));
        assert_eq!(needed, 6);
        assert!(buf.iter().all(|&c| c == b'x' as c_char));

        // SAFETY: size query with a NULL buffer and cap 0.
        let r = unsafe { write_str("hello", std::ptr::null_mut(), 0, &mut needed) };
        assert!(r.is_err());
        assert_eq!(needed, 6);

        let mut big = [0 as c_char; 6];
        // SAFETY: big has 6 bytes.
        unsafe { write_str("hello", big.as_mut_ptr(), big.len(), std::ptr::null_mut()) }.unwrap();
        assert_eq!(big.map(|c| c as u8), *b"hello\0");

        let mut untouched = 99usize;
        // SAFETY: a NULL buffer with a non-zero cap is refused before any write.
        let r = unsafe { write_str("hello", std::ptr::null_mut(), 64, &mut untouched) };
        assert!(matches!(r, Err(Error::NullArgument("buf"))));
        assert_eq!(untouched, 99, "*needed is not written on NULL_ARGUMENT");
    }
}
