// llmc/dropout.cuh — dropout with a counter-based random generator: the hidden-state kernels (plain, fused
// with the residual add, backward) and the keep decision the flash-attention kernels apply to attention
// probabilities.
//
// Semantics. Each element is dropped with probability p and the kept ones are scaled by s = 1/(1-p),
// so the expectation is unchanged: out = inp * (keep ? s : 0). Multiplying (rather than selecting 0)
// keeps IEEE semantics: a dropped inf or NaN becomes NaN, as in PyTorch, so an overflow in fp16
// activations still reaches the trainer's overflow check. p = 0 is an exact copy and costs no random
// numbers.
//
// No stored mask. The keep decision is a pure function of (seed, offset, element index), so the
// backward regenerates the forward's mask instead of reading it: no B·T·C bytes of mask per dropout
// site written in the forward and read in the backward (at bf16, a uint8 mask is 25% more traffic for
// each of the two passes and memory that lives from forward to backward), and for the attention
// probabilities a stored mask is not an option at all (B·NH·T² bytes per layer, the matrix flash
// attention exists to never materialize).
//
// The generator: Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2,
// 3", SC11), the generator of cuRAND, PyTorch's CUDA dropout and FlashAttention. A keyed bijection of a
// 128-bit counter: 10 rounds of two 32x32->64-bit multiplies, xors and key additions. Why it rather than
// a cheaper integer hash: it passes TestU01's BigCrush with a wide margin (7 rounds already do), its
// published known-answer vectors pin the implementation (test/test_dropout.cu checks them on the
// device and the host), and it uses only integer multiplies, xors and adds, so a GPU and the CPU backend
// produce the same bits by construction (no floating point in the decision). Cost: 60-70 integer
// instructions per call (per round one IMAD.WIDE.U32 per product, which gives both halves, 3-input LOP3
// xors and the key additions) for 4 decisions, ~16 per element, each with the full 32-bit resolution
// (schemes that compare 8-bit slices of a word to save calls round p to a multiple of 1/256,
// 0.1 -> 0.098). On an H100 SXM (3.35 TB/s; 132 SMs x 4 schedulers x 32 lanes at ~1.8 GHz,
// ~31 T lane-instructions/s) bf16 dropout_forward moves 4 bytes per element, 0.84 T elements/s at full
// bandwidth, so the generator needs ~13 T instructions/s: about 40% of the issue rate, and the kernel
// stays memory-bound (fp32 and the residual form, 8 and 6 bytes per element, more so).
//
// Streams. Key = seed (64 bits); counter = (index_lo, index_hi, offset_lo, offset_hi). The offset
// selects a stream: two calls with different offsets never share a counter whatever their sizes, so a
// trainer gives every dropout site of every step its own offset (e.g. step * sites + site) and keeps
// one seed for the run. Hidden states: element n uses word n % 4 of counter index n / 4 (one Philox call
// per 4 consecutive elements: a Packed128 of fp32, half of one of bf16/fp16). Keep iff the word is >=
// threshold = round(p · 2^32): the drop probability is p within 2^-33.
//
// Offsets in device memory. A CUDA graph replays its kernels with the arguments they were captured
// with, so a captured pass would draw the captured masks again. A trainer that replays a pass gives
// the launches a pass_offset instead (DropoutArgs): device memory the kernels add to offset as they
// start (dropout_resolve), which the trainer rewrites before each replay (dropout_set_pass_offset).
// The counters, hence the masks, are those of the same offset given as an argument.
//
// Attention probabilities: element (bh = b·NH + h, query q, key k) uses counter index
// bh·2^42 + (q with bit 3 cleared)·2^21 + (k with bit 3 cleared) and word 2·(bit 3 of q) + (bit 3 of k):
// one Philox call covers the 2×2 group {q, q^8} × {k, k^8}. Why that group: the fp32 attention kernels
// give each lane rows r, r+4, r+8, r+12 of a 16-row block and columns c, c+8, ..., c+56 of a 64-column
// tile, the bf16/fp16 ones (mma.sync fragments) rows g, g+8 and columns c, c+8 (two adjacent 8-column
// tiles), with rows = queries in the forward and dQ kernels and rows = keys in the backward's P^T;
// {q, q^8} × {k, k^8} lies in one lane in every kernel and both orientations, so every call's 4 words are used by the lane that
// made it (a group of 4 consecutive keys would waste 3 of them). The mask does not depend on T, so
// extra padding changes no decision. Requires q, k < 2^21 and b·NH + h < 2^22.
#pragma once
#include "cuda_common.h"
#include "precision.cuh"

#include <cmath>
#include <cstdint>

// ----------------------------------------------------------------------------
// CUDA kernels

// Everything a kernel needs to decide keep/drop and scale: built on the host by dropout_args.
struct DropoutArgs {
    uint64_t seed;       // the Philox key
    uint64_t offset;     // the stream: counter words 2 and 3
    uint32_t threshold;  // keep iff the random word >= threshold = round(p * 2^32)
    float scale;         // 1 / (1 - p), rounded to fp32 once
    const uint64_t* pass_offset = nullptr;  // device memory added to offset at the kernel's start, or none
};

