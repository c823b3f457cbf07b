// test/test_fused_classifier.cu — fused_classifier (llmc/fused_classifier.cuh) against a CPU
// reference in double from the same (storage-rounded) logits, for float, bf16 and fp16, under
// forward/reverse/random thread orders: losses, dlogits, vocabulary padding, ignored rows, large
// logits, loss-only mode, and the report of an out-of-range target; in fp16, that a loss-scaled
// gradient that overflows, and a NaN logit, reach dlogits as inf and NaN; that the kernel keeping the
// row in shared memory (one DRAM read per row) and production's two-pass kernel agree bit for bit, and
// where the device profile (SIMT_DEVICE) fits GPT-2's row on chip.
#include "../llmc/fused_classifier.cuh"
#include "harness.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

// ----------------------------------------------------------------------------
// Helpers

// One case: the shape, the logits' spread and offset, which rows are ignored or out of range.
struct Case {
    const char* what;
    int N, V, Vp;
    float spread;       // logits uniform in [-spread, spread) ...
    float offset;       // ... plus offset * (row % 3 - 1): large logits must not overflow exp
    float padding;      // value of the padding columns V..Vp-1 (must never matter; NaN is allowed)
    int ignore_index;   // -1: none matches
    int ignored_every;  // every k-th row's target is ignore_index (0: none)
    int bad_row;        // a row whose target is V (out of range), or -1
    bool write_dlogits;
};

// The statistics of the reference: loss, and dlogits (0 where the row is ignored or invalid).
struct Reference {
    std::vector<double> loss, dlogits;
    double max_magnitude = 0;  // max over counted rows of |max logit - target logit| + log V
};

// Loss and dlogits of every row in double, as fused_classifier defines them.
Reference reference(const std::vector<double>& x, const std::vector<int>& targets, int N, int V, int Vp, double dloss,
                    int ignore_index) {
    Reference r;
    r.loss.assign(N, 0.0);
    r.dlogits.assign((size_t)N * Vp, 0.0);
    for (int n = 0; n < N; n++) {
        int t = targets[n];
        if (t == ignore_index || t < 0 || t >= V) {
            r.loss[n] = t == ignore_index ? 0.0 : NAN;
            continue;
        }
        const double* row = &x[(size_t)n * Vp];
        double m = *std::max_element(row, row + V), s = 0;
        for (int i = 0; i < V; i++) s += std::exp(row[i] - m);
        r.loss[n] = m + std::log(s) - row[t];
        for (int i = 0; i < V; i++) r.dlogits[(size_t)n * Vp + i] = (std::exp(row[i] - m) / s - (i == t)) * dloss;
        r.max_magnitude = std::max(r.max_magnitude, std::fabs(m - row[t]) + std::log((double)V));
    }
    return r;
}

// ----------------------------------------------------------------------------

