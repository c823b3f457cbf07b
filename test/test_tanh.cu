// test/test_tanh.cu — the tanh kernels of llmc/tanh.cuh (forward and in-place backward) against a
// double-precision reference, for fp32, bf16 and fp16, under three thread orders, at sizes that are and
// are not multiples of the 128-bit pack, through misaligned views, and in the tails where 1 - tanh^2
// would cancel.
#include "../llmc/tanh.cuh"
#include "harness.h"

#include <cfloat>
#include <cmath>
#include <vector>

// Values in [lo, hi) rounded to T, with chosen ones first: zero, tiny, the tails where tanh is +-1 to
// fp32 precision and its derivative is far below 1 (where 1 - tanh^2 would lose every digit), both
// sides of tanh_fp32's switch to +-1 at 9.1, and beyond 44, where its expm1 would overflow.
template <class T>
std::vector<T> inputs(size_t n, uint64_t seed, float lo, float hi) {
    std::vector<T> t = th::random_tensor<T>(n, seed, lo, hi);
    const float chosen[] = {0.f, 1e-3f, -1e-3f, 9.f, -9.f, 20.f, -20.f, 0.55f, -3.f, 9.08f, -9.1f, 50.f};
    for (size_t i = 0; i < n && i < sizeof(chosen) / sizeof(chosen[0]); i++) t[i] = from_float<T>(chosen[i]);
    return t;
}

// The kernels' fp32 error in units of eps_fp32 of the result, from counting roundings. Forward:
// tanh_fp32 is within 2 (llmc/tanh.cuh derives it; the kernel avoids tanhf, which --use_fast_math
// makes tanh.approx.f32). Backward: e = exp(-2|x|) has the exponential's ~2 ulp plus, on a GPU under
// --use_fast_math, ~1.2 ulp per unit of argument (|arg| = 2|x|); then 1 + e, its square, 4e / d^2
// and the product with dout: 4 roundings. So 2 (forward) and 6 + 2.4|x| (backward), plus 2 of slack.
double forward_ulps() { return 4; }
double backward_ulps(double x) { return 8 + 2.4 * std::fabs(x); }

// Forward and backward at N elements for storage type T, through a view `offset` elements into its
// allocation (offset 1 defeats 128-bit access: the scalar path).
template <class T>
void test_tanh(size_t N, size_t offset, uint64_t seed) {
    const char* tname = th::dtype_name<T>();
    auto x = inputs<T>(N, seed, -5.f, 5.f);
    auto dout = th::random_tensor<T>(N, seed + 1, -1.f, 1.f);
    char name[160];
    snprintf(name, sizeof(name), "tanh_forward %s N=%zu offset=%zu: thread orders", tname, N, offset);
    auto out = th::run_orders(name, [&] {
        th::DeviceView<T> d_inp(x, offset), d_out(std::vector<T>(N), offset);
        tanh_forward(d_out.ptr, (const T*)d_inp.ptr, N, 0);
        return d_out.host();
    });
    snprintf(name, sizeof(name), "tanh_backward_inplace %s N=%zu offset=%zu: thread orders", tname, N, offset);
    auto dinp = th::run_orders(name, [&] {
        th::DeviceView<T> d_inp(x, offset), d_grad(dout, offset);
        tanh_backward_inplace(d_grad.ptr, (const T*)d_inp.ptr, N, 0);
        return d_grad.host();
    });
    // Budgets: the fp32 error above relative to the result, plus for bf16 and fp16 the one rounding to
    // T (k = 1: eps/2 of |ref|, the other half covers the fp32 value straddling a rounding boundary the
    // exact one does not). atol = FLT_MIN guards results that are zero; for fp16 also half its smallest
    // subnormal (the derivative at |x| = 9 or 20 times dout falls below fp16's normal range).
    double rounding = sizeof(T) == 4 ? 0 : dtype_eps<T>();
    double atol = FLT_MIN + (sizeof(T) == 4 ? 0 : dtype_denorm_min<T>() / 2);
    std::vector<double> ref(N), ref_grad(N), budget(N), budget_grad(N);
    for (size_t i = 0; i < N; i++) {
        double xi = th::to_double(x[i]), dyi = th::to_double(dout[i]);
        double sech = 1 / std::cosh(xi);
        ref[i] = std::tanh(xi);
        ref_grad[i] = dyi * sech * sech;
        budget[i] = atol + (th::EPS_FP32 * forward_ulps() + rounding) * std::fabs(ref[i]);
        budget_grad[i] = atol + (th::EPS_FP32 * backward_ulps(xi) + rounding) * std::fabs(ref_grad[i]);
    }
    snprintf(name, sizeof(name), "tanh_forward %s N=%zu offset=%zu vs double", tname, N, offset);
    th::check_budget(name, ref, out, budget);
    snprintf(name, sizeof(name), "tanh_backward_inplace %s N=%zu offset=%zu vs double", tname, N, offset);
    th::check_budget(name, ref_grad, dinp, budget_grad);
}

