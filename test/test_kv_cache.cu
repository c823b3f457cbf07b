// test/test_kv_cache.cu — attention_decode (llmc/kv_cache.cuh), one query against a KV cache, for fp32,
// bf16 and fp16, against a CPU reference in double: softmax(q k_j / sqrt(HS), j <= pos) · v per head.
//
// Tolerances, from a first-order rounding-error analysis (a length-n fp32 sum errs by at most n eps
// times the sum of its |terms|). mag[d] = sum_j p_j |v_j[d]| (the output with every term made
// positive, so that cancellation cannot make the budget vanish), a_j = sum_d |q_d k_jd| / sqrt(HS),
// amax = max_j a_j. The kernel's chains (its DecodeLayout: chunks of vec elements, G lanes per key, S
// slices of the keys), with n = pos + 1 keys:
//   score: L_dot = ceil(chunks/G) vec terms per lane + log2 G tree adds; the product, the scale and its
//          rounding: L_dot + 3
//          roundings of a_j (in log2 units, converted back by exp2); s - m one more of 2 amax, exp2 2
//          ulp: each weight has relative error rho <= ((L_dot + 5) amax + 2) eps, which moves the
//          output by at most 2 rho mag (the weights' errors, and the normalizer's share of them);
//   sum of weights: n/256 + 5 + 8 adds, all positive: relative L_l eps;
//   values: the product + n/S + S adds: L_num + 1 roundings of mag; the division one more.
//   So the fp32 budget is k eps mag with k = 2 ((L_dot + 5) amax + 2) + L_l + L_num + 2 (eps = 2^-23).
// bf16 and fp16: the inputs are values of the type and the reference is computed from those same
//   values, so the only roundings besides the fp32 ones above are the final one to the type: half an
//   ulp, eps_T/2 |out|; below fp16's normal range a rounding errs by up to half the smallest subnormal,
//   absolutely (the atol).
// These bounds are worst cases, so a key that is left out (one of 4096 moves the output by ~1/4096) may
// hide inside them: two structural checks catch what the budget cannot. The cache rows after pos are
// NaN (a kernel that reads a future row, even multiplying it by a zero weight, outputs NaN), and
// "peaked" cases give key 0 or key pos a score 30 above the others, so that the output is that key's
// value: leaving out either end of the key range is an O(1) error.
// Both load paths run: 128-bit chunks (aligned cache, HS a multiple of the pack width) and single
// elements (HS = 20 in 16-bit types, or a cache one element off alignment). Every case runs under
// th::run_orders (bit-identical results under forward, reverse and random thread orders); shape errors
// exit with a message naming the constraint.
#include "../llmc/kv_cache.cuh"
#include "harness.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

struct Case {
    int HS, NH, maxT, pos;
    int peak;        // -1: random scores; else the key that gets a score 30 above the others
    int offset = 0;  // elements between an aligned allocation and the cache (1: the unaligned path)
    int C() const { return NH * HS; }
    std::string name(const char* dtype, int vec) const {
        char buf[200];
        snprintf(buf, sizeof(buf), "attention_decode<%s> HS=%d NH=%d maxT=%d pos=%d%s%s (vec %d)", dtype, HS, NH, maxT,
                 pos, peak < 0 ? "" : (" peak at key " + std::to_string(peak)).c_str(),
                 offset ? " unaligned cache" : "", vec);
        return buf;
    }
};