// The arguments a kernel decides with: offset plus *pass_offset when there is one (see the top).
__device__ inline DropoutArgs dropout_resolve(DropoutArgs d) {
    if (d.pass_offset) d.offset += __ldg(d.pass_offset);
    d.pass_offset = nullptr;
    return d;
}

// Philox4x32-10: the 4 random words of counter ctr under key `key` (Random123's philox4x32_10).
__host__ __device__ inline uint4 philox4x32_10(uint4 ctr, uint2 key) {
#pragma unroll
    for (int round = 0; round < 10; round++) {
        // High and low halves of the 32x32-bit products written separately: nvcc then emits 32-bit
        // mul.wide/mul.lo pairs (one IMAD.WIDE.U32) and 32-bit xors; a single 64-bit product kept the
        // whole round in 64-bit registers and emitted 64-bit multiplies.
        uint32_t hi0 = (uint32_t)(((uint64_t)0xD2511F53u * ctr.x) >> 32), lo0 = 0xD2511F53u * ctr.x;
        uint32_t hi1 = (uint32_t)(((uint64_t)0xCD9E8D57u * ctr.z) >> 32), lo1 = 0xCD9E8D57u * ctr.z;
        ctr = uint4{hi1 ^ ctr.y ^ key.x, lo1, hi0 ^ ctr.w ^ key.y, lo0};
        key.x += 0x9E3779B9u;  // the Weyl sequence of round keys
        key.y += 0xBB67AE85u;
    }
    return ctr;
}

// The 4 random words of counter index `index` in the stream `offset` of `seed`.
__host__ __device__ inline uint4 dropout_random4(uint64_t seed, uint64_t offset, uint64_t index) {
    return philox4x32_10(uint4{(uint32_t)index, (uint32_t)(index >> 32), (uint32_t)offset, (uint32_t)(offset >> 32)},
                         uint2{(uint32_t)seed, (uint32_t)(seed >> 32)});
}

// Word k (0..3) of r: a select chain, not an array index, so that a run-time k stays in registers.
__host__ __device__ inline uint32_t dropout_word(uint4 r, int k) {
    return k == 0 ? r.x : k == 1 ? r.y : k == 2 ? r.z : r.w;
}

// Whether element n of a hidden-state tensor is kept (the reference for the kernels below).
__host__ __device__ inline bool dropout_keep(const DropoutArgs& d, uint64_t n) {
    return dropout_word(dropout_random4(d.seed, d.offset, n / 4), (int)(n % 4)) >= d.threshold;
}

// Counter index of attention element (bh, query q, key k): its 2×2 group {q, q^8} × {k, k^8}.
__host__ __device__ inline uint64_t dropout_attention_index(uint32_t bh, int q, int k) {
    return (uint64_t)bh << 42 | (uint64_t)(q & ~8) << 21 | (uint64_t)(k & ~8);
}
// Which of the group's 4 words is element (q, k)'s: x (q, k), y (q, k^8), z (q^8, k), w (q^8, k^8) for
// q, k with bit 3 clear.
__host__ __device__ inline int dropout_attention_word(int q, int k) { return ((q >> 3) & 1) * 2 + ((k >> 3) & 1); }

// Whether the attention probability of query q for key k in head bh = b*NH + h is kept (the reference
// for the mask the attention kernels build 32 elements at a time).
__host__ __device__ inline bool dropout_attention_keep(const DropoutArgs& d, uint32_t bh, int q, int k) {
    uint4 r = dropout_random4(d.seed, d.offset, dropout_attention_index(bh, q, k));
    return dropout_word(r, dropout_attention_word(q, k)) >= d.threshold;
}

// out = residual + inp * (keep ? s : 0) (kResidual) or inp * (keep ? s : 0), for elements [i, i + P)
// of one thread, P = Packed128<T>::size (4 fp32 or 8 bf16/fp16: one or two Philox calls). With
// kResidual the dropped value is rounded to T before the add, as dropout followed by a separate
// residual add (and PyTorch in bf16) rounds it, so the fusion changes the cost and not one bit.
// kDrop = false (p = 0): no random numbers; without a residual, a bit-exact copy. One 128-bit access
// per operand when `packed` (every pointer 16-byte aligned) and the pack lies inside n, element by
// element otherwise (the tail, misaligned views). out may alias inp or residual.
template <class T, bool kDrop, bool kResidual>
__global__ void dropout_forward_kernel(T* out, const T* residual, const T* inp, size_t n, DropoutArgs d, bool packed) {
    constexpr int P = Packed128<T>::size;
    static_assert(P % 4 == 0, "a pack holds whole groups of 4 elements (one Philox call each)");
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (i >= n) return;
    if (kDrop) d = dropout_resolve(d);
    float factor[P];  // s or 0 per element (i is a multiple of 4: the pack is whole Philox groups)
    for (int g = 0; g < P / 4; g++) {
        uint4 r = kDrop ? dropout_random4(d.seed, d.offset, i / 4 + g) : uint4{};
        for (int k = 0; k < 4; k++) factor[4 * g + k] = dropout_word(r, k) >= d.threshold ? d.scale : 0.f;
    }
    auto apply = [&](int e, T x, T res) -> T {
        if (!kDrop && !kResidual) return x;
        // __fmul_rn: never contracted with the residual add into one FMA, whose single rounding would
        // differ from dropout_forward's product and residual_forward's sum.
        T dropped = kDrop ? from_float<T>(__fmul_rn(to_float(x), factor[e])) : x;
        return kResidual ? from_float<T>(to_float(res) + to_float(dropped)) : dropped;
    };
    if (packed && i + P <= n) {
        Packed128<T> x = load128cs(inp + i), res = kResidual ? load128cs(residual + i) : Packed128<T>::zeros(), o;
        for (int e = 0; e < P; e++) o[e] = apply(e, x[e], res[e]);
        store128(out + i, o);
    } else {
        for (int e = 0; e < P; e++)
            if (i + e < n) out[i + e] = apply(e, inp[i + e], kResidual ? residual[i + e] : from_float<T>(0.f));
    }
}

