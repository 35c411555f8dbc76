//! GGUF files written byte by byte, so tests can state every field, including
//! the wrong ones (hostile headers), without any GGUF library.

/// One metadata value, encoded with its type number.
#[derive(Clone)]
pub enum V {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    /// Element type number and encoded elements.
    Arr(u32, Vec<V>),
    U64(u64),
    I64(i64),
    F64(f64),
    /// Any type number and raw bytes (for hostile values).
    Raw(u32, Vec<u8>),
}

impl V {
    pub fn type_id(&self) -> u32 {
        match self {
            V::U8(_) => 0,
            V::I8(_) => 1,
            V::U16(_) => 2,
            V::I16(_) => 3,
            V::U32(_) => 4,
            V::I32(_) => 5,
            V::F32(_) => 6,
            V::Bool(_) => 7,
            V::Str(_) => 8,
            V::Arr(..) => 9,
            V::U64(_) => 10,
            V::I64(_) => 11,
            V::F64(_) => 12,
            V::Raw(t, _) => *t,
        }
    }

    /// The value's bytes, without its type.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            V::U8(v) => out.push(*v),
            V::I8(v) => out.push(*v as u8),
            V::U16(v) => out.extend(v.to_le_bytes()),
            V::I16(v) => out.extend(v.to_le_bytes()),
            V::U32(v) => out.extend(v.to_le_bytes()),
            V::I32(v) => out.extend(v.to_le_bytes()),
            V::F32(v) => out.extend(v.to_le_bytes()),
            V::Bool(v) => out.push(*v as u8),
            V::Str(s) => string(out, s),
            V::Arr(t, items) => {
                out.extend(t.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for i in items {
                    i.encode(out);
                }
            }
            V::U64(v) => out.extend(v.to_le_bytes()),
            V::I64(v) => out.extend(v.to_le_bytes()),
            V::F64(v) => out.extend(v.to_le_bytes()),
            V::Raw(_, b) => out.extend(b),
        }
    }
}

pub fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// One tensor info: name, ggml dims (`ne[0]` first), type number, offset
/// relative to the data section.
#[derive(Clone)]
pub struct T {
    pub name: String,
    pub ne: Vec<u64>,
    pub ty: u32,
    pub offset: u64,
}

/// A whole file: everything a GGUF header states, then the data section.
#[derive(Clone)]
pub struct File {
    pub version: u32,
    /// Tensor count as written (None: the number of `tensors`).
    pub n_tensors: Option<u64>,
    /// Key count as written (None: the number of `kv`).
    pub n_kv: Option<u64>,
    pub kv: Vec<(String, V)>,
    pub tensors: Vec<T>,
    /// Padding target after the tensor infos.
    pub alignment: u64,
    pub data: Vec<u8>,
}

impl File {
    /// Tensors `(name, ne, type number, bytes)` laid out at aligned offsets.
    pub fn new(kv: Vec<(String, V)>, tensors: &[(&str, &[u64], u32, Vec<u8>)]) -> File {
        let alignment = kv
            .iter()
            .find_map(|(k, v)| match (k.as_str(), v) {
                ("general.alignment", V::U32(a)) => Some(*a as u64),
                _ => None,
            })
            .unwrap_or(32);
        let mut data = Vec::new();
        let mut infos = Vec::new();
        for (name, ne, ty, bytes) in tensors {
            while !(data.len() as u64).is_multiple_of(alignment) {
                data.push(0);
            }
            infos.push(T {
                name: name.to_string(),
                ne: ne.to_vec(),
                ty: *ty,
                offset: data.len() as u64,
            });
            data.extend(bytes);
        }
        File {
            version: 3,
            n_tensors: None,
            n_kv: None,
            kv,
            tensors: infos,
            alignment,
            data,
        }
    }

    /// The header's bytes, padded to the alignment.
    pub fn header(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(self.version.to_le_bytes());
        b.extend(
            self.n_tensors
                .unwrap_or(self.tensors.len() as u64)
                .to_le_bytes(),
        );
        b.extend(self.n_kv.unwrap_or(self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            string(&mut b, k);
            b.extend(v.type_id().to_le_bytes());
            v.encode(&mut b);
        }
        for t in &self.tensors {
            string(&mut b, &t.name);
            b.extend((t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                b.extend(d.to_le_bytes());
            }
            b.extend(t.ty.to_le_bytes());
            b.extend(t.offset.to_le_bytes());
        }
        while !(b.len() as u64).is_multiple_of(self.alignment) {
            b.push(0);
        }
        b
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut b = self.header();
        b.extend(&self.data);
        b
    }

    /// Where the data section starts in the file.
    pub fn data_start(&self) -> usize {
        self.header().len()
    }

    pub fn write(&self, path: &std::path::Path) {
        std::fs::write(path, self.bytes()).unwrap();
    }
}

/// Deterministic bytes.
pub fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(seed as u32) as u8
                >> 1
        })
        .collect()
}

/// Metadata with a value of every type, nested arrays included.
pub fn every_type() -> Vec<(String, V)> {
    vec![
        ("general.architecture".into(), V::Str("llama".into())),
        ("t.u8".into(), V::U8(200)),
        ("t.i8".into(), V::I8(-100)),
        ("t.u16".into(), V::U16(60000)),
        ("t.i16".into(), V::I16(-30000)),
        ("t.u32".into(), V::U32(4_000_000_000)),
        ("t.i32".into(), V::I32(-2_000_000_000)),
        ("t.f32".into(), V::F32(1.5)),
        ("t.bool".into(), V::Bool(true)),
        ("t.u64".into(), V::U64(u64::MAX)),
        ("t.i64".into(), V::I64(i64::MIN)),
        ("t.f64".into(), V::F64(-2.25)),
        (
            "t.strings".into(),
            V::Arr(8, vec![V::Str("a".into()), V::Str("ünï".into())]),
        ),
        (
            "t.nested".into(),
            V::Arr(
                9,
                vec![
                    V::Arr(4, vec![V::U32(1), V::U32(2)]),
                    V::Arr(8, vec![V::Str("x".into())]),
                ],
            ),
        ),
        ("t.empty".into(), V::Arr(6, vec![])),
    ]
}
