// test/simt/test_cublaslt.cu — cublasLtMatmul against a naive double-precision GEMM for every type
// combination, transpose, epilogue, batching, beta and in-place mode the CPU backend supports,
// plus the configurations the library refuses. Host code only, so the same file runs on a GPU
// against the real cuBLASLt (nvcc -std=c++17 test/simt/test_cublaslt.cu -lcublasLt); checks of
// behaviour that is the CPU backend's own (its conservative refusals) are compiled out there.
//
// Tolerances (doc/testing.md: |out - ref| <= atol + k*eps*|ref|). The reference is exact (double) on
// the operands as stored, so the errors allowed are those of fp32 arithmetic and of the one final
// rounding, as bounds rather than fits:
//   - fp32 arithmetic: a K-term dot product summed in any order is within K*u * sum|a_i b_i|
//     (Higham's gamma_K, u = 2^-24); alpha, beta*C and the bias add three more roundings. So
//     atol = (K+3) * u * S, with S the largest |alpha*sA*sB| sum|a||b| + |beta*C| + |bias| of the
//     output. GELU and its derivative amplify an input error by at most 1.13 and add a few ulps
//     of tanhf: factor 2 on atol, 16u on rtol.
//   - what the real library does besides (seen on an H100, cuBLASLt 13.0): for bf16/fp16 outputs
//     some kernels round alpha*op(A)op(B) to D's type before adding beta*C and the bias and before
//     GELU: one more rounding of a value below S, 0.5 * eps_D * S on the pre-activation. Its GELU
//     epilogue is less exact than tanhf, as the hardware tanh approximation would be (PTX
//     tanh.approx.f32: relative error at most 2^-11), which moves gelu(v) = v (1 + tanh) / 2 by at
//     most 2^-12 |v|: 2^-12 * max|v| on atol.
//   - fp8 operands: the accumulation unit is what the device's fp8 GEMM keeps, measured by
//     test/fp8_accumulation.h's probe (fp32's u unless the accumulator is narrower, as Hopper's fp8
//     tensor cores' is): atol = (K+3) * u_fp8 * S.
//   - TF32 operands: rounding A and B to 11 significant bits costs 2^-11 relative per operand, so
//     atol += EPS_TF32 * S (the reference uses the unrounded fp32 operands).
//   - the final rounding to the output type: half an ulp, k = 0.5: rtol = 0.5 * eps, plus half the
//     smallest subnormal in atol for results that underflow.
// Every output buffer is compared whole, padding included: padding holds a sentinel (-448, exact
// in every type) that a stray write would change by far more than the budget.
#include <cuda_runtime.h>
#include <strings.h>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "../fp8_accumulation.h"
#include "../harness.h"

// The CPU backend's own choices (refusing what some GPU or version may accept; needing no
// workspace) are tested only against the CPU backend.
#ifdef __CUDACC__
#define CPU_BACKEND 0
#else
#define CPU_BACKEND 1
#endif

#define CHECK_LT(call)                                                                         \
    do {                                                                                       \
        cublasStatus_t st_ = (call);                                                           \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                    \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,               \
                    cublasGetStatusName(st_));                                                 \
            exit(2);                                                                           \
        }                                                                                      \
    } while (0)

// ----------------------------------------------------------------------------
// Element types

constexpr double kU32 = 1.0 / (1 << 24);  // fp32 unit roundoff
constexpr float kSentinel = -448.0f;       // exact in fp32, bf16, fp16, E4M3 and E5M2

// What the tolerances need to know about a storage type.
struct TypeInfo {
    const char* name;
    size_t size;
    double eps;   // machine epsilon (harness EPS_*)
    double tiny;  // smallest positive subnormal
};

TypeInfo info(cudaDataType t) {
    switch (t) {
        case CUDA_R_32F: return {"f32", 4, th::EPS_FP32, std::ldexp(1.0, -149)};
        case CUDA_R_16BF: return {"bf16", 2, th::EPS_BF16, std::ldexp(1.0, -133)};
        case CUDA_R_16F: return {"f16", 2, th::EPS_FP16, std::ldexp(1.0, -24)};
        case CUDA_R_8F_E4M3: return {"e4m3", 1, th::EPS_E4M3, std::ldexp(1.0, -9)};
        case CUDA_R_8F_E5M2: return {"e5m2", 1, th::EPS_E5M2, std::ldexp(1.0, -16)};
        default: fprintf(stderr, "unexpected type %d\n", (int)t); exit(2);
    }
}

bool is_fp8(cudaDataType t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }

// Reads one element of type t as a double (exact).
double decode(cudaDataType t, const uint8_t* p) {
    switch (t) {
        case CUDA_R_32F: { float v; memcpy(&v, p, 4); return v; }
        case CUDA_R_16BF: { __nv_bfloat16 v; memcpy(&v, p, 2); return __bfloat162float(v); }
        case CUDA_R_16F: { __half v; memcpy(&v, p, 2); return __half2float(v); }
        case CUDA_R_8F_E4M3: { __nv_fp8_e4m3 v; memcpy(&v, p, 1); return float(v); }
        case CUDA_R_8F_E5M2: { __nv_fp8_e5m2 v; memcpy(&v, p, 1); return float(v); }
        default: exit(2);
    }
}

// Stores x as one element of type t (rounded to nearest; fp8 saturating).
void encode(cudaDataType t, float x, uint8_t* p) {
    switch (t) {
        case CUDA_R_32F: memcpy(p, &x, 4); break;
        case CUDA_R_16BF: { __nv_bfloat16 v = __float2bfloat16(x); memcpy(p, &v, 2); break; }
        case CUDA_R_16F: { __half v = __float2half(x); memcpy(p, &v, 2); break; }
        case CUDA_R_8F_E4M3: { __nv_fp8_e4m3 v(x); memcpy(p, &v, 1); break; }
        case CUDA_R_8F_E5M2: { __nv_fp8_e5m2 v(x); memcpy(p, &v, 1); break; }
        default: exit(2);
    }
}

// ----------------------------------------------------------------------------
// Host matrices and device copies

// A column-major strided batch of `type`, holding exactly the elements its layout can touch.
struct HostMat {
    cudaDataType type = CUDA_R_32F;
    int64_t rows = 0, cols = 0, ld = 0, batch = 1, stride = 0;
    std::vector<uint8_t> bytes;

    size_t elems() const { return (size_t)(stride * (batch - 1) + ld * (cols - 1) + rows); }
    size_t index(int64_t b, int64_t i, int64_t j) const { return (size_t)(b * stride + i + j * ld); }
    double at(int64_t b, int64_t i, int64_t j) const {
        return decode(type, &bytes[index(b, i, j) * info(type).size]);
    }
};

