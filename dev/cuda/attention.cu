// dev/cuda/attention.cu — multi-head attention forward and backward: each variant against a CPU
// reference (double), then timed (TFLOP/s).
//
// Variants:
//   1           naive kernels, one thread per score: the (B,NH,T,T) scores and probabilities in global
//               memory, fp32 math, no dropout
//   2           (bf16/fp16) flash attention on WMMA: llmc/attention.cuh's fp32 kernels with their
//               tile products on tensor cores through the WMMA API (AttnWmmaMath below). WMMA hides
//               which lane holds which accumulator element, so every row-wise step (softmax max and
//               sum, masks, the rescale of O) stores the 16×64 score tile to shared memory and reads it
//               back in a known layout; the backward runs a dK/dV kernel and a separate dQ kernel, 7
//               tile products per tile pair. The simpler form of the production kernels.
//   3           (bf16/fp16, forward, head sizes <= 64) the production forward with two 16-row tiles of
//               queries per warp (blocks of 128 queries) instead of one: every K and V fragment read
//               from shared memory then feeds two mma instead of one, registers capped for 2 resident
//               blocks per SM. Timed beside production (on an H100 it was 9% slower under a causal
//               mask, 3 to 4% faster without one).
//   4           (bf16/fp16, backward, no dropout) the production backward kernel with one block per
//               key tile, adding its dQ rows by float atomics into one fp32 buffer (FlashAttention-2's
//               way; dQ's last bits then depend on timing), and the reduce kernel over that buffer.
//               On an H100 8 to 18% slower than production's slices.
//   5           (bf16/fp16, forward, no dropout) production's forward with its registers capped for 2
//               resident blocks per SM (146 registers: 3 blocks) instead of 4 (128): on an H100 3 to
//               5% slower. (The backward capped for 3 blocks instead of 2, 168 registers instead of
//               230, spills, which the nvcc checks refuse; on an H100 it ran 2 to 7% slower.)
//   6           (bf16/fp16, backward, HS = 64, no dropout, where production takes wgmma: sm_90a)
//               the backward on mma.sync, attention_backward_mma_kernel, which production takes
//               elsewhere: what Hopper's warpgroup MMA buys. Validated and timed only where
//               wgmma_supported(), the sweep's head-size-64 shapes included ("mma-sweep" lines). On an
//               H200, 128 TFLOP/s against production's 144 at GPT-2 124M's shape.
//   7           (bf16/fp16, backward, HS = 64, no dropout, sm_90a) production's wgmma backward with each
//               query tile's dQ product run behind the next tile's Sᵀ and dPᵀ, and its rows added to
//               the dQ slice while that tile's dV and dK products run, instead of all waiting for the
//               product (AttnWgmmaTile's kDeferDq: attention_backward_wgmma_defer_dq; one barrier less
//               per tile, 213 registers instead of 180; the same bits). On an H200 1 to 2% slower at
//               the timed shapes, and GPT-2 124M's step no faster. Validated and timed where
//               wgmma_supported() ("defer-sweep" lines over the sweep's head-size-64 shapes).
//   8           (bf16/fp16, forward, HS = 64, no dropout, sm_90a) attention_forward_wgmma_kernel: the
//               forward on Hopper's warpgroup MMA, S = Q Kᵀ and O += P V as chains of 4 wgmma over
//               128-byte swizzled tiles (P from the accumulators into A registers), the online softmax
//               of production's; 111 registers, 4 blocks per SM. Off in production
//               (attention_forward_wgmma) until timed here; validated and timed where wgmma_supported()
//               ("wgmma-fwd-sweep" lines: its forward, and forward+backward with production's backward).
//   9           (bf16/fp16, backward, HS = 64, no dropout, sm_90a) production's wgmma backward with its
//               registers capped for 3 resident blocks per SM instead of 2 (168 registers instead of
//               180, no spills: attention_backward_wgmma_blocks; the same bits): 12 warps per SM to
//               hide the waits on its products, its barriers and its dQ rows' round trips, where one
//               block's warpgroup does everything in turn. Off in production until timed; validated
//               and timed where wgmma_supported() ("wgmma3-sweep" lines).
//   10, 11      (bf16/fp16, backward, HS = 64, no dropout, sm_90a) production's wgmma backward, and
//               variant 9, adding each query tile's dQ rows to the slice by reductions in L2
//               (red.global.add.v2.f32, attention_backward_wgmma_red_dq: 16 instructions per thread
//               that nothing waits for, where production loads the rows, waits, adds and stores; the
//               same bits). Off in production until timed; validated and timed where
//               wgmma_supported() ("wgmma-red-sweep", "wgmma3-red-sweep" lines).
//   12, 13      (bf16/fp16, backward, HS = 64, no dropout, sm_90a) production's wgmma backward, and
//               variant 11, summing each query tile's dQ from its slices in the block that adds the
//               tile's last contribution (a counter per tile: atomic_add_release, and the last one
//               acquires), instead of in attention_backward_dq_reduce_kernel after it: the slices read
//               while fresh in L2 instead of from DRAM (400 MB a layer at GPT-2 124M's B = 16), a launch
//               less (attention_backward_sum_dq; the same bits). Off in production until timed;
//               validated and timed where wgmma_supported() ("wgmma-sum-sweep",
//               "wgmma3-red-sum-sweep" lines).
//   14          (bf16/fp16, backward, HS = 64) the mma.sync backward (production's off Hopper) summing
//               dQ's slices itself as variant 12 does (attention_backward_sum_dq; the same bits):
//               253 registers on sm_90a, 240 on sm_80, 2 blocks per SM. Off in production until timed;
//               validated and timed at HS = 64 on every device ("mma-sum-sweep" lines where
//               wgmma_supported(), beside variant 6's).
// The production backward is also timed with each number of dQ slices the shape allows (its blocks
// per head; production picks attention_dq_splits).
//   production  llmc/attention.cuh, flash attention; for bf16/fp16 the FlashAttention-2 kernels on
//               mma.sync m16n8k16: S, P and the softmax statistics in registers (known fragment
//               layouts: quad shuffles instead of the round trips), Q's fragments in registers for the
//               whole pass, ldmatrix fragment loads, K/V (Q/dO) tiles double-buffered by cp.async, and
//               a backward of 5 products per tile pair with dQ summed from per-block slices. Where
//               the device has Hopper's warpgroup MMA (sm_90a) the backward at HS = 64 without
//               dropout is attention_backward_wgmma_kernel: the same 5 products on wgmma
//               (llmc/wgmma.cuh), every tile 128-byte swizzled in shared memory, Pᵀ and dSᵀ from the
//               accumulators into A registers, the same dQ slices.
//               Faster than variant 1, which writes the scores, reads them back for the softmax, writes
//               P and reads it again for P V (the backward adds dP and dS): O(B·NH·T²) bytes of DRAM
//               traffic, several times, against 4·B·NH·T²·HS FLOPs — at HS = 64 about 8 FLOPs per byte,
//               far below the ~300 an H100's tensor cores need, so it runs at DRAM speed and needs
//               B·NH·T² floats per buffer (400 MB at B=8, NH=12, T=1024). Flash attention keeps each
//               tile of scores on chip: its traffic is O(B·NH·T·HS) per pass over the keys, it skips
//               the tiles above the causal diagonal or in padding, and its products run on tensor
//               cores.
// Dropout on P is validated for the flash kernels only: the reference takes its mask from
// dropout_attention_keep, the host twin of what the kernels regenerate.
//
// Build and run: make build/cpu/dev_attention && build/cpu/dev_attention    (CPU backend)
//                make build/gpu/dev_attention && build/gpu/dev_attention    (GPU, nvcc)
// Prints a PASS/FAIL line per checked output and variant (the exit code says whether all passed),
// then times each variant at one shape, then llmc's kernels over FlashAttention-2's benchmark shapes
// ("sweep" lines, which make gpu-check collects; dev/cuda/README.md).
// With --profile it only runs llmc's bf16 forward and backward once at GPT-2 124M's shape (causal),
// after a warm-up, between cudaProfilerStart and cudaProfilerStop: for a profiler started with
// collection off (make gpu-check: ncu --profile-from-start off, its throughput, occupancy and stall
// sections).
#include "../../llmc/attention.cuh"
#include "../../llmc/mfu.h"
#include "../../test/harness.h"
#include "common.h"

#include <cuda_profiler_api.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

// ----------------------------------------------------------------------------
// CPU reference (double): out, lse and dqkv for the layout of llmc/attention.cuh

struct Shape {
    int B, T, C, NH;
    bool causal;
    std::vector<int> valid;  // empty: no padding
    float dropout = 0.f;     // drop probability of P (seed kDropSeed, offset kDropOffset)
    int HS() const { return C / NH; }
    int valid_of(int b) const { return valid.empty() ? T : std::min(std::max(valid[b], 0), T); }
};

