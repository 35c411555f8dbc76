/*
 * C ABI tests of sharing on the host backend, owner and importer in one
 * process (tests/share_processes.rs covers separate processes): serve a
 * loader's destinations, attach, read the same bytes at other addresses,
 * publish a version, sleep refused while attached, bad arguments refused.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "safetensors_writer.h"

static float wa[4 * 3], wb[5];

int main(void) {
  char dir[] = "/tmp/vmmw-c-share-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[256], sock[256];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  snprintf(sock, sizeof sock, "%s/weights.sock", dir);
  for (int i = 0; i < 12; ++i) wa[i] = (float)i * 0.25f;
  for (int i = 0; i < 5; ++i) wb[i] = (float)(7 * i);
  st_tensor ts[2] = {
      {"a.weight", "F32", {4, 3}, 2, wa, sizeof wa},
      {"b.bias", "F32", {5}, 1, wb, sizeof wb},
  };
  CHECK(st_write(path, ts, 2) == 0);
  vmmw_error_t* err = NULL;

  /* Owner: load into a tag, serve it. */
  vmmw_pool_options_t opts;
  memset(&opts, 0, sizeof opts);
  opts.size = sizeof opts;
  opts.backend = VMMW_BACKEND_HOST;
  vmmw_pool_t* pool = NULL;
  CHECK_OK(vmmw_pool_new(&opts, &pool, &err));
  uint32_t tag = 0;
  CHECK_OK(vmmw_tag_id("shared-weights", &tag, &err));
  vmmw_loader_t* ld = NULL;
  CHECK_OK(vmmw_loader_open(path, &ld, &err));
  CHECK_OK(vmmw_loader_allocate(ld, pool, tag, &err));
  CHECK_OK(vmmw_loader_load(ld, pool, NULL, NULL, &err));

  vmmw_share_server_t* server = NULL;
  vmmw_share_options_t so;
  memset(&so, 0, sizeof so);
  so.size = sizeof so;
  so.sleep_policy = 7;
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_share_serve(pool, tag, ld, sock, &so, &server, NULL));
  so.sleep_policy = VMMW_SHARE_SLEEP_REFUSE;
  so.use_allowed_gid = 2;
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_share_serve(pool, tag, ld, sock, &so, &server, NULL));
  so.use_allowed_gid = 0;
  so.size = 0;
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_share_serve(pool, tag, ld, sock, &so, &server, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_share_serve(pool, tag, ld, NULL, NULL, &server, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_share_serve(pool, tag, ld, sock, NULL, NULL, NULL));
  uint32_t other = 0;
  CHECK_OK(vmmw_tag_id("not-the-weights", &other, &err));
  err = NULL;
  CHECK(vmmw_share_serve(pool, other, ld, sock, NULL, &server, &err) == VMMW_INVALID_ARGUMENT);
  CHECK(strstr(vmmw_error_message(err), "not inside the committed memory") != NULL);
  vmmw_error_free(err);
  CHECK(server == NULL && access(sock, F_OK) != 0);
  CHECK_OK(vmmw_share_serve(pool, tag, ld, sock, NULL, &server, &err));
  vmmw_destination_t owner_a;
  CHECK_OK(vmmw_loader_destination(ld, "a.weight", &owner_a, &err));
  vmmw_loader_free(ld);

  /* Importer: attach on its own device handle. */
  vmmw_device_t* dev = NULL;
  CHECK_OK(vmmw_device_open(VMMW_BACKEND_HOST, 0, &dev, &err));
  vmmw_share_t* share = NULL;
  CHECK_STATUS(VMMW_IO, vmmw_share_attach(dev, "/nonexistent/x.sock", 0, &share, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_share_attach(dev, sock, 2, &share, NULL));
  err = NULL;
  CHECK(vmmw_share_attach(dev, sock, 1, &share, &err) == VMMW_SHARE_REFUSED);
  CHECK(strstr(vmmw_error_message(err), "read-only") != NULL);
  vmmw_error_free(err);
  CHECK(share == NULL);
  CHECK_OK(vmmw_share_attach(dev, sock, 0, &share, &err));
  uint64_t attached = 0;
  CHECK_OK(vmmw_share_server_attached(server, &attached, &err));
  CHECK(attached == 1);

  size_t count = 0;
  CHECK_OK(vmmw_share_count(share, &count, &err));
  CHECK(count == 2);
  char name[32];
  CHECK_OK(vmmw_share_tensor_name(share, 0, name, sizeof name, NULL, &err));
  CHECK(strcmp(name, "a.weight") == 0);
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_share_tensor_name(share, 2, name, sizeof name, NULL, NULL));
  vmmw_destination_t a, b;
  CHECK_OK(vmmw_share_tensor(share, "a.weight", &a, &err));
  CHECK_OK(vmmw_share_tensor(share, "b.bias", &b, &err));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_share_tensor(share, "nope", &a, NULL));
  CHECK(a.ndim == 2 && a.shape[0] == 4 && a.shape[1] == 3 && strcmp(a.dtype, "F32") == 0);
  CHECK(a.ptr != owner_a.ptr && b.bytes == sizeof wb);
  /* Host backend: the imported memory is readable in this process. */
  CHECK(memcmp((const void*)(uintptr_t)a.ptr, wa, sizeof wa) == 0);
  CHECK(memcmp((const void*)(uintptr_t)b.ptr, wb, sizeof wb) == 0);
  float back[5];
  CHECK_OK(vmmw_share_read(share, b.ptr, back, sizeof back, &err));
  CHECK(memcmp(back, wb, sizeof wb) == 0);
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_share_read(share, b.ptr + (64u << 20), back, sizeof back, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_share_read(share, UINT64_MAX - 2, back, sizeof back, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_share_read(share, b.ptr, NULL, sizeof back, NULL));

  /* The owner writes in place and publishes; the importer sees both. */
  float one = 1234.5f;
  CHECK_OK(vmmw_pool_write(pool, owner_a.ptr, &one, sizeof one, &err));
  uint64_t version = 0;
  CHECK_OK(vmmw_share_server_publish(server, &version, &err));
  CHECK(version == 2);
  CHECK_OK(vmmw_share_version(share, &version, &err));
  CHECK(version == 2 && *(const float*)(uintptr_t)a.ptr == one);

  /* Default policy: the owner's sleep is refused while attached. */
  vmmw_tag_policy_t item = {tag, VMMW_POLICY_OFFLOAD};
  CHECK_STATUS(VMMW_INVALID_STATE, vmmw_pool_sleep(pool, &item, 1, NULL));
  uint32_t connected = 0;
  CHECK_OK(vmmw_share_owner_connected(share, &connected, &err));
  CHECK(connected == 1);
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_share_detach(NULL, NULL));
  CHECK_OK(vmmw_share_detach(share, &err));
  for (int i = 0; i < 500; ++i) {
    CHECK_OK(vmmw_share_server_attached(server, &attached, &err));
    if (attached == 0) break;
    struct timespec ms10 = {0, 10000000};
    nanosleep(&ms10, NULL);
  }
  CHECK(attached == 0);
  CHECK_OK(vmmw_pool_sleep(pool, &item, 1, &err));
  err = NULL;
  CHECK(vmmw_share_attach(dev, sock, 0, &share, &err) == VMMW_SHARE_REFUSED);
  CHECK(strstr(vmmw_error_message(err), "asleep") != NULL);
  vmmw_error_free(err);
  CHECK_OK(vmmw_pool_wake(pool, &tag, 1, &err));

  /* free: NULL is a no-op; a live share detaches; the server removes its socket. */
  vmmw_share_free(NULL);
  CHECK_OK(vmmw_share_attach(dev, sock, 0, &share, &err));
  vmmw_share_free(share);
  vmmw_share_server_free(NULL);
  vmmw_share_server_free(server);
  CHECK(access(sock, F_OK) != 0);
  vmmw_device_free(dev);
  vmmw_pool_free(pool);
  unlink(path);
  rmdir(dir);
  printf("test_share: %d checks passed\n", g_checks);
  return 0;
}
