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
//   method on it throws vmmw::Error with VMMW_NULL_ARGUMENT. Each adopts a C
//   handle through its explicit pointer constructor and gives it up with
//   release(), for code that mixes the wrapper and the C API.
// - Pool memory comes back as vmmw::Block, which returns itself to the pool
//   when destroyed; a Block keeps its pool's C handle alive.
// - Enumerations are enum classes over the C values; options are C++ structs
//   (the wrapper fills the C struct's size field).
// - Thread safety is the C API's: methods may run concurrently on one object
//   (const methods change nothing); destruction must not race with other use.
#ifndef VMMWEIGHTS_HPP
#define VMMWEIGHTS_HPP

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "vmmweights.h"

#if VMMW_VERSION_MAJOR != 0 || VMMW_VERSION_MINOR != 1
#error "vmmweights.hpp wraps the 0.1 C API: use the vmmweights.h of the same release"
#endif

namespace vmmw {

/// Status codes (the C VMMW_* numbers, which never change).
enum class Status : vmmw_status_t {
  Ok = VMMW_OK,
  InvalidArgument = VMMW_INVALID_ARGUMENT,
  NullArgument = VMMW_NULL_ARGUMENT,
  OutOfMemory = VMMW_OUT_OF_MEMORY,
  HostOutOfMemory = VMMW_HOST_OUT_OF_MEMORY,
  DriverUnavailable = VMMW_DRIVER_UNAVAILABLE,
  DriverError = VMMW_DRIVER_ERROR,
  UnknownPointer = VMMW_UNKNOWN_POINTER,
  UnknownTag = VMMW_UNKNOWN_TAG,
  InvalidState = VMMW_INVALID_STATE,
  CheckpointInvalid = VMMW_CHECKPOINT_INVALID,
  Io = VMMW_IO,
  PlanMismatch = VMMW_PLAN_MISMATCH,
  Cancelled = VMMW_CANCELLED,
  Panic = VMMW_PANIC,
  Unsupported = VMMW_UNSUPPORTED,
  BufferTooSmall = VMMW_BUFFER_TOO_SMALL,
  LoadInProgress = VMMW_LOAD_IN_PROGRESS,
  ShareRefused = VMMW_SHARE_REFUSED,
  ShareRevoked = VMMW_SHARE_REVOKED,
  VersionMismatch = VMMW_VERSION_MISMATCH,
  UpdateSource = VMMW_UPDATE_SOURCE,
  UpdateTorn = VMMW_UPDATE_TORN,
};

/// A failed vmmweights call: the C status code and the library's message.
class Error : public std::runtime_error {
 public:
  Error(vmmw_status_t status, const std::string& message, int32_t driver_code = 0)
      : std::runtime_error(message), status_(status), driver_code_(driver_code) {}

  /// The VMMW_* status code (never VMMW_OK).
  [[nodiscard]] vmmw_status_t status() const noexcept { return status_; }

  /// The status as an enum class (a number this header does not know stays as is).
  [[nodiscard]] Status code() const noexcept { return static_cast<Status>(status_); }

  /// The status code's name ("VMMW_OUT_OF_MEMORY").
  [[nodiscard]] const char* status_name() const noexcept { return vmmw_status_name(status_); }

  /// The driver's own code (a CUresult on the cuda backend, an errno on the
  /// host backend) of a VMMW_DRIVER_ERROR; 0 for any other error.
  [[nodiscard]] int32_t driver_code() const noexcept { return driver_code_; }

 private:
  vmmw_status_t status_;
  int32_t driver_code_;
};

namespace detail {

/// Throw vmmw::Error for a non-OK status, taking ownership of `err`.
inline void check(vmmw_status_t rc, vmmw_error_t* err) {
  if (rc == VMMW_OK) {
    vmmw_error_free(err);  // never set on success; harmless either way
    return;
  }
  std::string msg = err != nullptr ? vmmw_error_message(err) : vmmw_status_name(rc);
  int32_t driver_code = vmmw_error_driver_code(err);
  vmmw_error_free(err);
  throw Error(rc, std::string(vmmw_status_name(rc)) + ": " + msg, driver_code);
}

/// Call `f(vmmw_error_t**)` and throw on failure.
template <class F>
void call(F&& f) {
  vmmw_error_t* err = nullptr;
  vmmw_status_t rc = std::forward<F>(f)(&err);
  check(rc, err);
}

/// Read a string through the C buffer protocol (buf, cap, *needed).
template <class F>
std::string read_string(F&& f) {
  std::string out(64, '\0');
  for (int attempt = 0; attempt < 4; ++attempt) {
    size_t needed = 0;
    vmmw_error_t* err = nullptr;
    vmmw_status_t rc = f(&out[0], out.size(), &needed, &err);
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

/// Throw VMMW_NULL_ARGUMENT for the use of a moved-from (empty) object.
[[noreturn]] inline void empty_handle(const char* what) {
  throw Error(VMMW_NULL_ARGUMENT, std::string("VMMW_NULL_ARGUMENT: use of an empty (moved-from) ") + what);
}

/// The pointer of a handle, or throw VMMW_NULL_ARGUMENT for a moved-from one.
template <class P>
auto live(const P& p, const char* what) -> decltype(p.get()) {
  if (!p) empty_handle(what);
  return p.get();
}

}  // namespace detail

/// The library's version at run time ("0.1.0"); compare with VMMW_VERSION_STRING.
[[nodiscard]] inline std::string version() { return vmmw_version_string(); }

/// Which backend to open.
enum class Backend : vmmw_backend_t {
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
      return vmmw_device_open(static_cast<vmmw_backend_t>(backend), ordinal, &raw, e);
    });
    h_.reset(raw);
  }

  /// Adopt a handle from vmmw_device_open (this object frees it).
  explicit Device(vmmw_device_t* adopt) noexcept : h_(adopt) {}

  [[nodiscard]] Backend backend() const {
    vmmw_backend_t b = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_device_backend(get_checked(), &b, e); });
    return static_cast<Backend>(b);
  }

  [[nodiscard]] uint64_t granularity() const {
    uint64_t g = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_device_granularity(get_checked(), &g, e); });
    return g;
  }

  [[nodiscard]] MemInfo mem_info() const {
    MemInfo m{0, 0};
    detail::call([&](vmmw_error_t** e) {
      return vmmw_device_mem_info(get_checked(), &m.free_bytes, &m.total_bytes, e);
    });
    return m;
  }

  [[nodiscard]] std::string describe() const {
    const vmmw_device_t* d = get_checked();
    return detail::read_string([d](char* b, size_t c, size_t* n, vmmw_error_t** e) {
      return vmmw_device_describe(d, b, c, n, e);
    });
  }

  /// Why this backend was chosen.
  [[nodiscard]] std::string choice_reason() const {
    const vmmw_device_t* d = get_checked();
    return detail::read_string([d](char* b, size_t c, size_t* n, vmmw_error_t** e) {
      return vmmw_device_choice_reason(d, b, c, n, e);
    });
  }

  void synchronize() const {
    detail::call([&](vmmw_error_t** e) { return vmmw_device_synchronize(get_checked(), e); });
  }

  /// The C handle (still owned by this object); nullptr once moved from.
  [[nodiscard]] const vmmw_device_t* get() const noexcept { return h_.get(); }
  [[nodiscard]] vmmw_device_t* get() noexcept { return h_.get(); }

  /// Give up ownership: the caller frees the returned handle with vmmw_device_free.
  [[nodiscard]] vmmw_device_t* release() noexcept { return h_.release(); }

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

  /// Adopt a handle from vmmw_segment_new (this object frees it).
  explicit Segment(vmmw_segment_t* adopt) noexcept : h_(adopt) {}

  [[nodiscard]] vmmw_segment_info_t info() const {
    vmmw_segment_info_t i{};
    detail::call([&](vmmw_error_t** e) { return vmmw_segment_info(get_checked(), &i, e); });
    return i;
  }

  /// The base device address (stable for the segment's life).
  [[nodiscard]] uint64_t ptr() const { return info().ptr; }

  /// Copy host bytes in at `offset` (synchronous).
  void write(uint64_t offset, const void* src, size_t len) {
    detail::call([&](vmmw_error_t** e) { return vmmw_segment_write(get_mut(), offset, src, len, e); });
  }

  /// Copy bytes at `offset` out to host memory (synchronous).
  void read(uint64_t offset, void* dst, size_t len) const {
    detail::call([&](vmmw_error_t** e) { return vmmw_segment_read(get_checked(), offset, dst, len, e); });
  }

  [[nodiscard]] const vmmw_segment_t* get() const noexcept { return h_.get(); }
  [[nodiscard]] vmmw_segment_t* get() noexcept { return h_.get(); }

  /// Give up ownership: the caller frees the returned handle with vmmw_segment_free.
  [[nodiscard]] vmmw_segment_t* release() noexcept { return h_.release(); }

 private:
  const vmmw_segment_t* get_checked() const { return detail::live(h_, "vmmw::Segment"); }
  vmmw_segment_t* get_mut() { return detail::live(h_, "vmmw::Segment"); }
  detail::Owned<vmmw_segment_t, vmmw_segment_free> h_;
};

// ---- tags ------------------------------------------------------------------

/// Options of `pack` and `unpack` (docs/PACKED.md); value-initialized is the
/// defaults, with `size` set.
[[nodiscard]] inline vmmw_pack_options_t pack_options() {
  vmmw_pack_options_t o{};
  o.size = sizeof o;
  return o;
}

