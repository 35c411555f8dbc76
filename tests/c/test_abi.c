/*
 * ABI evolution tests: option structs of other sizes than this header's (a
 * program built against an older header passes a smaller struct, a newer one
 * a larger struct), named enum and status types, and the deprecated alias of
 * a renamed function. Built as C and as C++ by scripts/test.d/30-c.sh.
 */
#include <stddef.h>
#include <stdint.h>

#include "check.h"

static vmmw_error_t* err = NULL;

/* What an older header's vmmw_pool_options_t could have been: its first
 * fields only. The library must read these and default the rest. */
typedef struct {
  size_t size;
  const vmmw_device_t* device_handle;
  vmmw_backend_t backend;
} old_pool_options_t;

/* An older vmmw_sleep_options_t, cut after host_memory_limit. */
typedef struct {
  size_t size;
  uint64_t copy_piece_bytes;
  uint32_t streams;
  uint32_t debug_fill;
  uint64_t wake_coalesce_bytes;
  uint64_t backup_slab_bytes;
  uint64_t host_memory_limit;
} old_sleep_options_t;

/* A newer header's vmmw_load_options_t: one field more at the end. */
typedef struct {
  vmmw_load_options_t known;
  uint64_t added_later;
} new_load_options_t;

static void test_older_smaller_structs_still_work(void) {
  old_pool_options_t po;
  memset(&po, 0, sizeof po);
  po.size = sizeof po;
  po.backend = VMMW_BACKEND_HOST;
  vmmw_pool_t* pool = NULL;
  CHECK_OK(vmmw_pool_new((const vmmw_pool_options_t*)(const void*)&po, &pool, &err));
  CHECK(offsetof(old_pool_options_t, backend) == offsetof(vmmw_pool_options_t, backend));

  uint32_t w = 0;
  CHECK_OK(vmmw_tag_id("abi-old-struct", &w, &err));
  uint64_t p = 0;
  CHECK_OK(vmmw_pool_alloc_tagged(pool, 8u << 20, w, &p, &err));

  /* The older sleep options' last field is read: an offload over the limit fails up front. */
  old_sleep_options_t so;
  memset(&so, 0, sizeof so);
  so.size = sizeof so;
  so.host_memory_limit = 1u << 20;
  CHECK(offsetof(old_sleep_options_t, host_memory_limit) ==
        offsetof(vmmw_sleep_options_t, host_memory_limit));
  CHECK_OK(vmmw_pool_set_sleep_options(pool, (const vmmw_sleep_options_t*)(const void*)&so, &err));
  vmmw_tag_policy_t off = {w, VMMW_POLICY_OFFLOAD};
  CHECK_STATUS(VMMW_HOST_OUT_OF_MEMORY, vmmw_pool_sleep(pool, &off, 1, NULL));
  /* ... and the fields it lacks take their defaults: without the limit the same sleep works. */
  so.host_memory_limit = 0;
  CHECK_OK(vmmw_pool_set_sleep_options(pool, (const vmmw_sleep_options_t*)(const void*)&so, &err));
  CHECK_OK(vmmw_pool_sleep(pool, &off, 1, &err));
  CHECK_OK(vmmw_pool_wake(pool, &w, 1, &err));

  CHECK_OK(vmmw_pool_dealloc(pool, p, &err));
  vmmw_pool_free(pool);
}

