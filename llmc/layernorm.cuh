// llmc/layernorm.cuh — LayerNorm forward and backward, the residual add, and the two fused into one
// pass: the normalization of GPT-2 (pre-LN, eps 1e-5) and BERT (post-LN, eps 1e-12).
//
// Layout: activations are rows of C channels, (N,C) with N = B*T; weight and bias are (C).
// Statistics are fp32 (mean and rstd, saved for the backward pass); every output is computed in
// fp32 and rounded once to the storage type T. Everything here is deterministic: no float atomics.
#pragma once
#include "cuda_common.h"
#include "precision.cuh"

#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>

#include <cstdint>
#include <initializer_list>

namespace cg = cooperative_groups;

// ----------------------------------------------------------------------------
// CUDA kernels

// Loads P consecutive elements as floats: one 128-bit access when P fills a Packed128 (the caller
// has checked C and the pointers allow it), element by element when P == 1.
template <int P, class T>
__device__ inline void ln_load(float (&dst)[P], const T* src) {
    if constexpr (P == Packed128<T>::size) {
        Packed128<T> packed = load128(src);
        for (int k = 0; k < P; k++) dst[k] = to_float(packed[k]);
    } else {
        static_assert(P == 1, "ln_load: P is 1 or Packed128<T>::size");
        dst[0] = to_float(src[0]);
    }
}

// Rounds P floats to T and stores them, the counterpart of ln_load.
template <int P, class T>
__device__ inline void ln_store(T* dst, const float (&src)[P]) {
    if constexpr (P == Packed128<T>::size) {
        Packed128<T> packed;
        for (int k = 0; k < P; k++) packed[k] = from_float<T>(src[k]);
        store128(dst, packed);
    } else {
        static_assert(P == 1, "ln_store: P is 1 or Packed128<T>::size");
        dst[0] = from_float<T>(src[0]);
    }
}

// LayerNorm forward, one warp per row; with kResidual it first forms the row as inp1 + inp2
// (rounded to T, written to `residual`), otherwise the row is inp1 and inp2/residual are unused.
// The row is read from global memory once and kept in shared memory (as T, so exactly) for the
// two statistics passes and the normalization: two-pass mean/variance is robust to rows whose
// mean is large against their spread, and the re-reads cost shared-memory bandwidth, not DRAM.
// Each lane re-reads only the elements it stored itself, so no barrier is needed.
// Lane l handles the chunks of P elements starting at l*P, l*P + 32*P, ... (coalesced).
template <class T, int P, bool kResidual>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, T* residual, const T* inp1,
                                         const T* inp2, const T* weight, const T* bias, int N, int C,
                                         float eps) {
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    int lane = warp.thread_rank();
    int row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();
    if (row >= N) return;  // the whole warp leaves together
    size_t offset = (size_t)row * C;
    T* cached = dynamic_shared<T>() + (size_t)warp.meta_group_rank() * C;  // (C) this warp's row

    float sum = 0.f;
    for (int c = lane * P; c < C; c += 32 * P) {
        float x[P];
        ln_load(x, inp1 + offset + c);
        if constexpr (kResidual) {
            float y[P];
            ln_load(y, inp2 + offset + c);
            for (int k = 0; k < P; k++) x[k] = to_float(from_float<T>(x[k] + y[k]));
            ln_store(residual + offset + c, x);
        }
        ln_store(cached + c, x);  // x holds values of T: the round trip is exact
        for (int k = 0; k < P; k++) sum += x[k];
    }
    float m = cg::reduce(warp, sum, cg::plus<float>()) / C;

    float sum_sq = 0.f;
    for (int c = lane * P; c < C; c += 32 * P) {
        float x[P];
        ln_load(x, cached + c);
        for (int k = 0; k < P; k++) sum_sq += (x[k] - m) * (x[k] - m);
    }
    float s = rsqrtf(cg::reduce(warp, sum_sq, cg::plus<float>()) / C + eps);

    for (int c = lane * P; c < C; c += 32 * P) {
        float x[P], w[P], b[P], o[P];
        ln_load(x, cached + c);
        ln_load(w, weight + c);
        ln_load(b, bias + c);
        for (int k = 0; k < P; k++) o[k] = (x[k] - m) * s * w[k] + b[k];
        ln_store(out + offset + c, o);
    }
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = s;
    }
}

