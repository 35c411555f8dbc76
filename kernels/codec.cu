// The backup codec on the device: encode a raw range into one frame, decode
// a frame back. The format and the reference are src/codec (format.rs holds
// the byte layout); these kernels must produce exactly the reference's bytes
// and accept exactly the frames it accepts.
//
// One thread block per 64 KiB raw block; 256 threads (launch with exactly
// that many). Elements go in groups of 8 (a group's codes fill k whole bytes),
// group g to thread g % 256 in rounds, so neighbouring threads touch
// neighbouring bytes; escapes keep element order through a block-wide scan
// per round.
//
// Encoding a frame takes three launches: vmmw_codec_encode writes each block
// into a fixed slot of scratch and its size; vmmw_codec_index (one thread
// block) writes the header and the index from the sizes; vmmw_codec_pack
// moves each block to its offset. Decoding is one launch; a corrupt block
// lowers *status to its index (the caller sets it to 0xFFFFFFFF first).
//
// Built into PTX with nvcc on the GPU machine and committed
// (src/driver/cuda/codec.ptx; scripts/build-ptx.sh):
//   nvcc -ptx -arch=compute_75 -O3 -o src/driver/cuda/codec.ptx kernels/codec.cu

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned char u8;

#define BLOCK_BYTES 65536u
#define BLOCK_HEADER 16u
#define FRAME_HEADER 32u
#define SLOT_BYTES (BLOCK_HEADER + BLOCK_BYTES)
#define THREADS 256u
#define WARPS (THREADS / 32u)
#define MAX_WIDTH 7u
#define MODE_RAW 0u
#define MODE_CODED 1u

// splitmix64's finaliser over a word and its index (src/codec/checksum.rs).
__device__ __forceinline__ u64 mix(u64 w, u64 k) {
    u64 z = w ^ (k * 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// `n` (0..=8) bytes at any alignment as one little-endian word.
__device__ __forceinline__ u64 load_le(const u8* p, u32 n) {
    u64 w = 0;
    for (u32 b = 0; b < n; ++b) {
        w |= (u64)p[b] << (8 * b);
    }
    return w;
}

__device__ __forceinline__ void store_le(u8* p, u64 v, u32 n) {
    for (u32 b = 0; b < n; ++b) {
        p[b] = (u8)(v >> (8 * b));
    }
}

// Copy `n` bytes with the block's threads: 8 bytes at a time when both ends
// are 8-aligned (raw blocks usually are), else byte by byte.
__device__ __forceinline__ void copy_bytes(u8* dst, const u8* src, u32 n) {
    if ((((u64)dst | (u64)src) & 7) == 0) {
        const u32 words = n >> 3;
        for (u32 i = threadIdx.x; i < words; i += THREADS) {
            ((u64*)dst)[i] = ((const u64*)src)[i];
        }
        for (u32 i = 8 * words + threadIdx.x; i < n; i += THREADS) {
            dst[i] = src[i];
        }
    } else {
        for (u32 i = threadIdx.x; i < n; i += THREADS) {
            dst[i] = src[i];
        }
    }
}

// Group g's raw bytes (8 elements, `width` 8-byte words when whole) as
// little-endian words; `cnt` elements are valid. Whole groups at 8-aligned
// addresses load word by word.
__device__ __forceinline__ void load_group(const u8* p, u32 width, u32 cnt, u64* w) {
    if (cnt == 8 && ((u64)p & 7) == 0) {
        for (u32 k = 0; k < width; ++k) {
            w[k] = ((const u64*)p)[k];
        }
    } else {
        for (u32 k = 0; k < width; ++k) {
            const u32 have = cnt * width > 8 * k ? cnt * width - 8 * k : 0;
            w[k] = load_le(p + 8 * k, have < 8 ? have : 8);
        }
    }
}

__device__ __forceinline__ void store_group(u8* p, u32 width, u32 cnt, const u64* w) {
    if (cnt == 8 && ((u64)p & 7) == 0) {
        for (u32 k = 0; k < width; ++k) {
            ((u64*)p)[k] = w[k];
        }
    } else {
        for (u32 k = 0; k < width; ++k) {
            const u32 have = cnt * width > 8 * k ? cnt * width - 8 * k : 0;
            store_le(p + 8 * k, w[k], have < 8 ? have : 8);
        }
    }
}

// Element j of a group loaded by load_group.
__device__ __forceinline__ u32 group_elem(const u64* w, u32 width, u32 j) {
    const u32 bit = 8 * j * width;
    const u64 v = w[bit >> 6] >> (bit & 63);
    return width == 4 ? (u32)v : (u32)v & ((1u << (8 * width)) - 1u);
}

// Where the coded field sits in an element `width` bytes wide (Layout::split).
__device__ __forceinline__ u32 field_shift(u32 width) {
    return width == 1 ? 0u : (width == 2 ? 7u : 23u);
}

__device__ __forceinline__ u32 field_of(u32 v, u32 s) {
    return (v >> s) & 0xFFu;
}

__device__ __forceinline__ u32 rest_of(u32 v, u32 s, u32 width) {
    if (width == 1) {
        return 0;
    }
    return ((v >> (s + 8)) << s) | (v & ((1u << s) - 1u));
}

__device__ __forceinline__ u32 join(u32 f, u32 r, u32 s, u32 width) {
    if (width == 1) {
        return f;
    }
    return ((r >> s) << (s + 8)) | (f << s) | (r & ((1u << s) - 1u));
}

// The checksum sum term of thread threadIdx.x over the block's raw bytes,
// reduced over the thread block; the total is valid in thread 0.
__device__ u64 block_sum(u64 v, u64* warp_tot) {
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, o);
    }
    if ((threadIdx.x & 31u) == 0) {
        warp_tot[threadIdx.x >> 5] = v;
    }
    __syncthreads();
    u64 t = 0;
    if (threadIdx.x == 0) {
        for (u32 w = 0; w < WARPS; ++w) {
            t += warp_tot[w];
        }
    }
    __syncthreads();
    return t;
}

