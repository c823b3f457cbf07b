// llmc/moe_layer.cuh — a Mixture-of-Experts MLP layer, forward and backward, shared by the trainers:
// a router linear layer, llmc/moe.cuh's routing (softmax, top-K, dispatch plan with capacity,
// auxiliary losses), E expert MLPs over the expert-grouped token rows, and the weighted combine.
//
// What it computes, for x (N,C) -> y (N,C) (N tokens, C channels, E experts, K per token):
//   logits = x · routerᵀ                       router (E,C), no bias
//   top-K experts per token by logit, weights: the raw probability when K = 1 (Switch
//   Transformers), the K probabilities renormalized to sum 1 when K > 1 (Mixtral) (llmc/moe.cuh)
//   y[n] = sum over the token's kept choices (e, w) of w * expert_e(x[n])
// Experts (H hidden units each, no biases):
//   Gelu:   expert(x) = W2_e · gelu_new(W1_e · x)            W1 (E,H,C), W2 (E,C,H): GPT-2's MLP
//   SwiGLU: expert(x) = W2_e · (silu(G_e · x) * (U_e · x))   W1 (E,2H,C) holds G_e in rows [0,H) and
//           U_e in rows [H,2H) (one GEMM makes both halves), W2 (E,C,H): Mixtral's w1, w3, w2
// Auxiliary losses (llmc/moe.cuh): aux = alpha * E * sum_e f_e P_e (f_e: the share of the N*K
// assignments routed to e before dropping; P_e: the mean router probability of e) and z = beta *
// mean_n logsumexp(logits[n])^2. Hugging Face's Switch load_balancing_loss_func is aux at alpha = 1;
// its Mixtral loss is K times that.
//
// Capacity. cap = ceil(capacity_factor * N * K / E) assignments per expert (capacity_factor 0:
// dropless). Each expert keeps its first cap assignments in token order and drops the rest; a
// dropped choice adds nothing to y (a token whose every choice is dropped gets y = 0, and the
// residual stream around the layer carries it). The load-balancing loss still counts dropped
// assignments in f_e: it measures where the router sends tokens, not what fit.
//
// Expert GEMMs without host synchronization. Which rows belong to which expert is known only on the
// device (the plan's offsets), and neither this project's cuBLASLt use nor the CPU backend has a
// grouped GEMM. So the rows are laid out as E blocks of a fixed Rb rows each (expert e's kept
// assignments first, in token order, then zero rows), and every expert GEMM is ONE strided-batched
// cuBLASLt matmul over the E blocks (batch e multiplies block e by expert e's weights). Rb is the
// most rows an expert can hold: min(cap, N) with capacity (an expert gets at most one assignment per
// token, the K choices being distinct), N when dropless. The trade-off is compute and memory on the
// padding: the GEMMs process E*Rb rows for the M <= N*K in use. With a capacity factor f that is
// about f*N*K rows (the factor's own headroom, as in Switch Transformers' fixed-capacity TPU
// layout); dropless it is E*N rows, E/K times the work of the rows in use (as much as running every
// token through every expert). A grouped GEMM reading the device offsets would remove that waste;
// it is future work. The zero rows are harmless: they give zero expert outputs, nothing in the
// combine reads them, and their gradients are zero, so they add nothing to the weight gradients.
//
// Expert parallelism (MoeParallel, ranks P > 1). The E experts are sharded over P ranks, each
// holding E_l = E/P of them: rank r the global experts [r*E_l, (r+1)*E_l). Every rank routes its own
// N tokens over all E experts exactly as above — the plan, and the capacity counted over the rank's
// own N tokens (GShard's per-group capacity: each rank is a group) —, then the padded blocks move to
// the experts' ranks and back. The padded layout makes that exchange independent of the routing
// (fixed sizes: no counts exchanged, no host synchronization): block e (Rb rows) of the dispatch
// buffer goes to rank e / E_l, and rank d puts the block of its local expert el from source rank s
// at block el*P + s. So each local expert's rows are P*Rb contiguous rows (every source rank's
// block in rank order), and the expert GEMMs stay ONE strided-batched GEMM, over E_l batches of
// P*Rb rows. The expert outputs return by the reverse exchange into the dispatch layout, and the
// combine runs as with one rank. Backward: dye goes the forward way, the local experts' weight
// gradients come from P*Rb rows each, dxe goes back. Every transfer is a grouped ncclSend/ncclRecv
// on the layer's stream. The expert weight gradients are scaled by 1/P: each rank's loss is the
// mean over its own tokens, and data parallelism averages the replicated parameters' gradients over
// the ranks, so the experts' (summed over every rank's tokens by the GEMM) get the same mean.
// With P = 1 none of this happens: no NCCL calls, the single-process arithmetic bit for bit.
//
// Saved for the backward (MoeLayer's buffers, sized for N tokens): the logits, the router's fp32
// probabilities, logsumexp, experts and weights, the plan, and per padded row the expert input xe,
// the first GEMM's output hpre and the activation hact (what GPT-2's MLP keeps too, per expert row).
//
// Gradients accumulate (+=) into the router and expert weight gradients, as matmul_backward's do;
// dx is overwritten. Everything is deterministic: the GEMMs, and llmc/moe.cuh's kernels, add in
// fixed orders.
#pragma once
#include "cuda_common.h"
#include "distributed.h"
#include "gelu.cuh"
#include "matmul.cuh"
#include "moe.cuh"
#include "precision.cuh"
#include "swiglu.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

