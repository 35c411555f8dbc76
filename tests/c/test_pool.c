/*
 * C ABI tests over tags and the pool on the host backend: allocation under
 * tag scopes, per-tag reports, free/trim, bad pointers, the JSON report's
 * buffer contract, copies in and out, and the process-global pool.
 */
#include <stdint.h>

#include "check.h"

static void test_tags(void) {
  uint32_t a = 0, b = 0, again = 0, cur = 99;
  CHECK_OK(vmmw_tag_id("c-weights", &a, &err));
  CHECK_OK(vmmw_tag_id("c-kv", &b, &err));
  CHECK_OK(vmmw_tag_id("c-weights", &again, &err));
  CHECK(a == again && a != b && a != VMMW_TAG_DEFAULT);
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_tag_id("", &again, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_tag_id(NULL, &again, NULL));

  char name[32];
  CHECK_OK(vmmw_tag_name(a, name, sizeof name, NULL, &err));
  CHECK(strcmp(name, "c-weights") == 0);
  CHECK_STATUS(VMMW_UNKNOWN_TAG, vmmw_tag_name(100000, name, sizeof name, NULL, NULL));

  CHECK_OK(vmmw_tag_current(&cur, &err));
  CHECK(cur == VMMW_TAG_DEFAULT);
  CHECK_OK(vmmw_tag_push(a, &err));
  CHECK_OK(vmmw_tag_push(b, &err));
  CHECK_OK(vmmw_tag_current(&cur, &err));
  CHECK(cur == b);
  CHECK_OK(vmmw_tag_pop(&err));
  CHECK_OK(vmmw_tag_current(&cur, &err));
  CHECK(cur == a);
  CHECK_OK(vmmw_tag_pop(&err));
  vmmw_error_t* err = NULL;
  CHECK(vmmw_tag_pop(&err) == VMMW_INVALID_STATE); /* unbalanced pop changes nothing */
  CHECK(strstr(vmmw_error_message(err), "push") != NULL);
  vmmw_error_free(err);
  CHECK_STATUS(VMMW_UNKNOWN_TAG, vmmw_tag_push(100000, NULL));
}

static void test_pool(void) {
  vmmw_pool_options_t opts;
  memset(&opts, 0, sizeof opts);
  opts.size = sizeof opts;
  opts.backend = VMMW_BACKEND_HOST;
  vmmw_pool_t* pool = NULL;
  CHECK_OK(vmmw_pool_new(&opts, &pool, &err));
  uint32_t w = 0, kv = 0;
  CHECK_OK(vmmw_tag_id("c-weights", &w, &err));
  CHECK_OK(vmmw_tag_id("c-kv", &kv, &err));

  /* Blocks get the thread's current tag. */
  uint64_t p1 = 0, p2 = 0, p3 = 0;
  CHECK_OK(vmmw_tag_push(w, &err));
  CHECK_OK(vmmw_pool_alloc(pool, 3u << 20, &p1, &err));
  CHECK_OK(vmmw_pool_alloc(pool, 1000, &p2, &err));
  CHECK_OK(vmmw_tag_pop(&err));
  CHECK_OK(vmmw_pool_alloc_tagged(pool, 5000, kv, &p3, &err));
  CHECK(p1 && p2 && p3 && p1 != p2);

  vmmw_report_t total, rw, rkv;
  CHECK_OK(vmmw_pool_report(pool, &total, &err));
  CHECK_OK(vmmw_pool_report_tag(pool, w, &rw, &err));
  CHECK_OK(vmmw_pool_report_tag(pool, kv, &rkv, &err));
  CHECK(rw.live_blocks == 2 && rkv.live_blocks == 1 && total.live_blocks == 3);
  CHECK(rw.live_bytes >= (3u << 20) + 1000 && rkv.live_bytes >= 5000);
  CHECK(total.live_bytes == rw.live_bytes + rkv.live_bytes);
  CHECK(total.tracked_bytes >= total.live_bytes && total.reserved_bytes >= total.tracked_bytes);
  CHECK(total.tags == 2 && rw.tags == 1 && total.asleep == 0);

  /* Copies in and out; ranges outside the pool are refused. */
  unsigned char in[4096], out[4096];
  for (int i = 0; i < 4096; ++i) in[i] = (unsigned char)(i ^ 0x5a);
  CHECK_OK(vmmw_pool_write(pool, p1 + 100, in, sizeof in, &err));
  CHECK_OK(vmmw_pool_read(pool, p1 + 100, out, sizeof out, &err));
  CHECK(memcmp(in, out, sizeof in) == 0);
  CHECK_STATUS(VMMW_UNKNOWN_POINTER, vmmw_pool_read(pool, 16, out, 4, NULL));

  /* JSON report: size query, then the text. */
  size_t needed = 0;
  CHECK_STATUS(VMMW_BUFFER_TOO_SMALL, vmmw_pool_report_json(pool, NULL, 0, &needed, NULL));
  char* json = (char*)malloc(needed);
  CHECK_OK(vmmw_pool_report_json(pool, json, needed, &needed, &err));
  CHECK(strstr(json, "\"c-weights\"") != NULL && strstr(json, "\"live_bytes\"") != NULL);
  free(json);
  CHECK_OK(vmmw_pool_snapshot(pool, "after alloc", &err));
  CHECK_STATUS(VMMW_BUFFER_TOO_SMALL, vmmw_pool_timeline_json(pool, NULL, 0, &needed, NULL));
  json = (char*)malloc(needed);
  CHECK_OK(vmmw_pool_timeline_json(pool, json, needed, NULL, &err));
  CHECK(strstr(json, "after alloc") != NULL);
  free(json);

  /* Free, double free, bad pointer, trim. */
  CHECK_OK(vmmw_pool_dealloc(pool, p1, &err));
  vmmw_error_t* err = NULL;
  CHECK(vmmw_pool_dealloc(pool, p1, &err) == VMMW_UNKNOWN_POINTER);
  CHECK(strstr(vmmw_error_message(err), "0x") != NULL);
  vmmw_error_free(err);
  CHECK_STATUS(VMMW_UNKNOWN_POINTER, vmmw_pool_dealloc(pool, 12345, NULL));
  CHECK_OK(vmmw_pool_dealloc(pool, p2, &err));
  CHECK_OK(vmmw_pool_dealloc(pool, p3, &err));
  uint64_t released = 0;
  CHECK_OK(vmmw_pool_trim(pool, &released, &err));
  CHECK(released > 0);
  CHECK_OK(vmmw_pool_report(pool, &total, &err));
  CHECK(total.live_bytes == 0 && total.tracked_bytes == 0);
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pool_alloc(pool, 0, &p1, NULL));

  /* Arena mode for a tag. */
  CHECK_OK(vmmw_pool_set_tag_arena(pool, w, 64u << 20, 0, &err));
  CHECK_OK(vmmw_pool_alloc_tagged(pool, 3u << 20, w, &p1, &err));
  CHECK_OK(vmmw_pool_report_tag(pool, w, &rw, &err));
  CHECK(rw.reserved_bytes >= (64u << 20) && rw.tracked_bytes < (64u << 20));
  CHECK_OK(vmmw_pool_dealloc(pool, p1, &err));
  vmmw_pool_free(pool);
}

