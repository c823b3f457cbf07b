// llmc/moe.cuh — the kernel layer of a Mixture-of-Experts MLP: router softmax and top-k, the dispatch
// plan (a counting sort of the token -> expert assignments), the permutation of token rows into
// expert-grouped order and back, the weighted combine, and the router's backward with the
// load-balancing and z auxiliary losses. The layer that adds the router GEMM and the expert MLPs is
// llmc/moe_layer.cuh.
//
// Shapes. N tokens (B*T), C channels, E experts, K experts per token (1 <= K <= MOE_MAX_K, K <= E).
// An assignment is a (token n, choice k) pair, numbered a = n*K + k: token-major, k in rank order.
//
// 1. Router (moe_router_forward). Per token, in fp32 whatever the logits' storage type: the softmax
//    probabilities p (kept: the aux loss and the backward need them), logsumexp (the z-loss), and the
//    top K experts. Selection compares the logits, not the probabilities (the softmax is monotone, and
//    two logits that differ can round to the same probability); equal logits go to the lower expert
//    index. Weights: the K probabilities renormalized to sum 1 when K > 1 (Mixtral); with K = 1 the
//    raw probability (Switch Transformers), so that the router still gets a gradient.
//
// 2. Dispatch plan (moe_dispatch_plan), a counting sort on the device. One block per expert walks the
//    N*K assignments in order, a block-wide prefix count (warp ballots) giving each assignment routed
//    to its expert its rank among them; the expert's count is what remains. A single thread turns the
//    counts into offsets (an exclusive prefix sum over E), and each assignment's slot is its expert's
//    offset plus its rank. So the rows of expert e are offsets[e] .. offsets[e+1]-1, its tokens in
//    increasing token order: a stable sort, fixed by the assignments alone.
//    Capacity: with capacity cap > 0, an expert keeps its first cap assignments in token order; the
//    rest are dropped (slot -1): they add nothing to the output, and the token's residual stream
//    carries it past the layer (if all its choices are dropped, the layer's output for it is zero).
//    moe_capacity gives cap = ceil(factor * N * K / E), the expert's share of the assignments times
//    the capacity factor (Switch Transformers' rule, counted in assignments so that it holds for any
//    K); factor 0 means dropless (cap 0). The counts, offsets and the number of kept rows M =
//    offsets[E] stay on the device: no host synchronization. Row buffers are sized for the most rows
//    there can be (moe_max_rows), and the kernels past the plan read M from offsets[E].
//
// 3. Permute (moe_permute) copies token rows into expert-grouped rows, and writes zeros in the rows
//    past M, so that a GEMM over the whole buffer reads defined values. Its backward
//    (moe_permute_backward) gives each token the sum of its kept rows' gradients, read in k order.
//
// 4. Combine (moe_combine): out[n] = sum over kept k of weight[n,k] * expert_out[slot[n,k]], in k
//    order in fp32. Backward (moe_combine_backward): d expert_out[row] = weight * dout[token] (zeros
//    past M) and d weight[n,k] = dot(dout[n], expert_out[slot]) in fp32 (0 for a dropped choice).
//
// 5. Router losses and backward. With f_e = (assignments routed to e, before any dropping) / (N*K)
//    and P_e = mean over tokens of p[n,e]: aux = alpha * E * sum_e f_e * P_e (Switch Transformers; 1 *
//    alpha when balanced; Hugging Face's Mixtral loss counts f_e per token instead, K times this), and
//    z = beta * mean_n logsumexp_n^2 (ST-MoE). f_e is a count and has no gradient. The backward
//    chains d weight through the renormalization to dp for the chosen experts, adds the aux loss's
//    dp[n,e] = dloss * alpha * E * f_e / N for every expert, and the z-loss's dlogsumexp = dloss * 2 *
//    beta * lse / N, then the softmax: dlogit_e = p_e * (g_e - sum_e' p_e' g_e' + dlse).
//
// Determinism. No float atomics and no float sum whose order depends on the schedule: each output
// element is written by exactly one thread, which adds its terms in a fixed order (e, k or c order,
// or a fixed-shape tree: the block reduction of the aux statistics, the warp butterfly of the dot
// products). The plan's ranks are integer counts. So every result is the same bits under any thread
// order and on any run.
//
// Cost. The router is one thread per token looping over E: meant for E up to a few dozen, where a
// (N, E) row is a few cache lines. The plan reads the N*K expert ids once per expert (E blocks):
// O(E*N*K) integer work, small beside the expert GEMMs for such E.
#pragma once
#include "cuda_common.h"
#include "precision.cuh"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>

