// test/harness.h — the test harness every test shares: dtype-derived tolerances, one line per
// test, a final "N passed, N failed" and a non-zero exit code when anything failed.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>

namespace th {

// ----------------------------------------------------------------------------
// Tolerances. DESIGN.md: |out - ref| <= atol + k * eps * |ref|, eps the unit roundoff of the
// storage/compute dtype. A test states k (how many roundings its result can accumulate) and atol
// (the absolute floor, for results near zero) and says why; a budget is never widened to pass.

constexpr double EPS_FP32 = 1.0 / (1 << 23);  // 2^-23
constexpr double EPS_TF32 = 1.0 / (1 << 10);  // 10 explicit mantissa bits, like fp16
constexpr double EPS_FP16 = 1.0 / (1 << 10);  // 2^-10
constexpr double EPS_BF16 = 1.0 / (1 << 7);   // 2^-7
constexpr double EPS_E4M3 = 1.0 / (1 << 3);   // 3 mantissa bits
constexpr double EPS_E5M2 = 1.0 / (1 << 2);   // 2 mantissa bits

struct Tol {
    double atol;  // absolute floor
    double rtol;  // k * eps
};
inline Tol tol(double eps, double k, double atol) { return Tol{atol, k * eps}; }

// ----------------------------------------------------------------------------
// Tally

inline int& n_passed() { static int n = 0; return n; }
inline int& n_failed() { static int n = 0; return n; }

// Records one test result and prints its line: "PASS name  detail" or "FAIL name  detail".
inline bool report(bool ok, const char* name, const char* fmt = "", ...) {
    char detail[512] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", name, detail[0] ? "  " : "", detail);
    fflush(stdout);
    (ok ? n_passed() : n_failed())++;
    return ok;
}

// Prints the final tally and returns the process exit code (0 only when nothing failed).
inline int finish() {
    printf("%d passed, %d failed\n", n_passed(), n_failed());
    return n_failed() == 0 ? 0 : 1;
}

// ----------------------------------------------------------------------------
// Comparisons

inline double to_double(float x) { return x; }
inline double to_double(double x) { return x; }
inline double to_double(__nv_bfloat16 x) { return __bfloat162float(x); }
inline double to_double(__half x) { return __half2float(x); }

// Compares out against ref element-wise under tol; reports max abs error and the largest share of
// the per-element budget used (a pass uses at most 100%). T needs a to_double overload (float,
// double, __nv_bfloat16 and __half are provided above).
template <class T, class R>
bool check_close(const char* name, const R* ref, const T* out, size_t n, Tol t) {
    double max_err = 0, worst_share = 0;
    size_t worst_i = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        double r = to_double(ref[i]), o = to_double(out[i]);
        double err = std::fabs(o - r);
        double budget = t.atol + t.rtol * std::fabs(r);
        double share = budget > 0 ? err / budget : (err > 0 ? INFINITY : 0);
        if (!(err <= budget)) bad++;  // NaN fails too
        if (std::isnan(err)) share = INFINITY;
        if (err > max_err || std::isnan(err)) max_err = err;
        if (share > worst_share) { worst_share = share; worst_i = i; }
    }
    return report(bad == 0, name, "max_err=%.3g budget_used=%.0f%% (n=%zu, bad=%zu, worst at %zu: out=%.9g ref=%.9g)",
                  max_err, worst_share * 100, n, bad, worst_i, to_double(out[worst_i]),
                  to_double(ref[worst_i]));
}

// Bitwise equality of two buffers (used for determinism and schedule-order checks).
inline bool check_bitwise(const char* name, const void* a, const void* b, size_t bytes) {
    const unsigned char* pa = (const unsigned char*)a;
    const unsigned char* pb = (const unsigned char*)b;
    size_t first = bytes;
    for (size_t i = 0; i < bytes; i++)
        if (pa[i] != pb[i]) { first = i; break; }
    if (first == bytes) return report(true, name, "bit-identical (%zu bytes)", bytes);
    return report(false, name, "first differing byte at %zu of %zu", first, bytes);
}

// Deterministic pseudo-random fill in [lo, hi), so tests need no global RNG state.
inline void fill_uniform(float* x, size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        x[i] = lo + (hi - lo) * (float)((s >> 40) * (1.0 / (1ull << 24)));
    }
}

}  // namespace th

// ----------------------------------------------------------------------------
// Schedule orders (CPU backend only): a deterministic kernel must give bit-identical results
// whatever order the threads run in between two sync points; a missing __syncthreads shows up
// as a difference. On a GPU there is one (hardware) order and run_orders just runs.
#if defined(SIMT_CPU)
namespace th {
// Runs `run` (launches kernels, returns a std::vector of host results) under forward, reverse
// and seeded-random thread orders, reports whether all results are bit-identical, and returns
// the forward-order result.
template <class F>
auto run_orders(const char* name, F run) -> decltype(run()) {
    simt::Order saved = simt::get_order();
    simt::set_order(simt::Order::Forward);
    auto fwd = run();
    simt::set_order(simt::Order::Reverse);
    auto rev = run();
    simt::set_order(simt::Order::Random, 12345);
    auto rnd = run();
    simt::set_order(saved);
    size_t bytes = fwd.size() * sizeof(fwd[0]);
    bool same = rev.size() == fwd.size() && rnd.size() == fwd.size() &&
                memcmp(fwd.data(), rev.data(), bytes) == 0 && memcmp(fwd.data(), rnd.data(), bytes) == 0;
    report(same, name, same ? "bit-identical under forward, reverse and random thread orders"
                            : "results differ between thread orders (missing __syncthreads/__syncwarp?)");
    return fwd;
}
}  // namespace th
#else
namespace th {
template <class F>
auto run_orders(const char*, F run) -> decltype(run()) { return run(); }
}  // namespace th
#endif
