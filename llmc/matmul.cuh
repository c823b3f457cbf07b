// llmc/matmul.cuh — the linear layers: matrix multiplies through cuBLASLt with the bias and GELU
// epilogues fused where they apply, the input and weight gradients, and a deterministic kernel for
// the bias gradient.
//
// Row-major tensors meet column-major cuBLASLt. A row-major (R,S) matrix is a column-major (S,R)
// matrix with leading dimension S, so every product below is written for cuBLASLt as the
// transposed product: out = inp · Wᵀ (row-major) is outᵀ = W · inpᵀ (column-major), and so on.
// Weights are stored (OC, C), as llm.c and PyTorch's nn.Linear do.
#pragma once
#include "cuda_common.h"  // first: on the CPU backend it brings the shadow cuda_runtime.h
#include "gelu.cuh"
#include "precision.cuh"

#include <cublasLt.h>

#include <map>
#include <tuple>

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

// Partial column sums of dout (N,OC): block (x, y) sums columns [32x, 32x+32) over its slice of
// rows into partial[y][col]. 32 columns per block keep the reads of each row coalesced; the 8
// row-threads of a column are combined through shared memory in a fixed order (deterministic).
template <class T>
__global__ void bias_backward_partial_kernel(float* partial /*(R,OC)*/, const T* dout /*(N,OC)*/, int N, int OC,
                                             int rows_per_slice) {
    __shared__ float sums[8][33];
    int col = blockIdx.x * 32 + threadIdx.x;
    int row0 = blockIdx.y * rows_per_slice;
    int row1 = min(N, row0 + rows_per_slice);
    float s = 0.f;
    if (col < OC)
        for (int r = row0 + threadIdx.y; r < row1; r += 8) s += to_float(dout[(size_t)r * OC + col]);
    sums[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < OC) {
        float total = 0.f;
        for (int k = 0; k < 8; k++) total += sums[k][threadIdx.x];
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

// ----------------------------------------------------------------------------
// cuBLASLt context: one handle, one workspace, one cached heuristic per GEMM shape

struct MatmulContext {
    cublasLtHandle_t handle = nullptr;
    void* workspace = nullptr;
    size_t workspace_size = 0;
    bool tf32 = false;  // fp32 storage with TF32 tensor-core compute (--precision tf32)
    long long calls = 0;  // cublasLtMatmul calls so far (each is at least one GPU kernel)
    // (m, n, k, transa, transb, epilogue, dtype, compute) -> the heuristic's algorithm, or
    // nullopt-like "unsupported" (then the caller falls back to an unfused path).
    std::map<std::tuple<int, int, int, int, int, int, int, int>, std::pair<bool, cublasLtMatmulAlgo_t>> algos;
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
    cudaCheck(cudaMalloc(&ctx.workspace, ctx.workspace_size));
    ctx.tf32 = tf32;
}

inline void matmul_destroy() {
    MatmulContext& ctx = matmul_context();
    if (!ctx.handle) return;
    cudaCheck(cudaFree(ctx.workspace));
    cublasCheck(cublasLtDestroy(ctx.handle));
    ctx = MatmulContext();
}

template <class T> constexpr cudaDataType_t cuda_dtype();
template <> constexpr cudaDataType_t cuda_dtype<float>() { return CUDA_R_32F; }
template <> constexpr cudaDataType_t cuda_dtype<__nv_bfloat16>() { return CUDA_R_16BF; }
template <> constexpr cudaDataType_t cuda_dtype<__half>() { return CUDA_R_16F; }

// D (m,n) = alpha * op(A) op(B) + beta * D, column-major, with an epilogue (bias (m), aux (m,n)
// with leading dimension ldaux). Returns false, without computing, when cuBLASLt does not support
// this combination (so callers can fall back); any other failure exits.
template <class T>
bool cublaslt_matmul(T* d, const T* a, const T* b, int m, int n, int k, bool transa, bool transb, int lda,
                     int ldb, int ldd, float alpha, float beta, cublasLtEpilogue_t epilogue, const T* bias,
                     T* aux, int ldaux, cudaStream_t stream) {
    MatmulContext& ctx = matmul_context();
    cublasComputeType_t compute =
        (ctx.tf32 && cuda_dtype<T>() == CUDA_R_32F) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
    cublasOperation_t opa = transa ? CUBLAS_OP_T : CUBLAS_OP_N, opb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (bias) {
        cudaDataType_t bias_type = cuda_dtype<T>();
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                   sizeof(bias_type)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    if (aux) {
        int64_t ld = ldaux;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
    }
    cublasLtMatrixLayout_t la, lb, ld;
    cublasCheck(cublasLtMatrixLayoutCreate(&la, cuda_dtype<T>(), transa ? k : m, transa ? m : k, lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&lb, cuda_dtype<T>(), transb ? n : k, transb ? k : n, ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&ld, cuda_dtype<T>(), m, n, ldd));

    auto key = std::make_tuple(m, n, k, (int)transa, (int)transb, (int)epilogue, (int)cuda_dtype<T>(), (int)compute);
    auto it = ctx.algos.find(key);
    if (it == ctx.algos.end()) {
        cublasLtMatmulPreference_t pref;
        cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &ctx.workspace_size, sizeof(ctx.workspace_size)));
        cublasLtMatmulHeuristicResult_t result;
        int found = 0;
        cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx.handle, desc, la, lb, ld, ld, pref, 1, &result, &found);
        cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
        // Any refusal (NOT_SUPPORTED, or INVALID_VALUE for e.g. a GELU aux leading dimension that
        // is not a multiple of 8) means "use the unfused path"; the unfused DEFAULT epilogue is
        // always supported, and its failure is reported by the caller.
        bool ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
        it = ctx.algos.emplace(key, std::make_pair(ok, ok ? result.algo : cublasLtMatmulAlgo_t{})).first;
    }
    bool supported = it->second.first;
    if (supported) {
        cublasCheck(cublasLtMatmul(ctx.handle, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &it->second.second,
                                   ctx.workspace, ctx.workspace_size, stream));
        ctx.calls++;
    }
    cublasCheck(cublasLtMatrixLayoutDestroy(la));
    cublasCheck(cublasLtMatrixLayoutDestroy(lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(ld));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
    return supported;
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

// Scratch the backward pass needs (the bias-gradient partial sums).
inline size_t matmul_backward_scratch_bytes(int N, int OC) {
    int slices = CEIL_DIV(N, 256);
    return (size_t)slices * OC * sizeof(float);
}

// Gradients of out = inp · weightᵀ + bias:
//   dinp (N,C) = dout · weight, overwritten; with pre_gelu (N,C) non-null, multiplied by
//     gelu'(pre_gelu) (the layer's input was GELU(pre_gelu)): fused into cuBLASLt when possible;
//   dweight (OC,C) += doutᵀ · inp (accumulates across micro-batches);
//   dbias (OC) += column sums of dout (if dbias is non-null), deterministically.
template <class T>
void matmul_backward(T* dinp, T* dweight, T* dbias, void* scratch, const T* dout, const T* inp, const T* weight,
                     const T* pre_gelu, int N, int C, int OC, GeluKind gelu_kind, cudaStream_t stream) {
    bool fused = pre_gelu && gelu_kind == GeluKind::Tanh &&
                 cublaslt_matmul(dinp, weight, dout, C, N, OC, false, false, C, OC, C, 1.f, 0.f,
                                 CUBLASLT_EPILOGUE_DGELU, (const T*)nullptr, const_cast<T*>(pre_gelu), C, stream);
    if (!fused) {
        if (!cublaslt_matmul(dinp, weight, dout, C, N, OC, false, false, C, OC, C, 1.f, 0.f,
                             CUBLASLT_EPILOGUE_DEFAULT, (const T*)nullptr, (T*)nullptr, 0, stream)) {
            fprintf(stderr, "matmul_backward: cuBLASLt supports no algorithm for N=%d C=%d OC=%d\n", N, C, OC);
            exit(EXIT_FAILURE);
        }
        if (pre_gelu) gelu_backward_inplace(dinp, pre_gelu, (size_t)N * C, gelu_kind, stream);
    }
    if (!cublaslt_matmul(dweight, inp, dout, C, OC, N, false, true, C, OC, C, 1.f, 1.f, CUBLASLT_EPILOGUE_DEFAULT,
                         (const T*)nullptr, (T*)nullptr, 0, stream)) {
        fprintf(stderr, "matmul_backward: cuBLASLt supports no weight-gradient algorithm for N=%d C=%d OC=%d\n", N,
                C, OC);
        exit(EXIT_FAILURE);
    }
    if (dbias) {
        int rows_per_slice = 256;
        int slices = CEIL_DIV(N, rows_per_slice);
        float* partial = static_cast<float*>(scratch);
        cudaCheck(launch_kernel(bias_backward_partial_kernel<T>, dim3(CEIL_DIV(OC, 32), slices), dim3(32, 8), 0,
                                stream, partial, dout, N, OC, rows_per_slice));
        cudaCheck(launch_kernel(bias_backward_final_kernel<T>, dim3(CEIL_DIV(OC, 256)), dim3(256), 0, stream, dbias,
                                (const float*)partial, slices, OC));
    }
}
