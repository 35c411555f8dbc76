// vmmweights from C++ through find_package: the whole life of a model's
// weights in one program.
//
//   1. write a safetensors checkpoint (bf16, pseudo-random; --mib sets the size)
//   2. a pool (CUDA when present, else the host simulation) and a loader that
//      allocates every destination from it under the tag "weights"
//   3. load in place; checksum every destination read back against the file
//   4. sleep: weights offloaded to pinned host memory, a "kv" tag discarded;
//      the device memory is released, the pointers stay
//   5. wake; verify the checksums again at the same addresses
//   6. sleep with the reload policy (re-read from the
//      checkpoint at wake), wake, verify again
//
// Usage: example_shared [--mib N] [--tensors N] [--require-cuda] [--json FILE]
// Exit status 0 only when every checksum matches.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <vmmweights.hpp>

namespace {

struct Options {
  uint64_t mib = 16;
  int tensors = 8;
  bool require_cuda = false;
  std::string json;
};

double now_s() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

uint64_t fnv1a(const unsigned char* p, size_t n, uint64_t h = 1469598103934665603ull) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

struct Tensor {
  std::string name;
  uint64_t rows, cols;  // bf16
  uint64_t checksum;
  uint64_t bytes() const { return rows * cols * 2; }
};

// Writes the checkpoint; returns the tensors with the checksums of their bytes.
std::vector<Tensor> write_checkpoint(const std::string& path, const Options& o) {
  std::vector<Tensor> ts;
  const uint64_t cols = 4096;
  const uint64_t total_rows = o.mib * (1ull << 20) / (cols * 2);
  for (int i = 0; i < o.tensors; ++i) {
    uint64_t rows = total_rows / o.tensors + (i == 0 ? total_rows % o.tensors : 0);
    if (rows == 0) rows = 1;
    ts.push_back({"model.layers." + std::to_string(i) + ".weight", rows, cols, 0});
  }
  std::string header = "{";
  uint64_t off = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    header += (i ? "," : "") + std::string("\"") + ts[i].name + "\":{\"dtype\":\"BF16\",\"shape\":[" +
              std::to_string(ts[i].rows) + "," + std::to_string(ts[i].cols) + "],\"data_offsets\":[" +
              std::to_string(off) + "," + std::to_string(off + ts[i].bytes()) + "]}";
    off += ts[i].bytes();
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  std::ofstream f(path, std::ios::binary);
  unsigned char n8[8];
  for (int i = 0; i < 8; ++i) n8[i] = static_cast<unsigned char>((header.size() >> (8 * i)) & 0xff);
  f.write(reinterpret_cast<const char*>(n8), 8);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  uint64_t x = 0x9e3779b97f4a7c15ull;
  std::vector<unsigned char> buf;
  for (auto& t : ts) {
    buf.resize(t.bytes());
    for (size_t i = 0; i + 8 <= buf.size(); i += 8) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::memcpy(&buf[i], &x, 8);
    }
    t.checksum = fnv1a(buf.data(), buf.size());
    f.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
  }
  if (!f) throw std::runtime_error("cannot write " + path);
  return ts;
}