// Builds a matrix (an output) holding the sentinel everywhere.
HostMat blank_mat(cudaDataType type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                  int64_t stride) {
    HostMat x;
    x.type = type, x.rows = rows, x.cols = cols, x.ld = ld, x.batch = batch, x.stride = stride;
    const size_t sz = info(type).size;
    x.bytes.resize(x.elems() * sz);
    for (size_t e = 0; e < x.elems(); e++) encode(type, kSentinel, &x.bytes[e * sz]);
    return x;
}

// Builds a matrix (an input) whose elements are uniform in [lo, hi) rounded to its type;
// everything else (padding rows, gaps between batches) holds the sentinel.
HostMat make_mat(cudaDataType type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                 int64_t stride, uint64_t seed, float lo, float hi) {
    HostMat x = blank_mat(type, rows, cols, ld, batch, stride);
    const size_t sz = info(type).size;
    std::vector<float> v((size_t)(rows * cols));
    for (int64_t b = 0; b < batch; b++) {
        th::fill_uniform(v.data(), v.size(), seed * 1000 + (uint64_t)b, lo, hi);
        for (int64_t j = 0; j < cols; j++)
            for (int64_t i = 0; i < rows; i++)
                encode(type, v[(size_t)(i + j * rows)], &x.bytes[x.index(b, i, j) * sz]);
    }
    return x;
}

// Allocates device memory of exactly the host buffer's size and copies it there.
void* upload(const std::vector<uint8_t>& h) {
    void* d = nullptr;
    cudaCheck(cudaMalloc(&d, h.size()));
    cudaCheck(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice));
    return d;
}

std::vector<uint8_t> download(const void* d, size_t bytes) {
    std::vector<uint8_t> h(bytes);
    cudaCheck(cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost));
    return h;
}