constexpr uint64_t kDropSeed = 77, kDropOffset = 3;

// With dropout, P_ij is multiplied by M_ij / (1-p), M from dropout_attention_keep (the mask the kernels
// regenerate), in out, dV and dP (FlashAttention's semantics; lse and D as without dropout, D from the
// dropped out).
void attention_cpu(std::vector<double>& out, std::vector<double>& lse, std::vector<double>& dqkv,
                   const std::vector<float>& qkv, const std::vector<float>& dout, const Shape& s) {
    const int B = s.B, T = s.T, C = s.C, NH = s.NH, HS = s.HS();
    const double scale = 1.0 / std::sqrt((double)HS);
    const DropoutArgs drop = dropout_args("attention_cpu", s.dropout, kDropSeed, kDropOffset);
    auto mask = [&](int b, int h, int i, int j) {
        return s.dropout == 0 || dropout_attention_keep(drop, b * NH + h, i, j) ? 1 / (1 - (double)s.dropout) : 0.0;
    };
    out.assign((size_t)B * T * C, 0);
    lse.assign((size_t)B * NH * T, 0);
    dqkv.assign((size_t)B * T * 3 * C, 0);
    std::vector<double> p(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            auto at = [&](int t, int part, int d) { return ((size_t)b * T + t) * 3 * C + part * C + h * HS + d; };
            auto x = [&](int t, int part, int d) { return (double)qkv[at(t, part, d)]; };
            auto g = [&](int t, int d) { return (double)dout[((size_t)b * T + t) * C + h * HS + d]; };
            auto dx = [&](int t, int part, int d) -> double& { return dqkv[at(t, part, d)]; };
            int valid = s.valid_of(b);
            for (int i = 0; i < valid; i++) {
                int nk = s.causal ? i + 1 : valid;
                double m = -INFINITY, sum = 0;
                for (int j = 0; j < nk; j++) {
                    double dot = 0;
                    for (int d = 0; d < HS; d++) dot += x(i, 0, d) * x(j, 1, d);
                    m = std::max(m, p[j] = dot * scale);
                }
                for (int j = 0; j < nk; j++) sum += p[j] = std::exp(p[j] - m);
                lse[((size_t)b * NH + h) * T + i] = m + std::log(sum);
                std::vector<double> md(nk);
                for (int j = 0; j < nk; j++) md[j] = mask(b, h, i, j);
                double D = 0;
                for (int d = 0; d < HS; d++) {
                    double o = 0;
                    for (int j = 0; j < nk; j++) o += p[j] / sum * md[j] * x(j, 2, d);
                    out[((size_t)b * T + i) * C + h * HS + d] = o;
                    D += o * g(i, d);
                }
                for (int j = 0; j < nk; j++) {
                    double pj = p[j] / sum, dp = 0;
                    for (int d = 0; d < HS; d++) dp += g(i, d) * x(j, 2, d);
                    double ds = pj * (md[j] * dp - D) * scale;
                    for (int d = 0; d < HS; d++) {
                        dx(i, 0, d) += ds * x(j, 1, d);
                        dx(j, 1, d) += ds * x(i, 0, d);
                        dx(j, 2, d) += pj * md[j] * g(i, d);
                    }
                }
            }
        }
}

// ----------------------------------------------------------------------------
// Variant 1: naive kernels, the (B,NH,T,T) scores / probabilities in global memory, fp32 math.

// att[b,h,i,j] = q_i·k_j / sqrt(HS), -inf where masked. One thread per score.
template <class floatX>
__global__ void naive_scores_kernel(float* att, const floatX* qkv, int B, int T, int C, int NH, bool causal,
                                    const int* valid_len) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * NH * T * T) return;
    int j = idx % T, i = (idx / T) % T, h = (idx / ((size_t)T * T)) % NH, b = idx / ((size_t)NH * T * T);
    int HS = C / NH, valid = attn_valid_length(valid_len, b, T);
    const floatX* q = qkv + ((size_t)b * T + i) * 3 * C + h * HS;
    const floatX* k = qkv + ((size_t)b * T + j) * 3 * C + C + h * HS;
    float dot = 0.f;
    for (int d = 0; d < HS; d++) dot += to_float(q[d]) * to_float(k[d]);
    bool keep = i < valid && j < valid && (!causal || j <= i);
    att[idx] = keep ? dot * rsqrtf((float)HS) : -INFINITY;
}

// Softmax of each row of att in place, and its logsumexp (if lse is not null); rows with every
// score masked (padded queries) become zeros with lse 0. One warp per row.
__global__ void naive_softmax_kernel(float* att, float* lse, int rows, int T) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    float* a = att + (size_t)row * T;
    float m = -INFINITY;
    for (int j = lane; j < T; j += 32) m = fmaxf(m, a[j]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float sum = 0.f;
    for (int j = lane; j < T; j += 32) sum += m == -INFINITY ? 0.f : expf(a[j] - m);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    for (int j = lane; j < T; j += 32) a[j] = m == -INFINITY ? 0.f : expf(a[j] - m) / sum;
    if (lse && lane == 0) lse[row] = m == -INFINITY ? 0.f : m + logf(sum);
}

// out[b,i,h,:] = sum_j P[b,h,i,j] v_j. One thread per output element.
template <class floatX>
__global__ void naive_pv_kernel(floatX* out, const float* att, const floatX* qkv, int B, int T, int C, int NH) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * C) return;
    int c = idx % C, i = (idx / C) % T, b = idx / ((size_t)C * T), HS = C / NH, h = c / HS;
    const float* p = att + (((size_t)b * NH + h) * T + i) * T;
    const floatX* v = qkv + (size_t)b * T * 3 * C + 2 * C + c;
    float o = 0.f;
    for (int j = 0; j < T; j++) o += p[j] * to_float(v[(size_t)j * 3 * C]);
    out[idx] = from_float<floatX>(o);
}

// dP[b,h,i,j] = dO_i·v_j. One thread per element.
template <class floatX>
__global__ void naive_dp_kernel(float* dp, const floatX* dout, const floatX* qkv, int B, int T, int C, int NH) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * NH * T * T) return;
    int j = idx % T, i = (idx / T) % T, h = (idx / ((size_t)T * T)) % NH, b = idx / ((size_t)NH * T * T);
    int HS = C / NH;
    const floatX* g = dout + ((size_t)b * T + i) * C + h * HS;
    const floatX* v = qkv + ((size_t)b * T + j) * 3 * C + 2 * C + h * HS;
    float dot = 0.f;
    for (int d = 0; d < HS; d++) dot += to_float(g[d]) * to_float(v[d]);
    dp[idx] = dot;
}

// dS = P ∘ (dP - rowsum(P ∘ dP)) in place of dP, times the score scale. One warp per row.
__global__ void naive_ds_kernel(float* dp, const float* att, int rows, int T, float scale) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    float* g = dp + (size_t)row * T;
    const float* p = att + (size_t)row * T;
    float D = 0.f;
    for (int j = lane; j < T; j += 32) D += p[j] * g[j];
    for (int o = 16; o > 0; o >>= 1) D += __shfl_xor_sync(0xffffffffu, D, o);
    for (int j = lane; j < T; j += 32) g[j] = p[j] * (g[j] - D) * scale;
}

// dq_t = sum_u dS[t,u] k_u, dk_t = sum_u dS[u,t] q_u, dv_t = sum_u P[u,t] dO_u. One thread per
// element of dqkv.
template <class floatX>
__global__ void naive_grad_kernel(floatX* dqkv, const float* ds, const float* att, const floatX* qkv,
                                  const floatX* dout, int B, int T, int C, int NH) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * 3 * C) return;
    int col = idx % (3 * C), t = (idx / (3 * C)) % T, b = idx / ((size_t)3 * C * T);
    int part = col / C, c = col % C, HS = C / NH, h = c / HS;
    const float* S = (part == 2 ? att : ds) + ((size_t)b * NH + h) * T * T;
    const floatX* base = qkv + (size_t)b * T * 3 * C;
    float acc = 0.f;
    for (int u = 0; u < T; u++) {
        if (part == 0) acc += S[(size_t)t * T + u] * to_float(base[(size_t)u * 3 * C + C + c]);
        if (part == 1) acc += S[(size_t)u * T + t] * to_float(base[(size_t)u * 3 * C + c]);
        if (part == 2) acc += S[(size_t)u * T + t] * to_float(dout[((size_t)b * T + u) * C + c]);
    }
    dqkv[idx] = from_float<floatX>(acc);
}

