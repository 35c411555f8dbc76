/*
 * The interposer's test program: a CUDA program as the interposer meets
 * them, driven line by line on stdin by tests/preload/twin.py, answering
 * one line per command on stdout ("ok ..." or "err ...").
 *
 * The same source builds against the stand-in runtime (CI, host backend:
 * scripts/build-preload-standin.sh) and against the real libcudart on a GPU
 * (scripts/gpu.d/88-preload.sh, -DVMMW_TWIN_CUDA). Either way it is linked
 * against the runtime, so its references to cudaMalloc and the rest resolve
 * through the global scope, where LD_PRELOAD puts the interposer first.
 * Everything beyond the runtime API (the stand-in's counters, the
 * interposer's vmmw_preload_* calls, the driver's cuPointerGetAttribute) is
 * looked up at run time and reported as absent when it is.
 *
 * Commands (sizes in bytes; NAME names a buffer):
 *   info                        devices, whether the runtime is the stand-in
 *   alloc NAME DEV SIZE SEED    cudaMalloc on DEV, filled with pattern SEED
 *                               (SEED 0: left unwritten, never verified)
 *   allocmt THREADS PER MAX SEED   THREADS threads (device = thread % devices)
 *                               each allocate PER buffers of sizes up to MAX
 *   pitch NAME DEV W H SEED     cudaMallocPitch
 *   foreign NAME DEV SIZE       cudaMalloc of the runtime itself, behind
 *                               the interposer's back (dlsym in the runtime)
 *   managed NAME SIZE | host NAME SIZE   cudaMallocManaged / cudaMallocHost
 *   fill NAME|all SEED          write pattern SEED again
 *   verify NAME|all             read back and compare with the pattern
 *   probe NAME                  is the memory accessible now? (never faults here)
 *   free NAME | freehost NAME | freenull | freelater NAME MS
 *   meminfo DEV                 cudaMemGetInfo on DEV
 *   count WHAT DEV              a stand-in counter (-1 without the stand-in)
 *   settag NAME|-               vmmw_preload_set_tag (- is NULL)
 *   region 0|1                  vmmw_preload_set_region
 *   psleep POLICY | pwake MS    vmmw_preload_sleep / vmmw_preload_wake
 *   link BYTES                  host<->device copy rates from pinned memory
 *   mallocbench N SIZE          median cudaMalloc and cudaFree times
 *   forkexit                    a child forked here exits normally (its
 *                               exit handlers run) while this one goes on
 *   churn THREADS MS            THREADS threads cudaMalloc and cudaFree
 *                               (never touching the memory) for MS ms, in
 *                               the background; churnwait joins them
 *   edges DEV                   cudaMalloc of 0 bytes and of sizes no device
 *                               holds, overflowing pitches, cudaFree inside
 *                               a block of ours: their return codes
 *   sigwait N                   SIGUSR1 blocked in this thread (the only one
 *                               of the program's then), sent to the process
 *                               N times, each taken with sigtimedwait
 *   quit
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef VMMW_TWIN_CUDA
#include <cuda_runtime_api.h>
#else
#include "standin_cudart.h"
#endif

#define MAX_BUFS 4096
#define CHUNK ((size_t)64 << 20)

enum kind { DEVICE, FOREIGN, MANAGED, HOST };

struct buf {
    char name[64];
    void *ptr;
    size_t size;
    int device;
    uint64_t seed;
    enum kind kind;
    int live;
};

static struct buf bufs[MAX_BUFS];
static int nbufs;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int ndevices = 1;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void answer(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void answer(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

/* The pattern: 64-bit word i of a buffer with seed s. */
static inline uint64_t word(uint64_t s, uint64_t i) {
    return (s * 0x9E3779B97F4A7C15ull) ^ (i * 0xD6E8FEB86659FD93ull) ^ (i >> 7);
}

static void pattern(uint64_t *dst, uint64_t seed, uint64_t first_word, size_t words) {
    for (size_t k = 0; k < words; k++) dst[k] = word(seed, first_word + k);
}

