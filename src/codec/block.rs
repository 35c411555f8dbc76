//! One block, encoded and decoded: the reference the CUDA kernels
//! (`kernels/codec.cu`) reproduce byte for byte. The layout is in
//! [`super::format`].

use super::checksum::block_checksum;
use super::format::{
    coded_block_bytes, table_len, Layout, BLOCK_HEADER_BYTES, MAX_WIDTH, MODE_CODED, MODE_RAW,
};

/// Element `i` of `raw` as a little-endian value.
#[inline]
fn element(raw: &[u8], w: usize, i: usize) -> u32 {
    let mut v = 0u32;
    for (j, &b) in raw[i * w..i * w + w].iter().enumerate() {
        v |= (b as u32) << (8 * j);
    }
    v
}

/// The block's field values ranked: most frequent first, ties by smaller
/// value; with the count of each.
fn ranked(counts: &[u32; 256]) -> [u8; 256] {
    let mut order: [u8; 256] = std::array::from_fn(|v| v as u8);
    order.sort_by_key(|&v| (std::cmp::Reverse(counts[v as usize]), v));
    order
}

/// Append the encoding of one block of raw bytes (at most
/// [`super::format::BLOCK_BYTES`]) to `out`.
pub fn encode_block(raw: &[u8], layout: Layout, out: &mut Vec<u8>) {
    let w = layout.width();
    let n = raw.len() / w;
    let tail = &raw[n * w..];
    let sum = block_checksum(raw);
    let mut counts = [0u32; 256];
    for i in 0..n {
        counts[layout.split(element(raw, w, i)).0 as usize] += 1;
    }
    let order = ranked(&counts);
    // The narrowest code width of the smallest size; raw unless it shrinks.
    let mut best: Option<(usize, u8, usize)> = None;
    let mut covered = 0usize;
    let mut taken = 0usize;
    for k in 1..=MAX_WIDTH {
        while taken < table_len(k) {
            covered += counts[order[taken] as usize] as usize;
            taken += 1;
        }
        let size = coded_block_bytes(layout, n, k, n - covered, tail.len());
        if best.is_none_or(|(s, _, _)| size < s) {
            best = Some((size, k, n - covered));
        }
    }
    let (size, k, escapes) = best.expect("seven widths tried");
    if size >= BLOCK_HEADER_BYTES + raw.len() {
        out.extend_from_slice(&sum.to_le_bytes());
        out.extend_from_slice(&[MODE_RAW, 0, 0, 0, 0, 0, 0, 0]);
        out.extend_from_slice(raw);
        return;
    }
    let start = out.len();
    out.extend_from_slice(&sum.to_le_bytes());
    out.extend_from_slice(&[MODE_CODED, k, 0, 0]);
    out.extend_from_slice(&(escapes as u32).to_le_bytes());
    let table = &order[..table_len(k)];
    out.extend_from_slice(table);
    let escape = table_len(k) as u32;
    let mut code_of = [escape; 256];
    for (c, &v) in table.iter().enumerate() {
        code_of[v as usize] = c as u32;
    }
    let mut bits = 0u64;
    let mut nbits = 0u32;
    let mut escaped = Vec::with_capacity(escapes);
    for i in 0..n {
        let f = layout.split(element(raw, w, i)).0;
        let c = code_of[f as usize];
        if c == escape {
            escaped.push(f);
        }
        bits |= (c as u64) << nbits;
        nbits += k as u32;
        while nbits >= 8 {
            out.push(bits as u8);
            bits >>= 8;
            nbits -= 8;
        }
    }
    if nbits > 0 {
        out.push(bits as u8);
    }
    out.extend_from_slice(&escaped);
    for i in 0..n {
        let r = layout.split(element(raw, w, i)).1;
        out.extend_from_slice(&r.to_le_bytes()[..w - 1]);
    }
    out.extend_from_slice(tail);
    debug_assert_eq!(out.len() - start, size);
}

/// Decode one encoded block into `out` (its raw length). An error says what
/// is wrong; `out` may then hold anything.
pub fn decode_block(enc: &[u8], layout: Layout, out: &mut [u8]) -> Result<(), String> {
    if enc.len() < BLOCK_HEADER_BYTES {
        return Err(format!(
            "{} bytes, shorter than a block header ({BLOCK_HEADER_BYTES})",
            enc.len()
        ));
    }
    let sum = u64::from_le_bytes(enc[0..8].try_into().expect("8 bytes"));
    let (mode, k) = (enc[8], enc[9]);
    let escapes = u32::from_le_bytes(enc[12..16].try_into().expect("4 bytes")) as usize;
    if enc[10..12] != [0, 0] {
        return Err("reserved block header bytes are not zero".into());
    }
    let body = &enc[BLOCK_HEADER_BYTES..];
    match mode {
        MODE_RAW => {
            if k != 0 || escapes != 0 {
                return Err(format!("raw block with width {k} and {escapes} escapes"));
            }
            if body.len() != out.len() {
                return Err(format!(
                    "raw block holds {} bytes, expected {}",
                    body.len(),
                    out.len()
                ));
            }
            out.copy_from_slice(body);
        }
        MODE_CODED => decode_coded(body, layout, k, escapes, out)?,
        m => return Err(format!("mode {m} is neither raw (0) nor coded (1)")),
    }
    let got = block_checksum(out);
    if got != sum {
        return Err(format!(
            "checksum {got:016x} of the decoded bytes is not the stored {sum:016x}"
        ));
    }
    Ok(())
}

fn decode_coded(
    body: &[u8],
    layout: Layout,
    k: u8,
    escapes: usize,
    out: &mut [u8],
) -> Result<(), String> {
    let w = layout.width();
    let n = out.len() / w;
    let tail = out.len() - n * w;
    if !(1..=MAX_WIDTH).contains(&k) {
        return Err(format!("code width {k} is not in 1..={MAX_WIDTH}"));
    }
    if escapes > n {
        return Err(format!("{escapes} escapes for {n} elements"));
    }
    let want = coded_block_bytes(layout, n, k, escapes, tail) - BLOCK_HEADER_BYTES;
    if body.len() != want {
        return Err(format!(
            "coded block body holds {} bytes, its header says {want}",
            body.len()
        ));
    }
    let (table, rest) = body.split_at(table_len(k));
    let (codes, rest) = rest.split_at((n * k as usize).div_ceil(8));
    let (escaped, rest) = rest.split_at(escapes);
    let (raw_bits, tail_bytes) = rest.split_at(n * (w - 1));
    let escape = table_len(k);
    let mask = (1u32 << k) - 1;
    let mut e = 0usize;
    for i in 0..n {
        let bit = i * k as usize;
        let lo = codes[bit / 8] as u32;
        let hi = codes.get(bit / 8 + 1).copied().unwrap_or(0) as u32;
        let c = (((hi << 8) | lo) >> (bit % 8)) & mask;
        let f = if c as usize == escape {
            let f = *escaped
                .get(e)
                .ok_or_else(|| format!("more escape codes than the {escapes} escapes"))?;
            e += 1;
            f
        } else {
            table[c as usize]
        };
        let mut r = 0u32;
        for (j, &b) in raw_bits[i * (w - 1)..(i + 1) * (w - 1)].iter().enumerate() {
            r |= (b as u32) << (8 * j);
        }
        let v = layout.join(f, r);
        out[i * w..(i + 1) * w].copy_from_slice(&v.to_le_bytes()[..w]);
    }
    if e != escapes {
        return Err(format!("{e} escape codes for {escapes} escapes"));
    }
    out[n * w..].copy_from_slice(tail_bytes);
    Ok(())
}