// Which expert MLP.
enum class MoeExperts { Gelu, SwiGLU };

// The layer's shape and coefficients.
struct MoeConfig {
    int C = 0;                    // channels
    int E = 0;                    // experts
    int K = 1;                    // experts per token
    int H = 0;                    // hidden units per expert (GPT-2: 4C)
    MoeExperts experts = MoeExperts::Gelu;
    float capacity_factor = 0.f;  // 0: dropless
    float alpha = 0.f;            // load-balancing loss coefficient
    float beta = 0.f;             // z-loss coefficient
    // Rows of W1 per expert: H, or 2H for SwiGLU's stacked gate and up projections.
    int w1_rows() const { return experts == MoeExperts::SwiGLU ? 2 * H : H; }
};

// Expert parallelism: the ranks the experts are sharded over (1: every expert on this rank).
struct MoeParallel {
    int ranks = 1, rank = 0;
    ncclComm_t comm = nullptr;  // the ranks' communicator (ranks > 1)
};

// The layer's weights (or their gradients): router (E,C), w1 (E_l,w1_rows,C), w2 (E_l,C,H) — the
// E_l = E/ranks experts this rank holds (all E with one rank).
template <class T>
struct MoeWeights {
    T* router = nullptr;
    T* w1 = nullptr;
    T* w2 = nullptr;
};

// What the forward saves for the backward, and the backward's scratch, for N tokens.
template <class T>
struct MoeLayer {
    MoeConfig cfg;
    MoeParallel par;
    int N = 0, capacity = 0, Rb = 0;  // Rb: padded rows per expert
    // Router: logits (N,E), probs (N,E), lse (N), expert and weight (N,K).
    T* logits = nullptr;
    float *probs = nullptr, *lse = nullptr, *weight = nullptr;
    int* expert = nullptr;
    // Plan (llmc/moe.cuh): slot (N,K), row_assign (N*K), routed (E), offsets (E+1); and its padded
    // form: pslot (N,K) = the padded row of each kept assignment (-1 when dropped), prow (E*Rb) = the
    // assignment in each padded row (-1 for padding).
    int *slot = nullptr, *row_assign = nullptr, *routed = nullptr, *offsets = nullptr, *pslot = nullptr,
        *prow = nullptr;
    // losses (2) = {aux, z}, load (E) = f_e, importance (E) = P_e.
    float *losses = nullptr, *load = nullptr, *importance = nullptr;
    // Padded expert rows: xe (E*Rb,C), hpre (E*Rb,w1_rows), hact (E*Rb,H), ye (E*Rb,C).
    T *xe = nullptr, *hpre = nullptr, *hact = nullptr, *ye = nullptr;
    // Backward scratch: dye (E*Rb,C), dhact (E*Rb,H), dhpre (E*Rb,w1_rows), dxe (E*Rb,C), dweight
    // (N,K), dlogits (N,E).
    T *dye = nullptr, *dhact = nullptr, *dhpre = nullptr, *dxe = nullptr, *dlogits = nullptr;
    float* dweight = nullptr;
    // The rows the local experts process, (E*Rb,C) each, in the experts' layout (E_l blocks of
    // ranks*Rb rows): their own buffers with several ranks, else the same memory as xe, ye, dye, dxe.
    // hpre, hact, dhact and dhpre are always in this layout (with one rank the two layouts agree).
    T *xr = nullptr, *yr = nullptr, *dyr = nullptr, *dxr = nullptr;
};