// A cuBLASLt layout describing the host matrix (batch attributes only when batched).
cublasLtMatrixLayout_t make_layout(const HostMat& x) {
    cublasLtMatrixLayout_t l;
    CHECK_LT(cublasLtMatrixLayoutCreate(&l, x.type, (uint64_t)x.rows, (uint64_t)x.cols, x.ld));
    if (x.batch > 1) {
        int32_t count = (int32_t)x.batch;
        int64_t stride = x.stride;
        CHECK_LT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
        CHECK_LT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
    return l;
}

// ----------------------------------------------------------------------------
// One matmul configuration

const char* epilogue_name(cublasLtEpilogue_t e) {
    switch (e) {
        case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
        case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
        case CUBLASLT_EPILOGUE_GELU: return "GELU";
        case CUBLASLT_EPILOGUE_GELU_BIAS: return "GELU_BIAS";
        case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
        case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
        case CUBLASLT_EPILOGUE_DGELU_BGRAD: return "DGELU_BGRAD";
        case CUBLASLT_EPILOGUE_BGRADA: return "BGRADA";
        case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
        default: return "other";
    }
}

bool adds_bias(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool applies_gelu(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
           e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool writes_aux(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool applies_dgelu(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}
bool writes_grad(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_DGELU_BGRAD || e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB;
}

struct Case {
    cublasComputeType_t compute;
    cudaDataType a, b, c, d;
    bool ta, tb;
    cublasLtEpilogue_t epilogue;
    int batch;
    bool beta_nonzero, in_place;
    int m, n, k;
    // Optional changes to the descriptors before the call (for the refusal tests).
    std::function<void(cublasLtMatmulDesc_t, cublasLtMatrixLayout_t a_layout)> tweak = nullptr;
    const char* label = "";   // what a refusal test changed, for its name
    int64_t aux_ld = 0;       // 0: the smallest valid one (m rounded up to 8)
    int sample_columns = 0;   // 0: check every column; else check this many, spread over n
};

std::string case_name(const Case& c) {
    char s[256];
    snprintf(s, sizeof(s), "%s%s*%s+%s->%s %c%c %s batch=%d beta=%s%s m=%d n=%d k=%d%s%s",
             c.compute == CUBLAS_COMPUTE_32F_FAST_TF32 ? "tf32:" : "", info(c.a).name,
             info(c.b).name, info(c.c).name, info(c.d).name, c.ta ? 'T' : 'N', c.tb ? 'T' : 'N',
             epilogue_name(c.epilogue), c.batch, c.beta_nonzero ? "-0.5" : "0",
             c.in_place ? " in-place" : "", c.m, c.n, c.k, c.label[0] ? " " : "", c.label);
    return s;
}

double gelu_ref(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
double gelu_grad_ref(double x) {
    double s = std::sqrt(2 / M_PI), u = s * (x + 0.044715 * x * x * x), t = std::tanh(u);
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * s * (1 + 3 * 0.044715 * x * x);
}

// Compares a whole device output with the expected buffer (sentinel outside the matrix), or only
// the given columns of it (with their padding rows) when cols is not empty.
void compare(const std::string& name, const HostMat& expect_layout, const std::vector<double>& expect,
             const void* dev, const std::vector<int64_t>& cols, th::Tol tol) {
    const cudaDataType t = expect_layout.type;
    const size_t sz = info(t).size, n = expect_layout.elems();
    std::vector<uint8_t> raw = download(dev, n * sz);
    std::vector<double> out, ref;
    auto take = [&](size_t e) { out.push_back(decode(t, &raw[e * sz])); ref.push_back(expect[e]); };
    if (cols.empty()) {
        for (size_t e = 0; e < n; e++) take(e);
    } else {
        for (int64_t b = 0; b < expect_layout.batch; b++)
            for (int64_t j : cols)
                for (int64_t i = 0; i < expect_layout.ld; i++) {
                    size_t e = expect_layout.index(b, i, j);
                    if (e < n) take(e);
                }
    }
    th::check_close(name.c_str(), ref.data(), out.data(), out.size(), tol);
}

// Runs one configuration. With expect == CUBLAS_STATUS_SUCCESS it checks every output against
// the reference; otherwise it checks that both the heuristic and the matmul refuse with that
// status (any_failure: with any status but SUCCESS, where the real library's code is undocumented).
void run_case(cublasLtHandle_t lt, const Case& c, cublasStatus_t expect = CUBLAS_STATUS_SUCCESS,
              bool any_failure = false) {
    const bool fp8 = is_fp8(c.a);
    const std::string name = case_name(c);
    const int64_t m = c.m, n = c.n, k = c.k, batch = c.batch;
    // Padding and batch gaps make every leading dimension and stride differ from the tight one;
    // fp8 needs them in 16-byte multiples.
    const int64_t pad = fp8 ? 16 : 3, gap = fp8 ? 16 : 7;
    auto mat = [&](cudaDataType t, int64_t rows, int64_t cols, int64_t extra, uint64_t seed) {
        int64_t ld = rows + extra;
        return make_mat(t, rows, cols, ld, batch, ld * cols + gap, seed, -1, 1);
    };
    HostMat A = mat(c.a, c.ta ? k : m, c.ta ? m : k, pad, 1);
    HostMat B = mat(c.b, c.tb ? n : k, c.tb ? k : n, pad, 2);
    HostMat C = mat(c.c, m, n, fp8 ? 16 : 5, 3);
    const int64_t ldd = m + (fp8 ? 16 : 2);
    HostMat D = c.in_place ? C : blank_mat(c.d, m, n, ldd, batch, ldd * n + gap);

    // Whether alpha scales BGRADA/BGRADB's bias gradient is not documented; NVIDIA's reference
    // (nvmath-python's epilogue tests) and every weight-gradient caller use alpha = 1, so do we.
    const float alpha = (c.epilogue == CUBLASLT_EPILOGUE_BGRADA || c.epilogue == CUBLASLT_EPILOGUE_BGRADB) ? 1.0f : 0.75f;
    const float beta = c.beta_nonzero ? -0.5f : 0.0f;
    // fp8 scales: powers of two (exact), product 2 so that a forgotten scale shows.
    const float a_scale = 0.5f, b_scale = 4.0f, d_scale = is_fp8(c.d) ? 2.0f : 1.0f;
    const double sab = fp8 ? (double)a_scale * b_scale : 1.0;

    // Bias (input) or bias gradient (output): fp8 takes a 16-bit bias (C's type, or bf16 when C
    // is fp32); otherwise the bias has D's type.
    const cudaDataType bias_type = fp8 ? (c.c == CUDA_R_32F ? CUDA_R_16BF : c.c) : c.d;
    const int64_t bias_len = c.epilogue == CUBLASLT_EPILOGUE_BGRADB ? n : m;
    HostMat bias;
    if (adds_bias(c.epilogue)) bias = make_mat(bias_type, bias_len, 1, bias_len, batch, bias_len, 5, -1, 1);
    if (writes_grad(c.epilogue)) bias = blank_mat(bias_type, bias_len, 1, bias_len, batch, bias_len);
    // Aux: the GELU input, D's type, leading dimension a multiple of 8.
    const int64_t aux_ld = c.aux_ld ? c.aux_ld : (m + 7) / 8 * 8;
    HostMat aux;
    if (writes_aux(c.epilogue)) aux = blank_mat(c.d, m, n, aux_ld, batch, aux_ld * n);
    if (applies_dgelu(c.epilogue)) aux = make_mat(c.d, m, n, aux_ld, batch, aux_ld * n, 6, -3, 3);

    // Device buffers, exactly sized.
    void* dA = upload(A.bytes);
    void* dB = upload(B.bytes);
    void* dC = upload(C.bytes);
    void* dD = c.in_place ? dC : upload(D.bytes);
    void* dBias = bias.bytes.empty() ? nullptr : upload(bias.bytes);
    void* dAux = aux.bytes.empty() ? nullptr : upload(aux.bytes);
    // The A, B and D scales 16 bytes apart: the real library refuses fp8 GEMMs whose scale pointers
    // are less aligned (seen on an H100).
    std::vector<uint8_t> scales(12 * sizeof(float));
    memcpy(&scales[0], &a_scale, 4), memcpy(&scales[16], &b_scale, 4), memcpy(&scales[32], &d_scale, 4);
    float* dScales = (float*)upload(scales);
    float* dAmax = (float*)upload(std::vector<uint8_t>(sizeof(float), 0));

    // Descriptors.
    cublasLtMatmulDesc_t desc;
    CHECK_LT(cublasLtMatmulDescCreate(&desc, c.compute, CUDA_R_32F));
    cublasOperation_t opa = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    cublasLtEpilogue_t epilogue = c.epilogue;
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (dBias) {
        CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dBias, sizeof(dBias)));
        if (batch > 1) {
            int64_t s = bias.stride;
            CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &s, sizeof(s)));
        }
        if (fp8) {  // as llm.c does; non-fp8 cases rely on the default (D's type)
            int32_t t = bias_type;
            CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof(t)));
        }
    }
    if (dAux) {
        CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &dAux, sizeof(dAux)));
        CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
        if (batch > 1) {
            int64_t s = aux.stride;
            CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &s, sizeof(s)));
        }
    }
    if (fp8) {
        float* pa = dScales + 0;
        float* pb = dScales + 4;
        CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &pa, sizeof(pa)));
        CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &pb, sizeof(pb)));
        if (is_fp8(c.d)) {
            float* pd = dScales + 8;
            CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &pd, sizeof(pd)));
            CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &dAmax, sizeof(dAmax)));
        }
    }
    cublasLtMatrixLayout_t lA = make_layout(A), lB = make_layout(B), lC = make_layout(C), lD = make_layout(D);
    if (c.tweak) c.tweak(desc, lA);

    // Heuristic, then the call (with the workspace the heuristic asks for, as on a GPU).
    cublasLtMatmulPreference_t pref;
    CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t max_ws = 32u << 20;
    CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof(max_ws)));
    cublasLtMatmulHeuristicResult_t heur = {};
    int found = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, desc, lA, lB, lC, lD, pref, 1, &heur, &found);
    void* dWork = nullptr;
    if (found > 0 && heur.workspaceSize > 0) cudaCheck(cudaMalloc(&dWork, heur.workspaceSize));
    auto t0 = std::chrono::steady_clock::now();
    cublasStatus_t ms = cublasLtMatmul(lt, desc, &alpha, dA, lA, dB, lB, &beta, dC, lC, dD, lD,
                                       found > 0 ? &heur.algo : nullptr, dWork,
                                       found > 0 ? heur.workspaceSize : 0, 0);
    cudaCheck(cudaDeviceSynchronize());
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    if (expect != CUBLAS_STATUS_SUCCESS || any_failure) {
        bool ok = any_failure ? (hs != CUBLAS_STATUS_SUCCESS || found == 0) && ms != CUBLAS_STATUS_SUCCESS
                              : hs == expect && found == 0 && ms == expect;
        th::report(ok, ("refuses " + name).c_str(), "heuristic=%s (%d algos) matmul=%s, want %s",
                   cublasGetStatusName(hs), found, cublasGetStatusName(ms),
                   any_failure ? "any failure" : cublasGetStatusName(expect));
    } else if (hs != CUBLAS_STATUS_SUCCESS || found != 1 || heur.state != CUBLAS_STATUS_SUCCESS ||
               ms != CUBLAS_STATUS_SUCCESS) {
        th::report(false, name.c_str(), "heuristic=%s (%d algos) matmul=%s", cublasGetStatusName(hs),
                   found, cublasGetStatusName(ms));
    } else {
        // Which output columns to check (all, or a spread for the large timing cases).
        std::vector<int64_t> cols;
        for (int s = 0; s < c.sample_columns; s++) cols.push_back(s * (n - 1) / std::max(1, c.sample_columns - 1));
        std::vector<int64_t> jlist = cols;
        if (jlist.empty())
            for (int64_t j = 0; j < n; j++) jlist.push_back(j);

        // The reference, in double, and the magnitudes the budgets scale with.
        // Outside the matrices the buffers must still hold the sentinel (C's, when D is C).
        std::vector<double> d_ref(D.elems(), kSentinel), aux_ref(aux.elems(), kSentinel);
        std::vector<double> grad_ref(bias.elems(), 0.0);
        double S = 0, amax_ref = 0, grad_mag = 0;  // grad_mag: largest sum of |terms| of a gradient
        double vmax = 0;                            // largest |GELU input|
        std::vector<double> row_abs((size_t)bias_len);
        for (int64_t b = 0; b < batch; b++) {
            std::fill(row_abs.begin(), row_abs.end(), 0.0);
            for (int64_t j : jlist)
                for (int64_t i = 0; i < m; i++) {
                    double dot = 0, mag = 0;
                    for (int64_t p = 0; p < k; p++) {
                        double x = c.ta ? A.at(b, p, i) : A.at(b, i, p);
                        double y = c.tb ? B.at(b, j, p) : B.at(b, p, j);
                        dot += x * y, mag += std::fabs(x * y);
                    }
                    double v = alpha * sab * dot, s = std::fabs(alpha * sab) * mag;
                    if (beta != 0) v += beta * C.at(b, i, j), s += std::fabs(beta * C.at(b, i, j));
                    if (adds_bias(c.epilogue)) v += bias.at(b, i, 0), s += std::fabs(bias.at(b, i, 0));
                    if (applies_gelu(c.epilogue)) {
                        if (writes_aux(c.epilogue)) aux_ref[aux.index(b, i, j)] = v;
                        vmax = std::max(vmax, std::fabs(v));
                        v = gelu_ref(v);
                    }
                    if (applies_dgelu(c.epilogue)) v *= gelu_grad_ref(aux.at(b, i, j));
                    if (c.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
                        grad_ref[bias.index(b, i, 0)] += v;
                        row_abs[(size_t)i] += std::fabs(v);
                    }
                    S = std::max(S, s);
                    amax_ref = std::max(amax_ref, std::fabs(v));
                    d_ref[D.index(b, i, j)] = v * d_scale;
                }
            if (c.epilogue == CUBLASLT_EPILOGUE_BGRADA || c.epilogue == CUBLASLT_EPILOGUE_BGRADB)
                for (int64_t i = 0; i < bias_len; i++)
                    for (int64_t p = 0; p < k; p++) {
                        double x = c.epilogue == CUBLASLT_EPILOGUE_BGRADA ? A.at(b, i, p) : B.at(b, i, p);
                        grad_ref[bias.index(b, i, 0)] += x;
                        row_abs[(size_t)i] += std::fabs(x);
                    }
            for (double r : row_abs) grad_mag = std::max(grad_mag, r);
        }

        // Budgets (see the top of the file).
        const bool tf32 = c.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
        const bool nonlinear = applies_gelu(c.epilogue) || applies_dgelu(c.epilogue);
        const bool half_out = c.d == CUDA_R_16BF || c.d == CUDA_R_16F;
        const bool epilogue_math = beta != 0 || adds_bias(c.epilogue) || nonlinear;
        const double u_acc = fp8 ? th::fp8_accumulation().unit : kU32;  // test/fp8_accumulation.h
        const double arith = (k + 3) * u_acc * S + (tf32 ? th::EPS_TF32 * S : 0) +   // pre-activation
                             (half_out && epilogue_math ? 0.5 * info(c.d).eps * S : 0);
        const double v_err = (nonlinear ? 2 : 1) * arith +                           // D_temp
                             (applies_gelu(c.epilogue) ? std::ldexp(vmax, -12) : 0);
        const double v_rtol = nonlinear ? 16 * kU32 : 0;
        const TypeInfo td = info(c.d);
        compare(name + " /D", D, d_ref, dD, cols,
                th::Tol{d_scale * v_err * (1 + td.eps) + 0.5 * td.tiny, 0.5 * td.eps + v_rtol});
        if (writes_aux(c.epilogue))
            compare(name + " /aux", aux, aux_ref, dAux, cols, th::tol(td.eps, 0.5, arith * (1 + td.eps) + 0.5 * td.tiny));
        if (writes_grad(c.epilogue)) {
            const TypeInfo tb = info(bias_type);
            double g_err = c.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD
                               ? n * v_err + (n + 16) * kU32 * grad_mag  // n values, each within v_err
                               : k * kU32 * grad_mag + (tf32 ? th::EPS_TF32 * grad_mag : 0);
            compare(name + " /bias-grad", bias, grad_ref, dBias, {}, th::tol(tb.eps, 0.5, g_err * (1 + tb.eps) + 0.5 * tb.tiny));
        }
        if (is_fp8(c.d)) {
            std::vector<uint8_t> raw = download(dAmax, sizeof(float));
            float amax;
            memcpy(&amax, raw.data(), 4);
            double ref = amax_ref, out = amax;
            th::check_close((name + " /amax").c_str(), &ref, &out, 1, th::Tol{v_err, v_rtol});
        }
        if (c.sample_columns) printf("     %.3f s for %.2f GFLOP\n", seconds, 2.0 * m * n * k * batch / 1e9);
    }

    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(lA), cublasLtMatrixLayoutDestroy(lB);
    cublasLtMatrixLayoutDestroy(lC), cublasLtMatrixLayoutDestroy(lD);
    cublasLtMatmulDescDestroy(desc);
    for (void* p : {dA, dB, dC, dBias, dAux, (void*)dScales, (void*)dAmax, dWork})
        if (p) cudaCheck(cudaFree(p));
    if (!c.in_place) cudaCheck(cudaFree(dD));
}

