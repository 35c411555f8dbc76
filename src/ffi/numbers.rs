//! Converting the C layer's fixed-width numbers to Rust sizes: one place for
//! the "does not fit in size_t" error and for "0 means the default".

use crate::error::{Error, Result};

/// `v` as a `usize`, or `InvalidArgument` naming the argument `name`.
pub(crate) fn to_usize(v: u64, name: &str) -> Result<usize> {
    usize::try_from(v)
        .map_err(|_| Error::InvalidArgument(format!("`{name}` = {v} does not fit in size_t")))
}

/// `default` when `v` is 0 (the C option structs' "unset"), else [`to_usize`].
pub(crate) fn or_default(v: u64, default: usize, name: &str) -> Result<usize> {
    if v == 0 {
        Ok(default)
    } else {
        to_usize(v, name)
    }
}
