// dev/cuda/matmul.cu — the linear layer's forward pass (out = GELU(inp · Wᵀ + bias)): each variant
// against a CPU reference, then timed (TFLOP/s).
//
// Variants:
//   1           one thread per output element, fp32 loop over C: no data reuse, every input read from
//               global memory OC (or N) times, so memory-bound at a few TFLOP/s
//   2           cuBLASLt GEMM (tensor cores), then separate bias and GELU kernels: the (N,OC) output
//               makes two extra round trips through memory
//   production  llmc/matmul.cuh: cuBLASLt with the GELU_AUX_BIAS epilogue, bias and GELU applied while
//               the tile is in registers, writing the pre-GELU input (for backward) and the output
// fp8 (bf16 tensors, E4M3 GEMM; compute capability 8.9+, skipped with the reason elsewhere):
//   fp8 1       current scaling: each call measures both operands' amax, sets the scales, then casts:
//               every operand read twice before the GEMM
//   fp8 prod.   matmul_forward_fp8, delayed scaling: the scales come from earlier calls' amaxes, so
//               each operand is read once, by a cast that also records its amax
//   fp8 GEMM    the cuBLASLt fp8 GEMM alone (bias epilogue) on operands already cast: what the casts
//               cost, and how close the GEMM comes to the FP8 peak
// Then a probe of how many bits the fp8 GEMM keeps while it accumulates (fp8_accumulation_probe), and
// the bf16 GEMMs of one GPT-2 training step timed with each algorithm cuBLASLt offers, beside the
// heuristic's choice that production takes (step_gemms_by_algorithm), with the bias gradient's two
// routes.
//
// Build and run: make build/cpu/dev_matmul && build/cpu/dev_matmul    (CPU backend)
//                make build/gpu/dev_matmul && build/gpu/dev_matmul    (GPU, nvcc)
// Prints a PASS/FAIL line per checked output and variant (the exit code says whether all passed),
// then times each variant (dev/cuda/README.md).
#include "../../llmc/matmul.cuh"
#include "../../llmc/mfu.h"
#include "../../test/fp8_accumulation.h"
#include "../../test/harness.h"
#include "common.h"

#include <functional>
#include <string>
#include <vector>

// variant 1: out[n][o] = gelu(sum_c inp[n][c] * w[o][c] + b[o]), one thread each.
template <class T>
__global__ void matmul_naive_kernel(T* out, T* pre, const T* inp, const T* w, const T* bias, int N, int C, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x, n = blockIdx.y;
    if (o >= OC) return;
    float s = to_float(bias[o]);
    for (int c = 0; c < C; c++) s += to_float(inp[(size_t)n * C + c]) * to_float(w[(size_t)o * C + c]);
    pre[(size_t)n * OC + o] = from_float<T>(s);
    out[(size_t)n * OC + o] = from_float<T>(0.5f * s * (1.f + tanhf(0.7978845608f * (s + 0.044715f * s * s * s))));
}

// variant 2's bias kernel: x[n][o] += b[o].
template <class T>
__global__ void add_bias_kernel(T* x, const T* bias, int N, int OC) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)N * OC) x[i] = from_float<T>(to_float(x[i]) + to_float(bias[i % OC]));
}

// What each variant number of run_variant is, for the printed lines (3 is the production path, which
// make gpu-check reads as "bf16 variant 3").
const char* const kVariantNames[] = {"", "(thread per output)", "(GEMM, then bias and GELU kernels)",
                                     "(production, cuBLASLt epilogue)"};