// The cache's rows 0..pos (3C each) as values of T: random in [-1, 1), with the peak's key rows set
// to a multiple of the query so that its score is 30 (natural units) for every head.
template <class T>
std::vector<T> make_rows(const Case& cs, uint64_t seed) {
    const int C = cs.C(), HS = cs.HS;
    std::vector<float> f((size_t)(cs.pos + 1) * 3 * C);
    th::fill_uniform(f.data(), f.size(), seed);
    std::vector<T> rows = th::round_to<T>(f);
    if (cs.peak >= 0)
        for (int h = 0; h < cs.NH; h++) {  // k of the peak = alpha q (q is in other columns: unchanged)
            const T* q = rows.data() + (size_t)cs.pos * 3 * C + h * HS;
            T* k = rows.data() + (size_t)cs.peak * 3 * C + C + h * HS;
            double qq = 0;
            for (int d = 0; d < HS; d++) qq += th::to_double(q[d]) * th::to_double(q[d]);
            double alpha = 30.0 * std::sqrt((double)HS) / qq;
            for (int d = 0; d < HS; d++) k[d] = from_float<T>((float)(alpha * th::to_double(q[d])));
        }
    return rows;
}

// The exact output (C) in double and each element's fp32 budget multiplier k * mag (see the top).
struct Reference {
    std::vector<double> out, kmag;
};

Reference reference(const Case& cs, const std::vector<double>& rows, int vec) {
    const int C = cs.C(), HS = cs.HS, n = cs.pos + 1;
    const double scale = 1.0 / std::sqrt((double)HS);
    const DecodeLayout lay = attention_decode_layout(HS, vec);
    const int G = lay.lanes_per_key, S = lay.slices;
    const double L_dot = CEIL_DIV(lay.chunks, G) * vec + std::log2((double)G);
    const double L_l = CEIL_DIV(n, kDecodeThreads) + 5 + kDecodeWarps;
    const double L_num = CEIL_DIV(n, S) + S;
    Reference ref;
    ref.out.assign(C, 0);
    ref.kmag.assign(C, 0);
    std::vector<double> s(n), p(n);
    for (int h = 0; h < cs.NH; h++) {
        auto q = [&](int d) { return rows[(size_t)cs.pos * 3 * C + h * HS + d]; };
        auto k = [&](int j, int d) { return rows[(size_t)j * 3 * C + C + h * HS + d]; };
        auto v = [&](int j, int d) { return rows[(size_t)j * 3 * C + 2 * C + h * HS + d]; };
        double m = -INFINITY, amax = 0;
        for (int j = 0; j < n; j++) {
            double dot = 0, adot = 0;
            for (int d = 0; d < HS; d++) dot += q(d) * k(j, d), adot += std::fabs(q(d) * k(j, d));
            s[j] = dot * scale;
            amax = std::max(amax, adot * scale);
            m = std::max(m, s[j]);
        }
        double sum = 0;
        for (int j = 0; j < n; j++) sum += p[j] = std::exp(s[j] - m);
        double kf = 2 * ((L_dot + 5) * amax + 2) + L_l + L_num + 2;
        for (int d = 0; d < HS; d++) {
            double o = 0, mag = 0;
            for (int j = 0; j < n; j++) o += p[j] / sum * v(j, d), mag += p[j] / sum * std::fabs(v(j, d));
            ref.out[h * HS + d] = o;
            ref.kmag[h * HS + d] = kf * mag;
        }
    }
    return ref;
}

template <class T>
void test_case(const Case& cs, uint64_t seed) {
    const int C = cs.C();
    std::vector<T> rows = make_rows<T>(cs, seed);
    // The whole cache starts as NaN; only rows 0..pos get values.
    th::DeviceBuffer<T> base(cs.offset + (size_t)cs.maxT * 3 * C, th::Fill::NaN);
    T* cache = base.ptr + cs.offset;
    cudaCheck(cudaMemcpy(cache, rows.data(), rows.size() * sizeof(T), cudaMemcpyHostToDevice));
    th::DeviceBuffer<T> out(C, th::Fill::NaN);
    const int vec = attention_decode_vec((const T*)cache, C, cs.NH);
    Reference ref = reference(cs, th::widen(rows), vec);
    std::string name = cs.name(th::dtype_name<T>(), vec);
    std::vector<T> got = th::run_orders((name + ": thread orders").c_str(), [&] {
        attention_decode(out.ptr, (const T*)cache, cs.pos, C, cs.NH, cs.maxT, 0);
        return out.host();
    });
    const double eps32 = th::EPS_FP32, epsT = dtype_eps<T>(), atol = dtype_denorm_min<T>() / 2;
    std::vector<double> budget(C);
    for (int i = 0; i < C; i++) {
        double b32 = ref.kmag[i] * eps32;
        budget[i] = std::is_same<T, float>::value ? b32 + atol : b32 + epsT / 2 * (std::fabs(ref.out[i]) + b32) + atol;
    }
    th::check_budget((name + " vs double reference").c_str(), ref.out, got, budget);
}

