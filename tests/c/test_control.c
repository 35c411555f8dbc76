/*
 * C ABI tests of the control channel on the host backend (docs/PRELOAD.md):
 * this process serves its default pools on a control socket
 * (vmmw_control_serve) and drives itself through it, as `vmmw ctl` drives a
 * program under the interposer: status as JSON, sleep, wake, every byte at
 * its address; refusals carry the process's status and reason; bad
 * arguments are refused before anything is sent.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"

#define SIZE ((size_t)3 << 20)

static int holds(const unsigned char* p, size_t n, unsigned char seed) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != (unsigned char)((i % 251) ^ seed)) return 0;
  return 1;
}

int main(void) {
  char dir[] = "/tmp/vmmw-c-control-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char sock[256];
  snprintf(sock, sizeof sock, "%s/control.sock", dir);
  vmmw_error_t* err = NULL;

  vmmw_pool_t* pool = NULL;
  CHECK_OK(vmmw_pool_default(0, &pool, &err));
  vmmw_control_server_t* server = NULL;
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_control_serve(NULL, &server, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_control_serve(sock, NULL, NULL));
  CHECK_OK(vmmw_control_serve(sock, &server, &err));
  CHECK(server != NULL && access(sock, F_OK) == 0);
  /* The path is taken now. */
  vmmw_control_server_t* second = NULL;
  CHECK_STATUS(VMMW_IO, vmmw_control_serve(sock, &second, NULL));
  CHECK(second == NULL);

  /* Nothing allocated yet: a sleep is refused with the process's reason. */
  err = NULL;
  CHECK(vmmw_control_sleep(sock, VMMW_POLICY_OFFLOAD, NULL, 0, NULL, &err) == VMMW_INVALID_STATE);
  CHECK(strstr(vmmw_error_message(err), "no allocations yet") != NULL);
  vmmw_error_free(err);

  uint32_t tag = 0;
  CHECK_OK(vmmw_tag_id("c-control", &tag, &err));
  uint64_t ptr = 0;
  CHECK_OK(vmmw_pool_alloc_tagged(pool, SIZE, tag, &ptr, &err));
  unsigned char* p = (unsigned char*)(uintptr_t)ptr;
  for (size_t i = 0; i < SIZE; ++i) p[i] = (unsigned char)((i % 251) ^ 0x5a);

  /* Status: the size first, then the JSON. */
  size_t needed = 0;
  CHECK_STATUS(VMMW_BUFFER_TOO_SMALL, vmmw_control_status(sock, NULL, 0, &needed, NULL));
  CHECK(needed > 10);
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_control_status(sock, NULL, 8, &needed, NULL));
  char* json = (char*)malloc(needed + 4096);
  CHECK_OK(vmmw_control_status(sock, json, needed + 4096, &needed, &err));
  CHECK(strstr(json, "\"state\":\"awake\"") != NULL);
  CHECK(strstr(json, "\"tag\":\"c-control\"") != NULL);

  /* Sleep, with the figures; the JSON says asleep. */
  vmmw_control_result_t r;
  memset(&r, 0, sizeof r);
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_control_sleep(sock, VMMW_POLICY_RELOAD, NULL, 0, &r, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_control_sleep(sock, 42, NULL, 0, &r, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_control_sleep(sock, VMMW_POLICY_OFFLOAD, NULL, 1, &r, NULL));
  const char* nope[] = {"c-control-nope"};
  err = NULL;
  CHECK(vmmw_control_sleep(sock, VMMW_POLICY_OFFLOAD, nope, 1, &r, &err) == VMMW_UNKNOWN_TAG);
  CHECK(strstr(vmmw_error_message(err), "c-control-nope") != NULL);
  vmmw_error_free(err);
  CHECK(r.bytes == 0);
  const char* tags[] = {"c-control"};
  CHECK_OK(vmmw_control_sleep(sock, VMMW_POLICY_OFFLOAD, tags, 1, &r, &err));
  CHECK(r.bytes >= SIZE && r.backup_bytes >= SIZE && r.seconds >= r.sync_seconds);
  CHECK_OK(vmmw_control_status(sock, json, needed + 4096, &needed, &err));
  CHECK(strstr(json, "\"state\":\"asleep\"") != NULL);
  CHECK(strstr(json, "\"last\":{") != NULL);

  /* Wake (NULL result allowed): every byte at its address. */
  CHECK_OK(vmmw_control_wake(sock, 0, NULL, 0, NULL, &err));
  CHECK(holds(p, SIZE, 0x5a));
  /* Discard: the same addresses come back, their contents undefined. */
  CHECK_OK(vmmw_control_sleep(sock, VMMW_POLICY_DISCARD, NULL, 0, &r, &err));
  CHECK(r.backup_bytes == 0);
  memset(&r, 0, sizeof r);
  CHECK_OK(vmmw_control_wake(sock, 1000, tags, 1, &r, &err));
  CHECK(r.bytes >= SIZE && r.wait_seconds >= 0.0);
  memset(p, 7, SIZE);
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_control_wake(sock, 3600001, NULL, 0, NULL, NULL));

  /* Nobody serves a missing path. */
  char missing[300];
  snprintf(missing, sizeof missing, "%s/none.sock", dir);
  CHECK_STATUS(VMMW_IO, vmmw_control_status(missing, json, needed, &needed, NULL));
  /* Bad arguments are bad arguments whoever serves the path (checked before
   * it is reached, not answered by the process). */
  const char* bad_tags[] = {""};
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_control_wake(missing, 3600001, NULL, 0, NULL, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_control_wake(missing, 0, bad_tags, 1, NULL, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT,
               vmmw_control_sleep(missing, VMMW_POLICY_OFFLOAD, bad_tags, 1, NULL, NULL));

  free(json);
  vmmw_control_server_free(server);
  vmmw_control_server_free(NULL);
  CHECK(access(sock, F_OK) != 0);
  CHECK_OK(vmmw_pool_dealloc(pool, ptr, &err));
  vmmw_pool_free(pool);
  rmdir(dir);
  printf("test_control: %d checks passed\n", g_checks);
  return 0;
}
