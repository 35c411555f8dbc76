/*
 * C ABI tests of several devices on the host backend's simulated devices:
 * peer access of a pool tag, a replica load into two pools read once from
 * host memory, two tensor-parallel-style loaders on two devices, and bad
 * inputs that change nothing.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "safetensors_writer.h"

static float wa[8 * 4], wb[6];

int main(void) {
  char dir[] = "/tmp/vmmw-c-multi-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[256];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  for (int i = 0; i < 32; ++i) wa[i] = (float)i * 0.25f - 2.0f;
  for (int i = 0; i < 6; ++i) wb[i] = (float)(40 + i);
  st_tensor ts[2] = {
      {"a.weight", "F32", {8, 4}, 2, wa, sizeof wa},
      {"b.bias", "F32", {6}, 1, wb, sizeof wb},
  };
  CHECK(st_write(path, ts, 2) == 0);

  vmmw_pool_t* pools[2] = {NULL, NULL};
  for (int d = 0; d < 2; ++d) {
    vmmw_pool_options_t opts;
    memset(&opts, 0, sizeof opts);
    opts.size = sizeof opts;
    opts.backend = VMMW_BACKEND_HOST;
    opts.device = d;
    CHECK_OK(vmmw_pool_new(&opts, &pools[d], &err));
  }
  uint32_t tag = 0;
  CHECK_OK(vmmw_tag_id("multi-c-weights", &tag, &err));

  /* Peer access: bad lists change nothing. */
  int32_t can = -1;
  CHECK_OK(vmmw_pool_can_access_peer(pools[0], 1, &can, &err));
  CHECK(can == 1);
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pool_can_access_peer(pools[0], 4096, &can, NULL));
  vmmw_peer_access_t self = {0, VMMW_ACCESS_READ};
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pool_set_peer_access(pools[0], tag, &self, 1, NULL));
  vmmw_peer_access_t odd = {1, 7};
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pool_set_peer_access(pools[0], tag, &odd, 1, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_set_peer_access(pools[0], tag, NULL, 1, NULL));
  size_t n = 9;
  CHECK_OK(vmmw_pool_peer_access_count(pools[0], tag, &n, &err));
  CHECK(n == 0);

  /* Replicas: one loader per device, same rules, destinations in each pool. */
  vmmw_loader_t* ld[2] = {NULL, NULL};
  for (int d = 0; d < 2; ++d) {
    CHECK_OK(vmmw_loader_open(path, &ld[d], &err));
    CHECK_OK(vmmw_loader_allocate(ld[d], pools[d], tag, &err));
  }
  vmmw_loader_t* cl[2] = {ld[0], ld[1]};
  vmmw_pool_t* cp[2] = {pools[0], pools[1]};
  vmmw_loader_t* twice[2] = {ld[0], ld[0]};
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_load_devices(twice, cp, 2, VMMW_MULTI_REPLICAS, NULL, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_load_devices(cl, cp, 2, 9, NULL, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_load_devices(cl, cp, 0, VMMW_MULTI_REPLICAS, NULL, NULL));
  vmmw_multi_result_t res;
  memset(&res, 0, sizeof res);
  CHECK_OK(vmmw_loader_load_devices(cl, cp, 2, VMMW_MULTI_REPLICAS, &res, &err));
  CHECK(res.host_bytes == sizeof wa + sizeof wb);
  CHECK(res.delivered_bytes == 2 * (sizeof wa + sizeof wb));
  CHECK(res.peer_bytes == sizeof wa + sizeof wb);
  CHECK(res.recovered_devices == 0);
  for (int d = 0; d < 2; ++d) {
    vmmw_destination_t da, db;
    CHECK_OK(vmmw_loader_destination(ld[d], "a.weight", &da, &err));
    CHECK_OK(vmmw_loader_destination(ld[d], "b.bias", &db, &err));
    float back_a[32], back_b[6];
    CHECK_OK(vmmw_pool_read(pools[d], da.ptr, back_a, sizeof back_a, &err));
    CHECK_OK(vmmw_pool_read(pools[d], db.ptr, back_b, sizeof back_b, &err));
    CHECK(memcmp(back_a, wa, sizeof wa) == 0);
    CHECK(memcmp(back_b, wb, sizeof wb) == 0);
    vmmw_load_result_t lr;
    CHECK_OK(vmmw_loader_result(ld[d], &lr, &err));
  }
  /* The load granted each device read access to the other's tag. */
  CHECK_OK(vmmw_pool_peer_access_count(pools[0], tag, &n, &err));
  CHECK(n == 1);
  vmmw_peer_access_t got;
  CHECK_OK(vmmw_pool_peer_access_at(pools[0], tag, 0, &got, &err));
  CHECK(got.device == 1 && got.access == VMMW_ACCESS_READ);
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pool_peer_access_at(pools[0], tag, 1, &got, NULL));
  vmmw_peer_access_t rw = {0, VMMW_ACCESS_READWRITE};
  CHECK_OK(vmmw_pool_set_peer_access(pools[1], tag, &rw, 1, &err));
  CHECK_OK(vmmw_pool_peer_access_at(pools[1], tag, 0, &got, &err));
  CHECK(got.device == 0 && got.access == VMMW_ACCESS_READWRITE);

  /* Ranks: each device loads its own loader's plan from host memory. */
  CHECK_OK(vmmw_loader_load_devices(cl, cp, 2, VMMW_MULTI_RANKS, &res, &err));
  CHECK(res.host_bytes == 2 * (sizeof wa + sizeof wb));
  CHECK(res.peer_bytes == 0);

  for (int d = 0; d < 2; ++d) {
    vmmw_loader_free(ld[d]);
    vmmw_pool_free(pools[d]);
  }
  unlink(path);
  rmdir(dir);
  printf("test_multi: %d checks passed\n", g_checks);
  return 0;
}