/// Pack the checkpoint at `src` (a safetensors file, a folder with its index,
/// or a GGUF file) into `dst` (a folder for a folder, else a file): the same
/// tensors, header and metadata, each tensor's bytes losslessly compressed.
/// Encodes on the GPU where one opens, on CPU threads otherwise; nothing is
/// left at `dst` when it throws. Loading needs nothing new: `Loader` reads
/// packed checkpoints.
inline vmmw_pack_report_t pack(const std::string& src, const std::string& dst,
                               const vmmw_pack_options_t& options = pack_options()) {
  vmmw_pack_report_t r{};
  detail::call([&](vmmw_error_t** e) {
    return vmmw_pack(src.c_str(), dst.c_str(), &options, nullptr, nullptr, &r, e);
  });
  return r;
}

/// Write the original files of the packed checkpoint at `src` to `dst`, bit
/// for bit.
inline vmmw_pack_report_t unpack(const std::string& src, const std::string& dst,
                                 const vmmw_pack_options_t& options = pack_options()) {
  vmmw_pack_report_t r{};
  detail::call([&](vmmw_error_t** e) {
    return vmmw_unpack(src.c_str(), dst.c_str(), &options, nullptr, nullptr, &r, e);
  });
  return r;
}

/// A tag id: names a group of allocations that sleep and wake together.
using Tag = uint32_t;

/// The id of tag `name`, registering it on first use.
[[nodiscard]] inline Tag tag_id(const std::string& name) {
  Tag t = 0;
  detail::call([&](vmmw_error_t** e) { return vmmw_tag_id(name.c_str(), &t, e); });
  return t;
}

/// The name of a registered tag.
[[nodiscard]] inline std::string tag_name(Tag tag) {
  return detail::read_string([tag](char* b, size_t c, size_t* n, vmmw_error_t** e) {
    return vmmw_tag_name(tag, b, c, n, e);
  });
}

/// The tag allocations on this thread get now.
[[nodiscard]] inline Tag current_tag() {
  Tag t = 0;
  detail::call([&](vmmw_error_t** e) { return vmmw_tag_current(&t, e); });
  return t;
}

/// Make `tag` the tag of allocations made outside any scope, on every thread
/// (VMMW_TAG_DEFAULT restores the initial one).
inline void set_process_default_tag(Tag tag) {
  detail::call([&](vmmw_error_t** e) { return vmmw_tag_set_process_default(tag, e); });
}

/// How many times `tag`'s memory was mapped anew in this process (each wake);
/// re-register RDMA buffers (NCCL, NIXL, UCX) of the tag when it changed.
[[nodiscard]] inline uint64_t remap_epoch(Tag tag) {
  uint64_t out = 0;
  detail::call([&](vmmw_error_t** e) { return vmmw_tag_remap_epoch(tag, &out, e); });
  return out;
}

/// Calls `fn(tag, epoch)` after every remap of any tag while it lives, on the
/// thread that woke the tag, after the wake, with no library lock held.
/// Destroying it waits for calls running on other threads. `fn` must not
/// throw (an exception cannot cross the C library); a throwing `fn` calls
/// std::terminate. Not copyable or movable (the library holds its address).
class RemapCallback {
 public:
  explicit RemapCallback(std::function<void(Tag, uint64_t)> fn) : fn_(std::move(fn)) {
    detail::call([&](vmmw_error_t** e) { return vmmw_remap_callback_add(&RemapCallback::trampoline, this, &id_, e); });
  }
  ~RemapCallback() { (void)vmmw_remap_callback_remove(id_, nullptr); }
  RemapCallback(const RemapCallback&) = delete;
  RemapCallback& operator=(const RemapCallback&) = delete;
  RemapCallback(RemapCallback&&) = delete;
  RemapCallback& operator=(RemapCallback&&) = delete;

 private:
  static void trampoline(void* user, uint32_t tag, uint64_t epoch) noexcept {
    static_cast<RemapCallback*>(user)->fn_(tag, epoch);
  }
  std::function<void(Tag, uint64_t)> fn_;
  uint64_t id_ = 0;
};

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
enum class Policy : vmmw_policy_t {
  Offload = VMMW_POLICY_OFFLOAD,  ///< pinned host backup, restored byte for byte
  Discard = VMMW_POLICY_DISCARD,  ///< contents dropped (e.g. a KV cache)
  Reload = VMMW_POLICY_RELOAD,    ///< re-read from the checkpoint at wake
  OffloadCompressed = VMMW_POLICY_OFFLOAD_COMPRESSED,  ///< as Offload, backup compressed on the GPU
};

/// What Pool::swap did, each side on its own (vmmw_swap_result_t).
using SwapResult = vmmw_swap_result_t;

/// A swap that ran and whose sleep or wake side failed (vmmw_pool_swap): the
/// status is the wake side's when it failed, else the sleep side's; result()
/// tells both. A waking tag that failed is asleep with its backup intact.
class SwapError : public Error {
 public:
  SwapError(vmmw_status_t status, const std::string& message, int32_t driver_code, const SwapResult& result)
      : Error(status, message, driver_code), result_(result) {}

  /// Both sides' outcome.
  [[nodiscard]] const SwapResult& result() const noexcept { return result_; }

 private:
  SwapResult result_;
};

/// Pool creation options (defaults: auto backend, device 0, default sizes).
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

/// Sleep engine tunables; 0 means the default (see vmmw_sleep_options_t).
struct SleepOptions {
  uint64_t copy_piece_bytes = 0;
  uint32_t streams = 0;
  bool debug_fill = false;
  uint8_t debug_fill_byte = 0;
  uint64_t wake_coalesce_bytes = 0;
  uint64_t backup_slab_bytes = 0;
  uint64_t host_memory_limit = 0;  ///< cap on pinned backup memory (0: unlimited)
  bool free_backup_after_wake = false;
  bool release_pinned_after_wake = false;
  uint32_t codec_element_bytes = 0;  ///< OffloadCompressed: element width 1, 2 or 4 (0: 2)
};

/// A pool's memory, for all tags or one (see vmmw_report_t).
using Report = vmmw_report_t;

class Block;