// ----------------------------------------------------------------------------
// CUDA kernels

// Threads i < E*Rb: prow[i] = the assignment in padded row i (expert i / Rb, its (i % Rb)-th kept
// assignment), or -1 past the expert's kept count. Threads i < NK: pslot[i] = the padded row of
// assignment i, expert * Rb + its rank among the expert's kept rows, or -1 when dropped.
__global__ void moe_pad_plan_kernel(int* prow, int* pslot, const int* row_assign, const int* slot,
                                    const int* expert, const int* offsets, int E, int Rb, int NK) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < E * Rb) {
        int e = i / Rb, j = i % Rb;
        prow[i] = j < offsets[e + 1] - offsets[e] ? row_assign[offsets[e] + j] : -1;
    }
    if (i < NK) {
        int s = slot[i], e = expert[i];
        pslot[i] = s < 0 ? -1 : e * Rb + (s - offsets[e]);
    }
}

// One thread per element (r, c) of out (R,C): out[r] = src[token of prow[r]] times weight[prow[r]]
// (when weight is non-null), zeros for padding rows. The forward's gather of expert inputs (no
// weight: an exact copy) and the combine's backward into the expert rows (weight: w * dy).
template <class T>
__global__ void moe_gather_rows_kernel(T* out, const T* src, const float* weight, const int* prow, int K, int R,
                                       int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)R * C) return;
    int r = (int)(i / C), c = (int)(i % C);
    int a = prow[r];
    if (a < 0) {
        out[i] = from_float<T>(0.f);
        return;
    }
    float v = to_float(src[(size_t)(a / K) * C + c]);
    out[i] = from_float<T>(weight ? weight[a] * v : v);
}

// ----------------------------------------------------------------------------
// Strided-batched GEMM

// For each b < batch: D_b (m,n) = alpha op(A_b) op(B_b) + beta * D_b, column-major, with X_b = X + b *
// stride_x elements (cuBLASLt's strided batch layouts). Exits if cuBLASLt refuses it.
template <class T>
void moe_batched_matmul(T* d, const T* a, const T* b, int m, int n, int k, bool transa, bool transb, int lda, int ldb,
                        int ldd, long long stride_a, long long stride_b, long long stride_d, int batch, float beta,
                        cudaStream_t stream, float alpha = 1.f) {
    MatmulContext& ctx = matmul_context();
    cublasComputeType_t compute =
        (ctx.tf32 && cuda_dtype<T>() == CUDA_R_32F) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const cudaDataType_t type = cuda_dtype<T>();
    auto make = [&](MatmulPlan& plan) {
        cublasCheck(cublasLtMatmulDescCreate(&plan.desc, compute, CUDA_R_32F));
        set_desc_ops(plan.desc, transa, transb, CUBLASLT_EPILOGUE_DEFAULT);
        cublasCheck(cublasLtMatrixLayoutCreate(&plan.a, type, transa ? k : m, transa ? m : k, lda));
        cublasCheck(cublasLtMatrixLayoutCreate(&plan.b, type, transb ? n : k, transb ? k : n, ldb));
        cublasCheck(cublasLtMatrixLayoutCreate(&plan.d, type, m, n, ldd));
        const std::pair<cublasLtMatrixLayout_t, int64_t> strided[] = {
            {plan.a, stride_a}, {plan.b, stride_b}, {plan.d, stride_d}};
        for (const auto& [layout, stride] : strided) {
            int32_t count = batch;
            cublasCheck(
                cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
            cublasCheck(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                         sizeof(stride)));
        }
    };
    // The plan cache's key: the transa slot carries the batch count too (2 * batch + transa is
    // at least 2, where plain calls put 0 or 1), so a batched shape never reuses a plain shape's
    // plan, nor one of another batch count.
    MatmulKey key{m, n, k, 2 * batch + (int)transa, (int)transb, (int)CUBLASLT_EPILOGUE_DEFAULT, (int)type,
                  (int)compute};
    MatmulLayoutKey layout{lda, ldb, ldd, 0, stride_a, stride_b, stride_d};
    if (!cublaslt_run(key, layout, make, MatmulPointers{}, alpha, a, b, beta, d, stream)) {
        fprintf(stderr, "moe_batched_matmul: cuBLASLt supports no algorithm for m=%d n=%d k=%d batch=%d\n", m, n, k,
                batch);
        exit(EXIT_FAILURE);
    }
}