template <class T>
void run_variant(int variant, T* out, T* pre, const T* inp, const T* w, const T* b, int N, int C, int OC) {
    if (variant == 1) {
        cudaCheck(launch_kernel(matmul_naive_kernel<T>, dim3(CEIL_DIV(OC, 128), N), dim3(128), 0, 0, out, pre, inp, w, b, N, C, OC));
    } else if (variant == 2) {
        if (!cublaslt_matmul(pre, w, inp, OC, N, C, true, false, C, C, OC, 1.f, 0.f, CUBLASLT_EPILOGUE_DEFAULT,
                             (const T*)nullptr, (T*)nullptr, 0, 0)) {
            fprintf(stderr, "cuBLASLt refused the plain GEMM\n");
            exit(EXIT_FAILURE);
        }
        size_t total = (size_t)N * OC;
        cudaCheck(launch_kernel(add_bias_kernel<T>, dim3((unsigned)CEIL_DIV(total, 256)), dim3(256), 0, 0, pre, b, N, OC));
        gelu_forward(out, (const T*)pre, total, GeluKind::Tanh, 0);
    } else {
        matmul_forward(out, pre, inp, w, b, N, C, OC, GeluKind::Tanh, 0);
    }
}

template <class T>
void validate_and_bench(const char* tname, int N, int C, int OC, int reps, Precision prec) {
    std::vector<T> hi = th::random_tensor<T>((size_t)N * C, 1), hb = th::random_tensor<T>(OC, 3),
                   hw = th::random_tensor<T>((size_t)OC * C, 2, -0.1f, 0.1f);
    th::DeviceBuffer<T> inp(hi), w(hw), b(hb), out((size_t)N * OC), pre((size_t)N * OC);

    // CPU reference in double from the T-rounded inputs, on a sample of rows (all rows if small).
    int rows = std::min(N, 64);
    std::vector<double> ref((size_t)rows * OC);
    double max_mag = 0;
    for (int n = 0; n < rows; n++)
        for (int o = 0; o < OC; o++) {
            double s = to_float(hb[o]), mag = std::fabs(s);
            for (int c = 0; c < C; c++) {
                double p = (double)to_float(hi[(size_t)n * C + c]) * to_float(hw[(size_t)o * C + c]);
                s += p;
                mag += std::fabs(p);
            }
            ref[(size_t)n * OC + o] = 0.5 * s * (1 + std::tanh(0.7978845608028654 * (s + 0.044715 * s * s * s)));
            max_mag = std::max(max_mag, mag);
        }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    float peak = peak_tflops(prop.name, prec, false);
    auto run = [&](int variant) {
        run_variant(variant, out.ptr, pre.ptr, (const T*)inp.ptr, (const T*)w.ptr, (const T*)b.ptr, N, C, OC);
    };
    for (int variant = 1; variant <= 3; variant++) {
        run(variant);
        cudaCheck(cudaDeviceSynchronize());
        std::vector<T> h = th::to_host(out.ptr, (size_t)rows * OC);
        char name[128];
        snprintf(name, sizeof(name), "matmul %s variant %d %s (N=%d C=%d OC=%d)", tname, variant, kVariantNames[variant],
                 N, C, OC);
        // fp32 dot products of C terms (<= (C+4)*2^-24*sum|ab|), GELU (|gelu'| <= 1.13), output
        // rounded to T (half an ulp) plus one more ulp where an unfused path rounds pre-GELU to T.
        // Variant 2 also rounds the GEMM result to T *before* adding the bias: an error of half an
        // ulp of |inp·Wᵀ| <= max sum|ab|, which cancellation with the bias does not shrink.
        double atol = 2.3 * (C + 4) * std::ldexp(1.0, -24) * max_mag;
        if (variant == 2) atol += 1.13 * 0.5 * dtype_eps<T>() * max_mag;
        th::check_close(name, ref.data(), h.data(), h.size(), th::Tol{atol, 2 * dtype_eps<T>()});
        snprintf(name, sizeof(name), "%s variant %d %s", tname, variant, kVariantNames[variant]);
        flops_line(name, time_ms([&] { run(variant); }, reps), 2.0 * N * C * OC, peak);
    }
}

// The device's dense FP8 tensor-core peak in TFLOP/s (0: unknown device or no fp8 tensor cores).
float fp8_peak_tflops(const char* device_name) {
    int n;
    const GPUPeak* peaks = gpu_peaks(&n);
    for (int i = 0; i < n; i++)
        if (strstr(device_name, peaks[i].name_contains)) return peaks[i].fp8;
    return 0.f;
}

