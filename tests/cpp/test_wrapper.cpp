// Tests of the C++17 wrapper on the host backend; linked with tu_a.cpp (a
// second translation unit including the same header). Built with
// -Wall -Wextra -Werror and ASan/UBSan by scripts/test.d/40-cpp.sh.
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <thread>
#include <vector>

#include "vmmweights.hpp"
#include "vmmweights_testing.hpp"
#include "safetensors_writer.h"
#include "../../examples/gguf-runtime/tiny_gguf.h"

#include <unistd.h>

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
    CHECK(e.driver_code() == 0);  // only a VMMW_DRIVER_ERROR carries one
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

  const auto before = vmmw::testing::host_counts(dev);
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
    CHECK(vmmw::testing::host_counts(dev).reservations == before.reservations + 1);
  }
  // RAII released everything.
  const auto after = vmmw::testing::host_counts(dev);
  CHECK(after.reservations == before.reservations && after.handles == before.handles);

  vmmw::testing::host_set_memory_limit(dev, g);
  CHECK(status_of([&] { vmmw::Segment big(dev, 4 * g); }) == VMMW_OUT_OF_MEMORY);
  CHECK(vmmw::testing::host_counts(dev).handles == before.handles);
}

static void test_pool_tags_sleep() {
  vmmw::PoolOptions o;
  o.backend = vmmw::Backend::Host;
  vmmw::Pool pool(o);
  const vmmw::Tag w = vmmw::tag_id("cpp-weights");
  const vmmw::Tag kv = vmmw::tag_id("cpp-kv");
  CHECK(vmmw::tag_name(w) == "cpp-weights");
  vmmw::Block pw;
  {
    vmmw::TagScope scope(w);
    CHECK(vmmw::current_tag() == w);
    pw = pool.alloc(6u << 20);
  }
  CHECK(vmmw::current_tag() == VMMW_TAG_DEFAULT);
  vmmw::Block pkv = pool.alloc(1u << 20, kv);
  CHECK(pw.size() == (6u << 20) && pw.ptr() != 0);
  CHECK(pool.report(w).live_blocks == 1 && pool.report(kv).live_blocks == 1);
  CHECK(pool.report_json().find("cpp-weights") != std::string::npos);

  std::vector<unsigned char> in(8192), out(8192);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 7 + 5);
  pool.write(pw.ptr() + 1000, in.data(), in.size());
  pool.reserve_backup(8u << 20);
  pool.sleep({{w, vmmw::Policy::Offload}, {kv, vmmw::Policy::Discard}});
  CHECK(pool.report().asleep == 1 && pool.report(w).tracked_bytes == 0);
  CHECK(pool.last_cycle_json().find("cpp-kv") != std::string::npos);
  CHECK(status_of([&] { pool.read(pw.ptr() + 1000, out.data(), 16); }) == VMMW_INVALID_STATE);
  CHECK(status_of([&] { (void)pool.alloc(4096, w); }) == VMMW_INVALID_STATE);
  CHECK(pool.read_backup(pw.ptr() + 1000, out.data(), out.size()) == w);
  CHECK(in == out);
  CHECK(status_of([&] { (void)pool.read_backup(pkv.ptr(), out.data(), 16); }) == VMMW_INVALID_STATE);
  auto [view, view_tag] = pool.backup_view(pw.ptr() + 1000, in.size());
  CHECK(view_tag == w && std::memcmp(view, in.data(), in.size()) == 0);
  CHECK(status_of([&] { (void)pool.backup_view(pkv.ptr(), 16); }) == VMMW_INVALID_STATE);
  std::fill(out.begin(), out.end(), 0);
  pool.wake();
  pool.read(pw.ptr() + 1000, out.data(), out.size());
  CHECK(in == out);

  // Blocks give themselves back: at scope end, at reset(), or by free().
  const uint64_t raw_w = pw.ptr();
  pw.free();
  CHECK(!pw && pool.report(w).live_blocks == 0);
  CHECK(status_of([&] { pool.dealloc(raw_w); }) == VMMW_UNKNOWN_POINTER);
  { vmmw::Block moved = std::move(pkv); CHECK(moved && !pkv); }
  CHECK(pool.report(kv).live_blocks == 0);
  // release() hands the address over; the adopting constructor takes it back.
  vmmw::Block r = pool.alloc(4096, kv);
  const uint64_t raw = r.release();
  CHECK(!r && pool.report(kv).live_blocks == 1);
  { vmmw::Block again(pool, raw, 4096); }
  CHECK(pool.report(kv).live_blocks == 0);
  // A Block keeps its pool's C handle alive past the Pool object.
  vmmw::Block outlives;
  {
    vmmw::PoolOptions po;
    po.backend = vmmw::Backend::Host;
    vmmw::Pool short_lived(po);
    outlives = short_lived.alloc(4096);
    CHECK(status_of([&] { (void)short_lived.release(); }) == VMMW_INVALID_STATE);
  }
  outlives.free();

  // Sleep options as a C++ struct; process default tag; tag modes.
  {
    vmmw::Pool lim(o);  // a fresh pool: nothing pinned yet
    vmmw::SleepOptions so;
    so.host_memory_limit = 1u << 20;
    lim.set_sleep_options(so);
    vmmw::Block big = lim.alloc(4u << 20, w);
    CHECK(status_of([&] { lim.sleep({{w, vmmw::Policy::Offload}}); }) == VMMW_HOST_OUT_OF_MEMORY);
    lim.set_sleep_options(vmmw::SleepOptions());
    lim.sleep({{w, vmmw::Policy::Offload}});
    lim.wake();
  }
  vmmw::set_process_default_tag(kv);
  CHECK(vmmw::current_tag() == kv);
  vmmw::set_process_default_tag(VMMW_TAG_DEFAULT);
  pool.set_tag_arena(kv, 64u << 20);
  pool.set_tag_segments(kv);
  try {
    (void)pool.alloc(uint64_t(1) << 62);
    CHECK(false);
  } catch (const vmmw::Error& e) {
    CHECK(e.code() == vmmw::Status::OutOfMemory || e.code() == vmmw::Status::InvalidArgument);
  }
  CHECK(pool.trim() > 0);

  vmmw::Pool g1 = vmmw::Pool::global(0);
  vmmw::Pool g2 = vmmw::Pool::global(0);
  CHECK(g1.get() == g2.get());
  // release() and the adopting constructor round-trip a C handle.
  vmmw_pool_t* c_pool = g1.release();
  CHECK(g1.get() == nullptr && c_pool == g2.get());
  vmmw::Pool adopted(c_pool);
  CHECK(adopted.get() == g2.get());
}

