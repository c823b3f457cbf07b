// llmc/matmul.cuh — the linear layers: matrix multiplies through cuBLASLt with the bias and GELU
// epilogues fused where they apply, the input and weight gradients with the bias gradient fused into
// the weight-gradient GEMM, and a deterministic kernel for the bias gradient where it cannot be.
//
// Row-major tensors meet column-major cuBLASLt. A row-major (R,S) matrix is a column-major (S,R)
// matrix with leading dimension S, so every product below is written for cuBLASLt as the
// transposed product: out = inp · Wᵀ (row-major) is outᵀ = W · inpᵀ (column-major), and so on.
// Weights are stored (OC, C), as llm.c and PyTorch's nn.Linear do.
//
// The bias gradient is the column sums of dout (N,OC), which the weight-gradient GEMM reads anyway:
// in its column-major form dweightᵀ (C,OC) += inpᵀ · dout, B is dout read transposed, and cuBLASLt's
// BGRADB epilogue sums op(B) over the reduction dimension k = N while the GEMM streams it: one
// value per column of D, i.e. per output channel. cuBLASLt writes that vector (it does not add to
// it) in the bias type, which for non-fp8 GEMMs is D's type, so it lands in scratch and a small
// kernel adds it to dbias (which accumulates across micro-batches): OC values read instead of dout's
// N·OC. For 16-bit types that rounds the micro-batch's sum to T before adding it, one rounding
// more than the separate kernel makes. cuBLASLt takes BGRADB with fp32, bf16 and fp16 operands,
// not with fp8 ones (see llmc/simt/cublaslt.cpp), and may refuse it for a shape: then the GEMM runs
// plain and a deterministic reduction kernel (128-bit loads of dout) computes the sums. On Hopper
// that kernel is the route taken (matmul_bias_grad_in_gemm): there cuBLASLt's BGRADB is not fused
// into the GEMM but a reduction kernel of its own (globalKernelBgradAB in an H200's profile), slower
// than ours.
//
// fp8 (--precision fp8, compute capability 8.9+): matmul_forward_fp8 / matmul_backward_fp8 take
// bf16 tensors, cast the GEMM operands to fp8 with delayed per-tensor scales (llmc/fp8.cuh) and
// run cuBLASLt's fp8 GEMMs with bf16 outputs and fp32 accumulation. cuBLASLt's fp8 kernels take only
// the "TN" form: A transposed, B not, i.e. in row-major terms both operands stored with the
// reduction dimension contiguous. Which copy each GEMM reads:
//   forward  out (N,OC)   = inp · Wᵀ:   W (OC,C) and inp (N,C) as stored          (E4M3 x E4M3)
//   backward dinp (N,C)   = dout · W:   Wᵀ (C,OC) and dout (N,OC) as stored       (E4M3 x E5M2)
//            dW (OC,C)   += doutᵀ · inp: inpᵀ (C,N) and doutᵀ (OC,N)               (E4M3 x E5M2)
// so the backward casts W and inp transposed and dout both ways. Every fp8 copy lives in scratch
// only for the call; rows are zero-padded to 16 bytes, so any N works and C, OC need only be
// multiples of 8 (the bf16 outputs' 16-byte rule).
#pragma once
#include "cuda_common.h"  // first: on the CPU backend it brings the shadow cuda_runtime.h
#include "fp8.cuh"
#include "gelu.cuh"
#include "precision.cuh"

#include <cublasLt.h>

#include <chrono>
#include <cmath>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#define cublasCheck(call)                                                                          \
    do {                                                                                           \
        cublasStatus_t st_ = (call);                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                        \
            fprintf(stderr, "[cuBLASLt ERROR] %s (%d)\n  in: %s\n  at %s:%d\n", cublasLtGetStatusString(st_), \
                    (int)st_, #call, __FILE__, __LINE__);                                          \
            exit(EXIT_FAILURE);                                                                    \
        }                                                                                          \
    } while (0)

// ----------------------------------------------------------------------------
// CUDA kernels

// Rows of dout each block of the bias-gradient reduction sums; one fp32 partial per slice and column.
constexpr int BIAS_ROWS_PER_SLICE = 256;

// Partial column sums of dout (N,OC), VEC adjacent columns per thread (one 128-bit load per row when
// VEC is Packed128's width, else VEC = 1): block (x, y) sums columns [32·VEC·x, 32·VEC·(x+1)) over
// slice y's rows into partial[y][col]. Each warp reads 32·VEC adjacent values of a row (coalesced);
// the 8 row-threads of a column are combined through shared memory in a fixed order, so the sums
// are deterministic (and, for any VEC, the same as VEC = 1 gives).
template <class T, int VEC>
__global__ void bias_backward_partial_kernel(float* partial /*(R,OC)*/, const T* dout /*(N,OC)*/, int N, int OC,
                                             int rows_per_slice) {
    static_assert(VEC == 1 || VEC == Packed128<T>::size, "one element or one 128-bit pack per row");
    __shared__ float sums[8][32 * VEC];
    int col0 = (blockIdx.x * 32 + threadIdx.x) * VEC;  // OC % VEC == 0: a pack is wholly in or out
    int row0 = blockIdx.y * rows_per_slice;
    int row1 = min(N, row0 + rows_per_slice);
    float s[VEC] = {};
    if (col0 < OC)
        for (int r = row0 + threadIdx.y; r < row1; r += 8) {
            const T* p = dout + (size_t)r * OC + col0;
            if constexpr (VEC == 1) {
                s[0] += to_float(p[0]);
            } else {
                Packed128<T> pack = load128cs(p);  // streamed: dout is read once here
                for (int k = 0; k < VEC; k++) s[k] += to_float(pack[k]);
            }
        }
    for (int k = 0; k < VEC; k++) sums[threadIdx.y][threadIdx.x * VEC + k] = s[k];
    __syncthreads();
    if (threadIdx.y == 0)
        for (int j = threadIdx.x; j < 32 * VEC; j += 32) {  // adjacent threads, adjacent words: no bank conflicts
            int col = blockIdx.x * 32 * VEC + j;
            if (col >= OC) break;
            float total = 0.f;
            for (int k = 0; k < 8; k++) total += sums[k][j];
            partial[(size_t)blockIdx.y * OC + col] = total;
        }
}

