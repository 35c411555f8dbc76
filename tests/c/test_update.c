/*
 * C ABI tests of updates on the host backend: a checkpoint loaded with a
 * fuse rule (two tensors into one destination) and a rename, then updated
 * from host and device tensors; versions; every problem listed and nothing
 * written; a Reload sleep after an update brings the update back; misuse.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "safetensors_writer.h"

static float q[4 * 3], k[2 * 3], n[5];
static float q2[4 * 3], k2[2 * 3], n2[5];

static const char* RULES =
    "{\"rules\": ["
    "{\"match\": \"q\\\\.weight\", \"to\": \"qk.weight\", \"fuse\": {\"dim\": 0, \"index\": 0}},"
    "{\"match\": \"k\\\\.weight\", \"to\": \"qk.weight\", \"fuse\": {\"dim\": 0, \"index\": 1}},"
    "{\"match\": \"norm\", \"to\": \"final.norm\"}]}";

int main(void) {
  char dir[] = "/tmp/vmmw-c-update-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[256];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  for (int i = 0; i < 12; ++i) q[i] = (float)i, q2[i] = (float)i + 0.25f;
  for (int i = 0; i < 6; ++i) k[i] = (float)-i, k2[i] = (float)i * 3.0f;
  for (int i = 0; i < 5; ++i) n[i] = 1.0f, n2[i] = 2.0f + (float)i;
  st_tensor ts[3] = {
      {"q.weight", "F32", {4, 3}, 2, q, sizeof q},
      {"k.weight", "F32", {2, 3}, 2, k, sizeof k},
      {"norm", "F32", {5}, 1, n, sizeof n},
  };
  CHECK(st_write(path, ts, 3) == 0);

  vmmw_error_t* err = NULL;
  /* Zeroed with size set (the INIT macros are C only; this file is also built as C++). */
  vmmw_pool_options_t po;
  memset(&po, 0, sizeof po);
  po.size = sizeof po;
  po.backend = VMMW_BACKEND_HOST;
  vmmw_pool_t* pool = NULL;
  CHECK_OK(vmmw_pool_new(&po, &pool, &err));
  uint32_t tag = 0;
  CHECK_OK(vmmw_tag_id("c-update-weights", &tag, &err));
  vmmw_loader_t* ld = NULL;
  CHECK_OK(vmmw_loader_open(path, &ld, &err));
  CHECK_OK(vmmw_loader_set_rules_json(ld, RULES, &err));
  CHECK_OK(vmmw_loader_allocate(ld, pool, tag, &err));
  CHECK_OK(vmmw_loader_load(ld, pool, NULL, NULL, &err));
  vmmw_destination_t dqk, dn;
  CHECK_OK(vmmw_loader_destination(ld, "qk.weight", &dqk, &err));
  CHECK_OK(vmmw_loader_destination(ld, "final.norm", &dn, &err));
  CHECK(dqk.shape[0] == 6 && dqk.shape[1] == 3);

  uint64_t version = 0;
  CHECK_OK(vmmw_pool_tag_version(pool, tag, &version, &err));
  CHECK(version == 1);
  uint32_t owner = 0;
  CHECK_OK(vmmw_pool_tag_of(pool, dqk.ptr + 4, &owner, &err));
  CHECK(owner == tag);
  CHECK_STATUS(VMMW_UNKNOWN_POINTER, vmmw_pool_tag_of(pool, 8, &owner, NULL));

  /* The trainer's tensors: q and k on the host, norm in device memory (a pool block). */
  uint64_t nb = 0;
  CHECK_OK(vmmw_pool_alloc(pool, sizeof n2, &nb, &err));
  CHECK_OK(vmmw_pool_write(pool, nb, n2, sizeof n2, &err));
  vmmw_update_source_t* src = NULL;
  CHECK_OK(vmmw_update_source_new(&src, &err));
  uint64_t sq[2] = {4, 3}, sk[2] = {2, 3}, sn[1] = {5};
  CHECK_OK(vmmw_update_source_add(src, "q.weight", "F32", sq, 2, (uint64_t)(uintptr_t)q2, VMMW_UPDATE_HOST, &err));
  CHECK_OK(vmmw_update_source_add(src, "k.weight", "float32", sk, 2, (uint64_t)(uintptr_t)k2, VMMW_UPDATE_HOST, &err));
  /* Bad adds change nothing. */
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_update_source_add(src, "q.weight", "F32", sq, 2, 1, VMMW_UPDATE_HOST, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_update_source_add(src, "x", "F99", sq, 2, 1, VMMW_UPDATE_HOST, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_update_source_add(src, "x", "F32", sq, 2, 0, VMMW_UPDATE_HOST, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_update_source_add(src, "x", "F32", sq, 2, 1, 7, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_update_source_add(src, "x", "F32", sq, 65, 1, VMMW_UPDATE_HOST, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_update_source_add(src, "x", "F32", NULL, 2, 1, VMMW_UPDATE_HOST, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_update_source_add(NULL, "x", "F32", sq, 2, 1, VMMW_UPDATE_HOST, NULL));

  vmmw_update_options_t uo;
  memset(&uo, 0, sizeof uo);
  uo.size = sizeof uo;
  vmmw_update_result_t ur;
  float before[18], after[18], nback[5];
  CHECK_OK(vmmw_pool_read(pool, dqk.ptr, before, sizeof before, &err));

  /* Missing `norm` and a wrong version: one error lists both, nothing written. */
  uo.expected_version = 5;
  CHECK(vmmw_update(ld, pool, src, &uo, &ur, &err) == VMMW_PLAN_MISMATCH);
  CHECK(strstr(vmmw_error_message(err), "final.norm") != NULL);
  CHECK(strstr(vmmw_error_message(err), "expects 5") != NULL);
  vmmw_error_free(err);
  err = NULL;
  CHECK_OK(vmmw_pool_read(pool, dqk.ptr, after, sizeof after, &err));
  CHECK(memcmp(before, after, sizeof before) == 0);
  /* Version 0 does not exist; NULL options or result are refused. */
  uo.expected_version = 0;
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_update(ld, pool, src, &uo, &ur, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_update(ld, pool, src, NULL, &ur, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_update(ld, pool, src, &uo, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_update(NULL, pool, src, &uo, &ur, NULL));
  uo.expected_version = 1;
  uo.staging = 9;
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_update(ld, pool, src, &uo, &ur, NULL));
  uo.staging = VMMW_STAGING_AUTO;

  /* Only the version is wrong: its own status. */
  CHECK_OK(vmmw_update_source_add(src, "norm", "F32", sn, 1, nb, VMMW_UPDATE_DEVICE, &err));
  uo.expected_version = 2;
  CHECK_STATUS(VMMW_VERSION_MISMATCH, vmmw_update(ld, pool, src, &uo, &ur, NULL));

  /* The update: qk holds q2 then k2 (fused), final.norm holds n2. */
  uo.expected_version = 1;
  CHECK_OK(vmmw_update(ld, pool, src, &uo, &ur, &err));
  CHECK(ur.version == 2 && ur.tag == tag && ur.destinations == 2 && !ur.staged);
  CHECK(ur.bytes == sizeof q2 + sizeof k2 + sizeof n2);
  /* Where the time went: every phase took some, together no more than the call. */
  CHECK(ur.plan_seconds > 0 && ur.issue_seconds > 0 && ur.wait_seconds >= 0 && ur.bookkeeping_seconds > 0);
  CHECK(ur.seconds <= ur.plan_seconds + ur.issue_seconds + ur.wait_seconds + ur.bookkeeping_seconds);
  CHECK_OK(vmmw_pool_read(pool, dqk.ptr, after, sizeof after, &err));
  CHECK(memcmp(after, q2, sizeof q2) == 0 && memcmp(after + 12, k2, sizeof k2) == 0);
  CHECK_OK(vmmw_pool_read(pool, dn.ptr, nback, sizeof nback, &err));
  CHECK(memcmp(nback, n2, sizeof n2) == 0);
  CHECK_OK(vmmw_pool_tag_version(pool, tag, &version, &err));
  CHECK(version == 2);
  int32_t torn = 1;
  CHECK_OK(vmmw_pool_tag_torn(pool, tag, &torn, &err));
  CHECK(torn == 0);

  /* Staged, the same bytes again: version 3. */
  uo.expected_version = 2;
  uo.staging = VMMW_STAGING_ALWAYS;
  CHECK_OK(vmmw_update(ld, pool, src, &uo, &ur, &err));
  CHECK(ur.version == 3 && ur.staged == 1);

  /* Reload after the update: the wake brings the update back, not the checkpoint. */
  vmmw_tag_policy_t item = {tag, VMMW_POLICY_RELOAD};
  CHECK_OK(vmmw_pool_sleep(pool, &item, 1, &err));
  CHECK_OK(vmmw_pool_wake(pool, &tag, 1, &err));
  CHECK_OK(vmmw_pool_read(pool, dqk.ptr, after, sizeof after, &err));
  CHECK(memcmp(after, q2, sizeof q2) == 0 && memcmp(after + 12, k2, sizeof k2) == 0);
  CHECK_OK(vmmw_pool_read(pool, dn.ptr, nback, sizeof nback, &err));
  CHECK(memcmp(nback, n2, sizeof n2) == 0);

  /* Publish moves the version; unknown tags are refused. */
  CHECK_OK(vmmw_pool_publish(pool, tag, &version, &err));
  CHECK(version == 4);
  CHECK_STATUS(VMMW_UNKNOWN_TAG, vmmw_pool_tag_version(pool, 0xFFFFFFu, &version, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_tag_version(pool, tag, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_publish(NULL, tag, &version, NULL));
  CHECK(strcmp(vmmw_status_name(VMMW_UPDATE_TORN), "VMMW_UPDATE_TORN") == 0);

  /* A receiver that keeps imports: connects only at receive; nothing there is an I/O error. */
  char none[512];
  snprintf(none, sizeof none, "%s/none.sock", dir);
  vmmw_update_receiver_t* rx = NULL;
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_update_receiver_new(NULL, none, 1000, 0, 0, &rx, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_update_receiver_new(pool, NULL, 1000, 0, 0, &rx, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_update_receiver_new(pool, none, 1000, 0, 0, NULL, NULL));
  CHECK(rx == NULL);
  CHECK_OK(vmmw_update_receiver_new(pool, none, 1000, 0, 0, &rx, &err));
  uo.expected_version = 4;
  uo.staging = VMMW_STAGING_AUTO;
  CHECK_STATUS(VMMW_IO, vmmw_update_receiver_receive(rx, ld, pool, &uo, &ur, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_update_receiver_receive(NULL, ld, pool, &uo, &ur, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_update_receiver_receive(rx, ld, pool, NULL, &ur, NULL));
  vmmw_receive_stats_t rs;
  memset(&rs, 0xff, sizeof rs);
  CHECK_OK(vmmw_update_receiver_stats(rx, &rs, &err));
  CHECK(rs.direct == 0 && rs.attached == 0 && rs.reused == 0 && rs.kept_imports == 0 && rs.kept_bytes == 0);
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_update_receiver_stats(rx, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_update_receiver_stats(NULL, &rs, NULL));
  CHECK_OK(vmmw_update_receiver_drop_imports(rx, &err));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_update_receiver_drop_imports(NULL, NULL));
  CHECK_OK(vmmw_pool_tag_version(pool, tag, &version, &err));
  CHECK(version == 4);
  vmmw_update_receiver_free(rx);
  vmmw_update_receiver_free(NULL);

  /* A receiver made on another device's pool is refused for this pool before
     it connects (not an I/O error: nothing is tried), the tag untouched. */
  vmmw_pool_options_t po1 = po;
  po1.device = 1;
  vmmw_pool_t* pool1 = NULL;
  CHECK_OK(vmmw_pool_new(&po1, &pool1, &err));
  CHECK_OK(vmmw_update_receiver_new(pool1, none, 1000, 0, 0, &rx, &err));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_update_receiver_receive(rx, ld, pool, &uo, &ur, NULL));
  CHECK_OK(vmmw_pool_tag_torn(pool, tag, &torn, &err));
  CHECK(torn == 0);
  CHECK_OK(vmmw_pool_tag_version(pool, tag, &version, &err));
  CHECK(version == 4);
  vmmw_update_receiver_free(rx);
  vmmw_pool_free(pool1);

  /* A broadcast load checks its handles before any NCCL call (no
     communicator exists without NCCL); the result is left alone. */
  vmmw_broadcast_load_result_t lr;
  memset(&lr, 0x5a, sizeof lr);
  uint32_t readers[1] = {0};
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_load_broadcast(NULL, ld, pool, readers, 1, 0, 0, 0, &lr, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_load_broadcast(NULL, ld, pool, readers, 1, 0, 0, 0, NULL, NULL));
  CHECK(lr.buckets == 0x5a5a5a5a5a5a5a5aull);

  vmmw_update_source_free(src);
  vmmw_update_source_free(NULL);
  CHECK_OK(vmmw_pool_dealloc(pool, nb, &err));
  vmmw_loader_free(ld);
  vmmw_pool_free(pool);
  unlink(path);
  rmdir(dir);
  printf("test_update: ok\n");
  return 0;
}
