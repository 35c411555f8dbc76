/*
 * C ABI tests of GGUF metadata on the host backend: every getter on a file
 * written here, every bad argument refused with its status and nothing
 * written, a hostile file refused at open, and the ggml type table.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "../../examples/gguf-runtime/tiny_gguf.h"

int main(void) {
  char dir[] = "/tmp/vmmw-test-metadata-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[256], bad[256];
  snprintf(path, sizeof path, "%s/m.gguf", dir);
  snprintf(bad, sizeof bad, "%s/cut.gguf", dir);
  uint8_t q8[2 * 34];
  for (size_t i = 0; i < sizeof q8; ++i) q8[i] = (uint8_t)i;
  tiny_tensor_t t[] = {{"w", 8, 2, {32, 2, 0, 0}, q8, sizeof q8}};
  tiny_gguf_write(path, "llama", 7, t, 1);

  /* A truncated copy: refused at open, `out` untouched. */
  {
    FILE* in = fopen(path, "rb");
    FILE* out = fopen(bad, "wb");
    CHECK(in && out);
    uint8_t buf[4096];
    size_t n = fread(buf, 1, sizeof buf, in);
    fwrite(buf, 1, n - 40, out); /* into the data: the last 28 bytes are padding */
    fclose(in);
    fclose(out);
  }
  vmmw_metadata_t* m = (vmmw_metadata_t*)(uintptr_t)0x1;
  vmmw_error_t* err = NULL;
  CHECK(vmmw_metadata_open(bad, &m, &err) == VMMW_CHECKPOINT_INVALID);
  CHECK(m == (vmmw_metadata_t*)(uintptr_t)0x1);
  CHECK(strstr(vmmw_error_message(err), "cut.gguf") && strstr(vmmw_error_message(err), "`w`"));
  vmmw_error_free(err);
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_metadata_open(NULL, &m, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_metadata_open(path, NULL, NULL));
  CHECK_STATUS(VMMW_IO, vmmw_metadata_open("/nonexistent/x.gguf", &m, NULL));

  m = NULL;
  CHECK_OK(vmmw_metadata_open(path, &m, &err));
  size_t n = 0, i = 99;
  CHECK_OK(vmmw_metadata_count(m, &n, &err));
  CHECK(n == 2);
  char key[64];
  size_t needed = 0;
  CHECK_OK(vmmw_metadata_key(m, 1, key, sizeof key, &needed, &err));
  CHECK(strcmp(key, "example.layers") == 0 && needed == strlen(key) + 1);
  char small[4] = "xyz";
  CHECK_STATUS(VMMW_BUFFER_TOO_SMALL, vmmw_metadata_key(m, 1, small, sizeof small, &needed, NULL));
  CHECK(strcmp(small, "xyz") == 0 && needed == 15);
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_metadata_key(m, 2, key, sizeof key, NULL, NULL));
  CHECK_OK(vmmw_metadata_find(m, "example.layers", &i, &err));
  CHECK(i == 1);
  i = 99;
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_metadata_find(m, "nope", &i, NULL));
  CHECK(i == 99);
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_metadata_find(m, NULL, &i, NULL));

  uint32_t type = 99, elem = 99;
  size_t len = 99;
  CHECK_OK(vmmw_metadata_type(m, 0, NULL, 0, &type, &elem, &len, &err));
  CHECK(type == VMMW_METADATA_STRING && elem == 0 && len == 0);
  CHECK_OK(vmmw_metadata_type(m, 1, NULL, 0, &type, NULL, NULL, &err));
  CHECK(type == VMMW_METADATA_UINT32);
  uint64_t u = 0;
  int64_t s = 0;
  double f = 1.0;
  uint8_t b = 7;
  CHECK_OK(vmmw_metadata_u64(m, 1, NULL, 0, &u, &err));
  CHECK_OK(vmmw_metadata_i64(m, 1, NULL, 0, &s, &err));
  CHECK(u == 7 && s == 7);
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_metadata_f64(m, 1, NULL, 0, &f, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_metadata_bool(m, 1, NULL, 0, &b, NULL));
  CHECK(f == 1.0 && b == 7);
  char arch[16];
  CHECK_OK(vmmw_metadata_string(m, 0, NULL, 0, arch, sizeof arch, NULL, &err));
  CHECK(strcmp(arch, "llama") == 0);
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_metadata_u64(m, 0, NULL, 0, &u, NULL));
  /* A path into a value that is not an array, a NULL path with a depth, too deep. */
  size_t path0[1] = {0};
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_metadata_u64(m, 1, path0, 1, &u, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_metadata_u64(m, 1, NULL, 1, &u, NULL));
  size_t deep[64] = {0};
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_metadata_u64(m, 1, deep, 64, &u, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_metadata_type(m, 5, NULL, 0, &type, NULL, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_metadata_type(m, 0, NULL, 0, NULL, NULL, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_metadata_count(NULL, &n, NULL));
  CHECK(u == 7);

  uint32_t id = 0;
  size_t block = 0, size = 0;
  CHECK_OK(vmmw_ggml_type("q4_k", &id, &block, &size, &err));
  CHECK(id == 12 && block == 256 && size == 144);
  CHECK_OK(vmmw_ggml_type("BF16", &id, NULL, NULL, &err));
  CHECK(id == 30);
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_ggml_type("Q4_2", &id, NULL, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_ggml_type(NULL, &id, NULL, NULL, NULL));

  vmmw_metadata_free(m);
  vmmw_metadata_free(NULL);
  unlink(path);
  unlink(bad);
  rmdir(dir);
  printf("test_metadata: %d checks passed\n", g_checks);
  return 0;
}