// The fp8 forward pass (bias + tanh GELU) of each fp8 variant against a double reference computed
// from the same E4M3 values and scales (the scales are fp8_max / amax in every variant here: the
// delayed ones repeat the same tensors), then its speed.
void validate_and_bench_fp8(int N, int C, int OC, int reps) {
    std::string why;
    if (!fp8_supported(0, &why)) {
        printf("SKIP fp8 variants: %s\n", why.c_str());
        return;
    }
    using bf16 = __nv_bfloat16;
    std::vector<bf16> hi = th::random_tensor<bf16>((size_t)N * C, 1), hb = th::random_tensor<bf16>(OC, 3),
                      hw = th::random_tensor<bf16>((size_t)OC * C, 2, -0.1f, 0.1f);
    th::DeviceBuffer<bf16> inp(hi), w(hw), b(hb), out((size_t)N * OC), pre((size_t)N * OC);
    th::DeviceBuffer<char> scratch(matmul_fp8_scratch_bytes(N, C, OC)), mem(fp8_linear_bytes(16));
    Fp8Linear st;
    fp8_linear_init(&st, mem.ptr, 16, 0, 0);

    // Reference on a sample of rows, from the fp8 values the GEMM sees.
    auto amax = [](const std::vector<bf16>& v) {
        float m = 0.f;
        for (bf16 x : v) m = std::fmax(m, std::fabs(to_float(x)));
        return m;
    };
    const float sx = 448.f / amax(hi), sw = 448.f / amax(hw);
    const double sxw = (double)(1.f / sx) * (1.f / sw);
    auto q = [](bf16 x, float s) {
        __half h(__nv_cvt_fp8_to_halfraw(__nv_cvt_float_to_fp8(to_float(x) * s, __NV_SATFINITE, __NV_E4M3), __NV_E4M3));
        return (double)__half2float(h);
    };
    int rows = std::min(N, 64);
    std::vector<double> qx((size_t)rows * C), qw((size_t)OC * C), out_ref((size_t)rows * OC),
        out_budget(out_ref.size()), pre_ref(out_ref.size()), pre_budget(out_ref.size());
    for (size_t i = 0; i < qx.size(); i++) qx[i] = q(hi[i], sx);
    for (size_t i = 0; i < qw.size(); i++) qw[i] = q(hw[i], sw);
    const double u = std::ldexp(1.0, -24), eps = dtype_eps<bf16>();
    for (int n = 0; n < rows; n++)
        for (int o = 0; o < OC; o++) {
            double s = 0, mag = 0;
            for (int c = 0; c < C; c++) {
                double p = qx[(size_t)n * C + c] * qw[(size_t)o * C + c];
                s += p;
                mag += std::fabs(p);
            }
            double bias = to_float(hb[o]), v = s * sxw + bias, e = (C + 4) * u * (mag * sxw + std::fabs(bias));
            double g = 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
            size_t i = (size_t)n * OC + o;
            // fp32 accumulation (K+4 roundings of sum|terms|), bf16 rounding of pre (k = 1/2); GELU
            // carries the input error through |gelu'| <= 1.13, adds a few fp32 ulps, rounds once.
            pre_ref[i] = v;
            pre_budget[i] = e + 0.5 * eps * std::fabs(v);
            out_ref[i] = g;
            out_budget[i] = 1.13 * pre_budget[i] + 8 * u * std::fabs(v) + 0.5 * eps * std::fabs(g);
        }

    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    float peak = fp8_peak_tflops(prop.name);
    const double flops = 2.0 * N * C * OC;
    const Fp8MatmulScratch L = fp8_matmul_scratch_layout(N, C, OC);
    char* base = scratch.ptr;
    auto current = [&] {  // variant 1: fresh states, so each call primes (measures) before casting
        fp8_linear_init(&st, mem.ptr, 16, 0, 0);
        matmul_forward_fp8(out.ptr, pre.ptr, inp.ptr, w.ptr, b.ptr, N, C, OC, GeluKind::Tanh, st, scratch.ptr, 0);
    };
    auto delayed = [&] {
        matmul_forward_fp8(out.ptr, pre.ptr, inp.ptr, w.ptr, b.ptr, N, C, OC, GeluKind::Tanh, st, scratch.ptr, 0);
    };
    auto gemm_only = [&] {  // the operands the last call cast are still in the scratch buffer
        if (!cublaslt_matmul_fp8(pre.ptr, base + L.weight_q, __NV_E4M3, base + L.inp_q, __NV_E4M3, OC, N, fp8_ld(C),
                                 fp8_ld(C), fp8_ld(C), OC, st.weight.scale_inv, st.inp.scale_inv, 0.f,
                                 CUBLASLT_EPILOGUE_BIAS, b.ptr, (bf16*)nullptr, 0, 0)) {
            fprintf(stderr, "cuBLASLt refused the fp8 GEMM\n");
            exit(EXIT_FAILURE);
        }
    };
    struct Variant {
        const char* name;
        std::function<void()> run;
        bool gelu;  // validates out (GELU) or pre (GEMM + bias only)
    } variants[] = {{"fp8 variant 1 (current scaling)", current, true},
                    {"fp8 production (delayed scaling)", delayed, true},
                    {"fp8 GEMM only (operands already cast)", gemm_only, false}};
    for (const Variant& v : variants) {
        v.run();
        cudaCheck(cudaDeviceSynchronize());
        std::vector<bf16> h = th::to_host(v.gelu ? out.ptr : pre.ptr, (size_t)rows * OC);
        char name[160];
        snprintf(name, sizeof(name), "matmul %s (N=%d C=%d OC=%d)", v.name, N, C, OC);
        th::check_budget(name, v.gelu ? out_ref : pre_ref, h, v.gelu ? out_budget : pre_budget);
        flops_line(v.name, time_ms(v.run, reps), flops, peak);
    }
}