static void test_loader() {
  char dir[] = "/tmp/vmmw-cpp-loader-XXXXXX";
  CHECK(mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/model.safetensors";
  std::vector<float> a(64 * 32), b(32);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * 0.25f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = -static_cast<float>(i);
  st_tensor ts[2] = {{"layer.weight", "F32", {64, 32, 0, 0}, 2, a.data(), a.size() * 4},
                     {"layer.bias", "F32", {32, 0, 0, 0}, 1, b.data(), b.size() * 4}};
  CHECK(st_write(path.c_str(), ts, 2) == 0);

  vmmw::PoolOptions o;
  o.backend = vmmw::Backend::Host;
  vmmw::Pool pool(o);
  const vmmw::Tag w = vmmw::tag_id("cpp-loaded");
  vmmw::Loader loader(path);
  loader.allocate(pool, w);
  CHECK(loader.destination_names() == (std::vector<std::string>{"layer.bias", "layer.weight"}));
  CHECK(loader.plan().src_bytes == (a.size() + b.size()) * 4);
  vmmw::LoadOptions lo;
  lo.strategy = vmmw::CopyStrategy::Staged;
  loader.set_options(lo);

  // An exception thrown by the progress callback cancels and comes back out.
  bool threw = false;
  try {
    loader.load(pool, [](uint64_t, uint64_t) -> bool { throw std::runtime_error("stop"); });
  } catch (const std::runtime_error& e) {
    threw = std::string(e.what()) == "stop";
  }
  CHECK(threw);

  uint64_t last = 0;
  const auto r = loader.load(pool, [&](uint64_t done, uint64_t) { last = done; return false; });
  CHECK(r.bytes == (a.size() + b.size()) * 4 && last == r.bytes);
  const auto d = loader.destination("layer.weight");
  CHECK(d.dtype == "F32" && d.shape == (std::vector<uint64_t>{64, 32}) && d.bytes == a.size() * 4);
  std::vector<float> back(a.size());
  pool.read(d.ptr, back.data(), back.size() * 4);
  CHECK(back == a);
  // The default (staged) load left its pinned ring cached; releasing frees it.
  const uint64_t staging = pool.staging_bytes();
  CHECK(staging > 0);
  CHECK(pool.release_staging() == staging);
  CHECK(pool.staging_bytes() == 0 && pool.release_staging() == 0);

  pool.sleep({{w, vmmw::Policy::Reload}});
  pool.wake({w});
  std::fill(back.begin(), back.end(), 0.0f);
  pool.read(d.ptr, back.data(), back.size() * 4);
  CHECK(back == a);
  CHECK(loader.result_json().find("src_bytes") != std::string::npos);
  CHECK(status_of([&] { vmmw::Loader bad(std::string(dir) + "/missing.safetensors"); }) == VMMW_IO);

  // An update from host tensors: new bytes, version 1 -> 2; the wrong base
  // version is refused and writes nothing; a Reload wake keeps the update.
  {
    std::vector<float> a2(a.size()), b2(b.size());
    for (size_t i = 0; i < a2.size(); ++i) a2[i] = static_cast<float>(i) + 0.5f;
    for (size_t i = 0; i < b2.size(); ++i) b2[i] = 7.0f;
    vmmw::UpdateSource src;
    src.add("layer.weight", "F32", {64, 32}, reinterpret_cast<uintptr_t>(a2.data()), vmmw::Memory::Host);
    src.add("layer.bias", "F32", {32}, reinterpret_cast<uintptr_t>(b2.data()), vmmw::Memory::Host);
    CHECK(status_of([&] { src.add("layer.bias", "F32", {32}, 1, vmmw::Memory::Host); }) == VMMW_INVALID_ARGUMENT);
    CHECK(pool.tag_version(w) == 1 && !pool.tag_torn(w));
    vmmw::UpdateOptions uo;
    uo.expected_version = 3;
    CHECK(status_of([&] { vmmw::update(loader, pool, src, uo); }) == VMMW_VERSION_MISMATCH);
    pool.read(d.ptr, back.data(), back.size() * 4);
    CHECK(back == a);
    uo.expected_version = 1;
    const auto ur = vmmw::update(loader, pool, src, uo);
    CHECK(ur.version == 2 && ur.destinations == 2 && ur.bytes == (a.size() + b.size()) * 4);
    CHECK(ur.plan_seconds > 0 && ur.issue_seconds > 0 && ur.bookkeeping_seconds > 0);
    pool.sleep({{w, vmmw::Policy::Reload}});
    pool.wake({w});
    pool.read(d.ptr, back.data(), back.size() * 4);
    CHECK(back == a2);
    // Back to the checkpoint's values, staged: version 3.
    vmmw::UpdateSource again;
    again.add("layer.weight", "F32", {64, 32}, reinterpret_cast<uintptr_t>(a.data()), vmmw::Memory::Host);
    again.add("layer.bias", "F32", {32}, reinterpret_cast<uintptr_t>(b.data()), vmmw::Memory::Host);
    uo.expected_version = 2;
    uo.staged = true;
    const auto ur2 = vmmw::update(loader, pool, again, uo);
    CHECK(ur2.version == 3 && ur2.staged == 1);
    pool.read(d.ptr, back.data(), back.size() * 4);
    CHECK(back == a);
    vmmw::UpdateSource moved(std::move(again));
    CHECK(status_of([&] { vmmw::update(loader, pool, again, uo); }) == VMMW_NULL_ARGUMENT);
  }

  // Share the loaded tag; attach in this process (tests/share_processes.rs
  // covers separate ones): same bytes at other addresses, read-only.
  const std::string sock = std::string(dir) + "/weights.sock";
  {
    vmmw::ShareServer server(pool, w, loader, sock);
    vmmw::Device dev(vmmw::Backend::Host);
    CHECK(status_of([&] { vmmw::Share rw(dev, sock, true); }) == VMMW_SHARE_REFUSED);
    vmmw::Share share(dev, sock);
    CHECK(server.attached() == 1);
    CHECK(share.names() == (std::vector<std::string>{"layer.bias", "layer.weight"}));
    const auto t = share.tensor("layer.weight");
    CHECK(t.ptr != d.ptr && t.bytes == a.size() * 4 && t.ndim == 2 && t.shape[0] == 64);
    CHECK(std::memcmp(reinterpret_cast<const void*>(static_cast<uintptr_t>(t.ptr)), a.data(), t.bytes) == 0);
    std::vector<float> got(a.size());
    share.read(t.ptr, got.data(), got.size() * 4);
    CHECK(got == a);
    CHECK(status_of([&] { share.read(t.ptr + (64u << 20), got.data(), 4); }) == VMMW_INVALID_ARGUMENT);
    // The share's version is the tag's (three updates/publishes above: 3).
    CHECK(share.version() == 3 && server.publish() == 4 && share.version() == 4 && pool.tag_version(w) == 4);
    CHECK(share.owner_connected());
    CHECK(status_of([&] { pool.sleep({{w, vmmw::Policy::Offload}}); }) == VMMW_INVALID_STATE);
    share.detach();
    CHECK(status_of([&] { (void)share.version(); }) == VMMW_NULL_ARGUMENT);
  }
  CHECK(access(sock.c_str(), F_OK) != 0);

  // An update from a sender on another thread through the IPC transport (the
  // Rust and Python tests run it across processes): new bytes, version + 1.
  {
    std::vector<float> a3(a.size()), b3(b.size());
    for (size_t i = 0; i < a3.size(); ++i) a3[i] = static_cast<float>(i) * 0.25f;
    for (size_t i = 0; i < b3.size(); ++i) b3[i] = -3.0f;
    vmmw::UpdateSource src;
    src.add("layer.weight", "F32", {64, 32}, reinterpret_cast<uintptr_t>(a3.data()), vmmw::Memory::Host);
    src.add("layer.bias", "F32", {32}, reinterpret_cast<uintptr_t>(b3.data()), vmmw::Memory::Host);
    const std::string tx_path = std::string(dir) + "/tx.sock";
    vmmw::Pool sender_pool(o);
    vmmw::UpdateSender tx(sender_pool, tx_path, 2, 1024, 20000);
    const uint64_t v = pool.tag_version(w);
    vmmw_send_report_t report{};
    std::thread t([&] { report = tx.send(src); });
    vmmw::UpdateOptions uo;
    uo.expected_version = v;
    const auto r = vmmw::receive_ipc(loader, pool, tx_path, uo, 20000);
    t.join();
    CHECK(r.version == v + 1 && r.staged == 1 && report.version == v + 1 && report.buckets == 9);
    pool.read(d.ptr, back.data(), back.size() * 4);
    CHECK(back == a3);
    // Directly out of the sender's pool memory: no ring, no staging.
    std::vector<float> a4(a.size());
    for (size_t i = 0; i < a4.size(); ++i) a4[i] = static_cast<float>(i) * -0.5f;
    vmmw::Block wa = sender_pool.alloc(a4.size() * 4, vmmw::tag_id("cpp-trainer"));
    vmmw::Block wb = sender_pool.alloc(b3.size() * 4, vmmw::tag_id("cpp-trainer"));
    sender_pool.write(wa.ptr(), a4.data(), a4.size() * 4);
    sender_pool.write(wb.ptr(), b3.data(), b3.size() * 4);
    vmmw::UpdateSource direct;
    direct.add("layer.weight", "F32", {64, 32}, wa.ptr(), vmmw::Memory::Device);
    direct.add("layer.bias", "F32", {32}, wb.ptr(), vmmw::Memory::Device);
    std::thread td([&] { report = tx.send_direct(direct); });
    uo.expected_version = v + 1;
    const auto rd = vmmw::receive_ipc(loader, pool, tx_path, uo, 20000);
    td.join();
    CHECK(rd.version == v + 2 && rd.staged == 0 && report.version == v + 2 && report.buckets == 0);
    pool.read(d.ptr, back.data(), back.size() * 4);
    CHECK(back == a4);
    // A receiver that keeps its imports: the second direct update attaches nothing.
    vmmw::UpdateReceiver rx(pool, tx_path, 20000);
    for (uint32_t round = 0; round < 2; ++round) {
      for (size_t i = 0; i < a4.size(); ++i) a4[i] = static_cast<float>(i + round) * 0.25f;
      sender_pool.write(wa.ptr(), a4.data(), a4.size() * 4);
      std::thread tr([&] { report = tx.send_direct(direct); });
      uo.expected_version = v + 2 + round;
      const auto rr = rx.receive(loader, pool, uo);
      tr.join();
      const vmmw_receive_stats_t st = rx.stats();
      CHECK(rr.version == v + 3 + round && rr.staged == 0 && st.direct == 1);
      CHECK(st.attached == (round == 0 ? 1u : 0u) && st.reused == round && st.kept_imports == 1 && st.kept_bytes > 0);
      pool.read(d.ptr, back.data(), back.size() * 4);
      CHECK(back == a4);
    }
    rx.drop_imports();
    CHECK(rx.stats().kept_imports == 0 && rx.stats().kept_bytes == 0);
    vmmw::UpdateReceiver none(pool, std::string(dir) + "/none.sock", 1000);
    CHECK(status_of([&] { (void)none.receive(loader, pool, uo); }) == VMMW_IO);
    CHECK(status_of([&] { (void)tx.send_direct(src); }) == VMMW_INVALID_ARGUMENT);  // host memory
    CHECK(status_of([&] { (void)vmmw::receive_ipc(loader, pool, std::string(dir) + "/none.sock", uo, 1000); }) ==
          VMMW_IO);
    CHECK(status_of([] { (void)vmmw::NcclComm::from_raw(nullptr); }) != VMMW_OK);
  }
  unlink(path.c_str());
  rmdir(dir);
}

static void test_devices() {
  char dir[] = "/tmp/vmmw-cpp-multi-XXXXXX";
  CHECK(mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/model.safetensors";
  std::vector<float> a(16 * 8);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) - 7.5f;
  st_tensor ts[1] = {{"w", "F32", {16, 8, 0, 0}, 2, a.data(), a.size() * 4}};
  CHECK(st_write(path.c_str(), ts, 1) == 0);
  std::vector<vmmw::Pool> pools;
  for (int32_t d = 0; d < 2; ++d) {
    vmmw::PoolOptions o;
    o.backend = vmmw::Backend::Host;
    o.device = d;
    pools.emplace_back(o);
  }
  CHECK(pools[0].can_access_peer(1) && !pools[0].can_access_peer(0));
  const vmmw::Tag w = vmmw::tag_id("cpp-multi");
  vmmw::Loader l0(path), l1(path);
  l0.allocate(pools[0], w);
  l1.allocate(pools[1], w);
  const auto r = vmmw::load_devices({&l0, &l1}, {&pools[0], &pools[1]}, vmmw::MultiMode::Replicas);
  CHECK(r.host_bytes == a.size() * 4 && r.peer_bytes == a.size() * 4);
  for (int d = 0; d < 2; ++d) {
    std::vector<float> back(a.size());
    pools[d].read((d == 0 ? l0 : l1).destination("w").ptr, back.data(), back.size() * 4);
    CHECK(back == a);
  }
  const auto peers = pools[1].peer_access(w);
  CHECK(peers.size() == 1 && peers[0].device == 0 && peers[0].access == VMMW_ACCESS_READ);
  pools[1].set_peer_access(w, {});
  CHECK(pools[1].peer_access(w).empty());
  CHECK(status_of([&] { vmmw::load_devices({&l0, &l0}, {&pools[0], &pools[1]}, vmmw::MultiMode::Ranks); }) ==
        VMMW_INVALID_ARGUMENT);

  // Replicas slept without backups wake by one checkpoint fan-out.
  pools[1].set_peer_access(w, {{0, VMMW_ACCESS_READ}});
  for (auto& p : pools) p.sleep({{w, vmmw::Policy::Discard}});
  const auto wr = vmmw::wake_replicas_by_reload({&l0, &l1}, {&pools[0], &pools[1]});
  CHECK(wr.host_bytes == a.size() * 4);
  for (int d = 0; d < 2; ++d) {
    std::vector<float> back(a.size());
    pools[d].read((d == 0 ? l0 : l1).destination("w").ptr, back.data(), back.size() * 4);
    CHECK(back == a);
  }

  // Replicas on one host backup: sleep, wake from it on both devices, bytes exact.
  const vmmw::Tag rt = vmmw::tag_id("cpp-replicas-one-backup");
  std::vector<uint8_t> bytes(300000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 31 + 7);
  std::vector<vmmw::Block> blocks;
  uint64_t ptr[2];
  for (int d = 0; d < 2; ++d) {
    blocks.push_back(pools[d].alloc(bytes.size(), rt));
    ptr[d] = blocks.back().ptr();
    pools[d].write(ptr[d], bytes.data(), bytes.size());
  }
  const std::vector<vmmw::Replica> group = {{&pools[0], rt}, {&pools[1], rt}};
  const auto sr = vmmw::sleep_replicas(group);
  CHECK(sr.backup_bytes >= bytes.size() && sr.released_bytes == 2 * sr.backup_bytes);
  const auto ws = vmmw::wake_replicas_from_backup(group);
  CHECK(ws.host_bytes == sr.backup_bytes && ws.peer_bytes == sr.backup_bytes && ws.direct_pairs == 0);
  for (int d = 0; d < 2; ++d) {
    std::vector<uint8_t> back(bytes.size());
    pools[d].read(ptr[d], back.data(), back.size());
    CHECK(back == bytes);
  }
  CHECK(status_of([&] { vmmw::wake_replicas_from_backup(group); }) == VMMW_INVALID_STATE);
  // The former names still work through 0.x (and warn: silenced here on purpose).
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
  CHECK(status_of([&] { vmmw::wake_replicas(group); }) == VMMW_INVALID_STATE);
  CHECK(status_of([&] {
          vmmw::wake_replicas(std::vector<vmmw::Loader*>{nullptr}, std::vector<vmmw::Pool*>{nullptr});
        }) == VMMW_NULL_ARGUMENT);
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
  CHECK(status_of([&] { vmmw::sleep_replicas({{&pools[0], rt}, {&pools[0], rt}}); }) == VMMW_INVALID_ARGUMENT);
  vmmw::sleep_replicas(group);
  vmmw::ReplicaWakeOptions direct;
  direct.peer_copies = false;
  const auto wd = vmmw::wake_replicas_from_backup(group, direct);
  CHECK(wd.host_bytes == 2 * sr.backup_bytes && wd.direct_pairs == 2);
  // The holder's backup compressed: every device decodes a share of its frames.
  vmmw::ReplicaSleepOptions reload;
  reload.holder_policy = vmmw::Policy::Reload;
  CHECK(status_of([&] { vmmw::sleep_replicas(group, reload); }) == VMMW_INVALID_ARGUMENT);
  vmmw::ReplicaSleepOptions coded;
  coded.holder_policy = vmmw::Policy::OffloadCompressed;
  const auto sc = vmmw::sleep_replicas(group, coded);
  CHECK(sc.backup_bytes > 0 && sc.released_bytes == 2 * sr.backup_bytes);
  const auto wc = vmmw::wake_replicas_from_backup(group);
  CHECK(wc.host_bytes == sc.backup_bytes && wc.delivered_bytes == sc.released_bytes);
  for (int d = 0; d < 2; ++d) {
    std::vector<uint8_t> back(bytes.size());
    pools[d].read(ptr[d], back.data(), back.size());
    CHECK(back == bytes);
  }
  unlink(path.c_str());
  rmdir(dir);
}

// The progress contract (docs/ABI.md): false continues and never cancels,
// whenever the callback is called; true while bytes are still to come
// cancels (unless the copies in flight were the last: then it succeeds). 32 MiB, so the callback is called during the copy and not only at
// its end, where a reversed reading of the return value would not show.
static void test_progress_contract() {
  char dir[] = "/tmp/vmmw-cpp-progress-XXXXXX";
  CHECK(mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/big.safetensors";
  std::vector<float> w(8u << 20, 1.5f);
  st_tensor t = {"w.weight", "F32", {w.size(), 0, 0, 0}, 1, w.data(), w.size() * 4};
  CHECK(st_write(path.c_str(), &t, 1) == 0);
  vmmw::PoolOptions o;
  o.backend = vmmw::Backend::Host;
  vmmw::Pool pool(o);
  vmmw::Loader loader(path);
  loader.allocate(pool, vmmw::tag_id("cpp-progress"));

  int midway = 0;
  for (int i = 0; i < 20 && midway == 0; ++i) {
    int calls = 0;
    const auto r = loader.load(pool, [&](uint64_t done, uint64_t total) {
      ++calls;
      midway += done < total;
      return false;
    });
    CHECK(r.bytes == w.size() * 4 && calls > 0);
  }
  CHECK(midway > 0);  // else the loop above proved nothing

  bool cancelled = false;
  for (int i = 0; i < 20 && !cancelled; ++i) {
    bool called_midway = false;
    const int32_t rc = status_of([&] {
      loader.load(pool, [&](uint64_t done, uint64_t total) {
        called_midway |= done < total;
        return true;
      });
    });
    CHECK(rc == VMMW_CANCELLED || rc == VMMW_OK);  // OK: asked after the last copies
    cancelled = rc == VMMW_CANCELLED;
    CHECK(!cancelled || called_midway);
  }
  CHECK(cancelled);
  unlink(path.c_str());
  rmdir(dir);
}

static void test_remap_notices() {
  vmmw::PoolOptions o;
  o.backend = vmmw::Backend::Host;
  vmmw::Pool pool(o);
  const vmmw::Tag t = vmmw::tag_id("cpp-remap");
  pool.set_tag_rdma(t);
  vmmw::Block b = pool.alloc(1u << 20, t);
  CHECK(status_of([&] { pool.set_tag_rdma(t, false); }) == VMMW_INVALID_STATE);
  CHECK(vmmw::remap_epoch(t) == 0);
  std::vector<uint64_t> seen;
  {
    vmmw::RemapCallback cb([&](vmmw::Tag tag, uint64_t epoch) {
      if (tag == t) seen.push_back(epoch);
    });
    for (uint64_t cycle = 1; cycle <= 2; ++cycle) {
      pool.sleep({{t, vmmw::Policy::Offload}});
      CHECK(vmmw::remap_epoch(t) == cycle - 1);
      pool.wake();
      CHECK(vmmw::remap_epoch(t) == cycle);
    }
  }
  CHECK((seen == std::vector<uint64_t>{1, 2}));
  pool.sleep({{t, vmmw::Policy::Offload}});
  pool.wake();
  CHECK(seen.size() == 2 && vmmw::remap_epoch(t) == 3);
  CHECK(status_of([&] { (void)vmmw::remap_epoch(987654); }) == VMMW_UNKNOWN_TAG);
}

static void test_metadata() {
  char dir[] = "/tmp/vmmw-cpp-gguf-XXXXXX";
  CHECK(mkdtemp(dir) != nullptr);
  std::string path = std::string(dir) + "/m.gguf";
  std::vector<uint8_t> q8(2 * 34, 5);
  tiny_tensor_t t[] = {{"w", 8, 2, {32, 2, 0, 0}, q8.data(), q8.size()}};
  tiny_gguf_write(path.c_str(), "llama", 3, t, 1);
  vmmw::Metadata m(path);
  CHECK(m.size() == 2);
  CHECK(m.key(0) == "general.architecture");
  CHECK(m.string(m.find("general.architecture")) == "llama");
  size_t i = m.find("example.layers");
  CHECK(m.type(i) == VMMW_METADATA_UINT32);
  CHECK(m.u64(i) == 3 && m.i64(i) == 3);
  CHECK(status_of([&] { (void)m.f64(i); }) == VMMW_INVALID_ARGUMENT);
  CHECK(status_of([&] { (void)m.find("nope"); }) == VMMW_INVALID_ARGUMENT);
  CHECK(status_of([&] { (void)m.u64(i, {0}); }) == VMMW_INVALID_ARGUMENT);
  vmmw::GgmlType q = vmmw::ggml_type("Q8_0");
  CHECK(q.id == 8 && q.block == 32 && q.type_size == 34);
  vmmw::Metadata moved(std::move(m));
  CHECK(status_of([&] { (void)m.size(); }) == VMMW_NULL_ARGUMENT);
  CHECK(moved.size() == 2);
  unlink(path.c_str());
  rmdir(dir);
}

// The control channel: this process's default pools served on a socket and
// driven through it, as vmmw ctl drives a program under the interposer.
static void test_control() {
  char dir[] = "/tmp/vmmw-cpp-control-XXXXXX";
  CHECK(mkdtemp(dir) != nullptr);
  const std::string sock = std::string(dir) + "/control.sock";
  vmmw::Pool pool = vmmw::Pool::global(0);
  vmmw::control::Server server(sock);
  CHECK(status_of([&] { vmmw::control::Server again(sock); }) == VMMW_IO);
  const vmmw::Tag t = vmmw::tag_id("cpp-control");
  vmmw::Block b = pool.alloc(4u << 20, t);
  std::vector<unsigned char> in(4096), out(4096);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 13 + 1);
  pool.write(b.ptr() + 512, in.data(), in.size());
  CHECK(vmmw::control::status(sock).find("\"tag\":\"cpp-control\"") != std::string::npos);
  CHECK(status_of([&] { (void)vmmw::control::sleep(sock, vmmw::Policy::Reload); }) == VMMW_INVALID_ARGUMENT);
  CHECK(status_of([&] { (void)vmmw::control::sleep(sock, vmmw::Policy::Offload, {"cpp-nope"}); }) ==
        VMMW_UNKNOWN_TAG);
  vmmw::control::Result r = vmmw::control::sleep(sock, vmmw::Policy::Offload, {"cpp-control"});
  CHECK(r.bytes >= (4u << 20) && r.backup_bytes >= (4u << 20));
  CHECK(vmmw::control::status(sock).find("\"state\":\"asleep\"") != std::string::npos);
  r = vmmw::control::wake(sock, 1000);
  CHECK(r.bytes >= (4u << 20));
  pool.read(b.ptr() + 512, out.data(), out.size());
  CHECK(in == out);
  CHECK(status_of([&] { (void)vmmw::control::status(std::string(dir) + "/none.sock"); }) == VMMW_IO);
  b.reset();
  rmdir(dir);
}

static void test_swap() {
  vmmw::Device dev(vmmw::Backend::Host);
  vmmw::PoolOptions o;
  o.device_handle = &dev;
  vmmw::Pool pool(o);
  const vmmw::Tag a = vmmw::tag_id("cpp-swap-a");
  const vmmw::Tag b = vmmw::tag_id("cpp-swap-b");
  vmmw::Block pa = pool.alloc(16u << 20, a);
  vmmw::Block pb = pool.alloc(16u << 20, b);
  std::vector<unsigned char> in(4096), out(4096);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 13 + 1);
  pool.write(pb.ptr() + 64, in.data(), in.size());
  pool.sleep({{b, vmmw::Policy::Offload}});

  // Refused: nothing changes, a plain Error (not a SwapError).
  bool swap_error = false;
  try {
    (void)pool.swap({{a, vmmw::Policy::Offload}}, {a});
  } catch (const vmmw::SwapError&) {
    swap_error = true;
  } catch (const vmmw::Error& e) {
    CHECK(e.status() == VMMW_INVALID_ARGUMENT);
  }
  CHECK(!swap_error && pool.report(b).asleep == 1 && pool.report(a).asleep == 0);

  vmmw::SwapResult r = pool.swap({{a, vmmw::Policy::Offload}}, {b});
  CHECK(r.sleep_status == VMMW_OK && r.wake_status == VMMW_OK && r.slept_tags == 1 && r.woken_tags == 1);
  CHECK(r.released_bytes >= (16u << 20) && r.mapped_bytes >= (16u << 20));
  pool.read(pb.ptr() + 64, out.data(), out.size());
  CHECK(in == out);

  // A wake failing midway: a SwapError telling both sides.
  vmmw::testing::host_fail_nth(dev, vmmw::testing::FaultPoint::Map, 1);
  bool thrown = false;
  try {
    (void)pool.swap({{b, vmmw::Policy::Offload}}, {a});
  } catch (const vmmw::SwapError& e) {
    thrown = true;
    CHECK(e.result().sleep_status == VMMW_OK && e.result().wake_status == e.status());
    CHECK(e.result().woken_tags == 0);
  }
  CHECK(thrown && pool.report(a).asleep == 1 && pool.report(b).asleep == 1);

  // A waiting wake: no room, so it fails at its deadline; then it wakes.
  vmmw::testing::host_set_memory_limit(dev, vmmw::testing::host_counts(dev).physical_bytes + (4u << 20));
  CHECK(status_of([&] { pool.wake_with({b}, 20); }) == VMMW_OUT_OF_MEMORY);
  vmmw::testing::host_set_memory_limit(dev, 1ull << 30);
  pool.wake_with({b}, 20);
  pool.read(pb.ptr() + 64, out.data(), out.size());
  CHECK(in == out);
  pool.wake({a});
}

