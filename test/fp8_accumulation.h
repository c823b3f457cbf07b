// test/fp8_accumulation.h — how many bits this device's fp8 GEMM keeps while it adds up its products,
// measured, and the unit roundoff the fp8 tests' error budgets take from it.
//
// Hopper's fp8 tensor cores add products into an accumulator narrower than fp32 (reported for the
// H800 by DeepSeek-V3's authors, technical report section 3.3.2: about 14 bits), and cuBLASLt may or may not move partial sums into
// fp32 along K; a budget that assumes fp32 accumulation throughout then fails on an H100 by the
// difference. So the budgets take the accumulator's precision from a measurement, not a guess:
//
// The probe: D = Aᵀ B of E4M3 operands (M = N = 16, K = 4096), every output the sum of one product
// 1·1 first and K-1 products 2^-j. The sum 1 + (K-1)·2^-j is exact while the accumulator keeps j
// bits below the running sum's leading bit, and the bf16 output still tells it apart from what a
// lost bit gives for every j up to 18. kept: the largest j (8..18) whose sums all came out exact.
// unit: what one addition may lose, relative to the running sum: fp32's unit roundoff 2^-24 when every
// j the probe reaches is exact (the accumulator is fp32, or as good for these budgets, as on the CPU
// backend), else 2^-kept, one unit in the last place kept (the worst case, a truncating accumulator).
// A budget of (K + c)·unit·S then bounds the accumulation error of K products of magnitudes summing
// to S, however cuBLASLt splits K. The probe runs once per process (fp8_accumulation()).
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "../llmc/fp8.cuh"
#include "harness.h"

namespace th {

struct Fp8Accumulation {
    bool measured = false;           // the probe ran: the device has fp8 GEMMs and cuBLASLt ran them
    std::string why;                 // why it did not, when it did not
    int kept = 0;                    // the largest j (8..18) whose 1 + (K-1)·2^-j came out exact
    int first_lost = 0;              // the first j that did not (0: none, all the probe reaches)
    double unit = 1.0 / (1 << 24);   // unit roundoff of one addition, relative to the running sum
};

namespace detail {

// D[0] of D (M,N, bf16) = Aᵀ B for E4M3 A stored (K,M) and B stored (K,N), scales 1, on a handle of
// its own; NaN (and *why) when cuBLASLt offers no algorithm or refuses.
inline float fp8_probe_gemm(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, int M, int N, int K,
                            std::string* why) {
    DeviceBuffer<uint8_t> da(a), db(b);
    DeviceBuffer<float> scale(std::vector<float>{1.f});
    DeviceBuffer<__nv_bfloat16> d((size_t)M * N);
    const size_t workspace_bytes = 32u << 20;
    DeviceBuffer<char> workspace(workspace_bytes);
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulPreference_t pref;
    cublasLtCreate(&lt);
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
    const float* sp = scale.ptr;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sp, sizeof(sp));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sp, sizeof(sp));
    cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, K, M, K);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, K, N, K);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, M, N, M);
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                         sizeof(workspace_bytes));
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    float result = NAN;
    const float alpha = 1.f, beta = 0.f;
    if (cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heuristic, &found) !=
            CUBLAS_STATUS_SUCCESS || found == 0) {
        *why = "cuBLASLt offers no algorithm for the probe's fp8 GEMM";
    } else if (cublasLtMatmul(lt, desc, &alpha, da.ptr, la, db.ptr, lb, &beta, d.ptr, ld, d.ptr, ld, &heuristic.algo,
                              workspace.ptr, workspace_bytes, 0) != CUBLAS_STATUS_SUCCESS) {
        *why = "cuBLASLt refused the probe's fp8 GEMM";
    } else {
        result = __bfloat162float(d.host()[0]);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
    return result;
}

inline Fp8Accumulation probe_fp8_accumulation() {
    Fp8Accumulation r;
    if (!fp8_supported(0, &r.why)) return r;
    const int M = 16, N = 16, K = 4096;
    for (int j = 8; j <= 18; j++) {
        // a·b of every k > 0 is 2^-(j/2) · 2^-(j - j/2) = 2^-j, both exact in E4M3
        auto e4m3 = [](float x) { return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); };
        std::vector<uint8_t> a((size_t)M * K), b((size_t)N * K);
        for (int i = 0; i < M; i++)
            for (int k = 0; k < K; k++) a[(size_t)i * K + k] = e4m3(k == 0 ? 1.f : std::ldexp(1.f, -(j / 2)));
        for (int i = 0; i < N; i++)
            for (int k = 0; k < K; k++) b[(size_t)i * K + k] = e4m3(k == 0 ? 1.f : std::ldexp(1.f, -(j - j / 2)));
        float got = fp8_probe_gemm(a, b, M, N, K, &r.why);
        if (std::isnan(got)) return r;
        float exact = __bfloat162float(__float2bfloat16((float)(1.0 + (K - 1) * std::ldexp(1.0, -j))));
        if (got != exact) {
            r.first_lost = j;
            break;
        }
        r.kept = j;
    }
    r.measured = true;
    if (r.first_lost) r.unit = std::ldexp(1.0, -r.kept);
    return r;
}

}  // namespace detail

// This device's fp8 accumulation, probed on first use.
inline const Fp8Accumulation& fp8_accumulation() {
    static const Fp8Accumulation r = detail::probe_fp8_accumulation();
    return r;
}

}  // namespace th