// The GEMMs of one GPT-2 training step in bf16, each as llmc/matmul.cuh issues it (same operands,
// transposes, leading dimensions and epilogue), timed with each algorithm cuBLASLt's heuristic offers
// (matmul_set_algo_rank 0 .. kRanks-1; production takes rank 0). Each rank's output is checked
// against rank 0's: a different algorithm sums in another order (split-K, other tiles), so the two
// may differ by the fp32 accumulation bound and one bf16 rounding each, no more. Prints, per GEMM, the
// heuristic's choice and the fastest rank, then the step's sum of each (layers × the per-layer GEMMs
// + the classifier's three): what choosing the algorithm by timing would save.
// The two projections' bias gradients come from the LayerNorm backward (train_gpt2.cu's backward()),
// so their weight GEMMs are plain. Then the two routes of the other bias gradients (qkv's and fc's,
// per layer): the weight GEMM with cuBLASLt's BGRADB epilogue + bias_accumulate_kernel
// (matmul_backward_weight_bgradb, production where cuBLASLt takes it, but on Hopper) against the plain
// weight GEMM + bias_backward's reduction kernels (production on Hopper; matmul_bias_grad_in_gemm):
// both validated by test/test_matmul.cu.
constexpr int kRanks = 8;

void step_gemms_by_algorithm(int N, int C, int V, int layers, int reps) {
    using bf16 = __nv_bfloat16;
    const int C4 = 4 * C, widest = std::max(V, C4);
    // Random inputs (|x| <= 1, |w| <= 0.1, |dout| <= 0.01): one random (N, 4C) block each, repeated
    // where a buffer is larger (the classifier's (N, V)), so the host makes no gigabytes of numbers.
    const std::vector<bf16> block_x = th::random_tensor<bf16>((size_t)N * C4, 11),
                            block_w = th::random_tensor<bf16>((size_t)C4 * C, 12, -0.1f, 0.1f),
                            block_d = th::random_tensor<bf16>((size_t)N * C4, 13, -0.01f, 0.01f);
    auto fill_tiled = [](th::DeviceBuffer<bf16>& buf, const std::vector<bf16>& block) {
        for (size_t at = 0; at < buf.n; at += block.size())
            cudaCheck(cudaMemcpy(buf.ptr + at, block.data(), std::min(block.size(), buf.n - at) * sizeof(bf16),
                                 cudaMemcpyHostToDevice));
    };
    th::DeviceBuffer<bf16> x((size_t)N * C4), w((size_t)widest * C), dout((size_t)N * widest), pre((size_t)N * C4);
    fill_tiled(x, block_x);
    fill_tiled(w, block_w);
    fill_tiled(dout, block_d);
    fill_tiled(pre, block_x);
    th::DeviceBuffer<bf16> bias(th::random_tensor<bf16>(C4, 14)), out((size_t)N * widest), dw((size_t)widest * C),
        grad(C4), dbias(C4, th::Fill::Zero);
    th::DeviceBuffer<char> scratch(matmul_backward_scratch_bytes(N, C4));
    struct Gemm {
        std::string name;
        int calls;        // per step
        double flops;     // per call
        std::function<bool()> run;
        const bf16* out;  // what the ranks are compared on
        size_t out_n;
        double k;         // the product's inner size, for the accumulation bound
    };
    auto fwd = [&](const char* name, int OC, int K, cublasLtEpilogue_t epi, bool with_bias, int calls) {
        return Gemm{name, calls, 2.0 * N * K * OC, [=, &x, &w, &out, &bias, &pre] {
                        return cublaslt_matmul(out.ptr, (const bf16*)w.ptr, (const bf16*)x.ptr, OC, N, K, true, false,
                                               K, K, OC, 1.f, 0.f, epi, with_bias ? (const bf16*)bias.ptr : nullptr,
                                               epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ? pre.ptr : nullptr, OC, 0);
                    },
                    out.ptr, (size_t)N * OC, (double)K};
    };
    // dinp (N,K) = dout (N,OC) · W (OC,K), with dGELU of pre where the layer's input was a GELU.
    auto dinp = [&](const char* name, int OC, int K, bool dgelu, int calls) {
        return Gemm{name, calls, 2.0 * N * K * OC, [=, &w, &dout, &out, &pre] {
                        return cublaslt_matmul(out.ptr, (const bf16*)w.ptr, (const bf16*)dout.ptr, K, N, OC, false,
                                               false, K, OC, K, 1.f, 0.f,
                                               dgelu ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT,
                                               (const bf16*)nullptr, dgelu ? pre.ptr : nullptr, K, 0);
                    },
                    out.ptr, (size_t)N * K, (double)OC};
    };
    // dW (OC,K) += dout (N,OC)ᵀ · x (N,K), with BGRADB's bias sums where the layer has a bias.
    auto dweight = [&](const char* name, int OC, int K, bool bgradb, int calls) {
        return Gemm{name, calls, 2.0 * N * K * OC, [=, &x, &dout, &dw, &grad] {
                        return cublaslt_matmul(dw.ptr, (const bf16*)x.ptr, (const bf16*)dout.ptr, K, OC, N, false, true,
                                               K, OC, K, 1.f, 1.f,
                                               bgradb ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT,
                                               bgradb ? (const bf16*)grad.ptr : nullptr, (bf16*)nullptr, 0, 0);
                    },
                    dw.ptr, (size_t)OC * K, (double)N};
    };
    const Gemm gemms[] = {
        fwd("qkv forward (bias)", 3 * C, C, CUBLASLT_EPILOGUE_BIAS, true, layers),
        fwd("attention proj forward (bias)", C, C, CUBLASLT_EPILOGUE_BIAS, true, layers),
        fwd("fc forward (bias, GELU aux)", C4, C, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, true, layers),
        fwd("fc proj forward (bias)", C, C4, CUBLASLT_EPILOGUE_BIAS, true, layers),
        fwd("classifier forward", V, C, CUBLASLT_EPILOGUE_DEFAULT, false, 1),
        dinp("qkv dinp", 3 * C, C, false, layers),
        dinp("attention proj dinp", C, C, false, layers),
        dinp("fc dinp", C4, C, false, layers),
        dinp("fc proj dinp (dGELU)", C, C4, true, layers),
        dinp("classifier dinp", V, C, false, 1),
        dweight("qkv dweight (BGRADB)", 3 * C, C, true, layers),
        dweight("attention proj dweight", C, C, false, layers),
        dweight("fc dweight (BGRADB)", C4, C, true, layers),
        dweight("fc proj dweight", C, C4, false, layers),
        dweight("classifier dweight", V, C, false, 1),
    };
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    const float peak = peak_tflops(prop.name, Precision::BF16, false);
    printf("GPT-2 step's bf16 GEMMs by cuBLASLt algorithm (N=%d C=%d V=%d, %d layers; up to %d ranks):\n", N, C, V,
           layers, kRanks);
    double step_first = 0, step_best = 0;
    const size_t sample = 1 << 20;  // the outputs' first elements, compared across ranks
    for (const Gemm& g : gemms) {
        std::vector<bf16> first;
        float first_ms = 0, best_ms = 0;
        int best = -1, ranks = 0;
        for (int r = 0; r < kRanks; r++) {
            matmul_set_algo_rank(r);
            cudaCheck(cudaMemset(dw.ptr, 0, dw.n * sizeof(bf16)));  // the weight GEMMs accumulate
            if (!g.run()) break;  // no algorithm at this rank (or the one offered was refused)
            cudaCheck(cudaDeviceSynchronize());
            std::vector<bf16> h = th::to_host(g.out, std::min(g.out_n, sample));
            if (r == 0) {
                first = h;
            } else {
                // fp32 sums of k products of |x| <= 1, |w| <= 0.1 (or |dout| <= 0.01): each rank within
                // (k+4)·2^-24·k·0.1 of the exact sum, then rounded to bf16 (half an ulp each).
                char name[200];
                snprintf(name, sizeof(name), "gemm %s: algorithm rank %d = rank 0", g.name.c_str(), r);
                const double atol = 2 * (g.k + 4) * std::ldexp(1.0, -24) * g.k * 0.1;
                th::check_close(name, first.data(), h.data(), h.size(), th::Tol{atol, dtype_eps<bf16>()});
            }
            const float ms = time_ms([&] { g.run(); }, reps);
            if (r == 0) first_ms = ms;
            if (best < 0 || ms < best_ms) best = r, best_ms = ms;
            ranks++;
        }
        matmul_set_algo_rank(0);
        if (ranks == 0) {
            printf("  %s: cuBLASLt offers no algorithm\n", g.name.c_str());
            continue;
        }
        char name[200];
        snprintf(name, sizeof(name), "%s, heuristic's choice", g.name.c_str());
        flops_line(name, first_ms, g.flops, peak);
        snprintf(name, sizeof(name), "%s, fastest of %d (rank %d)", g.name.c_str(), ranks, best);
        flops_line(name, best_ms, g.flops, peak);
        step_first += g.calls * first_ms;
        step_best += g.calls * best_ms;
    }
    printf("  step GEMMs: heuristic's choices %.3f ms, fastest algorithm of each %.3f ms (%.1f%% less)\n", step_first,
           step_best, step_first > 0 ? 100 * (1 - step_best / step_first) : 0.0);

    // The bias gradients' two routes, summed over a step's 2 layers with one × layers.
    double bgradb_ms = 0, kernels_ms = 0;
    const std::pair<int, int> biased[] = {{3 * C, C}, {C4, C}};  // (OC, K) per layer
    for (const auto& [OC, K] : biased) {
        auto fused = [&, OC = OC, K = K] {
            return matmul_backward_weight_bgradb(dw.ptr, dbias.ptr, grad.ptr, (const bf16*)dout.ptr, (const bf16*)x.ptr,
                                                 N, K, OC, 0);
        };
        auto unfused = [&, OC = OC, K = K] {
            matmul_backward_weight(dw.ptr, (const bf16*)dout.ptr, (const bf16*)x.ptr, N, K, OC, 0);
            bias_backward(dbias.ptr, reinterpret_cast<float*>(scratch.ptr), (const bf16*)dout.ptr, N, OC, 0);
        };
        if (!fused()) {
            printf("  bias gradient OC=%d: cuBLASLt refuses BGRADB here (the kernels are the only route)\n", OC);
            return;
        }
        const float a = time_ms([&] { fused(); }, reps), b = time_ms(unfused, reps);
        bgradb_ms += layers * a;
        kernels_ms += layers * b;
    }
    printf("  bias gradients with their weight GEMMs, a step: BGRADB epilogue %.3f ms, plain GEMM + reduction kernels "
           "%.3f ms\n",
           bgradb_ms, kernels_ms);

    // fc's bias gradient is also the column sums of fc proj's input gradient (dGELU's output, which
    // is fc's dout): cuBLASLt's DGELU_BGRAD epilogue forms them while that GEMM writes it, and fc's
    // weight GEMM is then plain. Per layer, fc proj dinp (DGELU) + fc dweight (BGRADB), production but
    // on Hopper, against fc proj dinp (DGELU_BGRAD) + fc dweight; each + bias_accumulate_kernel.
    // Both routes add their sums into dw, a sink of C4 values, as production adds them into dbias.
    bf16* dgelu_out = out.ptr;  // (N, 4C): fc proj's dinp, fc's dout
    bf16 *grad_a = grad.ptr, *grad_b = dbias.ptr;
    auto via_bgradb = [&] {  // matmul_backward's launchers
        matmul_backward_input(dgelu_out, (const bf16*)dout.ptr, (const bf16*)w.ptr, (const bf16*)pre.ptr, N, C4, C,
                              GeluKind::Tanh, 0);
        return matmul_backward_weight_bgradb(dw.ptr, dw.ptr, grad_a, (const bf16*)dgelu_out, (const bf16*)x.ptr, N, C,
                                             C4, 0);
    };
    auto via_dgelu_bgrad = [&] {
        if (!cublaslt_matmul(dgelu_out, (const bf16*)w.ptr, (const bf16*)dout.ptr, C4, N, C, false, false, C4, C, C4,
                             1.f, 0.f, CUBLASLT_EPILOGUE_DGELU_BGRAD, (const bf16*)grad_b, pre.ptr, C4, 0))
            return false;
        matmul_backward_weight(dw.ptr, (const bf16*)dgelu_out, (const bf16*)x.ptr, N, C, C4, 0);
        cudaCheck(launch_kernel(bias_accumulate_kernel<bf16>, dim3(CEIL_DIV(C4, 256)), dim3(256), 0, 0, dw.ptr,
                                (const bf16*)grad_b, C4));
        return true;
    };
    if (!via_bgradb() || !via_dgelu_bgrad()) {
        printf("  fc bias gradient: cuBLASLt refuses DGELU_BGRAD or BGRADB here\n");
        return;
    }
    cudaCheck(cudaDeviceSynchronize());
    // The same sums, BGRADB's of the stored bf16 dGELU output, DGELU_BGRAD's (in cuBLASLt, and the
    // CPU backend) of the values before that rounding: apart by half an ulp of each term (bf16 eps
    // of the column's absolute sum covers it and the fp32 accumulation), and each sum's own rounding.
    std::vector<bf16> h_out = th::to_host(dgelu_out, (size_t)N * C4), h_a = th::to_host(grad_a, C4),
                      h_b = th::to_host(grad_b, C4);
    std::vector<double> want(C4), budget(C4, 0.0);
    for (size_t n = 0; n < (size_t)N; n++)
        for (int c = 0; c < C4; c++) budget[c] += std::fabs((double)to_float(h_out[n * C4 + c]));
    for (int c = 0; c < C4; c++) {
        want[c] = to_float(h_a[c]);
        budget[c] = dtype_eps<bf16>() * (budget[c] + 2 * std::fabs(want[c]));
    }
    char name[200];
    snprintf(name, sizeof(name), "fc bias gradient: DGELU_BGRAD's sums = BGRADB's (N=%d, %d columns)", N, C4);
    th::check_budget(name, want, h_b, budget);
    const float a = time_ms([&] { via_bgradb(); }, reps), b = time_ms([&] { via_dgelu_bgrad(); }, reps);
    printf("  fc bias gradient with fc proj dinp and fc dweight, a step: BGRADB in fc dweight %.3f ms, DGELU_BGRAD in "
           "fc proj dinp %.3f ms\n",
           layers * a, layers * b);
}