// ----------------------------------------------------------------------------
// The token exchange of expert parallelism

// Moves blocks of Rb rows (cols values each) between the dispatch layout (E blocks, block e for
// global expert e) and the experts' layout (E_l blocks of ranks*Rb rows: local expert el's block from
// source rank s at el*ranks + s), over every rank: to_experts sends each dispatch block to its
// expert's rank; !to_experts sends each block back to its source rank. One group of sends and
// receives on stream; with every peer's k-th send to this rank meeting this rank's k-th receive
// from that peer (NCCL's pairing), both loops below list the E_l blocks of a peer in local-expert
// order. dst and src are (E*Rb, cols) and must not overlap.
template <class T>
void moe_exchange(T* dst, const T* src, const MoeLayer<T>& L, size_t cols, bool to_experts, cudaStream_t stream) {
#ifdef USE_MPI
    const int P = L.par.ranks, El = L.cfg.E / P;
    const size_t block = (size_t)L.Rb * cols;
    const ncclDataType_t type = NcclType<T>::value;
    ncclCheck(ncclGroupStart());
    for (int p = 0; p < P; p++)
        for (int el = 0; el < El; el++) {
            size_t dispatch = (size_t)(p * El + el) * block;  // global expert p*El+el: local expert el of rank p
            size_t experts = (size_t)(el * P + p) * block;    // local expert el's rows from rank p
            ncclCheck(ncclSend(src + (to_experts ? dispatch : experts), block, type, p, L.par.comm, stream));
            ncclCheck(ncclRecv(dst + (to_experts ? experts : dispatch), block, type, p, L.par.comm, stream));
        }
    ncclCheck(ncclGroupEnd());
#else
    (void)dst, (void)src, (void)L, (void)cols, (void)to_experts, (void)stream;
#endif
}

// ----------------------------------------------------------------------------
// The layer

// Rows per expert block: the most an expert can keep (see the top comment).
inline int moe_layer_block_rows(int N, int capacity) { return capacity > 0 ? std::min(capacity, N) : N; }

