// Lets clang check the kernels' syntax where no CUDA toolkit is installed
// (scripts/check-kernels.sh): the few CUDA keywords and intrinsics the
// kernels use, mapped to clang's own. nvcc never sees this file.
#pragma once
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __align__(n) __attribute__((aligned(n)))
#include <__clang_cuda_builtin_vars.h>

__device__ inline unsigned int __shfl_down_sync(unsigned int mask, unsigned int v, int d) {
    return __nvvm_shfl_sync_down_i32(mask, v, d, 0x1f);
}
__device__ inline unsigned long long __shfl_down_sync(unsigned int mask, unsigned long long v,
                                                      int d) {
    unsigned int lo = __nvvm_shfl_sync_down_i32(mask, (unsigned int)v, d, 0x1f);
    unsigned int hi = __nvvm_shfl_sync_down_i32(mask, (unsigned int)(v >> 32), d, 0x1f);
    return ((unsigned long long)hi << 32) | lo;
}
__device__ inline unsigned int __shfl_up_sync(unsigned int mask, unsigned int v, unsigned int d) {
    return __nvvm_shfl_sync_up_i32(mask, v, d, 0);
}
__device__ inline unsigned int atomicAdd(unsigned int* p, unsigned int v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
__device__ inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
__device__ inline unsigned int atomicMin(unsigned int* p, unsigned int v) {
    return __atomic_fetch_min(p, v, __ATOMIC_RELAXED);
}
__device__ inline unsigned int __match_any_sync(unsigned int mask, unsigned int v) {
    return __nvvm_match_any_sync_i32(mask, v);
}
__device__ inline int __ffs(unsigned int v) { return v ? __builtin_ctz(v) + 1 : 0; }
__device__ inline int __popc(unsigned int v) { return __builtin_popcount(v); }