// dbias[col] += sum of the R partial sums, in slice order.
template <class T>
__global__ void bias_backward_final_kernel(T* dbias /*(OC)*/, const float* partial /*(R,OC)*/, int R, int OC) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= OC) return;
    float s = 0.f;
    for (int r = 0; r < R; r++) s += partial[(size_t)r * OC + col];
    dbias[col] = from_float<T>(to_float(dbias[col]) + s);
}

// dbias[col] += grad[col]: the bias gradient cuBLASLt's BGRADB epilogue wrote (it overwrites its
// output), added to the gradient accumulated over micro-batches.
template <class T>
__global__ void bias_accumulate_kernel(T* dbias /*(OC)*/, const T* grad /*(OC)*/, int OC) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= OC) return;
    dbias[col] = from_float<T>(to_float(dbias[col]) + to_float(grad[col]));
}

// ----------------------------------------------------------------------------
// cuBLASLt context: one handle, one workspace, one cached plan per GEMM shape and alignment

// What a cached plan is for: (m, n, k, transa, transb, epilogue, dtype, compute), the leading
// dimensions of A, B, D and the epilogue's aux matrix and the batch strides of A, B and D (0 for a
// single matrix): everything the descriptors are made from; then the alignments of the A, B and D
// pointers (log2 of the bytes, up to 256), which the algorithm is chosen for.
using MatmulKey = std::tuple<int, int, int, int, int, int, int, int>;
using MatmulLayoutKey = std::tuple<int, int, int, int, long long, long long, long long>;
using MatmulCacheKey = std::tuple<MatmulKey, int, int, int, MatmulLayoutKey>;

// A GEMM's plan: its operation descriptor and matrix layouts, made on the first call and kept, and
// the heuristic's algorithm for them, or "unsupported" (then the caller falls back to an unfused
// path). Creating descriptors is host work the GPU would wait for between short GEMMs; a step
// repeats the same few dozen shapes, so after the first step no GEMM creates anything.
struct MatmulPlan {
    bool ok = false;
    cublasLtMatmulAlgo_t algo{};
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;

    // Destroys the descriptors; returns the first failure (CUBLAS_STATUS_SUCCESS if none).
    cublasStatus_t destroy() {
        cublasStatus_t first = CUBLAS_STATUS_SUCCESS;
        for (cublasLtMatrixLayout_t layout : {a, b, d}) {
            cublasStatus_t s = cublasLtMatrixLayoutDestroy(layout);
            if (first == CUBLAS_STATUS_SUCCESS) first = s;
        }
        cublasStatus_t s = cublasLtMatmulDescDestroy(desc);
        return first == CUBLAS_STATUS_SUCCESS ? s : first;
    }
};

// The pointer attributes of the operation descriptor, which change from call to call of one plan
// (another layer's bias, aux matrix or fp8 scales): set on the cached descriptor before each call.
// A null pointer is not set (the plan's epilogue does not use it).
struct MatmulPointers {
    const void* bias = nullptr;
    const void* aux = nullptr;
    const float* scale_a = nullptr;
    const float* scale_b = nullptr;
};

struct MatmulContext {
    cublasLtHandle_t handle = nullptr;
    void* workspace = nullptr;
    size_t workspace_size = 0;
    bool tf32 = false;  // fp32 storage with TF32 tensor-core compute (--precision tf32)
    // Which of the heuristic's ranked algorithms a new plan takes: 0, its first choice, everywhere
    // but dev/cuda/matmul.cu, which times the others (matmul_set_algo_rank).
    int algo_rank = 0;
    // --gemm-autotune: a new plan times the heuristic's first kMatmulAutotuneCandidates algorithms on
    // its first call and keeps the fastest (matmul_autotune); the counts say what that did.
    bool autotune = false;
    int autotuned = 0, autotune_changed = 0;  // plans timed; of them, plans that took another than the first
    int autotune_captured = 0;                // plans made during a CUDA graph capture: not timed
    double autotune_ms = 0;                   // host time spent timing them
    long long calls = 0;  // cublasLtMatmul calls so far (each is at least one GPU kernel)
    std::map<MatmulCacheKey, MatmulPlan> plans;
    // A stream that runs GEMMs at the same time as the others (the trainers' --overlap-wgrad) has a
    // workspace of its own (matmul_add_stream): two GEMMs running at once must not share one.
    std::map<cudaStream_t, void*> stream_workspaces;
    void* workspace_for(cudaStream_t stream) const {
        auto it = stream_workspaces.find(stream);
        return it == stream_workspaces.end() ? workspace : it->second;
    }

    // Destroys every cached plan's descriptors and forgets the plans.
    void forget_plans() {
        for (auto& entry : plans) cublasCheck(entry.second.destroy());
        plans.clear();
    }
    // A program that exits without matmul_destroy (a refused input's exit(1)) still frees the cached
    // descriptors: host objects, which need neither the handle nor the device. Unchecked: a
    // destructor that runs during exit must not call exit.
    ~MatmulContext() {
        for (auto& entry : plans) entry.second.destroy();
    }
};
inline MatmulContext& matmul_context() {
    static MatmulContext ctx;
    return ctx;
}

// Creates the cuBLASLt handle and the workspace (32 MiB: what cuBLASLt wants on Hopper).
inline void matmul_init(bool tf32 = false) {
    MatmulContext& ctx = matmul_context();
    if (ctx.handle) return;
    cublasCheck(cublasLtCreate(&ctx.handle));
    ctx.workspace_size = 32 << 20;
    cudaMallocCheck(&ctx.workspace, ctx.workspace_size);
    ctx.tf32 = tf32;
}

// Destroys every cached plan's descriptors and forgets the plans (the next call of each shape asks
// the heuristic again).
inline void matmul_forget_plans() { matmul_context().forget_plans(); }

// Makes every GEMM from now on take the heuristic's algorithm of this rank (0: its first choice, as
// production does; 1: its second, ...), and forgets the cached plans, which were made for another.
// A GEMM for which the heuristic offers no algorithm of that rank is refused like an unsupported one
// (cublaslt_matmul returns false; the matmul_* launchers then exit, naming the shape).
inline void matmul_set_algo_rank(int rank) {
    matmul_forget_plans();
    matmul_context().algo_rank = rank;
}

// Turns --gemm-autotune on or off for the plans made from now on (see matmul_autotune).
inline void matmul_set_autotune(bool on) { matmul_context().autotune = on; }