static struct buf *find(const char *name) {
    for (int i = 0; i < nbufs; i++)
        if (bufs[i].live && !strcmp(bufs[i].name, name)) return &bufs[i];
    return NULL;
}

static struct buf *add(const char *name, void *ptr, size_t size, int device, uint64_t seed,
                       enum kind kind) {
    pthread_mutex_lock(&lock);
    struct buf *b = NULL;
    if (nbufs < MAX_BUFS) {
        b = &bufs[nbufs++];
        snprintf(b->name, sizeof b->name, "%s", name);
        b->ptr = ptr;
        b->size = size;
        b->device = device;
        b->seed = seed;
        b->kind = kind;
        b->live = 1;
    }
    pthread_mutex_unlock(&lock);
    return b;
}

/* Copy `size` bytes of pattern `seed` into device memory at `ptr` through a
 * pinned staging buffer of CHUNK bytes. */
static int fill(void *ptr, size_t size, uint64_t seed, void *stage) {
    for (size_t off = 0; off < size; off += CHUNK) {
        size_t n = size - off < CHUNK ? size - off : CHUNK;
        pattern((uint64_t *)stage, seed, off / 8, (n + 7) / 8);
        if (cudaMemcpy((char *)ptr + off, stage, n, cudaMemcpyHostToDevice) != cudaSuccess) return -1;
    }
    return 0;
}

/* Compare device memory with its pattern; the first bad offset, or -1. */
static long long check(const void *ptr, size_t size, uint64_t seed, void *stage, int *rc) {
    *rc = 0;
    uint64_t *want = malloc(CHUNK);
    if (!want) {
        *rc = -1;
        return -1;
    }
    long long bad = -1;
    for (size_t off = 0; off < size && bad < 0; off += CHUNK) {
        size_t n = size - off < CHUNK ? size - off : CHUNK;
        cudaError_t e = cudaMemcpy(stage, (const char *)ptr + off, n, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) {
            *rc = (int)e;
            break;
        }
        pattern(want, seed, off / 8, (n + 7) / 8);
        if (memcmp(stage, want, n) != 0) {
            const unsigned char *a = stage, *b = (const unsigned char *)want;
            size_t k = 0;
            while (k < n && a[k] == b[k]) k++;
            bad = (long long)(off + k);
        }
    }
    free(want);
    return bad;
}

static void *staging(void) {
    void *p = NULL;
    if (cudaMallocHost(&p, CHUNK) != cudaSuccess) return NULL;
    return p;
}

static void *lookup(const char *name) {
    return dlsym(RTLD_DEFAULT, name);
}

/* cudaMalloc of the runtime itself: the object that defines cudaGetDevice
 * (which the interposer leaves alone: the first definition in the global
 * scope is the runtime's), asked for its own cudaMalloc. */
static cudaError_t runtime_malloc(void **p, size_t size) {
    Dl_info info;
    void *get_device = dlsym(RTLD_DEFAULT, "cudaGetDevice");
    if (!get_device || !dladdr(get_device, &info) || !info.dli_fname) return cudaErrorInitializationError;
    void *h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    if (!h) return cudaErrorInitializationError;
    cudaError_t (*real)(void **, size_t) = (cudaError_t(*)(void **, size_t))dlsym(h, "cudaMalloc");
    cudaError_t rc = real ? real(p, size) : cudaErrorInitializationError;
    dlclose(h);
    return rc;
}

struct mt_args {
    int thread, per;
    size_t max;
    uint64_t seed;
    int failed;
    size_t bytes;
};

static const size_t mt_sizes[] = {256, 4096, 100000, 1 << 20, (1 << 20) + 1, 3 << 20, 0};

