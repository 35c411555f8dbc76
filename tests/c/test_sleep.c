/*
 * C ABI tests of sleep and wake on the host backend: offload keeps contents,
 * discard releases, pointers stay the same, sleeping memory is refused,
 * failures (bad policy, host-memory limit, device memory at wake) change
 * nothing and a later wake succeeds.
 */
#include <stdint.h>

#include "check.h"

enum { N = 1 << 16 };
static unsigned char pattern[N], back[N];

static void fill(uint32_t seed) {
  for (int i = 0; i < N; ++i) pattern[i] = (unsigned char)((i * 2654435761u + seed) >> 13);
}

int main(void) {
  vmmw_device_t* dev = NULL;
  CHECK_OK(vmmw_device_open(VMMW_BACKEND_HOST, 0, &dev, &err));
  vmmw_pool_options_t opts;
  memset(&opts, 0, sizeof opts);
  opts.size = sizeof opts;
  opts.device_handle = dev;
  vmmw_pool_t* pool = NULL;
  CHECK_OK(vmmw_pool_new(&opts, &pool, &err));
  uint32_t w = 0, kv = 0;
  CHECK_OK(vmmw_tag_id("sleep-weights", &w, &err));
  CHECK_OK(vmmw_tag_id("sleep-kv", &kv, &err));

  uint64_t pw = 0, pkv = 0, pw2 = 0;
  CHECK_OK(vmmw_pool_alloc_tagged(pool, 8u << 20, w, &pw, &err));
  CHECK_OK(vmmw_pool_alloc_tagged(pool, 4u << 20, kv, &pkv, &err));
  fill(1);
  CHECK_OK(vmmw_pool_write(pool, pw + 12345, pattern, N, &err));

  /* A bad policy is refused before anything moves. */
  vmmw_tag_policy_t bad[2] = {{w, VMMW_POLICY_OFFLOAD}, {kv, 7}};
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pool_sleep(pool, bad, 2, NULL));
  vmmw_report_t r;
  CHECK_OK(vmmw_pool_report(pool, &r, &err));
  CHECK(r.asleep == 0);
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_sleep(pool, NULL, 1, NULL));

  /* A tag this pool never held memory for (a misspelling) is refused at sleep
   * and wake, before anything moves: it would otherwise sleep nothing. */
  uint32_t typo = 0;
  CHECK_OK(vmmw_tag_id("sleep-weigths", &typo, &err));
  vmmw_tag_policy_t typo_items[2] = {{w, VMMW_POLICY_OFFLOAD}, {typo, VMMW_POLICY_OFFLOAD}};
  vmmw_error_t* typo_err = NULL;
  CHECK(vmmw_pool_sleep(pool, typo_items, 2, &typo_err) == VMMW_UNKNOWN_TAG);
  CHECK(strstr(vmmw_error_message(typo_err), "sleep-weigths") != NULL);
  vmmw_error_free(typo_err);
  CHECK_STATUS(VMMW_UNKNOWN_TAG, vmmw_pool_wake(pool, &typo, 1, NULL));
  CHECK_OK(vmmw_pool_report(pool, &r, &err));
  CHECK(r.asleep == 0);

  /* Host-memory limit: offload that does not fit fails before anything moves. */
  vmmw_sleep_options_t so;
  memset(&so, 0, sizeof so);
  so.size = sizeof so;
  so.host_memory_limit = 1u << 20;
  CHECK_OK(vmmw_pool_set_sleep_options(pool, &so, &err));
  vmmw_tag_policy_t off_w = {w, VMMW_POLICY_OFFLOAD};
  CHECK_STATUS(VMMW_HOST_OUT_OF_MEMORY, vmmw_pool_sleep(pool, &off_w, 1, NULL));
  CHECK_OK(vmmw_pool_read(pool, pw + 12345, back, N, &err));
  CHECK(memcmp(pattern, back, N) == 0);
  CHECK_OK(vmmw_pool_set_sleep_options(pool, NULL, &err));
  CHECK_OK(vmmw_pool_reserve_backup(pool, 8u << 20, &err));

  /* Sleep: weights offloaded, kv discarded. */
  vmmw_tag_policy_t items[2] = {{w, VMMW_POLICY_OFFLOAD}, {kv, VMMW_POLICY_DISCARD}};
  CHECK_OK(vmmw_pool_sleep(pool, items, 2, &err));
  vmmw_report_t rw, rkv;
  CHECK_OK(vmmw_pool_report_tag(pool, w, &rw, &err));
  CHECK_OK(vmmw_pool_report_tag(pool, kv, &rkv, &err));
  CHECK(rw.asleep == 1 && rw.tracked_bytes == 0 && rw.offloaded_bytes >= (8u << 20));
  CHECK(rw.host_backup_bytes >= (8u << 20));
  CHECK(rkv.asleep == 1 && rkv.tracked_bytes == 0 && rkv.discarded_bytes >= (4u << 20));
  CHECK(rw.live_bytes >= (8u << 20)); /* blocks stay live while asleep */
  size_t needed = 0;
  CHECK_STATUS(VMMW_BUFFER_TOO_SMALL, vmmw_pool_last_cycle_json(pool, NULL, 0, &needed, NULL));
  char* json = (char*)malloc(needed);
  CHECK_OK(vmmw_pool_last_cycle_json(pool, json, needed, NULL, &err));
  CHECK(strstr(json, "sleep-weights") != NULL && strstr(json, "offload") != NULL);
  free(json);

  /* Sleeping memory is refused, not faulted on; allocation in a sleeping tag too. */
  vmmw_error_t* err = NULL;
  CHECK(vmmw_pool_read(pool, pw + 12345, back, 16, &err) == VMMW_INVALID_STATE);
  CHECK(strstr(vmmw_error_message(err), "sleep-weights") != NULL);
  vmmw_error_free(err);
  CHECK_STATUS(VMMW_INVALID_STATE, vmmw_pool_alloc_tagged(pool, 4096, w, &pw2, NULL));

  /* The offloaded bytes read out of the host backup while asleep; the
   * discarded tag has none, and bad ranges change nothing. */
  memset(back, 0, N);
  uint32_t read_tag = 0;
  CHECK_OK(vmmw_pool_read_backup(pool, pw + 12345, back, N, &read_tag, &err));
  CHECK(memcmp(pattern, back, N) == 0);
  CHECK(read_tag == w);
  CHECK_OK(vmmw_pool_read_backup(pool, pw, NULL, 0, NULL, &err));
  memset(back, 0x5a, 16);
  err = NULL;
  CHECK(vmmw_pool_read_backup(pool, pkv, back, 16, NULL, &err) == VMMW_INVALID_STATE);
  CHECK(strstr(vmmw_error_message(err), "sleep-kv") != NULL);
  vmmw_error_free(err);
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_read_backup(NULL, pw, back, 16, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_read_backup(pool, pw, NULL, 16, NULL, NULL));
  CHECK_STATUS(VMMW_UNKNOWN_POINTER, vmmw_pool_read_backup(pool, 0x1000, back, 16, NULL, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pool_read_backup(pool, UINT64_MAX - 4, back, 16, NULL, NULL));
  CHECK(back[0] == 0x5a && back[15] == 0x5a);

  /* The same bytes in place: a view of the pinned backup, owned by the pool. */
  const void* view = NULL;
  read_tag = 0;
  CHECK_OK(vmmw_pool_backup_view(pool, pw + 12345, N, &view, &read_tag, &err));
  CHECK(view != NULL && read_tag == w && memcmp(pattern, view, N) == 0);
  const void* untouched = (const void*)0x1;
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_backup_view(NULL, pw, 16, &untouched, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_backup_view(pool, pw, 16, NULL, NULL, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pool_backup_view(pool, pw, 0, &untouched, NULL, NULL));
  CHECK_STATUS(VMMW_UNKNOWN_POINTER, vmmw_pool_backup_view(pool, 0x1000, 16, &untouched, NULL, NULL));
  CHECK_STATUS(VMMW_INVALID_STATE, vmmw_pool_backup_view(pool, pkv, 16, &untouched, NULL, NULL));
  CHECK(untouched == (const void*)0x1);

  /* Wake with too little device memory: refused, still asleep, backup intact. */
  CHECK_OK(vmmw_host_set_memory_limit(dev, 1u << 20, &err));
  CHECK_STATUS(VMMW_OUT_OF_MEMORY, vmmw_pool_wake(pool, &w, 1, NULL));
  CHECK_OK(vmmw_pool_report_tag(pool, w, &rw, &err));
  CHECK(rw.asleep == 1);
  CHECK_OK(vmmw_host_set_memory_limit(dev, 64ull << 30, &err));

  /* Wake everything: same pointers, offloaded bytes back exactly. */
  CHECK_OK(vmmw_pool_wake(pool, NULL, 0, &err));
  CHECK_OK(vmmw_pool_report(pool, &r, &err));
  CHECK(r.asleep == 0 && r.tracked_bytes >= (12u << 20));
  memset(back, 0, N);
  CHECK_OK(vmmw_pool_read(pool, pw + 12345, back, N, &err));
  CHECK(memcmp(pattern, back, N) == 0);
  CHECK_OK(vmmw_pool_write(pool, pkv, pattern, 64, &err)); /* kv usable again */
  CHECK_STATUS(VMMW_INVALID_STATE, vmmw_pool_read_backup(pool, pw + 12345, back, 16, NULL, NULL));

  /* A second cycle, then release the pinned backup. */
  CHECK_OK(vmmw_pool_sleep(pool, &off_w, 1, &err));
  CHECK_OK(vmmw_pool_wake(pool, &w, 1, &err));
  CHECK_OK(vmmw_pool_read(pool, pw + 12345, back, N, &err));
  CHECK(memcmp(pattern, back, N) == 0);

  /* OffloadCompressed: the same bytes back, a smaller backup for bytes that
   * compress (64 KiB of pattern in 8 MiB of zeros), read while asleep
   * through the decoder, and the ratio in the JSON report. */
  vmmw_tag_policy_t comp_w = {w, VMMW_POLICY_OFFLOAD_COMPRESSED};
  CHECK_OK(vmmw_pool_sleep(pool, &comp_w, 1, &err));
  CHECK_OK(vmmw_pool_report_tag(pool, w, &rw, &err));
  CHECK(rw.asleep == 1 && rw.tracked_bytes == 0 && rw.offloaded_bytes >= (8u << 20));
  CHECK(rw.host_backup_bytes > 0 && rw.host_backup_bytes < rw.offloaded_bytes / 4 * 3);
  memset(back, 0, N);
  CHECK_OK(vmmw_pool_read_backup(pool, pw + 12345, back, N, NULL, &err));
  CHECK(memcmp(pattern, back, N) == 0);
  needed = 0;
  CHECK_STATUS(VMMW_BUFFER_TOO_SMALL, vmmw_pool_report_json(pool, NULL, 0, &needed, NULL));
  json = (char*)malloc(needed);
  CHECK_OK(vmmw_pool_report_json(pool, json, needed, NULL, &err));
  CHECK(strstr(json, "host_backup_raw_bytes") != NULL);
  free(json);
  CHECK_OK(vmmw_pool_wake(pool, &w, 1, &err));
  memset(back, 0, N);
  CHECK_OK(vmmw_pool_read(pool, pw + 12345, back, N, &err));
  CHECK(memcmp(pattern, back, N) == 0);

  /* The element width the codec codes by: 1, 2 or 4 bytes; others refused,
   * changing nothing. */
  memset(&so, 0, sizeof so);
  so.size = sizeof so;
  so.codec_element_bytes = 3;
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pool_set_sleep_options(pool, &so, NULL));
  so.codec_element_bytes = 4;
  CHECK_OK(vmmw_pool_set_sleep_options(pool, &so, &err));
  CHECK_OK(vmmw_pool_sleep(pool, &comp_w, 1, &err));
  CHECK_OK(vmmw_pool_wake(pool, &w, 1, &err));
  memset(back, 0, N);
  CHECK_OK(vmmw_pool_read(pool, pw + 12345, back, N, &err));
  CHECK(memcmp(pattern, back, N) == 0);
  CHECK_OK(vmmw_pool_set_sleep_options(pool, NULL, &err));

  uint64_t unpinned = 0;
  CHECK_OK(vmmw_pool_release_backup(pool, &unpinned, &err));

  CHECK_OK(vmmw_pool_dealloc(pool, pw, &err));
  CHECK_OK(vmmw_pool_dealloc(pool, pkv, &err));
  vmmw_pool_free(pool);
  vmmw_host_counts_t c;
  CHECK_OK(vmmw_host_counts(dev, &c, &err));
  CHECK(c.reservations == 0 && c.handles == 0 && c.mappings == 0 && c.streams == 0);
  vmmw_device_free(dev);
  printf("test_sleep: %d checks passed\n", g_checks);
  return 0;
}