// Gives `stream` a workspace of its own (see MatmulContext::stream_workspaces); after matmul_init.
inline void matmul_add_stream(cudaStream_t stream) {
    MatmulContext& ctx = matmul_context();
    if (ctx.stream_workspaces.count(stream)) return;
    void* w = nullptr;
    cudaMallocCheck(&w, ctx.workspace_size);
    ctx.stream_workspaces[stream] = w;
}

// Device bytes of every cuBLASLt workspace: the default one and each stream's own.
inline size_t matmul_workspace_bytes() {
    const MatmulContext& ctx = matmul_context();
    return ctx.workspace_size * (1 + ctx.stream_workspaces.size());
}

inline void matmul_destroy() {
    MatmulContext& ctx = matmul_context();
    if (!ctx.handle) return;
    matmul_forget_plans();
    for (auto& [stream, w] : ctx.stream_workspaces) cudaCheck(cudaFree(w));
    cudaCheck(cudaFree(ctx.workspace));
    cublasCheck(cublasLtDestroy(ctx.handle));
    ctx = MatmulContext();
}

template <class T> constexpr cudaDataType_t cuda_dtype();
template <> constexpr cudaDataType_t cuda_dtype<float>() { return CUDA_R_32F; }
template <> constexpr cudaDataType_t cuda_dtype<__nv_bfloat16>() { return CUDA_R_16BF; }
template <> constexpr cudaDataType_t cuda_dtype<__half>() { return CUDA_R_16F; }

// The largest power of two (up to 256) dividing a pointer's address: cuBLASLt's kernels are chosen
// for an alignment, and one picked for 256-byte aligned operands may refuse a pointer that is only
// 16-byte aligned (a per-layer slice of a bf16 tensor, a KV-cache row).
inline uint32_t pointer_alignment(const void* p) {
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    uint32_t align = 256;
    while (align > 1 && a % align != 0) align /= 2;
    return align;
}

// Sets a pointer attribute of a descriptor.
inline void set_desc_pointer(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* ptr) {
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, attr, &ptr, sizeof(ptr)));
}

// How many of the heuristic's algorithms a new plan times under --gemm-autotune, and the timed runs of
// each (after one untimed run that warms it up).
constexpr int kMatmulAutotuneCandidates = 8;
constexpr int kMatmulAutotuneRuns = 3;

// Bytes of a matrix layout's storage (ld x columns of its type; column-major, as every layout here).
inline size_t matmul_layout_bytes(cublasLtMatrixLayout_t layout) {
    uint64_t cols = 0;
    int64_t ld = 0;
    uint32_t type = 0;
    size_t written;
    cublasCheck(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof(cols), &written));
    cublasCheck(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof(ld), &written));
    cublasCheck(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_TYPE, &type, sizeof(type), &written));
    size_t bytes = type == CUDA_R_32F ? 4 : type == CUDA_R_16BF || type == CUDA_R_16F ? 2 : 1;
    return (size_t)ld * cols * bytes;
}

// --gemm-autotune: times the heuristic's `found` algorithms for a new plan on this call's own
// operands (kMatmulAutotuneRuns runs each, after a warm-up run) and sets plan.algo to the fastest.
// cuBLASLt's heuristic picks from a performance model; timing its candidates finds the kernels it
// misjudges for a shape. The trial runs write D (and any aux or bias-gradient output; the real call
// that follows writes them again); when beta != 0 D is also the input C, so it is saved first and
// put back before every run (skipped, keeping the heuristic's choice, if the device has no memory
// for the copy). Each trial waits for the GPU: a plan made inside a CUDA graph capture is not
// timed (counted in autotune_captured; the trainers run each new graph key eagerly once first,
// ModelState::eager_first_use, so that none is). Algorithms whose split of K differs add in another
// order, so a tuned run's results may differ from an untuned one's in the last bits, and a resumed
// run tunes again.
inline void matmul_autotune(MatmulPlan& plan, const cublasLtMatmulHeuristicResult_t* results, int found, float alpha,
                            const void* a, const void* b, float beta, void* d, cudaStream_t stream) {
    MatmulContext& ctx = matmul_context();
    cudaStreamCaptureStatus capture;
    cudaCheck(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) ctx.autotune_captured++;
    if (capture != cudaStreamCaptureStatusNone || found < 2) return;
    auto t_start = std::chrono::steady_clock::now();
    const size_t d_bytes = beta != 0.f ? matmul_layout_bytes(plan.d) : 0;
    void* saved = nullptr;
    if (d_bytes > 0) {
        if (cudaMalloc(&saved, d_bytes) != cudaSuccess) {
            (void)cudaGetLastError();  // no room for the copy: the heuristic's choice stands
            return;
        }
        cudaCheck(cudaMemcpyAsync(saved, d, d_bytes, cudaMemcpyDeviceToDevice, stream));
    }
    int best = 0;
    float best_ms = INFINITY;
    for (int i = 0; i < found; i++) {
        float total_ms = 0.f;
        bool ran = true;
        for (int run = 0; run <= kMatmulAutotuneRuns && ran; run++) {
            if (d_bytes > 0) cudaCheck(cudaMemcpyAsync(d, saved, d_bytes, cudaMemcpyDeviceToDevice, stream));
            const float ms = time_on_stream(stream, [&] {
                ran = cublasLtMatmul(ctx.handle, plan.desc, &alpha, a, plan.a, b, plan.b, &beta, d, plan.d, d, plan.d,
                                     &results[i].algo, ctx.workspace_for(stream), ctx.workspace_size,
                                     stream) == CUBLAS_STATUS_SUCCESS;
            });
            if (run > 0) total_ms += ms;
        }
        if (ran && total_ms < best_ms) {
            best_ms = total_ms;
            best = i;
        }
    }
    if (d_bytes > 0) {
        cudaCheck(cudaMemcpyAsync(d, saved, d_bytes, cudaMemcpyDeviceToDevice, stream));
        cudaCheck(cudaStreamSynchronize(stream));
        cudaCheck(cudaFree(saved));
    }
    plan.algo = results[best].algo;
    ctx.autotuned++;
    ctx.autotune_changed += best != 0;
    ctx.autotune_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_start).count();
}