// Runs one case under thread orders and checks losses, dlogits and the exact zeros.
template <class T>
void run_case(const Case& c, uint64_t seed) {
    size_t n = (size_t)c.N * c.Vp;
    std::vector<float> u(n);
    th::fill_uniform(u.data(), n, seed, -c.spread, c.spread);
    std::vector<T> logits(n);
    std::vector<double> x(n);  // the reference starts from the same storage-rounded logits
    for (int r = 0; r < c.N; r++)
        for (int i = 0; i < c.Vp; i++) {
            size_t k = (size_t)r * c.Vp + i;
            float v = i < c.V ? u[k] + c.offset * (r % 3 - 1) : c.padding;
            logits[k] = from_float<T>(v);
            x[k] = to_float(logits[k]);
        }
    std::vector<int> targets(c.N);
    int counted = 0;
    for (int r = 0; r < c.N; r++) {
        targets[r] = (int)(((uint64_t)r * 2654435761u + seed) % c.V);
        if (c.ignored_every && r % c.ignored_every == 1) targets[r] = c.ignore_index;
        if (r == c.bad_row) targets[r] = c.V;
        counted += targets[r] != c.ignore_index;
    }
    targets[0] = c.V - 1;  // the last real column, next to the padding
    if (c.N > 2) targets[2] = 0;
    float dloss = 1.f / std::max(counted, 1);
    Reference ref = reference(x, targets, c.N, c.V, c.Vp, dloss, c.ignore_index);

    th::DeviceBuffer<T> d_logits(n);
    th::DeviceBuffer<float> d_losses(c.N);
    th::DeviceBuffer<int> d_targets(targets);
    std::vector<float> losses;
    char name[256];
    snprintf(name, sizeof(name), "fused_classifier %s %s (N=%d V=%d Vp=%d): thread orders", th::dtype_name<T>(), c.what,
             c.N, c.V, c.Vp);
    std::vector<T> out = th::run_orders(name, [&] {
        d_logits.upload(logits);
        fused_classifier(d_logits.ptr, d_losses.ptr, d_targets.ptr, c.N, c.V, c.Vp, dloss, c.ignore_index,
                         c.write_dlogits, 0);
        losses = d_losses.host();
        std::vector<T> result = d_logits.host();
        // the losses travel with the logits so that run_orders compares both
        const T* l = reinterpret_cast<const T*>(losses.data());
        result.insert(result.end(), l, l + c.N * sizeof(float) / sizeof(T));
        return result;
    });
    losses.assign(reinterpret_cast<const float*>(out.data() + n), reinterpret_cast<const float*>(out.data() + n) + c.N);
    out.resize(n);

    // Error budget of fp32 softmax statistics. k_sum bounds the roundings along the longest chain
    // that builds the row's sum: per element an exp, a subtraction and an addition (3 per element
    // of a thread's share), per level of the two butterfly reductions a merge (two exps, two
    // products, an addition, a subtraction: 6 per level, 2*5 levels), plus 8 for the GPU's fast
    // exp (2 ulp and the rounding of its argument's scaling). The loss (m - x[target]) + log(s)
    // adds three roundings, each at most eps times |m - x[target]| + log V.
    double k_sum = 3.0 * CEIL_DIV(c.V, CLASSIFIER_BLOCK) + 6 * 10 + 8;
    th::Tol loss_tol{th::EPS_FP32 * (k_sum + 3 * ref.max_magnitude), 0};
    std::vector<double> ref_loss, got_loss;
    int nan_ok = 1;
    for (int r = 0; r < c.N; r++) {
        if (std::isnan(ref.loss[r])) {
            nan_ok &= std::isnan(losses[r]);
            continue;
        }
        ref_loss.push_back(ref.loss[r]);
        got_loss.push_back(losses[r]);
    }
    snprintf(name, sizeof(name), "fused_classifier %s %s: losses vs double reference", th::dtype_name<T>(), c.what);
    th::check_close(name, ref_loss.data(), got_loss.data(), ref_loss.size(), loss_tol);
    if (c.bad_row >= 0) {
        snprintf(name, sizeof(name), "fused_classifier %s %s: out-of-range target gives loss NaN", th::dtype_name<T>(),
                 c.what);
        th::report(nan_ok, name, "row %d, target %d, loss %g", c.bad_row, c.V, (double)losses[c.bad_row]);
    }

    if (!c.write_dlogits) {
        snprintf(name, sizeof(name), "fused_classifier %s %s: logits untouched without write_dlogits", th::dtype_name<T>(),
                 c.what);
        th::check_bitwise(name, logits.data(), out.data(), n * sizeof(T));
        return;
    }
    // dlogits = (p - onehot) * dloss: p carries k_sum roundings relative (plus 2 for the division
    // and product), the subtraction and the scaling by dloss 2 more; near the target p - 1 can
    // cancel, hence the absolute floor dloss * k * eps. bf16 and fp16 add one rounding of the
    // result, at most half an ulp: k = 1 of the type's eps; in fp16 a dlogit p * dloss below the
    // normal range (2^-14) is rounded to a subnormal, up to half the smallest one absolutely:
    // atol + 2^-25 (at a trainer's dloss = 1/(B*T) that is most of them).
    double k = k_sum + 4;
    th::Tol tol = sizeof(T) == 4 ? th::Tol{dloss * k * th::EPS_FP32, k * th::EPS_FP32}
                                 : th::Tol{dloss * k * th::EPS_FP32 + dtype_denorm_min<T>() / 2,
                                           dtype_eps<T>() + k * th::EPS_FP32};
    std::vector<double> got(n);
    size_t nonzero_outside = 0;  // padding columns and ignored/invalid rows must be exactly 0
    for (size_t i = 0; i < n; i++) {
        got[i] = to_float(out[i]);
        int r = (int)(i / c.Vp), col = (int)(i % c.Vp);
        bool counted_row = targets[r] != c.ignore_index && targets[r] >= 0 && targets[r] < c.V;
        if ((col >= c.V || !counted_row) && to_float(out[i]) != 0.f) nonzero_outside++;
    }
    snprintf(name, sizeof(name), "fused_classifier %s %s: dlogits vs double reference", th::dtype_name<T>(), c.what);
    th::check_close(name, ref.dlogits.data(), got.data(), n, tol);
    snprintf(name, sizeof(name), "fused_classifier %s %s: padding columns and ignored rows are exactly 0",
             th::dtype_name<T>(), c.what);
    th::report(nonzero_outside == 0, name, "%zu nonzero", nonzero_outside);
}

