//! C access to a checkpoint's metadata (GGUF's typed key/value pairs),
//! read-only: open, count, keys, each value's type, typed getters, and
//! elements of (nested) arrays addressed by a path of indices. Also the ggml
//! type table, for runtimes that receive tensors by ggml type name.
//!
//! A value is addressed by the entry's index and a `path` of `depth` array
//! indices (NULL and 0 for the entry's own value): `(i, {2, 0}, 2)` is
//! element 0 of element 2 of entry `i`'s array. Value types use GGUF's
//! numbers (`VMMW_METADATA_UINT8` = 0 ... `VMMW_METADATA_FLOAT64` = 12).

use std::ffi::c_char;

use super::boundary::{arg, call, call_out, free_handle, into_handle, slice_arg, str_arg};
use super::buffer::write_str;
use super::error::vmmw_error_t;
use super::status::vmmw_status_t;
use crate::error::{Error, Result};
use crate::loader::gguf::{self, GgmlType, Metadata, ValueRef};
use crate::loader::Checkpoint;

/// Value type `uint8` (GGUF's numbering, as `vmmw_metadata_type` reports it).
pub const VMMW_METADATA_UINT8: u32 = 0;
/// Value type `int8`.
pub const VMMW_METADATA_INT8: u32 = 1;
/// Value type `uint16`.
pub const VMMW_METADATA_UINT16: u32 = 2;
/// Value type `int16`.
pub const VMMW_METADATA_INT16: u32 = 3;
/// Value type `uint32`.
pub const VMMW_METADATA_UINT32: u32 = 4;
/// Value type `int32`.
pub const VMMW_METADATA_INT32: u32 = 5;
/// Value type `float32`.
pub const VMMW_METADATA_FLOAT32: u32 = 6;
/// Value type `bool`.
pub const VMMW_METADATA_BOOL: u32 = 7;
/// Value type `string`.
pub const VMMW_METADATA_STRING: u32 = 8;
/// Value type `array`.
pub const VMMW_METADATA_ARRAY: u32 = 9;
/// Value type `uint64`.
pub const VMMW_METADATA_UINT64: u32 = 10;
/// Value type `int64`.
pub const VMMW_METADATA_INT64: u32 = 11;
/// Value type `float64`.
pub const VMMW_METADATA_FLOAT64: u32 = 12;

/// A checkpoint's metadata, read-only. Immutable once opened: any number of
/// threads may read one handle at the same time.
pub struct vmmw_metadata_t {
    pub(crate) meta: Metadata,
}

/// Open the checkpoint at `path` (any format `vmmw_loader_open` accepts) and
/// keep its metadata: a GGUF file's key/value pairs (the first part's, for a
/// split), none for safetensors. The checkpoint is validated as a load would
/// validate it. On success `*out` receives a new handle owned by the caller
/// (`vmmw_metadata_free`).
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `path` or `out` is NULL.
/// - `VMMW_IO`: missing or unreadable.
/// - `VMMW_CHECKPOINT_INVALID`, naming the file, tensor or key: every check of
///   `vmmw_loader_open` (for GGUF: docs/GGUF.md's list).
///
/// # Safety
/// `path` is a NUL-terminated string; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_metadata_open(
    path: *const c_char,
    out: *mut *mut vmmw_metadata_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let path = unsafe { str_arg(path, "path") }?;
        Ok(into_handle(vmmw_metadata_t {
            meta: Checkpoint::read_metadata(path)?,
        }))
    })
}

/// Free a metadata handle. NULL is accepted. Strings copied out stay valid
/// (they are the caller's buffers).
///
/// # Safety
/// `meta` is NULL or a live handle, not used afterwards and not concurrently.
#[no_mangle]
pub unsafe extern "C" fn vmmw_metadata_free(meta: *mut vmmw_metadata_t) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(meta) }
}

/// Number of key/value pairs into `*out`.
///
/// Errors: `VMMW_NULL_ARGUMENT`: `meta` or `out` is NULL.
///
/// # Safety
/// `meta` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_metadata_count(
    meta: *const vmmw_metadata_t,
    out: *mut usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        Ok(unsafe { arg(meta, "meta") }?.meta.len())
    })
}

