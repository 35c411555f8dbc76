/*
 * The stand-in llama-server's "model": weights and a KV cache in memory
 * from cudaMalloc, read and written only through cudaMemcpy, the way a
 * CUDA inference server touches device memory. Under the interposer
 * (LD_PRELOAD=libvmmw_preload.so) the allocations come from its pool, so a
 * sleep releases them and a wake must bring every byte back.
 *
 * Every answer is computed from the weights and the cached prompt state:
 *   - each request hashes all the weights, and every generated token mixes
 *     that hash in, so a weight byte lost in a sleep changes the output;
 *   - the KV cache holds, per position, the token and the state after it;
 *     a request reuses the longest cached prefix of its prompt (prompt_n
 *     counts the positions it had to compute), so a KV cache lost in a
 *     sleep shows as a large prompt_n, and a corrupted state as a wrong output.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The stand-in CUDA runtime's declarations (tests/preload/): the model links
 * against libvmmw_standin_cudart.so, so its cudaMalloc resolves through the
 * global scope, where the LD_PRELOAD'ed interposer comes first. */
#include "standin_cudart.h"

#define SM_VOCAB 4096u
#define SM_CHUNK (1u << 20)

/* Errors of our own are negative; CUDA's are returned as they are. */
enum { SM_OK = 0, SM_E_STATE = -1, SM_E_CONTEXT = -2, SM_E_HOST = -3 };

static struct {
    uint8_t *weights; /* device */
    uint64_t weight_bytes;
    int32_t *kv_tokens;  /* device, kv_cap entries */
    uint64_t *kv_states; /* device, kv_cap entries */
    uint64_t kv_cap;
    uint64_t n_cached; /* positions of the KV cache that are valid */
    uint64_t seed;
    uint64_t h;     /* the running state of the request being served */
    uint64_t whash; /* the weights' hash of the request being served */
    uint8_t *buf;   /* host staging */
} M;

static uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int sm_load(uint64_t weight_bytes, uint64_t kv_cap, uint64_t seed) {
    if (M.weights || weight_bytes < 8 || weight_bytes % 8 || kv_cap == 0)
        return SM_E_STATE;
    M.buf = malloc(SM_CHUNK);
    if (!M.buf)
        return SM_E_HOST;
    int e = cudaMalloc((void **)&M.weights, weight_bytes);
    if (!e)
        e = cudaMalloc((void **)&M.kv_tokens, kv_cap * sizeof(int32_t));
    if (!e)
        e = cudaMalloc((void **)&M.kv_states, kv_cap * sizeof(uint64_t));
    if (e)
        return e;
    M.weight_bytes = weight_bytes;
    M.kv_cap = kv_cap;
    M.seed = seed;
    uint64_t x = mix(seed);
    for (uint64_t off = 0; off < weight_bytes; off += SM_CHUNK) {
        uint64_t n = weight_bytes - off < SM_CHUNK ? weight_bytes - off : SM_CHUNK;
        for (uint64_t i = 0; i < n; i += 8) {
            x = mix(x + 0x9e3779b97f4a7c15ull);
            memcpy(M.buf + i, &x, 8);
        }
        if ((e = cudaMemcpy(M.weights + off, M.buf, n, cudaMemcpyHostToDevice)))
            return e;
    }
    return cudaDeviceSynchronize();
}

/* One weight word, read from device memory. */
static cudaError_t weight_at(uint64_t index, uint64_t *out) {
    return cudaMemcpy(out, M.weights + (index % (M.weight_bytes / 8)) * 8, 8, cudaMemcpyDeviceToHost);
}

static cudaError_t step(uint64_t *h, int32_t tok) {
    uint64_t w;
    cudaError_t e = weight_at(*h ^ (uint64_t)tok, &w);
    *h = mix(*h ^ ((uint64_t)tok * 0x9e3779b97f4a7c15ull) ^ w);
    return e;
}

