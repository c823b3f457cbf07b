// test/test_matmul.cu — the linear layers of llmc/matmul.cuh (cuBLASLt with bias/GELU epilogues,
// input/weight/bias gradients, the bias gradient fused into the weight GEMM or by the reduction
// kernels) against a double-precision reference, for fp32, bf16 and fp16; the plan cache; the
// heuristic's other algorithm ranks; --gemm-autotune's choice among them.
#include "../llmc/matmul.cuh"
#include "harness.h"

#include <algorithm>
#include <cmath>
#include <vector>

double gelu_tanh(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double gelu_tanh_grad(double x) {
    double u = 0.7978845608028654 * (x + 0.044715 * x * x * x), t = std::tanh(u);
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}
double gelu_erf(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_erf_grad(double x) { return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI); }

// dweight = dw0 + dout^T inp in double, (OC, C); *max_mag: the largest sum of |terms| of an element.
template <class T>
std::vector<double> dweight_reference(const std::vector<T>& dw0, const std::vector<T>& dout, const std::vector<T>& inp,
                                      int N, int C, int OC, double* max_mag) {
    std::vector<double> dw((size_t)OC * C);
    *max_mag = 0;
    for (int o = 0; o < OC; o++)
        for (int c = 0; c < C; c++) {
            double s = to_float(dw0[(size_t)o * C + c]), mag = std::fabs(s);
            for (int n = 0; n < N; n++) {
                double p = (double)to_float(dout[(size_t)n * OC + o]) * to_float(inp[(size_t)n * C + c]);
                s += p;
                mag += std::fabs(p);
            }
            dw[(size_t)o * C + c] = s;
            *max_mag = std::max(*max_mag, mag);
        }
    return dw;
}

// One forward + backward check at (N, C, OC) for storage type T, with or without bias and GELU.
template <class T>
void check_linear(const char* tname, int N, int C, int OC, bool use_bias, bool use_gelu, GeluKind kind) {
    auto inp = th::random_tensor<T>((size_t)N * C, 1), w = th::random_tensor<T>((size_t)OC * C, 2),
         b = th::random_tensor<T>(OC, 3), dout = th::random_tensor<T>((size_t)N * OC, 4),
         dw0 = th::random_tensor<T>((size_t)OC * C, 5), db0 = th::random_tensor<T>(OC, 6);
    // pre_gelu of the layer *below* (for the backward's fused dGELU): the gradient w.r.t. inp.
    auto pre_below = th::random_tensor<T>((size_t)N * C, 7);
    auto f = [](T x) { return (double)to_float(x); };
    double (*g)(double) = kind == GeluKind::Tanh ? gelu_tanh : gelu_erf;
    double (*gd)(double) = kind == GeluKind::Tanh ? gelu_tanh_grad : gelu_erf_grad;

    // Reference in double.
    std::vector<double> pre_ref((size_t)N * OC), out_ref((size_t)N * OC), dinp_ref((size_t)N * C), db_ref(OC);
    double max_fwd_mag = 0, max_dinp_mag = 0, max_dw_mag = 0;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = use_bias ? f(b[o]) : 0, mag = std::fabs(s);
            for (int c = 0; c < C; c++) {
                s += f(inp[(size_t)n * C + c]) * f(w[(size_t)o * C + c]);
                mag += std::fabs(f(inp[(size_t)n * C + c]) * f(w[(size_t)o * C + c]));
            }
            pre_ref[(size_t)n * OC + o] = s;
            out_ref[(size_t)n * OC + o] = use_gelu ? g(s) : s;
            max_fwd_mag = std::max(max_fwd_mag, mag);
        }
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double s = 0, mag = 0;
            for (int o = 0; o < OC; o++) {
                s += f(dout[(size_t)n * OC + o]) * f(w[(size_t)o * C + c]);
                mag += std::fabs(f(dout[(size_t)n * OC + o]) * f(w[(size_t)o * C + c]));
            }
            dinp_ref[(size_t)n * C + c] = use_gelu ? s * gd(f(pre_below[(size_t)n * C + c])) : s;
            max_dinp_mag = std::max(max_dinp_mag, mag);
        }
    for (int o = 0; o < OC; o++) {
        double bs = f(db0[o]);
        for (int n = 0; n < N; n++) bs += f(dout[(size_t)n * OC + o]);
        db_ref[o] = bs;
    }
    std::vector<double> dw_ref = dweight_reference(dw0, dout, inp, N, C, OC, &max_dw_mag);

    th::DeviceBuffer<T> d_inp(inp), d_w(w), d_b(b), d_dout(dout), d_dw(dw0), d_db(db0), d_pre_below(pre_below);
    th::DeviceBuffer<T> d_out((size_t)N * OC), d_pre((size_t)N * OC), d_dinp((size_t)N * C);
    th::DeviceBuffer<char> scratch(matmul_backward_scratch_bytes(N, OC));

    matmul_forward(d_out.ptr, use_gelu ? d_pre.ptr : nullptr, d_inp.ptr, d_w.ptr, use_bias ? d_b.ptr : nullptr, N, C,
                   OC, kind, 0);
    matmul_backward(d_dinp.ptr, d_dw.ptr, use_bias ? d_db.ptr : nullptr, scratch.ptr, d_dout.ptr, d_inp.ptr, d_w.ptr,
                    use_gelu ? d_pre_below.ptr : nullptr, N, C, OC, kind, 0);
    cudaCheck(cudaDeviceSynchronize());

    // Tolerances. A K-term fp32 dot product errs by at most K*2^-24 * sum|a*b| in any summation
    // order (plus a few roundings for bias/beta): atol = (K+4)*2^-24*max sum|a*b|. Outputs stored
    // in T add half an ulp of T (rtol = eps_T/2), and GELU (|gelu'| <= 1.13) with an unfused path
    // rounding its input to T first adds up to another ulp: rtol = 2*eps_T when GELU is involved.
    // Real cuBLASLt (test_cublaslt.cu) may also round the product to a 16-bit T before adding the
    // bias, the accumulated dweight or applying (d)GELU: half an ulp of T at the product's magnitude,
    // `pre` below; and its fused tanh GELU may be off by 2^-12 |x| (the hardware tanh approximation).
    double eps_t = dtype_eps<T>(), u = std::ldexp(1.0, -24);
    double pre = sizeof(T) == 2 ? 0.5 * eps_t : 0;
    double r = use_gelu ? 2 * eps_t : 0.5 * eps_t;
    double max_pre = 0;
    for (double x : pre_ref) max_pre = std::max(max_pre, std::fabs(x));
    double gelu_approx = use_gelu && kind == GeluKind::Tanh ? std::ldexp(max_pre, -12) : 0;
    char name[160];
    const char* epi = use_gelu ? (kind == GeluKind::Tanh ? "+gelu_tanh" : "+gelu_erf") : "";
    snprintf(name, sizeof(name), "matmul_forward<%s> N=%d C=%d OC=%d%s%s", tname, N, C, OC, use_bias ? "+bias" : "", epi);
    th::check_close(name, out_ref.data(), d_out.host().data(), out_ref.size(),
                    th::Tol{2 * ((C + 4) * u + (use_bias || use_gelu ? pre : 0)) * max_fwd_mag + gelu_approx, r});
    if (use_gelu) {
        snprintf(name, sizeof(name), "matmul_forward<%s> pre-GELU aux N=%d C=%d OC=%d", tname, N, C, OC);
        th::check_close(name, pre_ref.data(), d_pre.host().data(), pre_ref.size(),
                        th::Tol{((C + 4) * u + (use_bias ? pre : 0)) * max_fwd_mag, 0.5 * eps_t});
    }
    snprintf(name, sizeof(name), "matmul_backward<%s> dinp%s N=%d C=%d OC=%d", tname, use_gelu ? " (with dGELU)" : "", N, C, OC);
    th::check_close(name, dinp_ref.data(), d_dinp.host().data(), dinp_ref.size(),
                    th::Tol{2 * ((OC + 4) * u + (use_gelu ? pre : 0)) * max_dinp_mag, r});
    snprintf(name, sizeof(name), "matmul_backward<%s> dweight += N=%d C=%d OC=%d", tname, N, C, OC);
    th::check_close(name, dw_ref.data(), d_dw.host().data(), dw_ref.size(),
                    th::Tol{((N + 4) * u + pre) * max_dw_mag, 0.5 * eps_t});
    if (use_bias) {
        // Column sums: N+1 terms of magnitude <= 1 summed in fp32, one rounding to T. The fused
        // route (BGRADB) first rounds the N-term sum to T, since cuBLASLt writes it in T: half an
        // ulp of T more at |sum| <= N.
        snprintf(name, sizeof(name), "matmul_backward<%s> dbias += N=%d OC=%d", tname, N, OC);
        th::check_close(name, db_ref.data(), d_db.host().data(), db_ref.size(),
                        th::Tol{(N + 2) * u * (N + 1) + (sizeof(T) == 2 ? 0.5 * eps_t * N : 0), 0.5 * eps_t});
    }
}