// Allocates the layer's buffers for N tokens (N > 0) of configuration cfg, its experts sharded over
// par's ranks (which must divide E).
template <class T>
void moe_layer_init(MoeLayer<T>* L, const MoeConfig& cfg, int N, const MoeParallel& par = MoeParallel()) {
    moe_check_shape("moe_layer_init", N, cfg.E, cfg.K);
    if (N <= 0 || cfg.C <= 0 || cfg.H <= 0 || cfg.capacity_factor < 0.f) {
        fprintf(stderr, "moe_layer_init: need N, C, H > 0 and capacity_factor >= 0, got N=%d C=%d H=%d factor=%g\n",
                N, cfg.C, cfg.H, cfg.capacity_factor);
        exit(EXIT_FAILURE);
    }
    bool multi = false;
#ifdef USE_MPI
    multi = true;
#endif
    if (par.ranks < 1 || cfg.E % par.ranks != 0 || par.rank < 0 || par.rank >= par.ranks ||
        (par.ranks > 1 && (!multi || !par.comm))) {
        fprintf(stderr, "moe_layer_init: experts over %d ranks (rank %d): need ranks dividing E=%d and, for more "
                "than one, an NCCL communicator (a build with MPI)\n", par.ranks, par.rank, cfg.E);
        exit(EXIT_FAILURE);
    }
    L->cfg = cfg;
    L->par = par;
    L->N = N;
    L->capacity = moe_capacity(cfg.capacity_factor, N, cfg.K, cfg.E);
    L->Rb = moe_layer_block_rows(N, L->capacity);
    const size_t NK = (size_t)N * cfg.K, NE = (size_t)N * cfg.E, R = (size_t)cfg.E * L->Rb;
    const size_t C = cfg.C, H = cfg.H, H1 = cfg.w1_rows();
    auto alloc = [](auto** p, size_t n) { cudaMallocCheck(p, n * sizeof(**p)); };
    alloc(&L->logits, NE);
    alloc(&L->probs, NE);
    alloc(&L->lse, N);
    alloc(&L->weight, NK);
    alloc(&L->expert, NK);
    alloc(&L->slot, NK);
    alloc(&L->row_assign, NK);
    alloc(&L->routed, cfg.E);
    alloc(&L->offsets, cfg.E + 1);
    alloc(&L->pslot, NK);
    alloc(&L->prow, R);
    alloc(&L->losses, 2);
    alloc(&L->load, cfg.E);
    alloc(&L->importance, cfg.E);
    alloc(&L->xe, R * C);
    alloc(&L->hpre, R * H1);
    alloc(&L->hact, R * H);
    alloc(&L->ye, R * C);
    alloc(&L->dye, R * C);
    alloc(&L->dhact, R * H);
    alloc(&L->dhpre, R * H1);
    alloc(&L->dxe, R * C);
    alloc(&L->dweight, NK);
    alloc(&L->dlogits, NE);
    if (par.ranks > 1) {
        alloc(&L->xr, R * C);
        alloc(&L->yr, R * C);
        alloc(&L->dyr, R * C);
        alloc(&L->dxr, R * C);
    } else {
        L->xr = L->xe, L->yr = L->ye, L->dyr = L->dye, L->dxr = L->dxe;
    }
}

// Device bytes moe_layer_init(L, cfg, N, par) allocates over `ranks` ranks (for memory figures and
// batch-size planning).
template <class T>
size_t moe_layer_bytes(const MoeConfig& cfg, int N, int ranks = 1) {
    const size_t NK = (size_t)N * cfg.K, NE = (size_t)N * cfg.E, E = cfg.E;
    const size_t R = E * moe_layer_block_rows(N, moe_capacity(cfg.capacity_factor, N, cfg.K, cfg.E));
    const size_t C = cfg.C, H = cfg.H, H1 = cfg.w1_rows();
    // T: logits and dlogits; xe, ye, dye, dxe (and xr, yr, dyr, dxr with several ranks); hpre, dhpre;
    // hact, dhact
    size_t t = 2 * NE + (ranks > 1 ? 8 : 4) * R * C + 2 * R * H1 + 2 * R * H;
    // float: probs; lse; weight, dweight; losses; load, importance
    size_t f = NE + N + 2 * NK + 2 + 2 * E;
    // int: expert, slot, row_assign, pslot; routed; offsets; prow
    size_t i = 4 * NK + E + (E + 1) + R;
    return t * sizeof(T) + f * sizeof(float) + i * sizeof(int);
}

// Frees the layer's buffers.
template <class T>
void moe_layer_free(MoeLayer<T>* L) {
    void* all[] = {L->logits, L->probs, L->lse, L->weight, L->expert, L->slot, L->row_assign, L->routed,
                   L->offsets, L->pslot, L->prow, L->losses, L->load, L->importance, L->xe, L->hpre,
                   L->hact, L->ye, L->dye, L->dhact, L->dhpre, L->dxe, L->dweight, L->dlogits};
    for (void* p : all) cudaCheck(cudaFree(p));
    if (L->par.ranks > 1) {
        void* exchange[] = {L->xr, L->yr, L->dyr, L->dxr};
        for (void* p : exchange) cudaCheck(cudaFree(p));
    }
    *L = MoeLayer<T>();
}