// out = inp1 + inp2, element-wise (the residual connection). Each thread handles one Packed128's
// worth of elements: with one 128-bit access per operand when `packed` (all pointers 16-byte
// aligned) and the pack lies inside N, element by element otherwise (the tail, or misaligned views).
template <class T>
__global__ void residual_forward_kernel(T* out, const T* inp1, const T* inp2, size_t N, bool packed) {
    constexpr int P = Packed128<T>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (i >= N) return;
    if (packed && i + P <= N) {
        Packed128<T> a = load128cs(inp1 + i), b = load128cs(inp2 + i), o;
        for (int k = 0; k < P; k++) o[k] = from_float<T>(to_float(a[k]) + to_float(b[k]));
        store128(out + i, o);
    } else {
        for (size_t j = i; j < N && j < i + P; j++) out[j] = from_float<T>(to_float(inp1[j]) + to_float(inp2[j]));
    }
}

// A warp's dweight/dbias accumulators keep element c + k of lane l's chunk (c = l*P + j*32*P,
// k < P) at position j*32*P + k*32 + l, so that the 32 lanes updating element k of their chunks
// touch 32 consecutive floats (no shared-memory bank conflicts; the natural order would be P-way).
// This maps a position back to its channel (C or more for the padding past the last chunk).
template <int P>
__device__ inline int ln_acc_channel(int pos) {
    int j = pos / (32 * P), r = pos % (32 * P);
    return j * 32 * P + (r % 32) * P + r / 32;
}

// The start of both backward kernels (layernorm_backward_kernel and its rows-in-registers twin): warp w's n_sums column-sum
// accumulators (dweight, dbias[, dinp]), each padded_C floats of dynamic shared memory laid out as
// ln_acc_channel says, zeroed where this lane updates them; returns the first (the others follow).
template <int P>
__device__ inline float* ln_backward_accumulators(int C, int padded_C, int n_sums, int w, int lane) {
    float* acc = dynamic_shared<float>() + (size_t)w * n_sums * padded_C;
    for (int c = lane * P; c < C; c += 32 * P)
        for (int k = 0; k < P; k++)
            for (int s = 0; s < n_sums; s++) acc[s * padded_C + c - lane * P + k * 32 + lane] = 0.f;
    return acc;
}

// The end of both backward kernels, once every warp's accumulators
// (n_warps x (n_sums, padded_C) floats at the start of dynamic shared memory) are complete: their
// sum in warp order, this block's (n_sums, C) row of partials (dweight, dbias[, dinp]).
template <int P>
__device__ inline void ln_backward_block_partials(float* partials, int C, int padded_C, int n_sums, int n_warps) {
    const float* acc = dynamic_shared<float>();
    float* block_partials = partials + (size_t)blockIdx.x * n_sums * C;
    for (int pos = threadIdx.x; pos < n_sums * padded_C; pos += blockDim.x) {  // in position order: no bank conflicts
        int which = pos / padded_C, c = ln_acc_channel<P>(pos % padded_C);
        if (c >= C) continue;
        float total = 0.f;
        for (int v = 0; v < n_warps; v++) total += acc[(size_t)v * n_sums * padded_C + pos];
        block_partials[which * C + c] = total;
    }
}