// The bias-gradient reduction kernels (the route where cuBLASLt refuses BGRADB, and fp8's): column
// sums against the double reference (N+1 terms of magnitude <= 1 in fp32, one rounding to T), and
// bit-identical under every thread order. OC = 70 takes one column per thread, OC = 80 128-bit packs.
template <class T>
void check_bias_backward(int OC) {
    const int N = 300;
    auto dout = th::random_tensor<T>((size_t)N * OC, 9), db0 = th::random_tensor<T>(OC, 10);
    std::vector<double> ref(OC);
    for (int o = 0; o < OC; o++) {
        ref[o] = to_float(db0[o]);
        for (int n = 0; n < N; n++) ref[o] += to_float(dout[(size_t)n * OC + o]);
    }
    th::DeviceBuffer<T> d_dout(dout);
    th::DeviceBuffer<char> scratch(matmul_backward_scratch_bytes(N, OC));
    auto run = [&] {
        th::DeviceBuffer<T> d_db(db0);
        bias_backward(d_db.ptr, (float*)scratch.ptr, (const T*)d_dout.ptr, N, OC, 0);
        return d_db.host();
    };
    char name[96];
    snprintf(name, sizeof(name), "bias_backward kernels %s N=%d OC=%d", th::dtype_name<T>(), N, OC);
    th::check_close(name, ref.data(), run().data(), OC,
                    th::Tol{(N + 2) * std::ldexp(1.0, -24) * (N + 1), 0.5 * dtype_eps<T>()});
    th::run_orders(name, run);
}

