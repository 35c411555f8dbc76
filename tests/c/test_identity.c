/*
 * C ABI tests of destination identity on the host backend: a loader never
 * writes into memory that changed hands. A destination whose block was freed
 * with vmmw_pool_dealloc and handed to a new owner at the same address is
 * refused (VMMW_UNKNOWN_POINTER, naming it) with the new owner's bytes
 * intact, by vmmw_loader_load and by vmmw_loader_load_devices; a Reload wake
 * after the refused load keeps them too. Also an arena whose reservation the
 * driver cannot make: VMMW_OUT_OF_MEMORY, as an impossible block is.
 *
 * VMMW_IDENTITY_BACKEND=cuda runs the pools on the CUDA backend instead
 * (scripts/gpu.d/72-identity.sh); the two-device part then needs two devices
 * and says SKIP with one.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "safetensors_writer.h"

static float wa[4 * 3], wb[5];
static int32_t g_backend = VMMW_BACKEND_HOST;

/* What the new owner writes into the block it was handed. */
#define NEW_OWNER 0x55

static int all_bytes(vmmw_pool_t* pool, uint64_t ptr, size_t n, unsigned char want) {
  unsigned char buf[64];
  CHECK(n <= sizeof buf);
  CHECK_OK(vmmw_pool_read(pool, ptr, buf, n, &err));
  for (size_t i = 0; i < n; ++i)
    if (buf[i] != want) return 0;
  return 1;
}

/* Free `d`'s block and give its address to a new owner writing NEW_OWNER. */
static void change_hands(vmmw_pool_t* pool, uint32_t tag, const vmmw_destination_t* d) {
  unsigned char mine[64];
  CHECK(d->bytes <= sizeof mine);
  memset(mine, NEW_OWNER, sizeof mine);
  CHECK_OK(vmmw_pool_dealloc(pool, d->ptr, &err));
  uint64_t again = 0;
  CHECK_OK(vmmw_pool_alloc_tagged(pool, d->bytes, tag, &again, &err));
  CHECK(again == d->ptr); /* the pool hands the same address out again */
  CHECK_OK(vmmw_pool_write(pool, again, mine, d->bytes, &err));
}

/* The refusal names the destination (call first: `e` is read afterwards). */
static void check_refused(vmmw_status_t rc, vmmw_error_t* e, const char* name) {
  CHECK(rc == VMMW_UNKNOWN_POINTER);
  CHECK(e != NULL && strstr(vmmw_error_message(e), name) != NULL);
  CHECK(strstr(vmmw_error_message(e), "changed hands") != NULL);
  vmmw_error_free(e);
}

static void test_single(const char* path) {
  vmmw_pool_options_t opts;
  memset(&opts, 0, sizeof opts);
  opts.size = sizeof opts;
  opts.backend = g_backend;
  vmmw_pool_t* pool = NULL;
  CHECK_OK(vmmw_pool_new(&opts, &pool, &err));
  uint32_t tag = 0;
  CHECK_OK(vmmw_tag_id("identity-c-single", &tag, &err));
  vmmw_loader_t* ld = NULL;
  CHECK_OK(vmmw_loader_open(path, &ld, &err));
  CHECK_OK(vmmw_loader_allocate(ld, pool, tag, &err));
  CHECK_OK(vmmw_loader_load(ld, pool, NULL, NULL, &err));
  vmmw_destination_t da, db;
  CHECK_OK(vmmw_loader_destination(ld, "a.weight", &da, &err));
  CHECK_OK(vmmw_loader_destination(ld, "b.bias", &db, &err));

  change_hands(pool, tag, &da);
  unsigned char pattern[sizeof wb];
  memset(pattern, 0xA5, sizeof pattern);
  CHECK_OK(vmmw_pool_write(pool, db.ptr, pattern, sizeof pattern, &err));
  vmmw_error_t* e = NULL;
  vmmw_status_t rc = vmmw_loader_load(ld, pool, NULL, NULL, &e);
  check_refused(rc, e, "a.weight");
  CHECK(all_bytes(pool, da.ptr, da.bytes, NEW_OWNER)); /* the new owner's bytes */
  CHECK(all_bytes(pool, db.ptr, db.bytes, 0xA5));      /* and no other byte moved */
  /* Refused again: the check is not a one-off. */
  CHECK_STATUS(VMMW_UNKNOWN_POINTER, vmmw_loader_load(ld, pool, NULL, NULL, NULL));

  /* A Reload wake after the refused load keeps the new owner's bytes. */
  vmmw_tag_policy_t item = {tag, VMMW_POLICY_RELOAD};
  CHECK_OK(vmmw_pool_sleep(pool, &item, 1, &err));
  CHECK_OK(vmmw_pool_wake(pool, &tag, 1, &err));
  CHECK(all_bytes(pool, da.ptr, da.bytes, NEW_OWNER));

  /* A loader that registers the new block loads into it. */
  vmmw_loader_t* again = NULL;
  CHECK_OK(vmmw_loader_open(path, &again, &err));
  uint64_t shape[2] = {4, 3};
  CHECK_OK(vmmw_loader_register(again, "a.weight", da.ptr, "F32", shape, 2, &err));
  vmmw_load_options_t lo;
  memset(&lo, 0, sizeof lo);
  lo.size = sizeof lo;
  lo.allow_unexpected = 1;
  CHECK_OK(vmmw_loader_set_options(again, &lo, &err));
  CHECK_OK(vmmw_loader_load(again, pool, NULL, NULL, &err));
  float back[12];
  CHECK_OK(vmmw_pool_read(pool, da.ptr, back, sizeof back, &err));
  CHECK(memcmp(back, wa, sizeof wa) == 0);

  /* Freed and not handed out again: refused the same way. */
  CHECK_OK(vmmw_pool_dealloc(pool, da.ptr, &err));
  e = NULL;
  rc = vmmw_loader_load(again, pool, NULL, NULL, &e);
  check_refused(rc, e, "a.weight");
  vmmw_loader_free(again);
  vmmw_loader_free(ld);
  vmmw_pool_free(pool);
}

