//! The backup codec (src/codec): every input round-trips bit for bit, bf16
//! weights shrink to the promised size, data that does not compress costs
//! only headers, and a corrupt frame is refused, never decoded wrong.

use proptest::prelude::*;
use vmmweights::codec::format::{self, Layout, BLOCK_BYTES, BLOCK_HEADER_BYTES};
use vmmweights::codec::{self, checksum, Corrupt};

/// splitmix64 stream: deterministic pseudo-random words.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        checksum::mix(self.0, 0)
    }
    /// A standard normal sample (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let u2 = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// `count` bf16 values drawn from N(0, std^2), as initialised LLM weights.
pub fn normal_bf16(count: usize, std: f64, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    (0..count)
        .flat_map(|_| half::bf16::from_f64(r.normal() * std).to_le_bytes())
        .collect()
}

/// `count` fp16 values drawn from N(0, std^2).
pub fn normal_f16(count: usize, std: f64, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    (0..count)
        .flat_map(|_| half::f16::from_f64(r.normal() * std).to_le_bytes())
        .collect()
}

/// `count` fp32 values drawn from N(0, std^2).
pub fn normal_f32(count: usize, std: f64, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    (0..count)
        .flat_map(|_| ((r.normal() * std) as f32).to_le_bytes())
        .collect()
}

fn round_trip(raw: &[u8], layout: Layout) -> Vec<u8> {
    let enc = codec::encode(raw, layout);
    assert!(
        enc.len() <= format::max_frame_bytes(raw.len()),
        "{} bytes of {layout:?} encode to {}, over the bound",
        raw.len(),
        enc.len()
    );
    let mut out = vec![0xA5u8; raw.len()];
    codec::decode(&enc, &mut out)
        .unwrap_or_else(|e| panic!("{layout:?}, {} bytes: {e}", raw.len()));
    assert!(
        out == raw,
        "{layout:?}, {} bytes: decoded bytes differ",
        raw.len()
    );
    enc
}

fn ratio(raw: &[u8], layout: Layout) -> f64 {
    round_trip(raw, layout).len() as f64 / raw.len() as f64
}

const LAYOUTS: [Layout; 3] = [Layout::Bytes, Layout::Half, Layout::Single];

#[test]
fn bf16_weights_shrink_to_at_most_three_quarters() {
    // Initialised LLM weights (std 0.02) and wider ones (std 1, 0.002): the
    // exponent byte carries about 2.6 bits, the sign and mantissa stay raw.
    for (std, seed) in [(0.02, 1), (1.0, 2), (0.002, 3)] {
        let raw = normal_bf16(3 * BLOCK_BYTES / 2 + 17, std, seed);
        let r = ratio(&raw, Layout::Half);
        eprintln!("bf16 N(0, {std}^2): {:.4} of raw", r);
        assert!(r <= 0.75, "bf16 N(0, {std}^2) encodes to {r:.4} of raw");
    }
}

#[test]
fn other_float_widths_shrink() {
    let f16 = normal_f16(BLOCK_BYTES, 0.02, 4);
    let f32 = normal_f32(BLOCK_BYTES / 2, 0.02, 5);
    let (r16, r32) = (ratio(&f16, Layout::Half), ratio(&f32, Layout::Single));
    eprintln!("fp16 N(0, 0.02^2): {r16:.4}; fp32: {r32:.4}");
    assert!(r16 < 0.95, "fp16 encodes to {r16:.4} of raw");
    assert!(r32 < 0.87, "fp32 encodes to {r32:.4} of raw");
}

#[test]
fn incompressible_bytes_cost_only_headers() {
    let raw = Rng::new(6).bytes(5 * BLOCK_BYTES + 999);
    for layout in LAYOUTS {
        let enc = round_trip(&raw, layout);
        assert_eq!(enc.len(), format::max_frame_bytes(raw.len()), "{layout:?}");
        let r = enc.len() as f64 / raw.len() as f64;
        assert!(r < 1.001, "{layout:?}: random bytes cost {r:.5} of raw");
    }
}