/// The key of pair `index` (file order), into `buf` (buffer contract of
/// `vmmw_device_describe`).
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `meta` is NULL, or `buf` is NULL and `cap` > 0.
/// - `VMMW_INVALID_ARGUMENT`: `index` is not below the count.
/// - `VMMW_BUFFER_TOO_SMALL`: `cap` is short; `*needed` is set.
///
/// # Safety
/// `meta` is a live handle; `buf` is NULL or writable for `cap` bytes;
/// `needed` and `error` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_metadata_key(
    meta: *const vmmw_metadata_t,
    index: usize,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let m = &unsafe { arg(meta, "meta") }?.meta;
        let (k, _) = m.entries.get(index).ok_or_else(|| out_of_range(m, index))?;
        // SAFETY: forwarded contract.
        unsafe { write_str(k, buf, cap, needed) }
    })
}

/// The index of the pair whose key is `key` into `*out`.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `meta`, `key` or `out` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: no pair has that key (the message names it).
///
/// # Safety
/// `meta` is a live handle; `key` is a NUL-terminated string; `out` is
/// writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_metadata_find(
    meta: *const vmmw_metadata_t,
    key: *const c_char,
    out: *mut usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let m = &unsafe { arg(meta, "meta") }?.meta;
        // SAFETY: forwarded contract.
        let key = unsafe { str_arg(key, "key") }?;
        m.position(key).ok_or_else(|| {
            Error::InvalidArgument(format!("no metadata key `{}`", key.escape_debug()))
        })
    })
}

/// The type of the value at (`index`, `path`) into `*type_out`; for an
/// array, its element type into `*elem_type` and length into `*len`
/// (both 0 otherwise). `elem_type` and `len` may be NULL.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `meta` or `type_out` is NULL, or `path` is NULL
///   with `depth` > 0.
/// - `VMMW_INVALID_ARGUMENT`: `index` or a path step out of range, or a step
///   into a value that is not an array (the message names the key).
///
/// # Safety
/// `meta` is a live handle; `path` is NULL or readable for `depth` entries;
/// `type_out`, `elem_type`, `len` and `error` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_metadata_type(
    meta: *const vmmw_metadata_t,
    index: usize,
    path: *const usize,
    depth: usize,
    type_out: *mut u32,
    elem_type: *mut u32,
    len: *mut usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(type_out, "type_out", error, || {
        // SAFETY: forwarded contract.
        let (_, v) = unsafe { value_at(meta, index, path, depth) }?;
        let (et, n) = v
            .array()
            .map_or((0, 0), |a| (a.elem_type() as u32, a.len()));
        // SAFETY: NULL or writable per the contract.
        unsafe {
            if !elem_type.is_null() {
                elem_type.write(et);
            }
            if !len.is_null() {
                len.write(n);
            }
        }
        Ok(v.value_type() as u32)
    })
}

/// An integer value (any of the eight integer types) that fits in u64.
///
/// Errors: those of `vmmw_metadata_type`, and `VMMW_INVALID_ARGUMENT` when
/// the value is not an integer or is negative (the message names the key).
///
/// # Safety
/// As `vmmw_metadata_type`; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_metadata_u64(
    meta: *const vmmw_metadata_t,
    index: usize,
    path: *const usize,
    depth: usize,
    out: *mut u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let (key, v) = unsafe { value_at(meta, index, path, depth) }?;
        v.as_u64()
            .ok_or_else(|| wrong(key, v, "an integer that fits in uint64"))
    })
}

/// An integer value (any of the eight integer types) that fits in i64.
///
/// Errors: those of `vmmw_metadata_type`, and `VMMW_INVALID_ARGUMENT` when
/// the value is not an integer or is over `INT64_MAX`.
///
/// # Safety
/// As `vmmw_metadata_type`; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_metadata_i64(
    meta: *const vmmw_metadata_t,
    index: usize,
    path: *const usize,
    depth: usize,
    out: *mut i64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let (key, v) = unsafe { value_at(meta, index, path, depth) }?;
        v.as_i64()
            .ok_or_else(|| wrong(key, v, "an integer that fits in int64"))
    })
}

