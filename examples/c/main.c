/*
 * vmmweights from plain C: open a device (CUDA when present, else the host
 * simulation), allocate VMM memory, write it, read it back, print what it did.
 * Error handling shows the pattern every call follows: a status return and an
 * owned error object.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmmweights.h"

/* Print the failed call's message, free the error object, return 1. */
static int fail(const char* what, int32_t rc, vmmw_error_t* err) {
  fprintf(stderr, "%s failed: %s: %s\n", what, vmmw_status_name(rc), vmmw_error_message(err));
  vmmw_error_free(err);
  return 1;
}

int main(void) {
  vmmw_error_t* err = NULL;
  vmmw_device_t* dev = NULL;
  int32_t rc = vmmw_device_open(VMMW_BACKEND_AUTO, 0, &dev, &err);
  if (rc != VMMW_OK) return fail("vmmw_device_open", rc, err);

  char desc[256];
  rc = vmmw_device_describe(dev, desc, sizeof desc, NULL, &err);
  if (rc != VMMW_OK) return fail("vmmw_device_describe", rc, err);
  printf("vmmweights %s (header %s) on %s\n", vmmw_version_string(), VMMW_VERSION_STRING, desc);

  uint64_t g = 0;
  rc = vmmw_device_granularity(dev, &g, &err);
  if (rc != VMMW_OK) return fail("vmmw_device_granularity", rc, err);

  vmmw_segment_t* seg = NULL;
  rc = vmmw_segment_new(dev, 2 * g, g, &seg, &err);
  if (rc != VMMW_OK) return fail("vmmw_segment_new", rc, err);

  const char msg[] = "weights live at stable addresses";
  char back[sizeof msg];
  rc = vmmw_segment_write(seg, g - 8, msg, sizeof msg, &err);
  if (rc == VMMW_OK) rc = vmmw_segment_read(seg, g - 8, back, sizeof back, &err);
  if (rc != VMMW_OK) return fail("segment copy", rc, err);
  if (memcmp(msg, back, sizeof msg) != 0) {
    fprintf(stderr, "read back differs\n");
    return 1;
  }
  vmmw_segment_info_t info;
  rc = vmmw_segment_info(seg, &info, &err);
  if (rc != VMMW_OK) return fail("vmmw_segment_info", rc, err);
  printf("segment at 0x%llx: %llu bytes reserved, %llu mapped, %llu chunks; round trip ok\n",
         (unsigned long long)info.ptr, (unsigned long long)info.reserved,
         (unsigned long long)info.mapped, (unsigned long long)info.chunks);

  vmmw_segment_free(seg);
  vmmw_device_free(dev);
  return 0;
}