#[test]
fn adversarial_blocks_round_trip() {
    let mut r = Rng::new(7);
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("zeros", vec![0; BLOCK_BYTES]),
        ("ones", vec![0xFF; BLOCK_BYTES + 3]),
        ("empty", vec![]),
        ("one byte", vec![0x7F]),
        ("three bytes", vec![1, 2, 3]),
        ("random", r.bytes(BLOCK_BYTES * 2 + 1)),
    ];
    // Every 16-bit pattern: all exponents, NaN and Inf, signed zeros,
    // subnormals, each once.
    cases.push((
        "every 16-bit value",
        (0..=0xFFFFu16).flat_map(|v| v.to_le_bytes()).collect(),
    ));
    // Every exponent distinct in one block, most elements escapes at small widths.
    cases.push((
        "256 exponents cycling",
        (0..BLOCK_BYTES / 2)
            .flat_map(|i| (((i % 256) as u16) << 7 | (i as u16 & 0x7F)).to_le_bytes())
            .collect(),
    ));
    // NaN and Inf patterns of every width, mixed with ordinary values.
    let specials16 = [
        0x7F80u16, 0xFF80, 0x7FC0, 0xFFFF, 0x7C00, 0xFC00, 0x7E00, 0x0001, 0x8001,
    ];
    cases.push((
        "bf16/fp16 specials among normals",
        (0..BLOCK_BYTES / 2 + 5)
            .flat_map(|i| {
                if i % 3 == 0 {
                    specials16[i % specials16.len()].to_le_bytes()
                } else {
                    half::bf16::from_f32((i as f32).sin() * 0.01).to_le_bytes()
                }
            })
            .collect(),
    ));
    let specials32 = [
        f32::NAN,
        f32::INFINITY,
        -f32::INFINITY,
        f32::MIN_POSITIVE / 4.0,
        -0.0,
    ];
    cases.push((
        "fp32 specials and subnormals",
        (0..BLOCK_BYTES / 4 + 9)
            .flat_map(|i| {
                if i % 2 == 0 {
                    specials32[i % specials32.len()].to_le_bytes()
                } else {
                    f32::from_bits(i as u32).to_le_bytes() // subnormals
                }
            })
            .collect(),
    ));
    // One value, then one escape in an otherwise single-valued block.
    let mut one_escape = vec![0u8; BLOCK_BYTES];
    one_escape[BLOCK_BYTES - 1] = 0x55;
    cases.push(("one escape at the end", one_escape));
    // Exactly the frequency ties that the table's order breaks by value.
    cases.push(("ties", (0..BLOCK_BYTES).map(|i| (i % 200) as u8).collect()));
    cases.push((
        "normal bf16 odd length",
        normal_bf16(40_001, 0.02, 8)[..80_001].to_vec(),
    ));
    for (what, raw) in &cases {
        for layout in LAYOUTS {
            let enc = codec::encode(raw, layout);
            let mut out = vec![0x5Au8; raw.len()];
            codec::decode(&enc, &mut out).unwrap_or_else(|e| panic!("{what}, {layout:?}: {e}"));
            assert!(out == *raw, "{what}, {layout:?}: decoded bytes differ");
        }
    }
}

#[test]
fn block_edges_round_trip() {
    let base = normal_bf16(3 * BLOCK_BYTES, 0.02, 9);
    for len in [
        1,
        2,
        7,
        8,
        9,
        BLOCK_BYTES - 1,
        BLOCK_BYTES,
        BLOCK_BYTES + 1,
        2 * BLOCK_BYTES - 3,
        2 * BLOCK_BYTES + 2,
        3 * BLOCK_BYTES,
    ] {
        for layout in LAYOUTS {
            round_trip(&base[..len], layout);
        }
    }
}

#[test]
fn the_checksum_is_the_range_hash() {
    let b = Rng::new(10).bytes(1000);
    for n in [0, 1, 7, 8, 9, 1000] {
        assert_eq!(
            checksum::block_checksum(&b[..n]),
            vmmweights::driver::hash::hash(&b[..n])
        );
    }
}

fn decode_err(frame: &[u8], raw_len: usize) -> Corrupt {
    let mut out = vec![0u8; raw_len];
    codec::decode(frame, &mut out).expect_err("a corrupt frame decoded")
}

