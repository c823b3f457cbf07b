// llmc/kv_cache.cuh — attention of one new token against a KV cache: the decoding step of generation.
//
// Generation feeds one token at a time. Its query attends to the keys and values of every earlier
// position, which do not change once computed, so they are kept in a cache instead of being
// recomputed over the whole window for every new token.
//
// Layout. The cache of one layer is (maxT, 3C): row t is position t's qkv row exactly as the model's
// qkv matmul writes it, [q (C) | k (C) | v (C)], head h using columns h*HS .. h*HS+HS-1 of each part
// (HS = C/NH, as in llmc/attention.cuh). The model writes row pos (the new token) before the call; the
// query is that row's q part, and rows after pos are never read (they may hold stale values or none).
//
// Algorithm. One block per head, in three phases:
//   scores   q·k_j/sqrt(HS) for the keys j <= pos, into shared memory in fp32. A head's row is read
//            in chunks of VEC elements (one 128-bit load when the cache is aligned, VEC = 1 when it
//            is not); a group of G lanes shares a key, each lane reading up to 4 chunks of it (G =
//            chunks/4 rounded up to a power of two, at most 32: HS = 64 in fp32 or 128 in bf16 is 4
//            lanes of 4 independent 16-byte loads, 64 contiguous bytes per lane), each lane keeps its
//            chunks of q in registers, and an xor tree of log2(G) shuffles adds the lanes' parts:
//            32/G keys per warp at a time. Fewer lanes per key mean fewer shuffles per key and more
//            loads in flight per lane, at the same fully used 32-byte sectors;
//   softmax  the block's max and the sum of p_j = exp(s_j - max), each weight kept in shared memory;
//   values   out = sum_j p_j v_j / sum_j p_j: a thread per chunk of a row and per slice of the keys
//            (consecutive threads read consecutive chunks of one row: coalesced), fp32 partial sums
//            per slice, then added in slice order and rounded once to the storage type.
// At batch 1 this reads the cache once, like any decoder. With only NH blocks a long context leaves
// most SMs idle; splitting the keys of a head over several blocks (flash-decoding) would be the next
// step there.
//
// Determinism. Every sum has one order whatever the schedule (each thread's terms in index order,
// xor-shuffle trees, per-warp and per-slice partials added in index order), no atomics: the result
// is bit-identical run to run.
#pragma once
#include "cuda_common.h"
#include "precision.cuh"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

constexpr int kDecodeThreads = 256;                 // threads per block (one block per head)
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kDecodeMaxHeadSize = kDecodeThreads;  // the value phase needs a thread per chunk of a row
constexpr int kDecodeChunksPerLane = 4;             // chunks of a key a lane reads, when G < 32

// How a head's row of HS elements is split: chunks of vec elements, lanes_per_key lanes per key in
// the score phase, slices of the keys in the value phase.
struct DecodeLayout {
    int vec, chunks, lanes_per_key, slices;
};
// Lanes per key for a row of `chunks` chunks: enough for kDecodeChunksPerLane each, a power of two <= 32.
__host__ __device__ constexpr int attention_decode_lanes_per_key(int chunks) {
    int g = 1;
    while (g * kDecodeChunksPerLane < chunks && g < 32) g *= 2;
    return g;
}
__host__ __device__ inline DecodeLayout attention_decode_layout(int HS, int vec) {
    DecodeLayout d;
    d.vec = vec;
    d.chunks = HS / vec;
    d.lanes_per_key = attention_decode_lanes_per_key(d.chunks);
    d.slices = kDecodeThreads / d.chunks;
    return d;
}
// The most elements of q a lane keeps in registers with chunks of vec elements, over every HS up to
// kDecodeMaxHeadSize (8 for vec 1, 16 for 4, 32 for 8): the size of its register array.
__host__ __device__ constexpr int attention_decode_max_q(int vec) {
    int most = 0;
    for (int chunks = 1; chunks <= kDecodeMaxHeadSize / vec; chunks++) {
        int g = attention_decode_lanes_per_key(chunks), q = (chunks + g - 1) / g * vec;
        most = q > most ? q : most;
    }
    return most;
}

