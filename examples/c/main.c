/*
 * vmmweights from plain C: a pool (CUDA when present, else the host
 * simulation), a checkpoint loaded in place into it, sleep (the weights
 * offloaded to host memory, the device memory released, the pointers kept),
 * wake, and the memory report at each step.
 *
 * Usage: example-c [checkpoint]   (without one, a small checkpoint is written to /tmp)
 *
 * Every call follows one pattern: an int32_t status and, on failure, an owned
 * error object with the message.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vmmweights.h"

/* Run a call whose error argument is `&err_`; on failure print the message and exit. */
#define TRY(call)                                                                          \
  do {                                                                                     \
    vmmw_error_t* err_ = NULL;                                                             \
    int32_t rc_ = (call);                                                                  \
    if (rc_ != VMMW_OK) {                                                                  \
      fprintf(stderr, "%s failed: %s: %s\n", #call, vmmw_status_name(rc_),                 \
              vmmw_error_message(err_));                                                   \
      vmmw_error_free(err_);                                                               \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

/* A one-tensor safetensors file: "embed.weight", F32 [rows, 256], values i * 0.5. */
static void write_checkpoint(const char* path, int rows) {
  char header[256];
  uint64_t bytes = (uint64_t)rows * 256 * 4;
  int len = snprintf(header, sizeof header,
                     "{\"embed.weight\":{\"dtype\":\"F32\",\"shape\":[%d,256],\"data_offsets\":[0,%llu]}}",
                     rows, (unsigned long long)bytes);
  while (len % 8) header[len++] = ' ';
  FILE* f = fopen(path, "wb");
  if (!f) { perror(path); exit(1); }
  uint64_t n = (uint64_t)len; /* little-endian hosts */
  fwrite(&n, 8, 1, f);
  fwrite(header, 1, (size_t)len, f);
  for (uint64_t i = 0; i < bytes / 4; ++i) {
    float v = (float)i * 0.5f;
    fwrite(&v, 4, 1, f);
  }
  fclose(f);
}

static void print_report(const vmmw_pool_t* pool, const char* when) {
  vmmw_report_t r;
  TRY(vmmw_pool_report(pool, &r, &err_));
  printf("%-12s live %8llu B  reserved %8llu B  tracked %8llu B  host backup %8llu B  %s\n", when,
         (unsigned long long)r.live_bytes, (unsigned long long)r.reserved_bytes,
         (unsigned long long)r.tracked_bytes, (unsigned long long)r.host_backup_bytes,
         r.asleep ? "asleep" : "awake");
}

static float sum_of(const vmmw_pool_t* pool, const vmmw_destination_t* d) {
  float* host = (float*)malloc(d->bytes);
  TRY(vmmw_pool_read(pool, d->ptr, host, d->bytes, &err_));
  double s = 0;
  for (uint64_t i = 0; i < d->bytes / 4; ++i) s += host[i];
  free(host);
  return (float)s;
}

int main(int argc, char** argv) {
  char dir[] = "/tmp/vmmw-example-c-XXXXXX";
  char path[256];
  if (argc > 1) {
    snprintf(path, sizeof path, "%s", argv[1]);
  } else {
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_checkpoint(path, 1024);
  }
  printf("vmmweights %s (header %s)\n", vmmw_version_string(), VMMW_VERSION_STRING);

  vmmw_pool_t* pool = NULL;
  TRY(vmmw_pool_new(NULL, &pool, &err_)); /* NULL options: auto backend, device 0 */
  char desc[256];
  size_t needed = 0;
  vmmw_device_t* dev = NULL;
  TRY(vmmw_device_open(VMMW_BACKEND_AUTO, 0, &dev, &err_));
  TRY(vmmw_device_describe(dev, desc, sizeof desc, &needed, &err_));
  printf("device: %s\n", desc);
  vmmw_device_free(dev);

  uint32_t weights = 0;
  TRY(vmmw_tag_id("weights", &weights, &err_));
  vmmw_loader_t* loader = NULL;
  TRY(vmmw_loader_open(path, &loader, &err_));
  TRY(vmmw_loader_allocate(loader, pool, weights, &err_));
  TRY(vmmw_loader_load(loader, pool, NULL, NULL, &err_));
  vmmw_load_result_t res;
  TRY(vmmw_loader_result(loader, &res, &err_));
  printf("loaded %llu bytes in %.3f s (%.2f GB/s)\n", (unsigned long long)res.bytes, res.seconds, res.gbps);

  /* The first destination, whatever its name. */
  char name[256];
  TRY(vmmw_loader_destination_name(loader, 0, name, sizeof name, NULL, &err_));
  vmmw_destination_t d;
  TRY(vmmw_loader_destination(loader, name, &d, &err_));
  float before = sum_of(pool, &d);
  print_report(pool, "loaded");

  vmmw_tag_policy_t item = {weights, VMMW_POLICY_OFFLOAD};
  TRY(vmmw_pool_sleep(pool, &item, 1, &err_));
  print_report(pool, "asleep");
  TRY(vmmw_pool_wake(pool, &weights, 1, &err_));
  print_report(pool, "awake");
  float after = sum_of(pool, &d);
  printf("%s at 0x%llx: sum %.1f before sleep, %.1f after wake: %s\n", name, (unsigned long long)d.ptr,
         before, after, before == after ? "same" : "DIFFERENT");

  vmmw_loader_free(loader);
  vmmw_pool_free(pool);
  if (argc <= 1) {
    unlink(path);
    rmdir(dir);
  }
  return before == after ? 0 : 1;
}
