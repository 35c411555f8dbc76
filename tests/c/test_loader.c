/*
 * C ABI tests of the loader on the host backend: open, rules, allocate from a
 * pool, plan, load with progress, cancel, bad inputs that change nothing,
 * results, and sleep with the reload policy restoring loaded bytes.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "safetensors_writer.h"

static float wa[4 * 3], wb[5];

typedef struct {
  int calls;
  uint64_t last_done, last_total;
  int cancel_at_call; /* 0: never */
} progress_t;

static int32_t on_progress(uint64_t done, uint64_t total, void* user) {
  progress_t* p = (progress_t*)user;
  p->calls++;
  p->last_done = done;
  p->last_total = total;
  return p->cancel_at_call != 0 && p->calls >= p->cancel_at_call;
}

typedef struct {
  vmmw_pool_t* pool;
  uint32_t tag;
  int32_t rc;
} sleeper_t;

/* Tries to put the tag being loaded to sleep from inside the load. */
static int32_t sleep_in_progress(uint64_t done, uint64_t total, void* user) {
  (void)done;
  (void)total;
  sleeper_t* s = (sleeper_t*)user;
  vmmw_tag_policy_t it = {s->tag, VMMW_POLICY_DISCARD};
  s->rc = vmmw_pool_sleep(s->pool, &it, 1, NULL);
  return 0;
}

