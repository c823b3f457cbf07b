// test/test_gelu.cu — the GELU kernels of llmc/gelu.cuh (forward and in-place backward, tanh and erf
// forms) against a double-precision reference, for fp32, bf16 and fp16, under three thread orders, at
// sizes that are and are not multiples of the 128-bit pack, and through misaligned views.
#include "../llmc/gelu.cuh"
#include "harness.h"

#include <cfloat>
#include <cmath>
#include <vector>

// ----------------------------------------------------------------------------
// Reference (double)

constexpr double kSqrt2OverPi = 0.7978845608028654, kCubic = 0.044715;

double tanh_arg(double x) { return kSqrt2OverPi * (x + kCubic * x * x * x); }

// GELU and its derivative split in two terms (value = term1 + term2) so that the error budget can
// follow the cancellation between them: forward has term2 = 0; backward is sigmoid(2u) (tanh) or
// Phi(x) (erf) plus the x-times-derivative term. The forms avoid the cancellation in 1 + tanh and
// 1 + erf for negative x, which double precision suffers too (1 + tanh(-25) is 0 in double).
struct Terms {
    double t1, t2;
};
Terms gelu_ref(double x, GeluKind kind) {
    if (kind == GeluKind::Tanh) return {x / (1 + std::exp(-2 * tanh_arg(x))), 0};
    return {0.5 * x * std::erfc(-x / std::sqrt(2.0)), 0};
}
Terms gelu_grad_ref(double x, GeluKind kind) {
    if (kind == GeluKind::Tanh) {
        double u = tanh_arg(x), sig = 1 / (1 + std::exp(-2 * u));
        return {sig, 2 * x * sig * (1 - sig) * kSqrt2OverPi * (1 + 3 * kCubic * x * x)};
    }
    return {0.5 * std::erfc(-x / std::sqrt(2.0)), x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI)};
}

// The kernel's fp32 error, as a multiple of eps_fp32 of |term1| + |term2|, from counting roundings:
// Tanh: u = sqrt(2/pi)(x + 0.044715x^3) carries ~6 eps of relative error (its two terms share a
// sign: no cancellation), which exp(-2|u|) multiplies by 2|u| (the exponent's conditioning; the
// GPU's fast-math __expf adds ~1.2 ulp per unit of argument too), plus ~8 roundings in the
// sigmoid, its derivative, the products and the final multiply by dout: 12 + 16|u|.
// Erf: erfc(z), z = -x/sqrt(2), has conditioning ~2z^2 = x^2 on z's 1.5 eps of error, exp(-x^2/2)
// amplifies the 2 eps of its argument by x^2/2, plus ~6 ulps of erfcf/expf and ~6 roundings:
// 12 + 2x^2.
double fp32_error_ulps(double x, GeluKind kind) {
    return kind == GeluKind::Tanh ? 12 + 16 * std::fabs(tanh_arg(x)) : 12 + 2 * x * x;
}

// ----------------------------------------------------------------------------
// Helpers

// Values in [lo, hi) rounded to T, with a few chosen values first (zero, the tails, the zero of
// GELU' near -0.75), so the reference sees exactly what the kernel sees.
template <class T>
std::vector<T> random_tensor(size_t n, uint64_t seed, float lo, float hi, bool specials) {
    std::vector<T> t = th::random_tensor<T>(n, seed, lo, hi);
    const float chosen[] = {0.f, -8.f, 8.f, -0.7518f, -3.f, 3.f, -1e-3f, 1e-3f, -5.5f};
    for (size_t i = 0; specials && i < n && i < sizeof(chosen) / sizeof(chosen[0]); i++)
        t[i] = from_float<T>(chosen[i]);
    return t;
}

// ----------------------------------------------------------------------------
// Tests