// Scratch of variant 1: two (B,NH,T,T) fp32 buffers.
size_t attention1_scratch_bytes(int B, int T, int NH) { return 2 * (size_t)B * NH * T * T * sizeof(float); }

template <class floatX>
void attention_forward1(floatX* out, float* lse, const floatX* qkv, void* scratch, int B, int T, int C, int NH,
                        bool causal, const int* valid_len, cudaStream_t stream) {
    float* att = static_cast<float*>(scratch);
    size_t n_att = (size_t)B * NH * T * T;
    cudaCheck(launch_kernel(naive_scores_kernel<floatX>, dim3(CEIL_DIV(n_att, 256)), dim3(256), 0, stream, att, qkv, B,
                            T, C, NH, causal, valid_len));
    cudaCheck(launch_kernel(naive_softmax_kernel, dim3(CEIL_DIV(B * NH * T, 8)), dim3(256), 0, stream, att, lse,
                            B * NH * T, T));
    cudaCheck(launch_kernel(naive_pv_kernel<floatX>, dim3(CEIL_DIV((size_t)B * T * C, 256)), dim3(256), 0, stream, out,
                            (const float*)att, qkv, B, T, C, NH));
}

// Recomputes P with the forward (into the first scratch buffer) and derives the gradients.
template <class floatX>
void attention_backward1(floatX* dqkv, const floatX* dout, const floatX* qkv, void* scratch, int B, int T, int C,
                         int NH, bool causal, const int* valid_len, cudaStream_t stream) {
    float* att = static_cast<float*>(scratch);
    float* dp = att + (size_t)B * NH * T * T;
    size_t n_att = (size_t)B * NH * T * T;
    cudaCheck(launch_kernel(naive_scores_kernel<floatX>, dim3(CEIL_DIV(n_att, 256)), dim3(256), 0, stream, att, qkv, B,
                            T, C, NH, causal, valid_len));
    cudaCheck(launch_kernel(naive_softmax_kernel, dim3(CEIL_DIV(B * NH * T, 8)), dim3(256), 0, stream, att,
                            (float*)nullptr, B * NH * T, T));
    cudaCheck(launch_kernel(naive_dp_kernel<floatX>, dim3(CEIL_DIV(n_att, 256)), dim3(256), 0, stream, dp, dout, qkv, B,
                            T, C, NH));
    cudaCheck(launch_kernel(naive_ds_kernel, dim3(CEIL_DIV(B * NH * T, 8)), dim3(256), 0, stream, dp, (const float*)att,
                            B * NH * T, T, 1.f / std::sqrt((float)(C / NH))));
    cudaCheck(launch_kernel(naive_grad_kernel<floatX>, dim3(CEIL_DIV((size_t)B * T * 3 * C, 256)), dim3(256), 0, stream,
                            dqkv, (const float*)dp, (const float*)att, qkv, dout, B, T, C, NH));
}

// ----------------------------------------------------------------------------
// Variant 2 (bf16/fp16): flash attention with WMMA tile products (llmc's fp32 kernels, another Math)

// The tile products of variant 2 on tensor cores (WMMA m16n16k16, fp32 accumulate): the Math policy
// of llmc/attention.cuh's CUDA-core kernels (AttnSimtMath's interface). Accumulators are fragments,
// whose element-to-lane mapping is opaque, so row-wise steps go through the warp's scratch.
template <class floatX, int HS>
struct AttnWmmaMath {
    using Tile = AttnTile<floatX, HS>;
    using FragA = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, floatX, nvcuda::wmma::row_major>;
    using FragB = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, floatX, nvcuda::wmma::row_major>;
    // B^T read from a row-major B: a col_major matrix_b fragment.
    using FragBt = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, floatX, nvcuda::wmma::col_major>;
    using FragC = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;
    // A (16, HS) accumulator: one 16×16 fragment per 16 columns.
    struct Acc {
        FragC f[HS / 16];
    };

    __device__ static void zero(Acc& acc) {
        for (int n = 0; n < HS / 16; n++) nvcuda::wmma::fill_fragment(acc.f[n], 0.f);
    }

    // Computes the warp's (16, 64) tile of A B^T and calls visit(i, j, value) for this lane's elements
    // (see AttnSimtMath::scores), through the warp's scratch. Visiting element by element lets the
    // compiler load each value from the scratch where it is used: the backward kernels hold two
    // (16, HS) accumulators and a score tile, and at HS = 128 one more tile in registers would spill.
    // For the same reason the A fragments are kept in registers across the 4 column blocks only up
    // to HS = 64, and reloaded from shared memory for each block at HS = 128.
    template <class Visit>
    __device__ static void scores(const floatX* A, const floatX* B, float* scratch, Visit visit) {
        constexpr bool kKeepA = HS <= 64;
        FragA a[kKeepA ? HS / 16 : 1];
        if (kKeepA)
            for (int k = 0; k < HS / 16; k++) nvcuda::wmma::load_matrix_sync(a[k], A + 16 * k, Tile::kLd);
        for (int n = 0; n < Tile::kCols / 16; n++) {
            FragC c;
            nvcuda::wmma::fill_fragment(c, 0.f);
            for (int k = 0; k < HS / 16; k++) {
                if (!kKeepA) nvcuda::wmma::load_matrix_sync(a[0], A + 16 * k, Tile::kLd);
                FragBt b;
                nvcuda::wmma::load_matrix_sync(b, B + 16 * n * Tile::kLd + 16 * k, Tile::kLd);
                nvcuda::wmma::mma_sync(c, a[kKeepA ? k : 0], b, c);
            }
            nvcuda::wmma::store_matrix_sync(scratch + 16 * n, c, Tile::kLdX, nvcuda::wmma::mem_row_major);
        }
        __syncwarp();
        int lane = threadIdx.x % 32, rg = lane / 8, cg = lane % 8;
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 8; j++) visit(i, j, scratch[(rg + 4 * i) * Tile::kLdX + cg + 8 * j]);
        __syncwarp();  // everyone has read the scratch before it is written again
    }

    // acc += X Y, X the warp's (16, 64) tile (row stride kLdP), Y a (64, HS) tile (row stride kLd).
    __device__ static void accumulate(Acc& acc, const floatX* X, const floatX* Y) {
        for (int k = 0; k < Tile::kCols / 16; k++) {
            FragA x;
            nvcuda::wmma::load_matrix_sync(x, X + 16 * k, Tile::kLdP);
            for (int n = 0; n < HS / 16; n++) {
                FragB y;
                nvcuda::wmma::load_matrix_sync(y, Y + 16 * k * Tile::kLd + 16 * n, Tile::kLd);
                nvcuda::wmma::mma_sync(acc.f[n], x, y, acc.f[n]);
            }
        }
    }

    // Multiplies accumulator row rg + 4*i by f[i] through the scratch; skipped (exactly: the factors
    // are all 1) when no lane of the warp has a factor other than 1.
    __device__ static void scale_rows(Acc& acc, const float (&f)[4], float* scratch) {
        bool needed = f[0] != 1.f || f[1] != 1.f || f[2] != 1.f || f[3] != 1.f;
        if (!__any_sync(0xffffffffu, needed)) return;
        store(acc, scratch);
        __syncwarp();
        int lane = threadIdx.x % 32, rg = lane / 8, cg = lane % 8;
        for (int i = 0; i < 4; i++)
            for (int c = cg; c < HS; c += 8) scratch[(rg + 4 * i) * Tile::kLdX + c] *= f[i];
        __syncwarp();
        for (int n = 0; n < HS / 16; n++)
            nvcuda::wmma::load_matrix_sync(acc.f[n], scratch + 16 * n, Tile::kLdX, nvcuda::wmma::mem_row_major);
    }

    // Writes the accumulator to the warp's (16, HS) fp32 scratch (row stride kLdX).
    __device__ static void store(const Acc& acc, float* scratch) {
        for (int n = 0; n < HS / 16; n++)
            nvcuda::wmma::store_matrix_sync(scratch + 16 * n, acc.f[n], Tile::kLdX, nvcuda::wmma::mem_row_major);
    }
};

// Calls f(std::integral_constant<int, HS>) for a run-time head size of attention_check_shape's list.
template <class F>
void with_head_size(int HS, F f) {
    switch (HS) {
        case 16: f(std::integral_constant<int, 16>()); break;
        case 32: f(std::integral_constant<int, 32>()); break;
        case 64: f(std::integral_constant<int, 64>()); break;
        default: f(std::integral_constant<int, 128>()); break;
    }
}