// Every case for one storage type.
template <class T>
void test_dtype() {
    const Case cases[] = {
        // what                          N    V      Vp     spread offset padding ignore every bad  dlogits
        {"GPT-2-like, NaN padding",      7,   500,   512,   4.f,   0.f,   NAN,    -100,  3,    -1,  true},
        {"large logits, MLM ignore",     96,  500,   512,   8.f,   1000.f, 1e4f,  -100,  4,    -1,  true},
        {"GPT-2 vocabulary",             2,   50257, 50304, 6.f,   0.f,   0.f,    -1,    0,    -1,  true},
        {"odd sizes (element access)",   5,   37,    45,    3.f,   0.f,   7.f,    -1,    0,    -1,  true},
        {"one row",                      1,   300,   320,   2.f,   0.f,   0.f,    -1,    0,    -1,  true},
        {"out-of-range target",          7,   500,   512,   4.f,   0.f,   0.f,    -100,  0,    4,   true},
        {"loss only",                    7,   500,   512,   4.f,   50.f,  0.f,    -100,  3,    -1,  false},
    };
    uint64_t seed = 7;
    for (const Case& c : cases) run_case<T>(c, seed += 11);
}

// fp16 overflow reaches the trainer: with a loss-scaled dloss of 2^20 every target column's
// dlogit, (p - 1) * dloss, exceeds fp16's 65504 and must be stored as -inf (not clamped to the
// largest finite value), and a NaN logit makes its row's loss and every real dlogit NaN (the
// row max ignores a NaN, the row sum does not).
void test_fp16_nonfinite() {
    const int N = 4, V = 300, Vp = 304;
    std::vector<__half> logits = th::random_tensor<__half>((size_t)N * Vp, 91, -4.f, 4.f);
    logits[2 * Vp + 17] = from_float<__half>(NAN);
    std::vector<int> targets = {5, 299, 0, 150};
    th::DeviceBuffer<__half> d_logits(logits);
    th::DeviceBuffer<float> d_losses(N);
    th::DeviceBuffer<int> d_targets(targets);
    fused_classifier(d_logits.ptr, d_losses.ptr, d_targets.ptr, N, V, Vp, 1048576.f, -1, true, 0);
    std::vector<__half> out = d_logits.host();
    std::vector<float> losses = d_losses.host();
    bool target_inf = true, nan_row = true, others_ok = true;
    for (int r = 0; r < N; r++)
        for (int i = 0; i < V; i++) {
            float g = to_float(out[(size_t)r * Vp + i]);
            if (r == 2) nan_row &= std::isnan(g);
            else if (i == targets[r]) target_inf &= g == -INFINITY;
            else others_ok &= !std::isnan(g) && g >= 0.f;  // p * dloss: positive, possibly inf
        }
    th::report(target_inf && others_ok, "fused_classifier fp16: dloss 2^20 overflows target dlogits to -inf",
               "target columns -inf: %s, other columns >= 0 and not NaN: %s", target_inf ? "yes" : "no",
               others_ok ? "yes" : "no");
    bool loss_nan = std::isnan(losses[2]) && !std::isnan(losses[0]) && !std::isnan(losses[1]) && !std::isnan(losses[3]);
    th::report(nan_row && loss_nan, "fused_classifier fp16: a NaN logit makes its row's loss and dlogits NaN",
               "loss[2]=%g, dlogits of row 2 all NaN: %s", (double)losses[2], nan_row ? "yes" : "no");
}