// matmul_backward's bias gradient: fused into the weight-gradient GEMM (a BGRADB plan that ran) where
// the route is pinned there (BiasGradRoute::InGemm), and where cuBLASLt refuses BGRADB (planted, as
// cublaslt_run records a refusal) the plain GEMM and the reduction kernels: dinp bit-identical to the fused route's (the epilogue does not touch that
// GEMM); dweight bit-identical on the CPU backend, whose sums do not depend on the epilogue, and on
// a GPU, where cuBLASLt may run another kernel for the plain GEMM than for BGRADB (seen on an H100
// for fp16), within check_linear's dweight budget of the double reference; dbias against the double
// reference as in check_bias_backward. (The fused route's dbias is checked by check_linear.)
template <class T>
void check_bias_gradient_routes() {
    const int N = 130, C = 48, OC = 24;
    auto inp = th::random_tensor<T>((size_t)N * C, 91), w = th::random_tensor<T>((size_t)OC * C, 92),
         dout = th::random_tensor<T>((size_t)N * OC, 93), dw0 = th::random_tensor<T>((size_t)OC * C, 94),
         db0 = th::random_tensor<T>(OC, 95);
    th::DeviceBuffer<T> d_inp(inp), d_w(w), d_dout(dout);
    th::DeviceBuffer<char> scratch(matmul_backward_scratch_bytes(N, OC));
    auto run = [&] {
        th::DeviceBuffer<T> d_dinp((size_t)N * C), d_dw(dw0), d_db(db0);
        matmul_backward(d_dinp.ptr, d_dw.ptr, d_db.ptr, scratch.ptr, d_dout.ptr, d_inp.ptr, d_w.ptr, N, C, OC, 0);
        return std::make_tuple(d_dinp.host(), d_dw.host(), d_db.host());
    };
    auto bgrad_plans = [](bool refuse) {
        int ok = 0;
        for (auto& [key, plan] : matmul_context().plans)
            if (std::get<5>(std::get<0>(key)) == (int)CUBLASLT_EPILOGUE_BGRADB) {
                ok += plan.ok;
                if (refuse) plan.ok = false;
            }
        return ok;
    };
    matmul_forget_plans();
    matmul_bias_grad_route() = BiasGradRoute::InGemm;
    auto fused_route = run();
    int fused = bgrad_plans(true);
    auto kernel_route = run();
    matmul_bias_grad_route() = BiasGradRoute::Kernels;  // the Hopper route: the same as a refused BGRADB
    auto pinned_kernels = run();
    matmul_bias_grad_route() = BiasGradRoute::Auto;  // the device's choice: the kernels on Hopper only
    matmul_forget_plans();
    run();
    int device = 0, major = 0;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    int auto_fused = bgrad_plans(false);
    char name[128];
    snprintf(name, sizeof(name), "matmul_backward<%s>: by default the bias gradient %s (compute capability %d.x)",
             th::dtype_name<T>(), major == 9 ? "by the kernels" : "in the weight GEMM", major);
    th::report(auto_fused == (major == 9 ? 0 : 1), name, "BGRADB plans that ran: %d", auto_fused);
    snprintf(name, sizeof(name), "matmul_backward<%s>: the bias gradient is fused into the weight GEMM (BGRADB)",
             th::dtype_name<T>());
    th::report(fused == 1, name, "BGRADB plans that ran: %d", fused);
    snprintf(name, sizeof(name), "matmul_backward<%s>: the kernel route (Hopper's) = a refused BGRADB, bit for bit",
             th::dtype_name<T>());
    th::report(pinned_kernels == kernel_route, name);
    snprintf(name, sizeof(name), "matmul_backward<%s>: BGRADB refused: dinp bit-identical to the fused route",
             th::dtype_name<T>());
    th::report(std::get<0>(fused_route) == std::get<0>(kernel_route), name);
#ifndef __CUDACC__  // the CPU backend
    snprintf(name, sizeof(name), "matmul_backward<%s>: BGRADB refused: dweight bit-identical to the fused route",
             th::dtype_name<T>());
    th::report(std::get<1>(fused_route) == std::get<1>(kernel_route), name);
#else
    double max_mag;
    std::vector<double> dw_ref = dweight_reference(dw0, dout, inp, N, C, OC, &max_mag);
    double eps_t = dtype_eps<T>();
    snprintf(name, sizeof(name), "matmul_backward<%s>: BGRADB refused: dweight by the plain GEMM", th::dtype_name<T>());
    th::check_close(name, dw_ref.data(), std::get<1>(kernel_route).data(), dw_ref.size(),
                    th::Tol{((N + 4) * std::ldexp(1.0, -24) + 0.5 * eps_t) * max_mag, 0.5 * eps_t});
#endif
    std::vector<double> ref(OC);
    for (int o = 0; o < OC; o++) {
        ref[o] = to_float(db0[o]);
        for (int n = 0; n < N; n++) ref[o] += to_float(dout[(size_t)n * OC + o]);
    }
    snprintf(name, sizeof(name), "matmul_backward<%s>: BGRADB refused: dbias by the reduction kernels", th::dtype_name<T>());
    th::check_close(name, ref.data(), std::get<2>(kernel_route).data(), OC,
                    th::Tol{(N + 2) * std::ldexp(1.0, -24) * (N + 1), 0.5 * dtype_eps<T>()});
}