constexpr int MOE_MAX_K = 8;      // the top-k list lives in registers
constexpr int MOE_BLOCK = 256;    // threads per block of every MoE kernel
constexpr int MOE_WARPS = MOE_BLOCK / 32;

// ----------------------------------------------------------------------------
// CUDA kernels

// One thread per token n: probs[n] (E) = softmax(logits[n]), lse[n] = logsumexp(logits[n]),
// expert[n] (K) = the top K experts by logit (ties: lower index first), weight[n] (K) = their
// probabilities, renormalized to sum 1 when K > 1.
template <class TL>
__global__ void moe_router_forward_kernel(int* expert, float* weight, float* probs, float* lse, const TL* logits,
                                          int N, int E, int K) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const TL* x = logits + (size_t)n * E;
    float* p = probs + (size_t)n * E;

    // Top K by insertion into a list sorted by decreasing logit. A new logit moves past only strictly
    // smaller ones, so among equal logits the earlier (lower) expert stays first.
    int top_e[MOE_MAX_K];
    float top_x[MOE_MAX_K];
    int filled = 0;
    float m = -FLT_MAX;
    for (int e = 0; e < E; e++) {
        float v = to_float(x[e]);
        m = fmaxf(m, v);
        if (filled == K && !(v > top_x[K - 1])) continue;
        int j = filled < K ? filled++ : K - 1;
        while (j > 0 && v > top_x[j - 1]) {
            top_x[j] = top_x[j - 1];
            top_e[j] = top_e[j - 1];
            j--;
        }
        top_x[j] = v;
        top_e[j] = e;
    }

    float s = 0.f;
    for (int e = 0; e < E; e++) s += expf(to_float(x[e]) - m);
    float inv_s = 1.f / s;
    for (int e = 0; e < E; e++) p[e] = expf(to_float(x[e]) - m) * inv_s;
    lse[n] = m + logf(s);

    // The renormalization reads the stored probabilities, in k order, as the backward does.
    float chosen = 0.f;
    for (int k = 0; k < K; k++) chosen += p[top_e[k]];
    float scale = K > 1 ? 1.f / chosen : 1.f;
    for (int k = 0; k < K; k++) {
        expert[(size_t)n * K + k] = top_e[k];
        weight[(size_t)n * K + k] = p[top_e[k]] * scale;
    }
}

// One block per expert e: walks the NK assignments in order and writes, for each one routed to e,
// its rank among them into rank[a]; routed[e] = how many there are. Every thread runs the same
// number of chunks (the loop bound is uniform), so the barriers are reached by all.
__global__ void moe_plan_rank_kernel(int* rank, int* routed, const int* expert, int NK) {
    __shared__ int warp_count[MOE_WARPS];
    int e = blockIdx.x;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int running = 0;  // assignments to e in the chunks before this one
    for (int base = 0; base < NK; base += MOE_BLOCK) {
        int a = base + threadIdx.x;
        bool mine = a < NK && expert[a] == e;
        unsigned ballot = __ballot_sync(0xffffffffu, mine);
        if (lane == 0) warp_count[warp] = __popc(ballot);
        __syncthreads();
        int before = running + __popc(ballot & ((1u << lane) - 1u));
        for (int w = 0; w < MOE_WARPS; w++) {
            if (w < warp) before += warp_count[w];
            running += warp_count[w];
        }
        if (mine) rank[a] = before;
        __syncthreads();  // warp_count is rewritten by the next chunk
    }
    if (threadIdx.x == 0) routed[e] = running;
}

// One thread: offsets (E+1) = exclusive prefix sum of the kept counts, min(routed, cap) (all when
// cap == 0); offsets[E] = M, the rows in use.
__global__ void moe_plan_offsets_kernel(int* offsets, const int* routed, int E, int capacity) {
    int sum = 0;
    for (int e = 0; e < E; e++) {
        offsets[e] = sum;
        sum += capacity > 0 && routed[e] > capacity ? capacity : routed[e];
    }
    offsets[E] = sum;
}