// ----------------------------------------------------------------------------
// kernel launchers

constexpr int kDropoutBlockSize = 256;

// The kernel arguments for drop probability p in stream `offset` (plus *pass_offset, device memory,
// when given) of `seed`; exits with a message naming `who` unless 0 <= p < 1 (p = 1 would scale by
// infinity).
inline DropoutArgs dropout_args(const char* who, float p, uint64_t seed, uint64_t offset,
                                const uint64_t* pass_offset = nullptr) {
    if (!(p >= 0.f && p < 1.f)) {
        fprintf(stderr, "%s: dropout probability p = %g must be in [0, 1)\n", who, p);
        exit(EXIT_FAILURE);
    }
    DropoutArgs d;
    d.seed = seed;
    d.offset = offset;
    d.threshold = (uint32_t)std::nearbyint((double)p * 4294967296.0);  // p <= 1 - 2^-24: at most 2^32 - 256
    d.scale = 1.f / (1.f - p);
    d.pass_offset = pass_offset;
    return d;
}

// Writes a pass's offset into device memory on the stream, for launches given it as pass_offset.
inline void dropout_set_pass_offset(uint64_t* pass_offset, uint64_t value, cudaStream_t stream) {
    set_device_scalar(pass_offset, value, stream);
}

// Launches dropout_forward_kernel over n elements, the p = 0 variant without random numbers.
template <class T, bool kResidual>
void dropout_launch(const char* who, T* out, const T* residual, const T* inp, size_t n, float p, uint64_t seed,
                    uint64_t offset, cudaStream_t stream, const uint64_t* pass_offset) {
    DropoutArgs d = dropout_args(who, p, seed, offset, pass_offset);
    if (n == 0) return;
    constexpr int P = Packed128<T>::size;
    dim3 grid((unsigned)CEIL_DIV(n, (size_t)kDropoutBlockSize * P));
    bool packed = aligned16({out, inp, kResidual ? (const void*)residual : (const void*)inp});
    auto kernel = p > 0.f ? dropout_forward_kernel<T, true, kResidual> : dropout_forward_kernel<T, false, kResidual>;
    cudaCheck(launch_kernel(kernel, grid, dim3(kDropoutBlockSize), 0, stream, out, residual, inp, n, d, packed));
}

// out = inp * keep / (1 - p) over n elements (any n, any alignment; out may equal inp), the mask
// element n's decision in stream `offset` (plus *pass_offset when given) of `seed`. p = 0: an exact
// copy (nothing to do in place).
template <class T>
void dropout_forward(T* out, const T* inp, size_t n, float p, uint64_t seed, uint64_t offset, cudaStream_t stream,
                     const uint64_t* pass_offset = nullptr) {
    if (p == 0.f && out == inp) return;
    dropout_launch<T, false>("dropout_forward", out, (const T*)nullptr, inp, n, p, seed, offset, stream, pass_offset);
}

// out = residual + dropout(inp) over n elements, in one pass: BERT's hidden-state dropout before each
// post-LN residual add (projection and MLP outputs). Bit-identical to dropout_forward followed by
// residual_forward (llmc/layernorm.cuh). out may equal residual or inp.
template <class T>
void dropout_residual_forward(T* out, const T* residual, const T* inp, size_t n, float p, uint64_t seed,
                              uint64_t offset, cudaStream_t stream, const uint64_t* pass_offset = nullptr) {
    dropout_launch<T, true>("dropout_residual_forward", out, residual, inp, n, p, seed, offset, stream, pass_offset);
}

// dinp = dout * keep / (1 - p): the gradient through dropout (or through dropout_residual_forward's
// inp; its residual's gradient is dout itself), the forward's mask regenerated from (seed, offset,
// pass_offset), which must give the forward call's stream. dinp may equal dout.
template <class T>
void dropout_backward(T* dinp, const T* dout, size_t n, float p, uint64_t seed, uint64_t offset, cudaStream_t stream,
                      const uint64_t* pass_offset = nullptr) {
    if (p == 0.f && dinp == dout) return;
    dropout_launch<T, false>("dropout_backward", dinp, (const T*)nullptr, dout, n, p, seed, offset, stream, pass_offset);
}