// Loss-scaled fp16 gradients: an inf in dout must reach dinp, dweight and dbias, and a bias-gradient
// sum beyond fp16's range must become inf (not be clamped), so the trainer's overflow check sees them.
// N = 3, C = OC = 16: dout[0][0] = inf; dout[1][5] = dout[2][5] = 40000, whose dbias sum overflows
// while dinp rows 1 and 2 (|w| < 1) stay finite.
void check_backward_nonfinite_fp16() {
    const int N = 3, C = 16, OC = 16;
    auto inp = th::random_tensor<__half>((size_t)N * C, 71), w = th::random_tensor<__half>((size_t)OC * C, 72);
    auto dout = th::random_tensor<__half>((size_t)N * OC, 73);
    dout[0] = from_float<__half>(INFINITY);
    dout[1 * OC + 5] = dout[2 * OC + 5] = from_float<__half>(40000.f);
    th::DeviceBuffer<__half> d_inp(inp), d_w(w), d_dout(dout), d_dinp((size_t)N * C),
        d_dw((size_t)OC * C, th::Fill::Zero), d_db(OC, th::Fill::Zero);
    th::DeviceBuffer<char> scratch(matmul_backward_scratch_bytes(N, OC));
    matmul_backward(d_dinp.ptr, d_dw.ptr, d_db.ptr, scratch.ptr, d_dout.ptr, d_inp.ptr, d_w.ptr, (const __half*)nullptr,
                    N, C, OC, GeluKind::Tanh, 0);
    std::vector<__half> dinp = d_dinp.host(), dw = d_dw.host(), db = d_db.host();
    auto finite = [](__half x) { return std::isfinite(to_float(x)); };
    size_t wrong = 0;  // elements whose finiteness is not the expected one
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) wrong += finite(dinp[n * C + c]) != (n != 0);
    for (int o = 0; o < OC; o++)
        for (int c = 0; c < C; c++)
            if (o != 5) wrong += finite(dw[o * C + c]) != (o != 0);  // row 5 (40000 * inp) may overflow either way
    for (int o = 0; o < OC; o++) wrong += finite(db[o]) != (o != 0 && o != 5);
    bool ok = wrong == 0 && to_float(db[0]) == INFINITY && to_float(db[5]) == INFINITY;
    th::report(ok, "matmul_backward fp16: an inf dout and an overflowing dbias sum reach the gradients (no clamping)",
               "dbias[0]=%g dbias[5]=%g (want inf), elements of unexpected finiteness: %zu", to_float(db[0]),
               to_float(db[5]), wrong);
}

