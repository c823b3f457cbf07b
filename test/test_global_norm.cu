// test/test_global_norm.cu — tests llmc/global_norm.cuh: the sum of squares against a double
// reference (float, bf16 and fp16 values, sizes that are not multiples of the pack, the block or the
// grid), exact results on integer data (a lost or doubled element changes the answer), bit-identical
// results under thread orders, the clip factor against torch's fp32 formula, and for fp16 gradients
// (loss scaling) that the largest finite values give a finite norm and an inf or NaN gives inf or NaN.
#include "../llmc/global_norm.cuh"
#include "harness.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

// ----------------------------------------------------------------------------
// Helpers

// Runs global_norm_squared on host values x (converted to T) with exactly sized scratch, returns *out.
template <class T>
static float device_norm_squared(const std::vector<float>& x) {
    const size_t N = x.size();
    std::vector<T> xt(N);
    for (size_t i = 0; i < N; i++) xt[i] = from_float<T>(x[i]);
    th::DeviceBuffer<T> d_x(N > 0 ? N : 1);
    th::DeviceBuffer<float> d_out(1);
    th::DeviceBuffer<unsigned char> d_scratch(global_norm_scratch_bytes(N));
    if (N > 0) d_x.upload(xt);
    global_norm_squared(d_out.ptr, d_scratch.ptr, d_x.ptr, N, 0);
    cudaCheck(cudaDeviceSynchronize());
    return d_out.host()[0];
}

// Rounding budget of the kernel's fp32 sum for N values of T: every term is >= 0, so the relative
// error is at most (number of roundings on the longest path from a term to the result) * u. The
// path: a thread's fma chain over its grid-stride share (plus one tail element), the block's shuffle
// tree (5 levels within a warp, 5 over the warps), the final thread's chain over the partials and
// the final block's 10 tree levels. Counted with eps = 2^-23 = 2u, so the budget is twice the bound.
template <class T>
static double rounding_path(size_t N) {
    const size_t P = Packed128<T>::size;
    const size_t blocks = global_norm_num_blocks(N);
    const size_t threads = blocks * GLOBAL_NORM_BLOCK_SIZE;
    const size_t per_thread = CEIL_DIV(N / P, threads) * P + 1;
    const size_t final_chain = CEIL_DIV(blocks, (size_t)GLOBAL_NORM_FINAL_BLOCK_SIZE);
    return (double)(per_thread + 10 + final_chain + 10);
}

// ----------------------------------------------------------------------------
// Tests

// Uniform random values in [-1, 1) (rounded to T) against a double sum of their squares.
template <class T>
static void test_random(size_t N, uint64_t seed, bool orders) {
    const char* tname = th::dtype_name<T>();
    std::vector<float> x(N);
    th::fill_uniform(x.data(), N, seed, -1.f, 1.f);
    for (float& v : x) v = to_float(from_float<T>(v));
    double ref = 0;
    for (float v : x) ref += (double)v * v;

    char name[128];
    float got;
    if (orders) {
        snprintf(name, sizeof(name), "norm %s N=%zu: thread orders", tname, N);
        got = th::run_orders(name, [&]() { return std::vector<float>{device_norm_squared<T>(x)}; })[0];
    } else {
        got = device_norm_squared<T>(x);
    }
    snprintf(name, sizeof(name), "norm %s N=%zu: vs double (%d blocks)", tname, N, global_norm_num_blocks(N));
    th::check_close(name, &ref, &got, 1, th::tol(th::EPS_FP32, rounding_path<T>(N), 0));
}

// Small integers: every square and partial sum is an integer below 2^24, exact in fp32 in any
// order, so the result must equal the exact sum (budget 0).
template <class T>
static void test_exact(size_t N, int max_abs, uint64_t seed) {
    const char* tname = th::dtype_name<T>();
    std::vector<float> x(N);
    th::fill_uniform(x.data(), N, seed, -max_abs - 0.5f, max_abs + 0.5f);
    double ref = 0;
    for (float& v : x) {
        v = std::nearbyint(v);
        ref += (double)v * v;
    }
    float got = device_norm_squared<T>(x);
    char name[128];
    snprintf(name, sizeof(name), "norm %s N=%zu: integer values in [-%d, %d], exact", tname, N, max_abs, max_abs);
    th::check_close(name, &ref, &got, 1, th::Tol{0, 0});
}

// A single non-zero value at position `at` (first element, last full pack, the tail): exact.
template <class T>
static void test_single(size_t N, size_t at) {
    const char* tname = th::dtype_name<T>();
    std::vector<float> x(N, 0.f);
    x[at] = 3.f;
    double ref = 9.0;
    float got = device_norm_squared<T>(x);
    char name[128];
    snprintf(name, sizeof(name), "norm %s N=%zu: only element %zu non-zero", tname, N, at);
    th::check_close(name, &ref, &got, 1, th::Tol{0, 0});
}