// One thread per assignment a: slot[a] (holding its rank on entry) = offsets[expert] + rank, or -1
// when the rank is past the capacity; row_assign[slot] = a, the inverse map. Slots are distinct, so
// no two threads write the same row.
__global__ void moe_plan_slot_kernel(int* slot, int* row_assign, const int* expert, const int* offsets, int NK,
                                     int capacity) {
    int a = blockIdx.x * blockDim.x + threadIdx.x;
    if (a >= NK) return;
    int r = slot[a];
    if (capacity > 0 && r >= capacity) {
        slot[a] = -1;
        return;
    }
    int s = offsets[expert[a]] + r;
    slot[a] = s;
    row_assign[s] = a;
}

// Copies or zeroes VEC elements (one 128-bit access when VEC is the pack width).
template <int VEC, class T>
__device__ inline void moe_copy(T* dst, const T* src) {
    if constexpr (VEC == Packed128<T>::size) {
        store128(dst, load128(src));
    } else {
        for (int i = 0; i < VEC; i++) dst[i] = src[i];
    }
}
template <int VEC, class T>
__device__ inline void moe_zero(T* dst) {
    if constexpr (VEC == Packed128<T>::size) {
        store128(dst, Packed128<T>::zeros());
    } else {
        for (int i = 0; i < VEC; i++) dst[i] = from_float<T>(0.f);
    }
}

// Loads VEC values as floats / stores VEC floats, each rounded once to T.
template <int VEC, class T>
__device__ inline void moe_load(float* out, const T* p) {
    if constexpr (VEC == Packed128<T>::size) {
        Packed128<T> pack = load128(p);
        for (int i = 0; i < VEC; i++) out[i] = to_float(pack[i]);
    } else {
        for (int i = 0; i < VEC; i++) out[i] = to_float(p[i]);
    }
}
template <int VEC, class T>
__device__ inline void moe_store(T* p, const float* in) {
    if constexpr (VEC == Packed128<T>::size) {
        Packed128<T> pack;
        for (int i = 0; i < VEC; i++) pack[i] = from_float<T>(in[i]);
        store128(p, pack);
    } else {
        for (int i = 0; i < VEC; i++) p[i] = from_float<T>(in[i]);
    }
}

// One thread per VEC channels of one expert-grouped row r of R: xe[r] = x[token of row_assign[r]]
// for r < M = offsets[E], zeros after. C % VEC == 0.
template <class T, int VEC>
__global__ void moe_permute_kernel(T* xe, const T* x, const int* row_assign, const int* offsets, int E, int K, int R,
                                   int C) {
    int packs = C / VEC;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)R * packs) return;
    int r = (int)(idx / packs), c = (int)(idx % packs) * VEC;
    T* dst = xe + (size_t)r * C + c;
    if (r < offsets[E]) {
        moe_copy<VEC>(dst, x + (size_t)(row_assign[r] / K) * C + c);
    } else {
        moe_zero<VEC>(dst);
    }
}

// One thread per VEC channels of one token n: dx[n] = sum over kept k, in k order, of dxe[slot[n,k]]
// (fp32, rounded once); zeros for a token with no kept choice. C % VEC == 0.
template <class T, int VEC>
__global__ void moe_permute_backward_kernel(T* dx, const T* dxe, const int* slot, int N, int K, int C) {
    int packs = C / VEC;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * packs) return;
    int n = (int)(idx / packs), c = (int)(idx % packs) * VEC;
    float acc[VEC] = {};
    for (int k = 0; k < K; k++) {
        int s = slot[(size_t)n * K + k];
        if (s < 0) continue;
        float v[VEC];
        moe_load<VEC>(v, dxe + (size_t)s * C + c);
        for (int i = 0; i < VEC; i++) acc[i] += v[i];
    }
    moe_store<VEC>(dx + (size_t)n * C + c, acc);
}

// One thread per VEC channels of one token n: out[n] = sum over kept k, in k order, of weight[n,k] *
// ye[slot[n,k]] (fp32, rounded once). C % VEC == 0.
template <class T, int VEC>
__global__ void moe_combine_kernel(T* out, const T* ye, const float* weight, const int* slot, int N, int K, int C) {
    int packs = C / VEC;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * packs) return;
    int n = (int)(idx / packs), c = (int)(idx % packs) * VEC;
    float acc[VEC] = {};
    for (int k = 0; k < K; k++) {
        int s = slot[(size_t)n * K + k];
        if (s < 0) continue;
        float w = weight[(size_t)n * K + k];
        float v[VEC];
        moe_load<VEC>(v, ye + (size_t)s * C + c);
        for (int i = 0; i < VEC; i++) acc[i] += w * v[i];
    }
    moe_store<VEC>(out + (size_t)n * C + c, acc);
}

