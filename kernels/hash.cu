// Range hashes on the device: Reload's proof that loaded bytes are unchanged.
//
// The function, word by word (the host reference is src/driver/hash.rs, which
// must give the same sums): a range is read as little-endian 64-bit words,
// the last one zero-padded; word k of the range adds mix(word, k) to a 64-bit
// sum, wrapping. A sum is order-independent, so tiles of one range are summed
// by different thread blocks and added with one atomic each.
//
// Built into PTX with nvcc on the GPU machine and committed
// (src/driver/cuda/hash.ptx); the driver loads the PTX at run time, so
// building the crate needs no CUDA:
//   nvcc -ptx -arch=compute_75 -O3 -o src/driver/cuda/hash.ptx kernels/hash.cu

typedef unsigned long long u64;

// One piece of a range: `len` bytes at `ptr`, whose first word is word
// `word0` of the range; its sum is added to sums[out].
struct Tile {
    u64 ptr;
    u64 len;
    u64 word0;
    u64 out;
};

struct __align__(16) Pair {
    u64 lo;
    u64 hi;
};

// splitmix64's finaliser over the word and its index: a bijection of the word
// for each index, so any change of one word changes its term.
__device__ __forceinline__ u64 mix(u64 w, u64 k) {
    u64 z = w ^ (k * 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// `n` (1..=8) bytes at any alignment as one little-endian word.
__device__ __forceinline__ u64 load_bytes(const unsigned char* p, unsigned n) {
    u64 w = 0;
    for (unsigned b = 0; b < n; ++b) {
        w |= (u64)p[b] << (8 * b);
    }
    return w;
}

extern "C" __global__ void vmmw_hash_tiles(const Tile* __restrict__ tiles, u64 n_tiles,
                                           u64* __restrict__ sums) {
    __shared__ u64 warp_sums[32];
    for (u64 t = blockIdx.x; t < n_tiles; t += gridDim.x) {
        const Tile tile = tiles[t];
        const unsigned char* p = (const unsigned char*)tile.ptr;
        const u64 words = tile.len >> 3;
        u64 sum = 0;
        if ((tile.ptr & 15) == 0) {
            const Pair* q = (const Pair*)p;
            for (u64 i = threadIdx.x; i < words / 2; i += blockDim.x) {
                const Pair v = q[i];
                sum += mix(v.lo, tile.word0 + 2 * i) + mix(v.hi, tile.word0 + 2 * i + 1);
            }
            if ((words & 1) && threadIdx.x == 0) {
                sum += mix(((const u64*)p)[words - 1], tile.word0 + words - 1);
            }
        } else {
            for (u64 i = threadIdx.x; i < words; i += blockDim.x) {
                sum += mix(load_bytes(p + 8 * i, 8), tile.word0 + i);
            }
        }
        if ((tile.len & 7) && threadIdx.x == 0) {
            sum += mix(load_bytes(p + 8 * words, (unsigned)(tile.len & 7)), tile.word0 + words);
        }
        for (int o = 16; o > 0; o >>= 1) {
            sum += __shfl_down_sync(0xffffffffu, sum, o);
        }
        if ((threadIdx.x & 31) == 0) {
            warp_sums[threadIdx.x >> 5] = sum;
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            sum = threadIdx.x < (blockDim.x >> 5) ? warp_sums[threadIdx.x] : 0;
            for (int o = 16; o > 0; o >>= 1) {
                sum += __shfl_down_sync(0xffffffffu, sum, o);
            }
            if (threadIdx.x == 0) {
                atomicAdd(&sums[tile.out], sum);
            }
        }
        __syncthreads();
    }
}