// ----------------------------------------------------------------------------
// The combination matrix

struct Types {
    cublasComputeType_t compute;
    cudaDataType a, b, c, d;
};

Case make_case(Types t, bool ta, bool tb, cublasLtEpilogue_t e, int batch, int beta_mode, int m,
               int n, int k) {
    Case c;
    c.compute = t.compute, c.a = t.a, c.b = t.b, c.c = t.c, c.d = t.d;
    c.ta = ta, c.tb = tb, c.epilogue = e, c.batch = batch;
    c.beta_nonzero = beta_mode > 0;  // 0: beta = 0; 1: beta != 0; 2: beta != 0 with C = D
    c.in_place = beta_mode == 2;
    c.m = m, c.n = n, c.k = k;
    return c;
}

constexpr cublasComputeType_t F32C = CUBLAS_COMPUTE_32F, TF32C = CUBLAS_COMPUTE_32F_FAST_TF32;
constexpr cudaDataType F32 = CUDA_R_32F, BF16 = CUDA_R_16BF, F16 = CUDA_R_16F,
                       E4M3 = CUDA_R_8F_E4M3, E5M2 = CUDA_R_8F_E5M2;

// Every non-fp8 row of the "datatypes supported" table x 4 transposes x 10 epilogues (BGRADA
// needs op(A) = A, BGRADB op(B) = B^T) x {1, 3} matrices x {beta = 0, beta != 0, beta != 0 in
// place}, at a shape that is no multiple of 8.
void test_regular_combinations(cublasLtHandle_t lt) {
    const Types types[] = {{F32C, F32, F32, F32, F32}, {TF32C, F32, F32, F32, F32},
                           {F32C, BF16, BF16, BF16, BF16}, {F32C, F16, F16, F16, F16},
                           {F32C, BF16, BF16, F32, F32}, {F32C, F16, F16, F32, F32}};
    const cublasLtEpilogue_t epilogues[] = {
        CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU,
        CUBLASLT_EPILOGUE_GELU_BIAS, CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
        CUBLASLT_EPILOGUE_DGELU, CUBLASLT_EPILOGUE_DGELU_BGRAD, CUBLASLT_EPILOGUE_BGRADA,
        CUBLASLT_EPILOGUE_BGRADB};
    for (const Types& t : types)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (cublasLtEpilogue_t e : epilogues) {
                    if ((e == CUBLASLT_EPILOGUE_BGRADA && ta) || (e == CUBLASLT_EPILOGUE_BGRADB && !tb)) continue;
                    for (int batch : {1, 3})
                        for (int beta_mode = 0; beta_mode < 3; beta_mode++)
                            run_case(lt, make_case(t, ta, tb, e, batch, beta_mode, 37, 29, 45));
                }
}

