//! GGUF metadata values: the thirteen value types, arrays of any of them
//! (nested too), and the ordered key/value list of one file.
//!
//! Arrays of numbers are kept as packed vectors, so memory grows with the
//! file's bytes and not with a per-element enum.

use std::fmt;

/// A metadata value type's number in GGUF files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    /// `uint8`.
    U8 = 0,
    /// `int8`.
    I8 = 1,
    /// `uint16`.
    U16 = 2,
    /// `int16`.
    I16 = 3,
    /// `uint32`.
    U32 = 4,
    /// `int32`.
    I32 = 5,
    /// `float32`.
    F32 = 6,
    /// `bool` (one byte, 0 or 1).
    Bool = 7,
    /// Length-prefixed UTF-8 string.
    String = 8,
    /// Typed, length-prefixed array.
    Array = 9,
    /// `uint64`.
    U64 = 10,
    /// `int64`.
    I64 = 11,
    /// `float64`.
    F64 = 12,
}

impl ValueType {
    /// The type numbered `id`, if GGUF defines it.
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Bytes one value of this type takes at least in a file (a string's
    /// length prefix, an array's type and length).
    pub fn min_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }

    /// The name GGUF's documentation uses ("uint32", "string").
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "uint8",
            I8 => "int8",
            U16 => "uint16",
            I16 => "int16",
            U32 => "uint32",
            I32 => "int32",
            F32 => "float32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "uint64",
            I64 => "int64",
            F64 => "float64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `uint8`.
    U8(u8),
    /// `int8`.
    I8(i8),
    /// `uint16`.
    U16(u16),
    /// `int16`.
    I16(i16),
    /// `uint32`.
    U32(u32),
    /// `int32`.
    I32(i32),
    /// `float32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// `string`.
    String(String),
    /// `array`.
    Array(Array),
    /// `uint64`.
    U64(u64),
    /// `int64`.
    I64(i64),
    /// `float64`.
    F64(f64),
}

/// A metadata array: its element type and elements.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    /// `uint8` elements.
    U8(Vec<u8>),
    /// `int8` elements.
    I8(Vec<i8>),
    /// `uint16` elements.
    U16(Vec<u16>),
    /// `int16` elements.
    I16(Vec<i16>),
    /// `uint32` elements.
    U32(Vec<u32>),
    /// `int32` elements.
    I32(Vec<i32>),
    /// `float32` elements.
    F32(Vec<f32>),
    /// `bool` elements.
    Bool(Vec<bool>),
    /// `string` elements.
    String(Vec<String>),
    /// Nested arrays.
    Array(Vec<Array>),
    /// `uint64` elements.
    U64(Vec<u64>),
    /// `int64` elements.
    I64(Vec<i64>),
    /// `float64` elements.
    F64(Vec<f64>),
}

impl Value {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// An integer value of any integer type as i128 (None for other types).
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// A float value of either float type as f64.
    pub fn as_float(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
}

impl Array {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// True when the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as a [`Value`] (a copy; None past the end).
    pub fn get(&self, i: usize) -> Option<Value> {
        Some(match self {
            Array::U8(v) => Value::U8(*v.get(i)?),
            Array::I8(v) => Value::I8(*v.get(i)?),
            Array::U16(v) => Value::U16(*v.get(i)?),
            Array::I16(v) => Value::I16(*v.get(i)?),
            Array::U32(v) => Value::U32(*v.get(i)?),
            Array::I32(v) => Value::I32(*v.get(i)?),
            Array::F32(v) => Value::F32(*v.get(i)?),
            Array::Bool(v) => Value::Bool(*v.get(i)?),
            Array::String(v) => Value::String(v.get(i)?.clone()),
            Array::Array(v) => Value::Array(v.get(i)?.clone()),
            Array::U64(v) => Value::U64(*v.get(i)?),
            Array::I64(v) => Value::I64(*v.get(i)?),
            Array::F64(v) => Value::F64(*v.get(i)?),
        })
    }
}

impl fmt::Display for Value {
    /// Short form for tools: strings quoted and escaped, arrays as their type
    /// and length with the first elements.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) => {
                let shown: String = s.chars().take(80).collect();
                let more = if shown.len() < s.len() { "..." } else { "" };
                write!(f, "\"{}\"{more}", shown.escape_debug())
            }
            Value::Array(a) => {
                write!(f, "[{}; {}]", a.elem_type(), a.len())?;
                let shown: Vec<String> = (0..a.len().min(4))
                    .filter_map(|i| a.get(i))
                    .map(|v| v.to_string())
                    .collect();
                if !shown.is_empty() {
                    let more = if a.len() > 4 { ", ..." } else { "" };
                    write!(f, " [{}{more}]", shown.join(", "))?;
                }
                Ok(())
            }
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
        }
    }
}

