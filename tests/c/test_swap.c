/*
 * C ABI tests of swaps and waiting wakes on the host backend: a swap puts one
 * tag to sleep while another wakes and reports each side; bad lists change
 * nothing and leave the result untouched; a device too small for both makes
 * the wake wait for the sleep; a wake failing midway keeps its tag asleep
 * with its backup while the sleep side succeeds; a waiting wake fails at its
 * deadline naming the tag, and succeeds once memory is there.
 */
#include <stdint.h>

#include "check.h"

enum { N = 1 << 16, MODEL = 16 << 20 };
static unsigned char pa[N], pb[N], back[N];

static void fill(unsigned char* p, uint32_t seed) {
  for (int i = 0; i < N; ++i) p[i] = (unsigned char)((i * 2654435761u + seed) >> 13);
}

static int asleep(vmmw_pool_t* pool, uint32_t tag) {
  vmmw_report_t r;
  CHECK_OK(vmmw_pool_report_tag(pool, tag, &r, &err));
  return r.asleep;
}

static void same(vmmw_pool_t* pool, uint64_t ptr, const unsigned char* want) {
  memset(back, 0, N);
  CHECK_OK(vmmw_pool_read(pool, ptr, back, N, &err));
  CHECK(memcmp(want, back, N) == 0);
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
  uint32_t a = 0, b = 0, typo = 0;
  CHECK_OK(vmmw_tag_id("swap-a", &a, &err));
  CHECK_OK(vmmw_tag_id("swap-b", &b, &err));
  CHECK_OK(vmmw_tag_id("swap-never", &typo, &err));
  uint64_t ptr_a = 0, ptr_b = 0;
  CHECK_OK(vmmw_pool_alloc_tagged(pool, MODEL, a, &ptr_a, &err));
  CHECK_OK(vmmw_pool_alloc_tagged(pool, MODEL, b, &ptr_b, &err));
  fill(pa, 1);
  fill(pb, 2);
  CHECK_OK(vmmw_pool_write(pool, ptr_a + 4096, pa, N, &err));
  CHECK_OK(vmmw_pool_write(pool, ptr_b + 4096, pb, N, &err));
  vmmw_tag_policy_t off_b = {b, VMMW_POLICY_OFFLOAD};
  CHECK_OK(vmmw_pool_sleep(pool, &off_b, 1, &err));

  /* Refused before anything moves; the result is not written. */
  vmmw_swap_result_t res;
  memset(&res, 0x5a, sizeof res);
  vmmw_tag_policy_t off_a = {a, VMMW_POLICY_OFFLOAD};
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_swap(NULL, &off_a, 1, &b, 1, NULL, &res, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_swap(pool, NULL, 1, &b, 1, NULL, &res, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_swap(pool, &off_a, 1, NULL, 1, NULL, &res, NULL));
  vmmw_tag_policy_t bad = {a, 9};
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pool_swap(pool, &bad, 1, &b, 1, NULL, &res, NULL));
  vmmw_error_t* e = NULL;
  CHECK(vmmw_pool_swap(pool, &off_a, 1, &a, 1, NULL, &res, &e) == VMMW_INVALID_ARGUMENT);
  CHECK(strstr(vmmw_error_message(e), "both") != NULL);
  vmmw_error_free(e);
  CHECK_STATUS(VMMW_UNKNOWN_TAG, vmmw_pool_swap(pool, &off_a, 1, &typo, 1, NULL, &res, NULL));
  vmmw_swap_options_t unset;
  memset(&unset, 0, sizeof unset);
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pool_swap(pool, &off_a, 1, &b, 1, &unset, &res, NULL));
  CHECK(res.sleep_status == 0x5a5a5a5a);
  CHECK(!asleep(pool, a) && asleep(pool, b));
  same(pool, ptr_a + 4096, pa);

  /* The swap: a goes to sleep while b wakes, each side reported. */
  vmmw_swap_options_t so; /* VMMW_SWAP_OPTIONS_INIT in C; this file is C++ too */
  memset(&so, 0, sizeof so);
  so.size = sizeof so;
  CHECK_OK(vmmw_pool_swap(pool, &off_a, 1, &b, 1, &so, &res, &err));
  CHECK(res.sleep_status == VMMW_OK && res.wake_status == VMMW_OK);
  CHECK(res.slept_tags == 1 && res.woken_tags == 1);
  CHECK(res.released_bytes >= MODEL && res.mapped_bytes >= MODEL);
  CHECK(res.copied_out_bytes >= MODEL && res.copied_in_bytes >= MODEL);
  CHECK(res.seconds >= res.wake_seconds && res.seconds >= 0.0);
  CHECK(asleep(pool, a) && !asleep(pool, b));
  same(pool, ptr_b + 4096, pb);
  size_t needed = 0;
  CHECK_STATUS(VMMW_BUFFER_TOO_SMALL, vmmw_pool_last_cycle_json(pool, NULL, 0, &needed, NULL));
  char* json = (char*)malloc(needed);
  CHECK_OK(vmmw_pool_last_cycle_json(pool, json, needed, NULL, &err));
  CHECK(strstr(json, "swap-a") != NULL && strstr(json, "swap-b") != NULL);
  free(json);

  /* Room for one model and a half: the wake waits for the sleep's memory. */
  vmmw_host_counts_t counts;
  CHECK_OK(vmmw_host_counts(dev, &counts, &err));
  CHECK_OK(vmmw_host_set_memory_limit(dev, counts.physical_bytes + MODEL / 2, &err));
  CHECK_STATUS(VMMW_OUT_OF_MEMORY, vmmw_pool_wake(pool, &a, 1, NULL));
  vmmw_tag_policy_t off_b2 = {b, VMMW_POLICY_OFFLOAD};
  CHECK_OK(vmmw_pool_swap(pool, &off_b2, 1, &a, 1, NULL, &res, &err));
  same(pool, ptr_a + 4096, pa);
  CHECK(asleep(pool, b) && !asleep(pool, a));

  /* A wake failing midway: the waking tag stays asleep with its backup,
   * the sleep side is reported apart, and the call says the wake failed. */
  CHECK_OK(vmmw_host_set_memory_limit(dev, 1ull << 30, &err));
  CHECK_OK(vmmw_host_fail_nth(dev, VMMW_FAULT_MAP, 1, &err));
  memset(&res, 0, sizeof res);
  e = NULL;
  vmmw_status_t rc = vmmw_pool_swap(pool, &off_a, 1, &b, 1, NULL, &res, &e);
  CHECK(rc != VMMW_OK && rc == res.wake_status && res.sleep_status == VMMW_OK);
  CHECK(res.slept_tags == 1 && res.woken_tags == 0);
  CHECK(strstr(vmmw_error_message(e), "sleep side succeeded") != NULL);
  vmmw_error_free(e);
  CHECK(asleep(pool, a) && asleep(pool, b));
  CHECK_OK(vmmw_pool_wake(pool, &b, 1, &err));
  same(pool, ptr_b + 4096, pb);

  /* A waiting wake: no room, so it fails at its deadline naming the tag
   * (still asleep); with room, it wakes. NULL options are vmmw_pool_wake. */
  CHECK_OK(vmmw_host_counts(dev, &counts, &err));
  CHECK_OK(vmmw_host_set_memory_limit(dev, counts.physical_bytes + MODEL / 2, &err));
  vmmw_wake_options_t wo;
  memset(&wo, 0, sizeof wo);
  wo.size = sizeof wo;
  wo.wait_memory_ms = 30;
  e = NULL;
  CHECK(vmmw_pool_wake_with(pool, &a, 1, &wo, &e) == VMMW_OUT_OF_MEMORY);
  CHECK(strstr(vmmw_error_message(e), "swap-a") != NULL);
  CHECK(strstr(vmmw_error_message(e), "waited") != NULL);
  vmmw_error_free(e);
  CHECK(asleep(pool, a));
  CHECK_STATUS(VMMW_OUT_OF_MEMORY, vmmw_pool_wake_with(pool, &a, 1, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_wake_with(NULL, &a, 1, &wo, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_wake_with(pool, NULL, 1, &wo, NULL));
  CHECK_STATUS(VMMW_UNKNOWN_TAG, vmmw_pool_wake_with(pool, &typo, 1, &wo, NULL));
  CHECK_OK(vmmw_host_set_memory_limit(dev, 1ull << 30, &err));
  CHECK_OK(vmmw_pool_wake_with(pool, &a, 1, &wo, &err));
  same(pool, ptr_a + 4096, pa);

  /* A sleep side failing (Reload without a checkpoint to reload from):
   * its status in the result and the call's, the message says the wake
   * side succeeded, the tag is awake and untouched. */
  CHECK_OK(vmmw_pool_sleep(pool, &off_b, 1, &err));
  vmmw_tag_policy_t reload_a = {a, VMMW_POLICY_RELOAD};
  memset(&res, 0x5a, sizeof res);
  e = NULL;
  rc = vmmw_pool_swap(pool, &reload_a, 1, &b, 1, NULL, &res, &e);
  CHECK(rc != VMMW_OK && rc == res.sleep_status && res.wake_status == VMMW_OK);
  CHECK(res.slept_tags == 0 && res.woken_tags == 1 && res.released_bytes == 0);
  CHECK(strstr(vmmw_error_message(e), "wake side succeeded") != NULL);
  vmmw_error_free(e);
  CHECK(!asleep(pool, a) && !asleep(pool, b));
  same(pool, ptr_a + 4096, pa);
  same(pool, ptr_b + 4096, pb);

  /* Both sides failing: the wake side's status is the call's, the message
   * carries the sleep side's too. */
  CHECK_OK(vmmw_pool_sleep(pool, &off_b, 1, &err));
  CHECK_OK(vmmw_host_fail_nth(dev, VMMW_FAULT_MAP, 1, &err));
  memset(&res, 0x5a, sizeof res);
  e = NULL;
  rc = vmmw_pool_swap(pool, &reload_a, 1, &b, 1, NULL, &res, &e);
  CHECK(rc == res.wake_status && res.sleep_status != VMMW_OK && res.wake_status != VMMW_OK);
  CHECK(res.slept_tags == 0 && res.woken_tags == 0);
  CHECK(strstr(vmmw_error_message(e), "sleep side failed too") != NULL);
  vmmw_error_free(e);
  CHECK(!asleep(pool, a) && asleep(pool, b));
  same(pool, ptr_a + 4096, pa);

  /* NULL result and error on success; empty lists with NULL arrays. */
  CHECK_OK(vmmw_pool_swap(pool, &off_a, 1, &b, 1, NULL, NULL, NULL));
  CHECK(asleep(pool, a) && !asleep(pool, b));
  memset(&res, 0x5a, sizeof res);
  CHECK_OK(vmmw_pool_swap(pool, NULL, 0, NULL, 0, NULL, &res, &err));
  CHECK(res.sleep_status == VMMW_OK && res.wake_status == VMMW_OK);
  CHECK(res.slept_tags == 0 && res.woken_tags == 0 && res.released_bytes == 0);

  /* Options from a newer header: a larger size whose extra bytes are zero
   * is read; set extra bytes are refused with nothing changed. */
  struct {
    vmmw_swap_options_t o;
    uint64_t newer;
  } big;
  memset(&big, 0, sizeof big);
  big.o.size = sizeof big;
  CHECK_OK(vmmw_pool_swap(pool, &off_b, 1, &a, 1, &big.o, &res, &err));
  CHECK(asleep(pool, b) && !asleep(pool, a));
  same(pool, ptr_a + 4096, pa);
  big.newer = 1;
  memset(&res, 0x5a, sizeof res);
  CHECK_STATUS(VMMW_UNSUPPORTED, vmmw_pool_swap(pool, &off_a, 1, &b, 1, &big.o, &res, NULL));
  CHECK(res.sleep_status == 0x5a5a5a5a);
  CHECK(asleep(pool, b) && !asleep(pool, a));
  struct {
    vmmw_wake_options_t o;
    uint64_t newer;
  } wbig;
  memset(&wbig, 0, sizeof wbig);
  wbig.o.size = sizeof wbig;
  wbig.newer = 7;
  CHECK_STATUS(VMMW_UNSUPPORTED, vmmw_pool_wake_with(pool, &b, 1, &wbig.o, NULL));
  CHECK(asleep(pool, b));
  wbig.newer = 0;
  CHECK_OK(vmmw_pool_wake_with(pool, &b, 1, &wbig.o, &err));
  same(pool, ptr_b + 4096, pb);

  CHECK_OK(vmmw_pool_dealloc(pool, ptr_a, &err));
  CHECK_OK(vmmw_pool_dealloc(pool, ptr_b, &err));
  vmmw_pool_free(pool);
  vmmw_device_free(dev);
  printf("test_swap: %d checks passed\n", g_checks);
  return 0;
}