// Whether cuBLAS runs an fp8 epilogue on every fp8 GPU and version: what NVIDIA's own fp8 epilogue
// tests (nvmath-python, test_fp8_epilogs.py) do not let it refuse. DEFAULT and BIAS in every row;
// with a 16-bit D (= C) GELU, GELU_BIAS, and GELU_AUX_BIAS when A and B share a format; with a bf16
// D only, GELU_AUX (A and B in one format) and DGELU. The sources, and what the rest is, are in
// fp8_epilogue_supported (llmc/simt/cublaslt.cpp).
bool fp8_epilogue_everywhere(const Types& t, cublasLtEpilogue_t e) {
    const bool d16 = t.d == BF16 || t.d == F16, one_format = t.a == t.b;
    switch (e) {
        case CUBLASLT_EPILOGUE_DEFAULT:
        case CUBLASLT_EPILOGUE_BIAS: return true;
        case CUBLASLT_EPILOGUE_GELU:
        case CUBLASLT_EPILOGUE_GELU_BIAS: return d16;
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return d16 && one_format;
        case CUBLASLT_EPILOGUE_GELU_AUX: return t.d == BF16 && one_format;
        case CUBLASLT_EPILOGUE_DGELU: return t.d == BF16;
        default: return false;
    }
}

// Every fp8 row of the table (A, B in E4M3/E5M2 but not both E5M2; C in bf16/f16 with D = C,
// E4M3 or E5M2 when an input is E5M2; C = D = f32), in the only layout fp8 has (TN), with every
// epilogue that runs everywhere (above), batched or not, all beta modes (in place when C and D share
// a type). Scales on A and B, and on D with amax when D is fp8. The CPU backend refuses the other
// GELU epilogues and DGELU_BGRAD (some GPU or version may refuse them; a GPU may also run them).
void test_fp8_combinations(cublasLtHandle_t lt) {
    const cudaDataType ab[][2] = {{E4M3, E4M3}, {E4M3, E5M2}, {E5M2, E4M3}};
    const cudaDataType cd[][2] = {{BF16, BF16}, {BF16, E4M3}, {BF16, E5M2}, {F16, F16},
                                  {F16, E4M3}, {F16, E5M2}, {F32, F32}};
    const cublasLtEpilogue_t epilogues[] = {
        CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS,     CUBLASLT_EPILOGUE_GELU,
        CUBLASLT_EPILOGUE_GELU_BIAS, CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
        CUBLASLT_EPILOGUE_DGELU,   CUBLASLT_EPILOGUE_DGELU_BGRAD};
    for (auto& x : ab)
        for (auto& y : cd) {
            if (y[1] == E5M2 && x[0] != E5M2 && x[1] != E5M2) continue;
            const Types t = {F32C, x[0], x[1], y[0], y[1]};
            for (cublasLtEpilogue_t e : epilogues) {
                if (!fp8_epilogue_everywhere(t, e)) {
#if CPU_BACKEND
                    run_case(lt, make_case(t, true, false, e, 1, 0, 48, 37, 64), CUBLAS_STATUS_NOT_SUPPORTED);
#endif
                    continue;
                }
                for (int batch : {1, 3})
                    for (int beta_mode = 0; beta_mode < 3; beta_mode++) {
                        if (beta_mode == 2 && y[0] != y[1]) continue;
                        run_case(lt, make_case(t, true, false, e, batch, beta_mode, 48, 37, 64));
                    }
            }
        }
}

// Degenerate and uneven shapes: single rows, columns and k = 1, tall and long matrices.
void test_shapes(cublasLtHandle_t lt) {
    const int shapes[][3] = {{1, 1, 1}, {1, 17, 3}, {5, 3, 1}, {64, 64, 64}, {130, 7, 300}};
    for (const Types& t : {Types{F32C, F32, F32, F32, F32}, Types{F32C, BF16, BF16, BF16, BF16}})
        for (auto& s : shapes)
            for (int ta = 0; ta < 2; ta++)
                for (cublasLtEpilogue_t e : {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_GELU_AUX_BIAS})
                    run_case(lt, make_case(t, ta, !ta, e, 1, 1, s[0], s[1], s[2]));
}