// A GEMM's descriptors are cached with its plan: the second call of a shape creates no cuBLASLt
// descriptor (counted by the CPU backend), and uses the pointers it brings, not the first call's:
// with another bias and aux matrix it is bit-identical to the same call made with a fresh plan.
void check_plan_cache() {
    const int N = 16, C = 32, OC = 48;
    auto inp = th::random_tensor<float>((size_t)N * C, 81), w = th::random_tensor<float>((size_t)OC * C, 82);
    th::DeviceBuffer<float> d_inp(inp), d_w(w), d_b1(th::random_tensor<float>(OC, 83)),
        d_b2(th::random_tensor<float>(OC, 84));
    auto forward = [&](const float* bias) {
        th::DeviceBuffer<float> out((size_t)N * OC), pre((size_t)N * OC);
        matmul_forward(out.ptr, pre.ptr, d_inp.ptr, d_w.ptr, bias, N, C, OC, GeluKind::Tanh, 0);
        std::vector<float> both = out.host(), p = pre.host();
        both.insert(both.end(), p.begin(), p.end());
        return both;
    };
    matmul_forget_plans();
    std::vector<float> first = forward(d_b1.ptr);
#if defined(SIMT_CPU)
    uint64_t created0 = simt::cublaslt_descriptor_count();
#endif
    std::vector<float> cached = forward(d_b2.ptr);
#if defined(SIMT_CPU)
    uint64_t created = simt::cublaslt_descriptor_count() - created0;
    th::report(created == 0, "matmul plan cache: a repeated GEMM shape creates no cuBLASLt descriptors",
               "%llu created", (unsigned long long)created);
#endif
    matmul_forget_plans();
    std::vector<float> fresh = forward(d_b2.ptr);
    th::report(cached == fresh && cached != first,
               "matmul plan cache: a cached plan uses this call's bias and aux pointers (GELU_AUX_BIAS)",
               "cached == fresh plan: %d, differs from the first call's bias: %d", cached == fresh, cached != first);
}