static void test_devices(const char* path) {
  vmmw_device_t* dev[2] = {NULL, NULL};
  vmmw_pool_t* pools[2] = {NULL, NULL};
  vmmw_loader_t* lds[2] = {NULL, NULL};
  uint32_t tag = 0;
  CHECK_OK(vmmw_tag_id("identity-c-devices", &tag, &err));
  if (vmmw_device_open(g_backend, 1, &dev[1], NULL) != VMMW_OK) {
    printf("test_identity: SKIP the two-device part: device 1 does not open\n");
    return;
  }
  vmmw_device_free(dev[1]);
  dev[1] = NULL;
  for (int d = 0; d < 2; ++d) {
    CHECK_OK(vmmw_device_open(g_backend, d, &dev[d], &err));
    vmmw_pool_options_t opts;
    memset(&opts, 0, sizeof opts);
    opts.size = sizeof opts;
    opts.device_handle = dev[d];
    CHECK_OK(vmmw_pool_new(&opts, &pools[d], &err));
    CHECK_OK(vmmw_loader_open(path, &lds[d], &err));
    CHECK_OK(vmmw_loader_allocate(lds[d], pools[d], tag, &err));
  }
  CHECK_OK(vmmw_loader_load_devices(lds, pools, 2, VMMW_MULTI_REPLICAS, NULL, &err));
  vmmw_destination_t da;
  CHECK_OK(vmmw_loader_destination(lds[1], "a.weight", &da, &err));
  change_hands(pools[1], tag, &da);
  vmmw_error_t* e = NULL;
  vmmw_status_t rc = vmmw_loader_load_devices(lds, pools, 2, VMMW_MULTI_REPLICAS, NULL, &e);
  check_refused(rc, e, "a.weight");
  CHECK(all_bytes(pools[1], da.ptr, da.bytes, NEW_OWNER));
  e = NULL;
  rc = vmmw_loader_load_devices(lds, pools, 2, VMMW_MULTI_RANKS, NULL, &e);
  check_refused(rc, e, "a.weight");
  CHECK(all_bytes(pools[1], da.ptr, da.bytes, NEW_OWNER));
  vmmw_tag_policy_t item = {tag, VMMW_POLICY_RELOAD};
  CHECK_OK(vmmw_pool_sleep(pools[1], &item, 1, &err));
  CHECK_OK(vmmw_pool_wake(pools[1], &tag, 1, &err));
  CHECK(all_bytes(pools[1], da.ptr, da.bytes, NEW_OWNER));
  for (int d = 0; d < 2; ++d) {
    vmmw_loader_free(lds[d]);
    vmmw_pool_free(pools[d]);
    vmmw_device_free(dev[d]);
  }
}

static void test_arena_out_of_memory(void) {
  vmmw_pool_options_t opts;
  memset(&opts, 0, sizeof opts);
  opts.size = sizeof opts;
  opts.backend = g_backend;
  vmmw_pool_t* pool = NULL;
  CHECK_OK(vmmw_pool_new(&opts, &pool, &err));
  uint32_t tag = 0;
  CHECK_OK(vmmw_tag_id("identity-c-arena", &tag, &err));
  /* 2^56 bytes: the documented limit, more address space than there is. */
  CHECK_OK(vmmw_pool_set_tag_arena(pool, tag, (uint64_t)1 << 56, 0, &err));
  uint64_t ptr = 7;
  CHECK_STATUS(VMMW_OUT_OF_MEMORY, vmmw_pool_alloc_tagged(pool, 4096, tag, &ptr, NULL));
  CHECK(ptr == 7); /* out-parameter untouched */
  /* As the ordinary path reports an impossible block. */
  CHECK_STATUS(VMMW_OUT_OF_MEMORY, vmmw_pool_alloc(pool, (uint64_t)1 << 56, &ptr, NULL));
  vmmw_report_t r;
  CHECK_OK(vmmw_pool_report_tag(pool, tag, &r, &err));
  CHECK(r.live_blocks == 0 && r.reserved_bytes == 0);
  vmmw_pool_free(pool);
}

int main(void) {
  const char* b = getenv("VMMW_IDENTITY_BACKEND");
  if (b != NULL && strcmp(b, "cuda") == 0) g_backend = VMMW_BACKEND_CUDA;
  char dir[] = "/tmp/vmmw-c-identity-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[256];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  for (int i = 0; i < 12; ++i) wa[i] = (float)i * 0.5f + 1.0f;
  for (int i = 0; i < 5; ++i) wb[i] = (float)(10 + i);
  st_tensor ts[2] = {
      {"a.weight", "F32", {4, 3}, 2, wa, sizeof wa},
      {"b.bias", "F32", {5}, 1, wb, sizeof wb},
  };
  CHECK(st_write(path, ts, 2) == 0);

  test_single(path);
  test_devices(path);
  test_arena_out_of_memory();

  unlink(path);
  rmdir(dir);
  printf("test_identity: %d checks passed\n", g_checks);
  return 0;
}