// Configurations the library refuses. The first group is documented by NVIDIA (the datatypes
// table, fp8's TN and 16-byte rules, the bias and aux attributes); up to the D scale it was refused
// by the real library on an H100 (cuBLASLt 13.1), some with INVALID_VALUE where the CPU backend
// says NOT_SUPPORTED: those, and the later ones (not yet run on a GPU), accept any failure. The
// second is the CPU backend refusing what it does not emulate or what only some GPUs or versions
// accept (the H100 accepts TF32 compute on bf16 and on fp8 operands and a GELU aux leading dimension
// of 44, which the documentation rules out).
void test_refusals(cublasLtHandle_t lt) {
    const cublasStatus_t NS = CUBLAS_STATUS_NOT_SUPPORTED;
    const cublasLtEpilogue_t DEF = CUBLASLT_EPILOGUE_DEFAULT;
    for (int t = 0; t < 4; t++)
        if (t != 2)  // TN is the one fp8 layout
            run_case(lt, make_case({F32C, E4M3, E4M3, BF16, BF16}, t & 2, t & 1, DEF, 1, 0, 48, 37, 64), NS);
    run_case(lt, make_case({F32C, E5M2, E5M2, BF16, BF16}, true, false, DEF, 1, 0, 48, 37, 64), NS);
    run_case(lt, make_case({F32C, E4M3, E4M3, BF16, E5M2}, true, false, DEF, 1, 0, 48, 37, 64), NS);
    run_case(lt, make_case({F32C, E4M3, E4M3, F32, BF16}, true, false, DEF, 1, 0, 48, 37, 64), NS);
    run_case(lt, make_case({F32C, BF16, F16, BF16, BF16}, false, false, DEF, 1, 0, 37, 29, 45), NS, true);
    run_case(lt, make_case({F32C, F32, F32, BF16, BF16}, false, false, DEF, 1, 0, 37, 29, 45), NS);
    run_case(lt, make_case({F32C, BF16, BF16, BF16, F32}, false, false, DEF, 1, 0, 37, 29, 45), NS, true);
    run_case(lt, make_case({F32C, F16, F16, BF16, BF16}, false, false, DEF, 1, 0, 37, 29, 45), NS);
    // fp8 with k = 40: not a multiple of 16 bytes.
    run_case(lt, make_case({F32C, E4M3, E4M3, BF16, BF16}, true, false, DEF, 1, 0, 48, 37, 40), NS, true);
    // A D scale for a D that is not fp8 (nvmath-python: "not supported, would raise an error";
    // the header: INVALID_VALUE).
    Case dscale = make_case({F32C, E4M3, E4M3, BF16, BF16}, true, false, DEF, 1, 0, 48, 37, 64);
    dscale.label = "(D scale pointer, D not fp8)";
    dscale.tweak = [](cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t) {
        float* p = nullptr;  // any non-null device float: the A scale the case already set
        CHECK_LT(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &p, sizeof(p), nullptr));
        CHECK_LT(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &p, sizeof(p)));
    };
    run_case(lt, dscale, CUBLAS_STATUS_INVALID_VALUE, true);
    // fp8 takes a 16-bit bias (the fp8 rows of the datatypes table; XLA: "cuBLAS LT does not support
    // FP32 biases on matmuls with FP8 inputs, even if the matmul output is FP32").
    Case bias8 = make_case({F32C, E4M3, E4M3, BF16, BF16}, true, false, CUBLASLT_EPILOGUE_BIAS, 1, 0, 48, 37, 64);
    bias8.label = "(bias type f32)";
    bias8.tweak = [](cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t) {
        int32_t t = CUDA_R_32F;
        CHECK_LT(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof(t)));
    };
    run_case(lt, bias8, CUBLAS_STATUS_NOT_SUPPORTED, true);
    // The GELU input has D's type; another is allowed only with an E4M3 D ("Otherwise, the data type
    // should be left unset", EPILOGUE_AUX_DATA_TYPE: INVALID_VALUE). Its scale and amax exist for an
    // fp8 aux only (INVALID_VALUE for a bf16 one, as for a D scale).
    Case aux32 = make_case({F32C, E4M3, E4M3, BF16, BF16}, true, false, CUBLASLT_EPILOGUE_GELU_AUX, 1, 0, 48, 37, 64);
    aux32.label = "(aux type f32)";
    aux32.tweak = [](cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t) {
        int32_t t = CUDA_R_32F;
        CHECK_LT(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &t, sizeof(t)));
    };
    run_case(lt, aux32, CUBLAS_STATUS_INVALID_VALUE, true);
    for (cublasLtMatmulDescAttributes_t attr :
         {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER}) {
        Case auxs = make_case({F32C, E4M3, E4M3, BF16, BF16}, true, false, CUBLASLT_EPILOGUE_GELU_AUX, 1, 0, 48, 37, 64);
        auxs.label = attr == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER ? "(aux scale pointer, aux bf16)"
                                                                               : "(aux amax pointer, aux bf16)";
        auxs.tweak = [attr](cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t) {
            float* p = nullptr;  // a device float: the A scale the case already set
            CHECK_LT(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &p, sizeof(p), nullptr));
            CHECK_LT(cublasLtMatmulDescSetAttribute(d, attr, &p, sizeof(p)));
        };
        run_case(lt, auxs, CUBLAS_STATUS_INVALID_VALUE, true);
    }

#if CPU_BACKEND
    const Types f32 = {F32C, F32, F32, F32, F32}, bf16 = {F32C, BF16, BF16, BF16, BF16};
    run_case(lt, make_case({TF32C, BF16, BF16, BF16, BF16}, false, false, DEF, 1, 0, 37, 29, 45), NS);
    run_case(lt, make_case({TF32C, E4M3, E4M3, BF16, BF16}, true, false, DEF, 1, 0, 48, 37, 64), NS);
    // GELU aux leading dimension not a multiple of 8.
    Case aux = make_case(bf16, true, false, CUBLASLT_EPILOGUE_GELU_AUX, 1, 0, 37, 29, 45);
    aux.aux_ld = 44;
    aux.label = "(aux ld 44)";
    run_case(lt, aux, NS, true);
    Case row = make_case(f32, false, false, DEF, 1, 0, 37, 29, 45);
    row.label = "(A in ORDER_ROW)";
    row.tweak = [](cublasLtMatmulDesc_t, cublasLtMatrixLayout_t a) {
        int32_t order = CUBLASLT_ORDER_ROW;
        CHECK_LT(cublasLtMatrixLayoutSetAttribute(a, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof(order)));
    };
    run_case(lt, row, NS);
    Case fast16 = make_case({CUBLAS_COMPUTE_32F_FAST_16BF, F32, F32, F32, F32}, false, false, DEF, 1, 0, 37, 29, 45);
    fast16.label = "(compute 32F_FAST_16BF)";
    run_case(lt, fast16, NS);
    run_case(lt, make_case(f32, true, true, CUBLASLT_EPILOGUE_BGRADA, 1, 0, 37, 29, 45), NS);
    run_case(lt, make_case(f32, false, false, CUBLASLT_EPILOGUE_BGRADB, 1, 0, 37, 29, 45), NS);
    Case relu = make_case(f32, false, false, CUBLASLT_EPILOGUE_RELU, 1, 0, 37, 29, 45);
    relu.label = "(epilogue RELU)";
    run_case(lt, relu, NS);
    Case bias32 = make_case(bf16, false, false, CUBLASLT_EPILOGUE_BIAS, 1, 0, 37, 29, 45);
    bias32.label = "(bias type f32)";
    bias32.tweak = [](cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t) {
        int32_t t = CUDA_R_32F;
        CHECK_LT(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof(t)));
    };
    run_case(lt, bias32, NS);