// How many bits the fp8 GEMM keeps while it accumulates (test/fp8_accumulation.h): on a GPU one line
// for make gpu-check; on the CPU backend, which accumulates fp8 GEMMs in fp32, a check that the probe
// finds every sum exact.
void fp8_accumulation_probe() {
    const th::Fp8Accumulation& acc = th::fp8_accumulation();
    if (!acc.measured) {
        printf("SKIP fp8 accumulation probe: %s\n", acc.why.c_str());
        return;
    }
    bool all = acc.first_lost == 0;
    char name[200];
    snprintf(name, sizeof(name), "fp8 accumulation: 1 + 4095 products of 2^-j summed exactly for j <= %d%s", acc.kept,
             all ? " (all the probe reaches: fp32-like)" : "");
    if (on_cpu_backend())
        th::report(all, name, "first j lost: %s", all ? "none" : std::to_string(acc.first_lost).c_str());
    else
        printf("fp8 accumulation: sums exact down to products of 2^-%d beside 1.0%s\n", acc.kept,
               all ? " (all the probe reaches)" : "");
}

int main(int argc, char** argv) {
    dev_command_line(argc, argv,
        "The linear layer's forward pass (GELU(inp · Wᵀ + bias)): variant 1 (a thread per output), 2\n"
        "(cuBLASLt, then bias and GELU kernels) and production (llmc/matmul.cuh, cuBLASLt's epilogue), the\n"
        "fp8 variants, a probe of the fp8 GEMM's accumulation, and a GPT-2 step's bf16 GEMMs by cuBLASLt\n"
        "algorithm; timed in TFLOP/s.\n" DEV_VALIDATES);
    matmul_init();
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    bool gpu = peak_tflops(prop.name, Precision::BF16, false) > 0 || strstr(prop.name, "SIMT") == nullptr;
    printf("benchmark on %s%s\n", prop.name, gpu ? "" : " (CPU-backend figures, not GPU performance)");
    // GPT-2 small's MLP up-projection at B*T = 8192 on a GPU; a small shape on the CPU backend.
    int N = gpu ? 8192 : 256, C = gpu ? 768 : 128, OC = 4 * C;
    validate_and_bench<float>("fp32", N, C, OC, gpu ? 20 : 2, Precision::FP32);
    validate_and_bench<__nv_bfloat16>("bf16", N, C, OC, gpu ? 20 : 2, Precision::BF16);
    // fp16 and bf16 share the tensor-core peak on every GPU of the table, so fp16 reads the bf16 column.
    validate_and_bench<__half>("fp16", N, C, OC, gpu ? 20 : 2, Precision::BF16);
    validate_and_bench_fp8(N, C, OC, gpu ? 20 : 2);
    fp8_accumulation_probe();
    // GPT-2 124M's step at B=16, T=1024 on a GPU; 2 layers of a small one on the CPU backend.
    if (gpu)
        step_gemms_by_algorithm(16 * 1024, 768, 50304, 12, 10);
    else
        step_gemms_by_algorithm(128, 64, 320, 2, 1);
    matmul_destroy();
    return th::finish();
}
