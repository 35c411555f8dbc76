// vmmweights from C++ through find_package: open a device, allocate VMM
// memory, write and read it back. Runs on the host backend without a GPU.
#include <cstdio>
#include <vector>

#include <vmmweights.hpp>

int main() {
  try {
    vmmw::Device dev(vmmw::Backend::Auto);
    std::printf("vmmweights %s on %s (%s)\n", vmmw::version().c_str(), dev.describe().c_str(),
                dev.choice_reason().c_str());
    const uint64_t g = dev.granularity();
    vmmw::Segment seg(dev, 2 * g, g);
    std::vector<float> in(1024), out(1024);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) * 0.5f;
    seg.write(g - 512, in.data(), in.size() * sizeof(float));
    seg.read(g - 512, out.data(), out.size() * sizeof(float));
    if (in != out) {
      std::fprintf(stderr, "read back differs from what was written\n");
      return 1;
    }
    std::printf("segment at %#llx: %llu bytes in %llu chunks, round trip ok\n",
                static_cast<unsigned long long>(seg.ptr()),
                static_cast<unsigned long long>(seg.info().reserved),
                static_cast<unsigned long long>(seg.info().chunks));
    return 0;
  } catch (const vmmw::Error& e) {
    std::fprintf(stderr, "vmmweights error %s: %s\n", e.status_name(), e.what());
    return 1;
  }
}