static void test_pack() {
  char dir[] = "/tmp/vmmw-cpp-pack-XXXXXX";
  CHECK(mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/model.safetensors";
  const std::string packed = std::string(dir) + "/model.packed";
  const std::string back = std::string(dir) + "/back.safetensors";
  std::vector<float> a(40000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 101) / 64.0f;
  st_tensor t = {"w", "F32", {40000, 0, 0, 0}, 1, a.data(), a.size() * 4};
  CHECK(st_write(path.c_str(), &t, 1) == 0);
  vmmw_pack_options_t po = vmmw::pack_options();
  po.frame_bytes = 64 << 10;
  po.cpu = 1;
  const auto r = vmmw::pack(path, packed, po);
  CHECK(r.files == 1 && r.tensors == 1 && r.packed_bytes > 0);
  CHECK(status_of([&] { (void)vmmw::pack(path, packed, po); }) == VMMW_INVALID_ARGUMENT);
  (void)vmmw::unpack(packed, back);
  // The packed file loads as any checkpoint.
  vmmw::PoolOptions o;
  o.backend = vmmw::Backend::Host;
  vmmw::Pool pool(o);
  vmmw::Loader loader(packed);
  loader.allocate(pool, vmmw::tag_id("cpp-packed"));
  (void)loader.load(pool);
  std::vector<float> got(a.size());
  pool.read(loader.destination("w").ptr, got.data(), got.size() * 4);
  CHECK(got == a);
  unlink(path.c_str());
  unlink(packed.c_str());
  unlink(back.c_str());
  rmdir(dir);
}

int main() {
  test_pack();
  test_errors();
  test_remap_notices();
  test_metadata();
  test_progress_contract();
  test_device_and_segment();
  test_pool_tags_sleep();
  test_swap();
  test_loader();
  test_devices();
  test_control();
  std::printf("test_wrapper: %d checks passed\n", g_checks);
  return 0;
}
