/*
 * The C API under misuse: wrong numbers, wrong pointers and odd
 * files, as a careless or hostile engine would pass them. Every misuse must
 * return its documented status (never a signal, an abort, a hang or a silent
 * overwrite) and leave the library usable: each section ends with a
 * successful round trip through the pool.
 *
 * Run by scripts/test.d/30-c.sh under AddressSanitizer + UndefinedBehavior-
 * Sanitizer (as C and as C++). With the argument `memory` it runs the
 * host-memory cases instead; 30-c.sh runs those in a plain build under
 * `ulimit -v` (the sanitizers reserve terabytes of address space).
 * VMMW_MISUSE_BACKEND=cuda runs the pools on the CUDA backend instead
 * (scripts/gpu.d/70-misuse.sh); the host is the default.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "safetensors_writer.h"

static char g_dir[] = "/tmp/vmmw-c-misuse-XXXXXX";
static int32_t g_backend = VMMW_BACKEND_HOST;

/* Expect `call` to fail with `want` and its message to contain `needle`. */
#define CHECK_MSG(want, needle, call)                                                    \
  do {                                                                                   \
    vmmw_error_t* e_ = NULL;                                                             \
    int32_t rc_ = (call);                                                                \
    ++g_checks;                                                                          \
    if (rc_ != (want) || strstr(vmmw_error_message(e_), (needle)) == NULL) {             \
      fprintf(stderr, "%s:%d: %s returned %s (%s), want %s with `%s`\n", __FILE__,       \
              __LINE__, #call, vmmw_status_name(rc_), vmmw_error_message(e_),            \
              vmmw_status_name(want), (needle));                                         \
      exit(1);                                                                           \
    }                                                                                    \
    vmmw_error_free(e_);                                                                 \
  } while (0)
#define ERR (&e_)

static vmmw_pool_t* host_pool(void) {
  vmmw_pool_options_t o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.backend = g_backend;
  vmmw_pool_t* p = NULL;
  CHECK_OK(vmmw_pool_new(&o, &p, &err));
  return p;
}

/* The library still works: allocate, write, read back, free. */
static void still_usable(vmmw_pool_t* pool) {
  uint64_t p = 0;
  unsigned char in[4096], out[4096];
  for (int i = 0; i < 4096; ++i) in[i] = (unsigned char)(i * 31 + 7);
  CHECK_OK(vmmw_pool_alloc(pool, sizeof in, &p, &err));
  CHECK_OK(vmmw_pool_write(pool, p, in, sizeof in, &err));
  CHECK_OK(vmmw_pool_read(pool, p, out, sizeof out, &err));
  CHECK(memcmp(in, out, sizeof in) == 0);
  CHECK_OK(vmmw_pool_dealloc(pool, p, &err));
}

/* ---- NULL for every pointer argument ---------------------------------- */