// A launch the launcher must refuse: runs in a child (this binary with --bad-shape i), which must stop
// with a message containing `expect`.
struct BadShape {
    int C, NH, pos, maxT;
    const char* expect;
};
const BadShape kBadShapes[] = {
    {100, 3, 0, 16, "C must be a multiple of NH"},
    {600, 2, 0, 16, "head size HS = C/NH = 300 must be at most 256"},
    {64, 4, 16, 16, "pos must be in [0, maxT)"},
    {64, 4, -1, 16, "pos must be in [0, maxT)"},
    {64, 4, 0, 100000, "maxT is too large"},
};

void run_bad_shape(int i) {
    const BadShape& b = kBadShapes[i];
    float* x;
    cudaCheck(cudaMalloc(&x, 3 * (size_t)b.C * sizeof(float)));
    attention_decode(x, x, b.pos, b.C, b.NH, b.maxT, 0);
}

void test_bad_shapes(const char* self) {
    for (size_t i = 0; i < sizeof(kBadShapes) / sizeof(kBadShapes[0]); i++) {
        const BadShape& b = kBadShapes[i];
        th::ChildOutput child = th::run_command(std::string(self) + " --bad-shape " + std::to_string(i) + " 2>&1");
        const std::string& out = child.text;
        bool ok = child.status != 0 && out.find(b.expect) != std::string::npos;
        char name[160];
        snprintf(name, sizeof(name), "refused: C=%d NH=%d pos=%d maxT=%d", b.C, b.NH, b.pos, b.maxT);
        th::report(ok, name, "%s", out.substr(0, out.find('\n')).c_str());
    }
}

int main(int argc, char** argv) {
    if (argc == 3 && std::string(argv[1]) == "--bad-shape") {
        run_bad_shape(atoi(argv[2]));
        return 0;
    }
    // GPT-2-like head sizes (16, 64, 128), ones that are not powers of two (20, 24, 80) and the largest
    // (256); pos 0 (a single key), maxT - 1 (the last row of the cache), and lengths that are not
    // multiples of a warp, of the block or of the slices; maxT = 4096, and 16384, whose scores need
    // more than 48 KiB of shared memory (the opt-in path).
    std::vector<Case> cases = {
        {16, 3, 64, 0, -1},    {16, 3, 64, 1, -1},     {16, 3, 64, 17, -1},   {16, 3, 64, 63, -1},
        {64, 2, 200, 0, -1},   {64, 2, 200, 99, -1},   {64, 2, 200, 199, -1}, {80, 2, 77, 0, -1},
        {80, 2, 77, 40, -1},   {80, 2, 77, 76, -1},    {24, 2, 50, 49, -1},   {256, 1, 300, 299, -1},
        {128, 2, 4096, 0, -1}, {128, 2, 4096, 4095, -1}, {16, 1, 16384, 16383, -1},
        {64, 2, 200, 150, 0},  {64, 2, 200, 150, 150}, {80, 2, 77, 76, 0},    {16, 3, 64, 63, 63},
        {20, 3, 40, 39, -1},   {64, 2, 200, 199, -1, 1}, {64, 2, 200, 150, 150, 1},
    };
    uint64_t seed = 1;
    for (const Case& cs : cases) {
        test_case<float>(cs, seed);
        test_case<__nv_bfloat16>(cs, seed);
        test_case<__half>(cs, seed);
        seed++;
    }
    test_bad_shapes(argv[0]);
    return th::finish();
}
