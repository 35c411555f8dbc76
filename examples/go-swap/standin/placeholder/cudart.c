/*
 * Placeholder for the interposer's stand-in CUDA runtime while it is being
 * written: device memory is host memory, and placeholder_sleep/wake stand
 * for the interposer's control channel (the stand-in server answers the
 * control protocol with them when STANDIN_FAKE_CONTROL=1). Sleep copies
 * every allocation out (unless discarding) and scribbles over it, so a
 * server that touches its memory asleep computes garbage.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct alloc {
    void *ptr;
    size_t size;
    void *backup;
    struct alloc *next;
} alloc;
static alloc *allocs;
static int asleep;

int cudaMalloc(void **p, size_t n) {
    alloc *a = calloc(1, sizeof *a);
    if (!a || !(a->ptr = malloc(n ? n : 1)))
        return 2;
    a->size = n;
    a->next = allocs;
    allocs = a;
    *p = a->ptr;
    return 0;
}

int cudaFree(void *p) {
    for (alloc **a = &allocs; *a; a = &(*a)->next)
        if ((*a)->ptr == p) {
            alloc *x = *a;
            *a = x->next;
            free(x->ptr);
            free(x->backup);
            free(x);
            return 0;
        }
    return 1;
}

int cudaMemcpy(void *dst, const void *src, size_t n, int kind) {
    (void)kind;
    memmove(dst, src, n);
    return 0;
}

int cudaDeviceSynchronize(void) { return 0; }

uint64_t placeholder_bytes(void) {
    uint64_t n = 0;
    for (alloc *a = allocs; a; a = a->next)
        n += a->size;
    return n;
}

uint64_t placeholder_backup_bytes(void) {
    uint64_t n = 0;
    for (alloc *a = allocs; a; a = a->next)
        if (a->backup)
            n += a->size;
    return n;
}

int placeholder_asleep(void) { return asleep; }

int placeholder_sleep(int discard) {
    if (asleep)
        return 1;
    for (alloc *a = allocs; a; a = a->next) {
        if (!discard) {
            if (!(a->backup = malloc(a->size ? a->size : 1)))
                return 2;
            memcpy(a->backup, a->ptr, a->size);
        }
        memset(a->ptr, 0xa5, a->size);
    }
    asleep = 1;
    return 0;
}

int placeholder_wake(void) {
    if (!asleep)
        return 1;
    for (alloc *a = allocs; a; a = a->next)
        if (a->backup) {
            memcpy(a->ptr, a->backup, a->size);
            free(a->backup);
            a->backup = NULL;
        }
    asleep = 0;
    return 0;
}