static void null_arguments(vmmw_pool_t* pool) {
  uint64_t u64 = 7;
  size_t sz = 7;
  uint32_t u32 = 7;
  int32_t i32 = 7;
  char buf[64];
  vmmw_device_t* dev = NULL;
  CHECK_OK(vmmw_device_open(VMMW_BACKEND_HOST, 0, &dev, &err));

  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_device_open(VMMW_BACKEND_HOST, 0, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_device_backend(NULL, &i32, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_device_backend(dev, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_device_granularity(NULL, &u64, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_device_granularity(dev, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_device_mem_info(NULL, &u64, &u64, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_device_mem_info(dev, NULL, &u64, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_device_describe(NULL, buf, sizeof buf, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_device_choice_reason(NULL, buf, sizeof buf, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_device_synchronize(NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_host_set_memory_limit(NULL, 1, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_host_fail_nth(NULL, VMMW_FAULT_CREATE, 1, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_host_counts(NULL, NULL, NULL));
  vmmw_host_counts_t hc;
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_host_counts(dev, NULL, NULL));
  CHECK_OK(vmmw_host_counts(dev, &hc, &err));

  /* The buffer contract: NULL buf with cap > 0 writes nothing, not even *needed. */
  sz = 7;
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_device_describe(dev, NULL, 64, &sz, NULL));
  CHECK(sz == 7);
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_report_json(pool, NULL, 1 << 20, &sz, NULL));
  CHECK(sz == 7);
  CHECK_STATUS(VMMW_BUFFER_TOO_SMALL, vmmw_pool_report_json(pool, NULL, 0, &sz, NULL));
  CHECK(sz > 1);

  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_new(NULL, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_default(0, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_alloc(NULL, 64, &u64, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_alloc(pool, 64, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_alloc_tagged(NULL, 64, 0, &u64, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_alloc_tagged(pool, 64, 0, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_dealloc(NULL, 0x1000, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_trim(NULL, &u64, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_set_tag_arena(NULL, 0, 1 << 20, 0, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_set_tag_segments(NULL, 0, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_report(NULL, NULL, NULL));
  vmmw_report_t rep;
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_report(pool, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_report_tag(NULL, 0, &rep, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_report_tag(pool, 0, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_report_json(NULL, buf, sizeof buf, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_snapshot(NULL, "x", NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_snapshot(pool, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_timeline_json(NULL, buf, sizeof buf, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_clear_timeline(NULL, &u64, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_write(NULL, 0x1000, buf, 4, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_read(NULL, 0x1000, buf, 4, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_sleep(NULL, NULL, 0, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_sleep(pool, NULL, 1, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_wake(NULL, NULL, 0, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_wake(pool, NULL, 1, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_reserve_backup(NULL, 1, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_release_backup(NULL, &u64, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_set_sleep_options(NULL, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_last_cycle_json(NULL, buf, sizeof buf, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_staging_bytes(NULL, &u64, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_pool_release_staging(NULL, &u64, NULL));

  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_segment_new(NULL, 1 << 21, 0, NULL, NULL));
  vmmw_segment_t* seg = NULL;
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_segment_new(dev, 1 << 21, 0, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_segment_info(NULL, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_segment_write(NULL, 0, buf, 4, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_segment_read(NULL, 0, buf, 4, NULL));
  CHECK_OK(vmmw_segment_new(dev, 1 << 21, 0, &seg, &err));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_segment_read(seg, 0, NULL, 4, NULL));
  vmmw_segment_free(seg);

  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_tag_id(NULL, &u32, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_tag_id("misuse-null", NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_tag_current(NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_tag_name(0, NULL, 16, NULL, NULL));

  vmmw_loader_t* ld = NULL;
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_loader_open(NULL, &ld, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_loader_open("x", NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_loader_set_rules_json(NULL, "{}", NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_loader_set_rules_preset(NULL, "llama", 0, 0, 128, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_loader_set_options(NULL, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_loader_register(NULL, "w", 0x1000, "F32", NULL, 0, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_loader_declare_foreign(NULL, 0x1000, 16, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_loader_allocate(NULL, pool, 0, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_loader_destination_count(NULL, &sz, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_loader_destination_name(NULL, 0, buf, sizeof buf, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_loader_destination(NULL, "w", NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_loader_plan(NULL, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_loader_load(NULL, pool, NULL, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_loader_cancel(NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_loader_result(NULL, NULL, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_loader_result_json(NULL, buf, sizeof buf, NULL, NULL));

  /* NULL-tolerant frees and accessors. */
  vmmw_pool_free(NULL);
  vmmw_loader_free(NULL);
  vmmw_segment_free(NULL);
  vmmw_device_free(NULL);
  vmmw_error_free(NULL);
  CHECK(vmmw_error_status(NULL) == VMMW_NULL_ARGUMENT);
  CHECK(vmmw_torch_malloc(0, 0, NULL) == NULL);
  vmmw_torch_free(NULL, 0, 0, NULL);
  vmmw_device_free(dev);
  still_usable(pool);
}

/* ---- zero and huge sizes (item 8) ------------------------------------- */

static void sizes(vmmw_pool_t* pool) {
  uint64_t p = 0;
  vmmw_device_t* dev = NULL;
  CHECK_OK(vmmw_device_open(g_backend, 0, &dev, &err));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pool_alloc(pool, 0, &p, NULL));
  const uint64_t huge[] = {(1ull << 62) - 1, 1ull << 62, 1ull << 63, UINT64_MAX, UINT64_MAX - 511};
  for (size_t i = 0; i < sizeof huge / sizeof huge[0]; ++i) {
    CHECK_MSG(VMMW_OUT_OF_MEMORY, "out of device memory", vmmw_pool_alloc(pool, huge[i], &p, ERR));
    CHECK(p == 0);
  }
  vmmw_segment_t* seg = NULL;
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_segment_new(dev, 0, 0, &seg, NULL));
  CHECK_MSG(VMMW_INVALID_ARGUMENT, "2^56", vmmw_segment_new(dev, UINT64_MAX, 0, &seg, ERR));
  CHECK_MSG(VMMW_INVALID_ARGUMENT, "2^56", vmmw_segment_new(dev, 1 << 21, UINT64_MAX, &seg, ERR));
  CHECK(seg == NULL);
  /* Pool sizes of UINT64_MAX: a clear refusal naming the field, not "size 0". */
  vmmw_pool_options_t o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.device_handle = dev;
  vmmw_pool_t* bad = NULL;
  o.large_segment_bytes = UINT64_MAX;
  CHECK_MSG(VMMW_INVALID_ARGUMENT, "large_segment_bytes", vmmw_pool_new(&o, &bad, ERR));
  o.large_segment_bytes = 0;
  o.small_segment_bytes = UINT64_MAX;
  CHECK_MSG(VMMW_INVALID_ARGUMENT, "small_segment_bytes", vmmw_pool_new(&o, &bad, ERR));
  o.small_segment_bytes = 0;
  o.chunk_bytes = UINT64_MAX;
  CHECK_MSG(VMMW_INVALID_ARGUMENT, "chunk_bytes", vmmw_pool_new(&o, &bad, ERR));
  o.chunk_bytes = 0;
  o.align = 3;
  CHECK_MSG(VMMW_INVALID_ARGUMENT, "power of two", vmmw_pool_new(&o, &bad, ERR));
  o.align = 1ull << 63;
  CHECK_MSG(VMMW_INVALID_ARGUMENT, "align", vmmw_pool_new(&o, &bad, ERR));
  CHECK(bad == NULL);
  uint32_t t = 0;
  CHECK_OK(vmmw_tag_id("misuse-arena", &t, &err));
  CHECK_MSG(VMMW_INVALID_ARGUMENT, "reserve_bytes", vmmw_pool_set_tag_arena(pool, t, UINT64_MAX, 0, ERR));
  CHECK_MSG(VMMW_INVALID_ARGUMENT, "reserve_bytes", vmmw_pool_set_tag_arena(pool, t, 1 << 22, UINT64_MAX, ERR));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pool_set_tag_arena(pool, t, 0, 0, NULL));
  /* Reads and writes with ranges that overflow or run past a segment. */
  uint64_t q = 0;
  unsigned char b[16] = {0};
  CHECK_OK(vmmw_pool_alloc(pool, 4096, &q, &err));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pool_write(pool, UINT64_MAX - 4, b, sizeof b, NULL));
  CHECK_STATUS(VMMW_UNKNOWN_POINTER, vmmw_pool_read(pool, 16, b, sizeof b, NULL));
  CHECK_OK(vmmw_pool_dealloc(pool, q, &err));
  vmmw_device_free(dev);
  still_usable(pool);
}

/* ---- double, foreign and interior frees ------------------------------- */

static void frees(vmmw_pool_t* pool) {
  uint64_t p = 0, q = 0;
  CHECK_OK(vmmw_pool_alloc(pool, 4096, &p, &err));
  CHECK_OK(vmmw_pool_alloc(pool, 4096, &q, &err));
  CHECK_OK(vmmw_pool_dealloc(pool, p, &err));
  CHECK_STATUS(VMMW_UNKNOWN_POINTER, vmmw_pool_dealloc(pool, p, NULL));     /* double */
  CHECK_STATUS(VMMW_UNKNOWN_POINTER, vmmw_pool_dealloc(pool, q + 512, NULL)); /* interior */
  CHECK_STATUS(VMMW_UNKNOWN_POINTER, vmmw_pool_dealloc(pool, 0, NULL));
  CHECK_STATUS(VMMW_UNKNOWN_POINTER, vmmw_pool_dealloc(pool, 0xdead0000ull, NULL));
  CHECK_STATUS(VMMW_UNKNOWN_POINTER, vmmw_pool_dealloc(pool, UINT64_MAX, NULL));
  /* A block of another pool is foreign here, and still live there. */
  vmmw_pool_t* other = host_pool();
  uint64_t r = 0;
  CHECK_OK(vmmw_pool_alloc(other, 4096, &r, &err));
  CHECK_STATUS(VMMW_UNKNOWN_POINTER, vmmw_pool_dealloc(pool, r, NULL));
  still_usable(other);
  CHECK_OK(vmmw_pool_dealloc(other, r, &err));
  vmmw_pool_free(other);
  CHECK_OK(vmmw_pool_dealloc(pool, q, &err));
  /* torch entry points: freeing what they never gave. */
  vmmw_torch_free((void*)(uintptr_t)0xdead0000ull, 64, 0, NULL);
  still_usable(pool);
}

/* ---- tag misuse -------------------------------------------------------- */

static void tags(vmmw_pool_t* pool) {
  uint32_t t = 0, first = 0;
  char name[300];
  /* 10,000 tags: each an id, each usable. */
  for (int i = 0; i < 10000; ++i) {
    snprintf(name, sizeof name, "misuse-many-%d", i);
    CHECK_OK(vmmw_tag_id(name, &t, &err));
    if (i == 0) first = t;
  }
  CHECK(t == first + 9999);
  uint64_t p = 0;
  CHECK_OK(vmmw_pool_alloc_tagged(pool, 64, t, &p, &err));
  CHECK_OK(vmmw_pool_dealloc(pool, p, &err));
  /* Bad names. */
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_tag_id("", &t, NULL));
  memset(name, 'x', sizeof name - 1);
  name[sizeof name - 1] = 0;
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_tag_id(name, &t, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_tag_id("bad\nname", &t, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_tag_id("\xff\xfe", &t, NULL));
  /* Unknown ids. */
  CHECK_STATUS(VMMW_UNKNOWN_TAG, vmmw_tag_push(4000000000u, NULL));
  CHECK_STATUS(VMMW_UNKNOWN_TAG, vmmw_pool_alloc_tagged(pool, 64, 4000000000u, &p, NULL));
  CHECK_STATUS(VMMW_UNKNOWN_TAG, vmmw_tag_set_process_default(4000000000u, NULL));
  char buf[8];
  CHECK_STATUS(VMMW_UNKNOWN_TAG, vmmw_tag_name(4000000000u, buf, sizeof buf, NULL, NULL));
  /* Pop without push; deep push and pop back. */
  CHECK_STATUS(VMMW_INVALID_STATE, vmmw_tag_pop(NULL));
  for (int i = 0; i < 1000; ++i) CHECK_OK(vmmw_tag_push(first, &err));
  for (int i = 0; i < 1000; ++i) CHECK_OK(vmmw_tag_pop(&err));
  CHECK_STATUS(VMMW_INVALID_STATE, vmmw_tag_pop(NULL));
  uint32_t cur = 99;
  CHECK_OK(vmmw_tag_current(&cur, &err));
  CHECK(cur == VMMW_TAG_DEFAULT);
  still_usable(pool);
}

/* ---- sleep and wake misuse (items 4 and 5) ---------------------------- */

static void sleep_wake(vmmw_pool_t* pool) {
  uint32_t w = 0;
  CHECK_OK(vmmw_tag_id("misuse-sleep", &w, &err));
  uint64_t p = 0;
  unsigned char in[256], out[256];
  for (int i = 0; i < 256; ++i) in[i] = (unsigned char)(255 - i);
  CHECK_OK(vmmw_pool_alloc_tagged(pool, sizeof in, w, &p, &err));
  CHECK_OK(vmmw_pool_write(pool, p, in, sizeof in, &err));

  vmmw_tag_policy_t bad_policy = {w, 42};
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pool_sleep(pool, &bad_policy, 1, NULL));
  vmmw_tag_policy_t unknown = {4000000000u, VMMW_POLICY_OFFLOAD};
  CHECK_STATUS(VMMW_UNKNOWN_TAG, vmmw_pool_sleep(pool, &unknown, 1, NULL));
  uint32_t unknown_id = 4000000000u;
  CHECK_STATUS(VMMW_UNKNOWN_TAG, vmmw_pool_wake(pool, &unknown_id, 1, NULL));
  CHECK_OK(vmmw_pool_wake(pool, &w, 1, &err)); /* waking an awake tag: nothing to do */
  CHECK_OK(vmmw_pool_sleep(pool, NULL, 0, &err));
  /* Reload without a load behind it. */
  vmmw_tag_policy_t reload = {w, VMMW_POLICY_RELOAD};
  CHECK_STATUS(VMMW_INVALID_STATE, vmmw_pool_sleep(pool, &reload, 1, NULL));

  /* Option limits: streams = UINT32_MAX used to create streams until abort. */
  vmmw_sleep_options_t so;
  memset(&so, 0, sizeof so);
  so.size = sizeof so;
  so.streams = UINT32_MAX;
  CHECK_MSG(VMMW_INVALID_ARGUMENT, "streams", vmmw_pool_set_sleep_options(pool, &so, ERR));
  so.streams = 65;
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_pool_set_sleep_options(pool, &so, NULL));
  so.streams = 0;
  so.copy_piece_bytes = UINT64_MAX;
  CHECK_MSG(VMMW_INVALID_ARGUMENT, "copy_piece_bytes", vmmw_pool_set_sleep_options(pool, &so, ERR));
  so.copy_piece_bytes = 0;
  so.backup_slab_bytes = UINT64_MAX;
  CHECK_MSG(VMMW_INVALID_ARGUMENT, "backup_slab_bytes", vmmw_pool_set_sleep_options(pool, &so, ERR));
  so.backup_slab_bytes = 0;
  so.wake_coalesce_bytes = UINT64_MAX;
  CHECK_MSG(VMMW_INVALID_ARGUMENT, "wake_coalesce_bytes", vmmw_pool_set_sleep_options(pool, &so, ERR));
  so.wake_coalesce_bytes = 0;
  so.streams = 64;
  CHECK_OK(vmmw_pool_set_sleep_options(pool, &so, &err));

  /* Reserve 2^63 bytes: refused at once (it built 2^35 slab sizes), nothing pinned. */
  CHECK_MSG(VMMW_HOST_OUT_OF_MEMORY, "out of host memory", vmmw_pool_reserve_backup(pool, 1ull << 63, ERR));
  CHECK_STATUS(VMMW_HOST_OUT_OF_MEMORY, vmmw_pool_reserve_backup(pool, UINT64_MAX, NULL));
  uint64_t released = 99;
  CHECK_OK(vmmw_pool_release_backup(pool, &released, &err));
  CHECK(released == 0);
  so.host_memory_limit = 4u << 20;
  CHECK_OK(vmmw_pool_set_sleep_options(pool, &so, &err));
  CHECK_STATUS(VMMW_HOST_OUT_OF_MEMORY, vmmw_pool_reserve_backup(pool, 64u << 20, NULL));
  CHECK_OK(vmmw_pool_release_backup(pool, &released, &err));
  CHECK(released == 0);

  /* Sleep with 64 streams; memory of a sleeping tag is refused, then wake. */
  vmmw_tag_policy_t off = {w, VMMW_POLICY_OFFLOAD};
  CHECK_OK(vmmw_pool_sleep(pool, &off, 1, &err));
  CHECK_OK(vmmw_pool_sleep(pool, &off, 1, &err)); /* already asleep: left as is */
  CHECK_STATUS(VMMW_INVALID_STATE, vmmw_pool_write(pool, p, in, sizeof in, NULL));
  CHECK_STATUS(VMMW_INVALID_STATE, vmmw_pool_read(pool, p, out, sizeof out, NULL));
  uint64_t q = 0;
  CHECK_STATUS(VMMW_INVALID_STATE, vmmw_pool_alloc_tagged(pool, 64, w, &q, NULL));
  CHECK_OK(vmmw_pool_wake(pool, &w, 1, &err));
  CHECK_OK(vmmw_pool_read(pool, p, out, sizeof out, &err));
  CHECK(memcmp(in, out, sizeof in) == 0);
  CHECK_OK(vmmw_pool_set_sleep_options(pool, NULL, &err));
  CHECK_OK(vmmw_pool_dealloc(pool, p, &err));
  CHECK_OK(vmmw_pool_release_backup(pool, &released, &err));
  still_usable(pool);
}

/* ---- an 8-thread sleep/wake storm on one tag, 6 threads allocating elsewhere */

typedef struct {
  vmmw_pool_t* pool;
  uint32_t tag;
  int id;
  int failures;
} storm_arg;

static void* storm_sleeper(void* v) {
  storm_arg* a = (storm_arg*)v;
  for (int i = 0; i < 40; ++i) {
    vmmw_tag_policy_t item = {a->tag, VMMW_POLICY_OFFLOAD};
    vmmw_error_t* e = NULL;
    int32_t rc = ((i + a->id) % 2) ? vmmw_pool_sleep(a->pool, &item, 1, &e)
                                   : vmmw_pool_wake(a->pool, &a->tag, 1, &e);
    if (rc != VMMW_OK) {
      fprintf(stderr, "storm sleeper %d: %s\n", a->id, vmmw_error_message(e));
      a->failures++;
    }
    vmmw_error_free(e);
  }
  return NULL;
}

static void* storm_allocator(void* v) {
  storm_arg* a = (storm_arg*)v;
  unsigned char in[1000], out[1000];
  for (int i = 0; i < 60; ++i) {
    uint64_t p = 0;
    size_t n = 100 + (size_t)((i * 37 + a->id * 11) % 900);
    for (size_t k = 0; k < n; ++k) in[k] = (unsigned char)(k + (size_t)i + (size_t)a->id);
    if (vmmw_pool_alloc_tagged(a->pool, n, a->tag, &p, NULL) != VMMW_OK ||
        vmmw_pool_write(a->pool, p, in, n, NULL) != VMMW_OK ||
        vmmw_pool_read(a->pool, p, out, n, NULL) != VMMW_OK || memcmp(in, out, n) != 0 ||
        vmmw_pool_dealloc(a->pool, p, NULL) != VMMW_OK)
      a->failures++;
  }
  return NULL;
}

static void storm(vmmw_pool_t* pool) {
  uint32_t hot = 0;
  CHECK_OK(vmmw_tag_id("misuse-storm", &hot, &err));
  uint64_t p = 0;
  unsigned char in[512], out[512];
  for (int i = 0; i < 512; ++i) in[i] = (unsigned char)(i * 13);
  CHECK_OK(vmmw_pool_alloc_tagged(pool, sizeof in, hot, &p, &err));
  CHECK_OK(vmmw_pool_write(pool, p, in, sizeof in, &err));
  pthread_t th[14];
  storm_arg args[14];
  for (int i = 0; i < 14; ++i) {
    args[i].pool = pool;
    args[i].id = i;
    args[i].failures = 0;
    if (i < 8) {
      args[i].tag = hot;
    } else {
      char name[32];
      snprintf(name, sizeof name, "misuse-storm-alloc-%d", i);
      CHECK_OK(vmmw_tag_id(name, &args[i].tag, &err));
    }
    CHECK(pthread_create(&th[i], NULL, i < 8 ? storm_sleeper : storm_allocator, &args[i]) == 0);
  }
  for (int i = 0; i < 14; ++i) {
    CHECK(pthread_join(th[i], NULL) == 0);
    CHECK(args[i].failures == 0);
  }
  CHECK_OK(vmmw_pool_wake(pool, &hot, 1, &err));
  CHECK_OK(vmmw_pool_read(pool, p, out, sizeof out, &err));
  CHECK(memcmp(in, out, sizeof in) == 0);
  CHECK_OK(vmmw_pool_dealloc(pool, p, &err));
  uint64_t released = 0;
  CHECK_OK(vmmw_pool_release_backup(pool, &released, &err));
  still_usable(pool);
}

/* ---- loader misuse (items 1, 2, 3, 6) ---------------------------------- */

static float g_w[4 * 3];

static vmmw_loader_t* open_w(const char* path) {
  vmmw_loader_t* ld = NULL;
  CHECK_OK(vmmw_loader_open(path, &ld, &err));
  return ld;
}

static int32_t slow_progress(uint64_t done, uint64_t total, void* user) {
  (void)done;
  (void)total;
  (void)user;
  struct timespec ts = {0, 2000000};
  nanosleep(&ts, NULL);
  return 0;
}

static void* cancel_later(void* v) {
  struct timespec ts = {0, 5000000};
  nanosleep(&ts, NULL);
  CHECK(vmmw_loader_cancel((vmmw_loader_t*)v, NULL) == VMMW_OK);
  return NULL;
}

static void loader(vmmw_pool_t* pool) {
  char path[256], big[256], fifo[256], sub[256], idx[256];
  snprintf(path, sizeof path, "%s/model.safetensors", g_dir);
  snprintf(big, sizeof big, "%s/big.safetensors", g_dir);
  snprintf(fifo, sizeof fifo, "%s/pipe.safetensors", g_dir);
  snprintf(sub, sizeof sub, "%s/idx", g_dir);
  snprintf(idx, sizeof idx, "%s/idx/model.safetensors.index.json", g_dir);
  for (int i = 0; i < 12; ++i) g_w[i] = (float)i + 0.5f;
  st_tensor t = {"w", "F32", {4, 3}, 2, g_w, sizeof g_w};
  CHECK(st_write(path, &t, 1) == 0);
  uint32_t tag = 0;
  CHECK_OK(vmmw_tag_id("misuse-loader", &tag, &err));

  /* Item 1: a pad rule whose size overflows is refused before any write. */
  vmmw_loader_t* ld = open_w(path);
  CHECK_OK(vmmw_loader_set_rules_json(
      ld, "{\"rules\":[{\"match\":\"w\",\"pad\":{\"dim\":1,\"to\":4611686018427387904}}]}", &err));
  CHECK_MSG(VMMW_PLAN_MISMATCH, "overflows", vmmw_loader_allocate(ld, pool, tag, ERR));
  size_t count = 9;
  CHECK_OK(vmmw_loader_destination_count(ld, &count, &err));
  CHECK(count == 0);
  CHECK_OK(vmmw_loader_set_rules_json(
      ld, "{\"rules\":[{\"match\":\"w\",\"pad\":{\"dim\":1,\"multiple_of\":18446744073709551615}}]}", &err));
  CHECK_STATUS(VMMW_PLAN_MISMATCH, vmmw_loader_allocate(ld, pool, tag, NULL));
  vmmw_loader_free(ld);

  /* Item 3: shapes whose byte size overflows are refused at register. */
  ld = open_w(path);
  uint64_t nbr = 0, blk = 0;
  CHECK_OK(vmmw_pool_alloc_tagged(pool, 4096, tag, &blk, &err));
  CHECK_OK(vmmw_pool_alloc_tagged(pool, 4096, tag, &nbr, &err));
  uint64_t huge_shape[2] = {1ull << 62, 1ull << 62};
  CHECK_MSG(VMMW_INVALID_ARGUMENT, "overflows", vmmw_loader_register(ld, "w", blk, "F32", huge_shape, 2, ERR));
  uint64_t end_shape[1] = {4};
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_register(ld, "w", UINT64_MAX - 8, "F32", end_shape, 1, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_register(ld, "w", 0, "F32", end_shape, 1, NULL));
  CHECK_STATUS(VMMW_NULL_ARGUMENT, vmmw_loader_register(ld, "w", blk, "F32", NULL, 2, NULL));
  /* A wrong ndim is refused before the shape array is read (ASan would see it). */
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_register(ld, "w", blk, "F32", end_shape, SIZE_MAX, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_register(ld, "w", blk, "F32", end_shape, 65, NULL));
  CHECK_OK(vmmw_loader_destination_count(ld, &count, &err));
  CHECK(count == 0);
  vmmw_loader_free(ld);

  /* Item 2: a destination running past its 4 KiB block would overwrite the
   * neighbour: refused at load, the neighbour intact. */
  unsigned char sentinel[4096], back[4096];
  memset(sentinel, 0x5a, sizeof sentinel);
  CHECK_OK(vmmw_pool_write(pool, nbr, sentinel, sizeof sentinel, &err));
  ld = open_w(path);
  CHECK_OK(vmmw_loader_set_rules_json(ld, "{\"rules\":[{\"match\":\"w\",\"pad\":{\"dim\":0,\"to\":683}}]}", &err));
  uint64_t padded[2] = {683, 3}; /* 8196 bytes: past the end of a 4 KiB block */
  CHECK_OK(vmmw_loader_register(ld, "w", blk, "F32", padded, 2, &err));
  CHECK_OK(vmmw_loader_declare_foreign(ld, blk, 8196, &err)); /* pool memory: still checked */
  CHECK_MSG(VMMW_INVALID_ARGUMENT, "runs past the end of its block", vmmw_loader_load(ld, pool, NULL, NULL, ERR));
  CHECK_OK(vmmw_pool_read(pool, nbr, back, sizeof back, &err));
  CHECK(memcmp(sentinel, back, sizeof back) == 0);
  vmmw_loader_free(ld);

  /* A destination in a free block (past the end of the last live one) and at
   * an address no pool knows. */
  ld = open_w(path);
  uint64_t shape[2] = {4, 3};
  CHECK_OK(vmmw_loader_register(ld, "w", nbr + 4096 + 512, "F32", shape, 2, &err));
  CHECK_STATUS(VMMW_UNKNOWN_POINTER, vmmw_loader_load(ld, pool, NULL, NULL, NULL));
  vmmw_loader_free(ld);
  ld = open_w(path);
  CHECK_OK(vmmw_loader_register(ld, "w", 0xdead0000ull, "F32", shape, 2, &err));
  CHECK_MSG(VMMW_UNKNOWN_POINTER, "vmmw_loader_declare_foreign", vmmw_loader_load(ld, pool, NULL, NULL, ERR));
  vmmw_loader_free(ld);

  /* Destinations asleep in pool B, loaded through pool A: refused (not
   * inside pool A); declared foreign they would be the caller's business, so
   * declare an awake range of B and load through A. */
  vmmw_pool_t* b = host_pool();
  uint32_t btag = 0;
  CHECK_OK(vmmw_tag_id("misuse-pool-b", &btag, &err));
  uint64_t inb = 0;
  CHECK_OK(vmmw_pool_alloc_tagged(b, sizeof g_w, btag, &inb, &err));
  vmmw_tag_policy_t bsleep = {btag, VMMW_POLICY_DISCARD};
  CHECK_OK(vmmw_pool_sleep(b, &bsleep, 1, &err));
  ld = open_w(path);
  CHECK_OK(vmmw_loader_register(ld, "w", inb, "F32", shape, 2, &err));
  CHECK_STATUS(VMMW_UNKNOWN_POINTER, vmmw_loader_load(ld, pool, NULL, NULL, NULL));
  /* Through B itself: asleep. */
  CHECK_MSG(VMMW_INVALID_STATE, "asleep", vmmw_loader_load(ld, b, NULL, NULL, ERR));
  CHECK_OK(vmmw_pool_wake(b, &btag, 1, &err));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_declare_foreign(ld, 0, 16, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_declare_foreign(ld, inb, 0, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_declare_foreign(ld, UINT64_MAX - 8, 16, NULL));
  CHECK_OK(vmmw_loader_declare_foreign(ld, inb, sizeof g_w, &err));
  CHECK_OK(vmmw_loader_load(ld, pool, NULL, NULL, &err));
  float got[12];
  CHECK_OK(vmmw_pool_read(b, inb, got, sizeof got, &err));
  CHECK(memcmp(got, g_w, sizeof got) == 0);
  /* Through B itself, the declaration does not exempt B's memory: checked. */
  CHECK_OK(vmmw_pool_sleep(b, &bsleep, 1, &err));
  CHECK_STATUS(VMMW_INVALID_STATE, vmmw_loader_load(ld, b, NULL, NULL, NULL));
  CHECK_OK(vmmw_pool_wake(b, &btag, 1, &err));
  vmmw_loader_free(ld);
  CHECK_OK(vmmw_pool_dealloc(b, inb, &err));
  vmmw_pool_free(b);

  /* Load options: limits. */
  ld = open_w(path);
  vmmw_load_options_t lo;
  memset(&lo, 0, sizeof lo);
  lo.size = sizeof lo;
  lo.threads = UINT32_MAX;
  CHECK_MSG(VMMW_INVALID_ARGUMENT, "threads", vmmw_loader_set_options(ld, &lo, ERR));
  lo.threads = 0;
  lo.slot_bytes = UINT64_MAX;
  CHECK_MSG(VMMW_INVALID_ARGUMENT, "slot_bytes", vmmw_loader_set_options(ld, &lo, ERR));
  lo.slot_bytes = 0;
  lo.window_bytes = 1ull << 40;
  CHECK_MSG(VMMW_INVALID_ARGUMENT, "window_bytes", vmmw_loader_set_options(ld, &lo, ERR));
  lo.window_bytes = 0;
  lo.strategy = -1;
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_set_options(ld, &lo, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_set_rules_preset(ld, "llama", 2, 2, 128, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_set_rules_preset(ld, "gpt-9", 0, 0, 128, NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_set_rules_json(ld, "{\"rules\":", NULL));
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_set_rules_json(ld, "\xff", NULL));
  CHECK_STATUS(VMMW_UNKNOWN_TAG, vmmw_loader_allocate(ld, pool, 4000000000u, NULL));

  /* A pending cancel survives a load refused for another reason. */
  CHECK_OK(vmmw_loader_cancel(ld, &err));
  CHECK_STATUS(VMMW_PLAN_MISMATCH, vmmw_loader_load(ld, pool, NULL, NULL, NULL)); /* no destination */
  CHECK_OK(vmmw_loader_allocate(ld, pool, tag, &err));
  CHECK_STATUS(VMMW_CANCELLED, vmmw_loader_load(ld, pool, NULL, NULL, NULL));
  CHECK_OK(vmmw_loader_load(ld, pool, NULL, NULL, &err)); /* the cancel was consumed */
  vmmw_destination_t d;
  CHECK_OK(vmmw_loader_destination(ld, "w", &d, &err));
  CHECK_OK(vmmw_pool_read(pool, d.ptr, got, sizeof got, &err));
  CHECK(memcmp(got, g_w, sizeof got) == 0);
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_destination(ld, "nope", &d, NULL));
  char nb[4];
  size_t needed = 0;
  CHECK_STATUS(VMMW_INVALID_ARGUMENT, vmmw_loader_destination_name(ld, 99, nb, sizeof nb, &needed, NULL));

  /* Cancel from another thread while a (slow) load runs: CANCELLED or, when
   * the copies all landed first, OK; never a hang or a crash. */
  {
    enum { N = 1 << 20 };
    float* bigw = (float*)calloc(N, sizeof(float));
    CHECK(bigw != NULL);
    st_tensor bt[4] = {
        {"a", "F32", {N / 4}, 1, bigw, N},
        {"b", "F32", {N / 4}, 1, bigw, N},
        {"c", "F32", {N / 4}, 1, bigw, N},
        {"d", "F32", {N / 4}, 1, bigw, N},
    };
    CHECK(st_write(big, bt, 4) == 0);
    free(bigw);
    vmmw_loader_t* bl = open_w(big);
    vmmw_load_options_t so;
    memset(&so, 0, sizeof so);
    so.size = sizeof so;
    so.strategy = VMMW_COPY_SIMPLE;
    CHECK_OK(vmmw_loader_set_options(bl, &so, &err));
    CHECK_OK(vmmw_loader_allocate(bl, pool, tag, &err));
    pthread_t th;
    CHECK(pthread_create(&th, NULL, cancel_later, bl) == 0);
    int32_t rc = vmmw_loader_load(bl, pool, slow_progress, NULL, NULL);
    CHECK(pthread_join(th, NULL) == 0);
    CHECK(rc == VMMW_CANCELLED || rc == VMMW_OK);
    /* A cancel that arrived after the copies stays pending for the next load
     * (at most once); then a load succeeds. */
    rc = vmmw_loader_load(bl, pool, NULL, NULL, NULL);
    CHECK(rc == VMMW_CANCELLED || rc == VMMW_OK);
    CHECK_OK(vmmw_loader_load(bl, pool, NULL, NULL, &err));
    vmmw_loader_free(bl);
  }

  /* Item 6: a FIFO (shard or index) and an index that is /dev/zero are
   * refused at once, not read forever. */
  CHECK(mkfifo(fifo, 0600) == 0);
  vmmw_loader_t* none = NULL;
  CHECK_MSG(VMMW_CHECKPOINT_INVALID, "FIFO", vmmw_loader_open(fifo, &none, ERR));
  CHECK(mkdir(sub, 0700) == 0);
  CHECK(mkfifo(idx, 0600) == 0);
  CHECK_MSG(VMMW_CHECKPOINT_INVALID, "FIFO", vmmw_loader_open(sub, &none, ERR));
  CHECK(unlink(idx) == 0);
  CHECK(symlink("/dev/zero", idx) == 0);
  CHECK_MSG(VMMW_CHECKPOINT_INVALID, "device", vmmw_loader_open(sub, &none, ERR));
  CHECK(unlink(idx) == 0);
  CHECK_MSG(VMMW_CHECKPOINT_INVALID, "neither", vmmw_loader_open(sub, &none, ERR));
  CHECK_STATUS(VMMW_IO, vmmw_loader_open("/nonexistent/x.safetensors", &none, NULL));
  CHECK_MSG(VMMW_CHECKPOINT_INVALID, "device", vmmw_loader_open("/dev/zero", &none, ERR));
  CHECK(none == NULL);
  vmmw_loader_free(ld);
  CHECK_OK(vmmw_pool_dealloc(pool, blk, &err));
  CHECK_OK(vmmw_pool_dealloc(pool, nbr, &err));
  CHECK(rmdir(sub) == 0);
  unlink(fifo);
  unlink(big);
  unlink(path);
  still_usable(pool);
}

/* ---- timeline bounded and clearable (item 8) -------------------------- */

static void timeline(vmmw_pool_t* pool) {
  uint64_t cleared = 0;
  CHECK_OK(vmmw_pool_clear_timeline(pool, &cleared, &err));
  for (int i = 0; i < 1100; ++i) CHECK_OK(vmmw_pool_snapshot(pool, "tick", &err));
  size_t needed = 0;
  CHECK_STATUS(VMMW_BUFFER_TOO_SMALL, vmmw_pool_timeline_json(pool, NULL, 0, &needed, NULL));
  char* json = (char*)malloc(needed);
  CHECK(json != NULL);
  CHECK_OK(vmmw_pool_timeline_json(pool, json, needed, NULL, &err));
  CHECK(strstr(json, "\"dropped\": 76") != NULL);
  free(json);
  char longname[300];
  memset(longname, 'n', sizeof longname - 1);
  longname[sizeof longname - 1] = 0;
  CHECK_MSG(VMMW_INVALID_ARGUMENT, "snapshot name", vmmw_pool_snapshot(pool, longname, ERR));
  CHECK_OK(vmmw_pool_clear_timeline(pool, &cleared, &err));
  CHECK(cleared == 1024);
  CHECK_OK(vmmw_pool_clear_timeline(pool, NULL, &err));
  char small[128];
  CHECK_OK(vmmw_pool_timeline_json(pool, small, sizeof small, NULL, &err));
  CHECK(strstr(small, "\"dropped\": 0") != NULL);
  still_usable(pool);
}

/* ---- host memory (items 5 and 7), run under `ulimit -v` ---------------- */

static int memory_cases(void) {
  vmmw_pool_t* pool = host_pool();
  /* A reserve the address space cannot hold fails with HOST_OUT_OF_MEMORY
   * and leaves nothing pinned. */
  CHECK_MSG(VMMW_HOST_OUT_OF_MEMORY, "out of host memory", vmmw_pool_reserve_backup(pool, 6ull << 30, ERR));
  uint64_t released = 99;
  CHECK_OK(vmmw_pool_release_backup(pool, &released, &err));
  CHECK(released == 0);
  /* Offloading many tags of one small block each: HOST_OUT_OF_MEMORY for the
   * tag that does not fit (the earlier ones asleep), never the kernel. */
  enum { TAGS = 1000 };
  static uint32_t ids[TAGS];
  static uint64_t ptrs[TAGS];
  static vmmw_tag_policy_t items[TAGS];
  for (int i = 0; i < TAGS; ++i) {
    char name[32];
    snprintf(name, sizeof name, "misuse-mem-%d", i);
    CHECK_OK(vmmw_tag_id(name, &ids[i], &err));
    CHECK_OK(vmmw_pool_alloc_tagged(pool, 64, ids[i], &ptrs[i], &err));
    CHECK_OK(vmmw_pool_write(pool, ptrs[i], &i, sizeof i, &err));
    items[i].tag = ids[i];
    items[i].policy = VMMW_POLICY_OFFLOAD;
  }
  vmmw_error_t* e = NULL;
  int32_t rc = vmmw_pool_sleep(pool, items, TAGS, &e);
  printf("test_misuse memory: offloading %d tags: %s %s\n", TAGS, vmmw_status_name(rc), vmmw_error_message(e));
  CHECK(rc == VMMW_HOST_OUT_OF_MEMORY);
  vmmw_error_free(e);
  CHECK_OK(vmmw_pool_wake(pool, ids, TAGS, &err));
  for (int i = 0; i < TAGS; ++i) {
    int back = -1;
    CHECK_OK(vmmw_pool_read(pool, ptrs[i], &back, sizeof back, &err));
    CHECK(back == i);
    CHECK_OK(vmmw_pool_dealloc(pool, ptrs[i], &err));
  }
  CHECK_OK(vmmw_pool_release_backup(pool, &released, &err));
  uint64_t trimmed = 0;
  CHECK_OK(vmmw_pool_trim(pool, &trimmed, &err));
  still_usable(pool);
  vmmw_pool_free(pool);
  printf("test_misuse memory: %d checks passed\n", g_checks);
  return 0;
}

int main(int argc, char** argv) {
  const char* b = getenv("VMMW_MISUSE_BACKEND");
  if (b != NULL && strcmp(b, "cuda") == 0) g_backend = VMMW_BACKEND_CUDA;
  if (argc > 1 && strcmp(argv[1], "memory") == 0) return memory_cases();
  CHECK(mkdtemp(g_dir) != NULL);
  vmmw_pool_t* pool = host_pool();
  null_arguments(pool);
  sizes(pool);
  frees(pool);
  tags(pool);
  sleep_wake(pool);
  storm(pool);
  loader(pool);
  timeline(pool);
  vmmw_pool_free(pool);
  CHECK(rmdir(g_dir) == 0);
  printf("test_misuse: %d checks passed\n", g_checks);
  return 0;
}