int main(void) {
  char dir[] = "/tmp/vmmw-c-loader-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[256], bad[256];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  snprintf(bad, sizeof bad, "%s/broken.safetensors", dir);
  for (int i = 0; i < 12; ++i) wa[i] = (float)i * 1.5f - 3.0f;
  for (int i = 0; i < 5; ++i) wb[i] = (float)(100 + i);
  st_tensor ts[2] = {
      {"a.weight", "F32", {4, 3}, 2, wa, sizeof wa},
      {"b.bias", "F32", {5}, 1, wb, sizeof wb},
  };
  CHECK(st_write(path, ts, 2) == 0);
  FILE* f = fopen(bad, "wb");
  CHECK(f != NULL && fwrite("\xff\xff\xff\xff\xff\xff\xff\x7f{", 1, 9, f) == 9);
  fclose(f);

  /* Bad inputs. */
  vmmw_loader_t* ld = NULL;
  CHECK_STATUS(VMMW_IO, vmmw_loader_open("/nonexistent/model.safetensors", &ld, NULL));
  vmmw_error_t* err = NULL;
  CHECK(vmmw_loader_open(bad, &ld, &err) == VMMW_CHECKPOINT_INVALID);
  CHECK(strstr(vmmw_error_message(err), "broken.safetensors") != NULL);
  vmmw_error_free(err);
  CHECK(ld == NULL);

  vmmw_pool_options_t opts;
  memset(&opts, 0, sizeof opts);
  opts.size = sizeof opts;
  opts.backend = VMMW_BACKEND_HOST;
  vmmw_pool_t* pool = NULL;
  CHECK_OK(vmmw_pool_new(&opts, &pool, &err));
  uint32_t tag = 0;
  CHECK_OK(vmmw_tag_id("loader-weights", &tag, &err));

  CHECK_OK(vmmw_loader_open(path, &ld, &err));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_set_rules_json(ld, "{\"rules\": [{\"match\": \"(\"}]}", NULL));
  CHECK_OK(vmmw_loader_set_rules_json(ld, "{\"rules\": [{\"match\": \"b\\\\.bias\", \"to\": \"c.bias\"}]}", &err));
  vmmw_load_result_t res;
  CHECK_STATUS(VMMW_INVALID_STATE, vmmw_loader_result(ld, &res, NULL));

  /* Allocate the destinations from the pool, under the tag. */
  CHECK_OK(vmmw_loader_allocate(ld, pool, tag, &err));
  size_t count = 0;
  CHECK_OK(vmmw_loader_destination_count(ld, &count, &err));
  CHECK(count == 2);
  char name[32];
  CHECK_OK(vmmw_loader_destination_name(ld, 1, name, sizeof name, NULL, &err));
  CHECK(strcmp(name, "c.bias") == 0);
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_destination_name(ld, 2, name, sizeof name, NULL, NULL));
  vmmw_destination_t da, dc;
  CHECK_OK(vmmw_loader_destination(ld, "a.weight", &da, &err));
  CHECK_OK(vmmw_loader_destination(ld, "c.bias", &dc, &err));
  CHECK(da.ndim == 2 && da.shape[0] == 4 && da.shape[1] == 3 && da.bytes == sizeof wa);
  CHECK(strcmp(da.dtype, "F32") == 0 && dc.bytes == sizeof wb && da.ptr != 0);
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_destination(ld, "b.bias", &dc, NULL));
  vmmw_report_t rt;
  CHECK_OK(vmmw_pool_report_tag(pool, tag, &rt, &err));
  CHECK(rt.live_blocks == 2);

  vmmw_plan_summary_t plan;
  CHECK_OK(vmmw_loader_plan(ld, &plan, &err));
  CHECK(plan.src_bytes == sizeof wa + sizeof wb && plan.dst_bytes == plan.src_bytes);
  CHECK(plan.sources == 2 && plan.destinations == 2 && plan.missing == 0);

  /* A cancel requested before the load stops it before any byte moves; then load for real. */
  vmmw_load_options_t lo;
  memset(&lo, 0, sizeof lo);
  lo.size = sizeof lo;
  lo.strategy = VMMW_COPY_SIMPLE;
  CHECK_OK(vmmw_loader_set_options(ld, &lo, &err));
  CHECK_OK(vmmw_loader_cancel(ld, &err));
  progress_t pr = {0, 0, 0, 0};
  CHECK_STATUS(VMMW_CANCELLED, vmmw_loader_load(ld, pool, on_progress, &pr, NULL));
  memset(&pr, 0, sizeof pr);
  CHECK_OK(vmmw_loader_load(ld, pool, on_progress, &pr, &err));
  CHECK(pr.calls >= 1 && pr.last_done == pr.last_total && pr.last_total == plan.src_bytes);
  float back_a[12], back_c[5];
  CHECK_OK(vmmw_pool_read(pool, da.ptr, back_a, sizeof back_a, &err));
  CHECK_OK(vmmw_pool_read(pool, dc.ptr, back_c, sizeof back_c, &err));
  CHECK(memcmp(back_a, wa, sizeof wa) == 0 && memcmp(back_c, wb, sizeof wb) == 0);
  CHECK_OK(vmmw_loader_result(ld, &res, &err));
  CHECK(res.bytes == plan.src_bytes && res.threads >= 1);
  size_t needed = 0;
  CHECK_STATUS(VMMW_BUFFER_TOO_SMALL, vmmw_loader_result_json(ld, NULL, 0, &needed, NULL));
  char* json = (char*)malloc(needed);
  CHECK_OK(vmmw_loader_result_json(ld, json, needed, NULL, &err));
  CHECK(strstr(json, "\"src_bytes\"") != NULL);
  free(json);

  /* Reload policy: the host keeps only the live bytes the loader did not write
   * (here the padding of each block); wake re-reads the checkpoint into the
   * same addresses. */
  vmmw_tag_policy_t item = {tag, VMMW_POLICY_RELOAD};
  CHECK_OK(vmmw_pool_sleep(pool, &item, 1, &err));
  CHECK_OK(vmmw_pool_report_tag(pool, tag, &rt, &err));
  CHECK(rt.reloadable_bytes > 0 && rt.tracked_bytes == 0);
  CHECK(rt.host_backup_bytes == rt.live_bytes - plan.dst_bytes);
  CHECK_OK(vmmw_pool_wake(pool, &tag, 1, &err));
  memset(back_a, 0, sizeof back_a);
  CHECK_OK(vmmw_pool_read(pool, da.ptr, back_a, sizeof back_a, &err));
  CHECK(memcmp(back_a, wa, sizeof wa) == 0);

  /* Weights written after the load (an RL update) come back from a Reload
   * wake as written: the sleep hashes what was loaded on the device and keeps
   * what changed in the host backup. A range marked written is kept too. */
  float upd_a[12], upd_c[5];
  for (int i = 0; i < 12; i++) upd_a[i] = 100.0f + (float)i;
  for (int i = 0; i < 5; i++) upd_c[i] = -50.0f - (float)i;
  CHECK_OK(vmmw_pool_write(pool, da.ptr, upd_a, sizeof upd_a, &err));
  CHECK_OK(vmmw_pool_mark_written(pool, dc.ptr, sizeof upd_c, &err));
  CHECK_OK(vmmw_pool_write(pool, dc.ptr, upd_c, sizeof upd_c, &err));
  CHECK_OK(vmmw_pool_sleep(pool, &item, 1, &err));
  CHECK_OK(vmmw_pool_wake(pool, &tag, 1, &err));
  CHECK_OK(vmmw_pool_read(pool, da.ptr, back_a, sizeof back_a, &err));
  CHECK_OK(vmmw_pool_read(pool, dc.ptr, back_c, sizeof back_c, &err));
  CHECK(memcmp(back_a, upd_a, sizeof upd_a) == 0 && memcmp(back_c, upd_c, sizeof upd_c) == 0);
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_mark_written(NULL, dc.ptr, 4, NULL));
  CHECK_STATUS(VMMW_UNKNOWN_POINTER, vmmw_pool_mark_written(pool, 16, 4, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pool_mark_written(pool, dc.ptr, 1ull << 40, NULL));
  CHECK_OK(vmmw_pool_sleep(pool, &item, 1, &err));
  CHECK_STATUS(VMMW_INVALID_STATE, vmmw_pool_mark_written(pool, dc.ptr, 4, NULL));
  CHECK_OK(vmmw_pool_wake(pool, &tag, 1, &err));
  /* A new load makes the checkpoint the source again. */
  CHECK_OK(vmmw_loader_load(ld, pool, NULL, NULL, &err));
  CHECK_OK(vmmw_pool_sleep(pool, &item, 1, &err));
  CHECK_OK(vmmw_pool_wake(pool, &tag, 1, &err));
  CHECK_OK(vmmw_pool_read(pool, da.ptr, back_a, sizeof back_a, &err));
  CHECK_OK(vmmw_pool_read(pool, dc.ptr, back_c, sizeof back_c, &err));
  CHECK(memcmp(back_a, wa, sizeof wa) == 0 && memcmp(back_c, wb, sizeof wb) == 0);

  /* A sleep of a tag being loaded is refused, here from the progress callback. */
  sleeper_t sl = {pool, tag, -1};
  CHECK_OK(vmmw_loader_load(ld, pool, sleep_in_progress, &sl, &err));
  CHECK(sl.rc == VMMW_LOAD_IN_PROGRESS);

  /* The checkpoint rewritten while its tag sleeps with Reload: the wake is
   * refused before any byte moves and the tag stays asleep; forgetting the
   * reload sources lets it wake, then the new file loads. */
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_set_reload_check(ld, 2, NULL));
  CHECK_OK(vmmw_loader_set_reload_check(ld, 1, &err));
  CHECK_OK(vmmw_loader_load(ld, pool, NULL, NULL, &err));
  CHECK_OK(vmmw_pool_sleep(pool, &item, 1, &err));
  wb[0] = -1.0f;
  CHECK(st_write(path, ts, 2) == 0);
  err = NULL;
  CHECK(vmmw_pool_wake(pool, &tag, 1, &err) == VMMW_CHECKPOINT_INVALID);
  CHECK(strstr(vmmw_error_message(err), "model.safetensors") != NULL);
  vmmw_error_free(err);
  CHECK_OK(vmmw_pool_report_tag(pool, tag, &rt, &err));
  CHECK(rt.asleep && rt.tracked_bytes == 0);
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_forget_reload(NULL, tag, NULL));
  CHECK_OK(vmmw_pool_forget_reload(pool, tag, &err));
  CHECK_OK(vmmw_pool_wake(pool, &tag, 1, &err));
  CHECK_OK(vmmw_loader_load(ld, pool, NULL, NULL, &err));
  CHECK_OK(vmmw_pool_read(pool, dc.ptr, back_c, sizeof back_c, &err));
  CHECK(back_c[0] == -1.0f);
  CHECK_OK(vmmw_loader_set_reload_check(ld, 0, &err));

  /* A staged load keeps its pinned ring cached; releasing it frees exactly that,
   * and the next load pins a new one. */
  lo.strategy = VMMW_COPY_STAGED;
  CHECK_OK(vmmw_loader_set_options(ld, &lo, &err));
  CHECK_OK(vmmw_loader_load(ld, pool, NULL, NULL, &err));
  uint64_t staging = 0, released = 1;
  CHECK_OK(vmmw_pool_staging_bytes(pool, &staging, &err));
  CHECK(staging > 0);
  CHECK_OK(vmmw_pool_release_staging(pool, &released, &err));
  CHECK(released == staging);
  CHECK_OK(vmmw_pool_staging_bytes(pool, &staging, &err));
  CHECK(staging == 0);
  CHECK_OK(vmmw_pool_release_staging(pool, &released, &err));
  CHECK(released == 0);
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_staging_bytes(NULL, &staging, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_staging_bytes(pool, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_release_staging(NULL, &released, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_release_staging(pool, NULL, NULL));
  memset(back_a, 0, sizeof back_a);
  CHECK_OK(vmmw_pool_write(pool, da.ptr, back_a, sizeof back_a, &err));
  CHECK_OK(vmmw_loader_load(ld, pool, NULL, NULL, &err));
  CHECK_OK(vmmw_pool_read(pool, da.ptr, back_a, sizeof back_a, &err));
  CHECK(memcmp(back_a, wa, sizeof wa) == 0);
  CHECK_OK(vmmw_pool_staging_bytes(pool, &staging, &err));
  CHECK(staging > 0);

  /* A plan mismatch is found before anything is written. */
  vmmw_loader_t* ld2 = NULL;
  CHECK_OK(vmmw_loader_open(path, &ld2, &err));
  uint64_t own = 0;
  CHECK_OK(vmmw_pool_alloc_tagged(pool, 4096, tag, &own, &err));
  unsigned char sentinel[64];
  memset(sentinel, 0xab, sizeof sentinel);
  CHECK_OK(vmmw_pool_write(pool, own, sentinel, sizeof sentinel, &err));
  uint64_t wrong_shape[2] = {3, 4};
  CHECK_OK(vmmw_loader_register(ld2, "a.weight", own, "float32", wrong_shape, 2, &err));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_register(ld2, "a.weight", own + 2048, "F32", wrong_shape, 2, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_register(ld2, "x", own + 2048, "F99", wrong_shape, 2, NULL));
  err = NULL;
  CHECK(vmmw_loader_load(ld2, pool, NULL, NULL, &err) == VMMW_PLAN_MISMATCH);
  CHECK(strstr(vmmw_error_message(err), "a.weight") != NULL);
  vmmw_error_free(err);
  unsigned char after[64];
  CHECK_OK(vmmw_pool_read(pool, own, after, sizeof after, &err));
  CHECK(memcmp(after, sentinel, sizeof after) == 0);
  vmmw_loader_free(ld2);

  vmmw_loader_free(ld);
  vmmw_loader_free(NULL);
  vmmw_pool_free(pool);
  unlink(path);
  unlink(bad);
  rmdir(dir);
  printf("test_loader: %d checks passed\n", g_checks);
  return 0;
}