// One thread per VEC channels of one expert-grouped row r of R: dye[r] = weight[a] * dout[token of a]
// with a = row_assign[r], for r < M; zeros after. C % VEC == 0.
template <class T, int VEC>
__global__ void moe_combine_backward_rows_kernel(T* dye, const T* dout, const float* weight, const int* row_assign,
                                                 const int* offsets, int E, int K, int R, int C) {
    int packs = C / VEC;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)R * packs) return;
    int r = (int)(idx / packs), c = (int)(idx % packs) * VEC;
    T* dst = dye + (size_t)r * C + c;
    if (r >= offsets[E]) {
        moe_zero<VEC>(dst);
        return;
    }
    int a = row_assign[r];
    float w = weight[a];
    float v[VEC];
    moe_load<VEC>(v, dout + (size_t)(a / K) * C + c);
    for (int i = 0; i < VEC; i++) v[i] *= w;
    moe_store<VEC>(dst, v);
}

// One warp per assignment a: dweight[a] = dot(dout[token], ye[slot[a]]) in fp32 (lane l adds channels
// l, l+32, ... in order, then a butterfly), 0 when the choice was dropped. The warp's lanes all take
// the same branch (slot[a] is one value per warp), so the shuffle's full mask holds.
template <class T>
__global__ void moe_combine_backward_weight_kernel(float* dweight, const T* dout, const T* ye, const int* slot, int NK,
                                                   int K, int C) {
    int a = blockIdx.x * MOE_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (a >= NK) return;
    int s = slot[a];
    if (s < 0) {
        if (lane == 0) dweight[a] = 0.f;
        return;
    }
    const T* g = dout + (size_t)(a / K) * C;
    const T* y = ye + (size_t)s * C;
    float sum = 0.f;
    for (int c = lane; c < C; c += 32) sum += to_float(g[c]) * to_float(y[c]);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) dweight[a] = sum;
}

// Block e < E: importance[e] = mean over tokens of probs[:, e]; block E: losses[1] = beta * mean of
// lse^2. Each thread adds its strided share in token order, then a fixed tree over the block.
__global__ void moe_router_stats_kernel(float* importance, float* losses, const float* probs, const float* lse, int N,
                                        int E, float beta) {
    __shared__ float part[MOE_BLOCK];
    int e = blockIdx.x;
    float sum = 0.f;
    for (int n = threadIdx.x; n < N; n += MOE_BLOCK) {
        float v = e < E ? probs[(size_t)n * E + e] : lse[n];
        sum += e < E ? v : v * v;
    }
    part[threadIdx.x] = sum;
    __syncthreads();
    for (int half = MOE_BLOCK / 2; half > 0; half >>= 1) {
        if ((int)threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x != 0) return;
    if (e < E) {
        importance[e] = part[0] / N;
    } else {
        losses[1] = beta * (part[0] / N);
    }
}

// One thread: load[e] = f_e = routed[e] / (N*K), losses[0] = alpha * E * sum_e f_e * importance[e].
__global__ void moe_router_aux_kernel(float* losses, float* load, const float* importance, const int* routed, int N,
                                      int E, int K, float alpha) {
    float sum = 0.f;
    for (int e = 0; e < E; e++) {
        load[e] = (float)routed[e] / ((float)N * K);
        sum += load[e] * importance[e];
    }
    losses[0] = alpha * E * sum;
}

// One thread per token n: dlogits[n] (E) from dweight[n] (K) through the top-k weights, plus the aux
// and z losses' gradients scaled by dloss (see the file's top comment for the formulas).
template <class TL>
__global__ void moe_router_backward_kernel(TL* dlogits, const float* dweight, const int* expert, const float* weight,
                                           const float* probs, const float* lse, const int* routed, int N, int E,
                                           int K, float alpha, float beta, float dloss) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float* p = probs + (size_t)n * E;
    const int* ex = expert + (size_t)n * K;

    // dp of the chosen experts. K > 1: w_j = p_j / S, so dp_j = (dw_j - sum_l dw_l w_l) / S.
    float dp[MOE_MAX_K];
    if (K == 1) {
        dp[0] = dweight[n];
    } else {
        float chosen = 0.f, dot = 0.f;
        for (int k = 0; k < K; k++) {
            chosen += p[ex[k]];
            dot += dweight[(size_t)n * K + k] * weight[(size_t)n * K + k];
        }
        for (int k = 0; k < K; k++) dp[k] = (dweight[(size_t)n * K + k] - dot) / chosen;
    }
    // The aux loss's dp[n,e] = c * routed[e] with c = dloss * alpha * E / (N * N * K).
    float c_aux = dloss * alpha * E / ((float)N * N * K);
    float dlse = dloss * 2.f * beta * lse[n] / N;

    // g_e = aux_e + dp of e if chosen (the K experts are distinct); s = sum_e p_e g_e.
    auto grad_p = [&](int e) {
        float g = c_aux * routed[e];
        for (int k = 0; k < K; k++)
            if (ex[k] == e) g += dp[k];
        return g;
    };
    float s = 0.f;
    for (int e = 0; e < E; e++) s += p[e] * grad_p(e);
    for (int e = 0; e < E; e++) dlogits[(size_t)n * E + e] = from_float<TL>(p[e] * (grad_p(e) - s + dlse));
}

