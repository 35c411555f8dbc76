/*
 * C ABI tests over the core: status codes, error objects, version, devices and
 * segments on the host backend. Built by scripts/test.d/30-c.sh with
 * AddressSanitizer + UndefinedBehaviorSanitizer, once as C and once as C++
 * (LeakSanitizer then proves every handle and error object is freed).
 */
#include <stdint.h>

#include "check.h"

static void test_status_names(void) {
  CHECK(strcmp(vmmw_status_name(VMMW_OK), "VMMW_OK") == 0);
  CHECK(strcmp(vmmw_status_name(VMMW_OUT_OF_MEMORY), "VMMW_OUT_OF_MEMORY") == 0);
  CHECK(strcmp(vmmw_status_name(VMMW_BUFFER_TOO_SMALL), "VMMW_BUFFER_TOO_SMALL") == 0);
  CHECK(strcmp(vmmw_status_name(-1), "VMMW_UNKNOWN_STATUS") == 0);
  CHECK(strcmp(vmmw_status_name(1000), "VMMW_UNKNOWN_STATUS") == 0);
  /* The numbers are ABI. */
  CHECK(VMMW_NULL_ARGUMENT == 2 && VMMW_PANIC == 14 && VMMW_BUFFER_TOO_SMALL == 16);
}

static void test_version(void) {
  CHECK(strcmp(vmmw_version_string(), VMMW_VERSION_STRING) == 0);
  CHECK(vmmw_version_major() == VMMW_VERSION_MAJOR);
  CHECK(vmmw_version_minor() == VMMW_VERSION_MINOR);
  CHECK(vmmw_version_patch() == VMMW_VERSION_PATCH);
}

static void test_error_objects(void) {
  vmmw_device_t* dev = NULL;
  vmmw_error_t* err = NULL;
  /* Unknown backend: error object with status and an actionable message. */
  CHECK(vmmw_device_open(7, 0, &dev, &err) == VMMW_INVALID_ARGUMENT);
  CHECK(dev == NULL); /* out-parameter untouched on failure */
  CHECK(err != NULL);
  CHECK(vmmw_error_status(err) == VMMW_INVALID_ARGUMENT);
  CHECK(strstr(vmmw_error_message(err), "backend 7") != NULL);
  vmmw_error_free(err);
  /* The error argument may be NULL. */
  CHECK(vmmw_device_open(7, 0, &dev, NULL) == VMMW_INVALID_ARGUMENT);
  /* NULL out-pointer. */
  err = NULL;
  CHECK(vmmw_device_open(VMMW_BACKEND_HOST, 0, NULL, &err) == VMMW_NULL_ARGUMENT);
  CHECK(strstr(vmmw_error_message(err), "`out`") != NULL);
  vmmw_error_free(err);
  /* NULL-tolerant accessors and frees. */
  CHECK(strcmp(vmmw_error_message(NULL), "") == 0);
  CHECK(vmmw_error_status(NULL) == VMMW_NULL_ARGUMENT);
  vmmw_error_free(NULL);
  vmmw_device_free(NULL);
  vmmw_segment_free(NULL);
}

static void test_device(vmmw_device_t* dev) {
  int32_t backend = -1;
  CHECK_OK(vmmw_device_backend(dev, &backend, &err));
  CHECK(backend == VMMW_BACKEND_HOST);
  uint64_t g = 0;
  CHECK_OK(vmmw_device_granularity(dev, &g, &err));
  CHECK(g > 0 && (g & (g - 1)) == 0);

  /* Buffer contract: size query, too small (nothing written), exact fit. */
  size_t needed = 0;
  CHECK_STATUS(VMMW_BUFFER_TOO_SMALL, vmmw_device_describe(dev, NULL, 0, &needed, NULL));
  CHECK(needed > 1);
  char small[2] = {'x', 'x'};
  size_t needed2 = 0;
  CHECK_STATUS(VMMW_BUFFER_TOO_SMALL, vmmw_device_describe(dev, small, sizeof small, &needed2, NULL));
  CHECK(needed2 == needed && small[0] == 'x' && small[1] == 'x');
  char* text = (char*)malloc(needed);
  CHECK_OK(vmmw_device_describe(dev, text, needed, NULL, &err));
  CHECK(strlen(text) + 1 == needed);
  CHECK(strstr(text, "host") != NULL);
  free(text);

  uint64_t free_b = 0, total_b = 0;
  CHECK_OK(vmmw_device_mem_info(dev, &free_b, &total_b, &err));
  CHECK(total_b >= free_b && total_b > 0);
  uint64_t untouched = 42;
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_device_mem_info(dev, &untouched, NULL, NULL));
  CHECK(untouched == 42);
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_device_granularity(NULL, &g, NULL));
}