// The end of every cuBLASLt call here: the cached plan for (key, layout) and the pointers'
// alignments; on its first use make(plan) creates its descriptors and the heuristic is asked once
// (with the real alignments as preferences). Then the per-call pointers are set on the descriptor
// and the matmul D = alpha * op(A) op(B) + beta * D (D in place of C) runs if cuBLASLt supports it.
// Any refusal (no algorithm; NOT_SUPPORTED, or INVALID_VALUE for e.g. a GELU aux leading dimension
// that is not a multiple of 8, whether from the heuristic or from cublasLtMatmul itself) returns
// false and is remembered, which callers take as "use the unfused path"; the caller reports a
// refusal of the plain DEFAULT epilogue.
template <class Make>
bool cublaslt_run(const MatmulKey& key, const MatmulLayoutKey& layout, Make&& make, const MatmulPointers& ptrs,
                  float alpha, const void* a, const void* b, float beta, void* d, cudaStream_t stream) {
    MatmulContext& ctx = matmul_context();
    const uint32_t align_a = pointer_alignment(a), align_b = pointer_alignment(b), align_d = pointer_alignment(d);
    MatmulCacheKey cache_key{key, __builtin_ctz(align_a), __builtin_ctz(align_b), __builtin_ctz(align_d), layout};
    auto it = ctx.plans.find(cache_key);
    bool fresh = it == ctx.plans.end();
    if (fresh) it = ctx.plans.emplace(cache_key, MatmulPlan{}).first;
    MatmulPlan& plan = it->second;
    if (fresh) make(plan);
    const std::pair<cublasLtMatmulDescAttributes_t, const void*> pointers[] = {
        {CUBLASLT_MATMUL_DESC_BIAS_POINTER, ptrs.bias},
        {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, ptrs.aux},
        {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, ptrs.scale_a},
        {CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, ptrs.scale_b}};
    for (const auto& [attr, ptr] : pointers)
        if (ptr) set_desc_pointer(plan.desc, attr, ptr);
    if (fresh) {
        cublasLtMatmulPreference_t pref;
        cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &ctx.workspace_size, sizeof(ctx.workspace_size)));
        const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}};
        for (const auto& [attr, bytes] : aligns)
            cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof(bytes)));
        const bool tune = ctx.autotune && ctx.algo_rank == 0;
        std::vector<cublasLtMatmulHeuristicResult_t> results(tune ? kMatmulAutotuneCandidates : ctx.algo_rank + 1);
        int found = 0;
        cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx.handle, plan.desc, plan.a, plan.b, plan.d, plan.d, pref,
                                                           (int)results.size(), results.data(), &found);
        cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
        plan.ok = st == CUBLAS_STATUS_SUCCESS && found > ctx.algo_rank;
        if (plan.ok) plan.algo = results[ctx.algo_rank].algo;
        if (plan.ok && tune) matmul_autotune(plan, results.data(), found, alpha, a, b, beta, d, stream);
    }
    if (plan.ok) {
        cublasStatus_t st = cublasLtMatmul(ctx.handle, plan.desc, &alpha, a, plan.a, b, plan.b, &beta, d, plan.d, d,
                                           plan.d, &plan.algo, ctx.workspace_for(stream), ctx.workspace_size, stream);
        if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
            plan.ok = false;  // the heuristic offered what the call refuses: fall back, now and later
        } else {
            cublasCheck(st);
            ctx.calls++;
        }
    }
    return plan.ok;
}

// Sets the attributes every plan's operation descriptor has: transposes and epilogue.
inline void set_desc_ops(cublasLtMatmulDesc_t desc, bool transa, bool transb, cublasLtEpilogue_t epilogue) {
    cublasOperation_t opa = transa ? CUBLAS_OP_T : CUBLAS_OP_N, opb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
}

// D (m,n) = alpha * op(A) op(B) + beta * D, column-major, with an epilogue (bias (m), aux (m,n)
// with leading dimension ldaux). Returns false, without computing, when cuBLASLt does not support
// this combination (so callers can fall back); any other failure exits.
template <class T>
bool cublaslt_matmul(T* d, const T* a, const T* b, int m, int n, int k, bool transa, bool transb, int lda,
                     int ldb, int ldd, float alpha, float beta, cublasLtEpilogue_t epilogue, const T* bias,
                     T* aux, int ldaux, cudaStream_t stream) {
    MatmulContext& ctx = matmul_context();
    const cudaDataType_t type = cuda_dtype<T>();
    cublasComputeType_t compute =
        (ctx.tf32 && type == CUDA_R_32F) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    auto make = [&](MatmulPlan& plan) {
        cublasCheck(cublasLtMatmulDescCreate(&plan.desc, compute, CUDA_R_32F));
        set_desc_ops(plan.desc, transa, transb, epilogue);
        if (bias)
            cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type,
                                                       sizeof(type)));
        if (aux) {
            int64_t ld = ldaux;
            cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
        }
        cublasCheck(cublasLtMatrixLayoutCreate(&plan.a, type, transa ? k : m, transa ? m : k, lda));
        cublasCheck(cublasLtMatrixLayoutCreate(&plan.b, type, transb ? n : k, transb ? k : n, ldb));
        cublasCheck(cublasLtMatrixLayoutCreate(&plan.d, type, m, n, ldd));
    };
    MatmulKey key{m, n, k, (int)transa, (int)transb, (int)epilogue, (int)type, (int)compute};
    MatmulLayoutKey layout{lda, ldb, ldd, aux ? ldaux : 0, 0, 0, 0};
    MatmulPointers ptrs;
    ptrs.bias = bias;
    ptrs.aux = aux;
    return cublaslt_run(key, layout, make, ptrs, alpha, a, b, beta, d, stream);
}