static void test_unset_and_newer_sizes(void) {
  /* size 0 (never set): refused, and the message says what to do. */
  vmmw_pool_options_t po;
  memset(&po, 0, sizeof po);
  po.backend = VMMW_BACKEND_HOST;
  vmmw_pool_t* pool = NULL;
  CHECK(vmmw_pool_new(&po, &pool, &err) == VMMW_INVALID_ARGUMENT);
  CHECK(pool == NULL);
  CHECK(strstr(vmmw_error_message(err), "sizeof(vmmw_pool_options_t)") != NULL);
  vmmw_error_free(err);
  err = NULL;
  po.size = sizeof po;
  CHECK_OK(vmmw_pool_new(&po, &pool, &err));

  /* A newer, larger struct whose extra field is 0 (its default) is accepted ... */
  vmmw_loader_t* ld = NULL;
  CHECK(vmmw_loader_open("/nonexistent/model.safetensors", &ld, NULL) == VMMW_IO);
  /* (set_options needs a loader: open a tiny checkpoint) */
  const char* path = "/tmp/vmmw_test_abi.safetensors";
  static const char hdr[] = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}          ";
  FILE* f = fopen(path, "wb");
  CHECK(f != NULL);
  uint64_t n = sizeof hdr - 1;
  unsigned char n8[8];
  for (int i = 0; i < 8; ++i) n8[i] = (unsigned char)((n >> (8 * i)) & 0xff);
  float data[2] = {1.0f, 2.0f};
  CHECK(fwrite(n8, 1, 8, f) == 8 && fwrite(hdr, 1, n, f) == n && fwrite(data, 1, 8, f) == 8);
  CHECK(fclose(f) == 0);
  CHECK_OK(vmmw_loader_open(path, &ld, &err));

  new_load_options_t lo;
  memset(&lo, 0, sizeof lo);
  lo.known.size = sizeof lo;
  lo.known.strategy = VMMW_COPY_SIMPLE;
  CHECK_OK(vmmw_loader_set_options(ld, (const vmmw_load_options_t*)(const void*)&lo, &err));
  /* ... one that sets it is refused: the library cannot honour a setting it does not know. */
  lo.added_later = 1;
  CHECK(vmmw_loader_set_options(ld, (const vmmw_load_options_t*)(const void*)&lo, &err) ==
        VMMW_UNSUPPORTED);
  CHECK(strstr(vmmw_error_message(err), "newer header") != NULL);
  vmmw_error_free(err);
  err = NULL;
  /* Unknown enum values are refused too. */
  vmmw_load_options_t bad;
  memset(&bad, 0, sizeof bad);
  bad.size = sizeof bad;
  bad.strategy = (vmmw_copy_strategy_t)99;
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_set_options(ld, &bad, NULL));

  vmmw_loader_free(ld);
  vmmw_pool_free(pool);
  remove(path);
}

static void test_named_types_and_deprecated_alias(void) {
  vmmw_device_t* dev = NULL;
  CHECK_OK(vmmw_device_open(VMMW_BACKEND_HOST, 0, &dev, &err));
  vmmw_backend_t b = VMMW_BACKEND_AUTO;
  vmmw_status_t s = vmmw_device_backend(dev, &b, &err);
  CHECK(s == VMMW_OK && b == VMMW_BACKEND_HOST);
  vmmw_device_free(dev);

  vmmw_pool_options_t po;
  memset(&po, 0, sizeof po);
  po.size = sizeof po;
  po.backend = VMMW_BACKEND_HOST;
  vmmw_pool_t* pool = NULL;
  CHECK_OK(vmmw_pool_new(&po, &pool, &err));
  uint64_t p = 0;
  CHECK_OK(vmmw_pool_alloc(pool, 4096, &p, &err));
  /* The former name still works through 0.x (and warns: silenced here on purpose). */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
  CHECK_OK(vmmw_pool_free_ptr(pool, p, &err));
  CHECK_STATUS(VMMW_UNKNOWN_POINTER, vmmw_pool_free_ptr(pool, p, NULL));
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
  vmmw_pool_free(pool);
}

/* Every handle type vmmw_X_t has a vmmw_X_free that accepts NULL. */
static void test_every_free_accepts_null(void) {
  vmmw_device_free(NULL);
  vmmw_error_free(NULL);
  vmmw_loader_free(NULL);
  vmmw_pool_free(NULL);
  vmmw_segment_free(NULL);
  CHECK(1);
}

int main(void) {
  test_every_free_accepts_null();
  test_older_smaller_structs_still_work();
  test_unset_and_newer_sizes();
  test_named_types_and_deprecated_alias();
  printf("test_abi: %d checks passed\n", g_checks);
  return 0;
}
