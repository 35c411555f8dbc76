//! Reading a caller's option struct whose first field is its own size.
//!
//! `vmmw_pool_options_t`, `vmmw_load_options_t` and `vmmw_sleep_options_t`
//! start with `size_t size`, set by the caller to `sizeof` the struct as its
//! header declares it. That lets the structs grow at the end within an ABI
//! version (docs/ABI.md):
//! - an older program passes a smaller struct: the library reads `size` bytes
//!   and every field past them takes its default (0);
//! - a newer program passes a larger struct to an older library: accepted
//!   when every byte the library does not know is 0 (those fields are at
//!   their defaults), else `VMMW_UNSUPPORTED` naming the sizes, so a setting
//!   is never silently ignored;
//! - `size` smaller than the `size` field itself (0: never set) is
//!   `VMMW_INVALID_ARGUMENT`.

use std::mem::size_of;

use crate::error::{Error, Result};

/// An option struct C passes by pointer: `#[repr(C)]`, a `size: usize` first
/// field, and every field valid for any bit pattern (integers and raw
/// pointers), so a prefix of caller bytes over the default is a valid value.
///
/// # Safety
/// Implementors must meet every condition above.
pub(crate) unsafe trait SizedOptions: Copy {
    /// The C type name, for messages ("vmmw_load_options_t").
    const NAME: &'static str;
    /// Every field 0 except `size`, which is `size_of::<Self>()`.
    fn defaults() -> Self;
}

/// Read `*p` as written by a caller whose header declared `size` bytes;
/// `None` for a NULL `p` (the caller asked for defaults).
///
/// # Safety
/// `p` is NULL or readable for the number of bytes its `size` field holds.
pub(crate) unsafe fn read_sized<T: SizedOptions>(p: *const T) -> Result<Option<T>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL and, per the contract, readable for at least its
    // leading `size` field (checked against that field's size below before
    // anything else is read).
    let size = unsafe { p.cast::<usize>().read_unaligned() };
    let ours = size_of::<T>();
    if size < size_of::<usize>() {
        return Err(Error::InvalidArgument(format!(
            "{}.size is {size}: set it to sizeof({}) ({ours} in this library's header), \
             or start from VMMW_*_OPTIONS_INIT",
            T::NAME,
            T::NAME
        )));
    }
    let bytes = p.cast::<u8>();
    if size > ours {
        // SAFETY: the caller declared `size` readable bytes.
        let tail = unsafe { std::slice::from_raw_parts(bytes.add(ours), size - ours) };
        if let Some(at) = tail.iter().position(|&b| b != 0) {
            return Err(Error::Unsupported(format!(
                "{}.size is {size} but this library knows {ours} bytes of it, and byte {} \
                 past them is set: the program was built against a newer header than this \
                 library (vmmw_version_string() = {}); upgrade the library",
                T::NAME,
                ours + at,
                env!("CARGO_PKG_VERSION")
            )));
        }
    }
    let mut out = T::defaults();
    // SAFETY: `min(size, ours)` bytes are readable at `bytes` (caller
    // contract) and writable at `out` (it is `ours` bytes); any bit pattern is
    // a valid `T` field value (SizedOptions contract); the regions are disjoint.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes, (&mut out as *mut T).cast::<u8>(), size.min(ours))
    };
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct Opts {
        size: usize,
        a: u32,
        b: u32,
        c: u64,
    }

    // SAFETY: repr(C), size first, integers only.
    unsafe impl SizedOptions for Opts {
        const NAME: &'static str = "opts_t";
        fn defaults() -> Self {
            Opts {
                size: size_of::<Self>(),
                a: 0,
                b: 0,
                c: 0,
            }
        }
    }

    /// An older header's struct: the first two fields only.
    #[repr(C)]
    struct OldOpts {
        size: usize,
        a: u32,
    }

    #[test]
    fn null_means_defaults() {
        // SAFETY: NULL is allowed.
        assert_eq!(
            unsafe { read_sized::<Opts>(std::ptr::null()) }.unwrap(),
            None
        );
    }

    #[test]
    fn a_smaller_older_struct_reads_its_fields_and_defaults_the_rest() {
        let old = OldOpts {
            size: size_of::<OldOpts>(),
            a: 7,
        };
        // SAFETY: `old` is readable for its declared size.
        let got = unsafe { read_sized::<Opts>((&old as *const OldOpts).cast()) }
            .unwrap()
            .unwrap();
        assert_eq!((got.a, got.b, got.c), (7, 0, 0));
    }

    #[test]
    fn a_larger_newer_struct_is_accepted_only_with_a_zero_tail() {
        #[repr(C)]
        struct Newer {
            o: Opts,
            extra: u64,
        }
        let mut n = Newer {
            o: Opts {
                size: size_of::<Newer>(),
                a: 1,
                b: 2,
                c: 3,
            },
            extra: 0,
        };
        // SAFETY: `n` is readable for its declared size.
        let got = unsafe { read_sized::<Opts>((&n as *const Newer).cast()) }
            .unwrap()
            .unwrap();
        assert_eq!((got.a, got.b, got.c), (1, 2, 3));
        n.extra = 9;
        // SAFETY: as above.
        let err = unsafe { read_sized::<Opts>((&n as *const Newer).cast()) }.unwrap_err();
        assert!(matches!(err, Error::Unsupported(_)), "{err}");
        assert!(err.to_string().contains("newer header"), "{err}");
    }

    #[test]
    fn an_unset_size_is_refused_with_the_fix() {
        let o = Opts {
            size: 0,
            a: 1,
            b: 0,
            c: 0,
        };
        // SAFETY: `o` is readable.
        let err = unsafe { read_sized::<Opts>(&o) }.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert!(err.to_string().contains("sizeof(opts_t)"), "{err}");
    }
}
