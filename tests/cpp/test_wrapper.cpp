// Tests of the C++17 wrapper on the host backend; linked with tu_a.cpp (a
// second translation unit including the same header). Built with
// -Wall -Wextra -Werror and ASan/UBSan by scripts/test.d/40-cpp.sh.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "vmmweights.hpp"

uint64_t granularity_from_tu_a(const vmmw::Device& d);

static int g_checks = 0;
#define CHECK(cond)                                                            \
  do {                                                                         \
    ++g_checks;                                                                \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

template <class F>
static int32_t status_of(F&& f) {
  try {
    f();
  } catch (const vmmw::Error& e) {
    return e.status();
  }
  return VMMW_OK;
}

static_assert(!std::is_copy_constructible<vmmw::Device>::value, "handles are move-only");
static_assert(!std::is_copy_assignable<vmmw::Segment>::value, "handles are move-only");
static_assert(std::is_nothrow_move_constructible<vmmw::Device>::value, "moves never throw");
static_assert(std::is_nothrow_move_assignable<vmmw::Segment>::value, "moves never throw");

static void test_errors() {
  try {
    vmmw::Device d(static_cast<vmmw::Backend>(9));
    CHECK(false);
  } catch (const vmmw::Error& e) {
    CHECK(e.status() == VMMW_INVALID_ARGUMENT);
    CHECK(std::strcmp(e.status_name(), "VMMW_INVALID_ARGUMENT") == 0);
    CHECK(std::strstr(e.what(), "backend 9") != nullptr);
  }
  CHECK(vmmw::version() == VMMW_VERSION_STRING);
}

static void test_device_and_segment() {
  vmmw::Device dev(vmmw::Backend::Host);
  CHECK(dev.backend() == vmmw::Backend::Host);
  const uint64_t g = dev.granularity();
  CHECK(g == granularity_from_tu_a(dev));
  CHECK(dev.describe().find("host") != std::string::npos);
  CHECK(!dev.choice_reason().empty());
  CHECK(dev.mem_info().total_bytes > 0);

  const auto before = dev.host_counts();
  {
    vmmw::Segment seg(dev, 2 * g, g);
    CHECK(seg.info().chunks == 2);
    std::vector<unsigned char> in(4096), out(4096);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 13 + 1);
    seg.write(g - 100, in.data(), in.size());
    seg.read(g - 100, out.data(), out.size());
    CHECK(in == out);
    CHECK(status_of([&] { seg.read(2 * g, out.data(), 1); }) == VMMW_INVALID_ARGUMENT);

    // Moving transfers ownership; the moved-from handle is empty and refuses use.
    const uint64_t p = seg.ptr();
    vmmw::Segment moved(std::move(seg));
    CHECK(moved.ptr() == p);
    CHECK(seg.get() == nullptr);  // NOLINT(bugprone-use-after-move): documented state
    CHECK(status_of([&] { (void)seg.info(); }) == VMMW_NULL_ARGUMENT);
    CHECK(dev.host_counts().reservations == before.reservations + 1);
  }
  // RAII released everything.
  const auto after = dev.host_counts();
  CHECK(after.reservations == before.reservations && after.handles == before.handles);

  dev.host_set_memory_limit(g);
  CHECK(status_of([&] { vmmw::Segment big(dev, 4 * g); }) == VMMW_OUT_OF_MEMORY);
  CHECK(dev.host_counts().handles == before.handles);
}

int main() {
  test_errors();
  test_device_and_segment();
  std::printf("test_wrapper: %d checks passed\n", g_checks);
  return 0;
}