// The range-hash checksum of `len` bytes at `p` (valid in thread 0).
__device__ u64 checksum(const u8* p, u32 len, u64* warp_tot) {
    const u32 words = (len + 7u) >> 3;
    u64 s = 0;
    const bool aligned = ((u64)p & 7) == 0;
    for (u32 i = threadIdx.x; i < words; i += THREADS) {
        const u32 n = (8u * i + 8u <= len) ? 8u : len - 8u * i;
        s += mix(n == 8 && aligned ? ((const u64*)p)[i] : load_le(p + 8u * i, n), i);
    }
    s = block_sum(s, warp_tot);
    return mix(s, ~(u64)len);
}

// Exclusive prefix of `v` over the threads of the block, in thread order;
// `*total` (shared) receives the sum. Every thread must call it.
__device__ u32 block_scan(u32 v, u32* warp_tot, u32* total) {
    const u32 lane = threadIdx.x & 31u;
    const u32 warp = threadIdx.x >> 5;
    u32 x = v;
    for (u32 o = 1; o < 32; o <<= 1) {
        const u32 y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) {
            x += y;
        }
    }
    if (lane == 31) {
        warp_tot[warp] = x;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 acc = 0;
        for (u32 w = 0; w < WARPS; ++w) {
            const u32 t = warp_tot[w];
            warp_tot[w] = acc;
            acc += t;
        }
        *total = acc;
    }
    __syncthreads();
    const u32 r = warp_tot[warp] + x - v;
    __syncthreads();
    return r;
}

// Bytes of a coded block (format::coded_block_bytes).
__device__ __forceinline__ u64 coded_bytes(u32 n, u32 k, u32 esc, u32 width, u32 tail) {
    return (u64)BLOCK_HEADER + ((1u << k) - 1u) + (((u64)n * k + 7u) >> 3) + esc +
           (u64)n * (width - 1u) + tail;
}

