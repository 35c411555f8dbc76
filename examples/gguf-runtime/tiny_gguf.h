/*
 * A minimal GGUF v3 writer for the example and tests (little-endian hosts):
 * a few metadata pairs and tensors of any ggml type, data aligned to 32.
 * Real runtimes get their files from llama.cpp's tools; this only lets the
 * example run with nothing downloaded.
 */
#ifndef VMMW_TINY_GGUF_H
#define VMMW_TINY_GGUF_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char* name;
  uint32_t ggml_type; /* GGML_TYPE_* number */
  uint32_t n_dims;
  uint64_t ne[4];     /* ggml order: ne[0] is the row length */
  const uint8_t* data;
  uint64_t nbytes;
} tiny_tensor_t;

static void tiny_put(FILE* f, const void* p, size_t n) {
  if (fwrite(p, 1, n, f) != n) { perror("write"); exit(1); }
}
static void tiny_u32(FILE* f, uint32_t v) { tiny_put(f, &v, 4); }
static void tiny_u64(FILE* f, uint64_t v) { tiny_put(f, &v, 8); }
static void tiny_str(FILE* f, const char* s) {
  tiny_u64(f, strlen(s));
  tiny_put(f, s, strlen(s));
}
static uint64_t tiny_align(uint64_t x) { return (x + 31) / 32 * 32; }

/* Write `n` tensors with metadata general.architecture = `arch` and
 * example.layers = `layers` (uint32). */
static void tiny_gguf_write(const char* path, const char* arch, uint32_t layers,
                            const tiny_tensor_t* t, size_t n) {
  FILE* f = fopen(path, "wb");
  if (!f) { perror(path); exit(1); }
  tiny_put(f, "GGUF", 4);
  tiny_u32(f, 3);
  tiny_u64(f, n);
  tiny_u64(f, 2);
  tiny_str(f, "general.architecture");
  tiny_u32(f, 8); /* string */
  tiny_str(f, arch);
  tiny_str(f, "example.layers");
  tiny_u32(f, 4); /* uint32 */
  tiny_u32(f, layers);
  uint64_t off = 0;
  for (size_t i = 0; i < n; ++i) {
    tiny_str(f, t[i].name);
    tiny_u32(f, t[i].n_dims);
    for (uint32_t d = 0; d < t[i].n_dims; ++d) tiny_u64(f, t[i].ne[d]);
    tiny_u32(f, t[i].ggml_type);
    tiny_u64(f, off);
    off = tiny_align(off + t[i].nbytes);
  }
  static const uint8_t zeros[32] = {0};
  long pos = ftell(f);
  tiny_put(f, zeros, (size_t)(tiny_align((uint64_t)pos) - (uint64_t)pos));
  for (size_t i = 0; i < n; ++i) {
    tiny_put(f, t[i].data, t[i].nbytes);
    tiny_put(f, zeros, (size_t)(tiny_align(t[i].nbytes) - t[i].nbytes));
  }
  fclose(f);
}

#endif
