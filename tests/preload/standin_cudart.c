/*
 * The stand-in CUDA runtime (standin_cudart.h says what it is and how it
 * is used). Thread-safe: one lock guards the table of allocations, the
 * counters are atomic, the current device is per thread as in CUDA.
 */
#define _GNU_SOURCE
#include "standin_cudart.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEVICES 64

__attribute__((visibility("default"))) const int vmmw_standin_runtime = 1;

enum kind { KIND_DEVICE, KIND_MANAGED, KIND_HOST };

struct entry {
    void *ptr;
    size_t size;
    int device;
    enum kind kind;
    struct entry *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry *table;
static __thread int current_device;

static atomic_llong n_malloc[MAX_DEVICES], n_free[MAX_DEVICES], n_invalid_free,
    n_free_null, n_sync[MAX_DEVICES], n_managed, n_host, live[MAX_DEVICES], n_meminfo;

static int device_count(void) {
    const char *v = getenv("VMMW_STANDIN_DEVICES");
    int n = v ? atoi(v) : 2;
    if (n < 1) n = 1;
    if (n > MAX_DEVICES) n = MAX_DEVICES;
    return n;
}

static size_t device_memory(void) {
    const char *v = getenv("VMMW_STANDIN_MEMORY");
    return v ? (size_t)strtoull(v, NULL, 10) : ((size_t)1 << 40);
}

static cudaError_t record(void **ptr, size_t size, enum kind kind) {
    if (!ptr) return cudaErrorInvalidValue;
    if (size == 0) {
        *ptr = NULL;
        return cudaSuccess;
    }
    size_t rounded = (size + 255) & ~(size_t)255;
    void *p = aligned_alloc(256, rounded);
    struct entry *e = malloc(sizeof *e);
    if (!p || !e) {
        free(p);
        free(e);
        return cudaErrorMemoryAllocation;
    }
    e->ptr = p;
    e->size = size;
    e->device = current_device;
    e->kind = kind;
    pthread_mutex_lock(&lock);
    e->next = table;
    table = e;
    pthread_mutex_unlock(&lock);
    if (kind != KIND_HOST) atomic_fetch_add(&live[e->device], (long long)size);
    *ptr = p;
    return cudaSuccess;
}

/* Remove the entry of `ptr` if its kind is allowed; 1 when removed. */
static int forget(void *ptr, int allow_host) {
    pthread_mutex_lock(&lock);
    struct entry **at = &table;
    while (*at && (*at)->ptr != ptr) at = &(*at)->next;
    struct entry *e = *at;
    if (!e || (e->kind == KIND_HOST) != (allow_host != 0)) {
        pthread_mutex_unlock(&lock);
        return 0;
    }
    *at = e->next;
    pthread_mutex_unlock(&lock);
    if (e->kind != KIND_HOST) atomic_fetch_sub(&live[e->device], (long long)e->size);
    if (e->kind == KIND_DEVICE) atomic_fetch_add(&n_free[e->device], 1);
    free(e->ptr);
    free(e);
    return 1;
}

cudaError_t cudaGetDeviceCount(int *count) {
    if (!count) return cudaErrorInvalidValue;
    *count = device_count();
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    if (!device) return cudaErrorInvalidValue;
    *device = current_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= device_count()) return cudaErrorInvalidDevice;
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    atomic_fetch_add(&n_sync[current_device], 1);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t size) {
    cudaError_t rc = record(ptr, size, KIND_DEVICE);
    if (rc == cudaSuccess && size) atomic_fetch_add(&n_malloc[current_device], 1);
    return rc;
}

cudaError_t cudaMallocPitch(void **ptr, size_t *pitch, size_t width, size_t height) {
    if (!pitch) return cudaErrorInvalidValue;
    size_t row = (width + 511) & ~(size_t)511;
    cudaError_t rc = cudaMalloc(ptr, row * height);
    if (rc == cudaSuccess) *pitch = row;
    return rc;
}

cudaError_t cudaFree(void *ptr) {
    if (!ptr) {
        atomic_fetch_add(&n_free_null, 1);
        return cudaSuccess;
    }
    if (forget(ptr, 0)) return cudaSuccess;
    atomic_fetch_add(&n_invalid_free, 1);
    return cudaErrorInvalidValue;
}

cudaError_t cudaMallocHost(void **ptr, size_t size) {
    cudaError_t rc = record(ptr, size, KIND_HOST);
    if (rc == cudaSuccess) atomic_fetch_add(&n_host, 1);
    return rc;
}

cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags) {
    (void)flags;
    return cudaMallocHost(ptr, size);
}

cudaError_t cudaFreeHost(void *ptr) {
    if (!ptr) return cudaSuccess;
    return forget(ptr, 1) ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaMallocManaged(void **ptr, size_t size, unsigned int flags) {
    (void)flags;
    cudaError_t rc = record(ptr, size, KIND_MANAGED);
    if (rc == cudaSuccess) atomic_fetch_add(&n_managed, 1);
    return rc;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    if (!free_bytes || !total) return cudaErrorInvalidValue;
    atomic_fetch_add(&n_meminfo, 1);
    size_t t = device_memory();
    long long used = atomic_load(&live[current_device]);
    *total = t;
    *free_bytes = (size_t)used > t ? 0 : t - (size_t)used;
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    (void)kind;
    if (count && (!dst || !src)) return cudaErrorInvalidValue;
    memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *ptr, int value, size_t count) {
    if (count && !ptr) return cudaErrorInvalidValue;
    memset(ptr, value, count);
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }

cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }

const char *cudaGetErrorString(cudaError_t error) {
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    default: return "unrecognized error code";
    }
}

static long long per_device(atomic_llong *counters, int device) {
    if (device >= 0) return device < MAX_DEVICES ? atomic_load(&counters[device]) : 0;
    long long sum = 0;
    for (int d = 0; d < MAX_DEVICES; d++) sum += atomic_load(&counters[d]);
    return sum;
}

long long vmmw_standin_count(const char *what, int device) {
    if (!what) return -1;
    if (!strcmp(what, "malloc")) return per_device(n_malloc, device);
    if (!strcmp(what, "free")) return per_device(n_free, device);
    if (!strcmp(what, "sync")) return per_device(n_sync, device);
    if (!strcmp(what, "live_bytes")) return per_device(live, device);
    if (!strcmp(what, "free_null")) return atomic_load(&n_free_null);
    if (!strcmp(what, "invalid_free")) return atomic_load(&n_invalid_free);
    if (!strcmp(what, "managed")) return atomic_load(&n_managed);
    if (!strcmp(what, "host")) return atomic_load(&n_host);
    if (!strcmp(what, "meminfo")) return atomic_load(&n_meminfo);
    return -1;
}