// The heuristic's other algorithms (matmul_set_algo_rank; dev/cuda/matmul.cu times them): a bf16
// GEMM with bias at every rank offered (up to 8) against the double reference, within the forward's
// budget of check_linear; the first rank past those offered is refused with nothing written (the CPU
// backend offers two, which compute the same values); back at rank 0 the GEMM runs again.
void check_algo_ranks() {
    using bf16 = __nv_bfloat16;
    const int N = 64, C = 128, OC = 96;
    auto inp = th::random_tensor<bf16>((size_t)N * C, 91), w = th::random_tensor<bf16>((size_t)OC * C, 92),
         b = th::random_tensor<bf16>(OC, 93);
    std::vector<double> ref((size_t)N * OC);
    double max_mag = 0;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = to_float(b[o]), mag = std::fabs(s);
            for (int c = 0; c < C; c++) {
                double p = (double)to_float(inp[(size_t)n * C + c]) * to_float(w[(size_t)o * C + c]);
                s += p;
                mag += std::fabs(p);
            }
            ref[(size_t)n * OC + o] = s;
            max_mag = std::max(max_mag, mag);
        }
    th::DeviceBuffer<bf16> d_inp(inp), d_w(w), d_b(b);
    const double eps = dtype_eps<bf16>(), u = std::ldexp(1.0, -24);
    const th::Tol tol{2 * ((C + 4) * u + 0.5 * eps) * max_mag, 0.5 * eps};
    auto gemm = [&](bf16* out) {
        return cublaslt_matmul(out, (const bf16*)d_w.ptr, (const bf16*)d_inp.ptr, OC, N, C, true, false, C, C, OC, 1.f,
                               0.f, CUBLASLT_EPILOGUE_BIAS, (const bf16*)d_b.ptr, (bf16*)nullptr, 0, 0);
    };
    int offered = 0;
    bool untouched = false;
    for (int rank = 0; rank < 8; rank++) {
        matmul_set_algo_rank(rank);
        th::DeviceBuffer<bf16> out((size_t)N * OC, th::Fill::NaN);
        if (!gemm(out.ptr)) {
            std::vector<bf16> h = out.host();
            untouched = std::all_of(h.begin(), h.end(), [](bf16 x) { return std::isnan(to_float(x)); });
            break;
        }
        offered++;
        cudaCheck(cudaDeviceSynchronize());
        char name[120];
        snprintf(name, sizeof(name), "cuBLASLt algorithm rank %d: bf16 GEMM + bias N=%d C=%d OC=%d", rank, N, C, OC);
        th::check_close(name, ref.data(), out.host().data(), ref.size(), tol);
    }
#if defined(SIMT_CPU)
    th::report(offered == 2 && untouched, "cuBLASLt algorithm ranks: the CPU backend offers two; rank 2 is refused, "
               "nothing written", "offered %d, output untouched: %d", offered, untouched);
#else
    th::report(offered >= 1 && (offered == 8 || untouched), "cuBLASLt algorithm ranks: past those offered, refused "
               "with nothing written", "offered %d, output untouched: %d", offered, untouched);
#endif
    matmul_set_algo_rank(0);
    th::DeviceBuffer<bf16> out((size_t)N * OC, th::Fill::NaN);
    const bool again = gemm(out.ptr);
    cudaCheck(cudaDeviceSynchronize());
    th::report(again, "cuBLASLt algorithm rank 0 again after a refused rank: the GEMM runs", "");
    if (again) th::check_close("... and matches the reference", ref.data(), out.host().data(), ref.size(), tol);
}