// LayerNorm backward, one warp per row, over the rows [blockIdx.x * rows_per_block, + rows_per_block).
// Accumulates into dinp: dinp += rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), with
// xhat = (x - mean) * rstd and dnorm = dout * weight, from the forward pass's mean and rstd.
// Column sums over the rows, n_sums of them: dweight = sum_rows dout*xhat, dbias = sum_rows dout
// and, when n_sums is 3, sum_rows of dinp as stored after the += (see layernorm_backward's
// dinp_colsum). Each warp sums them in shared memory (each lane owns the elements it updates: no
// atomics), then the block's warps are summed in warp order into this block's (n_sums,C) row of
// `partials`; layernorm_backward_reduce_kernel adds the blocks' partials in block order. Fixed
// orders: the result is bit-reproducible.
// Pass 2 re-reads dout, inp and weight, which the same warp has just read (L1 hits): shared memory
// is spent on the accumulators instead.
template <class T, int P>
__global__ void layernorm_backward_kernel(T* dinp, float* partials, const T* dout, const T* inp, const T* weight,
                                          const float* mean, const float* rstd, int N, int C, int rows_per_block,
                                          int n_sums) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int lane = warp.thread_rank(), w = warp.meta_group_rank(), n_warps = warp.meta_group_size();
    int padded_C = CEIL_DIV(C, 32 * P) * 32 * P;
    float* dweight_acc = ln_backward_accumulators<P>(C, padded_C, n_sums, w, lane);  // (padded_C), see ln_acc_channel
    float* dbias_acc = dweight_acc + padded_C;
    float* dinp_acc = n_sums == 3 ? dbias_acc + padded_C : nullptr;

    int row_end = min(N, (int)(blockIdx.x + 1) * rows_per_block);
    for (int row = blockIdx.x * rows_per_block + w; row < row_end; row += n_warps) {
        size_t offset = (size_t)row * C;
        float m = mean[row], s = rstd[row];

        float sum_dnorm = 0.f, sum_dnorm_xhat = 0.f;
        for (int c = lane * P; c < C; c += 32 * P) {
            float dy[P], x[P], wt[P];
            ln_load(dy, dout + offset + c);
            ln_load(x, inp + offset + c);
            ln_load(wt, weight + c);
            for (int k = 0; k < P; k++) {
                float xhat = (x[k] - m) * s;
                float dnorm = dy[k] * wt[k];
                sum_dnorm += dnorm;
                sum_dnorm_xhat += dnorm * xhat;
                int pos = c - lane * P + k * 32 + lane;  // see ln_acc_channel
                dweight_acc[pos] += dy[k] * xhat;
                dbias_acc[pos] += dy[k];
            }
        }
        float mean_dnorm = cg::reduce(warp, sum_dnorm, cg::plus<float>()) / C;
        float mean_dnorm_xhat = cg::reduce(warp, sum_dnorm_xhat, cg::plus<float>()) / C;

        for (int c = lane * P; c < C; c += 32 * P) {
            float dy[P], x[P], wt[P], dx[P];
            ln_load(dy, dout + offset + c);
            ln_load(x, inp + offset + c);
            ln_load(wt, weight + c);
            ln_load(dx, dinp + offset + c);
            for (int k = 0; k < P; k++) {
                float xhat = (x[k] - m) * s;
                dx[k] += s * (dy[k] * wt[k] - mean_dnorm - xhat * mean_dnorm_xhat);
                // the sum sees what is stored: dx rounded to T
                if (dinp_acc) dinp_acc[c - lane * P + k * 32 + lane] += to_float(from_float<T>(dx[k]));
            }
            ln_store(dinp + offset + c, dx);
        }
    }

    block.sync();  // every warp's accumulators are complete
    ln_backward_block_partials<P>(partials, C, padded_C, n_sums, n_warps);
}