/// A caching pool of VMM memory (vmmw_pool_t). Thread-safe. Blocks keep the
/// C pool alive, so a Pool may be destroyed before its Blocks.
class Pool {
 public:
  explicit Pool(const PoolOptions& o = PoolOptions()) {
    vmmw_pool_options_t c{};
    c.size = sizeof c;
    c.device_handle = o.device_handle != nullptr ? o.device_handle->get() : nullptr;
    c.backend = static_cast<vmmw_backend_t>(o.backend);
    c.device = o.device;
    c.align = o.align;
    c.small_request_max = o.small_request_max;
    c.small_segment_bytes = o.small_segment_bytes;
    c.large_segment_bytes = o.large_segment_bytes;
    c.chunk_bytes = o.chunk_bytes;
    vmmw_pool_t* raw = nullptr;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_new(&c, &raw, e); });
    h_ = std::make_shared<Handle>(raw);
  }

  /// Adopt a handle from vmmw_pool_new or vmmw_pool_default (this object frees it).
  explicit Pool(vmmw_pool_t* adopt) : h_(std::make_shared<Handle>(adopt)) {}

  Pool(Pool&&) noexcept = default;
  Pool& operator=(Pool&&) noexcept = default;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  /// The process-global pool of `device` (shared with the PyTorch entry points).
  [[nodiscard]] static Pool global(int32_t device = 0) {
    vmmw_pool_t* raw = nullptr;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_default(device, &raw, e); });
    return Pool(raw);
  }

  /// Allocate under the current thread's tag; the block returns itself when destroyed.
  [[nodiscard]] Block alloc(uint64_t size);

  /// Allocate under `tag`.
  [[nodiscard]] Block alloc(uint64_t size, Tag tag);

  /// Give back a block by address (one from Block::release() or the C API).
  void dealloc(uint64_t ptr) {
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_dealloc(get_mut(), ptr, e); });
  }

  /// Say `[ptr, ptr+len)` was written since a load filled it: a Reload sleep
  /// keeps it in the host backup instead of restoring the checkpoint's bytes
  /// (optional: such a sleep also finds changed bytes by hashing them).
  void mark_written(uint64_t ptr, uint64_t len) {
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_mark_written(get_mut(), ptr, len, e); });
  }

  /// Return cached memory to the driver; the bytes released.
  uint64_t trim() {
    uint64_t r = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_trim(get_mut(), &r, e); });
    return r;
  }

  void set_tag_arena(Tag tag, uint64_t reserve_bytes, uint64_t grow_step = 0) {
    detail::call([&](vmmw_error_t** e) {
      return vmmw_pool_set_tag_arena(get_mut(), tag, reserve_bytes, grow_step, e);
    });
  }

  void set_tag_segments(Tag tag) {
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_set_tag_segments(get_mut(), tag, e); });
  }

  /// Create `tag`'s memory RDMA-capable (registrable by NCCL, NIXL, UCX), from
  /// its first allocation on and at every wake (vmmw_pool_set_tag_rdma).
  void set_tag_rdma(Tag tag, bool rdma = true) {
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_set_tag_rdma(get_mut(), tag, rdma ? 1 : 0, e); });
  }

  [[nodiscard]] Report report() const {
    Report r{};
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_report(get_checked(), &r, e); });
    return r;
  }

  [[nodiscard]] Report report(Tag tag) const {
    Report r{};
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_report_tag(get_checked(), tag, &r, e); });
    return r;
  }

  [[nodiscard]] std::string report_json() const {
    const vmmw_pool_t* p = get_checked();
    return detail::read_string([p](char* b, size_t c, size_t* n, vmmw_error_t** e) {
      return vmmw_pool_report_json(p, b, c, n, e);
    });
  }

  void snapshot(const std::string& name) {
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_snapshot(get_mut(), name.c_str(), e); });
  }

  [[nodiscard]] std::string timeline_json() const {
    const vmmw_pool_t* p = get_checked();
    return detail::read_string([p](char* b, size_t c, size_t* n, vmmw_error_t** e) {
      return vmmw_pool_timeline_json(p, b, c, n, e);
    });
  }

  /// Forget every snapshot of the timeline; returns how many were kept.
  uint64_t clear_timeline() {
    uint64_t n = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_clear_timeline(get_mut(), &n, e); });
    return n;
  }

  /// Copy host bytes to pool memory (synchronous, range-checked).
  void write(uint64_t dst, const void* src, size_t len) {
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_write(get_mut(), dst, src, len, e); });
  }

  /// Copy pool memory to host bytes (synchronous, range-checked).
  void read(uint64_t src, void* dst, size_t len) const {
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_read(get_checked(), src, dst, len, e); });
  }

  /// Copy asleep pool memory out of the host backup its sleep kept, without
  /// waking it (the tag must sleep with a backup holding the whole range).
  /// Returns the tag whose backup was read.
  Tag read_backup(uint64_t ptr, void* dst, size_t len) const {
    uint32_t tag = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_read_backup(get_checked(), ptr, dst, len, &tag, e); });
    return tag;
  }

  /// The pinned host address of the backup bytes of `len` bytes at `ptr`,
  /// without copying (an asleep tag's backup, or one kept after wake), and
  /// their tag. The pool owns the bytes: read them, never free them; valid
  /// until the segment is freed, the pool's unused backups are released, or
  /// a sleep of the tag needs a backup of another shape.
  std::pair<const void*, Tag> backup_view(uint64_t ptr, size_t len) const {
    const void* host = nullptr;
    uint32_t tag = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_backup_view(get_checked(), ptr, len, &host, &tag, e); });
    return {host, tag};
  }

  /// Put tags to sleep, each with its policy; pointers stay valid.
  void sleep(const std::vector<std::pair<Tag, Policy>>& items) {
    std::vector<vmmw_tag_policy_t> c;
    c.reserve(items.size());
    for (const auto& i : items) c.push_back(vmmw_tag_policy_t{i.first, static_cast<vmmw_policy_t>(i.second)});
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_sleep(get_mut(), c.data(), c.size(), e); });
  }

  /// Wake the listed tags (all sleeping tags when empty), at the same addresses.
  void wake(const std::vector<Tag>& tags = {}) {
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_wake(get_mut(), tags.data(), tags.size(), e); });
  }

  /// Wake as wake() does, but instead of failing at once when free device
  /// memory is short, map each chunk as the device has room, waiting up to
  /// `wait_memory_ms` for memory another process or pool releases
  /// (vmmw_pool_wake_with). Throws VMMW_OUT_OF_MEMORY naming the tag when the
  /// wait runs out; the tag stays asleep with its backup.
  void wake_with(const std::vector<Tag>& tags, uint64_t wait_memory_ms) {
    vmmw_wake_options_t o{};
    o.size = sizeof o;
    o.wait_memory_ms = wait_memory_ms;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_wake_with(get_mut(), tags.data(), tags.size(), &o, e); });
  }

  /// Put `sleep` to sleep and wake `wake` at once, the two directions of the
  /// link overlapping (vmmw_pool_swap). `wait_memory_ms`: how long the wake
  /// may still wait for memory from elsewhere once the sleep has ended.
  /// Throws vmmw::Error when refused (nothing changed), vmmw::SwapError
  /// (with both sides' outcome) when a side failed.
  SwapResult swap(const std::vector<std::pair<Tag, Policy>>& sleep, const std::vector<Tag>& wake,
                  uint64_t wait_memory_ms = 0) {
    std::vector<vmmw_tag_policy_t> c;
    c.reserve(sleep.size());
    for (const auto& i : sleep) c.push_back(vmmw_tag_policy_t{i.first, static_cast<vmmw_policy_t>(i.second)});
    vmmw_swap_options_t o{};
    o.size = sizeof o;
    o.wait_memory_ms = wait_memory_ms;
    SwapResult r{};
    r.sleep_status = -1;  // a status the library never writes: tells whether the swap ran
    vmmw_error_t* err = nullptr;
    vmmw_status_t rc = vmmw_pool_swap(get_mut(), c.data(), c.size(), wake.data(), wake.size(), &o, &r, &err);
    if (rc != VMMW_OK && r.sleep_status != -1) {
      std::string msg = err != nullptr ? vmmw_error_message(err) : vmmw_status_name(rc);
      int32_t driver_code = vmmw_error_driver_code(err);
      vmmw_error_free(err);
      throw SwapError(rc, std::string(vmmw_status_name(rc)) + ": " + msg, driver_code, r);
    }
    detail::check(rc, err);
    return r;
  }

  /// Grant peer devices access to every segment of `tag`, kept across
  /// sleep/wake and for new segments; peers missing from the list lose it.
  void set_peer_access(Tag tag, const std::vector<vmmw_peer_access_t>& peers) {
    detail::call([&](vmmw_error_t** e) {
      return vmmw_pool_set_peer_access(get_mut(), tag, peers.data(), peers.size(), e);
    });
  }

  /// The peers granted access to `tag`, sorted by device.
  std::vector<vmmw_peer_access_t> peer_access(Tag tag) const {
    const vmmw_pool_t* p = get_checked();
    size_t n = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_peer_access_count(p, tag, &n, e); });
    std::vector<vmmw_peer_access_t> out(n);
    for (size_t i = 0; i < n; ++i) {
      detail::call([&](vmmw_error_t** e) { return vmmw_pool_peer_access_at(p, tag, i, &out[i], e); });
    }
    return out;
  }

  /// Whether this pool's device can reach memory of device `peer`.
  bool can_access_peer(int32_t peer) const {
    int32_t can = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_can_access_peer(get_checked(), peer, &can, e); });
    return can != 0;
  }

  /// Drop a tag's reload sources: a Reload-asleep tag whose checkpoint changed
  /// then wakes with its backed-up bytes (loaded bytes undefined; load again).
  void forget_reload(Tag tag) {
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_forget_reload(get_mut(), tag, e); });
  }

  /// Pin host backup memory ahead of time.
  void reserve_backup(uint64_t bytes) {
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_reserve_backup(get_mut(), bytes, e); });
  }

  /// Unpin backup memory not holding a sleeping tag; the bytes unpinned.
  uint64_t release_backup() {
    uint64_t r = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_release_backup(get_mut(), &r, e); });
    return r;
  }

  /// Bytes of pinned host staging the loader keeps cached for this pool's driver
  /// (shared by pools made from one vmmw_device_t).
  [[nodiscard]] uint64_t staging_bytes() const {
    uint64_t r = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_staging_bytes(get_checked(), &r, e); });
    return r;
  }

  /// Unpin the loader's cached staging ring for this pool's driver; the bytes unpinned.
  /// The next load pins a new one.
  uint64_t release_staging() {
    uint64_t r = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_release_staging(get_mut(), &r, e); });
    return r;
  }

  void set_sleep_options(const SleepOptions& o) {
    vmmw_sleep_options_t c{};
    c.size = sizeof c;
    c.copy_piece_bytes = o.copy_piece_bytes;
    c.streams = o.streams;
    c.debug_fill = o.debug_fill ? 1 : 0;
    c.debug_fill_byte = o.debug_fill_byte;
    c.wake_coalesce_bytes = o.wake_coalesce_bytes;
    c.backup_slab_bytes = o.backup_slab_bytes;
    c.host_memory_limit = o.host_memory_limit;
    c.free_backup_after_wake = o.free_backup_after_wake ? 1 : 0;
    c.release_pinned_after_wake = o.release_pinned_after_wake ? 1 : 0;
    c.codec_element_bytes = o.codec_element_bytes;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_set_sleep_options(get_mut(), &c, e); });
  }

  /// The weights version of `tag` in this pool (1 until an update or a publish moves it).
  [[nodiscard]] uint64_t tag_version(Tag tag) const {
    uint64_t v = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_tag_version(get_checked(), tag, &v, e); });
    return v;
  }

  /// True while an update of `tag` failed midway and left its destinations mixed.
  [[nodiscard]] bool tag_torn(Tag tag) const {
    int32_t torn = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_tag_torn(get_checked(), tag, &torn, e); });
    return torn != 0;
  }

  /// Announce weights of `tag` rewritten in place by other means than an
  /// update: the version moves by one (returned), importers see it.
  uint64_t publish(Tag tag) {
    uint64_t v = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_publish(get_mut(), tag, &v, e); });
    return v;
  }

  /// What the last sleep or wake through this handle did, as JSON.
  [[nodiscard]] std::string last_cycle_json() const {
    const vmmw_pool_t* p = get_checked();
    return detail::read_string([p](char* b, size_t c, size_t* n, vmmw_error_t** e) {
      return vmmw_pool_last_cycle_json(p, b, c, n, e);
    });
  }

  /// The C handle (still owned by this object); nullptr once moved from.
  [[nodiscard]] const vmmw_pool_t* get() const noexcept { return h_ ? h_->raw : nullptr; }
  [[nodiscard]] vmmw_pool_t* get() noexcept { return h_ ? h_->raw : nullptr; }

  /// Give up ownership: the caller frees the returned handle with
  /// vmmw_pool_free. Throws VMMW_INVALID_STATE while Blocks still hold it.
  [[nodiscard]] vmmw_pool_t* release() {
    if (h_ && h_.use_count() > 1)
      throw Error(VMMW_INVALID_STATE, "VMMW_INVALID_STATE: vmmw::Blocks still hold this pool; release or reset them first");
    vmmw_pool_t* raw = h_ ? h_->raw : nullptr;
    if (h_) h_->raw = nullptr;
    h_.reset();
    return raw;
  }

 private:
  friend class Block;
  /// The C handle, shared with the pool's Blocks; freed with the last of them.
  struct Handle {
    explicit Handle(vmmw_pool_t* r) noexcept : raw(r) {}
    ~Handle() { vmmw_pool_free(raw); }
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    vmmw_pool_t* raw;
  };

  const vmmw_pool_t* get_checked() const {
    if (!h_ || h_->raw == nullptr) detail::empty_handle("vmmw::Pool");
    return h_->raw;
  }
  vmmw_pool_t* get_mut() {
    if (!h_ || h_->raw == nullptr) detail::empty_handle("vmmw::Pool");
    return h_->raw;
  }
  std::shared_ptr<Handle> h_;
};

