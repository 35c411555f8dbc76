// The codec kernels on the CPU (see emu.h). Usage:
//   emu encode WIDTH RAW_IN FRAME_OUT     the frame of RAW_IN's bytes
//   emu decode FRAME_IN RAW_LEN RAW_OUT   prints the status word (4294967295 = ok)
// Each runs twice, on 8-aligned buffers and on buffers 3 bytes off (the
// kernels' byte-wise paths), and exits 3 when the two disagree.
#include "emu.h"

#include "../codec.cu"

#include <cstdio>
#include <cstdlib>
#include <algorithm>
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
        const std::vector<u8> raw = read_file(argv[3]);
        const u64 nb = (raw.size() + BLOCK_BYTES - 1) / BLOCK_BYTES;
        std::vector<u8> frames[2];
        for (int off = 0; off < 2; ++off) {
            const size_t shift = off ? 3 : 0;
            std::vector<u8> in(raw.size() + 8);
            std::copy(raw.begin(), raw.end(), in.begin() + shift);
            std::vector<u8> slots(nb * SLOT_BYTES + 1);
            std::vector<u32> sizes(nb + 1);
            std::vector<u8> frame(FRAME_HEADER + 8 * nb + nb * SLOT_BYTES + 8);
            u64 frame_len = 0;
            const u8* rp = in.data() + shift;
            u8* fp = frame.data() + shift;
            launch([&] { vmmw_codec_encode(rp, raw.size(), width, slots.data(), sizes.data()); });
            launch([&] { vmmw_codec_index(sizes.data(), raw.size(), width, fp, &frame_len); });
            launch([&] { vmmw_codec_pack(slots.data(), sizes.data(), raw.size(), fp); });
            frames[off].assign(fp, fp + frame_len);
        }
        if (frames[0] != frames[1]) {
            std::fprintf(stderr, "encode: aligned and unaligned buffers give different frames\n");
            return 3;
        }
        write_file(argv[4], frames[0].data(), frames[0].size());
        return 0;
    }
    if (op == "decode") {
        const std::vector<u8> input = read_file(argv[2]);
        const u64 raw_len = std::strtoull(argv[3], nullptr, 10);
        const u64 frame_len = input.size();
        std::vector<u8> outs[2];
        u32 statuses[2];
        for (int off = 0; off < 2; ++off) {
            const size_t shift = off ? 3 : 0;
            // Padding past the frame: a short frame's header is read before
            // its length is checked against it.
            std::vector<u8> frame(input.size() + 64 + shift);
            std::copy(input.begin(), input.end(), frame.begin() + shift);
            // Guard bytes after the output: the kernel must not touch them.
            std::vector<u8> out(raw_len + 64 + shift, 0xEE);
            u32 status = 0xFFFFFFFFu;
            const u8* fp = frame.data() + shift;
            u8* op = out.data() + shift;
            launch([&] { vmmw_codec_decode(fp, frame_len, op, raw_len, &status); });
            for (size_t i = 0; i < shift; ++i) {
                if (out[i] != 0xEE) {
                    std::fprintf(stderr, "decode wrote before its output\n");
                    return 3;
                }
            }
            for (size_t i = shift + raw_len; i < out.size(); ++i) {
                if (out[i] != 0xEE) {
                    std::fprintf(stderr, "decode wrote past its output\n");
                    return 3;
                }
            }
            outs[off].assign(op, op + raw_len);
            statuses[off] = status;
        }
        if (statuses[0] != statuses[1] || (statuses[0] == 0xFFFFFFFFu && outs[0] != outs[1])) {
            std::fprintf(stderr, "decode: aligned and unaligned buffers disagree\n");
            return 3;
        }
        write_file(argv[4], outs[0].data(), raw_len);
        std::printf("%u\n", statuses[0]);
        return 0;
    }
    std::fprintf(stderr, "unknown op %s\n", argv[1]);
    return 2;
}