// Variant 2's forward: 4-warp blocks where the device allows them, else the compact ones.
template <class floatX>
void attention_forward2(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH, bool causal,
                        const int* valid_len, cudaStream_t stream, const AttentionDropout& dropout = {}) {
    int HS = attention_check_shape("attention_forward2", B, T, C, NH, {out, qkv});
    DropoutArgs d = attention_dropout_args("attention_forward2", dropout, B, T, NH);
    with_head_size(HS, [&](auto hs) {
        constexpr int kHS = decltype(hs)::value;
        using Math = AttnWmmaMath<floatX, kHS>;
        auto blocks = attn_launch_shape<floatX, kHS>("attention_forward2", false).warps == 4
                          ? attention_forward_blocks<floatX, kHS, 4, Math>
                          : attention_forward_blocks<floatX, kHS, attn_compact_warps<floatX, kHS>(), Math>;
        blocks(out, lse, qkv, B, T, C, NH, causal, valid_len, d, dropout.p > 0.f, stream);
    });
}

// Variant 3: llmc's 16-bit forward with two 16-row query tiles per warp (production takes one), so
// that each K and V fragment read from shared memory feeds two mma: a block of 128 queries. HS <= 64.
template <class floatX>
void attention_forward3(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH, bool causal,
                        const int* valid_len, cudaStream_t stream, const AttentionDropout& dropout = {}) {
    int HS = attention_check_shape("attention_forward3", B, T, C, NH, {out, qkv});
    DropoutArgs d = attention_dropout_args("attention_forward3", dropout, B, T, NH);
    with_head_size(HS, [&](auto hs) {
        constexpr int kHS = decltype(hs)::value;
        if constexpr (kHS <= 64) {
            attention_forward_mma<floatX, kHS, 2, 2>(out, lse, qkv, B, T, C, NH, causal, valid_len, d, dropout.p > 0.f,
                                                  stream);
        } else {  // two (16, 128) output accumulators do not fit the registers
            fprintf(stderr, "attention_forward3: head size %d: two row tiles per warp need HS <= 64\n", kHS);
            exit(EXIT_FAILURE);
        }
    });
}

// Variant 2's backward: D = rowsum(dO ∘ O) into scratch (the first B·NH·T floats of
// attention_backward_scratch_bytes), then the dK/dV and dQ kernels.
template <class floatX>
void attention_backward2(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                         void* scratch, int B, int T, int C, int NH, bool causal, const int* valid_len,
                         cudaStream_t stream, const AttentionDropout& dropout = {}) {
    int HS = attention_check_shape("attention_backward2", B, T, C, NH, {dqkv, dout, qkv, out});
    DropoutArgs d = attention_dropout_args("attention_backward2", dropout, B, T, NH);
    float* D = static_cast<float*>(scratch);
    with_head_size(HS, [&](auto hs) {
        constexpr int kHS = decltype(hs)::value;
        using Math = AttnWmmaMath<floatX, kHS>;
        attention_backward_preprocess<floatX, kHS>(D, dout, out, B, T, C, NH, valid_len, stream);
        auto blocks = attn_launch_shape<floatX, kHS>("attention_backward2", true).warps == 4
                          ? attention_backward_blocks<floatX, kHS, 4, Math>
                          : attention_backward_blocks<floatX, kHS, attn_compact_warps<floatX, kHS>(), Math>;
        blocks(dqkv, dout, qkv, lse, D, B, T, C, NH, causal, valid_len, d, dropout.p > 0.f, stream);
    });
}

// Variant 4 (16-bit, no dropout): the production backward kernel with one block per key tile and its
// dQ rows added by float atomics into one fp32 buffer (FlashAttention-2's way), then the reduce kernel
// over that one slice (scale, round to floatX). More blocks and no slices to write back, but the order
// of the adds, and so dQ's last bits, depends on timing. Scratch as attention_backward's.
template <class floatX>
void attention_backward4(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                         void* scratch, int B, int T, int C, int NH, bool causal, const int* valid_len,
                         cudaStream_t stream) {
    int HS = attention_check_shape("attention_backward4", B, T, C, NH, {dqkv, dout, qkv, out});
    float* D = static_cast<float*>(scratch);
    float* dq = reinterpret_cast<float*>(static_cast<char*>(scratch) + attention_dq_part_offset(B, T, NH));
    with_head_size(HS, [&](auto hs) {
        constexpr int kHS = decltype(hs)::value;
        using Tile = AttnMmaTile<floatX, kHS>;
        attention_backward_preprocess<floatX, kHS>(D, dout, out, B, T, C, NH, valid_len, stream);
        cudaCheck(cudaMemsetAsync(dq, 0, (size_t)B * T * C * sizeof(float), stream));
        auto kernel = attention_backward_mma_kernel<floatX, kHS, false, true>;
        reserve_dynamic_smem(kernel, Tile::kBackwardSmem, "attention_backward4", "HS", kHS);
        cudaCheck(launch_kernel(kernel, dim3(CEIL_DIV(T, Tile::kRows), NH, B), dim3(Tile::kThreads),
                                Tile::kBackwardSmem, stream, dqkv, dq, (int*)nullptr, dout, qkv, lse, D, T, C, NH, causal,
                                valid_len, DropoutArgs{}));
        const size_t n = (size_t)B * T * NH * (kHS / Packed128<floatX>::size);
        cudaCheck(launch_kernel(attention_backward_dq_reduce_kernel<floatX, kHS>, dim3((unsigned)CEIL_DIV(n, 256)),
                                dim3(256), 0, stream, dqkv, dq, B, T, C, NH, 1, causal, valid_len));
    });
}

// Variant 5 (16-bit, no dropout): production's forward with its registers capped for 2 resident blocks
// per SM (__launch_bounds__; 146 registers, so 3 blocks) instead of production's 4 (128 registers).
template <class floatX>
void attention_forward5(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH, bool causal,
                        const int* valid_len, cudaStream_t stream) {
    int HS = attention_check_shape("attention_forward5", B, T, C, NH, {out, qkv});
    with_head_size(HS, [&](auto hs) {
        constexpr int kHS = decltype(hs)::value;
        attention_forward_mma<floatX, kHS, AttnMmaTile<floatX, kHS>::kFwdTiles, 2>(out, lse, qkv, B, T, C, NH, causal,
                                                                                   valid_len, DropoutArgs{}, false,
                                                                                   stream);
    });
}

// Variant 6 (16-bit, HS = 64, no dropout, sm_90a): attention_backward with its mma.sync kernel (any
// device: variant 14 takes it too).
template <class floatX>
void attention_backward6(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                         void* scratch, int B, int T, int C, int NH, bool causal, const int* valid_len,
                         cudaStream_t stream) {
    const bool saved = attention_backward_wgmma();
    attention_backward_wgmma() = false;
    attention_backward(dqkv, dout, qkv, out, lse, scratch, B, T, C, NH, causal, valid_len, stream);
    attention_backward_wgmma() = saved;
}

// Variant 14 (16-bit, HS = 64): attention_backward with its mma.sync kernel summing dQ's slices itself.
template <class floatX>
void attention_backward14(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                          void* scratch, int B, int T, int C, int NH, bool causal, const int* valid_len,
                          cudaStream_t stream) {
    const bool saved = attention_backward_sum_dq();
    attention_backward_sum_dq() = true;
    attention_backward6(dqkv, dout, qkv, out, lse, scratch, B, T, C, NH, causal, valid_len, stream);
    attention_backward_sum_dq() = saved;
}

// Variants 7 and 9 to 13 (16-bit, HS = 64, no dropout, sm_90a): attention_backward with its wgmma
// kernel deferring dQ (`defer`, variant 7) or adding it at once, its registers capped for `blocks` (2
// or 3) blocks per SM, with `red` its dQ rows added by reductions in L2, with `sum` its dQ slices summed
// by each query tile's last writer.
template <class floatX>
void attention_backward_wgmma_as(bool defer, int blocks, bool red, bool sum, floatX* dqkv, const floatX* dout,
                                 const floatX* qkv, const floatX* out, const float* lse, void* scratch, int B, int T,
                                 int C, int NH, bool causal, const int* valid_len, cudaStream_t stream) {
    const bool saved = attention_backward_wgmma(), saved_defer = attention_backward_wgmma_defer_dq(),
               saved_red = attention_backward_wgmma_red_dq(), saved_sum = attention_backward_sum_dq();
    const int saved_blocks = attention_backward_wgmma_blocks();
    attention_backward_wgmma() = true;
    attention_backward_wgmma_defer_dq() = defer;
    attention_backward_wgmma_blocks() = blocks;
    attention_backward_wgmma_red_dq() = red;
    attention_backward_sum_dq() = sum;
    attention_backward(dqkv, dout, qkv, out, lse, scratch, B, T, C, NH, causal, valid_len, stream);
    attention_backward_wgmma() = saved;
    attention_backward_wgmma_defer_dq() = saved_defer;
    attention_backward_wgmma_blocks() = saved_blocks;
    attention_backward_wgmma_red_dq() = saved_red;
    attention_backward_sum_dq() = saved_sum;
}