/// One block of pool memory at a stable device address. Move-only; returns
/// itself to its pool when destroyed (or at reset()); keeps the pool alive.
class [[nodiscard]] Block {
 public:
  Block() noexcept = default;

  /// Adopt the block at `ptr` (from the C API, or Block::release()) of `pool`.
  Block(Pool& pool, uint64_t ptr, uint64_t size) noexcept : pool_(pool.h_), ptr_(ptr), size_(size) {}

  ~Block() { reset(); }
  Block(Block&& o) noexcept : pool_(std::move(o.pool_)), ptr_(o.ptr_), size_(o.size_) { o.ptr_ = 0; }
  Block& operator=(Block&& o) noexcept {
    if (this != &o) {
      reset();
      pool_ = std::move(o.pool_);
      ptr_ = o.ptr_;
      size_ = o.size_;
      o.ptr_ = 0;
    }
    return *this;
  }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  /// The device address (0 when empty).
  [[nodiscard]] uint64_t ptr() const noexcept { return ptr_; }
  /// The bytes asked for.
  [[nodiscard]] uint64_t size() const noexcept { return size_; }
  explicit operator bool() const noexcept { return ptr_ != 0; }

  /// Give the block back now; throws vmmw::Error on failure (the destructor
  /// cannot report one). Empty afterwards.
  void free() {
    if (ptr_ == 0) return;
    const uint64_t p = ptr_;
    ptr_ = 0;
    auto pool = std::move(pool_);
    detail::call([&](vmmw_error_t** e) { return vmmw_pool_dealloc(pool->raw, p, e); });
  }

  /// Give the block back now, ignoring errors (what the destructor does).
  void reset() noexcept {
    if (ptr_ != 0 && pool_ && pool_->raw != nullptr) (void)vmmw_pool_dealloc(pool_->raw, ptr_, nullptr);
    ptr_ = 0;
    pool_.reset();
  }

  /// Give up ownership: the caller returns the address with Pool::dealloc
  /// (or vmmw_pool_dealloc). Empty afterwards.
  [[nodiscard]] uint64_t release() noexcept {
    const uint64_t p = ptr_;
    ptr_ = 0;
    pool_.reset();
    return p;
  }

 private:
  std::shared_ptr<Pool::Handle> pool_;
  uint64_t ptr_ = 0;
  uint64_t size_ = 0;
};

inline Block Pool::alloc(uint64_t size) {
  uint64_t p = 0;
  detail::call([&](vmmw_error_t** e) { return vmmw_pool_alloc(get_mut(), size, &p, e); });
  return Block(*this, p, size);
}

inline Block Pool::alloc(uint64_t size, Tag tag) {
  uint64_t p = 0;
  detail::call([&](vmmw_error_t** e) { return vmmw_pool_alloc_tagged(get_mut(), size, tag, &p, e); });
  return Block(*this, p, size);
}

// ---- loader ----------------------------------------------------------------

/// How a load moves bytes (see VMMW_COPY_*).
enum class CopyStrategy : vmmw_copy_strategy_t {
  Auto = VMMW_COPY_AUTO,      ///< staged through a cache-sized pinned ring; cold data by pread
  Direct = VMMW_COPY_DIRECT,  ///< DMA from registered mmap windows of the page cache
  Staged = VMMW_COPY_STAGED,  ///< memcpy into pinned slots, then DMA
  Read = VMMW_COPY_READ,      ///< pread into pinned slots, then DMA
  Simple = VMMW_COPY_SIMPLE,  ///< one thread, no pinning (the reference path)
};

/// Load options; 0 / false means the default.
struct LoadOptions {
  bool allow_missing = false;     ///< leave destinations no source fills untouched
  bool allow_unexpected = false;  ///< skip checkpoint tensors with no destination
  CopyStrategy strategy = CopyStrategy::Auto;
  uint32_t threads = 0;  ///< 0: one per CPU, at most 16
  uint64_t window_bytes = 0;
  uint64_t slot_bytes = 0;
};

/// One destination parameter.
struct Destination {
  uint64_t ptr = 0;
  uint64_t bytes = 0;
  std::string dtype;
  std::vector<uint64_t> shape;
};

/// What a plan will do / what a load did (see the C structs).
using PlanSummary = vmmw_plan_summary_t;
using LoadResult = vmmw_load_result_t;

/// Progress of a load: (bytes done, bytes total). Returns whether to cancel:
/// false continues, true asks the load to stop, as a non-zero return does in
/// C (vmmw_progress_fn) and a truthy one in Python (docs/ABI.md).
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

  /// Adopt a handle from vmmw_loader_open (this object frees it).
  explicit Loader(vmmw_loader_t* adopt) noexcept : h_(adopt) {}

  void set_rules_json(const std::string& json) {
    detail::call([&](vmmw_error_t** e) { return vmmw_loader_set_rules_json(get_mut(), json.c_str(), e); });
  }

  void set_rules_preset(const std::string& family, uint32_t tp_rank = 0, uint32_t tp_world = 0,
                        uint32_t head_dim = 128) {
    detail::call([&](vmmw_error_t** e) {
      return vmmw_loader_set_rules_preset(get_mut(), family.c_str(), tp_rank, tp_world, head_dim, e);
    });
  }

  void set_options(const LoadOptions& o) {
    vmmw_load_options_t c{};
    c.size = sizeof c;
    c.allow_missing = o.allow_missing ? 1 : 0;
    c.allow_unexpected = o.allow_unexpected ? 1 : 0;
    c.strategy = static_cast<vmmw_copy_strategy_t>(o.strategy);
    c.threads = o.threads;
    c.window_bytes = o.window_bytes;
    c.slot_bytes = o.slot_bytes;
    detail::call([&](vmmw_error_t** e) { return vmmw_loader_set_options(get_mut(), &c, e); });
  }

  /// Keep content checksums at load, so Reload wakes prove the checkpoint unchanged.
  void set_reload_check(bool enable) {
    detail::call([&](vmmw_error_t** e) { return vmmw_loader_set_reload_check(get_mut(), enable ? 1 : 0, e); });
  }

  /// Register your own destination at device address `ptr`.
  void add(const std::string& name, uint64_t ptr, const std::string& dtype,
           const std::vector<uint64_t>& shape) {
    detail::call([&](vmmw_error_t** e) {
      return vmmw_loader_register(get_mut(), name.c_str(), ptr, dtype.c_str(), shape.data(), shape.size(), e);
    });
  }

  /// Declare `[ptr, ptr + bytes)` as device memory you own outside the pool
  /// loads run on; destinations outside the pool must lie in such a range
  /// (the pool's own memory is checked regardless).
  void declare_foreign(uint64_t ptr, uint64_t bytes) {
    detail::call([&](vmmw_error_t** e) { return vmmw_loader_declare_foreign(get_mut(), ptr, bytes, e); });
  }

  /// Allocate every destination the plan needs from `pool` under `tag`.
  void allocate(Pool& pool, Tag tag) {
    detail::call([&](vmmw_error_t** e) { return vmmw_loader_allocate(get_mut(), pool.get(), tag, e); });
  }

  /// Names of the registered destinations, in name order.
  [[nodiscard]] std::vector<std::string> destination_names() const {
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

  [[nodiscard]] Destination destination(const std::string& name) const {
    vmmw_destination_t d{};
    detail::call([&](vmmw_error_t** e) { return vmmw_loader_destination(get_checked(), name.c_str(), &d, e); });
    Destination out;
    out.ptr = d.ptr;
    out.bytes = d.bytes;
    const char* begin = d.dtype;
    const void* nul = std::memchr(begin, 0, sizeof d.dtype);
    out.dtype.assign(begin, nul != nullptr ? static_cast<const char*>(nul) : begin + sizeof d.dtype);
    out.shape.assign(d.shape, d.shape + (d.ndim < VMMW_MAX_DIMS ? d.ndim : VMMW_MAX_DIMS));
    return out;
  }

  /// Check the plan without writing anything.
  [[nodiscard]] PlanSummary plan() const {
    PlanSummary s{};
    detail::call([&](vmmw_error_t** e) { return vmmw_loader_plan(get_checked(), &s, e); });
    return s;
  }

  /// Load into the destinations on `pool`'s device. An exception thrown by
  /// `progress` cancels the load and is rethrown here.
  LoadResult load(Pool& pool, const Progress& progress = Progress()) {
    struct Ctx {
      const Progress* fn;
      std::exception_ptr error;
    } ctx{&progress, nullptr};
    auto trampoline = [](uint64_t done, uint64_t total, void* user) -> int32_t {
      auto* c = static_cast<Ctx*>(user);
      try {
        return (*c->fn)(done, total) ? 1 : 0;
      } catch (...) {
        c->error = std::current_exception();  // never unwind into the library
        return 1;
      }
    };
    vmmw_error_t* err = nullptr;
    vmmw_status_t rc = vmmw_loader_load(get_mut(), pool.get(), progress ? +trampoline : nullptr, &ctx, &err);
    if (ctx.error) {
      vmmw_error_free(err);
      std::rethrow_exception(ctx.error);
    }
    detail::check(rc, err);
    return result();
  }

  /// Stop a running load from another thread (it throws VMMW_CANCELLED).
  void cancel() {
    detail::call([&](vmmw_error_t** e) { return vmmw_loader_cancel(get_mut(), e); });
  }

  [[nodiscard]] LoadResult result() const {
    LoadResult r{};
    detail::call([&](vmmw_error_t** e) { return vmmw_loader_result(get_checked(), &r, e); });
    return r;
  }

  [[nodiscard]] std::string result_json() const {
    const vmmw_loader_t* l = get_checked();
    return detail::read_string([l](char* b, size_t c, size_t* n, vmmw_error_t** e) {
      return vmmw_loader_result_json(l, b, c, n, e);
    });
  }

  [[nodiscard]] const vmmw_loader_t* get() const noexcept { return h_.get(); }
  [[nodiscard]] vmmw_loader_t* get() noexcept { return h_.get(); }

  /// Give up ownership: the caller frees the returned handle with vmmw_loader_free.
  [[nodiscard]] vmmw_loader_t* release() noexcept { return h_.release(); }

 private:
  const vmmw_loader_t* get_checked() const { return detail::live(h_, "vmmw::Loader"); }
  vmmw_loader_t* get_mut() { return detail::live(h_, "vmmw::Loader"); }
  detail::Owned<vmmw_loader_t, vmmw_loader_free> h_;
};