// y (N,C, overwritten) = the layer applied to x (N,C) with weights w; saves what the backward needs
// in L and writes L->losses = {aux, z}. No host synchronization.
template <class T>
void moe_layer_forward(MoeLayer<T>* L, T* y, const T* x, const MoeWeights<T>& w, cudaStream_t stream) {
    const MoeConfig& c = L->cfg;
    const int N = L->N, NK = N * c.K, R = c.E * L->Rb, H1 = c.w1_rows();
    const int P = L->par.ranks, El = c.E / P;
    const long long Rr = (long long)P * L->Rb;  // rows per local expert

    matmul_forward(L->logits, x, w.router, (const T*)nullptr, N, c.C, c.E, stream);  // (N,E)
    moe_router_forward(L->expert, L->weight, L->probs, L->lse, (const T*)L->logits, N, c.E, c.K, stream);
    moe_dispatch_plan(L->slot, L->row_assign, L->routed, L->offsets, L->expert, N, c.K, c.E, L->capacity, stream);
    moe_router_losses(L->losses, L->load, L->importance, L->probs, L->lse, L->routed, N, c.E, c.K, c.alpha, c.beta,
                      stream);
    cudaCheck(launch_kernel(moe_pad_plan_kernel, dim3(CEIL_DIV(std::max(R, NK), MOE_BLOCK)), dim3(MOE_BLOCK), 0,
                            stream, L->prow, L->pslot, L->row_assign, L->slot, L->expert, L->offsets, c.E, L->Rb,
                            NK));
    cudaCheck(launch_kernel(moe_gather_rows_kernel<T>, dim3((unsigned)CEIL_DIV((size_t)R * c.C, (size_t)MOE_BLOCK)),
                            dim3(MOE_BLOCK), 0, stream, L->xe, x, (const float*)nullptr, L->prow, c.K, R, c.C));

    if (P > 1) moe_exchange(L->xr, (const T*)L->xe, *L, c.C, true, stream);

    // Row-major per local expert: hpre (Rr,H1) = xr (Rr,C) · W1_eᵀ; as column-major hpreᵀ = W1_e xrᵀ.
    moe_batched_matmul(L->hpre, w.w1, L->xr, H1, (int)Rr, c.C, true, false, c.C, c.C, H1, (long long)H1 * c.C,
                       Rr * c.C, Rr * H1, El, 0.f, stream);
    if (c.experts == MoeExperts::Gelu) {
        gelu_forward(L->hact, (const T*)L->hpre, (size_t)R * c.H, GeluKind::Tanh, stream);
    } else {
        swiglu_forward(L->hact, (const T*)L->hpre, (size_t)R, c.H, stream);
    }
    // yr (Rr,C) = hact (Rr,H) · W2_eᵀ.
    moe_batched_matmul(L->yr, w.w2, L->hact, c.C, (int)Rr, c.H, true, false, c.H, c.H, c.C, (long long)c.C * c.H,
                       Rr * c.H, Rr * c.C, El, 0.f, stream);
    if (P > 1) moe_exchange(L->ye, (const T*)L->yr, *L, c.C, false, stream);
    moe_combine(y, (const T*)L->ye, L->weight, L->pslot, N, c.K, c.C, stream);
}