// --gemm-autotune (matmul_autotune): a new plan times the heuristic's candidates at its first call
// and keeps the fastest. A forward with bias and the GELU aux output, and a weight gradient that adds
// into dweight (beta 1: D is also C, so the trial runs must start from a copy of it), against the
// same calls untuned: on the CPU backend, whose candidates compute the same values, bit for bit (a
// trial run left in D would double the gradient); on a GPU, where another algorithm may add in
// another order, within 1e-5 of the largest output. Both new plans are timed on the CPU backend. A
// plan made while a stream is captured into a CUDA graph is not timed (a trial waits for the GPU),
// and the replayed graph computes the same values.
void check_autotune() {
    const int N = 48, C = 64, OC = 80;
    auto inp = th::random_tensor<float>((size_t)N * C, 71), w = th::random_tensor<float>((size_t)OC * C, 72),
         dout = th::random_tensor<float>((size_t)N * OC, 73), dw0 = th::random_tensor<float>((size_t)OC * C, 74);
    th::DeviceBuffer<float> d_inp(inp), d_w(w), d_b(th::random_tensor<float>(OC, 75)), d_dout(dout);
    auto run = [&](bool tune) {
        matmul_forget_plans();
        matmul_set_autotune(tune);
        th::DeviceBuffer<float> out((size_t)N * OC), pre((size_t)N * OC), dw(dw0);
        matmul_forward(out.ptr, pre.ptr, d_inp.ptr, d_w.ptr, d_b.ptr, N, C, OC, GeluKind::Tanh, 0);
        matmul_backward_weight(dw.ptr, d_dout.ptr, d_inp.ptr, N, C, OC, 0);
        std::vector<float> all = out.host(), p = pre.host(), g = dw.host();
        all.insert(all.end(), p.begin(), p.end());
        all.insert(all.end(), g.begin(), g.end());
        return all;
    };
    std::vector<float> plain = run(false);
    const int tuned0 = matmul_context().autotuned;
    std::vector<float> tuned = run(true);
    const int timed = matmul_context().autotuned - tuned0;
    double largest = 0, diff = 0;
    for (size_t i = 0; i < plain.size(); i++) {
        largest = std::max(largest, (double)std::fabs(plain[i]));
        diff = std::max(diff, (double)std::fabs(plain[i] - tuned[i]));
    }
#if defined(SIMT_CPU)
    th::report(diff == 0 && timed == 2, "--gemm-autotune: GELU-aux forward and accumulating weight gradient as "
               "untuned, bit for bit; both plans timed", "max diff %g, %d plans timed", diff, timed);
#else
    th::report(diff <= 1e-5 * largest, "--gemm-autotune: GELU-aux forward and accumulating weight gradient as "
               "untuned, within 1e-5 of the largest output", "max diff %g of %g, %d plans timed", diff, largest, timed);
#endif
    // A new plan inside a capture: not timed; the graph's replay computes the untuned values.
    matmul_forget_plans();
    matmul_set_autotune(true);
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    th::DeviceBuffer<float> out((size_t)N * OC), pre((size_t)N * OC);
    const int before = matmul_context().autotuned;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaCheck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    matmul_forward(out.ptr, pre.ptr, d_inp.ptr, d_w.ptr, d_b.ptr, N, C, OC, GeluKind::Tanh, stream);
    cudaCheck(cudaStreamEndCapture(stream, &graph));
    cudaCheck(cudaGraphInstantiate(&exec, graph, 0));
    cudaCheck(cudaGraphLaunch(exec, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    std::vector<float> replayed = out.host(), plain_out(plain.begin(), plain.begin() + (size_t)N * OC);
    double rdiff = 0;
    for (size_t i = 0; i < replayed.size(); i++) rdiff = std::max(rdiff, (double)std::fabs(replayed[i] - plain_out[i]));
    th::report(matmul_context().autotuned == before && rdiff <= 1e-5 * largest,
               "--gemm-autotune: a plan made during a CUDA graph capture is not timed; the replay computes the GEMM",
               "%d timed, max diff %g", matmul_context().autotuned - before, rdiff);
    cudaCheck(cudaGraphExecDestroy(exec));
    cudaCheck(cudaGraphDestroy(graph));
    cudaCheck(cudaStreamDestroy(stream));
    matmul_set_autotune(false);
    matmul_forget_plans();
}

int main() {
    matmul_init();
    check_plan_cache();
    check_algo_ranks();
    check_autotune();
    check_backward_nonfinite_fp16();
    for (auto [N, C, OC] : {std::make_tuple(37, 72, 100), std::make_tuple(64, 64, 256), std::make_tuple(130, 48, 24)}) {
        for (bool bias : {false, true}) {
            check_linear<float>("float", N, C, OC, bias, false, GeluKind::Tanh);
            check_linear<__nv_bfloat16>("bf16", N, C, OC, bias, false, GeluKind::Tanh);
            check_linear<__half>("fp16", N, C, OC, bias, false, GeluKind::Tanh);
        }
        for (GeluKind kind : {GeluKind::Tanh, GeluKind::Erf}) {
            check_linear<float>("float", N, C, OC, true, true, kind);
            check_linear<__nv_bfloat16>("bf16", N, C, OC, true, true, kind);
            check_linear<__half>("fp16", N, C, OC, true, true, kind);
        }
    }
    for (int OC : {70, 80}) {
        check_bias_backward<float>(OC);
        check_bias_backward<__nv_bfloat16>(OC);
        check_bias_backward<__half>(OC);
    }
    check_bias_gradient_routes<float>();
    check_bias_gradient_routes<__nv_bfloat16>();
    check_bias_gradient_routes<__half>();
    matmul_destroy();
    return th::finish();
}