/// Where an update source tensor's bytes lie.
enum class Memory : vmmw_update_memory_t {
  Device = VMMW_UPDATE_DEVICE,  ///< memory the pool's device can read
  Host = VMMW_UPDATE_HOST,      ///< host memory of this process
};

/// Whole tensors, by checkpoint name, that an update reads (docs/UPDATES.md).
/// Move-only; the tensors stay the caller's and must stay valid while
/// updates read them.
class UpdateSource {
 public:
  UpdateSource() {
    vmmw_update_source_t* raw = nullptr;
    detail::call([&](vmmw_error_t** e) { return vmmw_update_source_new(&raw, e); });
    h_.reset(raw);
  }

  /// Adopt a handle from vmmw_update_source_new (this object frees it).
  explicit UpdateSource(vmmw_update_source_t* adopt) noexcept : h_(adopt) {}

  /// Add tensor `name` of `dtype` and `shape` lying contiguously at `ptr`.
  void add(const std::string& name, const std::string& dtype, const std::vector<uint64_t>& shape, uint64_t ptr,
           Memory memory = Memory::Device) {
    detail::call([&](vmmw_error_t** e) {
      return vmmw_update_source_add(get_mut(), name.c_str(), dtype.c_str(), shape.data(), shape.size(), ptr,
                                    static_cast<vmmw_update_memory_t>(memory), e);
    });
  }

  [[nodiscard]] vmmw_update_source_t* get() noexcept { return h_.get(); }

  /// Give up ownership: the caller frees the returned handle with vmmw_update_source_free.
  [[nodiscard]] vmmw_update_source_t* release() noexcept { return h_.release(); }

 private:
  vmmw_update_source_t* get_mut() { return detail::live(h_, "vmmw::UpdateSource"); }
  detail::Owned<vmmw_update_source_t, vmmw_update_source_free> h_;
};

/// Options of an update (vmmw_update_options_t).
struct UpdateOptions {
  uint64_t expected_version = 0;  ///< the version the update replaces (Pool::tag_version); required
  bool tag_set = false;           ///< version `tag` instead of the destinations' one pool tag
  Tag tag = 0;
  bool allow_missing = false;     ///< update only the destinations the source fills
  bool allow_unexpected = false;  ///< skip source tensors no destination receives
  bool staged = false;            ///< always stage through scratch device memory
};

/// Write `source` into the destinations `loader` registered, through its
/// rules, on `pool`'s device; the tag's version moves to
/// `o.expected_version + 1`. Every destination ends untouched or wholly new.
inline vmmw_update_result_t update(Loader& loader, Pool& pool, UpdateSource& source, const UpdateOptions& o) {
  vmmw_update_options_t c{};
  c.size = sizeof c;
  c.expected_version = o.expected_version;
  c.tag_set = o.tag_set ? 1 : 0;
  c.tag = o.tag;
  c.allow_missing = o.allow_missing ? 1 : 0;
  c.allow_unexpected = o.allow_unexpected ? 1 : 0;
  c.staging = o.staged ? VMMW_STAGING_ALWAYS : VMMW_STAGING_AUTO;
  vmmw_update_result_t r{};
  vmmw_loader_t* l = loader.get();
  if (l == nullptr) detail::empty_handle("vmmw::Loader");
  vmmw_pool_t* p = pool.get();
  if (p == nullptr) detail::empty_handle("vmmw::Pool");
  vmmw_update_source_t* s = source.get();
  if (s == nullptr) detail::empty_handle("vmmw::UpdateSource");
  detail::call([&](vmmw_error_t** e) { return vmmw_update(l, p, s, &c, &r, e); });
  return r;
}

/// A ggml tensor type's entry in the type table (vmmw_ggml_type).
struct GgmlType {
  uint32_t id = 0;         ///< number in GGUF files
  size_t block = 0;        ///< elements per block (1 for plain types)
  size_t type_size = 0;    ///< bytes per block
};

/// The ggml type named `name` ("Q8_0", "BF16": the dtype names of GGUF tensors).
[[nodiscard]] inline GgmlType ggml_type(const std::string& name) {
  GgmlType t;
  detail::call([&](vmmw_error_t** e) { return vmmw_ggml_type(name.c_str(), &t.id, &t.block, &t.type_size, e); });
  return t;
}

/// A checkpoint's metadata (GGUF's typed key/value pairs; none for
/// safetensors), read-only. A value is addressed by the pair's index and a
/// path of array indices (empty for the pair's own value). Thread-safe reads.
class Metadata {
 public:
  /// Open the checkpoint at `path` (validated as a load would) and keep its metadata.
  explicit Metadata(const std::string& path) {
    vmmw_metadata_t* raw = nullptr;
    detail::call([&](vmmw_error_t** e) { return vmmw_metadata_open(path.c_str(), &raw, e); });
    h_.reset(raw);
  }

  /// Adopt a handle from vmmw_metadata_open (this object frees it).
  explicit Metadata(vmmw_metadata_t* adopt) noexcept : h_(adopt) {}

  [[nodiscard]] size_t size() const {
    size_t n = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_metadata_count(get_checked(), &n, e); });
    return n;
  }

  [[nodiscard]] std::string key(size_t index) const {
    const vmmw_metadata_t* m = get_checked();
    return detail::read_string([m, index](char* b, size_t c, size_t* n, vmmw_error_t** e) {
      return vmmw_metadata_key(m, index, b, c, n, e);
    });
  }

  /// The index of `key`; throws VMMW_INVALID_ARGUMENT when there is none.
  [[nodiscard]] size_t find(const std::string& key) const {
    size_t i = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_metadata_find(get_checked(), key.c_str(), &i, e); });
    return i;
  }

  /// The value's type (VMMW_METADATA_*); for an array, its element type and length.
  [[nodiscard]] uint32_t type(size_t index, const std::vector<size_t>& path = {}, uint32_t* elem_type = nullptr,
                              size_t* len = nullptr) const {
    uint32_t t = 0;
    detail::call([&](vmmw_error_t** e) {
      return vmmw_metadata_type(get_checked(), index, path.data(), path.size(), &t, elem_type, len, e);
    });
    return t;
  }

  [[nodiscard]] uint64_t u64(size_t index, const std::vector<size_t>& path = {}) const {
    uint64_t v = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_metadata_u64(get_checked(), index, path.data(), path.size(), &v, e); });
    return v;
  }

  [[nodiscard]] int64_t i64(size_t index, const std::vector<size_t>& path = {}) const {
    int64_t v = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_metadata_i64(get_checked(), index, path.data(), path.size(), &v, e); });
    return v;
  }

  [[nodiscard]] double f64(size_t index, const std::vector<size_t>& path = {}) const {
    double v = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_metadata_f64(get_checked(), index, path.data(), path.size(), &v, e); });
    return v;
  }

  [[nodiscard]] bool boolean(size_t index, const std::vector<size_t>& path = {}) const {
    uint8_t v = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_metadata_bool(get_checked(), index, path.data(), path.size(), &v, e); });
    return v != 0;
  }

  [[nodiscard]] std::string string(size_t index, const std::vector<size_t>& path = {}) const {
    const vmmw_metadata_t* m = get_checked();
    return detail::read_string([&](char* b, size_t c, size_t* n, vmmw_error_t** e) {
      return vmmw_metadata_string(m, index, path.data(), path.size(), b, c, n, e);
    });
  }

  [[nodiscard]] const vmmw_metadata_t* get() const noexcept { return h_.get(); }

  /// Give up ownership: the caller frees the returned handle with vmmw_metadata_free.
  [[nodiscard]] vmmw_metadata_t* release() noexcept { return h_.release(); }

 private:
  const vmmw_metadata_t* get_checked() const { return detail::live(h_, "vmmw::Metadata"); }
  detail::Owned<vmmw_metadata_t, vmmw_metadata_free> h_;
};