// ----------------------------------------------------------------------------
// kernel launchers

// Capacity per expert for a capacity factor: ceil(factor * N * K / E) assignments (at least 1);
// factor <= 0 gives 0, dropless.
inline int moe_capacity(float factor, int N, int K, int E) {
    if (factor <= 0.f) return 0;
    int cap = (int)std::ceil((double)factor * N * K / E);
    return cap > 0 ? cap : 1;
}

// The most expert-grouped rows a plan can fill: N*K, or E*capacity when that is smaller.
inline int moe_max_rows(int N, int K, int E, int capacity) {
    long long all = (long long)N * K;
    return capacity > 0 && (long long)E * capacity < all ? E * capacity : (int)all;
}

// Exits with a message unless the shape is one the kernels handle.
inline void moe_check_shape(const char* who, int N, int E, int K) {
    if (N < 0 || E <= 0 || K < 1 || K > E || K > MOE_MAX_K) {
        fprintf(stderr, "%s: need N >= 0, E > 0 and 1 <= K <= min(E, %d), got N=%d E=%d K=%d\n", who, MOE_MAX_K, N,
                E, K);
        exit(EXIT_FAILURE);
    }
}

// Whether C and every pointer allow one Packed128 per thread.
template <class T>
inline bool moe_can_pack(int C, std::initializer_list<const void*> ptrs) {
    if (C % Packed128<T>::size != 0) return false;
    for (const void* p : ptrs)
        if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
    return true;
}

// Router: logits (N,E) in TL (a storage type or float) -> expert (N,K) ints, weight (N,K), probs
// (N,E) and lse (N) fp32.
template <class TL>
void moe_router_forward(int* expert, float* weight, float* probs, float* lse, const TL* logits, int N, int E, int K,
                        cudaStream_t stream) {
    moe_check_shape("moe_router_forward", N, E, K);
    if (N == 0) return;
    cudaCheck(launch_kernel(moe_router_forward_kernel<TL>, dim3(CEIL_DIV(N, MOE_BLOCK)), dim3(MOE_BLOCK), 0, stream,
                            expert, weight, probs, lse, logits, N, E, K));
}

// Dispatch plan from expert (N,K): slot (N,K) = the assignment's expert-grouped row, or -1 if dropped;
// row_assign (moe_max_rows) = the assignment in each row (rows past M unwritten); routed (E) = the
// assignments routed to each expert before dropping; offsets (E+1) = first row of each expert, and
// offsets[E] = M. capacity 0: dropless.
inline void moe_dispatch_plan(int* slot, int* row_assign, int* routed, int* offsets, const int* expert, int N, int K,
                              int E, int capacity, cudaStream_t stream) {
    moe_check_shape("moe_dispatch_plan", N, E, K);
    if (capacity < 0) {
        fprintf(stderr, "moe_dispatch_plan: need capacity >= 0 (0: dropless), got %d\n", capacity);
        exit(EXIT_FAILURE);
    }
    int NK = N * K;
    cudaCheck(launch_kernel(moe_plan_rank_kernel, dim3(E), dim3(MOE_BLOCK), 0, stream, slot, routed, expert, NK));
    cudaCheck(launch_kernel(moe_plan_offsets_kernel, dim3(1), dim3(1), 0, stream, offsets, routed, E, capacity));
    if (NK == 0) return;
    cudaCheck(launch_kernel(moe_plan_slot_kernel, dim3(CEIL_DIV(NK, MOE_BLOCK)), dim3(MOE_BLOCK), 0, stream, slot,
                            row_assign, expert, offsets, NK, capacity));
}