#endif
}

// Realistic sizes, timed; a spread of 8 columns is checked against the reference.
void test_large(cublasLtHandle_t lt) {
    Case fc = make_case({F32C, BF16, BF16, BF16, BF16}, true, false, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 1, 0, 3072, 1024, 768);
    Case f32 = make_case({F32C, F32, F32, F32, F32}, false, false, CUBLASLT_EPILOGUE_DEFAULT, 1, 1, 1024, 1024, 1024);
    Case tf32 = make_case({TF32C, F32, F32, F32, F32}, true, false, CUBLASLT_EPILOGUE_BIAS, 1, 0, 768, 1024, 768);
    Case attn = make_case({F32C, BF16, BF16, BF16, BF16}, true, false, CUBLASLT_EPILOGUE_DEFAULT, 48, 0, 256, 256, 64);
    for (Case* c : {&fc, &f32, &tf32, &attn}) {
        c->sample_columns = 8;
        run_case(lt, *c);
    }
}

// ----------------------------------------------------------------------------
// Descriptors, heuristic, TF32 rounding, names

void test_api(cublasLtHandle_t lt) {
    cublasLtMatmulDesc_t desc;
    CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int64_t wrong = CUBLAS_OP_T;
    th::report(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &wrong, sizeof(wrong)) ==
                   CUBLAS_STATUS_INVALID_VALUE,
               "desc: SetAttribute with the wrong size is INVALID_VALUE");
    cublasOperation_t op = CUBLAS_OP_T, back = CUBLAS_OP_N;
    size_t written = 0;
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof(op)));
    cublasStatus_t s = cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, nullptr, 0, &written);
    th::report(s == CUBLAS_STATUS_SUCCESS && written == sizeof(int32_t),
               "desc: GetAttribute with size 0 reports the size", "%zu bytes", written);
    th::report(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &back, sizeof(back), &written) ==
                       CUBLAS_STATUS_SUCCESS && back == CUBLAS_OP_T,
               "desc: GetAttribute returns what was set");
    cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_DEFAULT;
    th::report(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e), nullptr) ==
                       CUBLAS_STATUS_SUCCESS && e == CUBLASLT_EPILOGUE_DEFAULT,
               "desc: the epilogue defaults to DEFAULT");
    CHECK_LT(cublasLtMatmulDescDestroy(desc));

    cublasLtMatrixLayout_t l;
    CHECK_LT(cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, 37, 29, 40));
    uint64_t rows = 0;
    int32_t count = 0;
    th::report(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof(rows), &written) ==
                       CUBLAS_STATUS_SUCCESS && rows == 37 && written == 8,
               "layout: GetAttribute returns the rows given to Create");
    th::report(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count), nullptr) ==
                       CUBLAS_STATUS_SUCCESS && count == 1,
               "layout: the batch count defaults to 1");
    th::report(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &rows, sizeof(rows)) ==
                   CUBLAS_STATUS_INVALID_VALUE,
               "layout: SetAttribute with the wrong size is INVALID_VALUE");

    // The heuristic: one algorithm for a plain GEMM; a request for none is an invalid value.
    CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasLtMatmulPreference_t pref;
    CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatrixLayout_t sq;
    CHECK_LT(cublasLtMatrixLayoutCreate(&sq, CUDA_R_32F, 64, 64, 64));
    cublasLtMatmulHeuristicResult_t r = {};
    int found = 0;
    s = cublasLtMatmulAlgoGetHeuristic(lt, desc, sq, sq, sq, sq, pref, 1, &r, &found);
    th::report(s == CUBLAS_STATUS_SUCCESS && found == 1 && r.state == CUBLAS_STATUS_SUCCESS,
               "heuristic: one algorithm for an f32 GEMM", "%s, %d algos, workspace %zu",
               cublasGetStatusName(s), found, r.workspaceSize);
#if CPU_BACKEND
    th::report(r.workspaceSize == 0, "heuristic: the CPU algorithm needs no workspace");
#endif
    th::report(cublasLtMatmulAlgoGetHeuristic(lt, desc, sq, sq, sq, sq, pref, 0, &r, &found) ==
                   CUBLAS_STATUS_INVALID_VALUE,
               "heuristic: requestedAlgoCount 0 is INVALID_VALUE");
    CHECK_LT(cublasLtMatrixLayoutDestroy(sq));
    CHECK_LT(cublasLtMatrixLayoutDestroy(l));
    CHECK_LT(cublasLtMatmulPreferenceDestroy(pref));
    CHECK_LT(cublasLtMatmulDescDestroy(desc));

    th::report(strcmp(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED") == 0,
               "names: cublasGetStatusName", "%s", cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED));
    th::report(cublasLtGetVersion() >= 110000, "version: cublasLtGetVersion", "%zu", cublasLtGetVersion());
}

// D = A B for n x n matrices of constants a and b under the given compute type: every element is
// n*a*b, summed exactly when n is a power of two and a has few bits. Returns D's first element, or
// NaN if the elements differ.
float matmul_const(cublasLtHandle_t lt, cublasComputeType_t compute, float a, float b, int n) {
    const size_t e = (size_t)n * n;
    std::vector<float> h(3 * e, a);
    std::fill(h.begin() + e, h.begin() + 2 * e, b);
    std::vector<uint8_t> bytes(h.size() * sizeof(float));
    memcpy(bytes.data(), h.data(), bytes.size());
    float* d = (float*)upload(bytes);
    cublasLtMatmulDesc_t desc;
    CHECK_LT(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
    cublasLtMatrixLayout_t l;
    CHECK_LT(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, n, n, n));
    const float one = 1.0f, zero = 0.0f;
    CHECK_LT(cublasLtMatmul(lt, desc, &one, d, l, d + e, l, &zero, d + 2 * e, l, d + 2 * e, l, nullptr, nullptr, 0, 0));
    std::vector<uint8_t> out = download(d + 2 * e, e * sizeof(float));
    std::vector<float> result(e);
    memcpy(result.data(), out.data(), out.size());
    CHECK_LT(cublasLtMatrixLayoutDestroy(l));
    CHECK_LT(cublasLtMatmulDescDestroy(desc));
    cudaCheck(cudaFree(d));
    for (float r : result)
        if (r != result[0]) return NAN;
    return result[0];
}

