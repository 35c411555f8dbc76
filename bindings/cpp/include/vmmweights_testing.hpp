// vmmweights_testing.hpp: the host backend's testing hooks for C++ test
// suites (fault injection, a simulated memory limit, live-object counts),
// over include/vmmweights_testing.h. Like that header, not installed and not
// part of the stable API (docs/ABI.md).
#ifndef VMMWEIGHTS_TESTING_HPP
#define VMMWEIGHTS_TESTING_HPP

#include "vmmweights.hpp"
#include "vmmweights_testing.h"

namespace vmmw {
namespace testing {

/// Host-backend driver steps that host_fail_nth can make fail.
enum class FaultPoint : vmmw_fault_point_t {
  Reserve = VMMW_FAULT_RESERVE,
  Create = VMMW_FAULT_CREATE,
  Map = VMMW_FAULT_MAP,
  SetAccess = VMMW_FAULT_SET_ACCESS,
};

/// Set the host backend's simulated device memory.
inline void host_set_memory_limit(Device& d, uint64_t bytes) {
  detail::call([&](vmmw_error_t** e) { return vmmw_host_set_memory_limit(d.get(), bytes, e); });
}

/// Fail the n-th next call of `point` (n = 0 clears).
inline void host_fail_nth(Device& d, FaultPoint point, uint64_t n) {
  detail::call([&](vmmw_error_t** e) {
    return vmmw_host_fail_nth(d.get(), static_cast<vmmw_fault_point_t>(point), n, e);
  });
}

/// The host backend's live objects, for leak checks.
[[nodiscard]] inline vmmw_host_counts_t host_counts(const Device& d) {
  vmmw_host_counts_t c{};
  detail::call([&](vmmw_error_t** e) { return vmmw_host_counts(d.get(), &c, e); });
  return c;
}

}  // namespace testing
}  // namespace vmmw

#endif  // VMMWEIGHTS_TESTING_HPP