namespace detail {
inline vmmw_update_options_t update_options(const UpdateOptions& o) {
  vmmw_update_options_t c{};
  c.size = sizeof c;
  c.expected_version = o.expected_version;
  c.tag_set = o.tag_set ? 1 : 0;
  c.tag = o.tag;
  c.allow_missing = o.allow_missing ? 1 : 0;
  c.allow_unexpected = o.allow_unexpected ? 1 : 0;
  c.staging = o.staged ? VMMW_STAGING_ALWAYS : VMMW_STAGING_AUTO;
  return c;
}
}  // namespace detail

/// An IPC update sender (vmmw_update_sender_t): a control socket at `path`
/// that receivers connect to, and a ring of `slots` buffers of `slot_bytes`
/// (0: 2 of 256 MiB) in `pool`, allocated at the first send() and exported
/// once (send_direct() needs no ring). Move-only.
class UpdateSender {
 public:
  UpdateSender(Pool& pool, const std::string& path, uint32_t slots = 0, uint64_t slot_bytes = 0,
               uint64_t timeout_ms = 0) {
    vmmw_update_sender_t* raw = nullptr;
    detail::call([&](vmmw_error_t** e) {
      return vmmw_update_sender_new(pool.get(), path.c_str(), slots, slot_bytes, timeout_ms, &raw, e);
    });
    h_.reset(raw);
  }

  /// Wait for `receivers` receivers and send them `source`'s tensors in
  /// buckets; returns once every receiver committed the update.
  vmmw_send_report_t send(UpdateSource& source, uint32_t receivers = 1) {
    vmmw_send_report_t r{};
    vmmw_update_source_t* s = source.get();
    if (s == nullptr) detail::empty_handle("vmmw::UpdateSource");
    detail::call([&](vmmw_error_t** e) { return vmmw_update_sender_send(get_mut(), s, receivers, &r, e); });
    return r;
  }

  /// Wait for `receivers` receivers and send them `source`'s tensors
  /// directly, without the ring: every tensor lies in device memory of the
  /// sender's pool; each receiver maps it and copies straight out of it.
  /// Returns once every receiver committed; the tensors must not be written
  /// before then.
  vmmw_send_report_t send_direct(UpdateSource& source, uint32_t receivers = 1) {
    vmmw_send_report_t r{};
    vmmw_update_source_t* s = source.get();
    if (s == nullptr) detail::empty_handle("vmmw::UpdateSource");
    detail::call(
        [&](vmmw_error_t** e) { return vmmw_update_sender_send_direct(get_mut(), s, receivers, &r, e); });
    return r;
  }

 private:
  vmmw_update_sender_t* get_mut() { return detail::live(h_, "vmmw::UpdateSender"); }
  detail::Owned<vmmw_update_sender_t, vmmw_update_sender_free> h_;
};

/// Receive one update from the IPC sender at `path` into `loader`'s
/// destinations in `pool`, through its rules (vmmw_update_receive_ipc).
inline vmmw_update_result_t receive_ipc(Loader& loader, Pool& pool, const std::string& path, const UpdateOptions& o,
                                        uint64_t timeout_ms = 0) {
  vmmw_update_options_t c = detail::update_options(o);
  vmmw_update_result_t r{};
  vmmw_loader_t* l = loader.get();
  if (l == nullptr) detail::empty_handle("vmmw::Loader");
  detail::call([&](vmmw_error_t** e) {
    return vmmw_update_receive_ipc(l, pool.get(), path.c_str(), timeout_ms, &c, &r, e);
  });
  return r;
}

/// A receiver of updates from the IPC sender at `path` that keeps the shares
/// of its direct updates imported between updates
/// (vmmw_update_receiver_t): a later direct update from the same sender over
/// the same memory attaches nothing. The kept imports keep the sender's
/// memory allocated (also memory it freed or put to sleep since) until they
/// are dropped: drop_imports(), a failed receive, or destruction. Imports on
/// `pool`'s device; connects at each receive(). At most `max_kept_imports`
/// shares (0: 64) and `max_kept_bytes` bytes (0: no byte bound) stay
/// imported. Move-only.
class UpdateReceiver {
 public:
  UpdateReceiver(Pool& pool, const std::string& path, uint64_t timeout_ms = 0, uint64_t max_kept_imports = 0,
                 uint64_t max_kept_bytes = 0) {
    vmmw_update_receiver_t* raw = nullptr;
    detail::call([&](vmmw_error_t** e) {
      return vmmw_update_receiver_new(pool.get(), path.c_str(), timeout_ms, max_kept_imports, max_kept_bytes, &raw,
                                      e);
    });
    h_.reset(raw);
  }

  /// Receive one update into `loader`'s destinations in `pool`, as
  /// receive_ipc(), reusing the imports kept from earlier direct updates
  /// where the sender says the memory is the same.
  vmmw_update_result_t receive(Loader& loader, Pool& pool, const UpdateOptions& o) {
    vmmw_update_options_t c = detail::update_options(o);
    vmmw_update_result_t r{};
    vmmw_loader_t* l = loader.get();
    if (l == nullptr) detail::empty_handle("vmmw::Loader");
    detail::call([&](vmmw_error_t** e) { return vmmw_update_receiver_receive(get_mut(), l, pool.get(), &c, &r, e); });
    return r;
  }

  /// What the last successful receive() did (zero before the first) and
  /// what is kept imported now.
  [[nodiscard]] vmmw_receive_stats_t stats() const {
    vmmw_receive_stats_t s{};
    const vmmw_update_receiver_t* r = detail::live(h_, "vmmw::UpdateReceiver");
    detail::call([&](vmmw_error_t** e) { return vmmw_update_receiver_stats(r, &s, e); });
    return s;
  }

  /// Drop every kept import; the next receive() attaches again.
  void drop_imports() {
    detail::call([&](vmmw_error_t** e) { return vmmw_update_receiver_drop_imports(get_mut(), e); });
  }

 private:
  vmmw_update_receiver_t* get_mut() { return detail::live(h_, "vmmw::UpdateReceiver"); }
  detail::Owned<vmmw_update_receiver_t, vmmw_update_receiver_free> h_;
};

/// An NCCL communicator for broadcast updates (vmmw_nccl_comm_t). Move-only.
class NcclComm {
 public:
  /// A new unique id (128 bytes) for the other ranks' constructors.
  [[nodiscard]] static std::vector<uint8_t> unique_id() {
    std::vector<uint8_t> id(128);
    detail::call([&](vmmw_error_t** e) { return vmmw_nccl_unique_id(id.data(), e); });
    return id;
  }

  /// Join the communicator of `world` ranks named by `id` as `rank`, on `pool`'s device.
  NcclComm(Pool& pool, const std::vector<uint8_t>& id, uint32_t world, uint32_t rank) {
    if (id.size() != 128) throw std::invalid_argument("vmmw::NcclComm: the unique id is 128 bytes");
    vmmw_nccl_comm_t* raw = nullptr;
    detail::call([&](vmmw_error_t** e) { return vmmw_nccl_comm_new(pool.get(), id.data(), world, rank, &raw, e); });
    h_.reset(raw);
  }

  /// Use an ncclComm_t the caller has (left alone when this object goes).
  [[nodiscard]] static NcclComm from_raw(void* comm) {
    vmmw_nccl_comm_t* raw = nullptr;
    detail::call([&](vmmw_error_t** e) { return vmmw_nccl_comm_from_raw(comm, &raw, e); });
    return NcclComm(raw);
  }

  /// Broadcast `source` from this rank (the root) to every rank; applies nothing here.
  void broadcast_send(Pool& pool, UpdateSource& source, uint64_t slot_bytes = 0, uint64_t timeout_ms = 0) {
    vmmw_update_source_t* s = source.get();
    if (s == nullptr) detail::empty_handle("vmmw::UpdateSource");
    detail::call([&](vmmw_error_t** e) {
      return vmmw_update_broadcast_send(get_mut(), pool.get(), s, slot_bytes, timeout_ms, e);
    });
  }

