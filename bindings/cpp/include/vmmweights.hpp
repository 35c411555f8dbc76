// vmmweights.hpp: header-only C++17 wrapper over the C API in vmmweights.h.
//
// Design:
// - Errors are exceptions: every failing call throws vmmw::Error, which carries
//   the C status code (status()) and the library's message (what()). We chose
//   exceptions over a Result type because the wrapper's constructors acquire
//   resources (RAII) and have no return value to carry an error, and because
//   every failure here is exceptional (out of memory, bad checkpoint), not
//   control flow. Code built with -fno-exceptions should call the C API directly.
// - Handles are move-only RAII objects that free the C handle in their
//   destructor. A moved-from object is empty (get() == nullptr); calling a
//   method on it throws vmmw::Error with VMMW_NULL_ARGUMENT.
// - Thread safety is the C API's: const methods may run concurrently on one
//   object; destruction must not race with other use.
#ifndef VMMWEIGHTS_HPP
#define VMMWEIGHTS_HPP

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "vmmweights.h"

namespace vmmw {

/// A failed vmmweights call: the C status code and the library's message.
class Error : public std::runtime_error {
 public:
  Error(int32_t status, const std::string& message)
      : std::runtime_error(message), status_(status) {}

  /// The VMMW_* status code (never VMMW_OK).
  int32_t status() const noexcept { return status_; }

  /// The status code's name ("VMMW_OUT_OF_MEMORY").
  const char* status_name() const noexcept { return vmmw_status_name(status_); }

 private:
  int32_t status_;
};

namespace detail {

/// Throw vmmw::Error for a non-OK status, taking ownership of `err`.
inline void check(int32_t rc, vmmw_error_t* err) {
  if (rc == VMMW_OK) {
    vmmw_error_free(err);  // never set on success; harmless either way
    return;
  }
  std::string msg = err != nullptr ? vmmw_error_message(err) : vmmw_status_name(rc);
  vmmw_error_free(err);
  throw Error(rc, std::string(vmmw_status_name(rc)) + ": " + msg);
}

/// Call `f(vmmw_error_t**)` and throw on failure.
template <class F>
void call(F&& f) {
  vmmw_error_t* err = nullptr;
  int32_t rc = std::forward<F>(f)(&err);
  check(rc, err);
}

/// Read a string through the C buffer protocol (buf, cap, *needed).
template <class F>
std::string read_string(F&& f) {
  std::string out(64, '\0');
  for (int attempt = 0; attempt < 4; ++attempt) {
    size_t needed = 0;
    vmmw_error_t* err = nullptr;
    int32_t rc = f(&out[0], out.size(), &needed, &err);
    if (rc == VMMW_OK) {
      out.resize(needed > 0 ? needed - 1 : 0);
      return out;
    }
    if (rc != VMMW_BUFFER_TOO_SMALL) check(rc, err);
    vmmw_error_free(err);
    out.assign(needed, '\0');
  }
  throw Error(VMMW_BUFFER_TOO_SMALL, "VMMW_BUFFER_TOO_SMALL: string kept growing while read");
}

template <class T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const noexcept { Free(p); }
};

template <class T, void (*Free)(T*)>
using Owned = std::unique_ptr<T, Deleter<T, Free>>;

/// The pointer of a handle, or throw VMMW_NULL_ARGUMENT for a moved-from one.
template <class P>
auto live(const P& p, const char* what) -> decltype(p.get()) {
  if (!p) throw Error(VMMW_NULL_ARGUMENT, std::string("VMMW_NULL_ARGUMENT: use of an empty (moved-from) ") + what);
  return p.get();
}

}  // namespace detail

/// The library's version at run time ("0.1.0"); compare with VMMW_VERSION_STRING.
inline std::string version() { return vmmw_version_string(); }

/// Which backend to open.
enum class Backend : int32_t {
  Auto = VMMW_BACKEND_AUTO,  ///< VMMW_BACKEND env var, else CUDA when usable, else host
  Host = VMMW_BACKEND_HOST,  ///< the host simulation (no GPU)
  Cuda = VMMW_BACKEND_CUDA,  ///< CUDA; throws VMMW_DRIVER_UNAVAILABLE without one
};

/// Free and total device memory in bytes.
struct MemInfo {
  uint64_t free_bytes;
  uint64_t total_bytes;
};