static void test_pool_on_device_handle(void) {
  vmmw_device_t* dev = NULL;
  CHECK_OK(vmmw_device_open(VMMW_BACKEND_HOST, 0, &dev, &err));
  vmmw_pool_options_t opts;
  memset(&opts, 0, sizeof opts);
  opts.size = sizeof opts;
  opts.device_handle = dev;
  vmmw_pool_t* pool = NULL;
  CHECK_OK(vmmw_pool_new(&opts, &pool, &err));
  vmmw_host_counts_t c0, c1;
  CHECK_OK(vmmw_host_counts(dev, &c0, &err));
  CHECK_OK(vmmw_host_set_memory_limit(dev, 4u << 20, &err));
  uint64_t p = 0;
  CHECK_STATUS(VMMW_OUT_OF_MEMORY, vmmw_pool_alloc(pool, 64u << 20, &p, NULL));
  CHECK(p == 0);
  CHECK_OK(vmmw_host_counts(dev, &c1, &err));
  CHECK(c1.handles == c0.handles && c1.reservations == c0.reservations);
  vmmw_pool_free(pool);
  vmmw_device_free(dev);
  /* Bad options are refused. */
  memset(&opts, 0, sizeof opts);
  opts.size = sizeof opts;
  opts.backend = VMMW_BACKEND_HOST;
  opts.align = 3;
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pool_new(&opts, &pool, NULL));
}

static void test_global_pool(void) {
  vmmw_pool_t* a = NULL;
  vmmw_pool_t* b = NULL;
  CHECK_OK(vmmw_pool_default(0, &a, &err));
  CHECK_OK(vmmw_pool_default(0, &b, &err));
  CHECK(a == b);
  vmmw_pool_free(a); /* drops one reference; the registry keeps the pool */
  uint64_t p = 0;
  CHECK_OK(vmmw_pool_alloc(b, 4096, &p, &err));
  CHECK_OK(vmmw_pool_dealloc(b, p, &err));
  vmmw_pool_free(b);
  CHECK_OK(vmmw_pool_default(0, &a, &err)); /* the same pool, alive */
  CHECK(a == b);
  CHECK_OK(vmmw_pool_alloc(a, 4096, &p, &err));
  CHECK_OK(vmmw_pool_dealloc(a, p, &err));
  vmmw_pool_free(a);
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pool_default(-1, &a, NULL));
}

int main(void) {
  test_tags();
  test_pool();
  test_pool_on_device_handle();
  test_global_pool();
  printf("test_pool: %d checks passed\n", g_checks);
  return 0;
}
