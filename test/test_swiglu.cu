// test/test_swiglu.cu — the SwiGLU kernels of llmc/swiglu.cuh (forward and backward) against a
// double-precision reference, for fp32 and bf16, under three thread orders, with gate values from
// the saturated tails (|g| up to 12, and +-100 where exp overflows) to zero.
#include "../llmc/swiglu.cuh"
#include "harness.h"

#include <cfloat>
#include <cmath>
#include <vector>

// ----------------------------------------------------------------------------
// Reference (double)

double sigmoid(double g) { return 1 / (1 + std::exp(-g)); }

// ----------------------------------------------------------------------------
// Tests

// Forward and backward on R rows of H for storage type T.
template <class T>
void test_swiglu(size_t R, int H, uint64_t seed) {
    const char* tname = th::dtype_name<T>();
    std::vector<T> inp = th::random_tensor<T>(R * 2 * H, seed, -12.f, 12.f);
    std::vector<T> dout = th::random_tensor<T>(R * H, seed + 1, -1.f, 1.f);
    // A few gate values where exp(-g) overflows or is exactly 1: the saturated limits and g = 0.
    const float specials[] = {0.f, -100.f, 100.f, -0.f};
    for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]) && i < (size_t)H; i++) inp[i] = from_float<T>(specials[i]);
    char name[160];

    snprintf(name, sizeof(name), "swiglu_forward %s R=%zu H=%d: thread orders", tname, R, H);
    auto out = th::run_orders(name, [&] {
        th::DeviceBuffer<T> d_inp(inp), d_out(R * H, th::Fill::NaN);
        swiglu_forward(d_out.ptr, (const T*)d_inp.ptr, R, H, 0);
        return d_out.host();
    });
    snprintf(name, sizeof(name), "swiglu_backward %s R=%zu H=%d: thread orders", tname, R, H);
    auto dinp = th::run_orders(name, [&] {
        th::DeviceBuffer<T> d_inp(inp), d_dout(dout), d_dinp(R * 2 * H, th::Fill::NaN);
        swiglu_backward(d_dinp.ptr, (const T*)d_dout.ptr, (const T*)d_inp.ptr, R, H, 0);
        return d_dinp.host();
    });

    // Budgets, in fp32 roundings (eps) of the terms' magnitudes: sigmoid(g) = 1/(1+exp(-g)) carries
    // the exponential's error (a few ulps, plus ~1.2 ulp per unit of |g| for the GPU's fast-math
    // __expf) and two roundings: (4 + 2|g|) eps relative. The forward's two products add 2: (6 +
    // 2|g|). d up = dout g s adds 2 more: (8 + 2|g|). d gate = dout u s (1 + g (1 - s)): 1 - s has
    // s's absolute error, so the bound is taken on dout u s (1 + |g|), with (12 + 4|g|) for the
    // extra products and the g (1 - s) term's error scaled by |g|. bf16 adds one rounding of the
    // result (k = 1 of eps_bf16: eps/2 for the rounding, eps/2 for the fp32 value straddling a
    // boundary). atol FLT_MIN guards the exact zeros only.
    double rounding = sizeof(T) == 4 ? 0 : dtype_eps<T>(), e = th::EPS_FP32;
    std::vector<double> ref(R * H), budget(R * H), ref_d(R * 2 * H), budget_d(R * 2 * H);
    for (size_t r = 0; r < R; r++)
        for (int h = 0; h < H; h++) {
            size_t i = r * H + h, gi = r * 2 * H + h, ui = gi + H;
            double g = th::to_double(inp[gi]), u = th::to_double(inp[ui]), d = th::to_double(dout[i]);
            double s = sigmoid(g), ag = std::fabs(g);
            ref[i] = g * s * u;
            budget[i] = FLT_MIN + (e * (6 + 2 * ag) + rounding) * std::fabs(ref[i]);
            ref_d[gi] = d * u * s * (1 + g * (1 - s));
            budget_d[gi] = FLT_MIN + e * (12 + 4 * ag) * std::fabs(d * u) * s * (1 + ag) + rounding * std::fabs(ref_d[gi]);
            ref_d[ui] = d * g * s;
            budget_d[ui] = FLT_MIN + (e * (8 + 2 * ag) + rounding) * std::fabs(ref_d[ui]);
        }
    snprintf(name, sizeof(name), "swiglu_forward %s R=%zu H=%d vs double", tname, R, H);
    th::check_budget(name, ref, out, budget);
    snprintf(name, sizeof(name), "swiglu_backward %s R=%zu H=%d vs double", tname, R, H);
    th::check_budget(name, ref_d, dinp, budget_d);
}

int main() {
    for (auto [R, H] : {std::pair<size_t, int>{1, 4}, {37, 64}, {5, 300}}) {
        test_swiglu<float>(R, H, 11 + R);
        test_swiglu<__nv_bfloat16>(R, H, 23 + R);
    }
    return th::finish();
}
