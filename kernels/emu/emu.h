// Runs the CUDA C kernels on the CPU, so CI checks that kernels/codec.cu
// produces the reference's bytes without a GPU (scripts/check-kernels.sh).
// One thread block of 256 threads at a time, as fibers on one OS thread:
// __syncthreads switches to the next fiber, and a round over all of them is a
// barrier. Shared memory is function-static (one block runs at a time), and a
// shuffle is a block-wide exchange (every kernel shuffles with the whole block
// in step).
#pragma once
#include <atomic>
#include <cstdint>

struct Dim3 {
    unsigned int x, y, z;
};

inline Dim3 threadIdx{0, 0, 0};
inline Dim3 blockIdx{0, 0, 0};
inline Dim3 gridDim{1, 1, 1};
inline Dim3 blockDim{256, 1, 1};
void emu_sync();
inline unsigned long long emu_slots[256];

#define __device__
#define __global__
#define __shared__ static
#define __forceinline__ inline

inline void __syncthreads() { emu_sync(); }

template <typename T>
inline T emu_exchange(T v, int from) {
    emu_slots[threadIdx.x] = (unsigned long long)v;
    __syncthreads();
    T r = (T)emu_slots[from];
    __syncthreads();
    return r;
}

template <typename T>
inline T __shfl_down_sync(unsigned int, T v, int d) {
    const int lane = threadIdx.x & 31;
    return emu_exchange(v, lane + d < 32 ? (int)threadIdx.x + d : (int)threadIdx.x);
}

template <typename T>
inline T __shfl_up_sync(unsigned int, T v, unsigned int d) {
    const unsigned lane = threadIdx.x & 31;
    return emu_exchange(v, lane >= d ? (int)(threadIdx.x - d) : (int)threadIdx.x);
}

template <typename T>
inline T atomicAdd(T* p, T v) {
    return std::atomic_ref<T>(*p).fetch_add(v);
}

inline unsigned int atomicMin(unsigned int* p, unsigned int v) {
    std::atomic_ref<unsigned int> a(*p);
    unsigned int old = a.load();
    while (v < old && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}

// Lanes of the calling warp whose value equals this lane's (every lane of
// the block calls it in step, as the kernels do).
inline unsigned int __match_any_sync(unsigned int, unsigned int v) {
    emu_slots[threadIdx.x] = v;
    __syncthreads();
    const unsigned warp = threadIdx.x & ~31u;
    unsigned int m = 0;
    for (unsigned l = 0; l < 32; ++l) {
        if (emu_slots[warp + l] == v) {
            m |= 1u << l;
        }
    }
    __syncthreads();
    return m;
}
inline int __ffs(unsigned int v) { return v ? __builtin_ctz(v) + 1 : 0; }
inline int __popc(unsigned int v) { return __builtin_popcount(v); }