/// A float32 or float64 value, as a double.
///
/// Errors: those of `vmmw_metadata_type`, and `VMMW_INVALID_ARGUMENT` when
/// the value is not a float.
///
/// # Safety
/// As `vmmw_metadata_type`; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_metadata_f64(
    meta: *const vmmw_metadata_t,
    index: usize,
    path: *const usize,
    depth: usize,
    out: *mut f64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let (key, v) = unsafe { value_at(meta, index, path, depth) }?;
        v.as_f64().ok_or_else(|| wrong(key, v, "a float"))
    })
}

/// A bool value: 1 for true, 0 for false into `*out`.
///
/// Errors: those of `vmmw_metadata_type`, and `VMMW_INVALID_ARGUMENT` when
/// the value is not a bool.
///
/// # Safety
/// As `vmmw_metadata_type`; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_metadata_bool(
    meta: *const vmmw_metadata_t,
    index: usize,
    path: *const usize,
    depth: usize,
    out: *mut u8,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let (key, v) = unsafe { value_at(meta, index, path, depth) }?;
        v.as_bool()
            .map(u8::from)
            .ok_or_else(|| wrong(key, v, "a bool"))
    })
}

/// A string value into `buf` (buffer contract of `vmmw_device_describe`; a
/// string holding NUL bytes reads as cut at the first one in C, `*needed`
/// still counts every byte).
///
/// Errors: those of `vmmw_metadata_type`, the buffer contract, and
/// `VMMW_INVALID_ARGUMENT` when the value is not a string.
///
/// # Safety
/// As `vmmw_metadata_type`; `buf` is NULL or writable for `cap` bytes;
/// `needed` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_metadata_string(
    meta: *const vmmw_metadata_t,
    index: usize,
    path: *const usize,
    depth: usize,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let (key, v) = unsafe { value_at(meta, index, path, depth) }?;
        let s = v.as_str().ok_or_else(|| wrong(key, v, "a string"))?;
        // SAFETY: forwarded contract.
        unsafe { write_str(s, buf, cap, needed) }
    })
}

/// The ggml tensor type named `name` ("Q8_0", "q4_k", "BF16"; the names
/// `vmmw_destination_t.dtype` holds for GGUF tensors): its number in GGUF
/// files, elements per block and bytes per block. Each out-pointer may be NULL.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `name` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: ggml has no type of that name.
///
/// # Safety
/// `name` is a NUL-terminated string; `id`, `block`, `type_size` and `error`
/// are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_ggml_type(
    name: *const c_char,
    id: *mut u32,
    block: *mut usize,
    type_size: *mut usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let name = unsafe { str_arg(name, "name") }?;
        let t = GgmlType::parse(name).ok_or_else(|| {
            Error::InvalidArgument(format!("ggml has no type `{}`", name.escape_debug()))
        })?;
        // SAFETY: NULL or writable per the contract.
        unsafe {
            if !id.is_null() {
                id.write(t.id());
            }
            if !block.is_null() {
                block.write(t.block());
            }
            if !type_size.is_null() {
                type_size.write(t.type_size());
            }
        }
        Ok(())
    })
}

/// # Safety
/// `meta` is NULL or a live handle that outlives `'a`; `path` is NULL or
/// readable for `depth` entries.
unsafe fn value_at<'a>(
    meta: *const vmmw_metadata_t,
    index: usize,
    path: *const usize,
    depth: usize,
) -> Result<(&'a str, ValueRef<'a>)> {
    // SAFETY: forwarded contract.
    let m = &unsafe { arg(meta, "meta") }?.meta;
    if depth > gguf::MAX_DEPTH + 1 {
        return Err(Error::InvalidArgument(format!(
            "path depth {depth} is deeper than any array may nest ({})",
            gguf::MAX_DEPTH + 1
        )));
    }
    // SAFETY: forwarded contract.
    let path = unsafe { slice_arg(path, depth, "path") }?;
    let v = m.at(index, path).map_err(Error::InvalidArgument)?;
    Ok((&m.entries[index].0, v))
}