// TF32 keeps 10 mantissa bits: 1 + 2^-12 becomes 1 under TF32 and stays itself under f32. FAST_TF32
// allows the library to use TF32 tensor cores, it does not oblige it: on a GPU cuBLASLt runs a 1x1
// product with full fp32 kernels (seen on an H100), so the GPU check uses a 128x128x128 product of
// constants, which runs on the tensor cores: D = 128 * (1 + 2^-12) under f32, 128 under TF32.
// The ties (round to nearest even) are the CPU backend's choice; GPUs may truncate instead.
void test_tf32_rounding(cublasLtHandle_t lt) {
    const float x = 1.0f + std::ldexp(1.0f, -12);
    const int n = CPU_BACKEND ? 1 : 128;
    float t = matmul_const(lt, TF32C, x, 1.0f, n) / n, f = matmul_const(lt, F32C, x, 1.0f, n) / n;
    th::report(t == 1.0f, "tf32: A = 1 + 2^-12 loses its last bits", "got 1 + %g ulp(tf32) (n=%d)", (t - 1) * 1024, n);
    th::report(f == x, "f32: A = 1 + 2^-12 keeps them", "got 1 + %g * 2^-12 (n=%d)", (f - 1) * 4096, n);
#if CPU_BACKEND
    float tie_down = matmul_const(lt, TF32C, 1.0f + std::ldexp(1.0f, -11), 1.0f, 1);
    float tie_up = matmul_const(lt, TF32C, 1.0f + 3 * std::ldexp(1.0f, -11), 1.0f, 1);
    th::report(tie_down == 1.0f && tie_up == 1.0f + std::ldexp(1.0f, -9),
               "tf32: ties round to even", "1+2^-11 -> 1+%g*2^-10, 1+3*2^-11 -> 1+%g*2^-10",
               (tie_down - 1) * 1024, (tie_up - 1) * 1024);
#endif
}

// fp8 outputs saturate: a D_temp beyond the largest finite E4M3 (448) is stored as +-448, not as
// NaN or infinity (nvmath-python's amax example: "most of the elements are clamped to the maximum
// value"), and amax reports D_temp before the D scale. A = B = all ones (16 x 16, TN), scales
// 1: D_temp = 16 everywhere; with scaleD = 100, D = 1600 -> 448.
void test_fp8_saturation(cublasLtHandle_t lt) {
    const int n = 16;
    std::vector<uint8_t> ones(n * n);
    for (uint8_t& x : ones) encode(E4M3, 1.0f, &x);
    void* dA = upload(ones);
    void* dD = upload(std::vector<uint8_t>(n * n, 0));
    std::vector<uint8_t> hs(2 * sizeof(float), 0);
    const float scale_d = 100.0f;
    memcpy(&hs[0], &scale_d, 4);
    float* dScale = (float*)upload(hs);
    float* dAmax = dScale + 1;
    cublasLtMatmulDesc_t desc;
    CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t t = CUBLAS_OP_T;
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &dScale, sizeof(dScale)));
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &dAmax, sizeof(dAmax)));
    cublasLtMatrixLayout_t l8, l16;
    CHECK_LT(cublasLtMatrixLayoutCreate(&l8, E4M3, n, n, n));
    CHECK_LT(cublasLtMatrixLayoutCreate(&l16, BF16, n, n, n));
    void* dC = upload(std::vector<uint8_t>(n * n * 2, 0));
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasLtMatmul(lt, desc, &one, dA, l8, dA, l8, &zero, dC, l16, dD, l8, nullptr, nullptr, 0, 0);
    std::vector<uint8_t> d = download(dD, n * n), amax = download(dAmax, 4);
    bool all_max = true;
    for (uint8_t& x : d) all_max &= decode(E4M3, &x) == 448.0;
    float a;
    memcpy(&a, amax.data(), 4);
    th::report(s == CUBLAS_STATUS_SUCCESS && all_max && a == 16.0f,
               "fp8: E4M3 output saturates to 448; amax is taken before the D scale",
               "%s, D[0] = %g, amax = %g", cublasGetStatusName(s), decode(E4M3, &d[0]), a);
    CHECK_LT(cublasLtMatrixLayoutDestroy(l8));
    CHECK_LT(cublasLtMatrixLayoutDestroy(l16));
    CHECK_LT(cublasLtMatmulDescDestroy(desc));
    for (void* p : {dA, dC, dD, (void*)dScale}) cudaCheck(cudaFree(p));
}

#if CPU_BACKEND
// The backend computes with the OpenBLAS kernels the CPU's features allow, whatever CPU model the
// installed OpenBLAS knows (llmc/simt/cublaslt.cpp): SkylakeX with AVX-512, Haswell with AVX2 + FMA,
// or the one OPENBLAS_CORETYPE names; and it leaves OPENBLAS_CORETYPE as it found it, since the
// processes it starts inherit the environment. Runs before the first cublasLtCreate.
void test_openblas_kernels() {
    const char* user = getenv("OPENBLAS_CORETYPE");
    std::string before = user ? user : "(unset)";
    std::string core = simt::openblas_core();
    const char* after = getenv("OPENBLAS_CORETYPE");
    std::string want = "(OpenBLAS's own choice)";
#if defined(__x86_64__)
    if (user)
        want = user;
    else if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512cd"))
        want = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        want = "Haswell";
#endif
    bool named = want[0] == '(' || strcasecmp(core.c_str(), want.c_str()) == 0;
    th::report(named, "OpenBLAS kernels: those the CPU's features allow", "OpenBLAS uses %s, expected %s",
               core.c_str(), want.c_str());
    th::report((after ? std::string(after) : "(unset)") == before, "OpenBLAS loaded: OPENBLAS_CORETYPE unchanged",
               "before %s, after %s", before.c_str(), after ? after : "(unset)");
}
#endif

int main() {
    auto t0 = std::chrono::steady_clock::now();
#if CPU_BACKEND
    test_openblas_kernels();
#endif
    cublasLtHandle_t lt;
    CHECK_LT(cublasLtCreate(&lt));
    test_api(lt);
    test_tf32_rounding(lt);
    test_regular_combinations(lt);
    test_fp8_combinations(lt);
    test_fp8_saturation(lt);
    test_shapes(lt);
    test_refusals(lt);
    test_large(lt);
    CHECK_LT(cublasLtDestroy(lt));
    printf("total %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return th::finish();
}