  /// Receive one update broadcast from `root` into `loader`'s destinations in `pool`.
  vmmw_update_result_t broadcast_receive(Loader& loader, Pool& pool, uint32_t root, const UpdateOptions& o,
                                         uint64_t slot_bytes = 0, uint64_t timeout_ms = 0) {
    vmmw_update_options_t c = detail::update_options(o);
    vmmw_update_result_t r{};
    vmmw_loader_t* l = loader.get();
    if (l == nullptr) detail::empty_handle("vmmw::Loader");
    detail::call([&](vmmw_error_t** e) {
      return vmmw_update_broadcast_receive(get_mut(), l, pool.get(), root, slot_bytes, timeout_ms, &c, &r, e);
    });
    return r;
  }

  /// Broadcast `source` from this rank (the root) and apply it here too, into
  /// `loader`'s destinations in `pool`.
  vmmw_update_result_t broadcast_root(Loader& loader, Pool& pool, UpdateSource& source, const UpdateOptions& o,
                                      uint64_t slot_bytes = 0, uint64_t timeout_ms = 0) {
    vmmw_update_options_t c = detail::update_options(o);
    vmmw_update_result_t r{};
    vmmw_loader_t* l = loader.get();
    if (l == nullptr) detail::empty_handle("vmmw::Loader");
    vmmw_update_source_t* s = source.get();
    if (s == nullptr) detail::empty_handle("vmmw::UpdateSource");
    detail::call([&](vmmw_error_t** e) {
      return vmmw_update_broadcast_root(get_mut(), l, pool.get(), s, slot_bytes, timeout_ms, &c, &r, e);
    });
    return r;
  }

  /// Load the checkpoint `loader` opened into its destinations in `pool`
  /// (allocated first, as for a load): the `readers` stream its files into
  /// the broadcast ring and every rank applies each bucket through its
  /// rules. Every rank passes the same readers and `slot_bytes`. `stage`:
  /// buckets land in scratch first, so a failed load leaves the
  /// destinations untouched.
  vmmw_broadcast_load_result_t broadcast_load(Loader& loader, Pool& pool, const std::vector<uint32_t>& readers,
                                              uint64_t slot_bytes = 0, uint64_t timeout_ms = 0, bool stage = false) {
    vmmw_broadcast_load_result_t r{};
    vmmw_loader_t* l = loader.get();
    if (l == nullptr) detail::empty_handle("vmmw::Loader");
    detail::call([&](vmmw_error_t** e) {
      return vmmw_load_broadcast(get_mut(), l, pool.get(), readers.data(), readers.size(), slot_bytes, timeout_ms,
                                 stage ? 1u : 0u, &r, e);
    });
    return r;
  }

  /// Register device memory with the communicator (ncclCommRegister).
  [[nodiscard]] void* register_buffer(uint64_t ptr, uint64_t len) {
    void* h = nullptr;
    detail::call([&](vmmw_error_t** e) { return vmmw_nccl_register(get_mut(), ptr, len, &h, e); });
    return h;
  }

  /// Drop a registration made by register_buffer.
  void deregister_buffer(void* handle) {
    detail::call([&](vmmw_error_t** e) { return vmmw_nccl_deregister(get_mut(), handle, e); });
  }

 private:
  explicit NcclComm(vmmw_nccl_comm_t* adopt) noexcept : h_(adopt) {}
  vmmw_nccl_comm_t* get_mut() { return detail::live(h_, "vmmw::NcclComm"); }
  detail::Owned<vmmw_nccl_comm_t, vmmw_nccl_comm_free> h_;
};

/// What the owner's sleep of a shared tag does to attached importers.
enum class SharePolicy : int32_t {
  Refuse = VMMW_SHARE_SLEEP_REFUSE,  ///< the sleep throws VMMW_INVALID_STATE while importers are attached
  Revoke = VMMW_SHARE_SLEEP_REVOKE,  ///< importers' next call throws VMMW_SHARE_REVOKED
};

/// How a share is served (vmmw_share_options_t); the defaults refuse sleep
/// while importers are attached, share read-only, and accept only this user.
struct ShareOptions {
  SharePolicy policy = SharePolicy::Refuse;
  bool allow_write = false;
  bool use_allowed_uid = false;  ///< accept `allowed_uid` instead of this process's user
  uint32_t allowed_uid = 0;
  bool use_allowed_gid = false;  ///< accept members of group `allowed_gid` too
  uint32_t allowed_gid = 0;
  uint32_t max_connections = 0;       ///< connections served at once; 0: 256
  uint32_t handshake_timeout_ms = 0;  ///< one deadline per handshake; 0: 10000
};

/// The owner's side of a share (vmmw_share_server_t): serves a loader's
/// destinations, which lie in one tag of a pool, on a Unix socket path.
/// Destroying it stops serving; attached importers keep their mappings.
class ShareServer {
 public:
  ShareServer(Pool& pool, Tag tag, const Loader& loader, const std::string& path,
              const ShareOptions& o = ShareOptions()) {
    vmmw_share_options_t c{};
    c.size = sizeof c;
    c.sleep_policy = static_cast<vmmw_share_sleep_policy_t>(o.policy);
    c.allow_write = o.allow_write ? 1u : 0u;
    c.use_allowed_uid = o.use_allowed_uid ? 1u : 0u;
    c.allowed_uid = o.allowed_uid;
    c.use_allowed_gid = o.use_allowed_gid ? 1u : 0u;
    c.allowed_gid = o.allowed_gid;
    c.max_connections = o.max_connections;
    c.handshake_timeout_ms = o.handshake_timeout_ms;
    vmmw_share_server_t* raw = nullptr;
    detail::call([&](vmmw_error_t** e) {
      return vmmw_share_serve(pool.get(), tag, loader.get(), path.c_str(), &c, &raw, e);
    });
    h_.reset(raw);
  }

  /// Importers attached now.
  [[nodiscard]] uint64_t attached() const {
    uint64_t n = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_share_server_attached(get_checked(), &n, e); });
    return n;
  }

  /// Announce weights written in place; returns the new version.
  uint64_t publish() {
    uint64_t v = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_share_server_publish(get_mut(), &v, e); });
    return v;
  }

  const vmmw_share_server_t* get() const noexcept { return h_.get(); }

 private:
  const vmmw_share_server_t* get_checked() const { return detail::live(h_, "vmmw::ShareServer"); }
  vmmw_share_server_t* get_mut() { return detail::live(h_, "vmmw::ShareServer"); }
  detail::Owned<vmmw_share_server_t, vmmw_share_server_free> h_;
};

/// The importer's side (vmmw_share_t): the owner's tensors mapped at this
/// process's addresses, read-only unless asked and allowed. Destroying it
/// detaches (errors ignored); detach() reports them.
class Share {
 public:
  Share(const Device& device, const std::string& path, bool read_write = false) {
    vmmw_share_t* raw = nullptr;
    detail::call([&](vmmw_error_t** e) {
      return vmmw_share_attach(device.get(), path.c_str(), read_write ? 1u : 0u, &raw, e);
    });
    h_.reset(raw);
  }

  /// Tensor names, in the owner's order.
  [[nodiscard]] std::vector<std::string> names() const {
    const vmmw_share_t* s = get_checked();
    size_t n = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_share_count(s, &n, e); });
    std::vector<std::string> out;
    out.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      out.push_back(detail::read_string([s, i](char* b, size_t c, size_t* nd, vmmw_error_t** e) {
        return vmmw_share_tensor_name(s, i, b, c, nd, e);
      }));
    }
    return out;
  }

  /// The tensor `name` at this process's address; throws VMMW_SHARE_REVOKED once revoked.
  [[nodiscard]] vmmw_destination_t tensor(const std::string& name) const {
    vmmw_destination_t d{};
    detail::call([&](vmmw_error_t** e) { return vmmw_share_tensor(get_checked(), name.c_str(), &d, e); });
    return d;
  }

  /// The weights version: the owner's tag version (changes when the owner updates or publishes).
  [[nodiscard]] uint64_t version() const {
    uint64_t v = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_share_version(get_checked(), &v, e); });
    return v;
  }

  /// Copy `len` bytes of the share at this process's address `src` into `dst`.
  void read(uint64_t src, void* dst, size_t len) const {
    detail::call([&](vmmw_error_t** e) { return vmmw_share_read(get_checked(), src, dst, len, e); });
  }

  /// False once the owner stopped serving or exited (the memory stays valid).
  [[nodiscard]] bool owner_connected() const {
    uint32_t c = 0;
    detail::call([&](vmmw_error_t** e) { return vmmw_share_owner_connected(get_checked(), &c, e); });
    return c != 0;
  }

  /// Unmap and release now, reporting errors; the object is empty afterwards.
  void detach() {
    vmmw_share_t* raw = h_.release();
    if (raw == nullptr) return;
    detail::call([&](vmmw_error_t** e) { return vmmw_share_detach(raw, e); });
  }

  const vmmw_share_t* get() const noexcept { return h_.get(); }

 private:
  const vmmw_share_t* get_checked() const { return detail::live(h_, "vmmw::Share"); }
  detail::Owned<vmmw_share_t, vmmw_share_free> h_;
};

/// How a load over several devices divides the work.
enum class MultiMode : vmmw_multi_mode_t {
  Replicas = VMMW_MULTI_REPLICAS,  ///< all of it on every device; host memory read once, shares exchanged peer to peer
  Ranks = VMMW_MULTI_RANKS,        ///< each device loads its own loader's plan (tensor-parallel ranks)
};