// xe (R,C) = the token rows of x (N,C) in expert-grouped order, zeros past M; R = moe_max_rows.
template <class T>
void moe_permute(T* xe, const T* x, const int* row_assign, const int* offsets, int E, int K, int R, int C,
                 cudaStream_t stream) {
    if (R < 0 || C <= 0) {
        fprintf(stderr, "moe_permute: need R >= 0 rows and C > 0 channels, got R=%d C=%d\n", R, C);
        exit(EXIT_FAILURE);
    }
    if (R == 0) return;
    if (moe_can_pack<T>(C, {xe, x})) {
        constexpr int P = Packed128<T>::size;
        size_t threads = (size_t)R * (C / P);
        cudaCheck(launch_kernel(moe_permute_kernel<T, P>, dim3((unsigned)CEIL_DIV(threads, (size_t)MOE_BLOCK)),
                                dim3(MOE_BLOCK), 0, stream, xe, x, row_assign, offsets, E, K, R, C));
    } else {
        size_t threads = (size_t)R * C;
        cudaCheck(launch_kernel(moe_permute_kernel<T, 1>, dim3((unsigned)CEIL_DIV(threads, (size_t)MOE_BLOCK)),
                                dim3(MOE_BLOCK), 0, stream, xe, x, row_assign, offsets, E, K, R, C));
    }
}

// The backward of moe_permute: dx (N,C, overwritten) = the sum of each token's kept rows of dxe (R,C).
template <class T>
void moe_permute_backward(T* dx, const T* dxe, const int* slot, int N, int K, int C, cudaStream_t stream) {
    if (N < 0 || K < 1 || C <= 0) {
        fprintf(stderr, "moe_permute_backward: need N >= 0, K >= 1, C > 0, got N=%d K=%d C=%d\n", N, K, C);
        exit(EXIT_FAILURE);
    }
    if (N == 0) return;
    if (moe_can_pack<T>(C, {dx, dxe})) {
        constexpr int P = Packed128<T>::size;
        size_t threads = (size_t)N * (C / P);
        cudaCheck(launch_kernel(moe_permute_backward_kernel<T, P>,
                                dim3((unsigned)CEIL_DIV(threads, (size_t)MOE_BLOCK)), dim3(MOE_BLOCK), 0, stream, dx,
                                dxe, slot, N, K, C));
    } else {
        size_t threads = (size_t)N * C;
        cudaCheck(launch_kernel(moe_permute_backward_kernel<T, 1>,
                                dim3((unsigned)CEIL_DIV(threads, (size_t)MOE_BLOCK)), dim3(MOE_BLOCK), 0, stream, dx,
                                dxe, slot, N, K, C));
    }
}

// out (N,C, overwritten) = sum over kept k of weight (N,K) * ye (R,C) at slot (N,K).
template <class T>
void moe_combine(T* out, const T* ye, const float* weight, const int* slot, int N, int K, int C, cudaStream_t stream) {
    if (N < 0 || K < 1 || C <= 0) {
        fprintf(stderr, "moe_combine: need N >= 0, K >= 1, C > 0, got N=%d K=%d C=%d\n", N, K, C);
        exit(EXIT_FAILURE);
    }
    if (N == 0) return;
    if (moe_can_pack<T>(C, {out, ye})) {
        constexpr int P = Packed128<T>::size;
        size_t threads = (size_t)N * (C / P);
        cudaCheck(launch_kernel(moe_combine_kernel<T, P>, dim3((unsigned)CEIL_DIV(threads, (size_t)MOE_BLOCK)),
                                dim3(MOE_BLOCK), 0, stream, out, ye, weight, slot, N, K, C));
    } else {
        size_t threads = (size_t)N * C;
        cudaCheck(launch_kernel(moe_combine_kernel<T, 1>, dim3((unsigned)CEIL_DIV(threads, (size_t)MOE_BLOCK)),
                                dim3(MOE_BLOCK), 0, stream, out, ye, weight, slot, N, K, C));
    }
}

