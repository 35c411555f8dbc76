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
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

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

// ---- tags ------------------------------------------------------------------

/// A tag id: names a group of allocations that sleep and wake together.
using Tag = uint32_t;

/// The id of tag `name`, registering it on first use.
inline Tag tag_id(const std::string& name) {
  Tag t = 0;
  detail::call([&](vmmw_error_t** e) { return vmmw_tag_id(name.c_str(), &t, e); });
  return t;
}

/// The name of a registered tag.
inline std::string tag_name(Tag tag) {
  return detail::read_string([tag](char* b, size_t c, size_t* n, vmmw_error_t** e) {
    return vmmw_tag_name(tag, b, c, n, e);
  });
}

/// The tag allocations on this thread get now.
inline Tag current_tag() {
  Tag t = 0;
  detail::call([&](vmmw_error_t** e) { return vmmw_tag_current(&t, e); });
  return t;
}

/// Scope guard: allocations made by this thread get `tag` while it lives.
/// Not movable (a scope belongs to the thread and the block that opened it).
class TagScope {
 public:
  explicit TagScope(Tag tag) {
    detail::call([&](vmmw_error_t** e) { return vmmw_tag_push(tag, e); });
  }
  explicit TagScope(const std::string& name) : TagScope(tag_id(name)) {}
  ~TagScope() { (void)vmmw_tag_pop(nullptr); }
  TagScope(const TagScope&) = delete;
  TagScope& operator=(const TagScope&) = delete;
  TagScope(TagScope&&) = delete;
  TagScope& operator=(TagScope&&) = delete;
};

// ---- pool --------------------------------------------------------------------

/// Sleep policies.
enum class Policy : int32_t {
  Offload = VMMW_POLICY_OFFLOAD,  ///< pinned host backup, restored byte for byte
  Discard = VMMW_POLICY_DISCARD,  ///< contents dropped (e.g. a KV cache)
  Reload = VMMW_POLICY_RELOAD,    ///< re-read from the checkpoint at wake
};

/// Pool creation options (all zero = auto backend, device 0, default sizes).
struct PoolOptions {
  Backend backend = Backend::Auto;
  int32_t device = 0;
  const Device* device_handle = nullptr;  ///< use this device instead of backend/device
  uint64_t align = 0;
  uint64_t small_request_max = 0;
  uint64_t small_segment_bytes = 0;
  uint64_t large_segment_bytes = 0;
  uint64_t chunk_bytes = 0;
};