// Variants 9 to 13: variant number, label, blocks per SM, dQ by reductions, dQ summed by the tiles' last
// writers, sweep tag.
struct WgmmaBackwardVariant {
    int number;
    const char* label;
    int blocks;
    bool red, sum;
    const char* tag;
};
constexpr WgmmaBackwardVariant kWgmmaBackwardVariants[] = {
    {9, "flash on wgmma, registers for 3 blocks per SM", 3, false, false, "wgmma3"},
    {10, "flash on wgmma, dQ by reductions in L2", 2, true, false, "wgmma-red"},
    {11, "flash on wgmma, 3 blocks per SM, dQ by reductions", 3, true, false, "wgmma3-red"},
    {12, "flash on wgmma, dQ summed by the tiles' last writers", 2, false, true, "wgmma-sum"},
    {13, "flash on wgmma, 3 blocks per SM, dQ by reductions, summed by the last writers", 3, true, true,
     "wgmma3-red-sum"},
};

// Variant 8 (16-bit, HS = 64, no dropout, sm_90a): attention_forward with its wgmma kernel.
template <class floatX>
void attention_forward8(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH, bool causal,
                        const int* valid_len, cudaStream_t stream) {
    const bool saved = attention_forward_wgmma();
    attention_forward_wgmma() = true;
    attention_forward(out, lse, qkv, B, T, C, NH, causal, valid_len, stream);
    attention_forward_wgmma() = saved;
}

// ----------------------------------------------------------------------------
// Validation

// Every variant against the double reference. Tolerances: |out - ref| <= k eps (|ref| + max|ref|):
// fp32 sums of T terms of HS-long products, k = 2 (T + HS) + 16 (the derivation, and a sharper
// per-element budget, are in test/test_attention.cu); bf16 and fp16 add the rounding of P, dS and
// the outputs: k = 8 with the type's eps (the max|ref| term absorbs cancellation in dq and dk, and
// fp16's absolute rounding below its normal range, at most 2^-25 per P or dS).
template <class floatX>
void validate(const Shape& s, uint64_t seed) {
    const int B = s.B, T = s.T, C = s.C, NH = s.NH;
    const bool lowp = !std::is_same<floatX, float>::value;
    std::vector<float> qkv((size_t)B * T * 3 * C), dout((size_t)B * T * C);
    th::fill_uniform(qkv.data(), qkv.size(), seed, -2.f, 2.f);
    th::fill_uniform(dout.data(), dout.size(), seed + 1, -1.f, 1.f);
    std::vector<floatX> qkv_x(qkv.size()), dout_x(dout.size());
    for (size_t i = 0; i < qkv.size(); i++) qkv[i] = to_float(qkv_x[i] = from_float<floatX>(qkv[i]));
    for (size_t i = 0; i < dout.size(); i++) dout[i] = to_float(dout_x[i] = from_float<floatX>(dout[i]));
    std::vector<double> out_ref, lse_ref, dqkv_ref;
    attention_cpu(out_ref, lse_ref, dqkv_ref, qkv, dout, s);

    double k = lowp ? 8 : 2 * (T + s.HS()) + 16, eps = lowp ? dtype_eps<floatX>() : th::EPS_FP32;
    auto check = [&](const char* variant, const char* what, const std::vector<double>& ref,
                     const std::vector<double>& got) {
        double scale = 0;
        for (double r : ref) scale = std::max(scale, std::fabs(r));
        char name[256];
        snprintf(name, sizeof(name), "%s %s B=%d T=%d C=%d NH=%d %s%s%s: %s", variant, th::dtype_name<floatX>(), B, T,
                 C, NH, s.causal ? "causal" : "full", s.valid.empty() ? "" : " padded",
                 s.dropout > 0 ? " dropout" : "", what);
        th::check_close(name, ref.data(), got.data(), ref.size(), th::tol(eps, k, k * eps * scale));
    };

    // NaN in every output: an element a variant does not write shows.
    th::DeviceBuffer<floatX> d_qkv(qkv_x), d_dout(dout_x), out(dout.size(), th::Fill::NaN),
        dqkv(qkv.size(), th::Fill::NaN);
    th::DeviceBuffer<float> lse((size_t)B * NH * T, th::Fill::NaN);
    th::DeviceBuffer<int> valid(s.valid);
    const int* vl = s.valid.empty() ? nullptr : valid.ptr;
    const AttentionDropout dropout{s.dropout, kDropSeed, kDropOffset};
    for (int variant = s.dropout > 0 ? 2 : 1; variant <= 3; variant++) {  // variant 1 has no dropout
        if (variant == 2 && !lowp) continue;  // variant 2 is the 16-bit types' (fp32 is production's)
        const char* label = variant == 1   ? "variant 1 (naive)"
                            : variant == 2 ? "variant 2 (WMMA flash)"
                                           : "flash (llmc)";
        if (variant == 1) {
            th::DeviceBuffer<char> scratch(attention1_scratch_bytes(B, T, NH), th::Fill::NaN);
            attention_forward1(out.ptr, lse.ptr, d_qkv.ptr, scratch.ptr, B, T, C, NH, s.causal, vl, 0);
            attention_backward1(dqkv.ptr, d_dout.ptr, d_qkv.ptr, scratch.ptr, B, T, C, NH, s.causal, vl, 0);
        } else if (variant == 2) {
            if constexpr (!std::is_same<floatX, float>::value) {
                th::DeviceBuffer<char> scratch(attention_backward_scratch_bytes<floatX>(B, T, C, NH), th::Fill::NaN);
                attention_forward2(out.ptr, lse.ptr, d_qkv.ptr, B, T, C, NH, s.causal, vl, 0, dropout);
                attention_backward2(dqkv.ptr, d_dout.ptr, d_qkv.ptr, out.ptr, lse.ptr, scratch.ptr, B, T, C, NH,
                                    s.causal, vl, 0, dropout);
            }
        } else {
            th::DeviceBuffer<char> scratch(attention_backward_scratch_bytes<floatX>(B, T, C, NH), th::Fill::NaN);
            attention_forward(out.ptr, lse.ptr, d_qkv.ptr, B, T, C, NH, s.causal, vl, 0, dropout);
            attention_backward(dqkv.ptr, d_dout.ptr, d_qkv.ptr, out.ptr, lse.ptr, scratch.ptr, B, T, C, NH, s.causal,
                               vl, 0, dropout);
        }
        check(label, "out", out_ref, th::widen(out.host()));
        check(label, "lse", lse_ref, th::widen(lse.host()));
        check(label, "dqkv", dqkv_ref, th::widen(dqkv.host()));
    }
    if (lowp && s.HS() <= 64) {  // variant 3: a forward only
        if constexpr (!std::is_same<floatX, float>::value) {
            th::DeviceBuffer<floatX> out3(dout.size(), th::Fill::NaN);
            th::DeviceBuffer<float> lse3((size_t)B * NH * T, th::Fill::NaN);
            attention_forward3(out3.ptr, lse3.ptr, d_qkv.ptr, B, T, C, NH, s.causal, vl, 0, dropout);
            check("variant 3 (flash, 32 rows per warp)", "out", out_ref, th::widen(out3.host()));
            check("variant 3 (flash, 32 rows per warp)", "lse", lse_ref, th::widen(lse3.host()));
        }
    }
    if (lowp && s.dropout == 0.f) {  // variant 4: a backward only, from the production forward's out and lse
        if constexpr (!std::is_same<floatX, float>::value) {
            th::DeviceBuffer<floatX> dqkv4(qkv.size(), th::Fill::NaN);
            th::DeviceBuffer<char> scratch(attention_backward_scratch_bytes<floatX>(B, T, C, NH), th::Fill::NaN);
            attention_backward4(dqkv4.ptr, d_dout.ptr, d_qkv.ptr, out.ptr, lse.ptr, scratch.ptr, B, T, C, NH, s.causal,
                                vl, 0);
            check("variant 4 (flash, dQ by atomics)", "dqkv", dqkv_ref, th::widen(dqkv4.host()));
        }
    }
    if (lowp && s.dropout == 0.f && s.HS() == 64) {  // variant 14: a backward only
        if constexpr (!std::is_same<floatX, float>::value) {
            th::DeviceBuffer<floatX> dqkv14(qkv.size(), th::Fill::NaN);
            th::DeviceBuffer<char> scratch(attention_backward_scratch_bytes<floatX>(B, T, C, NH), th::Fill::NaN);
            attention_backward14(dqkv14.ptr, d_dout.ptr, d_qkv.ptr, out.ptr, lse.ptr, scratch.ptr, B, T, C, NH,
                                 s.causal, vl, 0);
            check("variant 14 (flash on mma.sync, dQ summed by the last writers)", "dqkv", dqkv_ref,
                  th::widen(dqkv14.host()));
        }
    }
    if (lowp && s.dropout == 0.f && s.HS() == 64 && wgmma_supported()) {  // variants 6, 7, 9-13: backwards only
        if constexpr (!std::is_same<floatX, float>::value) {
            th::DeviceBuffer<floatX> dqkv6(qkv.size(), th::Fill::NaN);
            th::DeviceBuffer<char> scratch(attention_backward_scratch_bytes<floatX>(B, T, C, NH), th::Fill::NaN);
            attention_backward6(dqkv6.ptr, d_dout.ptr, d_qkv.ptr, out.ptr, lse.ptr, scratch.ptr, B, T, C, NH, s.causal,
                                vl, 0);
            check("variant 6 (flash on mma.sync)", "dqkv", dqkv_ref, th::widen(dqkv6.host()));
            th::DeviceBuffer<floatX> dqkv7(qkv.size(), th::Fill::NaN);
            attention_backward_wgmma_as(true, 2, false, false, dqkv7.ptr, d_dout.ptr, d_qkv.ptr, out.ptr, lse.ptr,
                                        scratch.ptr, B, T, C, NH, s.causal, vl, 0);
            check("variant 7 (flash on wgmma, dQ deferred)", "dqkv", dqkv_ref, th::widen(dqkv7.host()));
            for (const WgmmaBackwardVariant& v : kWgmmaBackwardVariants) {
                th::DeviceBuffer<floatX> dqkv_v(qkv.size(), th::Fill::NaN);
                attention_backward_wgmma_as(false, v.blocks, v.red, v.sum, dqkv_v.ptr, d_dout.ptr, d_qkv.ptr,
                                            out.ptr, lse.ptr, scratch.ptr, B, T, C, NH, s.causal, vl, 0);
                const std::string label = "variant " + std::to_string(v.number) + " (" + v.label + ")";
                check(label.c_str(), "dqkv", dqkv_ref, th::widen(dqkv_v.host()));
            }
        }
    }
    if (lowp && s.dropout == 0.f) {  // variant 5: a forward only
        if constexpr (!std::is_same<floatX, float>::value) {
            th::DeviceBuffer<floatX> out5(dout.size(), th::Fill::NaN);
            th::DeviceBuffer<float> lse5((size_t)B * NH * T, th::Fill::NaN);
            attention_forward5(out5.ptr, lse5.ptr, d_qkv.ptr, B, T, C, NH, s.causal, vl, 0);
            check("variant 5 (flash, registers for 2 blocks per SM)", "out", out_ref, th::widen(out5.host()));
            check("variant 5 (flash, registers for 2 blocks per SM)", "lse", lse_ref, th::widen(lse5.host()));
        }
    }
    if (lowp && s.dropout == 0.f && s.HS() == 64 && wgmma_supported()) {  // variant 8: a forward only
        if constexpr (!std::is_same<floatX, float>::value) {
            th::DeviceBuffer<floatX> out8((size_t)B * T * C, th::Fill::NaN);
            th::DeviceBuffer<float> lse8((size_t)B * NH * T, th::Fill::NaN);
            attention_forward8(out8.ptr, lse8.ptr, d_qkv.ptr, B, T, C, NH, s.causal, vl, 0);
            check("variant 8 (flash forward on wgmma)", "out", out_ref, th::widen(out8.host()));
            check("variant 8 (flash forward on wgmma)", "lse", lse_ref, th::widen(lse8.host()));
        }
    }
}