/// The metadata of one GGUF file: key/value pairs in file order, keys unique.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    /// The pairs, in the order the file lists them.
    pub entries: Vec<(String, Value)>,
}

impl Metadata {
    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the file has no metadata.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A value somewhere in the metadata: a key's own value, or element `i` of
/// an array (arrays are packed, so an element is its array and an index).
#[derive(Debug, Clone, Copy)]
pub enum ValueRef<'a> {
    /// A key's value.
    Value(&'a Value),
    /// Element `.1` of an array (always in range).
    Elem(&'a Array, usize),
}

impl<'a> ValueRef<'a> {
    /// The value's type.
    pub fn value_type(self) -> ValueType {
        match self {
            ValueRef::Value(v) => v.value_type(),
            ValueRef::Elem(a, _) => a.elem_type(),
        }
    }

    /// The array, when the value is one.
    pub fn array(self) -> Option<&'a Array> {
        match self {
            ValueRef::Value(Value::Array(a)) => Some(a),
            ValueRef::Elem(Array::Array(v), i) => v.get(i),
            _ => None,
        }
    }

    /// The string, when the value is one.
    pub fn as_str(self) -> Option<&'a str> {
        match self {
            ValueRef::Value(Value::String(s)) => Some(s),
            ValueRef::Elem(Array::String(v), i) => v.get(i).map(String::as_str),
            _ => None,
        }
    }

    /// A number or bool, copied (None for strings and arrays).
    pub fn scalar(self) -> Option<Value> {
        match self {
            ValueRef::Value(Value::String(_) | Value::Array(_)) => None,
            ValueRef::Value(v) => Some(v.clone()),
            ValueRef::Elem(Array::String(_) | Array::Array(_), _) => None,
            ValueRef::Elem(a, i) => a.get(i),
        }
    }

    /// An integer of any integer type that fits in u64.
    pub fn as_u64(self) -> Option<u64> {
        self.scalar()?.as_int().and_then(|i| u64::try_from(i).ok())
    }

    /// An integer of any integer type that fits in i64.
    pub fn as_i64(self) -> Option<i64> {
        self.scalar()?.as_int().and_then(|i| i64::try_from(i).ok())
    }

    /// A float32 or float64, as f64.
    pub fn as_f64(self) -> Option<f64> {
        self.scalar()?.as_float()
    }

    /// A bool.
    pub fn as_bool(self) -> Option<bool> {
        match self.scalar()? {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
}

impl Metadata {
    /// The index of `key`.
    pub fn position(&self, key: &str) -> Option<usize> {
        self.entries.iter().position(|(k, _)| k == key)
    }

    /// The value of entry `index`, then of element `path[0]` of that array,
    /// and so on into nested arrays. Errors say which step is out of range.
    pub fn at(&self, index: usize, path: &[usize]) -> std::result::Result<ValueRef<'_>, String> {
        let (key, v) = self.entries.get(index).ok_or_else(|| {
            format!(
                "metadata index {index} is not below the count {}",
                self.entries.len()
            )
        })?;
        let mut r = ValueRef::Value(v);
        for (depth, &i) in path.iter().enumerate() {
            let a = r.array().ok_or_else(|| {
                format!(
                    "metadata key `{}`: the value at depth {depth} is a {}, not an array",
                    key.escape_debug(),
                    r.value_type()
                )
            })?;
            if i >= a.len() {
                return Err(format!(
                    "metadata key `{}`: index {i} at depth {depth} is not below the array length {}",
                    key.escape_debug(),
                    a.len()
                ));
            }
            r = ValueRef::Elem(a, i);
        }
        Ok(r)
    }
}
