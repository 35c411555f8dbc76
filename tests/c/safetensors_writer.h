/* Writes small safetensors files for the tests and examples (header-only). */
#ifndef VMMW_SAFETENSORS_WRITER_H
#define VMMW_SAFETENSORS_WRITER_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct {
  const char* name;
  const char* dtype; /* "F32", "BF16", ... */
  uint64_t shape[4];
  int ndim;
  const void* data;
  uint64_t bytes;
} st_tensor;

/* Write `n` tensors to `path`; returns 0 on success. */
static int st_write(const char* path, const st_tensor* t, int n) {
  char header[4096];
  size_t len = 0;
  uint64_t offset = 0;
  len += (size_t)snprintf(header + len, sizeof header - len, "{");
  for (int i = 0; i < n; ++i) {
    len += (size_t)snprintf(header + len, sizeof header - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                            i ? "," : "", t[i].name, t[i].dtype);
    for (int d = 0; d < t[i].ndim; ++d)
      len += (size_t)snprintf(header + len, sizeof header - len, "%s%llu", d ? "," : "",
                              (unsigned long long)t[i].shape[d]);
    len += (size_t)snprintf(header + len, sizeof header - len, "],\"data_offsets\":[%llu,%llu]}",
                            (unsigned long long)offset, (unsigned long long)(offset + t[i].bytes));
    offset += t[i].bytes;
  }
  len += (size_t)snprintf(header + len, sizeof header - len, "}");
  while (len % 8 != 0) header[len++] = ' '; /* data starts 8-byte aligned */
  FILE* f = fopen(path, "wb");
  if (!f) return -1;
  unsigned char n8[8];
  for (int i = 0; i < 8; ++i) n8[i] = (unsigned char)(((uint64_t)len >> (8 * i)) & 0xff);
  int ok = fwrite(n8, 1, 8, f) == 8 && fwrite(header, 1, len, f) == len;
  for (int i = 0; i < n && ok; ++i) ok = fwrite(t[i].data, 1, (size_t)t[i].bytes, f) == t[i].bytes;
  return (fclose(f) == 0 && ok) ? 0 : -1;
}

#endif