// Bytes of dynamic shared memory per block: the value phase's partial sums (slices * HS), the
// per-warp maxima and sums (2 kDecodeWarps) and a score per position (maxT), all fp32. Sized by
// maxT, not pos, so that every step of a generation launches the same configuration.
inline size_t attention_decode_smem_bytes(int HS, int vec, int maxT) {
    DecodeLayout d = attention_decode_layout(HS, vec);
    return ((size_t)d.slices * HS + 2 * kDecodeWarps + (size_t)maxT) * sizeof(float);
}

// ----------------------------------------------------------------------------
// CUDA kernels

// Loads VEC consecutive values at p as floats: one 128-bit load when VEC is the pack width (the
// launcher checked the alignment), single elements when VEC = 1.
template <int VEC, class T>
__device__ inline void decode_load(float (&out)[VEC], const T* p) {
    if constexpr (VEC == Packed128<T>::size) {
        Packed128<T> pack = load128(p);
        for (int k = 0; k < VEC; k++) out[k] = to_float(pack[k]);
    } else {
        for (int k = 0; k < VEC; k++) out[k] = to_float(p[k]);
    }
}

// Block h computes head h's out (C) for the query at position pos from cache (maxT, 3C).
// scale_log2 = log2(e)/sqrt(HS): scores are kept in log2 units, so that each weight is one exp2.
// (min 1 block per SM: a launch has only NH blocks, so registers need not be rationed for occupancy)
template <class T, int VEC>
__global__ void __launch_bounds__(kDecodeThreads, 1)
    attention_decode_kernel(T* out, const T* cache, int pos, int C, int HS, float scale_log2) {
    constexpr int kQ = attention_decode_max_q(VEC);
    const int h = blockIdx.x, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const DecodeLayout d = attention_decode_layout(HS, VEC);
    const size_t stride = 3 * (size_t)C;
    const T* q = cache + (size_t)pos * stride + (size_t)h * HS;  // row pos, head h's q
    const T* k = cache + C + (size_t)h * HS;                     // row 0, head h's k; row j at k + j*stride
    const T* v = k + C;                                          // row 0, head h's v
    // The fixed-size regions first and the scores last, so that the scores end where the allocation
    // does (the CPU backend's AddressSanitizer build then catches a read past them).
    float* partial = dynamic_shared<float>();         // (slices, HS) value-phase partial sums
    float* warp_max = partial + (size_t)d.slices * HS; // (kDecodeWarps)
    float* warp_sum = warp_max + kDecodeWarps;         // (kDecodeWarps)
    float* s = warp_sum + kDecodeWarps;                // (maxT) scores of keys 0..pos, then their weights

    // Scores. Lane glane of a group owns chunks glane, glane + G, ... (at most kQ elements);
    // the loop bound is uniform over the block, so every lane reaches every shuffle, and the xor tree
    // leaves the same bits in every lane of the group (float addition is commutative).
    const int G = d.lanes_per_key, keys_per_warp = 32 / G, group = lane / G, glane = lane % G;
    float qr[kQ];
    for (int i = 0; i < kQ / VEC; i++) {
        int c = glane + i * G;
        float x[VEC] = {};
        if (c < d.chunks) decode_load<VEC>(x, q + c * VEC);
        for (int e = 0; e < VEC; e++) qr[i * VEC + e] = x[e];
    }
    float thread_max = -INFINITY;
    for (int j0 = 0; j0 <= pos; j0 += kDecodeWarps * keys_per_warp) {
        int j = j0 + warp * keys_per_warp + group;
        float dot = 0.f;
        if (j <= pos)
            for (int i = 0; i < kQ / VEC; i++) {
                int c = glane + i * G;
                if (c >= d.chunks) break;
                float x[VEC];
                decode_load<VEC>(x, k + (size_t)j * stride + c * VEC);
                for (int e = 0; e < VEC; e++) dot += qr[i * VEC + e] * x[e];
            }
        for (int offset = G / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        if (j <= pos) {
            float score = dot * scale_log2;
            if (glane == 0) s[j] = score;
            thread_max = fmaxf(thread_max, score);
        }
    }
    for (int offset = 16; offset > 0; offset /= 2)
        thread_max = fmaxf(thread_max, __shfl_xor_sync(0xffffffffu, thread_max, offset));
    if (lane == 0) warp_max[warp] = thread_max;
    __syncthreads();  // the scores and the per-warp maxima are complete
    float m = warp_max[0];
    for (int i = 1; i < kDecodeWarps; i++) m = fmaxf(m, warp_max[i]);

    // Weights p_j = exp2(s_j - m) <= 1 (the largest is 1, so the sum is >= 1) and their sum.
    float thread_sum = 0.f;
    for (int j = tid; j <= pos; j += kDecodeThreads) {
        float p = exp2f(s[j] - m);
        s[j] = p;
        thread_sum += p;
    }
    for (int offset = 16; offset > 0; offset /= 2) thread_sum += __shfl_xor_sync(0xffffffffu, thread_sum, offset);
    if (lane == 0) warp_sum[warp] = thread_sum;
    __syncthreads();  // the weights and the per-warp sums are complete
    float l = 0.f;
    for (int i = 0; i < kDecodeWarps; i++) l += warp_sum[i];

    // Values: thread (slice, c) sums p_j v_j over chunk c of the keys j = slice, slice + slices, ...
    if (tid < d.slices * d.chunks) {
        int c = tid % d.chunks, slice = tid / d.chunks;
        float acc[VEC] = {};
        for (int j = slice; j <= pos; j += d.slices) {
            float x[VEC];
            decode_load<VEC>(x, v + (size_t)j * stride + c * VEC);
            for (int e = 0; e < VEC; e++) acc[e] += s[j] * x[e];
        }
        for (int e = 0; e < VEC; e++) partial[slice * HS + c * VEC + e] = acc[e];
    }
    __syncthreads();
    if (tid < HS) {
        float acc = partial[tid];
        for (int i = 1; i < d.slices; i++) acc += partial[i * HS + tid];
        out[(size_t)h * HS + tid] = from_float<T>(acc / l);
    }
}

// ----------------------------------------------------------------------------
// kernel launchers

// The chunk width attention_decode uses: a 128-bit pack when every row and head of the cache starts
// 16-byte aligned (C and HS multiples of the pack width, an aligned cache), else single elements.
template <class T>
inline int attention_decode_vec(const T* qkv_cache, int C, int NH) {
    constexpr int P = Packed128<T>::size;
    bool aligned = C % NH == 0 && (C / NH) % P == 0 && C % P == 0 && aligned16({qkv_cache});
    return aligned ? P : 1;
}

// out (C) = causal attention of the query at position pos over positions 0..pos of one sequence, per
// head: softmax(q k_j / sqrt(HS), j <= pos) · v. qkv_cache (maxT, 3C) holds the qkv rows of positions
// 0..pos (row pos: the new token's). Any HS = C/NH up to 256; 0 <= pos < maxT; maxT as large as the
// device's shared memory allows (4 bytes per position: ~56K positions on an H100).
template <class T>
void attention_decode(T* out, const T* qkv_cache, int pos, int C, int NH, int maxT, cudaStream_t stream) {
    char problem[160] = "";
    if (C < 1 || NH < 1 || maxT < 1) snprintf(problem, sizeof(problem), "C, NH and maxT must be >= 1");
    else if (C % NH != 0) snprintf(problem, sizeof(problem), "C must be a multiple of NH");
    else if (C / NH > kDecodeMaxHeadSize)
        snprintf(problem, sizeof(problem), "head size HS = C/NH = %d must be at most %d", C / NH, kDecodeMaxHeadSize);
    else if (pos < 0 || pos >= maxT) snprintf(problem, sizeof(problem), "pos must be in [0, maxT)");
    else if (out == nullptr || qkv_cache == nullptr) snprintf(problem, sizeof(problem), "out and qkv_cache must not be null");
    if (problem[0]) {
        fprintf(stderr, "attention_decode: unsupported shape C=%d NH=%d pos=%d maxT=%d: %s\n", C, NH, pos, maxT, problem);
        exit(EXIT_FAILURE);
    }
    const int HS = C / NH, vec = attention_decode_vec(qkv_cache, C, NH);
    auto kernel = vec == 1 ? attention_decode_kernel<T, 1> : attention_decode_kernel<T, Packed128<T>::size>;
    size_t smem = attention_decode_smem_bytes(HS, vec, maxT);
    reserve_dynamic_smem(kernel, smem, "attention_decode", "maxT", maxT);  // 4 bytes per position
    float scale_log2 = (float)(1.4426950408889634 / std::sqrt((double)HS));
    cudaCheck(launch_kernel(kernel, dim3(NH), dim3(kDecodeThreads), smem, stream, out, qkv_cache, pos, C, HS,
                            scale_log2));
}