// The backward of moe_layer_forward (same L, x and w): dx (N,C) overwritten; dw's router, w1 and w2
// gradients accumulated (+=). dy (N,C) is the gradient of y; dloss the weight of a unit of the
// auxiliary losses in the objective (1, or 1/grad accumulation steps, times any loss scale).
template <class T>
void moe_layer_backward(MoeLayer<T>* L, T* dx, const MoeWeights<T>& dw, const T* dy, const T* x,
                        const MoeWeights<T>& w, float dloss, cudaStream_t stream) {
    const MoeConfig& c = L->cfg;
    const int N = L->N, R = c.E * L->Rb, H1 = c.w1_rows();
    const int P = L->par.ranks, El = c.E / P;
    const long long Rr = (long long)P * L->Rb;  // rows per local expert
    const float wscale = 1.f / (float)P;        // the experts' gradients averaged as the replicated ones (top)

    // Combine: dye (R,C) = weight * dy on each kept row; dweight (N,K) = dy · ye.
    cudaCheck(launch_kernel(moe_gather_rows_kernel<T>, dim3((unsigned)CEIL_DIV((size_t)R * c.C, (size_t)MOE_BLOCK)),
                            dim3(MOE_BLOCK), 0, stream, L->dye, dy, (const float*)L->weight, L->prow, c.K, R, c.C));
    moe_combine_backward_weight(L->dweight, dy, (const T*)L->ye, L->pslot, N, c.K, c.C, stream);

    if (P > 1) moe_exchange(L->dyr, (const T*)L->dye, *L, c.C, true, stream);

    // Second expert GEMM, per local expert: dW2_e (C,H) += dyr_eᵀ hact_e / P; dhact (Rr,H) = dyr_e W2_e.
    moe_batched_matmul(dw.w2, L->hact, L->dyr, c.H, c.C, (int)Rr, false, true, c.H, c.C, c.H, Rr * c.H, Rr * c.C,
                       (long long)c.C * c.H, El, 1.f, stream, wscale);
    moe_batched_matmul(L->dhact, w.w2, L->dyr, c.H, (int)Rr, c.C, false, false, c.H, c.C, c.H, (long long)c.C * c.H,
                       Rr * c.C, Rr * c.H, El, 0.f, stream);
    if (c.experts == MoeExperts::Gelu) {
        gelu_backward_inplace(L->dhact, (const T*)L->hpre, (size_t)R * c.H, GeluKind::Tanh, stream);
    } else {
        swiglu_backward(L->dhpre, (const T*)L->dhact, (const T*)L->hpre, (size_t)R, c.H, stream);
    }
    const T* dhpre = c.experts == MoeExperts::Gelu ? L->dhact : L->dhpre;  // (R,H1)

    // First expert GEMM: dW1_e (H1,C) += dhpre_eᵀ xr_e / P; dxr (Rr,C) = dhpre_e W1_e.
    moe_batched_matmul(dw.w1, L->xr, dhpre, c.C, H1, (int)Rr, false, true, c.C, H1, c.C, Rr * c.C, Rr * H1,
                       (long long)H1 * c.C, El, 1.f, stream, wscale);
    moe_batched_matmul(L->dxr, w.w1, dhpre, c.C, (int)Rr, H1, false, false, c.C, H1, c.C, (long long)H1 * c.C,
                       Rr * H1, Rr * c.C, El, 0.f, stream);
    if (P > 1) moe_exchange(L->dxe, (const T*)L->dxr, *L, c.C, false, stream);
    moe_permute_backward(dx, (const T*)L->dxe, L->pslot, N, c.K, c.C, stream);

    // Router: dlogits (N,E) from dweight and the auxiliary losses; drouter (E,C) += dlogitsᵀ x;
    // dx += dlogits · router (beta = 1 adds the router's path to the experts').
    moe_router_backward(L->dlogits, L->dweight, L->expert, L->weight, L->probs, L->lse, L->routed, N, c.E, c.K,
                        c.alpha, c.beta, dloss, stream);
    matmul_backward_weight(dw.router, (const T*)L->dlogits, x, N, c.C, c.E, stream);
    if (!cublaslt_matmul(dx, (const T*)w.router, (const T*)L->dlogits, c.C, N, c.E, false, false, c.C, c.E, c.C, 1.f,
                         1.f, CUBLASLT_EPILOGUE_DEFAULT, (const T*)nullptr, (T*)nullptr, 0, stream)) {
        fprintf(stderr, "moe_layer_backward: cuBLASLt supports no algorithm for the router's dx (N=%d C=%d E=%d)\n",
                N, c.C, c.E);
        exit(EXIT_FAILURE);
    }
}