// layernorm_backward_kernel with each row in registers, for rows of at most kChunks x 32 packs of 16
// bytes: a warp loads a row's dout, inp and dinp at once, one trip to DRAM per row where the kernel
// above makes two (dout and inp for the sums, then all three for the +=), each a load the warp waits
// for. The same operations in the same order: bit-identical to it. On an H200 (bf16, N = 8192,
// C = 768) 0.0308 ms against 0.0385 (dev/cuda/layernorm.cu); 121 registers there, against 56.
// The body is shared with layernorm_backward_sums_in_registers_kernel below (kSumsInRegisters).
template <class T, int kChunks, bool kSumsInRegisters>
__device__ __forceinline__ void layernorm_backward_rows_in_registers(T* dinp, float* partials, const T* dout,
                                                                     const T* inp, const T* weight, const float* mean,
                                                                     const float* rstd, int N, int C,
                                                                     int rows_per_block, int n_sums) {
    constexpr int P = Packed128<T>::size;
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int lane = warp.thread_rank(), w = warp.meta_group_rank(), n_warps = warp.meta_group_size();
    int padded_C = CEIL_DIV(C, 32 * P) * 32 * P;
    float* dweight_acc = ln_backward_accumulators<P>(C, padded_C, n_sums, w, lane);  // see ln_acc_channel
    float* dbias_acc = dweight_acc + padded_C;
    float* dinp_acc = n_sums == 3 ? dbias_acc + padded_C : nullptr;
    // With kSumsInRegisters, the lane's column sums of chunk j, element k (channel lane * P + j * 32 * P + k)
    float sum_w[kSumsInRegisters ? kChunks : 1][P] = {}, sum_b[kSumsInRegisters ? kChunks : 1][P] = {},
          sum_d[kSumsInRegisters ? kChunks : 1][P] = {};

    int row_end = min(N, (int)(blockIdx.x + 1) * rows_per_block);
    for (int row = blockIdx.x * rows_per_block + w; row < row_end; row += n_warps) {
        size_t offset = (size_t)row * C;
        // Chunk j of the row: channels c = lane * P + j * 32 * P .. + P - 1 (the loop order above).
        Packed128<T> dy[kChunks], x[kChunks], dx[kChunks];
        for (int j = 0; j < kChunks; j++) {
            int c = lane * P + j * 32 * P;
            if (c >= C) break;
            dy[j] = load128(dout + offset + c);
            x[j] = load128(inp + offset + c);
            dx[j] = load128(dinp + offset + c);
        }
        float m = mean[row], s = rstd[row];

        float sum_dnorm = 0.f, sum_dnorm_xhat = 0.f;
        for (int j = 0; j < kChunks; j++) {
            int c = lane * P + j * 32 * P;
            if (c >= C) break;
            Packed128<T> wt = load128(weight + c);
            for (int k = 0; k < P; k++) {
                float xhat = (to_float(x[j][k]) - m) * s;
                float dnorm = to_float(dy[j][k]) * to_float(wt[k]);
                sum_dnorm += dnorm;
                sum_dnorm_xhat += dnorm * xhat;
                if constexpr (kSumsInRegisters) {
                    sum_w[j][k] += to_float(dy[j][k]) * xhat;
                    sum_b[j][k] += to_float(dy[j][k]);
                } else {
                    int pos = c - lane * P + k * 32 + lane;
                    dweight_acc[pos] += to_float(dy[j][k]) * xhat;
                    dbias_acc[pos] += to_float(dy[j][k]);
                }
            }
        }
        float mean_dnorm = cg::reduce(warp, sum_dnorm, cg::plus<float>()) / C;
        float mean_dnorm_xhat = cg::reduce(warp, sum_dnorm_xhat, cg::plus<float>()) / C;

        for (int j = 0; j < kChunks; j++) {
            int c = lane * P + j * 32 * P;
            if (c >= C) break;
            Packed128<T> wt = load128(weight + c), out;
            for (int k = 0; k < P; k++) {
                float xhat = (to_float(x[j][k]) - m) * s;
                float d = to_float(dx[j][k]) + s * (to_float(dy[j][k]) * to_float(wt[k]) - mean_dnorm -
                                                    xhat * mean_dnorm_xhat);
                out[k] = from_float<T>(d);
                if constexpr (kSumsInRegisters) {
                    if (dinp_acc) sum_d[j][k] += to_float(out[k]);
                } else {
                    if (dinp_acc) dinp_acc[c - lane * P + k * 32 + lane] += to_float(out[k]);
                }
            }
            store128(dinp + offset + c, out);
        }
    }
    if constexpr (kSumsInRegisters)  // the warp's sums to its accumulators (zeroed above), where the others read them
        for (int j = 0; j < kChunks; j++) {
            int c = lane * P + j * 32 * P;
            if (c >= C) break;
            for (int k = 0; k < P; k++) {
                int pos = c - lane * P + k * 32 + lane;
                dweight_acc[pos] = sum_w[j][k];
                dbias_acc[pos] = sum_b[j][k];
                if (dinp_acc) dinp_acc[pos] = sum_d[j][k];
            }
        }

    block.sync();
    ln_backward_block_partials<P>(partials, C, padded_C, n_sums, n_warps);
}
template <class T, int kChunks>
__global__ void layernorm_backward_rows_in_registers_kernel(T* dinp, float* partials, const T* dout, const T* inp,
                                                            const T* weight, const float* mean, const float* rstd,
                                                            int N, int C, int rows_per_block, int n_sums) {
    layernorm_backward_rows_in_registers<T, kChunks, false>(dinp, partials, dout, inp, weight, mean, rstd, N, C,
                                                            rows_per_block, n_sums);
}