// Forward and backward at N elements for storage type T, through a view `offset` elements into
// its allocation (offset 1 defeats 128-bit access: the scalar path).
template <class T>
void test_gelu(GeluKind kind, size_t N, size_t offset, uint64_t seed) {
    const char* kname = kind == GeluKind::Tanh ? "tanh" : "erf", *tname = th::dtype_name<T>();
    auto x = random_tensor<T>(N, seed, -6.f, 6.f, true);
    auto dout = random_tensor<T>(N, seed + 1, -1.f, 1.f, false);
    char name[160];

    snprintf(name, sizeof(name), "gelu_forward %s %s N=%zu offset=%zu: thread orders", kname, tname, N, offset);
    auto out = th::run_orders(name, [&] {
        th::DeviceView<T> d_inp(x, offset), d_out(std::vector<T>(N), offset);
        gelu_forward(d_out.ptr, (const T*)d_inp.ptr, N, kind, 0);
        return d_out.host();
    });
    snprintf(name, sizeof(name), "gelu_backward_inplace %s %s N=%zu offset=%zu: thread orders", kname, tname, N, offset);
    auto dinp = th::run_orders(name, [&] {
        th::DeviceView<T> d_inp(x, offset), d_grad(dout, offset);
        gelu_backward_inplace(d_grad.ptr, (const T*)d_inp.ptr, N, kind, 0);
        return d_grad.host();
    });

    // Budgets: the fp32 computation's error (fp32_error_ulps), plus for bf16 and fp16 the one
    // rounding of the result to T (k = 1: at most eps/2 of |ref|, the other half covers the fp32
    // value straddling a rounding boundary the exact one does not). atol = FLT_MIN: below it fp32 is
    // subnormal and relative accuracy ends (not reached by these inputs, it only guards zero); for
    // fp16 also half its smallest subnormal, 2^-25: GELU(x) and GELU'(x) dout for x below about -5
    // fall under fp16's normal range (2^-14), where that rounding is absolute.
    double rounding = sizeof(T) == 4 ? 0 : dtype_eps<T>();
    double atol = FLT_MIN + (sizeof(T) == 4 ? 0 : dtype_denorm_min<T>() / 2);
    std::vector<double> ref(N), ref_grad(N), budget(N), budget_grad(N);
    for (size_t i = 0; i < N; i++) {
        double xi = th::to_double(x[i]), dyi = th::to_double(dout[i]), ulps = fp32_error_ulps(xi, kind);
        Terms f = gelu_ref(xi, kind), g = gelu_grad_ref(xi, kind);
        ref[i] = f.t1 + f.t2;
        budget[i] = atol + th::EPS_FP32 * ulps * (std::fabs(f.t1) + std::fabs(f.t2)) + rounding * std::fabs(ref[i]);
        ref_grad[i] = dyi * (g.t1 + g.t2);
        budget_grad[i] = atol + th::EPS_FP32 * ulps * std::fabs(dyi) * (std::fabs(g.t1) + std::fabs(g.t2)) +
                         rounding * std::fabs(ref_grad[i]);
    }
    snprintf(name, sizeof(name), "gelu_forward %s %s N=%zu offset=%zu vs double", kname, tname, N, offset);
    th::check_budget(name, ref, out, budget);
    snprintf(name, sizeof(name), "gelu_backward_inplace %s %s N=%zu offset=%zu vs double", kname, tname, N, offset);
    th::check_budget(name, ref_grad, dinp, budget_grad);
}

// In place (out == inp) gives the out-of-place bits.
template <class T>
void test_gelu_inplace(GeluKind kind, size_t N) {
    auto x = random_tensor<T>(N, 77, -6.f, 6.f, true);
    th::DeviceBuffer<T> d_a(x), d_b(N, th::Fill::Zero);
    gelu_forward(d_b.ptr, (const T*)d_a.ptr, N, kind, 0);
    gelu_forward(d_a.ptr, (const T*)d_a.ptr, N, kind, 0);
    auto a = d_a.host(), b = d_b.host();
    char name[128];
    snprintf(name, sizeof(name), "gelu_forward %s %s N=%zu in place == out of place",
             kind == GeluKind::Tanh ? "tanh" : "erf", th::dtype_name<T>(), N);
    th::check_bitwise(name, a.data(), b.data(), N * sizeof(T));
}