// D (m,n) bf16, column-major, = epilogue(scale_a * scale_b * op(A) B + beta * D) for fp8 operands in
// the one form cuBLASLt's fp8 kernels take ("TN"): A stored (k,m) and read transposed, B stored
// (k,n). scale_a and scale_b are device pointers (the operands' scale_inv: they undo the cast's
// scaling). bias (m) and aux (the GELU input, (m,n) with leading dimension ldaux) are bf16, as
// cuBLASLt wants them with a bf16 output. Accumulation is full fp32 (no FAST_ACCUM). Returns false,
// without computing, when cuBLASLt does not support the combination; any other failure exits.
inline bool cublaslt_matmul_fp8(__nv_bfloat16* d, const void* a, __nv_fp8_interpretation_t fa, const void* b,
                                __nv_fp8_interpretation_t fb, int m, int n, int k, int lda, int ldb, int ldd,
                                const float* scale_a, const float* scale_b, float beta, cublasLtEpilogue_t epilogue,
                                const __nv_bfloat16* bias, __nv_bfloat16* aux, int ldaux, cudaStream_t stream) {
    const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    const cudaDataType_t ta = fa == __NV_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
    const cudaDataType_t tb = fb == __NV_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
    const cudaDataType_t td = CUDA_R_16BF;
    auto make = [&](MatmulPlan& plan) {
        cublasCheck(cublasLtMatmulDescCreate(&plan.desc, compute, CUDA_R_32F));
        set_desc_ops(plan.desc, true, false, epilogue);
        if (bias)
            cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &td, sizeof(td)));
        if (aux) {
            int64_t ld = ldaux;
            cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &td,
                                                       sizeof(td)));
            cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
        }
        cublasCheck(cublasLtMatrixLayoutCreate(&plan.a, ta, k, m, lda));
        cublasCheck(cublasLtMatrixLayoutCreate(&plan.b, tb, k, n, ldb));
        cublasCheck(cublasLtMatrixLayoutCreate(&plan.d, td, m, n, ldd));
    };

    // The cache's dtype slot holds both input types, above 2^16 so that no plain cudaDataType_t
    // (all below 256) can collide with an fp8 entry.
    int types = (1 << 16) | ((int)ta << 8) | (int)tb;
    MatmulKey key{m, n, k, 1, 0, (int)epilogue, types, (int)compute};
    MatmulLayoutKey layout{lda, ldb, ldd, aux ? ldaux : 0, 0, 0, 0};
    MatmulPointers ptrs;
    ptrs.bias = bias;
    ptrs.aux = aux;
    ptrs.scale_a = scale_a;
    ptrs.scale_b = scale_b;
    return cublaslt_run(key, layout, make, ptrs, 1.f, a, b, beta, d, stream);
}

// ----------------------------------------------------------------------------
// kernel launchers

// out (N,OC) = inp (N,C) · weightᵀ (weight (OC,C)) + bias (OC, or null). With pre_gelu non-null,
// also applies GELU: pre_gelu (N,OC) keeps the input of the GELU for the backward pass and out
// its output. The tanh GELU is fused into cuBLASLt's epilogue when supported; the erf form (BERT)
// has no epilogue and runs as a separate kernel.
template <class T>
void matmul_forward(T* out, T* pre_gelu, const T* inp, const T* weight, const T* bias, int N, int C, int OC,
                    GeluKind gelu_kind, cudaStream_t stream) {
    if (pre_gelu && gelu_kind == GeluKind::Tanh) {
        cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        if (cublaslt_matmul(out, weight, inp, OC, N, C, true, false, C, C, OC, 1.f, 0.f, epi, bias, pre_gelu, OC,
                            stream))
            return;
    }
    cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    T* target = pre_gelu ? pre_gelu : out;
    if (!cublaslt_matmul(target, weight, inp, OC, N, C, true, false, C, C, OC, 1.f, 0.f, epi, bias, (T*)nullptr, 0,
                         stream)) {
        fprintf(stderr, "matmul_forward: cuBLASLt supports no algorithm for N=%d C=%d OC=%d\n", N, C, OC);
        exit(EXIT_FAILURE);
    }
    if (pre_gelu) gelu_forward(out, pre_gelu, (size_t)N * OC, gelu_kind, stream);
}

// A linear layer without an activation: out (N,OC) = inp (N,C) · weightᵀ + bias (OC, or null).
template <class T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC, cudaStream_t stream) {
    matmul_forward(out, (T*)nullptr, inp, weight, bias, N, C, OC, GeluKind::Tanh, stream);
}

// Scratch the backward pass needs: the bias-gradient partial sums of the reduction kernel (one fp32
// row per slice of rows), which also holds the OC values of T that the fused BGRADB GEMM writes.
inline size_t matmul_backward_scratch_bytes(int N, int OC) {
    int slices = CEIL_DIV(N, BIAS_ROWS_PER_SLICE);
    return (size_t)slices * OC * sizeof(float);
}

// dbias (OC) += column sums of dout (N,OC), by the deterministic reduction kernels; partial:
// matmul_backward_scratch_bytes(N, OC) bytes.
template <class T>
void bias_backward(T* dbias, float* partial, const T* dout, int N, int OC, cudaStream_t stream) {
    constexpr int P = Packed128<T>::size;
    int slices = CEIL_DIV(N, BIAS_ROWS_PER_SLICE);
    if (rows_pack128<T>(OC, {dout}))
        cudaCheck(launch_kernel(bias_backward_partial_kernel<T, P>, dim3(CEIL_DIV(OC, 32 * P), slices), dim3(32, 8), 0,
                                stream, partial, dout, N, OC, BIAS_ROWS_PER_SLICE));
    else
        cudaCheck(launch_kernel(bias_backward_partial_kernel<T, 1>, dim3(CEIL_DIV(OC, 32), slices), dim3(32, 8), 0,
                                stream, partial, dout, N, OC, BIAS_ROWS_PER_SLICE));
    cudaCheck(launch_kernel(bias_backward_final_kernel<T>, dim3(CEIL_DIV(OC, 256)), dim3(256), 0, stream, dbias,
                            (const float*)partial, slices, OC));
}

// dinp (N,C) = dout · weight (see matmul_backward), times gelu'(pre_gelu) when pre_gelu is non-null.
template <class T>
void matmul_backward_input(T* dinp, const T* dout, const T* weight, const T* pre_gelu, int N, int C, int OC,
                           GeluKind gelu_kind, cudaStream_t stream) {
    bool fused = pre_gelu && gelu_kind == GeluKind::Tanh &&
                 cublaslt_matmul(dinp, weight, dout, C, N, OC, false, false, C, OC, C, 1.f, 0.f,
                                 CUBLASLT_EPILOGUE_DGELU, (const T*)nullptr, const_cast<T*>(pre_gelu), C, stream);
    if (fused) return;
    if (!cublaslt_matmul(dinp, weight, dout, C, N, OC, false, false, C, OC, C, 1.f, 0.f, CUBLASLT_EPILOGUE_DEFAULT,
                         (const T*)nullptr, (T*)nullptr, 0, stream)) {
        fprintf(stderr, "matmul_backward: cuBLASLt supports no algorithm for N=%d C=%d OC=%d\n", N, C, OC);
        exit(EXIT_FAILURE);
    }
    if (pre_gelu) gelu_backward_inplace(dinp, pre_gelu, (size_t)N * C, gelu_kind, stream);
}