static void *mt_worker(void *arg) {
    struct mt_args *a = arg;
    int dev = a->thread % ndevices;
    void *stage = staging();
    if (!stage || cudaSetDevice(dev) != cudaSuccess) {
        a->failed = 1;
        return NULL;
    }
    for (int k = 0; k < a->per && !a->failed; k++) {
        size_t size = mt_sizes[k % 7];
        if (size == 0 || size > a->max) size = a->max;
        void *p = NULL;
        char name[64];
        snprintf(name, sizeof name, "t%d_%d", a->thread, k);
        uint64_t seed = a->seed + (uint64_t)a->thread * 1000 + (uint64_t)k;
        if (cudaMalloc(&p, size) != cudaSuccess || fill(p, size, seed, stage) != 0 ||
            !add(name, p, size, dev, seed, DEVICE)) {
            a->failed = 1;
            break;
        }
        a->bytes += size;
    }
    cudaFreeHost(stage);
    return NULL;
}

static void cmd_allocmt(int threads, int per, size_t max, uint64_t seed) {
    pthread_t t[64];
    struct mt_args a[64];
    if (threads < 1 || threads > 64) {
        answer("err threads 1..64");
        return;
    }
    for (int i = 0; i < threads; i++) {
        a[i] = (struct mt_args){.thread = i, .per = per, .max = max, .seed = seed};
        pthread_create(&t[i], NULL, mt_worker, &a[i]);
    }
    size_t bytes = 0;
    int failed = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        failed |= a[i].failed;
        bytes += a[i].bytes;
    }
    if (failed)
        answer("err a thread failed to allocate or fill");
    else
        answer("ok n=%d bytes=%zu", threads * per, bytes);
}

static void cmd_verify(const char *which) {
    void *stage = staging();
    if (!stage) {
        answer("err no pinned staging");
        return;
    }
    int checked = 0;
    size_t bytes = 0;
    double t0 = now();
    for (int i = 0; i < nbufs; i++) {
        struct buf *b = &bufs[i];
        if (!b->live || b->kind != DEVICE || b->seed == 0 || (strcmp(which, "all") && strcmp(which, b->name)))
            continue;
        cudaSetDevice(b->device);
        int rc;
        long long bad = check(b->ptr, b->size, b->seed, stage, &rc);
        if (rc) {
            answer("err %s read back failed: cuda error %d", b->name, rc);
            cudaFreeHost(stage);
            return;
        }
        if (bad >= 0) {
            answer("err %s mismatch at offset %lld of %zu", b->name, bad, b->size);
            cudaFreeHost(stage);
            return;
        }
        checked++;
        bytes += b->size;
    }
    cudaFreeHost(stage);
    answer("ok checked=%d bytes=%zu seconds=%.3f", checked, bytes, now() - t0);
}

static void cmd_fill(const char *which, uint64_t seed) {
    void *stage = staging();
    int n = 0;
    for (int i = 0; stage && i < nbufs; i++) {
        struct buf *b = &bufs[i];
        if (!b->live || b->kind != DEVICE || b->seed == 0 || (strcmp(which, "all") && strcmp(which, b->name)))
            continue;
        cudaSetDevice(b->device);
        b->seed = seed + (uint64_t)i;
        if (fill(b->ptr, b->size, b->seed, stage)) {
            answer("err %s fill failed", b->name);
            cudaFreeHost(stage);
            return;
        }
        n++;
    }
    if (stage) cudaFreeHost(stage);
    answer("ok filled=%d", n);
}

/* Whether `p` is accessible now, without faulting this process. */
static void cmd_probe(const struct buf *b) {
    typedef int (*get_attr_fn)(void *, int, unsigned long long);
    get_attr_fn get_attr = (get_attr_fn)lookup("cuPointerGetAttribute");
    if (!get_attr) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (h) get_attr = (get_attr_fn)dlsym(h, "cuPointerGetAttribute");
    }
    if (lookup("vmmw_standin_count")) {
        /* Host memory: read it in a child; a fault kills the child only. */
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            volatile const unsigned char *p = b->ptr;
            unsigned char x = p[0] ^ p[b->size - 1];
            (void)x;
            _exit(0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        if (WIFSIGNALED(st))
            answer("ok faulted signal=%d", WTERMSIG(st));
        else
            answer("ok readable");
    } else if (get_attr) {
        /* CU_POINTER_ATTRIBUTE_MAPPED (13): is a physical allocation mapped there? */
        unsigned long long mapped = 0;
        int rc = get_attr(&mapped, 13, (unsigned long long)(uintptr_t)b->ptr);
        if (rc == 0 && mapped)
            answer("ok readable");
        else
            answer("ok faulted rc=%d mapped=%llu", rc, mapped);
    } else {
        answer("ok unknown");
    }
}

