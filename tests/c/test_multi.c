/*
 * C ABI tests of several devices on the host backend's simulated devices:
 * peer access of a pool tag, a replica load into two pools read once from
 * host memory, replicas asleep on one raw or compressed host backup, two
 * tensor-parallel-style loaders on two devices, and bad inputs that change
 * nothing.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "safetensors_writer.h"

static float wa[8 * 4], wb[6];

/* Replicas asleep on one host backup: the same blocks and bytes in a tag on
 * two devices, one backup, every device woken from it; a device out of
 * memory mid-wake loses nothing and a retry restores exact bytes. */
static void test_replicas_one_backup(void) {
  enum { NB = 3 };
  static const uint64_t sizes[NB] = {1000, 300000, 5000};
  static unsigned char bytes[NB][300000];
  for (int i = 0; i < NB; ++i)
    for (uint64_t j = 0; j < sizes[i]; ++j) bytes[i][j] = (unsigned char)(j * 7 + i * 13 + 1);
  vmmw_device_t* dev[2] = {NULL, NULL};
  vmmw_pool_t* rp[2] = {NULL, NULL};
  uint64_t ptr[2][NB];
  uint32_t tag = 0;
  CHECK_OK(vmmw_tag_id("replicas-c-one-backup", &tag, &err));
  for (int d = 0; d < 2; ++d) {
    CHECK_OK(vmmw_device_open(VMMW_BACKEND_HOST, d, &dev[d], &err));
    vmmw_pool_options_t opts;
    memset(&opts, 0, sizeof opts);
    opts.size = sizeof opts;
    opts.device_handle = dev[d];
    CHECK_OK(vmmw_pool_new(&opts, &rp[d], &err));
    for (int i = 0; i < NB; ++i) {
      CHECK_OK(vmmw_pool_alloc_tagged(rp[d], sizes[i], tag, &ptr[d][i], &err));
      CHECK_OK(vmmw_pool_write(rp[d], ptr[d][i], bytes[i], sizes[i], &err));
    }
  }
  uint32_t tags[2] = {tag, tag};
  vmmw_pool_t* twice[2] = {rp[0], rp[0]};
  vmmw_replica_sleep_result_t sr;
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_replicas_sleep(NULL, tags, 2, &sr, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_replicas_sleep(rp, NULL, 2, &sr, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_replicas_sleep(rp, tags, 0, &sr, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_replicas_sleep(twice, tags, 2, &sr, NULL));
  CHECK_STATUS(VMMW_INVALID_STATE, vmmw_replicas_wake_from_backup(rp, tags, 2, NULL, NULL, NULL));
  /* The former names still work through 0.x (and warn: silenced here on purpose). */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
  CHECK_STATUS(VMMW_INVALID_STATE, vmmw_replicas_wake(rp, tags, 2, NULL, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_loader_wake_replicas(NULL, NULL, 2, NULL, NULL));
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

  /* The backup over the host-memory limit: VMMW_HOST_OUT_OF_MEMORY, nothing sleeps. */
  vmmw_sleep_options_t so;
  memset(&so, 0, sizeof so);
  so.size = sizeof so;
  so.host_memory_limit = 4096;
  CHECK_OK(vmmw_pool_set_sleep_options(rp[0], &so, &err));
  CHECK_STATUS(VMMW_HOST_OUT_OF_MEMORY, vmmw_replicas_sleep(rp, tags, 2, &sr, NULL));
  so.host_memory_limit = 0;
  CHECK_OK(vmmw_pool_set_sleep_options(rp[0], &so, &err));
  for (int d = 0; d < 2; ++d) {
    unsigned char awake[16];
    CHECK_OK(vmmw_pool_read(rp[d], ptr[d][0], awake, sizeof awake, &err));
  }

  memset(&sr, 0, sizeof sr);
  CHECK_OK(vmmw_replicas_sleep(rp, tags, 2, &sr, &err));
  CHECK(sr.backup_bytes > 0 && sr.released_bytes == 2 * sr.backup_bytes);
  unsigned char probe[16];
  CHECK_STATUS(VMMW_INVALID_STATE, vmmw_pool_read(rp[1], ptr[1][0], probe, sizeof probe, NULL));

  vmmw_replica_wake_options_t wo;
  memset(&wo, 0, sizeof wo); /* size 0: never set */
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_replicas_wake_from_backup(rp, tags, 2, &wo, NULL, NULL));
  wo.size = sizeof wo;
  wo.no_peer_copies = 2;
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_replicas_wake_from_backup(rp, tags, 2, &wo, NULL, NULL));
  wo.no_peer_copies = 0;

  /* Device 1 cannot create memory mid-wake: nothing is lost. */
  CHECK_OK(vmmw_host_fail_nth(dev[1], VMMW_FAULT_CREATE, 1, &err));
  vmmw_replica_wake_result_t wr;
  CHECK_STATUS(VMMW_OUT_OF_MEMORY, vmmw_replicas_wake_from_backup(rp, tags, 2, &wo, &wr, NULL));
  for (int d = 0; d < 2; ++d) {
    vmmw_host_counts_t c;
    CHECK_OK(vmmw_host_counts(dev[d], &c, &err));
    CHECK(c.physical_bytes == 0);
  }
  CHECK_STATUS(VMMW_INVALID_STATE, vmmw_pool_read(rp[0], ptr[0][0], probe, sizeof probe, NULL));

  memset(&wr, 0, sizeof wr);
  CHECK_OK(vmmw_replicas_wake_from_backup(rp, tags, 2, &wo, &wr, &err));
  CHECK(wr.host_bytes == sr.backup_bytes);
  CHECK(wr.peer_bytes == sr.backup_bytes);
  CHECK(wr.delivered_bytes == 2 * sr.backup_bytes);
  CHECK(wr.direct_pairs == 0);
  static unsigned char back[300000];
  for (int d = 0; d < 2; ++d)
    for (int i = 0; i < NB; ++i) {
      CHECK_OK(vmmw_pool_read(rp[d], ptr[d][i], back, (size_t)sizes[i], &err));
      CHECK(memcmp(back, bytes[i], sizes[i]) == 0);
    }

  /* No peer copies: every device copies the whole backup. */
  CHECK_OK(vmmw_replicas_sleep(rp, tags, 2, NULL, &err));
  wo.no_peer_copies = 1;
  CHECK_OK(vmmw_replicas_wake_from_backup(rp, tags, 2, &wo, &wr, &err));
  CHECK(wr.host_bytes == 2 * sr.backup_bytes && wr.peer_bytes == 0 && wr.direct_pairs == 2);
  CHECK_OK(vmmw_pool_read(rp[1], ptr[1][1], back, (size_t)sizes[1], &err));
  CHECK(memcmp(back, bytes[1], sizes[1]) == 0);

  for (int d = 0; d < 2; ++d) {
    vmmw_pool_free(rp[d]);
    vmmw_device_free(dev[d]);
  }
}

/* Replicas asleep on one compressed host backup (vmmw_replicas_sleep_with,
 * the holder with VMMW_POLICY_OFFLOAD_COMPRESSED): bf16-like bytes over
 * several codec frames, a holder policy without a full backup refused, a
 * device failing mid-wake losing nothing, every device woken bit for bit
 * with only encoded bytes read from host memory. */
static void test_replicas_compressed_backup(void) {
  enum { NB = 2 };
  static const uint64_t sizes[NB] = {(3u << 20) + 6, 4001};
  static unsigned char bytes[NB][(3u << 20) + 6];
  uint32_t x = 12345;
  for (int i = 0; i < NB; ++i)
    for (uint64_t j = 0; j < sizes[i]; ++j) {
      x = x * 1664525u + 1013904223u;
      /* bf16 little-endian: a random low byte, a high byte (sign and
       * exponent) from four values, as weights of one scale have. */
      bytes[i][j] = (j % 2 == 0) ? (unsigned char)(x >> 24) : (unsigned char)(0x3c + ((x >> 20) & 1) + ((x >> 21) & 1) * 0x80);
    }
  vmmw_device_t* dev[2] = {NULL, NULL};
  vmmw_pool_t* rp[2] = {NULL, NULL};
  uint64_t ptr[2][NB];
  uint32_t tag = 0;
  CHECK_OK(vmmw_tag_id("replicas-c-compressed", &tag, &err));
  for (int d = 0; d < 2; ++d) {
    CHECK_OK(vmmw_device_open(VMMW_BACKEND_HOST, d, &dev[d], &err));
    vmmw_pool_options_t opts;
    memset(&opts, 0, sizeof opts);
    opts.size = sizeof opts;
    opts.device_handle = dev[d];
    CHECK_OK(vmmw_pool_new(&opts, &rp[d], &err));
    for (int i = 0; i < NB; ++i) {
      CHECK_OK(vmmw_pool_alloc_tagged(rp[d], sizes[i], tag, &ptr[d][i], &err));
      CHECK_OK(vmmw_pool_write(rp[d], ptr[d][i], bytes[i], sizes[i], &err));
    }
  }
  uint32_t tags[2] = {tag, tag};
  vmmw_replica_sleep_result_t sr;
  unsigned char probe[16];

  /* Bad options change nothing: size 0, a policy without a full backup, an unknown one. */
  vmmw_replica_sleep_options_t so;
  memset(&so, 0, sizeof so); /* size 0: never set */
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_replicas_sleep_with(rp, tags, 2, &so, &sr, NULL));
  vmmw_replica_sleep_options_t bad;
  memset(&bad, 0, sizeof bad);
  bad.size = sizeof bad;
  bad.holder_policy = VMMW_POLICY_RELOAD;
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_replicas_sleep_with(rp, tags, 2, &bad, &sr, NULL));
  bad.holder_policy = VMMW_POLICY_DISCARD;
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_replicas_sleep_with(rp, tags, 2, &bad, &sr, NULL));
  bad.holder_policy = 7;
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_replicas_sleep_with(rp, tags, 2, &bad, &sr, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_replicas_sleep_with(NULL, tags, 2, NULL, &sr, NULL));
  for (int d = 0; d < 2; ++d) CHECK_OK(vmmw_pool_read(rp[d], ptr[d][0], probe, sizeof probe, &err));

  vmmw_replica_sleep_options_t co;
  memset(&co, 0, sizeof co);
  co.size = sizeof co;
  co.holder_policy = VMMW_POLICY_OFFLOAD_COMPRESSED;
  memset(&sr, 0, sizeof sr);
  CHECK_OK(vmmw_replicas_sleep_with(rp, tags, 2, &co, &sr, &err));
  /* Half of the bytes are low-entropy exponents: well under raw. */
  CHECK(sr.backup_bytes > 0 && sr.backup_bytes * 10 < sr.released_bytes / 2 * 9);
  CHECK_STATUS(VMMW_INVALID_STATE, vmmw_pool_read(rp[1], ptr[1][0], probe, sizeof probe, NULL));

  /* Device 1 cannot create memory mid-wake: nothing is lost. */
  CHECK_OK(vmmw_host_fail_nth(dev[1], VMMW_FAULT_CREATE, 1, &err));
  vmmw_replica_wake_result_t wr;
  CHECK_STATUS(VMMW_OUT_OF_MEMORY, vmmw_replicas_wake_from_backup(rp, tags, 2, NULL, &wr, NULL));
  for (int d = 0; d < 2; ++d) {
    vmmw_host_counts_t c;
    CHECK_OK(vmmw_host_counts(dev[d], &c, &err));
    CHECK(c.physical_bytes == 0);
    CHECK_STATUS(VMMW_INVALID_STATE, vmmw_pool_read(rp[d], ptr[d][0], probe, sizeof probe, NULL));
  }

  memset(&wr, 0, sizeof wr);
  CHECK_OK(vmmw_replicas_wake_from_backup(rp, tags, 2, NULL, &wr, &err));
  CHECK(wr.host_bytes == sr.backup_bytes);
  CHECK(wr.delivered_bytes == sr.released_bytes);
  CHECK(wr.direct_pairs == 0);
  static unsigned char back[(3u << 20) + 6];
  for (int d = 0; d < 2; ++d)
    for (int i = 0; i < NB; ++i) {
      CHECK_OK(vmmw_pool_read(rp[d], ptr[d][i], back, (size_t)sizes[i], &err));
      CHECK(memcmp(back, bytes[i], sizes[i]) == 0);
    }

  /* vmmw_replicas_sleep keeps a raw backup: the same bytes come back. */
  CHECK_OK(vmmw_replicas_sleep(rp, tags, 2, &sr, &err));
  CHECK(sr.backup_bytes * 2 == sr.released_bytes);
  CHECK_OK(vmmw_replicas_wake_from_backup(rp, tags, 2, NULL, &wr, &err));
  CHECK_OK(vmmw_pool_read(rp[1], ptr[1][0], back, (size_t)sizes[0], &err));
  CHECK(memcmp(back, bytes[0], sizes[0]) == 0);

  for (int d = 0; d < 2; ++d) {
    vmmw_pool_free(rp[d]);
    vmmw_device_free(dev[d]);
  }
}

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
  /* The cancel rule: a load refused before its copies (here a loader with no
   * destinations) leaves every pending cancel; a load that ran its copies
   * clears every listed loader's. */
  vmmw_loader_t* bare = NULL;
  CHECK_OK(vmmw_loader_open(path, &bare, &err));
  vmmw_loader_t* refused[2] = {ld[0], bare};
  CHECK_OK(vmmw_loader_cancel(ld[0], &err));
  CHECK_OK(vmmw_loader_cancel(ld[1], &err));
  CHECK_STATUS(VMMW_PLAN_MISMATCH, vmmw_loader_load_devices(refused, cp, 2, VMMW_MULTI_REPLICAS, NULL, NULL));
  CHECK_STATUS(VMMW_CANCELLED, vmmw_loader_load_devices(cl, cp, 2, VMMW_MULTI_REPLICAS, NULL, NULL));
  CHECK_OK(vmmw_loader_load(ld[1], pools[1], NULL, NULL, &err)); /* ld[1]'s cancel was consumed too */
  vmmw_loader_free(bare);
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
  CHECK_STATUS(VMMW_UNKNOWN_TAG, vmmw_pool_peer_access_count(pools[0], 0x7fffffffu, &n, NULL));
  CHECK_STATUS(VMMW_UNKNOWN_TAG, vmmw_pool_peer_access_at(pools[0], 0x7fffffffu, 0, &got, NULL));
  vmmw_peer_access_t rw = {0, VMMW_ACCESS_READWRITE};
  CHECK_OK(vmmw_pool_set_peer_access(pools[1], tag, &rw, 1, &err));
  CHECK_OK(vmmw_pool_peer_access_at(pools[1], tag, 0, &got, &err));
  CHECK(got.device == 0 && got.access == VMMW_ACCESS_READWRITE);

  /* Ranks: each device loads its own loader's plan from host memory. */
  CHECK_OK(vmmw_loader_load_devices(cl, cp, 2, VMMW_MULTI_RANKS, &res, &err));
  CHECK(res.host_bytes == 2 * (sizeof wa + sizeof wb));
  CHECK(res.peer_bytes == 0);

  /* Replicas slept without backups wake by one checkpoint fan-out. */
  vmmw_tag_policy_t discard = {tag, VMMW_POLICY_DISCARD};
  for (int d = 0; d < 2; ++d) CHECK_OK(vmmw_pool_sleep(pools[d], &discard, 1, &err));
  memset(&res, 0, sizeof res);
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_replicas_wake_by_reload(NULL, cp, 2, &res, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_replicas_wake_by_reload(cl, cp, 0, &res, NULL));
  CHECK_OK(vmmw_replicas_wake_by_reload(cl, cp, 2, &res, &err));
  CHECK(res.host_bytes == sizeof wa + sizeof wb);
  CHECK(res.peer_bytes == sizeof wa + sizeof wb);
  for (int d = 0; d < 2; ++d) {
    vmmw_destination_t da;
    float back_a[32];
    CHECK_OK(vmmw_loader_destination(ld[d], "a.weight", &da, &err));
    CHECK_OK(vmmw_pool_read(pools[d], da.ptr, back_a, sizeof back_a, &err));
    CHECK(memcmp(back_a, wa, sizeof wa) == 0);
  }

  test_replicas_one_backup();
  test_replicas_compressed_backup();

  for (int d = 0; d < 2; ++d) {
    vmmw_loader_free(ld[d]);
    vmmw_pool_free(pools[d]);
  }
  unlink(path);
  rmdir(dir);
  printf("test_multi: %d checks passed\n", g_checks);
  return 0;
}