// The same with its column sums in registers: a lane updates the same kChunks x P channels in every
// row, so its sums can stay in registers (n_sums x kChunks x P floats) until the warp's last row,
// instead of a shared-memory load and store per sum, element and row (3 x 24 of each per lane and row
// at C = 768 in bf16); they go to the warp's shared-memory accumulators once, at the end. The same
// adds in the same order: the same bits (LayernormBackwardKernel::SumsInRegisters, untimed). Its
// registers are capped for 3 blocks per SM where the sums take at most 24 floats per lane (bf16 at
// C = 768: 168 registers on sm_90, against 121 without the sums), else for 2, so that none spill.
constexpr int kLayernormBackwardWarps = 4;  // warps per backward block
template <class T, int kChunks>
__global__ void __launch_bounds__(32 * kLayernormBackwardWarps, kChunks * Packed128<T>::size <= 24 ? 3 : 2)
    layernorm_backward_sums_in_registers_kernel(T* dinp, float* partials, const T* dout, const T* inp,
                                                const T* weight, const float* mean, const float* rstd, int N, int C,
                                                int rows_per_block, int n_sums) {
    layernorm_backward_rows_in_registers<T, kChunks, true>(dinp, partials, dout, inp, weight, mean, rstd, N, C,
                                                           rows_per_block, n_sums);
}

// dweight += sum over blocks of partials[g][0], dbias += sum of partials[g][1] (and dinp_colsum +=
// sum of partials[g][2] when n_sums is 3), summed in block order: the deterministic second half of
// layernorm_backward's column sums. Block (32, 32): threadIdx.x picks one of 32 consecutive columns
// of the (n_sums,C) partials (coalesced loads), threadIdx.y strides over the blocks; the 32 column
// sums are combined in y order.
template <class T>
__global__ void layernorm_backward_reduce_kernel(T* dweight, T* dbias, T* dinp_colsum, const float* partials,
                                                 int n_blocks, int C, int n_sums) {
    __shared__ float column_sums[32][32];
    int e = blockIdx.x * 32 + threadIdx.x;  // column of (n_sums,C)
    float sum = 0.f;
    if (e < n_sums * C)
        for (int g = threadIdx.y; g < n_blocks; g += blockDim.y) sum += partials[(size_t)g * n_sums * C + e];
    column_sums[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && e < n_sums * C) {
        float total = 0.f;
        for (int y = 0; y < (int)blockDim.y; y++) total += column_sums[y][threadIdx.x];
        T* target = e < C ? dweight + e : e < 2 * C ? dbias + (e - C) : dinp_colsum + (e - 2 * C);
        *target = from_float<T>(to_float(*target) + total);
    }
}

// ----------------------------------------------------------------------------
// kernel launchers

constexpr int kLayernormForwardWarps = 8;      // rows per forward block
constexpr int kLayernormBackwardMinRows = 32;  // rows per backward block at least (amortizes its partials)
constexpr int kLayernormBackwardMaxBlocks = 1024;

// Exits with a message naming the op when N or C cannot describe a (N,C) tensor.
inline void layernorm_check_shape(const char* op, int N, int C) {
    if (N < 0 || C <= 0) {
        fprintf(stderr, "%s: need N >= 0 rows and C > 0 channels, got N=%d C=%d\n", op, N, C);
        exit(EXIT_FAILURE);
    }
}

