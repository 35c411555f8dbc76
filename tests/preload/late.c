/*
 * A program that loads its CUDA runtime late, as Python does when it
 * imports torch: not linked against any runtime, it first asks the
 * interposer about its region and tag (a layer probing at import), then
 * dlopens the runtime named by argv[1] with RTLD_GLOBAL and calls
 * cudaMalloc through the global scope, where LD_PRELOAD puts the
 * interposer first. Driven by tests/preload/twin.py (late_flow).
 *
 * Prints, one line each:
 *   "probed region=R tag=T"                   before the runtime is loaded
 *   "allocated rc=N socket_var=0|1 STATUS"    after the first cudaMalloc
 *                                             (STATUS: vmmw_preload_status)
 * then waits for a line on stdin (the test sleeps and wakes it meanwhile)
 * and prints "verified ok" or "verified bad".
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIZE ((size_t)4 << 20)

typedef int (*malloc_fn)(void **, size_t);
typedef int (*memcpy_fn)(void *, const void *, size_t, int);

static void *need(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) {
        printf("err no %s\n", name);
        fflush(stdout);
        exit(1);
    }
    return p;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s RUNTIME.so\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    int (*region)(void) = (int (*)(void))need(RTLD_DEFAULT, "vmmw_preload_region");
    int (*get_tag)(char *, size_t, size_t *) =
        (int (*)(char *, size_t, size_t *))need(RTLD_DEFAULT, "vmmw_preload_get_tag");
    char tag[128] = "";
    size_t needed = 0;
    int r = region();
    get_tag(tag, sizeof tag, &needed);
    printf("probed region=%d tag=%s\n", r, tag);

    if (!dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL)) {
        printf("err dlopen: %s\n", dlerror());
        return 1;
    }
    malloc_fn cuda_malloc = (malloc_fn)need(RTLD_DEFAULT, "cudaMalloc");
    memcpy_fn cuda_memcpy = (memcpy_fn)need(RTLD_DEFAULT, "cudaMemcpy");
    unsigned char *host = malloc(SIZE), *back = malloc(SIZE);
    for (size_t i = 0; i < SIZE; i++) host[i] = (unsigned char)(i * 31 + 7);
    void *dev = NULL;
    int rc = cuda_malloc(&dev, SIZE);
    if (rc == 0) rc = cuda_memcpy(dev, host, SIZE, 1 /* host to device */);
    int (*status)(char *, size_t, size_t *) =
        (int (*)(char *, size_t, size_t *))need(RTLD_DEFAULT, "vmmw_preload_status");
    static char doc[1 << 16];
    status(doc, sizeof doc, &needed);
    printf("allocated rc=%d socket_var=%d %s\n", rc, getenv("VMMW_CONTROL_SOCKET") != NULL, doc);

    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 1;
    rc = cuda_memcpy(back, dev, SIZE, 2 /* device to host */);
    printf("verified %s\n", rc == 0 && memcmp(host, back, SIZE) == 0 ? "ok" : "bad");
    return 0;
}
