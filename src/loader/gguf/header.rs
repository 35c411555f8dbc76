//! Parsing and validating one GGUF file's header: magic, version, typed
//! metadata, tensor infos, alignment and where the data section starts.
//!
//! The parser reads from the file's bytes (its mapping) and trusts nothing:
//! every count and length is checked against the bytes left before anything
//! is allocated for it, and against the stated limits below, so a hostile
//! header cannot make it allocate more than a small multiple of
//! [`MAX_HEADER`]. Every offset and size is computed with checked arithmetic.

use std::collections::HashSet;

use super::super::dtype::Dtype;
use super::super::ggml_type::GgmlType;
use super::value::{Array, Metadata, Value, ValueType};

/// "GGUF" at byte level.
pub const MAGIC: [u8; 4] = *b"GGUF";

/// Largest header (metadata and tensor infos, up to the data section) read:
/// real ones, vocabulary included, are a few MB.
pub const MAX_HEADER: u64 = 256 << 20;

/// Longest metadata string (a chat template is tens of KB).
pub const MAX_STRING: u64 = 64 << 20;

/// Longest key (GGUF's own rule: at most 65535 bytes).
pub const MAX_KEY: u64 = 65535;

/// Longest tensor name accepted (GGUF asks for 64; some writers exceed it).
pub const MAX_NAME: u64 = 4096;

/// Deepest nesting of arrays inside arrays.
pub const MAX_DEPTH: usize = 8;

/// Most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// Alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// One tensor info as the file states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawTensor {
    /// Name.
    pub name: String,
    /// Dimensions in ggml order: `ne[0]` first, the fastest-moving one.
    pub ne: Vec<u64>,
    /// ggml type.
    pub ty: GgmlType,
    /// Absolute offset of the data in the file.
    pub offset: u64,
    /// Bytes of data.
    pub len: u64,
}

/// A validated header.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// Format version (2 or 3).
    pub version: u32,
    /// `general.alignment`, or 32.
    pub alignment: u64,
    /// Metadata, in file order.
    pub metadata: Metadata,
    /// Tensors, in file order.
    pub tensors: Vec<RawTensor>,
    /// Absolute offset of the data section.
    pub data_start: u64,
}

/// What is wrong with a header, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderError {
    /// The tensor concerned, when one is.
    pub tensor: Option<String>,
    /// What is wrong (naming the metadata key where one is concerned).
    pub reason: String,
}

type Res<T> = std::result::Result<T, HeaderError>;

fn err<T>(reason: impl Into<String>) -> Res<T> {
    Err(HeaderError {
        tensor: None,
        reason: reason.into(),
    })
}

/// A read position over the header's bytes; every read is bounded by them.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// The file is longer than `buf` (the header limit cut it).
    capped: bool,
}

impl<'a> Cursor<'a> {
    fn left(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Res<&'a [u8]> {
        if n > self.left() {
            let why = if self.capped {
                format!("the header would run past the {MAX_HEADER}-byte limit")
            } else {
                "the file is truncated".to_owned()
            };
            return err(format!(
                "{what} needs {n} bytes at offset {} but {} are left: {why}",
                self.pos,
                self.left()
            ));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Res<[u8; N]> {
        let s = self.take(N as u64, what)?;
        Ok(s.try_into().expect("take returned N bytes"))
    }

    fn u32(&mut self, what: &str) -> Res<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Res<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of items of at least `min` bytes each, bounded by the bytes left.
    fn count(&mut self, min: u64, limit: u64, what: &str) -> Res<u64> {
        let n = self.u64(what)?;
        if n > limit {
            return err(format!("{what} is {n}, over the limit of {limit}"));
        }
        if n.checked_mul(min).is_none_or(|b| b > self.left()) {
            return err(format!(
                "{what} is {n}, but {} bytes are left in the header (at least {min} per item)",
                self.left()
            ));
        }
        Ok(n)
    }

    fn string(&mut self, limit: u64, what: &str) -> Res<String> {
        let n = self.u64(what)?;
        if n > limit {
            return err(format!(
                "{what}: string length {n} is over the limit of {limit}"
            ));
        }
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| HeaderError {
            tensor: None,
            reason: format!("{what}: string is not UTF-8: {e}"),
        })
    }

    fn value(&mut self, ty: ValueType, depth: usize, what: &str) -> Res<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(what)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(what)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(self.u32(what)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::Bool => Value::Bool(self.boolean(what)?),
            ValueType::String => Value::String(self.string(MAX_STRING, what)?),
            ValueType::Array => Value::Array(self.array_value(depth + 1, what)?),
            ValueType::U64 => Value::U64(self.u64(what)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
        })
    }

