/*
 * The stand-in CUDA runtime: the subset of the CUDA runtime API that the
 * interposer's tests (and programs standing in for CUDA applications, such
 * as a stand-in llama-server) use, on host memory, with counters a test can
 * read. Build it with scripts/build-preload-standin.sh; docs/PRELOAD.md
 * ("Testing without a GPU") says how to use it.
 *
 * Programs include this header in place of <cuda_runtime_api.h> and link
 * against libvmmw_standin_cudart.so, so their references to cudaMalloc and
 * the rest resolve through the global scope, where an LD_PRELOAD'ed
 * interposer comes first, exactly as libggml-cuda's references to the real
 * libcudart do. Device memory is ordinary host memory (aligned to 256
 * bytes); copies are memcpy; synchronization returns at once and is counted.
 *
 * Environment:
 *   VMMW_STANDIN_DEVICES  devices simulated (default 2, at most 64)
 *   VMMW_STANDIN_MEMORY   bytes each device reports in cudaMemGetInfo when
 *                         nobody interposes (default 1 TiB, so a test can
 *                         tell the runtime's answer from the interposer's)
 */
#ifndef VMMW_STANDIN_CUDART_H
#define VMMW_STANDIN_CUDART_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidDevice = 101
} cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

#define cudaMemAttachGlobal 0x01
#define cudaHostAllocDefault 0x00

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaMallocPitch(void **ptr, size_t *pitch, size_t width, size_t height);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMallocManaged(void **ptr, size_t size, unsigned int flags);
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemset(void *ptr, int value, size_t count);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t error);

/* Not CUDA: the stand-in's own. */

/* Present only in the stand-in: the interposer refuses its host backend
 * under any other runtime (host memory is useless to a real one). */
extern const int vmmw_standin_runtime;

/*
 * A counter of the stand-in, by name, for `device` (-1: every device):
 *   "malloc"        cudaMalloc/cudaMallocPitch calls the stand-in served
 *   "free"          cudaFree calls that freed a stand-in allocation
 *   "free_null"     cudaFree(NULL) calls
 *   "invalid_free"  cudaFree calls with a pointer the stand-in never gave
 *   "sync"          cudaDeviceSynchronize calls
 *   "managed"       cudaMallocManaged calls
 *   "host"          cudaMallocHost/cudaHostAlloc calls
 *   "live_bytes"    bytes of device and managed allocations not freed
 *   "meminfo"       cudaMemGetInfo calls the stand-in answered
 * -1 for an unknown name.
 */
long long vmmw_standin_count(const char *what, int device);

#ifdef __cplusplus
}
#endif

#endif
