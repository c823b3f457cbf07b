// test/test_adamw.cu — tests llmc/adamw.cuh: several AdamW steps over a table of tensors of very
// different sizes (weight decay on some only), float parameters and bf16 or fp16 parameters with fp32
// master weights, the device-side gradient scale, that an inf or NaN gradient is not hidden, and the
// float <-> bf16 and float <-> fp16 casts.
//
// Two references for AdamW:
//  - torch order (fp32): the operations of torch.optim.AdamW's single-tensor CPU path, in its order,
//    each rounded to fp32 (scalars computed in double as Python does). The kernel performs exactly
//    these IEEE-rounded operations in this order, so the budget is 0: any difference is a bug. One
//    case has subnormal gradients, moments and weights, which a GPU build flushes to zero
//    (llmc/adamw.cuh): there the reference computes as the device does, which a probe kernel tells.
//  - textbook (double): AdamW's formulas in double precision, to check the fp32 result is accurate
//    (budgets below, derived from the number of fp32 roundings per step).
// Every result must also be bit-identical under forward, reverse and random thread orders.
#include "../llmc/adamw.cuh"
#include "harness.h"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

// ----------------------------------------------------------------------------
// Helpers

// Rounds x to bf16 (nearest even) by bit manipulation: independent of cuda_bf16.h, for the cast test.
static uint16_t bf16_bits_rne(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if (std::isnan(x)) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float bf16_bits_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static float round_bf16(float x) { return bf16_bits_to_float(bf16_bits_rne(x)); }

// Rounds x to fp16 (nearest even; overflow to inf, subnormals, NaN) from its value, independent of
// cuda_fp16.h: subnormals are multiples of 2^-24 (scaling by 2^24 is exact, nearbyint rounds to even),
// normal numbers drop 13 of fp32's 23 mantissa bits, and from 65520 (half way between fp16's largest,
// 65504, and 2^16) on the result is inf.
static uint16_t fp16_bits_rne(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (std::isnan(x)) return sign | 0x7e00;
    float a = std::fabs(x);
    if (a >= 65520.f) return sign | 0x7c00;
    if (a < 0x1p-14f) return sign | (uint16_t)std::nearbyint(a * 0x1p24f);  // 1024 encodes 2^-14 itself
    uint32_t au = u & 0x7fffffffu;
    au += 0x0fffu + ((au >> 13) & 1u);  // add half an fp16 ulp, plus one when odd: ties to even
    uint32_t exponent = (au >> 23) - 127 + 15, mantissa = (au >> 13) & 0x3ffu;
    return (uint16_t)(sign | (exponent << 10) | mantissa);
}
static float fp16_bits_to_float(uint16_t b) {
    int exponent = (b >> 10) & 0x1f, mantissa = b & 0x3ff;
    float sign = (b & 0x8000) ? -1.f : 1.f;
    if (exponent == 0) return sign * std::ldexp((float)mantissa, -24);
    if (exponent == 31) return mantissa ? NAN : sign * INFINITY;
    return sign * std::ldexp((float)(mantissa | 0x400), exponent - 25);
}
static float round_fp16(float x) { return fp16_bits_to_float(fp16_bits_rne(x)); }

// x rounded to the storage type T by the bit-level references above.
template <class T>
static float round_to_T(float x) {
    if (std::is_same<T, __nv_bfloat16>::value) return round_bf16(x);
    if (std::is_same<T, __half>::value) return round_fp16(x);
    return x;
}

// ----------------------------------------------------------------------------
// References

struct Hyper {
    float lr, beta1, beta2, eps, weight_decay;
};

// One AdamW step in torch's order of fp32 operations (see llmc/adamw.cuh for the torch code). flush: as
// a flush-to-zero device computes it, every subnormal input and result read as (signed) zero.
static void ref_step_torch_order(std::vector<float>& p, std::vector<float>& m, std::vector<float>& v,
                                 const std::vector<float>& grad, const std::vector<ParamTensor>& tensors,
                                 const Hyper& h, float grad_scale, int step, bool flush = false) {
    auto z = [flush](float x) { return flush && std::fabs(x) < FLT_MIN ? std::copysign(0.f, x) : x; };
    double bc1 = 1.0 - std::pow((double)h.beta1, (double)step);
    double bc2 = 1.0 - std::pow((double)h.beta2, (double)step);
    float decay = (float)(1.0 - (double)h.lr * (double)h.weight_decay);
    float w1 = (float)(1.0 - (double)h.beta1);
    float w2 = (float)(1.0 - (double)h.beta2);
    float bc2_sqrt = (float)std::sqrt(bc2);
    float neg_step = (float)(-((double)h.lr / bc1));
    for (const ParamTensor& t : tensors) {
        for (size_t i = t.offset; i < t.offset + t.size; i++) {
            float g = z(z(grad[i]) * grad_scale);
            p[i] = z(p[i]), m[i] = z(m[i]), v[i] = z(v[i]);
            if (t.weight_decay) p[i] = z(p[i] * decay);
            m[i] = z(std::fma(w1, z(g - m[i]), m[i]));
            v[i] = z(v[i] * h.beta2);
            v[i] = z(v[i] + z(z(w2 * g) * g));
            float denom = z(std::sqrt(v[i]) / bc2_sqrt);
            denom = z(denom + h.eps);
            p[i] = z(p[i] + z(z(neg_step * m[i]) / denom));
        }
    }
}

// One AdamW step from the textbook formulas, in double.
static void ref_step_double(std::vector<double>& p, std::vector<double>& m, std::vector<double>& v,
                            const std::vector<float>& grad, const std::vector<ParamTensor>& tensors,
                            const Hyper& h, double grad_scale, int step) {
    double b1 = h.beta1, b2 = h.beta2, lr = h.lr;
    for (const ParamTensor& t : tensors) {
        for (size_t i = t.offset; i < t.offset + t.size; i++) {
            double g = grad[i] * grad_scale;
            if (t.weight_decay) p[i] -= lr * h.weight_decay * p[i];
            m[i] = b1 * m[i] + (1 - b1) * g;
            v[i] = b2 * v[i] + (1 - b2) * g * g;
            double mhat = m[i] / (1 - std::pow(b1, step)), vhat = v[i] / (1 - std::pow(b2, step));
            p[i] -= lr * mhat / (std::sqrt(vhat) + h.eps);
        }
    }
}

// ----------------------------------------------------------------------------
// AdamW tests

// One test configuration: the tensor table, hyper-parameters, the steps to run and each step's
// gradient scale; steps from device_scale_from on also pass a device-side scale.
struct Case {
    const char* name;
    std::vector<size_t> sizes;
    std::vector<int> decay_flags;
    Hyper h;
    int first_step, num_steps;
    std::vector<float> grad_scales;
    int device_scale_from;  // step index (0-based within the run) from which grad_scale_device is used
    float device_scale;
    bool fresh_state;  // m = v = 0 (a run from the start) or random moments (a resumed run)
};

template <class T>
static void test_adamw(const Case& c) {
    const bool lowp = !std::is_same<T, float>::value;
    std::vector<ParamTensor> tensors;
    size_t N = 0;
    for (size_t k = 0; k < c.sizes.size(); k++) {
        tensors.push_back(ParamTensor{N, c.sizes[k], c.decay_flags[k]});
        N += c.sizes[k];
    }
    const int num_tensors = (int)tensors.size();

    // Initial state: weights, moments, and one gradient per step (rounded to T where T stores them).
    std::vector<float> p0(N), m0(N, 0.f), v0(N, 0.f);
    th::fill_uniform(p0.data(), N, 1, -1.f, 1.f);
    if (!c.fresh_state) {
        th::fill_uniform(m0.data(), N, 2, -0.1f, 0.1f);
        th::fill_uniform(v0.data(), N, 3, 0.f, 0.01f);
    }
    std::vector<std::vector<float>> grads(c.num_steps, std::vector<float>(N));
    for (int s = 0; s < c.num_steps; s++) {
        th::fill_uniform(grads[s].data(), N, 100 + s, -1.f, 1.f);
        for (float& g : grads[s]) g = round_to_T<T>(g);
    }
    std::vector<T> p0_T(N);
    for (size_t i = 0; i < N; i++) p0_T[i] = from_float<T>(p0[i]);

    // References.
    std::vector<float> rp = p0, rm = m0, rv = v0;
    std::vector<double> dp(p0.begin(), p0.end()), dm(m0.begin(), m0.end()), dv(v0.begin(), v0.end());
    for (int s = 0; s < c.num_steps; s++) {
        float scale = c.grad_scales[s];
        if (s >= c.device_scale_from) scale = scale * c.device_scale;
        ref_step_torch_order(rp, rm, rv, grads[s], tensors, c.h, scale, c.first_step + s);
        ref_step_double(dp, dm, dv, grads[s], tensors, c.h, scale, c.first_step + s);
    }

    // The kernel, under three thread orders; returns [params as float, master, m, v].
    char name[160];
    const char* tname = th::dtype_name<T>();
    snprintf(name, sizeof(name), "adamw %s %s: thread orders", c.name, tname);
    std::vector<float> out = th::run_orders(name, [&]() {
        th::DeviceBuffer<T> d_params(N), d_grads(N);
        th::DeviceBuffer<float> d_m(N), d_v(N), d_scale(1);
        th::DeviceBuffer<ParamTensor> d_tensors(num_tensors);
        th::DeviceBuffer<float>* d_master = lowp ? new th::DeviceBuffer<float>(N) : nullptr;
        d_params.upload(p0_T);
        d_m.upload(m0);
        d_v.upload(v0);
        d_scale.upload({c.device_scale});
        d_tensors.upload(tensors);
        if (d_master) d_master->upload(p0);
        for (int s = 0; s < c.num_steps; s++) {
            std::vector<T> g(N);
            for (size_t i = 0; i < N; i++) g[i] = from_float<T>(grads[s][i]);
            d_grads.upload(g);
            adamw_update<T>(d_params.ptr, d_master ? d_master->ptr : nullptr, d_grads.ptr, d_m.ptr, d_v.ptr,
                            d_tensors.ptr, num_tensors, N, c.h.lr, c.h.beta1, c.h.beta2, c.h.eps,
                            c.h.weight_decay, c.grad_scales[s], c.first_step + s, 0,
                            s >= c.device_scale_from ? d_scale.ptr : nullptr);
        }
        cudaCheck(cudaDeviceSynchronize());
        std::vector<float> result;
        for (T x : d_params.host()) result.push_back(to_float(x));
        std::vector<float> master = d_master ? d_master->host() : std::vector<float>(N, 0.f);
        std::vector<float> m = d_m.host(), v = d_v.host();
        result.insert(result.end(), master.begin(), master.end());
        result.insert(result.end(), m.begin(), m.end());
        result.insert(result.end(), v.begin(), v.end());
        delete d_master;
        return result;
    });
    const float* o_params = out.data();
    const float* o_master = out.data() + N;
    const float* o_m = out.data() + 2 * N;
    const float* o_v = out.data() + 3 * N;

    // Torch order: budget 0 (same IEEE operations in the same order). With master weights the fp32
    // weights are checked, and params must be exactly those rounded to T.
    const th::Tol exact{0, 0};
    const float* o_weights = lowp ? o_master : o_params;
    std::vector<float> rp_T(N);
    for (size_t i = 0; i < N; i++) rp_T[i] = round_to_T<T>(rp[i]);
    snprintf(name, sizeof(name), "adamw %s %s: weights == torch-order fp32", c.name, tname);
    th::check_close(name, rp.data(), o_weights, N, exact);
    if (lowp) {
        snprintf(name, sizeof(name), "adamw %s %s: params == master rounded to %s", c.name, tname, tname);
        th::check_close(name, rp_T.data(), o_params, N, exact);
    }
    snprintf(name, sizeof(name), "adamw %s %s: m == torch-order fp32", c.name, tname);
    th::check_close(name, rm.data(), o_m, N, exact);
    snprintf(name, sizeof(name), "adamw %s %s: v == torch-order fp32", c.name, tname);
    th::check_close(name, rv.data(), o_v, N, exact);

    // Textbook double. Per step, the fp32 weights take 2 roundings proportional to |p| (decay,
    // update add) and the update term (<= ~lr in size) about 8 (its own 4 operations plus the
    // rounding errors of m and v it divides); m and v take 4 roundings each per step (their
    // errors decay by beta, so summing them over steps is an upper bound). |g| <= 1 bounds m's
    // absolute error; v is a sum of positive terms, so its error is relative.
    const double e = th::EPS_FP32;
    const double steps = c.num_steps;
    snprintf(name, sizeof(name), "adamw %s %s: weights vs double", c.name, tname);
    th::check_close(name, dp.data(), o_weights, N, th::tol(e, 2 * steps, 8 * steps * c.h.lr * e));
    snprintf(name, sizeof(name), "adamw %s %s: m vs double", c.name, tname);
    th::check_close(name, dm.data(), o_m, N, th::tol(e, 4 * steps, 4 * steps * e));
    snprintf(name, sizeof(name), "adamw %s %s: v vs double", c.name, tname);
    th::check_close(name, dv.data(), o_v, N, th::tol(e, 4 * steps, 0));
    if (lowp) {
        // bf16/fp16 params: one rounding to nearest of the fp32 weights: at most half an ulp, i.e.
        // eps_T/2 * |ref| (a tight bound, reached just above a power of two), or half the smallest
        // subnormal for a weight below the normal range (fp16: 2^-14), plus the fp32 weights' own
        // error from above as the floor.
        snprintf(name, sizeof(name), "adamw %s %s: params vs double", c.name, tname);
        double atol = 8 * steps * c.h.lr * e + 2 * steps * e + dtype_denorm_min<T>() / 2;
        th::check_close(name, dp.data(), o_params, N, th::tol(dtype_eps<T>(), 0.5, atol));
    }
}

// Whether the device flushes subnormal fp32 operands to zero: a GPU build does (--use_fast_math implies
// -ftz=true), the CPU backend does not. x[0] = 2^-140 times x[1] = 1.
__global__ void flush_probe_kernel(float* x) { x[0] = __fmul_rn(x[0], x[1]); }
static bool device_flushes_subnormals() {
    th::DeviceBuffer<float> x(std::vector<float>{0x1p-140f, 1.f});
    cudaCheck(launch_kernel(flush_probe_kernel, dim3(1), dim3(1), 0, 0, x.ptr));
    return x.host()[0] == 0.f;
}

// Subnormals (below 2^-126): a gradient whose m (and update) is subnormal, one whose g^2 term of v is,
// a subnormal weight under weight decay with a zero gradient, each at weight 0 or so small that the
// subnormal part shows in the weight; and a normal element. Two steps, fp32, bit for bit against the
// torch-order reference computed the way this device computes: IEEE on the CPU backend, flushing to
// zero on a GPU. And the case must tell the two ways apart.
static void test_subnormal() {
    const std::vector<float> p0 = {0.f, 0.f, 1e-39f, -3e-39f, 0.5f}, g0 = {1e-39f, 1e-19f, 0.f, 0.f, 0.25f};
    const size_t N = p0.size();
    const std::vector<ParamTensor> tensors = {{0, N, 1}};
    const Hyper h{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
    const bool flush = device_flushes_subnormals();
    std::vector<float> rp[2] = {p0, p0}, rm[2] = {std::vector<float>(N), std::vector<float>(N)},
                       rv[2] = {std::vector<float>(N), std::vector<float>(N)};
    for (int step = 1; step <= 2; step++)
        for (int f = 0; f < 2; f++) ref_step_torch_order(rp[f], rm[f], rv[f], g0, tensors, h, 1.f, step, f);
    th::DeviceBuffer<float> d_p(p0), d_g(g0), d_m(N, th::Fill::Zero), d_v(N, th::Fill::Zero);
    th::DeviceBuffer<ParamTensor> d_tensors(tensors);
    for (int step = 1; step <= 2; step++)
        adamw_update<float>(d_p.ptr, nullptr, d_g.ptr, d_m.ptr, d_v.ptr, d_tensors.ptr, 1, N, h.lr, h.beta1, h.beta2,
                            h.eps, h.weight_decay, 1.f, step, 0);
    std::vector<float> got = d_p.host(), m = d_m.host(), v = d_v.host();
    got.insert(got.end(), m.begin(), m.end());
    got.insert(got.end(), v.begin(), v.end());
    std::vector<float> want[2];
    size_t differ = 0;
    for (int f = 0; f < 2; f++) {
        want[f] = rp[f];
        want[f].insert(want[f].end(), rm[f].begin(), rm[f].end());
        want[f].insert(want[f].end(), rv[f].begin(), rv[f].end());
    }
    for (size_t i = 0; i < 3 * N; i++) differ += memcmp(&want[0][i], &want[1][i], sizeof(float)) != 0;
    char name[160];
    snprintf(name, sizeof(name), "adamw fp32 subnormals: weights, m, v == torch-order fp32 %s",
             flush ? "flushing to zero, as this device does" : "in IEEE arithmetic");
    th::check_bitwise(name, want[flush].data(), got.data(), 3 * N * sizeof(float));
    th::report(differ > 0, "adamw fp32 subnormals: IEEE and flush-to-zero references differ",
               "in %zu of %zu values", differ, 3 * N);
}

// ----------------------------------------------------------------------------
// Cast tests

// float -> bf16 against the bit-manipulation reference: random values plus ties, overflow,
// subnormals, infinities and NaN; bf16 -> float over all 65536 bit patterns (exact).
static void test_cast() {
    std::vector<float> x(123457);
    th::fill_uniform(x.data(), x.size(), 7, -3.f, 3.f);
    const float specials[] = {0.f, -0.f, 1.f, 1.f + 1.f / 256, 1.f + 3.f / 256, -(1.f + 1.f / 256),
                              3.4028235e38f, -3.4028235e38f, 1e-40f, -1e-42f, 1.17549435e-38f,
                              INFINITY, -INFINITY, NAN, 65504.f, 0.1f, 1.0e30f};
    for (size_t k = 0; k < sizeof(specials) / sizeof(specials[0]); k++) x[k * 997] = specials[k];
    const size_t N = x.size();

    std::vector<uint16_t> bits = th::run_orders("cast float->bf16: thread orders", [&]() {
        th::DeviceBuffer<float> d_in(N);
        th::DeviceBuffer<__nv_bfloat16> d_out(N);
        d_in.upload(x);
        cast(d_out.ptr, d_in.ptr, N, 0);
        std::vector<uint16_t> b;
        for (__nv_bfloat16 y : d_out.host()) b.push_back(__nv_bfloat16_raw(y).x);
        return b;
    });
    size_t bad = 0, first_bad = N;
    for (size_t i = 0; i < N; i++) {
        bool ok = std::isnan(x[i]) ? std::isnan(bf16_bits_to_float(bits[i])) : bits[i] == bf16_bits_rne(x[i]);
        if (!ok && bad++ == 0) first_bad = i;
    }
    th::report(bad == 0, "cast float->bf16: round to nearest even (incl. ties, overflow, subnormals, inf, NaN)",
               "n=%zu, bad=%zu%s", N, bad, bad ? " (see first_bad)" : "");
    if (bad) printf("  first bad at %zu: x=%.9g got 0x%04x want 0x%04x\n", first_bad, x[first_bad],
                    bits[first_bad], bf16_bits_rne(x[first_bad]));

    std::vector<uint16_t> all(65536);
    for (size_t i = 0; i < all.size(); i++) all[i] = (uint16_t)i;
    std::vector<float> want(all.size());
    for (size_t i = 0; i < all.size(); i++) want[i] = bf16_bits_to_float(all[i]);
    std::vector<float> got = th::run_orders("cast bf16->float: thread orders", [&]() {
        th::DeviceBuffer<__nv_bfloat16> d_in(all.size());
        th::DeviceBuffer<float> d_out(all.size());
        std::vector<__nv_bfloat16> h;
        for (uint16_t b : all) h.push_back(__nv_bfloat16(__nv_bfloat16_raw{b}));
        d_in.upload(h);
        cast(d_out.ptr, d_in.ptr, all.size(), 0);
        return d_out.host();
    });
    th::check_bitwise("cast bf16->float: exact for all 65536 bit patterns", want.data(), got.data(), want.size() * 4);

    th::DeviceBuffer<float> d_a(1), d_b(1);
    d_a.upload({0.3f});
    cast(d_b.ptr, d_a.ptr, 1, 0);
    std::vector<float> one = d_b.host();
    th::report(one[0] == 0.3f, "cast float->float N=1: copy", "got %.9g", one[0]);
}

// float -> fp16 against the bit-level reference: values spread over fp16's whole range and past it
// (|x| = 2^u, u uniform in [-30, 18): zeros, subnormals, normals, overflow) plus ties (in the normal
// and the subnormal range), the overflow threshold 65520, infinities and NaN; fp16 -> float over all
// 65536 bit patterns (exact; NaN patterns must stay NaN).
static void test_cast_fp16() {
    std::vector<float> x(123457), u(x.size()), sign(x.size());
    th::fill_uniform(u.data(), u.size(), 8, -30.f, 18.f);
    th::fill_uniform(sign.data(), sign.size(), 9, -1.f, 1.f);
    for (size_t i = 0; i < x.size(); i++) x[i] = std::copysign(std::exp2(u[i]), sign[i]);
    const float specials[] = {0.f, -0.f, 1.f, 1.f + 0x1p-11f, 1.f + 3 * 0x1p-11f, -(1.f + 0x1p-11f), 65504.f,
                              65519.996f, 65520.f, -65520.f, 1e5f, 0x1p-14f, 0x1p-25f, 3 * 0x1p-25f, -0x1p-26f,
                              0x1.ffcp-15f, 6e-8f, INFINITY, -INFINITY, NAN, 0.1f, 3.4028235e38f};
    for (size_t k = 0; k < sizeof(specials) / sizeof(specials[0]); k++) x[k * 997] = specials[k];
    const size_t N = x.size();

    std::vector<uint16_t> bits = th::run_orders("cast float->fp16: thread orders", [&]() {
        th::DeviceBuffer<float> d_in(N);
        th::DeviceBuffer<__half> d_out(N);
        d_in.upload(x);
        cast(d_out.ptr, d_in.ptr, N, 0);
        std::vector<uint16_t> b;
        for (__half y : d_out.host()) b.push_back(__half_raw(y).x);
        return b;
    });
    size_t bad = 0, first_bad = N;
    for (size_t i = 0; i < N; i++) {
        bool ok = std::isnan(x[i]) ? std::isnan(fp16_bits_to_float(bits[i])) : bits[i] == fp16_bits_rne(x[i]);
        if (!ok && bad++ == 0) first_bad = i;
    }
    th::report(bad == 0, "cast float->fp16: round to nearest even (incl. ties, overflow, subnormals, inf, NaN)",
               "n=%zu, bad=%zu%s", N, bad, bad ? " (see first_bad)" : "");
    if (bad) printf("  first bad at %zu: x=%.9g got 0x%04x want 0x%04x\n", first_bad, x[first_bad],
                    bits[first_bad], fp16_bits_rne(x[first_bad]));

    std::vector<__half> all(65536);
    for (size_t i = 0; i < all.size(); i++) all[i] = __half(__half_raw{(unsigned short)i});
    std::vector<float> got = th::run_orders("cast fp16->float: thread orders", [&]() {
        th::DeviceBuffer<__half> d_in(all);
        th::DeviceBuffer<float> d_out(all.size());
        cast(d_out.ptr, d_in.ptr, all.size(), 0);
        return d_out.host();
    });
    bad = 0;
    for (size_t i = 0; i < all.size(); i++) {
        float want = fp16_bits_to_float((uint16_t)i);
        bad += std::isnan(want) ? !std::isnan(got[i]) : memcmp(&want, &got[i], 4) != 0;
    }
    th::report(bad == 0, "cast fp16->float: exact for all 65536 bit patterns (NaN stays NaN)", "bad=%zu", bad);
}

// An overflowed (inf) or NaN gradient of fp16 training is not hidden by the update: its weight,
// master weight and moments turn NaN or inf (g = inf makes m/sqrt(v) = inf/inf), so a trainer that
// fails to skip such a step sees it at once. The other elements update normally.
static void test_nonfinite_grad_fp16() {
    const size_t N = 3;
    std::vector<ParamTensor> tensors = {{0, N, 1}};
    std::vector<float> p = {0.5f, 0.5f, 0.5f}, zeros(N, 0.f);
    std::vector<__half> params(N, from_float<__half>(0.5f));
    std::vector<__half> grads = {from_float<__half>(0.25f), from_float<__half>(INFINITY), from_float<__half>(NAN)};
    th::DeviceBuffer<__half> d_params(params), d_grads(grads);
    th::DeviceBuffer<float> d_master(p), d_m(zeros), d_v(zeros);
    th::DeviceBuffer<ParamTensor> d_tensors(tensors);
    adamw_update<__half>(d_params.ptr, d_master.ptr, d_grads.ptr, d_m.ptr, d_v.ptr, d_tensors.ptr, 1, N, 1e-2f, 0.9f,
                         0.95f, 1e-8f, 0.1f, 1.f / 1024, 1, 0);
    std::vector<__half> out = d_params.host();
    std::vector<float> master = d_master.host(), m = d_m.host(), v = d_v.host();
    bool finite_ok = std::isfinite(to_float(out[0])) && std::isfinite(master[0]) && master[0] != 0.5f;
    bool bad_ok = true;
    for (size_t i = 1; i < N; i++)
        bad_ok &= std::isnan(to_float(out[i])) && std::isnan(master[i]) && !std::isfinite(m[i]) && !std::isfinite(v[i]);
    th::report(finite_ok && bad_ok, "adamw fp16: inf and NaN gradients give NaN weights (not hidden)",
               "params %g %g %g, m %g %g %g", to_float(out[0]), to_float(out[1]), to_float(out[2]), m[0], m[1], m[2]);
}

int main() {
    // GPT-2-like table scaled down: matrices (weight decay) and vectors (none) of very different
    // sizes, none a multiple of 8, one empty, one of a single element.
    const std::vector<size_t> sizes = {1000, 1, 123457, 37, 0, 4099, 769};
    const std::vector<int> flags = {1, 0, 1, 0, 1, 0, 1};
    const Hyper gpt2{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
    // From the first step: zero moments, gradient scales as clipping produces them (non powers of
    // two), and a device-side clip factor on the last two steps.
    Case fresh{"table-from-step-1", sizes, flags, gpt2, 1, 5, {1.f, 0.37f, 1.f, 0.5f, 1.f}, 3, 0.8f, true};
    // Resumed mid-run at step 1001 (bias corrections near 1) with non-zero moments.
    Case resumed{"table-resumed-step-1001", sizes, flags, Hyper{6e-4f, 0.9f, 0.999f, 1e-6f, 0.01f}, 1001, 3,
                 {1.f, 0.25f, 0.9f}, 99, 1.f, false};
    Case single{"N=1", {1}, {1}, gpt2, 1, 3, {1.f, 1.f, 0.3f}, 99, 1.f, true};
    Case small{"N=1000", {333, 667}, {1, 0}, gpt2, 1, 4, {1.f, 1.f, 1.f, 1.f}, 2, 0.6f, true};
    for (const Case* c : {&fresh, &resumed, &single, &small}) {
        test_adamw<float>(*c);
        test_adamw<__nv_bfloat16>(*c);
        test_adamw<__half>(*c);
    }
    test_subnormal();
    test_cast();
    test_cast_fp16();
    test_nonfinite_grad_fp16();
    return th::finish();
}