// dweight (OC,C) += doutᵀ · inp (see matmul_backward).
template <class T>
void matmul_backward_weight(T* dweight, const T* dout, const T* inp, int N, int C, int OC, cudaStream_t stream) {
    if (!cublaslt_matmul(dweight, inp, dout, C, OC, N, false, true, C, OC, C, 1.f, 1.f, CUBLASLT_EPILOGUE_DEFAULT,
                         (const T*)nullptr, (T*)nullptr, 0, stream)) {
        fprintf(stderr, "matmul_backward: cuBLASLt supports no weight-gradient algorithm for N=%d C=%d OC=%d\n", N,
                C, OC);
        exit(EXIT_FAILURE);
    }
}

// How matmul_backward computes a bias gradient: Auto, in the weight GEMM (BGRADB) except on Hopper
// (compute capability 9.x), where cuBLASLt runs BGRADB as a kernel of its own after the GEMM and the
// reduction kernels here are faster: a GPT-2 124M step's qkv and fc bias gradients with their weight
// GEMMs took 3.47 ms by BGRADB, 3.12 ms by plain GEMMs and the kernels (H200, bf16, B = 16;
// dev/cuda/matmul.cu). Elsewhere unmeasured: BGRADB saves the kernels' read of dout. InGemm and
// Kernels pin a route (the trainers' --bias-grad, tests).
enum class BiasGradRoute { Auto, InGemm, Kernels };
inline BiasGradRoute& matmul_bias_grad_route() {
    static BiasGradRoute route = BiasGradRoute::Auto;
    return route;
}
inline bool matmul_bias_grad_in_gemm() {
    static const bool hopper = [] {
        int device = 0, major = 0;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        return major == 9;
    }();
    BiasGradRoute route = matmul_bias_grad_route();
    return route == BiasGradRoute::Auto ? !hopper : route == BiasGradRoute::InGemm;
}

// dweight (OC,C) += doutᵀ · inp and dbias (OC) += column sums of dout in one cuBLASLt call, the
// BGRADB epilogue writing the OC sums to grad (OC values of T; cuBLASLt overwrites them), which a
// small kernel adds to dbias. Returns false, computing nothing, where cuBLASLt refuses BGRADB.
template <class T>
bool matmul_backward_weight_bgradb(T* dweight, T* dbias, T* grad, const T* dout, const T* inp, int N, int C, int OC,
                                   cudaStream_t stream) {
    if (!cublaslt_matmul(dweight, inp, dout, C, OC, N, false, true, C, OC, C, 1.f, 1.f, CUBLASLT_EPILOGUE_BGRADB,
                         (const T*)grad, (T*)nullptr, 0, stream))
        return false;
    cudaCheck(launch_kernel(bias_accumulate_kernel<T>, dim3(CEIL_DIV(OC, 256)), dim3(256), 0, stream, dbias,
                            (const T*)grad, OC));
    return true;
}

// The parameter half of matmul_backward: dweight (OC,C) += doutᵀ · inp and, if dbias is non-null,
// dbias (OC) += column sums of dout (see matmul_backward). It reads only dout and inp, so it may run
// on another stream than the input gradient (the trainers' --overlap-wgrad), with scratch of its own.
template <class T>
void matmul_backward_weight_bias(T* dweight, T* dbias, void* scratch, const T* dout, const T* inp, int N, int C,
                                 int OC, cudaStream_t stream) {
    if (!dbias) {
        matmul_backward_weight(dweight, dout, inp, N, C, OC, stream);
        return;
    }
    if (matmul_bias_grad_in_gemm() &&
        matmul_backward_weight_bgradb(dweight, dbias, static_cast<T*>(scratch), dout, inp, N, C, OC, stream))
        return;
    matmul_backward_weight(dweight, dout, inp, N, C, OC, stream);
    bias_backward(dbias, static_cast<float*>(scratch), dout, N, OC, stream);
}

// Gradients of out = inp · weightᵀ + bias:
//   dinp (N,C) = dout · weight, overwritten; with pre_gelu (N,C) non-null, multiplied by
//     gelu'(pre_gelu) (the layer's input was GELU(pre_gelu)): fused into cuBLASLt when possible;
//   dweight (OC,C) += doutᵀ · inp (accumulates across micro-batches);
//   dbias (OC) += column sums of dout (if dbias is non-null), deterministically: by the weight
//     GEMM's BGRADB epilogue where cuBLASLt takes it and matmul_bias_grad_in_gemm() says so (see the
//     top of the file), else by the reduction kernels.
// scratch: matmul_backward_scratch_bytes(N, OC) bytes, 16-byte aligned.
template <class T>
void matmul_backward(T* dinp, T* dweight, T* dbias, void* scratch, const T* dout, const T* inp, const T* weight,
                     const T* pre_gelu, int N, int C, int OC, GeluKind gelu_kind, cudaStream_t stream) {
    matmul_backward_input(dinp, dout, weight, pre_gelu, N, C, OC, gelu_kind, stream);
    matmul_backward_weight_bias(dweight, dbias, scratch, dout, inp, N, C, OC, stream);
}

// The gradients of a linear layer without an activation below it (dinp is dout · weight).
template <class T>
void matmul_backward(T* dinp, T* dweight, T* dbias, void* scratch, const T* dout, const T* inp, const T* weight, int N,
                     int C, int OC, cudaStream_t stream) {
    matmul_backward(dinp, dweight, dbias, scratch, dout, inp, weight, (const T*)nullptr, N, C, OC, GeluKind::Tanh,
                    stream);
}

// ----------------------------------------------------------------------------
// fp8 linear layers (--precision fp8)

// The delayed-scaling states of one linear layer: its input and weight (E4M3) and the gradient of
// its output (E5M2). The weight and input states are also used, without recording, by the
// backward pass's transposed casts.
struct Fp8Linear {
    Fp8Scaling inp, weight, grad;
};

// Bytes of device memory one Fp8Linear keeps.
inline size_t fp8_linear_bytes(int history_len) { return 3 * fp8_scaling_bytes(history_len); }

// Points st's three states at mem (fp8_linear_bytes(history_len) bytes) and resets them.
inline void fp8_linear_init(Fp8Linear* st, void* mem, int history_len, int margin, cudaStream_t stream) {
    char* p = static_cast<char*>(mem);
    size_t one = fp8_scaling_bytes(history_len);
    fp8_scaling_init(&st->inp, p, __NV_E4M3, history_len, margin, stream);
    fp8_scaling_init(&st->weight, p + one, __NV_E4M3, history_len, margin, stream);
    fp8_scaling_init(&st->grad, p + 2 * one, __NV_E5M2, history_len, margin, stream);
}