// The row kept on chip (fused_classifier's row_in_shared_memory) changes where the second sweep
// reads, not what it computes: bit-identical to production's two-pass kernel. At GPT-2's vocabulary
// the row (V rounded up to whole packs) fits in bf16 and fp16 on every profile (98.2 KiB of the
// smallest's 99 KiB) and in fp32 (196.3 KiB) on an H100 or H200 only; elsewhere the option reads twice.
template <class T>
void test_row_on_chip(int N, int V, int Vp) {
    auto logits = th::random_tensor<T>((size_t)N * Vp, 31, -6.f, 6.f);
    std::vector<int> targets(N);
    for (int r = 0; r < N; r++) targets[r] = (r * 7919) % V;
    th::DeviceBuffer<T> d_logits((size_t)N * Vp);
    th::DeviceBuffer<float> d_losses(N);
    th::DeviceBuffer<int> d_targets(targets);
    auto run = [&](bool row_in_shared_memory) {
        d_logits.upload(logits);
        fused_classifier(d_logits.ptr, d_losses.ptr, d_targets.ptr, N, V, Vp, 1.f / N, -1, true, 0, nullptr,
                         row_in_shared_memory);
        std::vector<T> out = d_logits.host();
        std::vector<float> losses = d_losses.host();
        const T* l = reinterpret_cast<const T*>(losses.data());
        out.insert(out.end(), l, l + N * sizeof(float) / sizeof(T));
        return out;
    };
    std::vector<T> on_chip = run(true), production = run(false);
    int optin = device_smem_optin();
    char name[200];
    snprintf(name, sizeof(name), "fused_classifier %s V=%d: %s (opt-in %d KiB) bit-identical to production",
             th::dtype_name<T>(), V,
             classifier_row_fits_on_chip<T>(V) ? "row in shared memory" : "row does not fit, two reads", optin / 1024);
    th::check_bitwise(name, production.data(), on_chip.data(), production.size() * sizeof(T));
}

// dloss read from device memory (what a replayed CUDA graph uses: set_device_scalar before the
// replay) gives the dlogits and losses of the same dloss as an argument, and a new value there the
// new value's, while the argument is ignored.
template <class T>
void test_dloss_on_device() {
    const int N = 6, V = 500, Vp = 512;
    auto logits = th::random_tensor<T>((size_t)N * Vp, 41, -6.f, 6.f);
    std::vector<int> targets(N);
    for (int r = 0; r < N; r++) targets[r] = r == 2 ? -100 : (r * 131) % V;
    th::DeviceBuffer<T> d_logits((size_t)N * Vp);
    th::DeviceBuffer<float> d_losses(N), d_dloss(1);
    th::DeviceBuffer<int> d_targets(targets);
    auto run = [&](float dloss, const float* device) {
        d_logits.upload(logits);
        fused_classifier(d_logits.ptr, d_losses.ptr, d_targets.ptr, N, V, Vp, dloss, -100, true, 0, device);
        std::vector<T> out = d_logits.host();
        std::vector<float> losses = d_losses.host();
        const T* l = reinterpret_cast<const T*>(losses.data());
        out.insert(out.end(), l, l + N * sizeof(float) / sizeof(T));
        return out;
    };
    bool same = true;
    for (float dloss : {1.f / 5, 3.f / 7}) {
        set_device_scalar(d_dloss.ptr, dloss, 0);
        std::vector<T> want = run(dloss, nullptr), got = run(123.f, d_dloss.ptr);
        same &= memcmp(want.data(), got.data(), want.size() * sizeof(T)) == 0;
    }
    char name[160];
    snprintf(name, sizeof(name), "fused_classifier %s: dloss from device memory == the same dloss as an argument",
             th::dtype_name<T>());
    th::report(same, name, "dlogits and losses %s for dloss 1/5 and 3/7 (argument 123 ignored)",
               same ? "bit-identical" : "differ");
}

int main() {
    test_dloss_on_device<float>();
    test_dloss_on_device<__nv_bfloat16>();
    test_row_on_chip<float>(3, 50257, 50304);
    test_row_on_chip<__nv_bfloat16>(3, 50257, 50304);
    test_row_on_chip<__half>(3, 50257, 50304);
    test_row_on_chip<float>(5, 500, 512);
    test_dtype<float>();
    test_dtype<__nv_bfloat16>();
    test_dtype<__half>();
    test_fp16_nonfinite();
    return th::finish();
}