/// An opened backend for one device (vmmw_device_t).
class Device {
 public:
  /// Open `backend` for device ordinal `ordinal`.
  explicit Device(Backend backend = Backend::Auto, int32_t ordinal = 0) {
    vmmw_device_t* raw = nullptr;
    detail::call([&](vmmw_error_t** e) {
      return vmmw_device_open(static_cast<int32_t>(backend), ordinal, &raw, e);
    });
    h_.reset(raw);
  }

  Backend backend() const {
    int32_t b = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_device_backend(get_checked(), &b, e); });
    return static_cast<Backend>(b);
  }

  uint64_t granularity() const {
    uint64_t g = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_device_granularity(get_checked(), &g, e); });
    return g;
  }

  MemInfo mem_info() const {
    MemInfo m{0, 0};
    detail::call([&](vmmw_error_t** e) {
      return vmmw_device_mem_info(get_checked(), &m.free_bytes, &m.total_bytes, e);
    });
    return m;
  }

  std::string describe() const {
    const vmmw_device_t* d = get_checked();
    return detail::read_string([d](char* b, size_t c, size_t* n, vmmw_error_t** e) {
      return vmmw_device_describe(d, b, c, n, e);
    });
  }

  /// Why this backend was chosen.
  std::string choice_reason() const {
    const vmmw_device_t* d = get_checked();
    return detail::read_string([d](char* b, size_t c, size_t* n, vmmw_error_t** e) {
      return vmmw_device_choice_reason(d, b, c, n, e);
    });
  }

  void synchronize() const {
    detail::call([&](vmmw_error_t** e) { return vmmw_device_synchronize(get_checked(), e); });
  }

  /// Testing hook (host backend): set the simulated device memory.
  void host_set_memory_limit(uint64_t bytes) const {
    detail::call([&](vmmw_error_t** e) { return vmmw_host_set_memory_limit(get_checked(), bytes, e); });
  }

  /// Testing hook (host backend): fail the n-th next call of a VMMW_FAULT_* primitive.
  void host_fail_nth(int32_t op, uint64_t n) const {
    detail::call([&](vmmw_error_t** e) { return vmmw_host_fail_nth(get_checked(), op, n, e); });
  }

  /// Testing hook (host backend): live objects, for leak checks.
  vmmw_host_counts_t host_counts() const {
    vmmw_host_counts_t c{};
    detail::call([&](vmmw_error_t** e) { return vmmw_host_counts(get_checked(), &c, e); });
    return c;
  }

  /// The C handle (still owned by this object); nullptr once moved from.
  const vmmw_device_t* get() const noexcept { return h_.get(); }

 private:
  const vmmw_device_t* get_checked() const { return detail::live(h_, "vmmw::Device"); }
  detail::Owned<vmmw_device_t, vmmw_device_free> h_;
};

/// One raw VMM allocation (vmmw_segment_t). Most callers want a Pool.
class Segment {
 public:
  /// Reserve and back `size` bytes on `device` in chunks of at most `chunk_size` (0 = one).
  Segment(const Device& device, uint64_t size, uint64_t chunk_size = 0) {
    vmmw_segment_t* raw = nullptr;
    detail::call([&](vmmw_error_t** e) {
      return vmmw_segment_new(device.get(), size, chunk_size, &raw, e);
    });
    h_.reset(raw);
  }

  vmmw_segment_info_t info() const {
    vmmw_segment_info_t i{};
    detail::call([&](vmmw_error_t** e) { return vmmw_segment_info(get_checked(), &i, e); });
    return i;
  }

  /// The base device address (stable for the segment's life).
  uint64_t ptr() const { return info().ptr; }

  /// Copy host bytes in at `offset` (synchronous).
  void write(uint64_t offset, const void* src, size_t len) const {
    detail::call([&](vmmw_error_t** e) { return vmmw_segment_write(get_checked(), offset, src, len, e); });
  }

  /// Copy bytes at `offset` out to host memory (synchronous).
  void read(uint64_t offset, void* dst, size_t len) const {
    detail::call([&](vmmw_error_t** e) { return vmmw_segment_read(get_checked(), offset, dst, len, e); });
  }

  const vmmw_segment_t* get() const noexcept { return h_.get(); }

 private:
  const vmmw_segment_t* get_checked() const { return detail::live(h_, "vmmw::Segment"); }
  detail::Owned<vmmw_segment_t, vmmw_segment_free> h_;
};

}  // namespace vmmw

#endif  // VMMWEIGHTS_HPP