    fn boolean(&mut self, what: &str) -> Res<bool> {
        match self.array::<1>(what)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => err(format!("{what}: bool byte is {b}, must be 0 or 1")),
        }
    }

    fn value_type(&mut self, what: &str) -> Res<ValueType> {
        let id = self.u32(what)?;
        ValueType::from_id(id).map_or_else(
            || {
                err(format!(
                    "{what}: unknown value type {id} (GGUF defines 0..=12)"
                ))
            },
            Ok,
        )
    }

    fn array_value(&mut self, depth: usize, what: &str) -> Res<Array> {
        if depth > MAX_DEPTH {
            return err(format!(
                "{what}: arrays nested deeper than {MAX_DEPTH} levels"
            ));
        }
        let ty = self.value_type(what)?;
        let n = self.count(ty.min_size(), u64::MAX, &format!("{what}: array length"))? as usize;
        macro_rules! packed {
            ($variant:ident, $read:expr) => {{
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push($read(self)?);
                }
                Array::$variant(v)
            }};
        }
        Ok(match ty {
            ValueType::U8 => Array::U8(self.take(n as u64, what)?.to_vec()),
            ValueType::I8 => Array::I8(
                self.take(n as u64, what)?
                    .iter()
                    .map(|&b| b as i8)
                    .collect(),
            ),
            ValueType::U16 => packed!(U16, |c: &mut Self| c.array(what).map(u16::from_le_bytes)),
            ValueType::I16 => packed!(I16, |c: &mut Self| c.array(what).map(i16::from_le_bytes)),
            ValueType::U32 => packed!(U32, |c: &mut Self| c.u32(what)),
            ValueType::I32 => packed!(I32, |c: &mut Self| c.array(what).map(i32::from_le_bytes)),
            ValueType::F32 => packed!(F32, |c: &mut Self| c.array(what).map(f32::from_le_bytes)),
            ValueType::Bool => packed!(Bool, |c: &mut Self| c.boolean(what)),
            ValueType::String => packed!(String, |c: &mut Self| c.string(MAX_STRING, what)),
            ValueType::Array => packed!(Array, |c: &mut Self| c.array_value(depth + 1, what)),
            ValueType::U64 => packed!(U64, |c: &mut Self| c.u64(what)),
            ValueType::I64 => packed!(I64, |c: &mut Self| c.array(what).map(i64::from_le_bytes)),
            ValueType::F64 => packed!(F64, |c: &mut Self| c.array(what).map(f64::from_le_bytes)),
        })
    }
}

/// Parse and validate the header of a GGUF file whose bytes are `file`.
pub fn parse(file: &[u8]) -> Res<Header> {
    parse_prefix(file, file.len() as u64)
}