#[test]
fn every_single_byte_change_is_refused() {
    // Coded and raw blocks, two blocks, a tail: flip bytes all over the
    // frame (every header and index byte, then a stride through the bodies);
    // each must be refused (none collides: 2^-64 per block).
    let mut raw = normal_bf16(BLOCK_BYTES / 2 + 3, 0.02, 11);
    raw.extend(Rng::new(12).bytes(4000));
    raw.push(9);
    let enc = codec::encode(&raw, Layout::Half);
    let second = u64::from_le_bytes(
        enc[format::FRAME_HEADER_BYTES + 8..format::FRAME_HEADER_BYTES + 16]
            .try_into()
            .unwrap(),
    ) as usize;
    let mut at: Vec<usize> = (0..format::data_start(2) + 200).collect();
    at.extend(second - 8..second + 200);
    at.extend((0..enc.len()).step_by(641));
    at.push(enc.len() - 1);
    let mut bad = enc.clone();
    for i in at {
        for flip in [0x01u8, 0x80] {
            bad[i] ^= flip;
            let mut out = vec![0u8; raw.len()];
            match codec::decode(&bad, &mut out) {
                Err(_) => {}
                Ok(()) => assert!(
                    out == raw,
                    "byte {i} ^ {flip:#x} decoded to different bytes"
                ),
            }
            bad[i] ^= flip;
        }
    }
}

#[test]
fn header_and_index_faults_name_what_is_wrong() {
    let raw = normal_bf16(2 * BLOCK_BYTES, 0.02, 13);
    let enc = codec::encode(&raw, Layout::Half);
    let e = decode_err(&enc, raw.len() - 1);
    assert!(e.reason.contains("raw bytes"), "{e}");
    let e = decode_err(&enc[..enc.len() - 1], raw.len());
    assert!(e.reason.contains("frame is"), "{e}");
    let mut b = enc.clone();
    b[format::FRAME_HEADER_BYTES + 8..format::FRAME_HEADER_BYTES + 16]
        .copy_from_slice(&u64::MAX.to_le_bytes());
    let e = decode_err(&b, raw.len());
    assert!(e.reason.contains("index entry 1"), "{e}");
    assert_eq!(e.block, None);
    let mut b = enc.clone();
    let second = u64::from_le_bytes(
        enc[format::FRAME_HEADER_BYTES + 8..format::FRAME_HEADER_BYTES + 16]
            .try_into()
            .unwrap(),
    ) as usize;
    b[second + 9] = 0; // width 0 in a coded block
    let e = decode_err(&b, raw.len());
    assert_eq!(e.block, Some(1), "{e}");
    assert!(decode_err(&[], 0).reason.contains("header"));
}