static void test_segment(vmmw_device_t* dev) {
  uint64_t g = 0;
  CHECK_OK(vmmw_device_granularity(dev, &g, &err));
  vmmw_segment_t* seg = NULL;
  CHECK_OK(vmmw_segment_new(dev, 3 * g - 5, g, &seg, &err));
  vmmw_segment_info_t info;
  CHECK_OK(vmmw_segment_info(seg, &info, &err));
  CHECK(info.reserved == 3 * g && info.committed == 3 * g && info.mapped == 3 * g);
  CHECK(info.chunks == 3 && info.ptr != 0);

  /* A write spanning a chunk boundary reads back intact. */
  enum { N = 1000 };
  unsigned char in[N], out[N];
  for (int i = 0; i < N; ++i) in[i] = (unsigned char)(i * 7 + 3);
  CHECK_OK(vmmw_segment_write(seg, g - N / 2, in, N, &err));
  memset(out, 0, N);
  CHECK_OK(vmmw_segment_read(seg, g - N / 2, out, N, &err));
  CHECK(memcmp(in, out, N) == 0);

  /* Out-of-range and overflowing ranges are refused, nothing copied. */
  vmmw_error_t* err = NULL;
  CHECK(vmmw_segment_read(seg, 3 * g - 10, out, 11, &err) == VMMW_INVALID_ARGUMENT);
  CHECK(strstr(vmmw_error_message(err), "committed") != NULL);
  vmmw_error_free(err);
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_segment_read(seg, UINT64_MAX, out, 2, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_segment_write(seg, 0, NULL, 4, NULL));
  CHECK_OK(vmmw_segment_write(seg, 0, NULL, 0, &err)); /* empty copy */
  vmmw_segment_free(seg);

  /* The segment keeps its driver alive after the device handle is gone. */
  vmmw_device_t* dev2 = NULL;
  CHECK_OK(vmmw_device_open(VMMW_BACKEND_HOST, 0, &dev2, &err));
  CHECK_OK(vmmw_segment_new(dev2, g, 0, &seg, &err));
  vmmw_device_free(dev2);
  CHECK_OK(vmmw_segment_write(seg, 0, in, 16, &err));
  CHECK_OK(vmmw_segment_read(seg, 0, out, 16, &err));
  CHECK(memcmp(in, out, 16) == 0);
  vmmw_segment_free(seg);
}

static void test_failures_leave_nothing(vmmw_device_t* dev) {
  uint64_t g = 0;
  CHECK_OK(vmmw_device_granularity(dev, &g, &err));
  vmmw_host_counts_t before, after;
  CHECK_OK(vmmw_host_counts(dev, &before, &err));

  /* Out of (simulated) device memory: clear error, nothing left allocated. */
  CHECK_OK(vmmw_host_set_memory_limit(dev, 2 * g, &err));
  vmmw_segment_t* seg = NULL;
  vmmw_error_t* err = NULL;
  CHECK(vmmw_segment_new(dev, 4 * g, g, &seg, &err) == VMMW_OUT_OF_MEMORY);
  CHECK(seg == NULL);
  CHECK(strlen(vmmw_error_message(err)) > 0);
  CHECK(vmmw_error_driver_code(err) == 0); /* not a driver error */
  vmmw_error_free(err);
  CHECK(vmmw_error_driver_code(NULL) == 0);
  CHECK_OK(vmmw_host_counts(dev, &after, &err));
  CHECK(memcmp(&before, &after, sizeof before) == 0);
  CHECK_OK(vmmw_host_set_memory_limit(dev, UINT64_MAX / 2, &err));

  /* A failing map midway through the chunks. */
  CHECK_OK(vmmw_host_fail_nth(dev, VMMW_FAULT_MAP, 2, &err));
  vmmw_error_t* derr = NULL;
  CHECK(vmmw_segment_new(dev, 3 * g, g, &seg, &derr) == VMMW_DRIVER_ERROR);
  CHECK(vmmw_error_status(derr) == VMMW_DRIVER_ERROR);
  CHECK(vmmw_error_driver_code(derr) == -1); /* the host backend's injected failure */
  vmmw_error_free(derr);
  CHECK(seg == NULL);
  CHECK_OK(vmmw_host_counts(dev, &after, &err));
  CHECK(memcmp(&before, &after, sizeof before) == 0);
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_host_fail_nth(dev, 99, 1, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_segment_new(dev, 0, 0, &seg, NULL));
}

int main(void) {
  test_status_names();
  test_version();
  test_error_objects();
  vmmw_device_t* dev = NULL;
  CHECK_OK(vmmw_device_open(VMMW_BACKEND_HOST, 0, &dev, &err));
  test_device(dev);
  test_segment(dev);
  test_failures_leave_nothing(dev);
  vmmw_device_free(dev);
  printf("test_core: %d checks passed\n", g_checks);
  return 0;
}