/// Parse and validate the header of a GGUF file of `file_len` bytes from
/// its first bytes `head` (at least its header: a packed file keeps them);
/// tensor data is checked against `file_len`.
pub fn parse_prefix(head: &[u8], file_len: u64) -> Res<Header> {
    let head = &head[..head.len().min(MAX_HEADER as usize)];
    let mut c = Cursor {
        buf: head,
        pos: 0,
        capped: (head.len() as u64) < file_len,
    };
    let magic: [u8; 4] = c.array("magic")?;
    if magic != MAGIC {
        return err(format!(
            "magic bytes are {magic:02x?}, not \"GGUF\" (47 47 55 46)"
        ));
    }
    let version = c.u32("version")?;
    match version {
        2 | 3 => {}
        1 => return err("GGUF version 1 (32-bit counts) is not supported; versions 2 and 3 are"),
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return err(format!(
                "version reads {v}: the file is big-endian (GGUF v{}), only little-endian files are supported",
                v.swap_bytes()
            ))
        }
        v => return err(format!("unknown GGUF version {v} (supported: 2, 3)")),
    }
    let n_tensors = c.count(8 + 4 + 4 + 8, 1 << 20, "tensor count")?;
    let n_kv = c.count(8 + 4 + 1, 1 << 20, "metadata key count")?;
    let mut metadata = Metadata::default();
    let mut keys = HashSet::new();
    for i in 0..n_kv {
        let key = c.string(MAX_KEY, &format!("metadata key {i}"))?;
        let what = format!("metadata key `{}`", key.escape_debug());
        if !keys.insert(key.clone()) {
            return err(format!("{what} appears twice"));
        }
        let ty = c.value_type(&what)?;
        let v = c.value(ty, 0, &what)?;
        metadata.entries.push((key, v));
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if a.is_power_of_two() => *a as u64,
        Some(Value::U32(a)) => {
            return err(format!(
                "metadata key `general.alignment` is {a}, not a power of two"
            ))
        }
        Some(v) => {
            return err(format!(
                "metadata key `general.alignment` is a {}, must be a uint32",
                v.value_type()
            ))
        }
    };
    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut names = HashSet::new();
    for i in 0..n_tensors {
        let name = c.string(MAX_NAME, &format!("tensor info {i}: name"))?;
        let at = |reason: String| HeaderError {
            tensor: Some(name.clone()),
            reason,
        };
        if !names.insert(name.clone()) {
            return Err(at("tensor name appears twice".into()));
        }
        let n_dims = c.u32("n_dimensions").map_err(|e| at(e.reason))?;
        if n_dims as usize > MAX_DIMS {
            return Err(at(format!(
                "{n_dims} dimensions, over ggml's limit of {MAX_DIMS}"
            )));
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let d = c.u64("dimension").map_err(|e| at(e.reason))?;
            if d > i64::MAX as u64 {
                return Err(at(format!("dimension {d} is over ggml's int64 range")));
            }
            ne.push(d);
        }
        let id = c.u32("type").map_err(|e| at(e.reason))?;
        let ty = GgmlType::from_id(id).ok_or_else(|| at(GgmlType::refusal(id)))?;
        let rel = c.u64("offset").map_err(|e| at(e.reason))?;
        if ty.is_quantized()
            && ne
                .first()
                .is_none_or(|&n0| !n0.is_multiple_of(ty.block() as u64))
        {
            return Err(at(format!(
                "ne[0] of {ne:?} is not a whole number of {ty} blocks of {} elements",
                ty.block()
            )));
        }
        let shape: Vec<u64> = ne.iter().rev().copied().collect();
        let len = Dtype::from_ggml(ty).bytes(&shape).ok_or_else(|| {
            at(format!(
                "dimensions {ne:?} of {ty}: the byte size overflows"
            ))
        })?;
        if !rel.is_multiple_of(alignment) {
            return Err(at(format!(
                "data offset {rel} is not a multiple of the alignment {alignment}"
            )));
        }
        tensors.push(RawTensor {
            name,
            ne,
            ty,
            offset: rel,
            len,
        });
    }
    let end = c.pos as u64;
    let data_start = end.div_ceil(alignment).checked_mul(alignment);
    let Some(data_start) = data_start.filter(|&d| d <= file_len || n_tensors == 0) else {
        return err(format!(
            "the data section would start at byte {} (header end {end} aligned to {alignment}), past the end of the file ({file_len} bytes)",
            end.div_ceil(alignment).saturating_mul(alignment)
        ));
    };
    let data_len = file_len.saturating_sub(data_start);
    for t in &mut tensors {
        let fits = t.offset.checked_add(t.len).is_some_and(|e| e <= data_len);
        if !fits {
            return Err(HeaderError {
                tensor: Some(t.name.clone()),
                reason: format!(
                    "data [{}, {}+{}) of {} {:?} runs past the end of the data section ({data_len} bytes, file {file_len} bytes; truncated?)",
                    t.offset, t.offset, t.len, t.ty, t.ne
                ),
            });
        }
        t.offset += data_start;
    }
    let mut order: Vec<&RawTensor> = tensors.iter().collect();
    order.sort_by_key(|t| (t.offset, t.len));
    for w in order.windows(2) {
        if w[1].offset < w[0].offset + w[0].len {
            return Err(HeaderError {
                tensor: Some(w[1].name.clone()),
                reason: format!(
                    "data overlaps tensor `{}` (bytes {}..{} and {}..{} of the file)",
                    w[0].name.escape_debug(),
                    w[0].offset,
                    w[0].offset + w[0].len,
                    w[1].offset,
                    w[1].offset + w[1].len
                ),
            });
        }
    }
    Ok(Header {
        version,
        alignment,
        metadata,
        tensors,
        data_start,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(out: &mut Vec<u8>, v: &str) {
        out.extend((v.len() as u64).to_le_bytes());
        out.extend(v.as_bytes());
    }

    /// A v3 file: one u32 pair, one Q8_0 tensor of ne [32, 2] at offset 0.
    fn file() -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        s(&mut b, "k");
        b.extend(4u32.to_le_bytes());
        b.extend(9u32.to_le_bytes());
        s(&mut b, "w");
        b.extend(2u32.to_le_bytes());
        b.extend(32u64.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(8u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.resize(b.len().div_ceil(32) * 32, 0);
        b.extend([7u8; 68]);
        b
    }

    #[test]
    fn parses_offsets_from_the_aligned_data_start() {
        let b = file();
        let h = parse(&b).unwrap();
        assert_eq!(h.metadata.get("k"), Some(&Value::U32(9)));
        assert_eq!(h.data_start, (b.len() - 68) as u64);
        assert_eq!(h.tensors[0].offset, h.data_start);
        assert_eq!(h.tensors[0].len, 68);
        assert_eq!(h.tensors[0].ne, vec![32, 2]);
    }

    #[test]
    fn every_prefix_is_refused_without_panicking() {
        let b = file();
        for n in 0..b.len() {
            let e = parse(&b[..n]).unwrap_err();
            assert!(!e.reason.is_empty());
        }
    }
}
