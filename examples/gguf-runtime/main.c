/*
 * A ggml-style runtime's use of vmmweights: load a GGUF checkpoint in place
 * into pool memory, receive each tensor as such a runtime builds its tensor
 * table (name, ggml type number, ne[] in ggml order, data pointer, bytes),
 * read the model's metadata, then sleep the weights (device memory released,
 * pointers kept) and wake them, checking every byte.
 *
 * Usage: example-gguf-runtime [model.gguf]
 *   without one, a small model (Q8_0, Q4_0 and F32 tensors) is written to /tmp.
 * Sleep uses the Reload policy: wake reads the bytes again from the file,
 * nothing is kept on the host.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vmmweights.h"
#include "tiny_gguf.h"

#define TRY(call)                                                                          \
  do {                                                                                     \
    vmmw_error_t* err_ = NULL;                                                             \
    int32_t rc_ = (call);                                                                  \
    if (rc_ != VMMW_OK) {                                                                  \
      fprintf(stderr, "%s failed: %s: %s\n", #call, vmmw_status_name(rc_),                 \
              vmmw_error_message(err_));                                                   \
      vmmw_error_free(err_);                                                               \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

/* What a ggml runtime keeps per tensor. */
typedef struct {
  char name[128];
  uint32_t type;  /* GGML_TYPE_* */
  char type_name[16];
  int n_dims;
  uint64_t ne[4]; /* ne[0] fastest */
  uint64_t data;  /* device address */
  uint64_t nbytes;
  uint8_t* copy;  /* host copy, to check sleep and wake */
} runtime_tensor_t;

static uint8_t* pattern(uint64_t n, unsigned seed) {
  uint8_t* p = malloc(n);
  for (uint64_t i = 0; i < n; ++i) p[i] = (uint8_t)((i * 2654435761u + seed) >> 3);
  return p;
}

static void write_model(const char* path) {
  /* 4 rows of 256: Q8_0 is 8 blocks of 34 bytes a row, Q4_0 8 of 18. */
  uint8_t* q8 = pattern(4 * 8 * 34, 1);
  uint8_t* q4 = pattern(4 * 8 * 18, 2);
  uint8_t* f32 = pattern(256 * 4, 3);
  tiny_tensor_t t[] = {
      {"blk.0.attn_q.weight", 8, 2, {256, 4, 0, 0}, q8, 4 * 8 * 34},
      {"blk.0.ffn_up.weight", 2, 2, {256, 4, 0, 0}, q4, 4 * 8 * 18},
      {"output_norm.weight", 0, 1, {256, 0, 0, 0}, f32, 256 * 4},
  };
  tiny_gguf_write(path, "llama", 1, t, 3);
  free(q8);
  free(q4);
  free(f32);
}