// Encode each raw block b of [raw, raw+raw_len) into slots + b*SLOT_BYTES;
// sizes[b] receives its encoded length.
extern "C" __global__ void vmmw_codec_encode(const u8* __restrict__ raw, u64 raw_len, u32 width,
                                             u8* __restrict__ slots, u32* __restrict__ sizes) {
    __shared__ u32 counts[256];
    __shared__ u32 rank_of[256];
    __shared__ u8 table[128];
    __shared__ u64 warp_sums[WARPS];
    __shared__ u32 warp_tot[WARPS];
    __shared__ u32 round_total;
    __shared__ u32 s_k;
    __shared__ u32 s_esc;
    __shared__ u32 s_size;
    __shared__ u32 s_raw;
    const u64 nb = (raw_len + BLOCK_BYTES - 1) / BLOCK_BYTES;
    const u32 sh = field_shift(width);
    for (u64 b = blockIdx.x; b < nb; b += gridDim.x) {
        const u8* src = raw + b * BLOCK_BYTES;
        const u64 left = raw_len - b * BLOCK_BYTES;
        const u32 blen = left < BLOCK_BYTES ? (u32)left : BLOCK_BYTES;
        const u32 n = blen / width;
        const u32 tail = blen - n * width;
        u8* slot = slots + b * SLOT_BYTES;
        const u64 sum = checksum(src, blen, warp_sums);

        counts[threadIdx.x] = 0;
        __syncthreads();
        // Lanes holding one value add once, with their count: weights have
        // few exponents, and shared atomics on one address serialize.
        for (u32 base = 0; base < n; base += THREADS) {
            const u32 i = base + threadIdx.x;
            const u32 f = i < n ? field_of((u32)load_le(src + i * width, width), sh) : 256u;
            const u32 peers = __match_any_sync(0xffffffffu, f);
            if (f < 256u && (threadIdx.x & 31u) == (u32)(__ffs(peers) - 1)) {
                atomicAdd(&counts[f], (u32)__popc(peers));
            }
        }
        __syncthreads();
        // Rank: most frequent first, ties by smaller value.
        {
            const u32 v = threadIdx.x;
            const u32 c = counts[v];
            u32 r = 0;
            for (u32 u = 0; u < 256; ++u) {
                const u32 cu = counts[u];
                r += (cu > c || (cu == c && u < v)) ? 1u : 0u;
            }
            rank_of[v] = r;
            if (r < 127) {
                table[r] = (u8)v;
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            u32 covered = 0, taken = 0, best_size = 0, best_k = 0, best_esc = 0;
            for (u32 k = 1; k <= MAX_WIDTH; ++k) {
                while (taken < (1u << k) - 1u) {
                    covered += counts[table[taken]];
                    ++taken;
                }
                const u32 size = (u32)coded_bytes(n, k, n - covered, width, tail);
                if (best_k == 0 || size < best_size) {
                    best_size = size;
                    best_k = k;
                    best_esc = n - covered;
                }
            }
            s_raw = best_size >= BLOCK_HEADER + blen ? 1u : 0u;
            s_k = best_k;
            s_esc = best_esc;
            s_size = s_raw ? BLOCK_HEADER + blen : best_size;
            store_le(slot, sum, 8);
            slot[8] = (u8)(s_raw ? MODE_RAW : MODE_CODED);
            slot[9] = (u8)(s_raw ? 0u : best_k);
            slot[10] = 0;
            slot[11] = 0;
            store_le(slot + 12, s_raw ? 0u : best_esc, 4);
            sizes[b] = s_size;
        }
        __syncthreads();
        if (s_raw) {
            copy_bytes(slot + BLOCK_HEADER, src, blen);
        } else {
            const u32 k = s_k;
            const u32 m = (1u << k) - 1u;
            u8* tbl = slot + BLOCK_HEADER;
            u8* codes = tbl + m;
            const u32 code_len = (u32)(((u64)n * k + 7u) >> 3);
            u8* escs = codes + code_len;
            u8* rest = escs + s_esc;
            if (threadIdx.x < m) {
                tbl[threadIdx.x] = table[threadIdx.x];
            }
            const u32 groups = (n + 7u) / 8u;
            u32 esc_base = 0;
            for (u32 g0 = 0; g0 < groups; g0 += THREADS) {
                const u32 g = g0 + threadIdx.x;
                u64 bits = 0;
                u32 mine = 0;
                u32 fields[8];
                u32 cnt = 0;
                if (g < groups) {
                    cnt = n - 8u * g < 8u ? n - 8u * g : 8u;
                    u64 w[4];
                    load_group(src + 8u * g * width, width, cnt, w);
                    for (u32 j = 0; j < cnt; ++j) {
                        const u32 i = 8u * g + j;
                        const u32 v = group_elem(w, width, j);
                        const u32 f = field_of(v, sh);
                        const u32 r = rank_of[f];
                        const u32 c = r < m ? r : m;
                        fields[j] = c == m ? f : 256u;
                        mine += c == m ? 1u : 0u;
                        bits |= (u64)c << (j * k);
                        store_le(rest + (u64)i * (width - 1u), rest_of(v, sh, width), width - 1u);
                    }
                }
                const u32 at = esc_base + block_scan(mine, warp_tot, &round_total);
                if (g < groups) {
                    u32 e = at;
                    for (u32 j = 0; j < cnt; ++j) {
                        if (fields[j] != 256u) {
                            escs[e++] = (u8)fields[j];
                        }
                    }
                    const u32 first = g * k;
                    const u32 nbytes = (first + k <= code_len) ? k : code_len - first;
                    store_le(codes + first, bits, nbytes);
                }
                esc_base += round_total;
                __syncthreads();
            }
            if (threadIdx.x < tail) {
                rest[(u64)n * (width - 1u) + threadIdx.x] = src[n * width + threadIdx.x];
            }
        }
        __syncthreads();
    }
}

// Write the frame header and index from the block sizes; *frame_len receives
// the frame's length. One thread block.
extern "C" __global__ void vmmw_codec_index(const u32* __restrict__ sizes, u64 raw_len, u32 width,
                                            u8* __restrict__ frame, u64* __restrict__ frame_len) {
    __shared__ u32 warp_tot[WARPS];
    __shared__ u32 round_total;
    const u64 nb = (raw_len + BLOCK_BYTES - 1) / BLOCK_BYTES;
    u64 at = FRAME_HEADER + 8u * nb;
    for (u64 b0 = 0; b0 < nb; b0 += THREADS) {
        const u64 b = b0 + threadIdx.x;
        const u32 size = b < nb ? sizes[b] : 0u;
        // A round's sizes sum to at most 256 slots, well inside u32.
        const u32 before = block_scan(size, warp_tot, &round_total);
        if (b < nb) {
            store_le(frame + FRAME_HEADER + 8u * b, at + before, 8);
        }
        at += round_total;
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const u8 magic[4] = {'V', 'M', 'W', 'C'};
        for (u32 i = 0; i < 4; ++i) {
            frame[i] = magic[i];
        }
        frame[4] = 1;
        frame[5] = (u8)width;
        frame[6] = 0;
        frame[7] = 0;
        store_le(frame + 8, BLOCK_BYTES, 4);
        store_le(frame + 12, 0, 4);
        store_le(frame + 16, raw_len, 8);
        store_le(frame + 24, at, 8);
        *frame_len = at;
    }
}

// Move each encoded block from its slot to its offset in the frame.
extern "C" __global__ void vmmw_codec_pack(const u8* __restrict__ slots,
                                           const u32* __restrict__ sizes, u64 raw_len,
                                           u8* __restrict__ frame) {
    const u64 nb = (raw_len + BLOCK_BYTES - 1) / BLOCK_BYTES;
    for (u64 b = blockIdx.x; b < nb; b += gridDim.x) {
        const u64 at = load_le(frame + FRAME_HEADER + 8u * b, 8);
        const u8* slot = slots + b * SLOT_BYTES;
        u8* dst = frame + at;
        copy_bytes(dst, slot, sizes[b]);
    }
}

// Decode the frame [frame, frame+frame_len) into [out, out+raw_len). A block
// whose header, bounds, escapes or checksum is wrong lowers *status to its
// index (0 also for a bad frame header); nothing outside `out` is written.
extern "C" __global__ void vmmw_codec_decode(const u8* __restrict__ frame, u64 frame_len,
                                             u8* __restrict__ out, u64 raw_len,
                                             u32* __restrict__ status) {
    __shared__ u8 table[128];
    __shared__ u64 warp_sums[WARPS];
    __shared__ u32 warp_tot[WARPS];
    __shared__ u32 round_total;
    __shared__ u32 s_ok;
    __shared__ u32 s_mode;
    __shared__ u32 s_k;
    __shared__ u32 s_esc;
    __shared__ u32 s_width;
    __shared__ u64 s_start;
    __shared__ u64 s_sum;
    const u64 nb = (raw_len + BLOCK_BYTES - 1) / BLOCK_BYTES;
    const u64 ds = FRAME_HEADER + 8u * nb;
    if (nb == 0) {
        // An empty frame is its header alone.
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            const bool ok = frame_len == FRAME_HEADER && frame[0] == 'V' && frame[1] == 'M' &&
                            frame[2] == 'W' && frame[3] == 'C' && frame[4] == 1 &&
                            (frame[5] == 1 || frame[5] == 2 || frame[5] == 4) && frame[6] == 0 &&
                            frame[7] == 0 && load_le(frame + 8, 4) == BLOCK_BYTES &&
                            load_le(frame + 12, 4) == 0 && load_le(frame + 16, 8) == 0 &&
                            load_le(frame + 24, 8) == FRAME_HEADER;
            if (!ok) {
                atomicMin(status, 0u);
            }
        }
        return;
    }
    for (u64 b = blockIdx.x; b < nb; b += gridDim.x) {
        const u64 left = raw_len - b * BLOCK_BYTES;
        const u32 blen = left < BLOCK_BYTES ? (u32)left : BLOCK_BYTES;
        u8* dst = out + b * BLOCK_BYTES;
        if (threadIdx.x == 0) {
            u32 ok = frame_len >= ds;
            u32 width = 0;
            if (ok) {
                width = frame[5];
                ok = frame[0] == 'V' && frame[1] == 'M' && frame[2] == 'W' && frame[3] == 'C' &&
                     frame[4] == 1 && (width == 1 || width == 2 || width == 4) &&
                     frame[6] == 0 && frame[7] == 0 && load_le(frame + 8, 4) == BLOCK_BYTES &&
                     load_le(frame + 12, 4) == 0 && load_le(frame + 16, 8) == raw_len &&
                     load_le(frame + 24, 8) == frame_len;
            }
            u64 start = 0, end = 0;
            if (ok) {
                start = load_le(frame + FRAME_HEADER + 8u * b, 8);
                end = b + 1 < nb ? load_le(frame + FRAME_HEADER + 8u * (b + 1), 8) : frame_len;
                const u64 lo = b == 0 ? ds : load_le(frame + FRAME_HEADER + 8u * (b - 1), 8);
                ok = (b == 0 ? start == ds : start >= lo) && start <= frame_len && end >= start &&
                     end <= frame_len && end - start >= BLOCK_HEADER;
            }
            u32 mode = 0, k = 0, esc = 0;
            if (ok) {
                const u8* h = frame + start;
                s_sum = load_le(h, 8);
                mode = h[8];
                k = h[9];
                esc = (u32)load_le(h + 12, 4);
                const u32 n = blen / width;
                const u64 len = end - start;
                ok = h[10] == 0 && h[11] == 0;
                if (mode == MODE_RAW) {
                    ok = ok && k == 0 && esc == 0 && len == BLOCK_HEADER + (u64)blen;
                } else if (mode == MODE_CODED) {
                    ok = ok && k >= 1 && k <= MAX_WIDTH && esc <= n &&
                         len == coded_bytes(n, k, esc, width, blen - n * width);
                } else {
                    ok = 0;
                }
            }
            s_ok = ok;
            s_mode = mode;
            s_k = k;
            s_esc = esc;
            s_width = width;
            s_start = start;
        }
        __syncthreads();
        if (!s_ok) {
            if (threadIdx.x == 0) {
                atomicMin(status, (u32)b);
            }
            __syncthreads();
            continue;
        }
        const u8* body = frame + s_start + BLOCK_HEADER;
        if (s_mode == MODE_RAW) {
            copy_bytes(dst, body, blen);
        } else {
            const u32 width = s_width;
            const u32 sh = field_shift(width);
            const u32 k = s_k;
            const u32 m = (1u << k) - 1u;
            const u32 n = blen / width;
            const u32 code_len = (u32)(((u64)n * k + 7u) >> 3);
            const u8* codes = body + m;
            const u8* escs = codes + code_len;
            const u8* rest = escs + s_esc;
            if (threadIdx.x < m) {
                table[threadIdx.x] = body[threadIdx.x];
            }
            __syncthreads();
            const u32 groups = (n + 7u) / 8u;
            u32 esc_base = 0;
            u32 bad = 0;
            for (u32 g0 = 0; g0 < groups; g0 += THREADS) {
                const u32 g = g0 + threadIdx.x;
                u64 bits = 0;
                u32 cnt = 0;
                u32 mine = 0;
                if (g < groups) {
                    cnt = n - 8u * g < 8u ? n - 8u * g : 8u;
                    const u32 first = g * k;
                    const u32 nbytes = (first + k <= code_len) ? k : code_len - first;
                    bits = load_le(codes + first, nbytes);
                    for (u32 j = 0; j < cnt; ++j) {
                        mine += ((bits >> (j * k)) & m) == m ? 1u : 0u;
                    }
                }
                u32 e = esc_base + block_scan(mine, warp_tot, &round_total);
                if (g < groups) {
                    u64 w[4] = {0, 0, 0, 0};
                    for (u32 j = 0; j < cnt; ++j) {
                        const u32 i = 8u * g + j;
                        const u32 c = (u32)((bits >> (j * k)) & m);
                        u32 f;
                        if (c == m) {
                            // An escape past the list: refused below, read nothing.
                            f = e < s_esc ? escs[e] : 0u;
                            bad |= e < s_esc ? 0u : 1u;
                            ++e;
                        } else {
                            f = table[c];
                        }
                        const u32 r = (u32)load_le(rest + (u64)i * (width - 1u), width - 1u);
                        const u32 bit = 8 * j * width;
                        w[bit >> 6] |= (u64)join(f, r, sh, width) << (bit & 63);
                    }
                    store_group(dst + 8u * g * width, width, cnt, w);
                }
                esc_base += round_total;
                __syncthreads();
            }
            if (threadIdx.x < blen - n * width) {
                dst[n * width + threadIdx.x] = rest[(u64)n * (width - 1u) + threadIdx.x];
            }
            if (bad || esc_base != s_esc) {
                s_ok = 0;
            }
        }
        __syncthreads();
        const u64 sum = checksum(dst, blen, warp_sums);
        if (threadIdx.x == 0 && (!s_ok || sum != s_sum)) {
            atomicMin(status, (u32)b);
        }
        __syncthreads();
    }
}