static void cmd_link(size_t bytes) {
    void *h = NULL, *d = NULL;
    if (cudaMallocHost(&h, bytes) != cudaSuccess) {
        answer("err cudaMallocHost of %zu", bytes);
        return;
    }
    if (cudaMalloc(&d, bytes) != cudaSuccess) {
        cudaFreeHost(h);
        answer("err cudaMalloc of %zu", bytes);
        return;
    }
    memset(h, 1, bytes);
    double best_h2d = 1e9, best_d2h = 1e9;
    for (int r = 0; r < 4; r++) {
        double t0 = now();
        cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
        cudaDeviceSynchronize();
        double t1 = now();
        cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost);
        cudaDeviceSynchronize();
        double t2 = now();
        if (t1 - t0 < best_h2d) best_h2d = t1 - t0;
        if (t2 - t1 < best_d2h) best_d2h = t2 - t1;
    }
    cudaFree(d);
    cudaFreeHost(h);
    answer("ok h2d_gbps=%.2f d2h_gbps=%.2f", (double)bytes / best_h2d / 1e9, (double)bytes / best_d2h / 1e9);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void cmd_mallocbench(int n, size_t size) {
    if (n < 1 || n > 4096) {
        answer("err n 1..4096");
        return;
    }
    void **p = calloc((size_t)n, sizeof *p);
    double *tm = calloc((size_t)n, sizeof *tm), *tf = calloc((size_t)n, sizeof *tf);
    for (int i = 0; i < n; i++) {
        double t0 = now();
        if (cudaMalloc(&p[i], size) != cudaSuccess) {
            answer("err cudaMalloc %d of %zu", i, size);
            for (int k = 0; k < i; k++) cudaFree(p[k]);
            free(p), free(tm), free(tf);
            return;
        }
        tm[i] = now() - t0;
    }
    for (int i = 0; i < n; i++) {
        double t0 = now();
        cudaFree(p[i]);
        tf[i] = now() - t0;
    }
    qsort(tm, (size_t)n, sizeof *tm, cmp_double);
    qsort(tf, (size_t)n, sizeof *tf, cmp_double);
    answer("ok malloc_us=%.2f free_us=%.2f", tm[n / 2] * 1e6, tf[n / 2] * 1e6);
    free(p), free(tm), free(tf);
}

/* Churn: allocate and free, never touching, while the test sleeps and
 * wakes the process; counts what came back. */
static struct {
    pthread_t t[64];
    int threads;
    double until;
    long served, refused, other, free_failed;
    pthread_mutex_t lock;
} churn = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void *churn_worker(void *arg) {
    int id = (int)(intptr_t)arg;
    unsigned s = 2654435761u * (unsigned)(id + 1);
    long served = 0, refused = 0, other = 0, free_failed = 0;
    cudaSetDevice(id % ndevices);
    while (now() < churn.until) {
        void *p[8] = {0};
        for (int k = 0; k < 8; k++) {
            s = s * 1103515245u + 12345u;
            size_t size = (s >> 9) % 3 ? 256 + (s >> 4) % 200000 : ((size_t)1 << 20) + (s >> 4) % (3 << 20);
            cudaError_t rc = cudaMalloc(&p[k], size);
            if (rc == cudaSuccess)
                served++;
            else {
                p[k] = NULL;
                if (rc == cudaErrorMemoryAllocation)
                    refused++;
                else
                    other++;
            }
        }
        for (int k = 0; k < 8; k++)
            if (p[k] && cudaFree(p[k]) != cudaSuccess) free_failed++;
    }
    pthread_mutex_lock(&churn.lock);
    churn.served += served, churn.refused += refused, churn.other += other;
    churn.free_failed += free_failed;
    pthread_mutex_unlock(&churn.lock);
    return NULL;
}