int main(int argc, char** argv) {
  char dir[] = "/tmp/vmmw-gguf-runtime-XXXXXX";
  char path[512];
  if (argc > 1) {
    snprintf(path, sizeof path, "%s", argv[1]);
  } else {
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    write_model(path);
  }

  /* Metadata, as a runtime reads hyperparameters. */
  vmmw_metadata_t* meta = NULL;
  TRY(vmmw_metadata_open(path, &meta, &err_));
  size_t n_kv = 0, arch_i = 0;
  char arch[64] = "?";
  TRY(vmmw_metadata_count(meta, &n_kv, &err_));
  {
    vmmw_error_t* e = NULL;
    if (vmmw_metadata_find(meta, "general.architecture", &arch_i, &e) == VMMW_OK)
      TRY(vmmw_metadata_string(meta, arch_i, NULL, 0, arch, sizeof arch, NULL, &err_));
    vmmw_error_free(e);
  }
  printf("%s: %zu metadata pairs, architecture %s\n", path, n_kv, arch);

  vmmw_pool_t* pool = NULL;
  TRY(vmmw_pool_new(NULL, &pool, &err_));
  uint32_t weights = 0;
  TRY(vmmw_tag_id("weights", &weights, &err_));
  vmmw_loader_t* loader = NULL;
  TRY(vmmw_loader_open(path, &loader, &err_));
  TRY(vmmw_loader_allocate(loader, pool, weights, &err_));
  TRY(vmmw_loader_load(loader, pool, NULL, NULL, &err_));
  vmmw_load_result_t res;
  TRY(vmmw_loader_result(loader, &res, &err_));
  printf("loaded %llu bytes in %.3f s\n", (unsigned long long)res.bytes, res.seconds);

  /* The runtime's tensor table. */
  size_t n = 0;
  TRY(vmmw_loader_destination_count(loader, &n, &err_));
  runtime_tensor_t* table = calloc(n, sizeof *table);
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    runtime_tensor_t* rt = &table[i];
    TRY(vmmw_loader_destination_name(loader, i, rt->name, sizeof rt->name, NULL, &err_));
    vmmw_destination_t d;
    TRY(vmmw_loader_destination(loader, rt->name, &d, &err_));
    snprintf(rt->type_name, sizeof rt->type_name, "%s", d.dtype);
    size_t block = 0, type_size = 0;
    TRY(vmmw_ggml_type(d.dtype, &rt->type, &block, &type_size, &err_));
    /* Our shapes are row-major: ggml's ne[] is the shape reversed. */
    rt->n_dims = (int)d.ndim;
    uint64_t rows = 1;
    for (uint32_t k = 0; k < d.ndim; ++k) {
      rt->ne[k] = d.shape[d.ndim - 1 - k];
      if (k > 0) rows *= rt->ne[k];
    }
    rt->data = d.ptr;
    rt->nbytes = d.bytes;
    uint64_t want = rt->ne[0] / block * type_size * rows; /* ggml_nbytes */
    if (want != rt->nbytes) bad = 1;
    rt->copy = malloc(rt->nbytes);
    TRY(vmmw_pool_read(pool, rt->data, rt->copy, rt->nbytes, &err_));
    printf("  %-22s %-5s type %2u ne [%llu, %llu] at 0x%llx, %llu bytes%s\n", rt->name, rt->type_name,
           rt->type, (unsigned long long)rt->ne[0], (unsigned long long)rt->ne[1],
           (unsigned long long)rt->data, (unsigned long long)rt->nbytes,
           want == rt->nbytes ? "" : "  SIZE MISMATCH");
  }
  if (argc <= 1) {
    /* The bytes are the file's, exactly: compare with what was written. */
    uint8_t* q8 = pattern(4 * 8 * 34, 1);
    for (size_t i = 0; i < n; ++i)
      if (strcmp(table[i].name, "blk.0.attn_q.weight") == 0 &&
          (table[i].type != 8 || memcmp(table[i].copy, q8, table[i].nbytes) != 0))
        bad = 1;
    free(q8);
  }

  vmmw_tag_policy_t item = {weights, VMMW_POLICY_RELOAD};
  TRY(vmmw_pool_sleep(pool, &item, 1, &err_));
  vmmw_report_t r;
  TRY(vmmw_pool_report(pool, &r, &err_));
  printf("asleep: tracked %llu bytes, host backup %llu bytes\n", (unsigned long long)r.tracked_bytes,
         (unsigned long long)r.host_backup_bytes);
  TRY(vmmw_pool_wake(pool, &weights, 1, &err_));
  for (size_t i = 0; i < n; ++i) {
    uint8_t* now = malloc(table[i].nbytes);
    TRY(vmmw_pool_read(pool, table[i].data, now, table[i].nbytes, &err_));
    if (memcmp(now, table[i].copy, table[i].nbytes) != 0) {
      printf("  %s: bytes differ after wake\n", table[i].name);
      bad = 1;
    }
    free(now);
    free(table[i].copy);
  }
  printf("woke: every tensor at the same address with the same bytes: %s\n", bad ? "NO" : "yes");

  free(table);
  vmmw_loader_free(loader);
  vmmw_pool_free(pool);
  vmmw_metadata_free(meta);
  if (argc <= 1) {
    unlink(path);
    rmdir(dir);
  }
  return bad;
}