// ----------------------------------------------------------------------------
// Benchmark

// The block shapes on this device: 4 warps, or fewer where the device's shared memory per block is too
// small for them (which costs speed: more blocks read the streamed tiles). llmc's mma.sync kernels
// (bf16/fp16) always run 4 warps; the fp32 kernels and variant 2 use attn_launch_shape.
template <class floatX>
void print_block_shapes(int HS, int B, int T, int NH) {
    with_head_size(HS, [&](auto hs) {
        constexpr int kHS = decltype(hs)::value;
        AttnLaunch fwd = attn_launch_shape<floatX, kHS>("benchmark", false);
        AttnLaunch bwd = attn_launch_shape<floatX, kHS>("benchmark", true);
        if constexpr (std::is_same<floatX, float>::value) {
            printf("  flash blocks: forward %d warps (%zu bytes of shared memory), backward %d warps (%zu bytes)\n",
                   fwd.warps, fwd.smem, bwd.warps, bwd.smem);
        } else {
            using Tile = AttnMmaTile<floatX, kHS>;
            printf("  flash (llmc) blocks: 4 warps, forward %d queries (%zu bytes of shared memory), backward %d keys "
                   "(%zu bytes), %d-query tiles, dQ in %d slices\n",
                   16 * Tile::kFwdTiles * Tile::kWarps, Tile::kForwardSmem, Tile::kRows, Tile::kBackwardSmem,
                   Tile::kColsB, attention_dq_splits(B, T, NH));
            printf("  variant 2 blocks: forward %d warps (%zu bytes), backward %d warps (%zu bytes)\n", fwd.warps,
                   fwd.smem, bwd.warps, bwd.smem);
        }
    });
}

// The tensors a timed shape needs: qkv (B,T,3C) and dout (B,T,C) random, the outputs NaN-filled.
template <class floatX>
struct BenchTensors {
    th::DeviceBuffer<floatX> qkv, dout, out, dqkv;
    th::DeviceBuffer<float> lse;       // (B,NH,T)
    th::DeviceBuffer<char> scratch;    // the backward's
    static std::vector<floatX> random(size_t n, uint64_t seed) {
        std::vector<float> h(n);
        th::fill_uniform(h.data(), n, seed);
        return th::round_to<floatX>(h);
    }
    BenchTensors(int B, int T, int C, int NH)
        : qkv(random((size_t)B * T * 3 * C, 7)), dout(random((size_t)B * T * C, 8)),
          out((size_t)B * T * C, th::Fill::NaN), dqkv((size_t)B * T * 3 * C, th::Fill::NaN),
          lse((size_t)B * NH * T, th::Fill::NaN),
          scratch(attention_backward_scratch_bytes<floatX>(B, T, C, NH), th::Fill::NaN) {}
};

// FLOPs of the forward: Q K^T and P V, 2·T·T·HS each per head, halved under a causal mask. The
// backward is counted as 2.5x the forward (5 products), FlashAttention's convention, which llmc's
// bf16/fp16 backward does; its fp32 backward and variant 2 do 7 (a separate dQ kernel), and variant 1
// is charged the same FLOPs.
double attention_fwd_flops(int B, int T, int NH, int HS, bool causal) {
    return 4.0 * B * NH * (double)T * T * HS * (causal ? 0.5 : 1.0);
}

// The production backward with each number of dQ slices attention_dq_splits can pick for the shape
// (through the block target; it picks the counts that share the key tiles most evenly): each slice is
// an fp32 copy of dQ that its blocks read, add to and write back, and that the reduce kernel sums, so
// fewer slices move fewer bytes through DRAM but give the GPU fewer blocks.
template <class floatX>
void time_dq_slices(BenchTensors<floatX>& bt, int B, int T, int NH, int HS, bool causal, int reps) {
    const int C = NH * HS, saved_target = attention_dq_target_blocks();
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    const double peak = peak_tflops(prop.name, Precision::BF16, false);
    const double flops = 2.5 * attention_fwd_flops(B, T, NH, HS, causal);
    int last = 0;
    for (int want = 1; want <= CEIL_DIV(T, 64); want++) {
        attention_dq_target_blocks() = want * B * NH;
        const int slices = attention_dq_splits(B, T, NH);
        if (slices <= last) continue;  // a count already timed
        last = slices;
        th::DeviceBuffer<char> scratch(attention_backward_scratch_bytes<floatX>(B, T, C, NH), th::Fill::NaN);
        auto bwd = [&] {
            attention_backward(bt.dqkv.ptr, bt.dout.ptr, bt.qkv.ptr, bt.out.ptr, bt.lse.ptr, scratch.ptr, B, T, C, NH,
                               causal, nullptr, 0);
        };
        char label[80];
        snprintf(label, sizeof(label), "backward (llmc, flash), dQ in %d slice%s", slices, slices > 1 ? "s" : "");
        flops_line(label, time_ms(bwd, reps), flops, peak);
    }
    attention_dq_target_blocks() = saved_target;
}