/// One load into several devices: `loaders[i]`'s destinations on `pools[i]`
/// (vmmw_loader_load_devices). Cancel with `loaders[0]->cancel()`.
inline vmmw_multi_result_t load_devices(const std::vector<Loader*>& loaders, const std::vector<Pool*>& pools,
                                        MultiMode mode) {
  if (loaders.size() != pools.size()) {
    throw std::invalid_argument("vmmw::load_devices: one pool per loader");
  }
  std::vector<vmmw_loader_t*> ls;
  std::vector<vmmw_pool_t*> ps;
  for (size_t i = 0; i < loaders.size(); ++i) {
    ls.push_back(loaders[i] != nullptr ? loaders[i]->get() : nullptr);
    ps.push_back(pools[i] != nullptr ? pools[i]->get() : nullptr);
  }
  vmmw_multi_result_t r{};
  detail::call([&](vmmw_error_t** e) {
    return vmmw_loader_load_devices(ls.data(), ps.data(), ls.size(), static_cast<vmmw_multi_mode_t>(mode), &r, e);
  });
  return r;
}

/// Replicas that slept without backups (Policy::Discard) woken by one
/// checkpoint fan-out (vmmw_replicas_wake_by_reload): their tags are woken,
/// then the checkpoint is loaded once and exchanged over peer copies.
inline vmmw_multi_result_t wake_replicas_by_reload(const std::vector<Loader*>& loaders,
                                                   const std::vector<Pool*>& pools) {
  if (loaders.size() != pools.size()) {
    throw std::invalid_argument("vmmw::wake_replicas_by_reload: one pool per loader");
  }
  std::vector<vmmw_loader_t*> ls;
  std::vector<vmmw_pool_t*> ps;
  for (size_t i = 0; i < loaders.size(); ++i) {
    ls.push_back(loaders[i] != nullptr ? loaders[i]->get() : nullptr);
    ps.push_back(pools[i] != nullptr ? pools[i]->get() : nullptr);
  }
  vmmw_multi_result_t r{};
  detail::call([&](vmmw_error_t** e) { return vmmw_replicas_wake_by_reload(ls.data(), ps.data(), ls.size(), &r, e); });
  return r;
}

/// The former name of wake_replicas_by_reload, kept through 0.x.
[[deprecated("renamed vmmw::wake_replicas_by_reload")]] inline vmmw_multi_result_t wake_replicas(
    const std::vector<Loader*>& loaders, const std::vector<Pool*>& pools) {
  return wake_replicas_by_reload(loaders, pools);
}

/// One replica of a replica group: `tag` in `pool` (one pool per device).
struct Replica {
  Pool* pool;
  Tag tag;
};

namespace detail {
inline void replica_args(const std::vector<Replica>& rs, std::vector<vmmw_pool_t*>& ps, std::vector<uint32_t>& ts) {
  for (const auto& r : rs) {
    ps.push_back(r.pool != nullptr ? r.pool->get() : nullptr);
    ts.push_back(r.tag);
  }
}
}  // namespace detail

/// How replicas keep their one host backup (vmmw_replica_sleep_options_t).
struct ReplicaSleepOptions {
  /// The holder's policy: Policy::Offload (raw bytes) or
  /// Policy::OffloadCompressed (codec frames, decoded on every device at
  /// wake); any other throws (VMMW_INVALID_ARGUMENT) and nothing sleeps.
  Policy holder_policy = Policy::Offload;
};

/// Put replicas to sleep on one host backup taken from `replicas[0]`; the
/// others release their memory without a copy (vmmw_replicas_sleep_with).
/// The caller asserts they hold the same bytes.
inline vmmw_replica_sleep_result_t sleep_replicas(const std::vector<Replica>& replicas,
                                                  const ReplicaSleepOptions& o = ReplicaSleepOptions()) {
  std::vector<vmmw_pool_t*> ps;
  std::vector<uint32_t> ts;
  detail::replica_args(replicas, ps, ts);
  vmmw_replica_sleep_options_t c{};
  c.size = sizeof c;
  c.holder_policy = static_cast<vmmw_policy_t>(o.holder_policy);
  vmmw_replica_sleep_result_t r{};
  detail::call([&](vmmw_error_t** e) {
    return vmmw_replicas_sleep_with(ps.data(), ts.data(), ps.size(), &c, &r, e);
  });
  return r;
}

/// How a wake of replicas moves the bytes (vmmw_replica_wake_options_t).
struct ReplicaWakeOptions {
  bool peer_copies = true;        ///< exchange parts over peer copies (false: every device copies the whole backup)
  uint64_t copy_piece_bytes = 0;  ///< one copy on one stream; 0 = 64 MiB
};

/// Wake replicas slept by sleep_replicas on every device from the one
/// backup, host memory read once (vmmw_replicas_wake_from_backup); a
/// compressed backup is decoded on every device, each a share of its frames. On an
/// error every replica stays asleep with the backup intact; waking again can
/// succeed.
inline vmmw_replica_wake_result_t wake_replicas_from_backup(const std::vector<Replica>& replicas,
                                                            const ReplicaWakeOptions& o = ReplicaWakeOptions()) {
  std::vector<vmmw_pool_t*> ps;
  std::vector<uint32_t> ts;
  detail::replica_args(replicas, ps, ts);
  vmmw_replica_wake_options_t c{};
  c.size = sizeof c;
  c.copy_piece_bytes = o.copy_piece_bytes;
  c.no_peer_copies = o.peer_copies ? 0 : 1;
  vmmw_replica_wake_result_t r{};
  detail::call([&](vmmw_error_t** e) {
    return vmmw_replicas_wake_from_backup(ps.data(), ts.data(), ps.size(), &c, &r, e);
  });
  return r;
}

/// The former name of wake_replicas_from_backup, kept through 0.x.
[[deprecated("renamed vmmw::wake_replicas_from_backup")]] inline vmmw_replica_wake_result_t wake_replicas(
    const std::vector<Replica>& replicas, const ReplicaWakeOptions& o = ReplicaWakeOptions()) {
  return wake_replicas_from_backup(replicas, o);
}

// ---------------------------------------------------------------------------
// The control channel (docs/PRELOAD.md): a process serving a control socket
// (a program run under the interposer with `vmmw exec`, or one that serves
// its default pools with ControlServer) asked for its status, to sleep, or
// to wake. A refusal throws vmmw::Error with the status the process named.
namespace control {

/// What a sleep or wake did (vmmw_control_result_t).
using Result = vmmw_control_result_t;

/// The status of the process serving `socket`, as its JSON
/// (vmmw_control_status): state, each tag of each device, each device's
/// memory, the host backup, the last sleep or wake.
[[nodiscard]] inline std::string status(const std::string& socket) {
  return detail::read_string([&](char* b, size_t c, size_t* n, vmmw_error_t** e) {
    return vmmw_control_status(socket.c_str(), b, c, n, e);
  });
}

namespace detail_control {
inline std::vector<const char*> names(const std::vector<std::string>& tags) {
  std::vector<const char*> v;
  v.reserve(tags.size());
  for (const auto& t : tags) v.push_back(t.c_str());
  return v;
}
}  // namespace detail_control

/// Synchronize every device of the process serving `socket` and sleep its
/// tags (`tags`, or every tag when empty) with `policy` (Offload,
/// OffloadCompressed or Discard) (vmmw_control_sleep).
inline Result sleep(const std::string& socket, Policy policy = Policy::Offload,
                    const std::vector<std::string>& tags = {}) {
  auto names = detail_control::names(tags);
  Result r{};
  vmmw::detail::call([&](vmmw_error_t** e) {
    return vmmw_control_sleep(socket.c_str(), static_cast<vmmw_policy_t>(policy), names.data(),
                              names.size(), &r, e);
  });
  return r;
}

/// Wake the tags asleep (`tags`, or every asleep tag when empty), waiting up
/// to `wait_memory_ms` for memory being released (0: refuse at once)
/// (vmmw_control_wake). A failed wake leaves every backup intact.
inline Result wake(const std::string& socket, uint64_t wait_memory_ms = 0,
                   const std::vector<std::string>& tags = {}) {
  auto names = detail_control::names(tags);
  Result r{};
  vmmw::detail::call([&](vmmw_error_t** e) {
    return vmmw_control_wake(socket.c_str(), wait_memory_ms, names.data(), names.size(), &r, e);
  });
  return r;
}

/// This process's default pools served on a control socket at `path`
/// (vmmw_control_serve), until destroyed.
class Server {
 public:
  explicit Server(const std::string& path) {
    vmmw_control_server_t* raw = nullptr;
    vmmw::detail::call([&](vmmw_error_t** e) { return vmmw_control_serve(path.c_str(), &raw, e); });
    h_.reset(raw);
  }

  /// Adopt a handle from vmmw_control_serve (this object frees it).
  explicit Server(vmmw_control_server_t* adopt) noexcept : h_(adopt) {}

  [[nodiscard]] const vmmw_control_server_t* get() const noexcept { return h_.get(); }

  /// Give up the handle (the caller frees it with vmmw_control_server_free).
  [[nodiscard]] vmmw_control_server_t* release() noexcept { return h_.release(); }

 private:
  vmmw::detail::Owned<vmmw_control_server_t, vmmw_control_server_free> h_;
};

}  // namespace control

}  // namespace vmmw

#endif  // VMMWEIGHTS_HPP