// The weight half of moe_combine's backward: dweight (N,K, overwritten; 0 for dropped choices) =
// dot(dout[n], ye[slot[n,k]]), for dout (N,C) and the rows ye (any row count) that slot (N,K) indexes.
template <class T>
void moe_combine_backward_weight(float* dweight, const T* dout, const T* ye, const int* slot, int N, int K, int C,
                                 cudaStream_t stream) {
    int NK = N * K;
    if (NK == 0) return;
    cudaCheck(launch_kernel(moe_combine_backward_weight_kernel<T>, dim3(CEIL_DIV(NK, MOE_WARPS)), dim3(MOE_BLOCK), 0,
                            stream, dweight, dout, ye, slot, NK, K, C));
}

// The backward of moe_combine: dye (R,C, overwritten; zeros past M) and dweight (N,K, overwritten; 0
// for dropped choices) from dout (N,C), with ye (R,C) and weight (N,K) of the forward.
template <class T>
void moe_combine_backward(T* dye, float* dweight, const T* dout, const T* ye, const float* weight, const int* slot,
                          const int* row_assign, const int* offsets, int N, int K, int E, int R, int C,
                          cudaStream_t stream) {
    if (N < 0 || K < 1 || R < 0 || C <= 0) {
        fprintf(stderr, "moe_combine_backward: need N >= 0, K >= 1, R >= 0, C > 0, got N=%d K=%d R=%d C=%d\n", N, K,
                R, C);
        exit(EXIT_FAILURE);
    }
    if (R > 0) {
        if (moe_can_pack<T>(C, {dye, dout})) {
            constexpr int P = Packed128<T>::size;
            size_t threads = (size_t)R * (C / P);
            cudaCheck(launch_kernel(moe_combine_backward_rows_kernel<T, P>,
                                    dim3((unsigned)CEIL_DIV(threads, (size_t)MOE_BLOCK)), dim3(MOE_BLOCK), 0, stream,
                                    dye, dout, weight, row_assign, offsets, E, K, R, C));
        } else {
            size_t threads = (size_t)R * C;
            cudaCheck(launch_kernel(moe_combine_backward_rows_kernel<T, 1>,
                                    dim3((unsigned)CEIL_DIV(threads, (size_t)MOE_BLOCK)), dim3(MOE_BLOCK), 0, stream,
                                    dye, dout, weight, row_assign, offsets, E, K, R, C));
        }
    }
    moe_combine_backward_weight(dweight, dout, ye, slot, N, K, C, stream);
}

// The auxiliary losses: losses (2) = {aux, z}; load (E) = f_e, the fraction of assignments routed to
// each expert; importance (E) = P_e, the mean router probability. From the router's probs (N,E) and
// lse (N) and the plan's routed (E). N > 0.
inline void moe_router_losses(float* losses, float* load, float* importance, const float* probs, const float* lse,
                              const int* routed, int N, int E, int K, float alpha, float beta, cudaStream_t stream) {
    moe_check_shape("moe_router_losses", N, E, K);
    if (N == 0) {
        fprintf(stderr, "moe_router_losses: need N > 0 tokens (the losses are means over them)\n");
        exit(EXIT_FAILURE);
    }
    cudaCheck(launch_kernel(moe_router_stats_kernel, dim3(E + 1), dim3(MOE_BLOCK), 0, stream, importance, losses, probs,
                            lse, N, E, beta));
    cudaCheck(launch_kernel(moe_router_aux_kernel, dim3(1), dim3(1), 0, stream, losses, load, importance, routed, N, E,
                            K, alpha));
}

// The router's backward: dlogits (N,E, overwritten, in TL) from dweight (N,K) and the aux and z
// losses' gradients times dloss (the training objective's weight of a unit of them: 1, or 1/grad
// accumulation steps, times the loss scale).
template <class TL>
void moe_router_backward(TL* dlogits, const float* dweight, const int* expert, const float* weight, const float* probs,
                         const float* lse, const int* routed, int N, int E, int K, float alpha, float beta,
                         float dloss, cudaStream_t stream) {
    moe_check_shape("moe_router_backward", N, E, K);
    if (N == 0) return;
    cudaCheck(launch_kernel(moe_router_backward_kernel<TL>, dim3(CEIL_DIV(N, MOE_BLOCK)), dim3(MOE_BLOCK), 0, stream,
                            dlogits, dweight, expert, weight, probs, lse, routed, N, E, K, alpha, beta, dloss));
}
