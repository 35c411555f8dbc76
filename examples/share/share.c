/*
 * Weights loaded once, read by another process.
 *
 *   share serve CHECKPOINT SOCKET   load the checkpoint into a pool tag and
 *                                   serve it until stdin closes
 *   share attach SOCKET             attach, checksum every tensor, detach
 *
 * Both print "sum=<hex>" over the same tensors, so a script can compare them
 * (examples/share/run.sh does). The backend is VMMW_BACKEND (auto: CUDA when
 * present, else the host simulation).
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vmmweights.h"

static int fail(const char* what, int32_t rc, vmmw_error_t* err) {
  fprintf(stderr, "%s: %s: %s\n", what, vmmw_status_name(rc), err ? vmmw_error_message(err) : "");
  vmmw_error_free(err);
  return 1;
}

#define TRY(what, call)                        \
  do {                                         \
    vmmw_error_t* err_ = NULL;                 \
    int32_t rc_ = (call);                      \
    if (rc_ != VMMW_OK) return fail(what, rc_, err_); \
  } while (0)

/* FNV-1a over a tensor's name and bytes, folded into `h`. */
static uint64_t fnv(uint64_t h, const void* p, size_t n) {
  const unsigned char* b = (const unsigned char*)p;
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ULL;
  return h;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int serve(const char* ckpt, const char* sock) {
  vmmw_pool_options_t po = VMMW_POOL_OPTIONS_INIT;
  vmmw_pool_t* pool = NULL;
  TRY("pool", vmmw_pool_new(&po, &pool, &err_));
  uint32_t tag = 0;
  TRY("tag", vmmw_tag_id("weights", &tag, &err_));
  vmmw_loader_t* ld = NULL;
  TRY("open", vmmw_loader_open(ckpt, &ld, &err_));
  TRY("allocate", vmmw_loader_allocate(ld, pool, tag, &err_));
  TRY("load", vmmw_loader_load(ld, pool, NULL, NULL, &err_));
  size_t n = 0;
  TRY("count", vmmw_loader_destination_count(ld, &n, &err_));
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; ++i) {
    char name[512];
    TRY("name", vmmw_loader_destination_name(ld, i, name, sizeof name, NULL, &err_));
    vmmw_destination_t d;
    TRY("destination", vmmw_loader_destination(ld, name, &d, &err_));
    void* buf = malloc(d.bytes ? d.bytes : 1);
    TRY("read", vmmw_pool_read(pool, d.ptr, buf, d.bytes, &err_));
    h = fnv(fnv(h, name, strlen(name)), buf, d.bytes);
    free(buf);
  }
  vmmw_share_server_t* server = NULL;
  TRY("serve", vmmw_share_serve(pool, tag, ld, sock, NULL, &server, &err_));
  vmmw_loader_free(ld); /* the server keeps its own list of tensors */
  printf("serving %zu tensors on %s sum=%016" PRIx64 "\n", n, sock, h);
  fflush(stdout);
  while (getchar() != EOF) {
  }
  vmmw_share_server_free(server);
  vmmw_pool_free(pool);
  return 0;
}

static int attach(const char* sock) {
  vmmw_device_t* dev = NULL;
  TRY("device", vmmw_device_open(VMMW_BACKEND_AUTO, 0, &dev, &err_));
  double t0 = now_ms();
  vmmw_share_t* share = NULL;
  TRY("attach", vmmw_share_attach(dev, sock, 0, &share, &err_));
  double attach_ms = now_ms() - t0;
  size_t n = 0;
  TRY("count", vmmw_share_count(share, &n, &err_));
  uint64_t version = 0;
  TRY("version", vmmw_share_version(share, &version, &err_));
  /* The owner's order is name order for a loader; hash in that order. */
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; ++i) {
    char name[512];
    TRY("name", vmmw_share_tensor_name(share, i, name, sizeof name, NULL, &err_));
    vmmw_destination_t d;
    TRY("tensor", vmmw_share_tensor(share, name, &d, &err_));
    void* buf = malloc(d.bytes ? d.bytes : 1);
    TRY("read", vmmw_share_read(share, d.ptr, buf, d.bytes, &err_));
    h = fnv(fnv(h, name, strlen(name)), buf, d.bytes);
    free(buf);
  }
  printf("attached %zu tensors in %.2f ms, version %" PRIu64 " sum=%016" PRIx64 "\n", n, attach_ms,
         version, h);
  TRY("detach", vmmw_share_detach(share, &err_));
  vmmw_device_free(dev);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 4 && strcmp(argv[1], "serve") == 0) return serve(argv[2], argv[3]);
  if (argc == 3 && strcmp(argv[1], "attach") == 0) return attach(argv[2]);
  fprintf(stderr, "usage: %s serve CHECKPOINT SOCKET | attach SOCKET\n", argv[0]);
  return 2;
}