// Where the fp8 layers keep their per-call fp8 copies and amax partials inside the scratch buffer
// (byte offsets, 256-aligned). Forward and backward regions overlap: they are never live at once.
struct Fp8MatmulScratch {
    size_t inp_q, weight_q, inp_partials, weight_partials;                           // forward
    size_t weight_t, dout_q, dout_t, inp_t, dout_partials, bias_partials;  // backward
    size_t bytes;
};

inline Fp8MatmulScratch fp8_matmul_scratch_layout(int N, int C, int OC) {
    Fp8MatmulScratch L{};
    size_t at = 0;
    auto take = [&at](size_t bytes) {
        size_t here = at;
        at += CEIL_DIV(bytes, (size_t)256) * 256;
        return here;
    };
    const size_t f = sizeof(float);
    L.inp_q = take((size_t)N * fp8_ld(C));
    L.weight_q = take((size_t)OC * fp8_ld(C));
    L.inp_partials = take(fp8_cast_num_partials(N, C) * f);
    L.weight_partials = take(fp8_cast_num_partials(OC, C) * f);
    size_t fwd_end = at;
    at = 0;
    L.weight_t = take((size_t)C * fp8_ld(OC));
    L.dout_q = take((size_t)N * fp8_ld(OC));
    L.dout_t = take((size_t)OC * fp8_ld(N));
    L.inp_t = take((size_t)C * fp8_ld(N));
    L.dout_partials = take(fp8_cast_num_partials(N, OC) * f);
    L.bias_partials = take(matmul_backward_scratch_bytes(N, OC));
    L.bytes = fwd_end > at ? fwd_end : at;
    return L;
}

// Bytes of scratch matmul_forward_fp8 and matmul_backward_fp8 need (one buffer serves both; it
// includes the bias-gradient partials). About N·C + OC·C bytes forward and 2·N·OC + N·C + OC·C
// backward: for GPT-2's MLP at N = 8192 tokens, C = 768, under 60 MB.
inline size_t matmul_fp8_scratch_bytes(int N, int C, int OC) { return fp8_matmul_scratch_layout(N, C, OC).bytes; }

// When cuBLASLt refuses an fp8 GEMM (a shape or alignment its fp8 kernels do not take on this GPU),
// that product runs in bf16 on the original tensors instead; says so once per GEMM, on stderr.
inline void fp8_refused_notice(const char* who, int N, int C, int OC) {
    static std::set<std::tuple<std::string, int, int, int>> told;
    if (told.emplace(who, N, C, OC).second)
        fprintf(stderr, "%s: cuBLASLt has no fp8 kernel for N=%d C=%d OC=%d here; this product runs in bf16\n", who,
                N, C, OC);
}

// Refuses shapes and pointers the fp8 GEMMs cannot take, naming the constraint.
inline void matmul_fp8_check(const char* who, int N, int C, int OC, std::initializer_list<const void*> outputs) {
    if (N < 1 || C < 8 || OC < 8 || C % 8 != 0 || OC % 8 != 0) {
        fprintf(stderr,
                "%s: fp8 matmuls need C and OC to be positive multiples of 8 (cuBLASLt's fp8 kernels want 16-byte "
                "rows of the bf16 outputs) and N >= 1; got N=%d C=%d OC=%d\n",
                who, N, C, OC);
        exit(EXIT_FAILURE);
    }
    if (!aligned16(outputs)) {
        fprintf(stderr, "%s: fp8 matmul outputs must be 16-byte aligned (cuBLASLt's fp8 kernels)\n", who);
        exit(EXIT_FAILURE);
    }
}

// out (N,OC) = inp (N,C) · weightᵀ (weight (OC,C)) + bias (OC, or null), with the two products'
// operands cast to E4M3 under fp8.inp / fp8.weight's delayed scales (recorded and updated after the
// GEMM). With pre_gelu non-null: pre_gelu keeps the GELU input and out its output, as in
// matmul_forward. The tanh GELU is fused into cuBLASLt's epilogue (GELU_AUX_BIAS, or GELU_AUX
// without a bias, as Transformer Engine does; the CPU backend runs them too); where cuBLASLt refuses
// that, the GEMM writes pre_gelu (bias fused) and gelu_forward runs separately. scratch:
// matmul_fp8_scratch_bytes(N, C, OC) bytes.
inline void matmul_forward_fp8(__nv_bfloat16* out, __nv_bfloat16* pre_gelu, const __nv_bfloat16* inp,
                               const __nv_bfloat16* weight, const __nv_bfloat16* bias, int N, int C, int OC,
                               GeluKind gelu_kind, Fp8Linear& fp8, void* scratch, cudaStream_t stream) {
    matmul_fp8_check("matmul_forward_fp8", N, C, OC, {out, pre_gelu});
    Fp8MatmulScratch L = fp8_matmul_scratch_layout(N, C, OC);
    char* base = static_cast<char*>(scratch);
    auto* xq = reinterpret_cast<__nv_fp8_storage_t*>(base + L.inp_q);
    auto* wq = reinterpret_cast<__nv_fp8_storage_t*>(base + L.weight_q);
    auto* xp = reinterpret_cast<float*>(base + L.inp_partials);
    auto* wp = reinterpret_cast<float*>(base + L.weight_partials);
    fp8_prime(fp8.inp, xp, inp, N, C, stream);
    fp8_prime(fp8.weight, wp, weight, OC, C, stream);
    fp8_cast(xq, (__nv_fp8_storage_t*)nullptr, xp, inp, N, C, fp8.inp, stream);       // (N, ldc)
    fp8_cast(wq, (__nv_fp8_storage_t*)nullptr, wp, weight, OC, C, fp8.weight, stream);  // (OC, ldc)

    // outᵀ (OC,N) = wq · xqᵀ: wq is column-major (ldc, OC), read transposed; xq column-major (ldc, N).
    // The zero padding of both makes the reduction over ldc >= C exact.
    const int ldc = fp8_ld(C);
    bool fused = pre_gelu && gelu_kind == GeluKind::Tanh &&
                 cublaslt_matmul_fp8(out, wq, __NV_E4M3, xq, __NV_E4M3, OC, N, ldc, ldc, ldc, OC,
                                     fp8.weight.scale_inv, fp8.inp.scale_inv, 0.f,
                                     bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX, bias,
                                     pre_gelu, OC, stream);
    if (!fused) {
        __nv_bfloat16* target = pre_gelu ? pre_gelu : out;
        if (cublaslt_matmul_fp8(target, wq, __NV_E4M3, xq, __NV_E4M3, OC, N, ldc, ldc, ldc, OC, fp8.weight.scale_inv,
                                fp8.inp.scale_inv, 0.f, bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias,
                                (__nv_bfloat16*)nullptr, 0, stream)) {
            if (pre_gelu) gelu_forward(out, (const __nv_bfloat16*)pre_gelu, (size_t)N * OC, gelu_kind, stream);
        } else {
            fp8_refused_notice("matmul_forward_fp8", N, C, OC);
            matmul_forward(out, pre_gelu, inp, weight, bias, N, C, OC, gelu_kind, stream);
        }
    }
    Fp8AmaxRecord records[2] = {{&fp8.inp, xp, fp8_cast_num_partials(N, C)},
                                {&fp8.weight, wp, fp8_cast_num_partials(OC, C)}};
    fp8_update_scales(records, 2, stream);
}