// Shared by layernorm_forward and fused_residual_layernorm_forward: picks 128-bit or scalar access
// and launches one warp per row.
template <class T, bool kResidual>
inline void layernorm_forward_launch(const char* op, T* out, float* mean, float* rstd, T* residual, const T* inp1,
                                     const T* inp2, const T* weight, const T* bias, int N, int C, float eps,
                                     cudaStream_t stream) {
    layernorm_check_shape(op, N, C);
    if (N == 0) return;
    constexpr int P = Packed128<T>::size;
    bool packed = rows_pack128<T>(C, {out, residual, inp1, inp2, weight, bias});
    auto kernel = packed ? layernorm_forward_kernel<T, P, kResidual> : layernorm_forward_kernel<T, 1, kResidual>;
    size_t smem = (size_t)kLayernormForwardWarps * C * sizeof(T);
    reserve_dynamic_smem(kernel, smem, op, "C", C);
    cudaCheck(launch_kernel(kernel, dim3(CEIL_DIV(N, kLayernormForwardWarps)), dim3(32 * kLayernormForwardWarps),
                            smem, stream, out, mean, rstd, residual, inp1, inp2, weight, bias, N, C, eps));
}

// out = (inp - mean) * rstd * weight + bias per row of C channels; writes mean and rstd (N) for
// the backward pass unless they are null (inference).
template <class T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N, int C,
                       float eps, cudaStream_t stream) {
    layernorm_forward_launch<T, false>("layernorm_forward", out, mean, rstd, (T*)nullptr, inp, (const T*)nullptr,
                                       weight, bias, N, C, eps, stream);
}

// residual = inp1 + inp2 (rounded to T), then out = layernorm(residual): the residual add and the
// next layer's LayerNorm in one pass, saving the re-read of the residual stream.
template <class T>
void fused_residual_layernorm_forward(T* residual, T* out, float* mean, float* rstd, const T* inp1, const T* inp2,
                                      const T* weight, const T* bias, int N, int C, float eps, cudaStream_t stream) {
    layernorm_forward_launch<T, true>("fused_residual_layernorm_forward", out, mean, rstd, residual, inp1, inp2,
                                      weight, bias, N, C, eps, stream);
}

// out = inp1 + inp2 over N elements (the residual connection; any N, any alignment).
template <class T>
void residual_forward(T* out, const T* inp1, const T* inp2, size_t N, cudaStream_t stream) {
    if (N == 0) return;
    constexpr int P = Packed128<T>::size;
    const int block_size = 256;
    bool packed = aligned16({out, inp1, inp2});
    cudaCheck(launch_kernel(residual_forward_kernel<T>, dim3((unsigned)CEIL_DIV(N, (size_t)block_size * P)),
                            dim3(block_size), 0, stream, out, inp1, inp2, N, packed));
}

// How the backward pass splits the N rows over blocks: at least kLayernormBackwardMinRows rows
// each (a multiple of the warps), at most kLayernormBackwardMaxBlocks blocks. Depends on N only,
// so the summation order, hence the result, is the same on every GPU and on the CPU backend.
inline int layernorm_backward_rows_per_block(int N) {
    int rows = CEIL_DIV(N, kLayernormBackwardMaxBlocks);
    if (rows < kLayernormBackwardMinRows) rows = kLayernormBackwardMinRows;
    return CEIL_DIV(rows, kLayernormBackwardWarps) * kLayernormBackwardWarps;
}

// Bytes of scratch layernorm_backward needs: each block's partial column sums, (blocks,3,C) fp32.
inline size_t layernorm_backward_scratch_bytes(int N, int C) {
    if (N <= 0 || C <= 0) return 0;
    size_t blocks = CEIL_DIV(N, layernorm_backward_rows_per_block(N));
    return blocks * 3 * (size_t)C * sizeof(float);
}

// Whether layernorm_backward at C channels can take dinp_colsum on this device: the third column
// sum is a third accumulator per warp in shared memory (the first two must fit regardless).
inline bool layernorm_backward_fits_colsum(int C) {
    size_t padded_C = CEIL_DIV((size_t)C, 32 * 8) * 32 * 8;  // the widest pack, 8 elements of 16 bits
    size_t smem = (size_t)kLayernormBackwardWarps * 3 * padded_C * sizeof(float);
    return smem <= 48 * 1024 || smem <= (size_t)device_smem_optin();
}

