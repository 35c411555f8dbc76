// The codec kernels on the CPU (see emu.h). Usage:
//   emu encode WIDTH RAW_IN FRAME_OUT     the frame of RAW_IN's bytes
//   emu decode FRAME_IN RAW_LEN RAW_OUT   prints the status word (4294967295 = ok)
#include "emu.h"

#include "../codec.cu"

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <ucontext.h>
#include <vector>

static std::vector<u8> read_file(const char* path) {
    std::vector<u8> v;
    FILE* f = std::fopen(path, "rb");
    if (!f) {
        std::perror(path);
        std::exit(2);
    }
    int c;
    while ((c = std::fgetc(f)) != EOF) {
        v.push_back((u8)c);
    }
    std::fclose(f);
    return v;
}

static void write_file(const char* path, const u8* p, size_t n) {
    FILE* f = std::fopen(path, "wb");
    if (!f || std::fwrite(p, 1, n, f) != n) {
        std::perror(path);
        std::exit(2);
    }
    std::fclose(f);
}

// One launch: a grid of one block of 256 fibers (the kernels loop over blocks).
static ucontext_t scheduler;
static ucontext_t fibers[256];
static const std::function<void()>* fiber_body;

void emu_sync() {
    // Back to the scheduler, which resumes the next fiber; once every fiber
    // has arrived, this one runs on.
    swapcontext(&fibers[threadIdx.x], &scheduler);
}

static bool fiber_done;

static void fiber_main() {
    (*fiber_body)();
    fiber_done = true;
}

static void launch(const std::function<void()>& body) {
    const size_t stack = 256 << 10;
    std::vector<std::vector<char>> stacks(256, std::vector<char>(stack));
    std::vector<bool> done(256, false);
    fiber_body = &body;
    for (unsigned t = 0; t < 256; ++t) {
        getcontext(&fibers[t]);
        fibers[t].uc_stack.ss_sp = stacks[t].data();
        fibers[t].uc_stack.ss_size = stack;
        fibers[t].uc_link = &scheduler;
        makecontext(&fibers[t], fiber_main, 0);
    }
    // Round robin: each fiber runs to its next barrier (or its end).
    for (;;) {
        unsigned live = 0;
        for (unsigned t = 0; t < 256; ++t) {
            if (done[t]) {
                continue;
            }
            threadIdx = Dim3{t, 0, 0};
            // A fiber that returns goes back through uc_link with its
            // context unchanged; mark it by the flag it cannot set itself.
            fiber_done = false;
            swapcontext(&scheduler, &fibers[t]);
            if (fiber_done) {
                done[t] = true;
            } else {
                ++live;
            }
        }
        if (live == 0) {
            break;
        }
    }
}

int main(int argc, char** argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: emu encode WIDTH IN OUT | emu decode IN RAW_LEN OUT\n");
        return 2;
    }
    const std::string op = argv[1];
    if (op == "encode") {
        const u32 width = (u32)std::atoi(argv[2]);
        std::vector<u8> raw = read_file(argv[3]);
        const u64 nb = (raw.size() + BLOCK_BYTES - 1) / BLOCK_BYTES;
        std::vector<u8> slots(nb * SLOT_BYTES + 1);
        std::vector<u32> sizes(nb + 1);
        std::vector<u8> frame(FRAME_HEADER + 8 * nb + nb * SLOT_BYTES);
        u64 frame_len = 0;
        const u8* rp = raw.data();
        launch([&] { vmmw_codec_encode(rp, raw.size(), width, slots.data(), sizes.data()); });
        launch([&] { vmmw_codec_index(sizes.data(), raw.size(), width, frame.data(), &frame_len); });
        launch([&] { vmmw_codec_pack(slots.data(), sizes.data(), raw.size(), frame.data()); });
        write_file(argv[4], frame.data(), frame_len);
        return 0;
    }
    if (op == "decode") {
        std::vector<u8> frame = read_file(argv[2]);
        const u64 raw_len = std::strtoull(argv[3], nullptr, 10);
        std::vector<u8> out(raw_len + 1);
        u32 status = 0xFFFFFFFFu;
        // The device reads a frame of at least its header; pad a short one
        // so the emulation does not read past its vector.
        const u64 frame_len = frame.size();
        frame.resize(frame.size() + 64);
        launch([&] { vmmw_codec_decode(frame.data(), frame_len, out.data(), raw_len, &status); });
        write_file(argv[4], out.data(), raw_len);
        std::printf("%u\n", status);
        return 0;
    }
    std::fprintf(stderr, "unknown op %s\n", argv[1]);
    return 2;
}