fn out_of_range(m: &Metadata, index: usize) -> Error {
    Error::InvalidArgument(format!(
        "metadata index {index} is not below the count {}",
        m.len()
    ))
}

fn wrong(key: &str, v: ValueRef<'_>, want: &str) -> Error {
    Error::InvalidArgument(format!(
        "metadata key `{}`: the value is a {} ({}), not {want}",
        key.escape_debug(),
        v.value_type(),
        match v {
            ValueRef::Value(x) => x.to_string(),
            ValueRef::Elem(a, i) => a.get(i).map_or_else(String::new, |x| x.to_string()),
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Status;
    use crate::loader::gguf::{Array, Value, ValueType};

    fn handle() -> *mut vmmw_metadata_t {
        let meta = Metadata {
            entries: vec![
                ("name".into(), Value::String("llama".into())),
                ("n".into(), Value::I16(-3)),
                (
                    "nested".into(),
                    Value::Array(Array::Array(vec![
                        Array::U8(vec![1, 2]),
                        Array::String(vec!["x".into()]),
                    ])),
                ),
            ],
        };
        into_handle(vmmw_metadata_t { meta })
    }

    #[test]
    fn getters_follow_paths_and_refuse_what_does_not_fit() {
        let m = handle();
        let mut buf = [0 as c_char; 8];
        let mut needed = 0usize;
        // SAFETY: `m` is live until freed below; every out-pointer is a local.
        unsafe {
            let (mut t, mut et, mut len) = (0u32, 0u32, 0usize);
            let err = std::ptr::null_mut();
            assert_eq!(
                vmmw_metadata_type(m, 2, std::ptr::null(), 0, &mut t, &mut et, &mut len, err),
                0
            );
            assert_eq!((t, et, len), (VMMW_METADATA_ARRAY, VMMW_METADATA_ARRAY, 2));
            let path = [1usize, 0];
            assert_eq!(
                vmmw_metadata_string(
                    m,
                    2,
                    path.as_ptr(),
                    2,
                    buf.as_mut_ptr(),
                    8,
                    &mut needed,
                    err
                ),
                0
            );
            assert_eq!((buf[0] as u8, buf[1], needed), (b'x', 0, 2));
            let mut u = 0u64;
            let path = [0usize, 1];
            assert_eq!(vmmw_metadata_u64(m, 2, path.as_ptr(), 2, &mut u, err), 0);
            assert_eq!(u, 2);
            let mut i = 0i64;
            assert_eq!(vmmw_metadata_i64(m, 1, std::ptr::null(), 0, &mut i, err), 0);
            assert_eq!(i, -3);
            u = 7;
            assert_eq!(
                vmmw_metadata_u64(m, 1, std::ptr::null(), 0, &mut u, err),
                Status::InvalidArgument as i32
            );
            assert_eq!(u, 7, "nothing written on failure");
            let past = [0usize, 2];
            assert_eq!(
                vmmw_metadata_u64(m, 2, past.as_ptr(), 2, &mut u, err),
                Status::InvalidArgument as i32
            );
            assert_eq!(
                vmmw_metadata_u64(m, 2, std::ptr::null(), 1, &mut u, err),
                Status::NullArgument as i32
            );
            assert_eq!(
                vmmw_metadata_key(m, 0, buf.as_mut_ptr(), 3, &mut needed, err),
                Status::BufferTooSmall as i32
            );
            assert_eq!(needed, 5);
            let mut n = 0usize;
            assert_eq!(vmmw_metadata_count(m, &mut n, err), 0);
            assert_eq!(n, 3);
            vmmw_metadata_free(m);
            vmmw_metadata_free(std::ptr::null_mut());
        }
    }

    #[test]
    fn value_type_constants_are_gguf_numbers() {
        assert_eq!(super::VMMW_METADATA_ARRAY, ValueType::Array as u32);
        assert_eq!(super::VMMW_METADATA_FLOAT64, ValueType::F64 as u32);
        assert_eq!(super::VMMW_METADATA_BOOL, ValueType::Bool as u32);
    }
}