// The reference's stable forms (sigmoid, erfc) against the textbook formulas, where the latter
// are accurate in double (|x| <= 4): guards the reference itself against an algebra slip.
void test_reference_forms() {
    double worst = 0;
    for (double x = -4; x <= 4; x += 1.0 / 64) {
        double u = tanh_arg(x), th_ = std::tanh(u), e = std::erf(x / std::sqrt(2.0));
        Terms ft = gelu_ref(x, GeluKind::Tanh), fe = gelu_ref(x, GeluKind::Erf);
        Terms gt = gelu_grad_ref(x, GeluKind::Tanh), ge = gelu_grad_ref(x, GeluKind::Erf);
        double textbook[4] = {0.5 * x * (1 + th_), 0.5 * x * (1 + e),
                              0.5 * (1 + th_) + 0.5 * x * (1 - th_ * th_) * kSqrt2OverPi * (1 + 3 * kCubic * x * x),
                              0.5 * (1 + e) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI)};
        double stable[4] = {ft.t1, fe.t1, gt.t1 + gt.t2, ge.t1 + ge.t2};
        for (int k = 0; k < 4; k++) worst = std::fmax(worst, std::fabs(stable[k] - textbook[k]));
    }
    // Both are double evaluations of O(1) quantities; 1e-12 is ~5000 double ulps, far below any slip.
    th::report(worst <= 1e-12, "reference: stable forms equal the textbook formulas for |x| <= 4", "max diff %.3g", worst);
}

// Loss-scaled fp16 gradients: the backward must pass an overflow on, not clamp it, so the trainer's
// overflow check sees it. dout = 65504 (fp16's largest) at x = 1.5, where GELU' = 1.13, gives 74000:
// inf; an inf dout stays inf; a NaN stays NaN; an inf dout where GELU' is 0 (x = -20) gives NaN.
// Nine elements: one 128-bit pack and the scalar tail.
void test_nonfinite_fp16() {
    const float xs[4] = {1.5f, 1.f, 0.5f, -20.f}, gs[4] = {65504.f, INFINITY, NAN, INFINITY};
    std::vector<__half> x, dout;
    for (int i = 0; i < 9; i++) {
        x.push_back(from_float<__half>(xs[i % 4]));
        dout.push_back(from_float<__half>(gs[i % 4]));
    }
    for (GeluKind kind : {GeluKind::Tanh, GeluKind::Erf}) {
        th::DeviceBuffer<__half> d_x(x), d_g(dout);
        gelu_backward_inplace(d_g.ptr, (const __half*)d_x.ptr, x.size(), kind, 0);
        std::vector<__half> g = d_g.host();
        bool ok = true;
        for (int i = 0; i < 9; i++) {
            float v = to_float(g[i]);
            ok &= i % 4 < 2 ? v == INFINITY : std::isnan(v);
        }
        char name[128];
        snprintf(name, sizeof(name), "gelu_backward_inplace %s fp16: overflow, inf and NaN pass through (no clamping)",
                 kind == GeluKind::Tanh ? "tanh" : "erf");
        th::report(ok, name, "got %g %g %g %g ... %g (want inf inf nan nan ... inf)", to_float(g[0]), to_float(g[1]),
                   to_float(g[2]), to_float(g[3]), to_float(g[8]));
    }
}

int main() {
    test_reference_forms();
    test_nonfinite_fp16();
    for (GeluKind kind : {GeluKind::Tanh, GeluKind::Erf}) {
        // GPT-2-like (B=4, T=64, 4C=256) scaled down, then sizes off the pack (4 fp32 / 8 bf16, fp16) and
        // the block (256 threads), tiny ones, and misaligned views (the scalar path).
        for (size_t N : {(size_t)4 * 64 * 256, (size_t)1, (size_t)7, (size_t)130, (size_t)8195}) {
            test_gelu<float>(kind, N, 0, N);
            test_gelu<__nv_bfloat16>(kind, N, 0, N);
            test_gelu<__half>(kind, N, 0, N);
        }
        test_gelu<float>(kind, 1000, 1, 5);
        test_gelu<__nv_bfloat16>(kind, 1003, 3, 6);
        test_gelu<__half>(kind, 1003, 3, 6);
        test_gelu_inplace<float>(kind, 1001);
        test_gelu_inplace<__nv_bfloat16>(kind, 1001);
        test_gelu_inplace<__half>(kind, 1001);
    }
    return th::finish();
}