template <class floatX>
void benchmark(int B, int T, int NH, int HS, bool causal, int reps) {
    const int C = NH * HS;
    // fp16 and bf16 share the tensor-core peak on every GPU of the table: fp16 reads the bf16 column.
    const Precision prec = std::is_same<floatX, float>::value ? Precision::FP32 : Precision::BF16;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    const double peak = peak_tflops(prop.name, prec, false);
    const double fwd_flops = attention_fwd_flops(B, T, NH, HS, causal);
    printf("%s B=%d T=%d NH=%d HS=%d %s:\n", th::dtype_name<floatX>(), B, T, NH, HS, causal ? "causal" : "full");
    print_block_shapes<floatX>(HS, B, T, NH);
    BenchTensors<floatX> bt(B, T, C, NH);
    th::DeviceBuffer<floatX> &qkv = bt.qkv, &dout = bt.dout, &out = bt.out, &dqkv = bt.dqkv;
    th::DeviceBuffer<float>& lse = bt.lse;
    th::DeviceBuffer<char>& scratch = bt.scratch;
    th::DeviceBuffer<char> scratch1(attention1_scratch_bytes(B, T, NH), th::Fill::NaN);
    auto fwd1 = [&] { attention_forward1(out.ptr, lse.ptr, qkv.ptr, scratch1.ptr, B, T, C, NH, causal, nullptr, 0); };
    auto fwd = [&] { attention_forward(out.ptr, lse.ptr, qkv.ptr, B, T, C, NH, causal, nullptr, 0); };
    auto bwd1 = [&] {
        attention_backward1(dqkv.ptr, dout.ptr, qkv.ptr, scratch1.ptr, B, T, C, NH, causal, nullptr, 0);
    };
    auto bwd = [&] {
        attention_backward(dqkv.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr, scratch.ptr, B, T, C, NH, causal, nullptr, 0);
    };
    flops_line("forward variant 1 (naive, scores in DRAM)", time_ms(fwd1, reps), fwd_flops, peak);
    flops_line("forward (llmc, flash)", time_ms(fwd, reps), fwd_flops, peak);
    flops_line("backward variant 1 (naive, scores in DRAM)", time_ms(bwd1, reps), 2.5 * fwd_flops, peak);
    flops_line("backward (llmc, flash)", time_ms(bwd, reps), 2.5 * fwd_flops, peak);
    if constexpr (!std::is_same<floatX, float>::value) {
        auto fwd2 = [&] { attention_forward2(out.ptr, lse.ptr, qkv.ptr, B, T, C, NH, causal, nullptr, 0); };
        auto bwd2 = [&] {
            attention_backward2(dqkv.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr, scratch.ptr, B, T, C, NH, causal,
                                nullptr, 0);
        };
        flops_line("forward variant 2 (WMMA flash)", time_ms(fwd2, reps), fwd_flops, peak);
        flops_line("backward variant 2 (WMMA flash)", time_ms(bwd2, reps), 2.5 * fwd_flops, peak);
        if (HS <= 64) {
            auto fwd3 = [&] { attention_forward3(out.ptr, lse.ptr, qkv.ptr, B, T, C, NH, causal, nullptr, 0); };
            flops_line("forward variant 3 (flash, 32 rows per warp)", time_ms(fwd3, reps), fwd_flops, peak);
        }
        auto bwd4 = [&] {
            attention_backward4(dqkv.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr, scratch.ptr, B, T, C, NH, causal,
                                nullptr, 0);
        };
        flops_line("backward variant 4 (flash, dQ by atomics)", time_ms(bwd4, reps), 2.5 * fwd_flops, peak);
        if (HS == 64) {
            auto bwd14 = [&] {
                attention_backward14(dqkv.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr, scratch.ptr, B, T, C, NH, causal,
                                     nullptr, 0);
            };
            flops_line("backward variant 14 (flash on mma.sync, dQ summed by the last writers)", time_ms(bwd14, reps),
                       2.5 * fwd_flops, peak);
        }
        if (HS == 64 && wgmma_supported()) {
            auto bwd6 = [&] {
                attention_backward6(dqkv.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr, scratch.ptr, B, T, C, NH, causal,
                                    nullptr, 0);
            };
            flops_line("backward variant 6 (flash on mma.sync)", time_ms(bwd6, reps), 2.5 * fwd_flops, peak);
            auto bwd7 = [&] {
                attention_backward_wgmma_as(true, 2, false, false, dqkv.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr,
                                            scratch.ptr, B, T, C, NH, causal, nullptr, 0);
            };
            flops_line("backward variant 7 (flash on wgmma, dQ deferred)", time_ms(bwd7, reps), 2.5 * fwd_flops, peak);
            for (const WgmmaBackwardVariant& v : kWgmmaBackwardVariants) {
                auto bwd_v = [&] {
                    attention_backward_wgmma_as(false, v.blocks, v.red, v.sum, dqkv.ptr, dout.ptr, qkv.ptr, out.ptr,
                                                lse.ptr, scratch.ptr, B, T, C, NH, causal, nullptr, 0);
                };
                const std::string label = "backward variant " + std::to_string(v.number) + " (" + v.label + ")";
                flops_line(label.c_str(), time_ms(bwd_v, reps), 2.5 * fwd_flops, peak);
            }
        }
        auto fwd5 = [&] { attention_forward5(out.ptr, lse.ptr, qkv.ptr, B, T, C, NH, causal, nullptr, 0); };
        flops_line("forward variant 5 (flash, registers for 2 blocks per SM)", time_ms(fwd5, reps), fwd_flops, peak);
        if (HS == 64 && wgmma_supported()) {
            auto fwd8 = [&] { attention_forward8(out.ptr, lse.ptr, qkv.ptr, B, T, C, NH, causal, nullptr, 0); };
            flops_line("forward variant 8 (flash forward on wgmma)", time_ms(fwd8, reps), fwd_flops, peak);
        }
        time_dq_slices(bt, B, T, NH, HS, causal, reps);
    }
    // The cost of dropout on P (BERT's p = 0.1): 8 Philox calls per lane and tile in each kernel.
    const AttentionDropout drop{0.1f, 1, 0};
    auto fwd_drop = [&] { attention_forward(out.ptr, lse.ptr, qkv.ptr, B, T, C, NH, causal, nullptr, 0, drop); };
    auto bwd_drop = [&] {
        attention_backward(dqkv.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr, scratch.ptr, B, T, C, NH, causal, nullptr, 0,
                           drop);
    };
    flops_line("forward (llmc, flash) with dropout 0.1", time_ms(fwd_drop, reps), fwd_flops, peak);
    flops_line("backward (llmc, flash) with dropout 0.1", time_ms(bwd_drop, reps), 2.5 * fwd_flops, peak);
}

// The FlashAttention-2 paper's benchmark shapes: B·T = 16384 tokens and NH·HS = 2048 channels, T from
// 512 to 2k, head sizes 64 and 128, causal and not. One line per shape with forward, backward and the
// two together (timed as one call after the other), in FlashAttention's FLOP convention, beside the
// paper's forward+backward figure on an H100 SXM where it gives one (causal shapes). llmc's flash
// kernels only: the variants are timed at one shape by benchmark() above.
struct SweepAnchor {
    int HS, T;
    double tflops;  // FlashAttention-2, forward+backward, causal, H100 SXM
};
constexpr SweepAnchor kFa2H100[] = {{64, 512, 141}, {64, 1024, 192}, {64, 2048, 232},
                                    {128, 512, 163}, {128, 1024, 221}, {128, 2048, 265}};

