/*
 * C ABI tests of packed checkpoints on the host backend: vmmw_pack and
 * vmmw_unpack give the file back byte for byte, with a progress callback
 * and a report; the packed file loads through vmmw_loader_open like any
 * checkpoint and holds the original bytes; bad arguments and an existing
 * output are refused with nothing written.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "safetensors_writer.h"

#define N (300 * 1024) /* bf16 elements: several 64 KiB frames */

static int32_t count_calls(uint64_t done, uint64_t total, void* user) {
  CHECK(done <= total);
  ++*(int*)user;
  return 0;
}

static long file_bytes(const char* path, unsigned char** out) {
  FILE* f = fopen(path, "rb");
  CHECK(f != NULL);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  *out = (unsigned char*)malloc((size_t)n);
  CHECK(*out != NULL && fread(*out, 1, (size_t)n, f) == (size_t)n);
  fclose(f);
  return n;
}

int main(void) {
  char dir[] = "/tmp/vmmw-test-pack-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[256], packed[256], back[256];
  snprintf(path, sizeof path, "%s/m.safetensors", dir);
  snprintf(packed, sizeof packed, "%s/m.packed", dir);
  snprintf(back, sizeof back, "%s/back.safetensors", dir);

  /* bf16 values of a few binades, as trained weights have. */
  uint16_t* w = (uint16_t*)malloc(N * sizeof *w);
  CHECK(w != NULL);
  uint32_t x = 12345;
  for (int i = 0; i < N; ++i) {
    x = x * 1664525u + 1013904223u;
    w[i] = (uint16_t)(((x >> 16) & 0x807F) | ((120u + (x >> 30)) << 7));
  }
  st_tensor t[] = {{"w", "BF16", {N, 0, 0, 0}, 1, w, N * sizeof *w}};
  CHECK(st_write(path, t, 1) == 0);

  vmmw_pack_options_t po;
  memset(&po, 0, sizeof po);
  po.size = sizeof po;
  po.frame_bytes = 64 << 10;
  po.cpu = 1;
  po.threads = 2;
  int calls = 0;
  vmmw_pack_report_t rep;
  memset(&rep, 0, sizeof rep);
  CHECK_OK(vmmw_pack(path, packed, &po, count_calls, &calls, &rep, &err));
  CHECK(calls > 0 && rep.files == 1 && rep.tensors == 1);
  CHECK(rep.packed_bytes < rep.original_bytes * 3 / 4);

  /* Refused, nothing written: NULL paths, an existing output, a packed input. */
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pack(NULL, packed, &po, NULL, NULL, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_unpack(packed, NULL, NULL, NULL, NULL, NULL, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pack(path, packed, &po, NULL, NULL, NULL, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pack(packed, back, &po, NULL, NULL, NULL, NULL));
  CHECK(access(back, F_OK) != 0);

  CHECK_OK(vmmw_unpack(packed, back, NULL, NULL, NULL, &rep, &err));
  unsigned char *a, *b;
  long na = file_bytes(path, &a), nb = file_bytes(back, &b);
  CHECK(na == nb && memcmp(a, b, (size_t)na) == 0);
  free(a);
  free(b);

  /* The packed file loads as any checkpoint. */
  vmmw_pool_options_t opts;
  memset(&opts, 0, sizeof opts);
  opts.size = sizeof opts;
  opts.backend = VMMW_BACKEND_HOST;
  vmmw_pool_t* pool = NULL;
  CHECK_OK(vmmw_pool_new(&opts, &pool, &err));
  uint32_t tag = 0;
  CHECK_OK(vmmw_tag_id("pack-weights", &tag, &err));
  vmmw_loader_t* ld = NULL;
  CHECK_OK(vmmw_loader_open(packed, &ld, &err));
  CHECK_OK(vmmw_loader_allocate(ld, pool, tag, &err));
  CHECK_OK(vmmw_loader_load(ld, pool, NULL, NULL, &err));
  vmmw_destination_t d;
  CHECK_OK(vmmw_loader_destination(ld, "w", &d, &err));
  uint16_t* got = (uint16_t*)malloc(N * sizeof *got);
  CHECK(got != NULL);
  CHECK_OK(vmmw_pool_read(pool, d.ptr, got, N * sizeof *got, &err));
  CHECK(memcmp(got, w, N * sizeof *w) == 0);
  free(got);
  free(w);
  vmmw_loader_free(ld);
  vmmw_pool_free(pool);
  unlink(path);
  unlink(packed);
  unlink(back);
  rmdir(dir);
  printf("test_pack: %d checks passed\n", g_checks);
  return 0;
}