static cudaError_t hash_weights(uint64_t *out) {
    uint64_t h = M.seed;
    for (uint64_t off = 0; off < M.weight_bytes; off += SM_CHUNK) {
        uint64_t n = M.weight_bytes - off < SM_CHUNK ? M.weight_bytes - off : SM_CHUNK;
        cudaError_t e = cudaMemcpy(M.buf, M.weights + off, n, cudaMemcpyDeviceToHost);
        if (e)
            return e;
        for (uint64_t i = 0; i < n; i += 8) {
            uint64_t v;
            memcpy(&v, M.buf + i, 8);
            h = (h ^ v) * 0x100000001b3ull;
        }
    }
    *out = mix(h);
    return 0;
}

/*
 * Takes a prompt of n tokens: reuses the longest cached prefix (at least
 * one position is always computed, as llama-server re-evaluates the last
 * prompt token), computes the rest into the KV cache. *prompt_n is the
 * positions computed, *cache_n those reused.
 */
int sm_prompt(const int32_t *prompt, uint64_t n, uint64_t *prompt_n, uint64_t *cache_n) {
    if (!M.weights || n == 0)
        return SM_E_STATE;
    if (n > M.kv_cap)
        return SM_E_CONTEXT;
    cudaError_t e = hash_weights(&M.whash);
    if (e)
        return e;
    uint64_t p = 0, limit = n < M.n_cached ? n : M.n_cached;
    for (uint64_t off = 0; off < limit && p == off; off += SM_CHUNK / 4) {
        uint64_t k = limit - off < SM_CHUNK / 4 ? limit - off : SM_CHUNK / 4;
        if ((e = cudaMemcpy(M.buf, M.kv_tokens + off, k * 4, cudaMemcpyDeviceToHost)))
            return e;
        const int32_t *cached = (const int32_t *)M.buf;
        for (uint64_t i = 0; i < k && cached[i] == prompt[off + i]; i++)
            p++;
    }
    if (p == n)
        p = n - 1;
    M.h = mix(M.whash ^ M.seed);
    if (p > 0 && (e = cudaMemcpy(&M.h, M.kv_states + p - 1, 8, cudaMemcpyDeviceToHost)))
        return e;
    for (uint64_t i = p; i < n; i++) {
        if ((e = step(&M.h, prompt[i])))
            return e;
        if ((e = cudaMemcpy(M.kv_tokens + i, prompt + i, 4, cudaMemcpyHostToDevice)) ||
            (e = cudaMemcpy(M.kv_states + i, &M.h, 8, cudaMemcpyHostToDevice)))
            return e;
    }
    M.n_cached = n;
    *prompt_n = n - p;
    *cache_n = p;
    return cudaDeviceSynchronize();
}

/* The next token after the prompt (or the last token); cached while the KV cache has room. */
int sm_next(int32_t *out) {
    if (!M.weights)
        return SM_E_STATE;
    uint64_t w;
    cudaError_t e = weight_at(M.h >> 3, &w);
    if (e)
        return e;
    int32_t tok = (int32_t)((mix(M.h ^ M.whash ^ w) >> 11) % SM_VOCAB);
    if ((e = step(&M.h, tok)))
        return e;
    if (M.n_cached < M.kv_cap) {
        if ((e = cudaMemcpy(M.kv_tokens + M.n_cached, &tok, 4, cudaMemcpyHostToDevice)) ||
            (e = cudaMemcpy(M.kv_states + M.n_cached, &M.h, 8, cudaMemcpyHostToDevice)))
            return e;
        M.n_cached++;
    }
    *out = tok;
    return 0;
}

/* Forget the cached prompt (llama-server's cache_prompt off): the next prompt is computed whole. */
void sm_forget_cache(void) { M.n_cached = 0; }

uint64_t sm_device_bytes(void) { return M.weight_bytes + M.kv_cap * 12; }

void sm_unload(void) {
    if (M.weights) {
        cudaDeviceSynchronize();
        cudaFree(M.weights);
        cudaFree(M.kv_tokens);
        cudaFree(M.kv_states);
    }
    free(M.buf);
    memset(&M, 0, sizeof M);
}