#[test]
fn raw_blocks_are_header_plus_bytes() {
    let raw = Rng::new(14).bytes(BLOCK_BYTES);
    let enc = codec::encode(&raw, Layout::Half);
    let start = format::data_start(1);
    assert_eq!(enc[start + 8], format::MODE_RAW);
    assert_eq!(&enc[start + BLOCK_HEADER_BYTES..], &raw[..]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_bytes_round_trip(raw in proptest::collection::vec(any::<u8>(), 0..200_000), w in 0usize..3) {
        round_trip(&raw, LAYOUTS[w]);
    }

    #[test]
    fn few_valued_elements_round_trip(
        vals in proptest::collection::vec(any::<u16>(), 1..40),
        picks in proptest::collection::vec(any::<u16>(), 0..70_000),
        w in 0usize..3,
    ) {
        let raw: Vec<u8> = picks.iter().flat_map(|&p| vals[p as usize % vals.len()].to_le_bytes()).collect();
        round_trip(&raw, LAYOUTS[w]);
    }

    #[test]
    fn corrupt_frames_never_decode_wrong(
        raw in proptest::collection::vec(0u8..4, 1..150_000),
        hits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
    ) {
        let mut enc = codec::encode(&raw, Layout::Half);
        for (at, v) in hits {
            let i = at % enc.len();
            enc[i] = v;
        }
        let mut out = vec![0u8; raw.len()];
        if codec::decode(&enc, &mut out).is_ok() {
            prop_assert!(out == raw);
        }
    }
}

/// The CUDA kernels run on the CPU (kernels/emu, built by
/// scripts/check-kernels.sh, which sets `VMMW_CODEC_EMU` to the binary):
/// the same frames as the reference, byte for byte, and the same verdict on
/// corrupt ones. The GPU itself is checked by the driver contract on cuda.
#[test]
fn kernels_emulated_on_the_cpu_match_the_reference() {
    let Some(emu) = std::env::var_os("VMMW_CODEC_EMU") else {
        eprintln!("SKIP: VMMW_CODEC_EMU is unset (scripts/check-kernels.sh builds and sets it)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = |n: &str| dir.path().join(n);
    let run = |args: &[&std::ffi::OsStr]| {
        let o = std::process::Command::new(&emu)
            .args(args)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{:?}: {}",
            args,
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    };
    let mut r = Rng::new(15);
    let mut inputs: Vec<(&str, Vec<u8>, Layout)> = vec![
        (
            "bf16 normal",
            normal_bf16(BLOCK_BYTES + 1001, 0.02, 16),
            Layout::Half,
        ),
        (
            "fp16 normal",
            normal_f16(BLOCK_BYTES / 2 + 7, 0.02, 17),
            Layout::Half,
        ),
        (
            "fp32 normal",
            normal_f32(BLOCK_BYTES / 4 + 3, 0.02, 18),
            Layout::Single,
        ),
        ("random", r.bytes(BLOCK_BYTES + 5), Layout::Bytes),
        (
            "few values",
            (0..BLOCK_BYTES * 2 + 3)
                .map(|i| (i % 5) as u8 * 3)
                .collect(),
            Layout::Bytes,
        ),
        ("zeros", vec![0; 1000], Layout::Half),
        ("empty", vec![], Layout::Single),
        ("one byte", vec![7], Layout::Half),
        (
            "every 16-bit value",
            (0..=0xFFFFu16).flat_map(|v| v.to_le_bytes()).collect(),
            Layout::Half,
        ),
    ];
    inputs.push((
        "bf16 with escapes at every width",
        (0..BLOCK_BYTES / 2)
            .flat_map(|i| {
                let e = if i % 97 == 0 {
                    (i / 97) as u16 % 256
                } else {
                    120 + (i % 9) as u16
                };
                ((e << 7) | (i as u16 & 0x807F)).to_le_bytes()
            })
            .collect(),
        Layout::Half,
    ));
    for (what, raw, layout) in &inputs {
        std::fs::write(path("raw"), raw).unwrap();
        let w = (layout.width() as u8).to_string();
        run(&[
            "encode".as_ref(),
            w.as_ref(),
            path("raw").as_os_str(),
            path("frame").as_os_str(),
        ]);
        let got = std::fs::read(path("frame")).unwrap();
        let want = codec::encode(raw, *layout);
        assert!(
            got == want,
            "{what}: the kernel's frame ({} bytes) differs from the reference's ({} bytes){}",
            got.len(),
            want.len(),
            got.iter()
                .zip(&want)
                .position(|(a, b)| a != b)
                .map(|i| format!(", first at byte {i}"))
                .unwrap_or_default()
        );
        let len = raw.len().to_string();
        let status = run(&[
            "decode".as_ref(),
            path("frame").as_os_str(),
            len.as_ref(),
            path("out").as_os_str(),
        ]);
        assert_eq!(
            status.trim(),
            u32::MAX.to_string(),
            "{what}: decode refused"
        );
        assert!(
            std::fs::read(path("out")).unwrap() == *raw,
            "{what}: decoded bytes differ"
        );
        // Corrupt bytes across the frame: the kernel refuses exactly what
        // the reference refuses.
        let step = (want.len() / 37).max(1);
        for i in (0..want.len()).step_by(step) {
            let mut bad = want.clone();
            bad[i] ^= 0x21;
            std::fs::write(path("bad"), &bad).unwrap();
            let status = run(&[
                "decode".as_ref(),
                path("bad").as_os_str(),
                len.as_ref(),
                path("out").as_os_str(),
            ]);
            let mut out = vec![0u8; raw.len()];
            let reference = codec::decode(&bad, &mut out);
            assert_eq!(
                status.trim() == u32::MAX.to_string(),
                reference.is_ok(),
                "{what}: byte {i} flipped: kernel status {}, reference {reference:?}",
                status.trim()
            );
        }
    }
}