// Reads every destination back and compares its checksum with the file's.
int verify(const vmmw::Pool& pool, const vmmw::Loader& loader, const std::vector<Tensor>& ts,
           const char* when) {
  int bad = 0;
  std::vector<unsigned char> buf;
  for (const auto& t : ts) {
    const auto d = loader.destination(t.name);
    buf.resize(d.bytes);
    pool.read(d.ptr, buf.data(), buf.size());
    if (fnv1a(buf.data(), buf.size()) != t.checksum || d.bytes != t.bytes()) {
      std::fprintf(stderr, "  %s: checksum of %s differs\n", when, t.name.c_str());
      ++bad;
    }
  }
  std::printf("  %-26s %zu tensors, %s\n", when, ts.size(), bad ? "MISMATCH" : "checksums match");
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc) o.mib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--tensors" && i + 1 < argc) o.tensors = std::atoi(argv[++i]);
    else if (a == "--require-cuda") o.require_cuda = true;
    else if (a == "--json" && i + 1 < argc) o.json = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--mib N] [--tensors N] [--require-cuda] [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  if (o.mib == 0 || o.tensors <= 0) return 2;
  char dir[] = "/tmp/vmmw-example-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 2;
  const std::string path = std::string(dir) + "/model.safetensors";
  int bad = 0;
  try {
    vmmw::Device dev(vmmw::Backend::Auto);
    std::printf("vmmweights %s (header %s) on %s\n", vmmw::version().c_str(), VMMW_VERSION_STRING,
                dev.describe().c_str());
    if (o.require_cuda && dev.backend() != vmmw::Backend::Cuda) {
      std::fprintf(stderr, "--require-cuda: no CUDA backend (%s)\n", dev.choice_reason().c_str());
      return 1;
    }
    double t = now_s();
    const auto tensors = write_checkpoint(path, o);
    std::printf("checkpoint: %llu MiB in %zu bf16 tensors, written in %.2f s\n",
                static_cast<unsigned long long>(o.mib), tensors.size(), now_s() - t);

    vmmw::PoolOptions po;
    po.device_handle = &dev;
    vmmw::Pool pool(po);
    const vmmw::Tag weights = vmmw::tag_id("weights");
    const vmmw::Tag kv = vmmw::tag_id("kv");
    vmmw::Loader loader(path);
    loader.allocate(pool, weights);
    const auto plan = loader.plan();
    const auto loaded = loader.load(pool);
    std::printf("load:    %.3f s, %.2f GB/s (%llu bytes, %u threads)\n", loaded.seconds, loaded.gbps,
                static_cast<unsigned long long>(loaded.bytes), loaded.threads);
    bad += verify(pool, loader, tensors, "after load");
    vmmw::Block kv_cache = pool.alloc(8u << 20, kv);  // given back when it goes out of scope
    pool.snapshot("loaded");

    pool.reserve_backup(plan.dst_bytes);
    t = now_s();
    pool.sleep({{weights, vmmw::Policy::Offload}, {kv, vmmw::Policy::Discard}});
    const double sleep_s = now_s() - t;
    const auto asleep = pool.report();
    pool.snapshot("asleep");
    std::printf("sleep:   %.3f s (offload weights, discard kv); tracked %llu bytes, host backup %llu bytes\n",
                sleep_s, static_cast<unsigned long long>(asleep.tracked_bytes),
                static_cast<unsigned long long>(asleep.host_backup_bytes));
    if (asleep.tracked_bytes != 0) {
      std::fprintf(stderr, "  sleep left %llu bytes physically backed\n",
                   static_cast<unsigned long long>(asleep.tracked_bytes));
      ++bad;
    }
    t = now_s();
    pool.wake();
    const double wake_s = now_s() - t;
    std::printf("wake:    %.3f s\n", wake_s);
    bad += verify(pool, loader, tensors, "after offload + wake");

    t = now_s();
    pool.sleep({{weights, vmmw::Policy::Reload}});
    const double reload_sleep_s = now_s() - t;
    t = now_s();
    pool.wake({weights});
    const double reload_wake_s = now_s() - t;
    std::printf("reload:  sleep %.3f s, wake %.3f s (re-read from the checkpoint)\n", reload_sleep_s,
                reload_wake_s);
    bad += verify(pool, loader, tensors, "after reload + wake");
    pool.snapshot("awake");
    kv_cache.free();

    if (!o.json.empty()) {
      std::ofstream j(o.json);
      j << "{\n  \"backend\": \"" << (dev.backend() == vmmw::Backend::Cuda ? "cuda" : "host") << "\",\n"
        << "  \"bytes\": " << loaded.bytes << ",\n  \"load_s\": " << loaded.seconds
        << ",\n  \"load_gbps\": " << loaded.gbps << ",\n  \"sleep_offload_s\": " << sleep_s
        << ",\n  \"wake_offload_s\": " << wake_s << ",\n  \"sleep_reload_s\": " << reload_sleep_s
        << ",\n  \"wake_reload_s\": " << reload_wake_s << ",\n  \"checksum_mismatches\": " << bad
        << ",\n  \"timeline\": " << pool.timeline_json() << "\n}\n";
    }
  } catch (const vmmw::Error& e) {
    std::fprintf(stderr, "vmmweights error: %s\n", e.what());
    bad = -1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    bad = -1;
  }
  std::remove(path.c_str());
  rmdir(dir);
  std::printf("%s\n", bad == 0 ? "OK: every checksum matches" : "FAILED");
  return bad == 0 ? 0 : 1;
}