/// A caching pool of VMM memory (vmmw_pool_t). Thread-safe.
class Pool {
 public:
  explicit Pool(const PoolOptions& o = PoolOptions()) {
    vmmw_pool_options_t c{};
    c.device_handle = o.device_handle != nullptr ? o.device_handle->get() : nullptr;
    c.backend = static_cast<int32_t>(o.backend);
    c.device = o.device;
    c.align = o.align;
    c.small_request_max = o.small_request_max;
    c.small_segment_bytes = o.small_segment_bytes;
    c.large_segment_bytes = o.large_segment_bytes;
    c.chunk_bytes = o.chunk_bytes;
    vmmw_pool_t* raw = nullptr;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_new(&c, &raw, e); });
    h_.reset(raw);
  }

  /// The process-global pool of `device` (shared with the PyTorch entry points).
  static Pool global(int32_t device = 0) {
    vmmw_pool_t* raw = nullptr;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_default(device, &raw, e); });
    return Pool(raw);
  }

  /// Allocate under the current thread's tag; returns the device address.
  uint64_t alloc(uint64_t size) const {
    uint64_t p = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_alloc(get_checked(), size, &p, e); });
    return p;
  }

  /// Allocate under `tag`.
  uint64_t alloc(uint64_t size, Tag tag) const {
    uint64_t p = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_alloc_tagged(get_checked(), size, tag, &p, e); });
    return p;
  }

  void free(uint64_t ptr) const {
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_free_ptr(get_checked(), ptr, e); });
  }

  /// Return cached memory to the driver; the bytes released.
  uint64_t trim() const {
    uint64_t r = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_trim(get_checked(), &r, e); });
    return r;
  }

  void set_tag_arena(Tag tag, uint64_t reserve_bytes, uint64_t grow_step = 0) const {
    detail::call([&](vmmw_error_t** e) {
      return vmmw_pool_set_tag_arena(get_checked(), tag, reserve_bytes, grow_step, e);
    });
  }

  void set_tag_segments(Tag tag) const {
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_set_tag_segments(get_checked(), tag, e); });
  }

  vmmw_report_t report() const {
    vmmw_report_t r{};
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_report(get_checked(), &r, e); });
    return r;
  }

  vmmw_report_t report(Tag tag) const {
    vmmw_report_t r{};
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_report_tag(get_checked(), tag, &r, e); });
    return r;
  }

  std::string report_json() const {
    const vmmw_pool_t* p = get_checked();
    return detail::read_string([p](char* b, size_t c, size_t* n, vmmw_error_t** e) {
      return vmmw_pool_report_json(p, b, c, n, e);
    });
  }

  void snapshot(const std::string& name) const {
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_snapshot(get_checked(), name.c_str(), e); });
  }

  std::string timeline_json() const {
    const vmmw_pool_t* p = get_checked();
    return detail::read_string([p](char* b, size_t c, size_t* n, vmmw_error_t** e) {
      return vmmw_pool_timeline_json(p, b, c, n, e);
    });
  }

  /// Copy host bytes to pool memory (synchronous, range-checked).
  void write(uint64_t dst, const void* src, size_t len) const {
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_write(get_checked(), dst, src, len, e); });
  }

  /// Copy pool memory to host bytes (synchronous, range-checked).
  void read(uint64_t src, void* dst, size_t len) const {
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_read(get_checked(), src, dst, len, e); });
  }

  /// Put tags to sleep, each with its policy; pointers stay valid.
  void sleep(const std::vector<std::pair<Tag, Policy>>& items) const {
    std::vector<vmmw_tag_policy_t> c;
    c.reserve(items.size());
    for (const auto& i : items) c.push_back(vmmw_tag_policy_t{i.first, static_cast<int32_t>(i.second)});
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_sleep(get_checked(), c.data(), c.size(), e); });
  }

  /// Wake the listed tags (all sleeping tags when empty), at the same addresses.
  void wake(const std::vector<Tag>& tags = {}) const {
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_wake(get_checked(), tags.data(), tags.size(), e); });
  }

  /// Drop a tag's reload sources: a Reload-asleep tag whose checkpoint changed
  /// then wakes with its backed-up bytes (loaded bytes undefined; load again).
  void forget_reload(Tag tag) const {
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_forget_reload(get_checked(), tag, e); });
  }

  /// Pin host backup memory ahead of time.
  void reserve_backup(uint64_t bytes) const {
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_reserve_backup(get_checked(), bytes, e); });
  }

  /// Unpin backup memory not holding a sleeping tag; the bytes unpinned.
  uint64_t release_backup() const {
    uint64_t r = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_release_backup(get_checked(), &r, e); });
    return r;
  }

  /// Bytes of pinned host staging the loader keeps cached for this pool's driver
  /// (shared by pools made from one vmmw_device_t).
  uint64_t staging_bytes() const {
    uint64_t r = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_staging_bytes(get_checked(), &r, e); });
    return r;
  }

  /// Unpin the loader's cached staging ring for this pool's driver; the bytes unpinned.
  /// The next load pins a new one.
  uint64_t release_staging() const {
    uint64_t r = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_release_staging(get_checked(), &r, e); });
    return r;
  }

  void set_sleep_options(const vmmw_sleep_options_t& o) const {
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_set_sleep_options(get_checked(), &o, e); });
  }

  /// What the last sleep or wake through this handle did, as JSON.
  std::string last_cycle_json() const {
    const vmmw_pool_t* p = get_checked();
    return detail::read_string([p](char* b, size_t c, size_t* n, vmmw_error_t** e) {
      return vmmw_pool_last_cycle_json(p, b, c, n, e);
    });
  }

  const vmmw_pool_t* get() const noexcept { return h_.get(); }

 private:
  explicit Pool(vmmw_pool_t* raw) : h_(raw) {}
  const vmmw_pool_t* get_checked() const { return detail::live(h_, "vmmw::Pool"); }
  detail::Owned<vmmw_pool_t, vmmw_pool_free> h_;
};

// ---- loader ----------------------------------------------------------------

/// Progress of a load: (bytes done, bytes total); return false to cancel.
using Progress = std::function<bool(uint64_t done, uint64_t total)>;

/// Loads a safetensors checkpoint in place (vmmw_loader_t).
class Loader {
 public:
  /// Open a checkpoint file or folder; headers are validated now.
  explicit Loader(const std::string& path) {
    vmmw_loader_t* raw = nullptr;
    detail::call([&](vmmw_error_t** e) { return vmmw_loader_open(path.c_str(), &raw, e); });
    h_.reset(raw);
  }