// Gradients of the fp8 linear layer, as matmul_backward computes them (same arguments and
// accumulation rules; scratch: matmul_fp8_scratch_bytes(N, C, OC) bytes) with fp8 GEMMs:
//   dinp (N,C)   = dout · weight            E5M2 dout x E4M3 weight (optionally times gelu'(pre_gelu))
//   dweight (OC,C) += doutᵀ · inp           E5M2 dout x E4M3 inp
//   dbias (OC)  += column sums of the bf16 dout (deterministic kernels: cuBLASLt has no BGRADB
//                  for fp8 operands, and this weight GEMM's B is not read transposed)
// dout's cast records its amax into fp8.grad (updated after both GEMMs). weight and inp are cast
// transposed under the scales the forward pass left, without recording (the forward recorded these
// very tensors). The forward must have run first. DGELU is fused where cuBLASLt's fp8 kernels offer
// it, else gelu_backward_inplace runs after the GEMM.
inline void matmul_backward_fp8(__nv_bfloat16* dinp, __nv_bfloat16* dweight, __nv_bfloat16* dbias, void* scratch,
                                const __nv_bfloat16* dout, const __nv_bfloat16* inp, const __nv_bfloat16* weight,
                                const __nv_bfloat16* pre_gelu, int N, int C, int OC, GeluKind gelu_kind,
                                Fp8Linear& fp8, cudaStream_t stream) {
    matmul_fp8_check("matmul_backward_fp8", N, C, OC, {dinp, dweight});
    if (!fp8.inp.primed || !fp8.weight.primed) {
        fprintf(stderr, "matmul_backward_fp8: run matmul_forward_fp8 with these states first (it sets their scales)\n");
        exit(EXIT_FAILURE);
    }
    Fp8MatmulScratch L = fp8_matmul_scratch_layout(N, C, OC);
    char* base = static_cast<char*>(scratch);
    auto* wt = reinterpret_cast<__nv_fp8_storage_t*>(base + L.weight_t);
    auto* gq = reinterpret_cast<__nv_fp8_storage_t*>(base + L.dout_q);
    auto* gt = reinterpret_cast<__nv_fp8_storage_t*>(base + L.dout_t);
    auto* xt = reinterpret_cast<__nv_fp8_storage_t*>(base + L.inp_t);
    auto* gp = reinterpret_cast<float*>(base + L.dout_partials);
    fp8_prime(fp8.grad, gp, dout, N, OC, stream);
    fp8_cast(gq, gt, gp, dout, N, OC, fp8.grad, stream);                                    // (N, ldo), (OC, ldn)
    fp8_cast((__nv_fp8_storage_t*)nullptr, wt, (float*)nullptr, weight, OC, C, fp8.weight, stream);  // (C, ldo)
    fp8_cast((__nv_fp8_storage_t*)nullptr, xt, (float*)nullptr, inp, N, C, fp8.inp, stream);         // (C, ldn)
    const int ldo = fp8_ld(OC), ldn = fp8_ld(N);

    // dinpᵀ (C,N) = wt · gqᵀ: wt column-major (ldo, C) read transposed, gq column-major (ldo, N).
    bool fused = pre_gelu && gelu_kind == GeluKind::Tanh &&
                 cublaslt_matmul_fp8(dinp, wt, __NV_E4M3, gq, __NV_E5M2, C, N, ldo, ldo, ldo, C, fp8.weight.scale_inv,
                                     fp8.grad.scale_inv, 0.f, CUBLASLT_EPILOGUE_DGELU, (const __nv_bfloat16*)nullptr,
                                     const_cast<__nv_bfloat16*>(pre_gelu), C, stream);
    if (!fused) {
        if (cublaslt_matmul_fp8(dinp, wt, __NV_E4M3, gq, __NV_E5M2, C, N, ldo, ldo, ldo, C, fp8.weight.scale_inv,
                                fp8.grad.scale_inv, 0.f, CUBLASLT_EPILOGUE_DEFAULT, (const __nv_bfloat16*)nullptr,
                                (__nv_bfloat16*)nullptr, 0, stream)) {
            if (pre_gelu) gelu_backward_inplace(dinp, pre_gelu, (size_t)N * C, gelu_kind, stream);
        } else {
            fp8_refused_notice("matmul_backward_fp8 (input gradient)", N, C, OC);
            matmul_backward_input(dinp, dout, weight, pre_gelu, N, C, OC, gelu_kind, stream);
        }
    }
    // dweightᵀ (C,OC) += xt · gt: xt column-major (ldn, C) read transposed, gt column-major (ldn, OC).
    if (!cublaslt_matmul_fp8(dweight, xt, __NV_E4M3, gt, __NV_E5M2, C, OC, ldn, ldn, ldn, C, fp8.inp.scale_inv,
                             fp8.grad.scale_inv, 1.f, CUBLASLT_EPILOGUE_DEFAULT, (const __nv_bfloat16*)nullptr,
                             (__nv_bfloat16*)nullptr, 0, stream)) {
        fp8_refused_notice("matmul_backward_fp8 (weight gradient)", N, C, OC);
        matmul_backward_weight(dweight, dout, inp, N, C, OC, stream);
    }
    Fp8AmaxRecord record{&fp8.grad, gp, fp8_cast_num_partials(N, OC)};
    fp8_update_scales(&record, 1, stream);
    if (dbias) bias_backward(dbias, reinterpret_cast<float*>(base + L.bias_partials), dout, N, OC, stream);
}