// In place (out == inp) gives the out-of-place bits.
template <class T>
void test_tanh_inplace(size_t N) {
    auto x = inputs<T>(N, 77, -5.f, 5.f);
    th::DeviceBuffer<T> d_a(x), d_b(N, th::Fill::Zero);
    tanh_forward(d_b.ptr, (const T*)d_a.ptr, N, 0);
    tanh_forward(d_a.ptr, (const T*)d_a.ptr, N, 0);
    auto a = d_a.host(), b = d_b.host();
    char name[128];
    snprintf(name, sizeof(name), "tanh_forward %s N=%zu in place == out of place", th::dtype_name<T>(), N);
    th::check_bitwise(name, a.data(), b.data(), N * sizeof(T));
}

// Non-finite inputs: tanh(NaN) and its derivative are NaN (a model holding a NaN must show it in its
// loss, not hide it behind +-1), tanh(+-inf) = +-1 with derivative 0.
template <class T>
void test_tanh_non_finite() {
    const float in[] = {NAN, -NAN, INFINITY, -INFINITY};
    const size_t N = 4;
    std::vector<T> x(N), dout(N, from_float<T>(1.f));
    for (size_t i = 0; i < N; i++) x[i] = from_float<T>(in[i]);
    th::DeviceBuffer<T> d_inp(x), d_out(N, th::Fill::Zero), d_grad(dout);
    tanh_forward(d_out.ptr, (const T*)d_inp.ptr, N, 0);
    tanh_backward_inplace(d_grad.ptr, (const T*)d_inp.ptr, N, 0);
    auto out = d_out.host(), grad = d_grad.host();
    float y[N], g[N];
    for (size_t i = 0; i < N; i++) y[i] = th::to_double(out[i]), g[i] = th::to_double(grad[i]);
    bool ok = std::isnan(y[0]) && std::isnan(y[1]) && y[2] == 1.f && y[3] == -1.f && std::isnan(g[0]) &&
              std::isnan(g[1]) && g[2] == 0.f && g[3] == 0.f;
    char name[64];
    snprintf(name, sizeof(name), "tanh %s non-finite inputs", th::dtype_name<T>());
    th::report(ok, name, "tanh(nan, -nan, inf, -inf) = %g %g %g %g (want nan nan 1 -1), derivative %g %g %g %g "
               "(want nan nan 0 0)", y[0], y[1], y[2], y[3], g[0], g[1], g[2], g[3]);
}

int main() {
    // BERT's pooler (B=4 rows of C=768, and the test model's 4 x 64), then sizes off the pack (4 fp32,
    // 8 bf16/fp16) and the block, tiny ones, and misaligned views (the scalar path).
    for (size_t N : {(size_t)4 * 768, (size_t)4 * 64, (size_t)1, (size_t)7, (size_t)8195}) {
        test_tanh<float>(N, 0, N);
        test_tanh<__nv_bfloat16>(N, 0, N);
        test_tanh<__half>(N, 0, N);
    }
    test_tanh<float>(1000, 1, 5);
    test_tanh<__nv_bfloat16>(1003, 3, 6);
    test_tanh<__half>(1003, 3, 6);
    test_tanh_inplace<float>(1001);
    test_tanh_inplace<__nv_bfloat16>(1001);
    test_tanh_inplace<__half>(1001);
    test_tanh_non_finite<float>();
    test_tanh_non_finite<__nv_bfloat16>();
    test_tanh_non_finite<__half>();
    return th::finish();
}