  void set_rules_json(const std::string& json) const {
    detail::call([&](vmmw_error_t** e) { return vmmw_loader_set_rules_json(get_checked(), json.c_str(), e); });
  }

  void set_rules_preset(const std::string& family, uint32_t tp_rank = 0, uint32_t tp_world = 0,
                        uint32_t head_dim = 128) const {
    detail::call([&](vmmw_error_t** e) {
      return vmmw_loader_set_rules_preset(get_checked(), family.c_str(), tp_rank, tp_world, head_dim, e);
    });
  }

  void set_options(const vmmw_load_options_t& o) const {
    detail::call([&](vmmw_error_t** e) { return vmmw_loader_set_options(get_checked(), &o, e); });
  }

  /// Keep content checksums at load, so Reload wakes prove the checkpoint unchanged.
  void set_reload_check(bool enable) const {
    detail::call([&](vmmw_error_t** e) { return vmmw_loader_set_reload_check(get_checked(), enable ? 1 : 0, e); });
  }

  /// Register your own destination at device address `ptr`.
  void add(const std::string& name, uint64_t ptr, const std::string& dtype,
           const std::vector<uint64_t>& shape) const {
    detail::call([&](vmmw_error_t** e) {
      return vmmw_loader_register(get_checked(), name.c_str(), ptr, dtype.c_str(), shape.data(), shape.size(), e);
    });
  }

  /// Allocate every destination the plan needs from `pool` under `tag`.
  void allocate(const Pool& pool, Tag tag) const {
    detail::call([&](vmmw_error_t** e) { return vmmw_loader_allocate(get_checked(), pool.get(), tag, e); });
  }

  /// Names of the registered destinations, in name order.
  std::vector<std::string> destination_names() const {
    const vmmw_loader_t* l = get_checked();
    size_t n = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_loader_destination_count(l, &n, e); });
    std::vector<std::string> out;
    out.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      out.push_back(detail::read_string([l, i](char* b, size_t c, size_t* nd, vmmw_error_t** e) {
        return vmmw_loader_destination_name(l, i, b, c, nd, e);
      }));
    }
    return out;
  }

  vmmw_destination_t destination(const std::string& name) const {
    vmmw_destination_t d{};
    detail::call([&](vmmw_error_t** e) { return vmmw_loader_destination(get_checked(), name.c_str(), &d, e); });
    return d;
  }

  /// Check the plan without writing anything.
  vmmw_plan_summary_t plan() const {
    vmmw_plan_summary_t s{};
    detail::call([&](vmmw_error_t** e) { return vmmw_loader_plan(get_checked(), &s, e); });
    return s;
  }

  /// Load into the destinations on `pool`'s device. An exception thrown by
  /// `progress` cancels the load and is rethrown here.
  vmmw_load_result_t load(const Pool& pool, const Progress& progress = Progress()) const {
    struct Ctx {
      const Progress* fn;
      std::exception_ptr error;
    } ctx{&progress, nullptr};
    auto trampoline = [](uint64_t done, uint64_t total, void* user) -> int32_t {
      auto* c = static_cast<Ctx*>(user);
      try {
        return (*c->fn)(done, total) ? 0 : 1;
      } catch (...) {
        c->error = std::current_exception();  // never unwind into the library
        return 1;
      }
    };
    vmmw_error_t* err = nullptr;
    int32_t rc = vmmw_loader_load(get_checked(), pool.get(), progress ? +trampoline : nullptr, &ctx, &err);
    if (ctx.error) {
      vmmw_error_free(err);
      std::rethrow_exception(ctx.error);
    }
    detail::check(rc, err);
    return result();
  }

  /// Stop a running load from another thread (it throws VMMW_CANCELLED).
  void cancel() const {
    detail::call([&](vmmw_error_t** e) { return vmmw_loader_cancel(get_checked(), e); });
  }

  vmmw_load_result_t result() const {
    vmmw_load_result_t r{};
    detail::call([&](vmmw_error_t** e) { return vmmw_loader_result(get_checked(), &r, e); });
    return r;
  }

  std::string result_json() const {
    const vmmw_loader_t* l = get_checked();
    return detail::read_string([l](char* b, size_t c, size_t* n, vmmw_error_t** e) {
      return vmmw_loader_result_json(l, b, c, n, e);
    });
  }

  const vmmw_loader_t* get() const noexcept { return h_.get(); }

 private:
  const vmmw_loader_t* get_checked() const { return detail::live(h_, "vmmw::Loader"); }
  detail::Owned<vmmw_loader_t, vmmw_loader_free> h_;
};

}  // namespace vmmw

#endif  // VMMWEIGHTS_HPP