// Which kernel layernorm_backward runs: Auto, the rows in registers where they fit (at most
// kLayernormBackwardRegisterChunks chunks of 32 packs of 16 bytes: C <= 1024 in bf16 and fp16, 512
// in fp32) and 128-bit access applies, else the streaming kernel; Streamed, always the streaming
// kernel; SumsInRegisters, where Auto takes the rows in registers, that kernel with its column sums
// in registers too (kSumsInRegisters; dev/cuda/layernorm.cu times the three against each other). All
// give the same bits.
enum class LayernormBackwardKernel { Auto, Streamed, SumsInRegisters };
constexpr int kLayernormBackwardRegisterChunks = 4;

// LayerNorm backward, accumulating: dinp += d(loss)/d(inp), dweight += ..., dbias += ... (the
// residual stream's gradient and gradient accumulation over micro-batches rely on the +=).
// dinp_colsum (C), when non-null: += the column sums of dinp as stored after the +=. dinp is then
// the gradient of a residual stream, and these sums are the gradient of the bias of a linear layer
// whose output was added into it (GPT-2's attention and MLP projections), computed from the values
// already in registers instead of by re-reading the (N,C) gradient in that layer's backward.
// mean and rstd are the forward pass's; scratch holds layernorm_backward_scratch_bytes(N, C).
// Deterministic: the same inputs give the same bits, whichever kernel runs.
template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, void* scratch, const T* dout, const T* inp, const T* weight,
                        const float* mean, const float* rstd, int N, int C, cudaStream_t stream,
                        T* dinp_colsum = nullptr, LayernormBackwardKernel which = LayernormBackwardKernel::Auto) {
    layernorm_check_shape("layernorm_backward", N, C);
    if (N == 0) return;
    constexpr int P = Packed128<T>::size;
    bool packed = rows_pack128<T>(C, {dinp, dout, inp, weight});
    int chunks = CEIL_DIV(C, 32 * P);
    auto kernel = packed ? layernorm_backward_kernel<T, P> : layernorm_backward_kernel<T, 1>;
    if (packed && chunks <= kLayernormBackwardRegisterChunks && which == LayernormBackwardKernel::Auto)
        kernel = chunks == 1   ? layernorm_backward_rows_in_registers_kernel<T, 1>
                 : chunks == 2 ? layernorm_backward_rows_in_registers_kernel<T, 2>
                 : chunks == 3 ? layernorm_backward_rows_in_registers_kernel<T, 3>
                               : layernorm_backward_rows_in_registers_kernel<T, 4>;
    if (packed && chunks <= kLayernormBackwardRegisterChunks && which == LayernormBackwardKernel::SumsInRegisters)
        kernel = chunks == 1   ? layernorm_backward_sums_in_registers_kernel<T, 1>
                 : chunks == 2 ? layernorm_backward_sums_in_registers_kernel<T, 2>
                 : chunks == 3 ? layernorm_backward_sums_in_registers_kernel<T, 3>
                               : layernorm_backward_sums_in_registers_kernel<T, 4>;
    int padded_C = packed ? chunks * 32 * P : CEIL_DIV(C, 32) * 32;
    int n_sums = dinp_colsum ? 3 : 2;
    size_t smem = (size_t)kLayernormBackwardWarps * n_sums * padded_C * sizeof(float);
    reserve_dynamic_smem(kernel, smem, "layernorm_backward", "C", C);

    int rows_per_block = layernorm_backward_rows_per_block(N);
    int n_blocks = CEIL_DIV(N, rows_per_block);
    float* partials = static_cast<float*>(scratch);  // (n_blocks,n_sums,C)
    cudaCheck(launch_kernel(kernel, dim3(n_blocks), dim3(32 * kLayernormBackwardWarps), smem, stream, dinp, partials,
                            dout, inp, weight, mean, rstd, N, C, rows_per_block, n_sums));
    cudaCheck(launch_kernel(layernorm_backward_reduce_kernel<T>, dim3(CEIL_DIV(n_sums * C, 32)), dim3(32, 32), 0,
                            stream, dweight, dbias, dinp_colsum, (const float*)partials, n_blocks, C, n_sums));
}