template <class floatX>
void sweep_point(int B, int T, int NH, int HS, bool causal, int reps) {
    const int C = NH * HS;
    const double fwd_flops = attention_fwd_flops(B, T, NH, HS, causal);
    BenchTensors<floatX> bt(B, T, C, NH);
    th::DeviceBuffer<floatX> &qkv = bt.qkv, &dout = bt.dout, &out = bt.out, &dqkv = bt.dqkv;
    th::DeviceBuffer<float>& lse = bt.lse;
    th::DeviceBuffer<char>& scratch = bt.scratch;
    auto fwd = [&] { attention_forward(out.ptr, lse.ptr, qkv.ptr, B, T, C, NH, causal, nullptr, 0); };
    auto bwd = [&] {
        attention_backward(dqkv.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr, scratch.ptr, B, T, C, NH, causal, nullptr, 0);
    };
    auto both = [&] { fwd(); bwd(); };
    const double tf = fwd_flops / (time_ms(fwd, reps) * 1e-3) / 1e12;
    const double tb = 2.5 * fwd_flops / (time_ms(bwd, reps) * 1e-3) / 1e12;
    const double tfb = 3.5 * fwd_flops / (time_ms(both, reps) * 1e-3) / 1e12;
    char anchor[64] = "";
    for (const SweepAnchor& a : kFa2H100)
        if (causal && a.HS == HS && a.T == T)
            snprintf(anchor, sizeof(anchor), "  (FlashAttention-2, H100 SXM: %.0f)", a.tflops);
    printf("  sweep %s HS=%d %s T=%d B=%d NH=%d: fwd %.4g bwd %.4g fwd+bwd %.4g TFLOP/s%s\n", th::dtype_name<floatX>(),
           HS, causal ? "causal" : "full", T, B, NH, tf, tb, tfb, anchor);
    if (HS == 64 && !std::is_same<floatX, float>::value && wgmma_supported()) {  // variants 6 to 14
        // A variant's line: its own pass (`what`: fwd or bwd) and forward+backward with production's other.
        auto line = [&](const char* tag, const char* what, auto pass, double pass_flops, auto both) {
            const double t_pass = time_ms(pass, reps) * 1e-3, t_both = time_ms(both, reps) * 1e-3;
            printf("  %s-sweep %s HS=%d %s T=%d B=%d NH=%d: %s %.4g fwd+bwd %.4g TFLOP/s\n", tag,
                   th::dtype_name<floatX>(), HS, causal ? "causal" : "full", T, B, NH, what, pass_flops / t_pass / 1e12,
                   3.5 * fwd_flops / t_both / 1e12);
        };
        auto bwd6 = [&] {
            attention_backward6(dqkv.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr, scratch.ptr, B, T, C, NH, causal,
                                nullptr, 0);
        };
        line("mma", "bwd", bwd6, 2.5 * fwd_flops, [&] { fwd(); bwd6(); });
        auto bwd14 = [&] {
            attention_backward14(dqkv.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr, scratch.ptr, B, T, C, NH, causal,
                                 nullptr, 0);
        };
        line("mma-sum", "bwd", bwd14, 2.5 * fwd_flops, [&] { fwd(); bwd14(); });
        auto bwd7 = [&] {
            attention_backward_wgmma_as(true, 2, false, false, dqkv.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr,
                                        scratch.ptr, B, T, C, NH, causal, nullptr, 0);
        };
        line("defer", "bwd", bwd7, 2.5 * fwd_flops, [&] { fwd(); bwd7(); });
        for (const WgmmaBackwardVariant& v : kWgmmaBackwardVariants) {
            auto bwd_v = [&] {
                attention_backward_wgmma_as(false, v.blocks, v.red, v.sum, dqkv.ptr, dout.ptr, qkv.ptr, out.ptr,
                                            lse.ptr, scratch.ptr, B, T, C, NH, causal, nullptr, 0);
            };
            line(v.tag, "bwd", bwd_v, 2.5 * fwd_flops, [&] { fwd(); bwd_v(); });
        }
        auto fwd8 = [&] { attention_forward8(out.ptr, lse.ptr, qkv.ptr, B, T, C, NH, causal, nullptr, 0); };
        line("wgmma-fwd", "fwd", fwd8, fwd_flops, [&] { fwd8(); bwd(); });
    }
}

template <class floatX>
void sweep(const std::vector<int>& seq_lens, int tokens, int channels, int reps) {
    printf("sweep: %s, B·T = %d tokens, NH·HS = %d channels (FlashAttention-2's benchmark shapes)\n",
           th::dtype_name<floatX>(), tokens, channels);
    for (int HS : {64, 128})
        for (bool causal : {true, false})
            for (int T : seq_lens) sweep_point<floatX>(tokens / T, T, channels / HS, HS, causal, reps);
}

// One bf16 causal forward and backward of llmc's kernels between cudaProfilerStart and cudaProfilerStop,
// after a warm-up pass (which loads the module and sets the kernels' shared-memory limits).
void profile_pass(int B, int T, int NH, int HS) {
    const int C = NH * HS;
    BenchTensors<__nv_bfloat16> bt(B, T, C, NH);
    auto pass = [&] {
        attention_forward(bt.out.ptr, bt.lse.ptr, bt.qkv.ptr, B, T, C, NH, true, nullptr, 0);
        attention_backward(bt.dqkv.ptr, bt.dout.ptr, bt.qkv.ptr, bt.out.ptr, bt.lse.ptr, bt.scratch.ptr, B, T, C, NH,
                           true, nullptr, 0);
    };
    pass();
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaProfilerStart());
    pass();
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaProfilerStop());
    printf("profiled: llmc's bf16 attention forward and backward, B=%d T=%d NH=%d HS=%d causal\n", B, T, NH, HS);
}

int main(int argc, char** argv) {
    if (argc == 2 && strcmp(argv[1], "--profile") == 0) {
#if defined(SIMT_CPU)
        profile_pass(1, 128, 2, 64);  // no profiler attaches to the CPU backend: a small shape
#else
        profile_pass(8, 1024, 12, 64);
#endif
        return 0;
    }
    dev_command_line(argc, argv,
        "Multi-head attention forward and backward: variant 1 (naive, scores in DRAM), 2 (flash on WMMA),\n"
        "3 to 5 (production with one change each), 6 (the backward on mma.sync where production takes\n"
        "wgmma: sm_90a), 7 (the wgmma backward deferring dQ), 8 (the forward on wgmma), 9 to 11 (the\n"
        "wgmma backward with registers for 3 blocks per SM, adding dQ by reductions in L2, both), 12 to 14\n"
        "(the wgmma backward, variant 11 and the mma.sync backward summing dQ's slices in the kernel) and\n"
        "production (llmc/attention.cuh, FlashAttention-2 on mma.sync, the backward on wgmma where it\n"
        "applies), timed in TFLOP/s; then production swept over FlashAttention-2's benchmark shapes.\n"
        DEV_VALIDATES
        "\n--profile: instead, only one bf16 forward and backward of production at GPT-2 124M's shape (a\n"
        "small one on the CPU backend) between cudaProfilerStart and cudaProfilerStop, for\n"
        "ncu --profile-from-start off.\n",
        "[--help | --profile]");
    // Validation: T not a multiple of the 64-row tile, every head size, causal and padded.
    const std::vector<Shape> shapes = {
        {2, 100, 64, 4, true, {}},         // HS = 16
        {2, 77, 96, 3, false, {77, 30}},   // HS = 32, padded
        {1, 130, 128, 2, true, {}},        // HS = 64
        {2, 65, 256, 2, false, {1, 65}},   // HS = 128, padded
        // Dropout on P (the flash kernels only): BERT's p = 0.1, padded and causal.
        {3, 90, 128, 2, false, {90, 1, 47}, 0.1f},  // HS = 64
        {2, 77, 96, 3, true, {}, 0.3f},             // HS = 32
    };
    uint64_t seed = 1;
    for (const Shape& s : shapes) {
        validate<float>(s, seed);
        validate<__nv_bfloat16>(s, seed);
        validate<__half>(s, seed);
        seed += 2;
    }

    // Benchmark: GPT-2 124M's attention (B=8, T=1024, NH=12, HS=64) on a GPU; a small slice on the
    // CPU backend.
#if defined(SIMT_CPU)
    printf("benchmark (CPU backend: times are for the simulator, not for any GPU)\n");
    benchmark<__nv_bfloat16>(1, 128, 2, 64, true, 1);
    benchmark<float>(1, 128, 2, 64, true, 1);
    sweep<__nv_bfloat16>({128}, 128, 256, 1);
#else
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("benchmark on %s\n", prop.name);
    benchmark<__nv_bfloat16>(8, 1024, 12, 64, true, 20);
    benchmark<__nv_bfloat16>(8, 1024, 12, 64, false, 20);
    benchmark<__half>(8, 1024, 12, 64, true, 20);
    benchmark<float>(8, 1024, 12, 64, true, 5);
    sweep<__nv_bfloat16>({512, 1024, 2048}, 16384, 2048, 10);
    // The backward by dQ slices at the sweep's head size 64, T = 1024 shape as well (production: 2).
    printf("bf16 B=16 T=1024 NH=32 HS=64 causal, the backward by dQ slices:\n");
    BenchTensors<__nv_bfloat16> bt(16, 1024, 2048, 32);
    attention_forward(bt.out.ptr, bt.lse.ptr, bt.qkv.ptr, 16, 1024, 2048, 32, true, nullptr, 0);  // out, lse
    time_dq_slices(bt, 16, 1024, 32, 64, true, 10);
    // And at GPT-2 124M's training shape (B=16 NH=12).
    printf("bf16 B=16 T=1024 NH=12 HS=64 causal, the backward by dQ slices:\n");
    BenchTensors<__nv_bfloat16> gpt(16, 1024, 768, 12);
    attention_forward(gpt.out.ptr, gpt.lse.ptr, gpt.qkv.ptr, 16, 1024, 768, 12, true, nullptr, 0);
    time_dq_slices(gpt, 16, 1024, 12, 64, true, 10);
#endif
    return th::finish();
}