struct later {
    struct buf *b;
    int ms;
};

static void *free_later(void *arg) {
    struct later *l = arg;
    usleep((useconds_t)l->ms * 1000);
    cudaSetDevice(l->b->device);
    cudaFree(l->b->ptr);
    l->b->live = 0;
    free(l);
    return NULL;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (cudaGetDeviceCount(&ndevices) != cudaSuccess || ndevices < 1) ndevices = 1;
    char line[512];
    while (fgets(line, sizeof line, stdin)) {
        char cmd[32] = "", a[64] = "";
        long long x = 0, y = 0, z = 0, w = 0;
        int n = sscanf(line, "%31s %63s %lld %lld %lld %lld", cmd, a, &x, &y, &z, &w);
        if (n < 1) continue;
        if (!strcmp(cmd, "quit")) {
            answer("ok bye");
            return 0;
        } else if (!strcmp(cmd, "info")) {
            answer("ok devices=%d standin=%d pid=%d preload=%d", ndevices,
                   lookup("vmmw_standin_count") != NULL, (int)getpid(),
                   lookup("vmmw_preload_status") != NULL);
        } else if (!strcmp(cmd, "alloc") && n >= 5) {
            /* alloc NAME DEV SIZE SEED */
            void *p = NULL, *stage = staging();
            cudaError_t rc = cudaSetDevice((int)x);
            if (rc == cudaSuccess) rc = cudaMalloc(&p, (size_t)y);
            if (rc != cudaSuccess) {
                answer("err cudaMalloc rc=%d", (int)rc);
            } else if (!stage || (z != 0 && fill(p, (size_t)y, (uint64_t)z, stage)) ||
                       !add(a, p, (size_t)y, (int)x, (uint64_t)z, DEVICE)) {
                answer("err fill");
            } else {
                answer("ok ptr=%p", p);
            }
            if (stage) cudaFreeHost(stage);
        } else if (!strcmp(cmd, "allocmt") && n >= 5) {
            /* allocmt THREADS PER MAX SEED: a holds THREADS */
            cmd_allocmt(atoi(a), (int)x, (size_t)y, (uint64_t)z);
        } else if (!strcmp(cmd, "pitch") && n >= 6) {
            /* pitch NAME DEV W H SEED */
            void *p = NULL, *stage = staging();
            size_t pitch = 0;
            cudaError_t rc = cudaSetDevice((int)x);
            if (rc == cudaSuccess) rc = cudaMallocPitch(&p, &pitch, (size_t)y, (size_t)z);
            if (rc != cudaSuccess || !stage) {
                answer("err cudaMallocPitch rc=%d", (int)rc);
            } else if (fill(p, pitch * (size_t)z, (uint64_t)w, stage) ||
                       !add(a, p, pitch * (size_t)z, (int)x, (uint64_t)w, DEVICE)) {
                answer("err fill");
            } else {
                answer("ok ptr=%p pitch=%zu", p, pitch);
            }
            if (stage) cudaFreeHost(stage);
        } else if (!strcmp(cmd, "foreign") && n >= 4) {
            void *p = NULL;
            cudaSetDevice((int)x);
            cudaError_t rc = runtime_malloc(&p, (size_t)y);
            if (rc == cudaSuccess && add(a, p, (size_t)y, (int)x, 0, FOREIGN))
                answer("ok ptr=%p", p);
            else
                answer("err runtime cudaMalloc rc=%d", (int)rc);
        } else if (!strcmp(cmd, "managed") && n >= 3) {
            void *p = NULL;
            cudaError_t rc = cudaMallocManaged(&p, (size_t)x, cudaMemAttachGlobal);
            if (rc == cudaSuccess && add(a, p, (size_t)x, 0, 0, MANAGED))
                answer("ok ptr=%p", p);
            else
                answer("err cudaMallocManaged rc=%d", (int)rc);
        } else if (!strcmp(cmd, "host") && n >= 3) {
            void *p = NULL;
            cudaError_t rc = cudaMallocHost(&p, (size_t)x);
            if (rc == cudaSuccess && add(a, p, (size_t)x, 0, 0, HOST))
                answer("ok ptr=%p", p);
            else
                answer("err cudaMallocHost rc=%d", (int)rc);
        } else if (!strcmp(cmd, "fill") && n >= 3) {
            cmd_fill(a, (uint64_t)x);
        } else if (!strcmp(cmd, "verify") && n >= 2) {
            cmd_verify(a);
        } else if (!strcmp(cmd, "probe") && n >= 2) {
            struct buf *b = find(a);
            if (b)
                cmd_probe(b);
            else
                answer("err no buffer %s", a);
        } else if (!strcmp(cmd, "free") && n >= 2) {
            struct buf *b = find(a);
            if (!b) {
                answer("err no buffer %s", a);
                continue;
            }
            cudaSetDevice(b->device);
            cudaError_t rc = cudaFree(b->ptr);
            b->live = 0;
            answer("ok rc=%d", (int)rc);
        } else if (!strcmp(cmd, "freeagain") && n >= 2) {
            /* The same pointer freed a second time (the buffer is gone). */
            for (int i = nbufs - 1; i >= 0; i--) {
                if (!strcmp(bufs[i].name, a) && !bufs[i].live) {
                    answer("ok rc=%d", (int)cudaFree(bufs[i].ptr));
                    goto next;
                }
            }
            answer("err no freed buffer %s", a);
        } else if (!strcmp(cmd, "freehost") && n >= 2) {
            struct buf *b = find(a);
            if (!b) {
                answer("err no buffer %s", a);
                continue;
            }
            cudaError_t rc = cudaFreeHost(b->ptr);
            b->live = 0;
            answer("ok rc=%d", (int)rc);
        } else if (!strcmp(cmd, "freenull")) {
            answer("ok rc=%d", (int)cudaFree(NULL));
        } else if (!strcmp(cmd, "freelater") && n >= 3) {
            struct buf *b = find(a);
            struct later *l = malloc(sizeof *l);
            pthread_t t;
            if (!b || !l) {
                free(l);
                answer("err no buffer %s", a);
                continue;
            }
            l->b = b;
            l->ms = (int)x;
            pthread_create(&t, NULL, free_later, l);
            pthread_detach(t);
            answer("ok");
        } else if (!strcmp(cmd, "meminfo") && n >= 2) {
            size_t f = 0, t = 0;
            cudaSetDevice(atoi(a));
            cudaError_t rc = cudaMemGetInfo(&f, &t);
            if (rc == cudaSuccess)
                answer("ok free=%zu total=%zu", f, t);
            else
                answer("err cudaMemGetInfo rc=%d", (int)rc);
        } else if (!strcmp(cmd, "count") && n >= 3) {
            long long (*count)(const char *, int) =
                (long long (*)(const char *, int))lookup("vmmw_standin_count");
            answer("ok n=%lld", count ? count(a, (int)x) : -1);
        } else if (!strcmp(cmd, "settag") && n >= 2) {
            int (*set)(const char *) = (int (*)(const char *))lookup("vmmw_preload_set_tag");
            if (!set)
                answer("err no vmmw_preload_set_tag");
            else
                answer("ok rc=%d", set(strcmp(a, "-") ? a : NULL));
        } else if (!strcmp(cmd, "region") && n >= 2) {
            int (*set)(int) = (int (*)(int))lookup("vmmw_preload_set_region");
            if (!set)
                answer("err no vmmw_preload_set_region");
            else
                answer("ok rc=%d", set(atoi(a)));
        } else if (!strcmp(cmd, "psleep") && n >= 2) {
            int (*sleep_fn)(int, const char *const *, size_t) =
                (int (*)(int, const char *const *, size_t))lookup("vmmw_preload_sleep");
            if (!sleep_fn)
                answer("err no vmmw_preload_sleep");
            else
                answer("ok rc=%d", sleep_fn(atoi(a), NULL, 0));
        } else if (!strcmp(cmd, "pwake") && n >= 2) {
            int (*wake_fn)(unsigned long long, const char *const *, size_t) =
                (int (*)(unsigned long long, const char *const *, size_t))lookup("vmmw_preload_wake");
            if (!wake_fn)
                answer("err no vmmw_preload_wake");
            else
                answer("ok rc=%d", wake_fn(strtoull(a, NULL, 10), NULL, 0));
        } else if (!strcmp(cmd, "link") && n >= 2) {
            cmd_link(strtoull(a, NULL, 10));
        } else if (!strcmp(cmd, "forkexit")) {
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) exit(0);
            int st = 0;
            waitpid(pid, &st, 0);
            answer("ok child=%d status=%d", (int)pid, st);
        } else if (!strcmp(cmd, "churn") && n >= 3) {
            churn.threads = atoi(a) < 1 ? 1 : atoi(a) > 64 ? 64 : atoi(a);
            churn.until = now() + (double)x / 1000.0;
            churn.served = churn.refused = churn.other = churn.free_failed = 0;
            for (int i = 0; i < churn.threads; i++)
                pthread_create(&churn.t[i], NULL, churn_worker, (void *)(intptr_t)i);
            answer("ok threads=%d", churn.threads);
        } else if (!strcmp(cmd, "churnwait")) {
            for (int i = 0; i < churn.threads; i++) pthread_join(churn.t[i], NULL);
            churn.threads = 0;
            answer("ok served=%ld refused=%ld other=%ld free_failed=%ld", churn.served, churn.refused,
                   churn.other, churn.free_failed);
        } else if (!strcmp(cmd, "edges") && n >= 2) {
            void *p0 = (void *)1, *big = NULL, *small = NULL, *q = NULL;
            size_t pitch = 0;
            cudaSetDevice(atoi(a));
            int zero = (int)cudaMalloc(&p0, 0);
            int huge = (int)cudaMalloc(&q, SIZE_MAX);
            int huge2 = (int)cudaMalloc(&q, SIZE_MAX - 4095);
            int pitch_over = (int)cudaMallocPitch(&q, &pitch, SIZE_MAX - 10, 2);
            int mid_small = -1, mid_big = -1;
            if (cudaMalloc(&small, 4096) == cudaSuccess && cudaMalloc(&big, (size_t)5 << 20) == cudaSuccess) {
                mid_small = (int)cudaFree((char *)small + 512);
                mid_big = (int)cudaFree((char *)big + ((size_t)2 << 20));
            }
            int freed = (int)cudaFree(small) + (int)cudaFree(big);
            answer("ok zero=%d null=%d huge=%d huge2=%d pitch_over=%d mid_small=%d mid_big=%d freed=%d", zero,
                   p0 == NULL, huge, huge2, pitch_over, mid_small, mid_big, freed);
        } else if (!strcmp(cmd, "sigwait") && n >= 2) {
            /* A program that takes its signals synchronously blocks them in
             * every thread it has; a thread of someone else's that leaves
             * them unblocked gets them instead (SIGUSR1's default: death). */
            sigset_t set;
            sigemptyset(&set);
            sigaddset(&set, SIGUSR1);
            pthread_sigmask(SIG_BLOCK, &set, NULL);
            struct timespec wait = {2, 0};
            int got = 0;
            for (int i = 0; i < atoi(a); i++) {
                kill(getpid(), SIGUSR1);
                if (sigtimedwait(&set, NULL, &wait) == SIGUSR1) got++;
            }
            pthread_sigmask(SIG_UNBLOCK, &set, NULL);
            answer("ok got=%d", got);
        } else if (!strcmp(cmd, "mallocbench") && n >= 3) {
            cmd_mallocbench(atoi(a), (size_t)x);
        } else {
            answer("err unknown command: %s", cmd);
        }
    next:;
    }
    return 0;
}