// The clip factor against torch's fp32 formula: reciprocal(sqrt(n2) + 1e-6) * max_norm, clamped
// to 1 (NaN kept). Same IEEE operations in the same order: budget 0 (bitwise).
static void test_clip_scale() {
    const float norms2[] = {0.f, 1e-12f, 0.25f, 0.999999f, 1.f, 1.000002f, 4.f, 12345.678f, 1e30f, INFINITY, NAN};
    const float max_norms[] = {1.f, 0.5f, 3.7f};
    const size_t n = sizeof(norms2) / sizeof(norms2[0]);
    for (float max_norm : max_norms) {
        std::vector<float> want(n), got(n);
        th::DeviceBuffer<float> d_n2(1), d_scale(1);
        for (size_t i = 0; i < n; i++) {
            float norm = std::sqrt(norms2[i]);
            float coef = (1.0f / (norm + 1e-6f)) * max_norm;
            want[i] = coef > 1.0f ? 1.0f : coef;
            d_n2.upload({norms2[i]});
            grad_clip_scale(d_scale.ptr, d_n2.ptr, max_norm, 0);
            got[i] = d_scale.host()[0];
        }
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            if (!(std::isnan(want[i]) ? std::isnan(got[i]) : memcmp(&want[i], &got[i], 4) == 0)) bad++;
        th::report(bad == 0, "grad_clip_scale: torch's fp32 clip factor, bitwise (incl. inf/NaN norms)",
                   "max_norm=%g, %zu cases, bad=%zu", max_norm, n, bad);
    }
}

// fp16 gradients under loss scaling: the norm is the trainer's overflow check, so it must be finite
// for any finite fp16 gradients (squares of values up to 65504 summed in fp32 cannot overflow) and
// inf or NaN as soon as one gradient is (an overflow in the backward pass, or a NaN).
static void test_fp16_range() {
    const size_t N = 100003;
    std::vector<float> x(N);
    for (size_t i = 0; i < N; i++) x[i] = i % 3 == 0 ? -65504.f : 65504.f;
    double ref = (double)N * 65504.0 * 65504.0;
    float got = device_norm_squared<__half>(x);
    th::check_close("norm fp16 N=100003: every value +-65504 (fp16's largest): finite, vs double", &ref, &got, 1,
                    th::tol(th::EPS_FP32, rounding_path<__half>(N), 0));
    std::vector<float> y(N);
    th::fill_uniform(y.data(), N, 5, -1.f, 1.f);
    const float specials[] = {INFINITY, -INFINITY, NAN};
    const size_t where[] = {777, N - 1, 0};  // a pack in the middle, the tail, the first element
    for (int k = 0; k < 3; k++) {
        std::vector<float> z = y;
        z[where[k]] = specials[k];
        float n2 = device_norm_squared<__half>(z);
        bool ok = std::isnan(specials[k]) ? std::isnan(n2) : n2 == INFINITY;
        char name[128];
        snprintf(name, sizeof(name), "norm fp16 N=100003: a %g at %zu gives %s", (double)specials[k], where[k],
                 std::isnan(specials[k]) ? "NaN" : "inf");
        th::report(ok, name, "got %g", (double)n2);
    }
}

int main() {
    // Sizes: single element, less than a pack, not multiples of 8/32/128/512, one block, many.
    const size_t sizes[] = {1, 7, 1000, 8191, 123457, 1000003};
    for (size_t N : sizes) {
        test_random<float>(N, 11 + N, N <= 123457);
        test_random<__nv_bfloat16>(N, 23 + N, N <= 123457);
        test_random<__half>(N, 29 + N, N <= 123457);
        test_exact<float>(N, 3, 5 + N);
        test_exact<__nv_bfloat16>(N, 3, 7 + N);
        test_exact<__half>(N, 3, 9 + N);
    }
    // More values than the 1024 blocks cover at 16 per thread: the grid is capped, each thread
    // strides further. Integers in [-1, 1] keep the sum (< N < 2^24) exact.
    const size_t big = (size_t)GLOBAL_NORM_MAX_BLOCKS * GLOBAL_NORM_BLOCK_SIZE * GLOBAL_NORM_MIN_ELEMS_PER_THREAD + 12345;
    test_exact<float>(big, 1, 99);
    test_random<__nv_bfloat16>(big, 98, false);
    for (size_t at : {(size_t)0, (size_t)123448, (size_t)123456}) {
        test_single<float>(123457, at);
        test_single<__nv_bfloat16>(123457, at);
        test_single<__half>(123457, at);
    }
    test_exact<float>(0, 1, 1);  // N = 0: the sum of nothing is 0
    test_clip_scale();
    test_fp16_range();
    return th::finish();
}
