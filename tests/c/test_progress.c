/* The progress contract (docs/ABI.md): a callback returning 0 asks the load
 * to continue and never cancels it, however often and whenever it is called;
 * one returning non-zero while bytes are still to come cancels it (unless
 * the copies in flight were the last ones: then the load succeeds). The
 * checkpoint is large enough (32 MiB) that the callback is called while the
 * copy runs, not only at its end, so a reversed reading of the return value
 * would show. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "safetensors_writer.h"

typedef struct {
  int calls, midway; /* midway: calls with done < total */
  int32_t answer;
} progress_t;

static int32_t answer(uint64_t done, uint64_t total, void* user) {
  progress_t* p = (progress_t*)user;
  p->calls++;
  if (done < total) p->midway++;
  return p->answer;
}

int main(void) {
  char dir[] = "/tmp/vmmw-c-progress-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[256];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  enum { N = 8 << 20 };
  float* w = (float*)malloc(N * sizeof(float));
  CHECK(w != NULL);
  for (int i = 0; i < N; ++i) w[i] = (float)(i % 1000);
  st_tensor t = {"w.weight", "F32", {N}, 1, w, (uint64_t)N * sizeof(float)};
  CHECK(st_write(path, &t, 1) == 0);

  vmmw_pool_options_t opts;
  memset(&opts, 0, sizeof opts);
  opts.size = sizeof opts;
  opts.backend = VMMW_BACKEND_HOST;
  vmmw_pool_t* pool = NULL;
  CHECK_OK(vmmw_pool_new(&opts, &pool, &err));
  uint32_t tag = 0;
  CHECK_OK(vmmw_tag_id("progress-weights", &tag, &err));
  vmmw_loader_t* ld = NULL;
  CHECK_OK(vmmw_loader_open(path, &ld, &err));
  CHECK_OK(vmmw_loader_allocate(ld, pool, tag, &err));

  /* Asking to continue: every load succeeds, until one was called midway. */
  int midway = 0, loads = 0;
  while (midway == 0 && loads < 20) {
    progress_t p = {0, 0, 0};
    CHECK_OK(vmmw_loader_load(ld, pool, answer, &p, &err));
    CHECK(p.calls >= 1);
    midway += p.midway;
    loads++;
  }
  CHECK(midway > 0); /* else the loop above proved nothing */
  printf("a callback returning 0 continued %d loads (%d calls midway)\n", loads, midway);

  /* Asking to stop while bytes are still to come cancels. */
  int cancelled = 0;
  for (int i = 0; i < 20 && !cancelled; ++i) {
    progress_t p = {0, 0, 1};
    vmmw_status_t rc = vmmw_loader_load(ld, pool, answer, &p, NULL);
    CHECK(rc == VMMW_CANCELLED || rc == VMMW_OK); /* OK: asked after the last copies */
    cancelled = rc == VMMW_CANCELLED;
    CHECK(!cancelled || p.midway > 0);
  }
  CHECK(cancelled);
  printf("a callback returning 1 midway cancelled the load\n");

  vmmw_loader_free(ld);
  vmmw_pool_free(pool);
  free(w);
  unlink(path);
  rmdir(dir);
  printf("test_progress: %d checks passed\n", g_checks);
  return 0;
}
