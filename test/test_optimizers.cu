// test/test_optimizers.cu — tests llmc/sgd.cuh and llmc/adafactor.cuh against torch.optim.SGD (momentum,
// Nesterov, none, dampening) and transformers' Adafactor (defaults; explicit lr with beta1 and weight
// decay; warmup_init): six steps over a table of tensors of different shapes (a 256x257 matrix of
// 65792 elements, a 1-row and a 1-column matrix, tiny weights, a 32x64 matrix, 1-D tensors down to one
// element, an all-zero bias), weight decay on the matrices only, fp32 parameters and bf16 parameters
// with fp32 master weights, a gradient scale on every step and a device-side one (the clip factor) on
// the last two. test/oracle_optimizers.py wrote the fixtures from the same inputs, which both sides
// generate with the same counter-based generator.
//
// SGD: the kernel performs torch's fp32 operations in torch's order, so the budget is 0 everywhere:
// against a host reference in torch's order (every element), and against torch itself (the fixture's
// sampled elements and an FNV-1a hash of all weights and momentum buffers). No value comes near the
// subnormal range, which a GPU build flushes to zero (llmc/adamw.cuh; test_adamw checks that case).
// Adafactor: element-wise operations in transformers' order, but the reductions (row and column
// means, mean of the row statistics, RMS of the weights and of the update) sum in another order, so
// results are compared to a double-precision reference that carries a rigorous bound on what an fp32
// implementation can err, given the length of the longest chain of roundings in each reduction: the
// kernel's own chains (known from its structure) for kernel vs double, any order (n - 1 additions)
// for transformers vs double, and the sum of both for kernel vs transformers.
// Every kernel result must also be bit-identical under forward, reverse and random thread orders.
#include "../llmc/adafactor.cuh"
#include "../llmc/sgd.cuh"
#include "harness.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

// ----------------------------------------------------------------------------
// Inputs, as test/oracle_optimizers.py generates them

static const char* kSgdFixture = "test/fixtures/optim_sgd.bin";
static const char* kAdafactorFixture = "test/fixtures/optim_adafactor.bin";

// One tensor of the table: shape, weight decay flag, parameter scale (0: all zero; ln: 1 + x/8 like a
// layernorm gain), gradient scale (powers of two, so the scaled values are exact) and zero_mod: the
// gradient is exactly zero in every zero_mod-th row (element of a vector) from row 1, as in the
// embedding rows of tokens absent from a batch (Adafactor's statistics there are eps1 alone).
struct Entry {
    std::vector<size_t> shape;
    int weight_decay;
    float param_scale;
    bool ln;
    float grad_scale;
    size_t zero_mod;
};
static const std::vector<Entry> kTable = {
    {{256, 257}, 1, 0.125f, false, 0.5f, 17},     // > 64K elements, neither dimension a multiple of 32
    {{1, 100}, 1, 0.25f, false, 0.0625f, 0},      // one row
    {{77, 1}, 1, 0.25f, false, 1.f / 64, 0},      // one column
    {{33, 45}, 1, 1.f / 4096, false, 0.125f, 0},  // RMS below Adafactor's eps2 = 1e-3
    {{45}, 0, 0.f, false, 1.f / 32, 0},           // a fresh bias: RMS 0
    {{300}, 0, 0.f, true, 0.25f, 7},              // a layernorm gain
    {{3}, 0, 1.f, false, 1.f / 128, 0},
    {{32, 64}, 1, 0.0625f, false, 1.f / 256, 0},  // multiples of 32
    {{1}, 0, 0.5f, false, 1.f, 0},
};
static const int kSteps = 6;
static const float kHostScales[kSteps] = {1.f, 0.37f, 1.f, 0.5f, 1.f, 0.9f};
static const float kDeviceScale = 0.8f;
static const int kDeviceScaleFrom = 4;

static size_t numel(const Entry& e) { return e.shape.size() == 2 ? e.shape[0] * e.shape[1] : e.shape[0]; }
static size_t total_params() {
    size_t n = 0;
    for (const Entry& e : kTable) n += numel(e);
    return n;
}

// Value i of stream `seed`: splitmix64 of (seed << 32) + i, its top 24 bits as a multiple of 2^-23 in
// [-1, 1) (exact in fp32).
static float uniform_value(uint64_t seed, uint64_t i) {
    uint64_t z = (seed << 32) + i + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((int64_t)(z >> 40) - (1 << 23)) * (1.0f / (1 << 23));
}

static std::vector<float> initial_params() {
    std::vector<float> p;
    size_t i = 0;
    for (const Entry& e : kTable)
        for (size_t k = 0; k < numel(e); k++, i++) {
            float x = uniform_value(1, i);
            p.push_back(e.ln ? 1.0f + x * 0.125f : x * e.param_scale);
        }
    return p;
}

// The gradient of step s (0-based), rounded to bf16 when bf16 is set.
static std::vector<float> gradient(int s, bool bf16) {
    std::vector<float> g;
    size_t i = 0;
    for (const Entry& e : kTable)
        for (size_t k = 0; k < numel(e); k++, i++) {
            const size_t row = e.shape.size() == 2 ? k / e.shape[1] : k;
            float x = e.zero_mod && row % e.zero_mod == 1 ? 0.f : uniform_value(100 + s, i) * e.grad_scale;
            g.push_back(bf16 ? to_float(from_float<__nv_bfloat16>(x)) : x);
        }
    return g;
}

// The fp32 gradient multiplier of step s: the host scale, times the device scale from kDeviceScaleFrom
// on (the kernels multiply the two in fp32 too).
static float step_scale(int s) { return s >= kDeviceScaleFrom ? kHostScales[s] * kDeviceScale : kHostScales[s]; }

// Flat indices the fixtures keep: every element of tensors up to 4096 elements, every 61st and the
// last of larger ones.
static std::vector<size_t> sample_indices() {
    std::vector<size_t> idx;
    size_t off = 0;
    for (const Entry& e : kTable) {
        const size_t n = numel(e);
        if (n <= 4096) {
            for (size_t k = 0; k < n; k++) idx.push_back(off + k);
        } else {
            for (size_t k = 0; k < n; k += 61) idx.push_back(off + k);
            if ((n - 1) % 61 != 0) idx.push_back(off + n - 1);
        }
        off += n;
    }
    return idx;
}

static uint64_t fnv1a64(const std::vector<float>& x) {
    uint64_t h = 0xCBF29CE484222325ull;
    const unsigned char* b = reinterpret_cast<const unsigned char*>(x.data());
    for (size_t i = 0; i < x.size() * sizeof(float); i++) h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

template <class V>
static std::vector<V> gather(const std::vector<V>& x, const std::vector<size_t>& idx) {
    std::vector<V> out;
    for (size_t i : idx) out.push_back(x[i]);
    return out;
}

// ----------------------------------------------------------------------------
// Fixture file: "OPTF", then records (u32 name length, name, u32 kind 0 = f32 / 1 = u64, u64 count, data).

struct Fixture {
    std::map<std::string, std::vector<float>> floats;
    std::map<std::string, std::vector<uint64_t>> u64;
    bool ok = false;
};

static Fixture load_fixture(const char* path) {
    Fixture fx;
    FILE* f = fopen(path, "rb");
    char magic[4];
    bool ok = f && fread(magic, 1, 4, f) == 4 && memcmp(magic, "OPTF", 4) == 0;
    uint32_t len;
    while (ok && fread(&len, 4, 1, f) == 1) {
        std::string name(len, '\0');
        uint32_t kind;
        uint64_t count;
        ok = len < 256 && fread(&name[0], 1, len, f) == len && fread(&kind, 4, 1, f) == 1 &&
             fread(&count, 8, 1, f) == 1 && kind <= 1 && count < (1u << 24);
        if (!ok) break;
        if (kind == 0) {
            std::vector<float>& v = fx.floats[name];
            v.resize(count);
            ok = fread(v.data(), 4, count, f) == count;
        } else {
            std::vector<uint64_t>& v = fx.u64[name];
            v.resize(count);
            ok = fread(v.data(), 8, count, f) == count;
        }
    }
    if (f) fclose(f);
    fx.ok = ok;
    th::report(ok, path, ok ? "fixture loaded (%zu records)" : "missing or malformed: regenerate with "
               "/usr/bin/python3 test/oracle_optimizers.py (%zu records read)", fx.floats.size() + fx.u64.size());
    return fx;
}

// The fixture's float record `name`, or n NaNs (so every check against it fails) when it is missing.
static std::vector<float> fixture_floats(const Fixture& fx, const std::string& name, size_t n) {
    auto it = fx.floats.find(name);
    if (it != fx.floats.end() && it->second.size() == n) return it->second;
    printf("  fixture record %s missing or of the wrong length (want %zu)\n", name.c_str(), n);
    return std::vector<float>(n, NAN);
}

// ----------------------------------------------------------------------------
// SGD

struct SgdRun {
    const char* name;
    float lr, momentum, dampening;
    bool nesterov;
    float weight_decay;
    bool bf16;  // also run with bf16 parameters (the fixture has the bf16-gradient run)
};

static std::vector<ParamTensor> sgd_table() {
    std::vector<ParamTensor> t;
    size_t off = 0;
    for (const Entry& e : kTable) {
        t.push_back(ParamTensor{off, numel(e), e.weight_decay});
        off += numel(e);
    }
    return t;
}

// One step of torch.optim.SGD's single-tensor path in its order of fp32 operations (see llmc/sgd.cuh).
static void sgd_ref_step(std::vector<float>& p, std::vector<float>& buf, const std::vector<float>& grad,
                         const SgdRun& r, float scale, bool first) {
    const float one_minus_damp = (float)(1.0 - (double)r.dampening);
    std::vector<ParamTensor> table = sgd_table();
    for (const ParamTensor& t : table)
        for (size_t i = t.offset; i < t.offset + t.size; i++) {
            float g = grad[i] * scale;
            if (t.weight_decay) g = std::fma(p[i], r.weight_decay, g);
            if (r.momentum != 0.f) {
                buf[i] = first ? g : std::fma(g, one_minus_damp, buf[i] * r.momentum);
                g = r.nesterov ? std::fma(buf[i], r.momentum, g) : buf[i];
            }
            p[i] = std::fma(g, -r.lr, p[i]);
        }
}

template <class T>
static void test_sgd(const SgdRun& r, const Fixture& fx) {
    const bool lowp = !std::is_same<T, float>::value;
    const char* dt = th::dtype_name<T>();
    const std::vector<ParamTensor> table = sgd_table();
    const size_t N = total_params();
    const std::vector<float> p0 = initial_params();
    std::vector<std::vector<float>> grads;
    for (int s = 0; s < kSteps; s++) grads.push_back(gradient(s, lowp));

    std::vector<float> ref_p = p0, ref_buf(N, 0.f);
    for (int s = 0; s < kSteps; s++) sgd_ref_step(ref_p, ref_buf, grads[s], r, step_scale(s), s == 0);

    char name[200];
    snprintf(name, sizeof(name), "sgd %s %s: thread orders", r.name, dt);
    // Returns [weights (master or params) | params as float | momentum buffer].
    std::vector<float> out = th::run_orders(name, [&]() {
        th::DeviceBuffer<T> d_params(th::round_to<T>(p0)), d_grads(N);
        th::DeviceBuffer<float> d_master(lowp ? N : 1), d_scale(std::vector<float>{kDeviceScale});
        th::DeviceBuffer<float> d_buf(N, th::Fill::NaN);  // step 1 must overwrite, never read, the buffer
        th::DeviceBuffer<ParamTensor> d_tensors(table);
        if (lowp) d_master.upload(p0);
        for (int s = 0; s < kSteps; s++) {
            d_grads.upload(th::round_to<T>(grads[s]));
            sgd_update<T>(d_params.ptr, lowp ? d_master.ptr : nullptr, d_grads.ptr,
                          r.momentum != 0.f ? d_buf.ptr : nullptr, d_tensors.ptr, (int)table.size(), N, r.lr,
                          r.momentum, r.dampening, r.weight_decay, r.nesterov, kHostScales[s], s + 1, 0,
                          s >= kDeviceScaleFrom ? d_scale.ptr : nullptr);
        }
        cudaCheck(cudaDeviceSynchronize());
        std::vector<float> result = lowp ? d_master.host() : std::vector<float>();
        for (T x : d_params.host()) result.push_back(to_float(x));
        if (!lowp) result.insert(result.end(), result.begin(), result.end());
        std::vector<float> b = d_buf.host();
        result.insert(result.end(), b.begin(), b.end());
        return result;
    });
    const std::vector<float> weights(out.begin(), out.begin() + N), params(out.begin() + N, out.begin() + 2 * N),
        buf(out.begin() + 2 * N, out.end());

    // Budget 0: the same IEEE operations in the same order as torch.
    const th::Tol exact{0, 0};
    snprintf(name, sizeof(name), "sgd %s %s: weights == torch-order fp32 reference", r.name, dt);
    th::check_close(name, ref_p.data(), weights.data(), N, exact);
    if (lowp) {
        std::vector<float> rounded;
        for (float x : weights) rounded.push_back(to_float(from_float<__nv_bfloat16>(x)));
        snprintf(name, sizeof(name), "sgd %s bf16: params == master rounded to bf16", r.name);
        th::check_close(name, rounded.data(), params.data(), N, exact);
    }
    const std::vector<size_t> idx = sample_indices();
    const std::string key = std::string("sgd/") + r.name + "/" + dt + "/";
    snprintf(name, sizeof(name), "sgd %s %s: weights == torch.optim.SGD (fixture samples)", r.name, dt);
    std::vector<float> fx_w = fixture_floats(fx, key + "weights", idx.size());
    th::check_close(name, fx_w.data(), gather(weights, idx).data(), idx.size(), exact);
    auto fnv = fx.u64.find(key + "fnv");
    const size_t num_hashes = r.momentum != 0.f ? 2 : 1;
    bool have = fnv != fx.u64.end() && fnv->second.size() == num_hashes;
    uint64_t h = fnv1a64(weights);
    snprintf(name, sizeof(name), "sgd %s %s: all weights bit-identical to torch.optim.SGD (FNV-1a hash)", r.name, dt);
    th::report(have && h == fnv->second[0], name, "hash %016llx, torch %016llx", (unsigned long long)h,
               have ? (unsigned long long)fnv->second[0] : 0ull);
    if (r.momentum != 0.f) {
        snprintf(name, sizeof(name), "sgd %s %s: momentum buffer == torch-order fp32 reference", r.name, dt);
        th::check_close(name, ref_buf.data(), buf.data(), N, exact);
        snprintf(name, sizeof(name), "sgd %s %s: momentum buffer == torch.optim.SGD (fixture samples)", r.name, dt);
        std::vector<float> fx_b = fixture_floats(fx, key + "buf", idx.size());
        th::check_close(name, fx_b.data(), gather(buf, idx).data(), idx.size(), exact);
        h = fnv1a64(buf);
        snprintf(name, sizeof(name), "sgd %s %s: all momentum buffers bit-identical to torch (FNV-1a hash)", r.name, dt);
        th::report(have && h == fnv->second[1], name, "hash %016llx, torch %016llx", (unsigned long long)h,
                   have ? (unsigned long long)fnv->second[1] : 0ull);
    }
}

// ----------------------------------------------------------------------------
// Adafactor: the double reference with rounding bounds

// A quantity an fp32 implementation computes: its exact value v and a bound e on |fp32 result - v|.
// Each rounding errs by at most u|x| (u = 2^-24, round to nearest); it is counted as eps = 2^-23 = 2u
// (the project's convention, a factor 2 of margin). Products and quotients propagate the operands'
// bounds exactly (not to first order); sqrt uses |sqrt(x') - sqrt(x)| <= |x' - x| / sqrt(x).
struct Val {
    double v, e;
};
static const double kEps = th::EPS_FP32;
static Val exact(double v) { return {v, 0.0}; }
static Val rounded(double v) { return {v, kEps * std::fabs(v)}; }  // a scalar rounded to fp32 once
static Val round_once(Val x) { return {x.v, x.e + kEps * (std::fabs(x.v) + x.e)}; }
static Val mul(Val a, Val b) {
    return round_once({a.v * b.v, std::fabs(a.v) * b.e + std::fabs(b.v) * a.e + a.e * b.e});
}
static Val div(Val a, Val b) {
    double q = a.v / b.v;
    return round_once({q, (a.e + std::fabs(q) * b.e) / (std::fabs(b.v) - b.e)});
}
static Val add(Val a, Val b) { return round_once({a.v + b.v, a.e + b.e}); }
static Val fma(Val a, Val b, Val c) {
    return round_once({a.v * b.v + c.v, std::fabs(a.v) * b.e + std::fabs(b.v) * a.e + a.e * b.e + c.e});
}
static Val sqrt_(Val a) {
    double r = std::sqrt(a.v);
    return round_once({r, a.v > 0 ? a.e / r : std::sqrt(a.e)});
}
static Val rsqrt_(Val a) { return div(exact(1.0), sqrt_(a)); }  // torch's CPU rsqrt: 1 / sqrt(x)
static Val max_(Val a, Val b) { return {std::max(a.v, b.v), std::max(a.e, b.e)}; }  // max is 1-Lipschitz
// A sum of non-negative terms in which each term passes through at most `depth` roundings (the
// longest chain of its summation tree): |error| <= sum(e_i) + gamma_depth * sum(|t_i| + e_i).
static Val sum_(const std::vector<Val>& terms, double depth) {
    double v = 0, e = 0, abs_sum = 0;
    for (const Val& t : terms) {
        v += t.v;
        e += t.e;
        abs_sum += std::fabs(t.v) + t.e;
    }
    return {v, e + depth * kEps / (1 - depth * kEps) * abs_sum};
}

// The rounding chains of each reduction of tensor t: the kernel's (from its structure, see
// llmc/adafactor.cuh: they depend on t's shape and its num_blocks only), or, for torch, whose
// summation order is not specified, n for n terms (n - 1 additions in any order, plus the rounding of
// x*x inside torch.norm).
struct Depths {
    bool torch;
    // a row: each strip of 32 columns through a 5-level tree, then the strips in order
    double row(const FactoredTensor& t) const { return torch ? t.cols : CEIL_DIV(t.cols, 32) + 5; }
    // a column: a warp's rows of a tile in order, the warps in order, then the tile rows in order
    double col(const FactoredTensor& t) const {
        const size_t rows = t.rows, warps = ADAFACTOR_BLOCK_SIZE / 32;
        return torch ? rows : CEIL_DIV(std::min(rows, (size_t)ADAFACTOR_TILE_ROWS), warps) + warps +
                                  CEIL_DIV(rows, (size_t)ADAFACTOR_TILE_ROWS);
    }
    // the mean of the row statistics: a thread's rows in order, the block's two shuffle trees, the
    // blocks' sums
    double row_mean(const FactoredTensor& t) const {
        const size_t rows = t.rows;
        return torch ? rows : CEIL_DIV(rows, (size_t)t.num_blocks * ADAFACTOR_BLOCK_SIZE) + 10 + blocks(t);
    }
    // RMS(param), RMS(u): a thread's share, the block's two shuffle trees, the blocks' sums
    double elements(const FactoredTensor& t) const {
        const size_t n = (size_t)t.rows * t.cols;
        return torch ? n : CEIL_DIV(n, (size_t)t.num_blocks * ADAFACTOR_BLOCK_SIZE) + 10 + blocks(t);
    }
    // the num_blocks per-block sums: a lane's in order, then a shuffle tree
    double blocks(const FactoredTensor& t) const { return CEIL_DIV(t.num_blocks, 32) + 5; }
};

// The state of the reference: weights, first moment, second moment (the kernel's layout).
struct AdafactorRef {
    std::vector<Val> p, m, second;
};

// One Adafactor step (transformers' algorithm, see llmc/adafactor.cuh) over every tensor, in double,
// with the rounding bounds of an fp32 implementation whose reductions have depths d.
static void adafactor_ref_step(AdafactorRef& st, const AdafactorLayout& layout, const std::vector<float>& grad,
                               float scale, const AdafactorConfig& cfg, int step, const Depths& d) {
    const double beta2t = 1.0 - std::pow((double)step, cfg.decay_rate);
    const Val bt = rounded(beta2t), omb = rounded(1.0 - beta2t), eps1 = rounded(cfg.eps1);
    double rel = cfg.lr;
    if (cfg.relative_step) rel = std::min(cfg.warmup_init ? 1e-6 * step : 1e-2, 1.0 / std::sqrt((double)step));
    for (const FactoredTensor& t : layout.tensors) {
        const size_t rows = t.rows, cols = t.cols, n = rows * cols;
        std::vector<Val> g(n), sq(n), u(n);
        for (size_t k = 0; k < n; k++) {
            g[k] = mul(exact(grad[t.offset + k]), exact(scale));
            sq[k] = add(mul(g[k], g[k]), eps1);
        }
        // RMS(param) before the update, and the learning rate.
        std::vector<Val> p2(n);
        for (size_t k = 0; k < n; k++) {
            const Val& p = st.p[t.offset + k];
            p2[k] = {p.v * p.v, 2 * std::fabs(p.v) * p.e + p.e * p.e};
        }
        const Val sqrt_n = rounded(std::pow((double)n, 0.5));
        Val lr = rounded(rel);
        if (cfg.scale_parameter) {
            Val rms = div(sqrt_(sum_(p2, d.elements(t))), sqrt_n);
            Val from_rms = mul(rms, rounded(rel)), from_eps = rounded(cfg.eps2 * rel);
            lr = rms.v > cfg.eps2 ? from_rms : from_eps;
            lr.e = std::max(from_rms.e, from_eps.e);
            // Within the bound of eps2, the fp32 comparison may take the other branch.
            if (std::fabs(rms.v - cfg.eps2) <= rms.e + kEps * cfg.eps2) lr.e += std::fabs(from_rms.v - from_eps.v);
        }
        Val* second = st.second.data() + t.state_offset;
        if (t.factored) {
            for (size_t r = 0; r < rows; r++) {
                std::vector<Val> terms(sq.begin() + r * cols, sq.begin() + (r + 1) * cols);
                second[r] = fma(div(sum_(terms, d.row(t)), exact(cols)), omb, mul(second[r], bt));
            }
            for (size_t c = 0; c < cols; c++) {
                std::vector<Val> terms;
                for (size_t r = 0; r < rows; r++) terms.push_back(sq[r * cols + c]);
                second[rows + c] = fma(div(sum_(terms, d.col(t)), exact(rows)), omb, mul(second[rows + c], bt));
            }
            Val row_mean = div(sum_(std::vector<Val>(second, second + rows), d.row_mean(t)), exact(rows));
            for (size_t r = 0; r < rows; r++) {
                Val r_factor = rsqrt_(div(second[r], row_mean));
                for (size_t c = 0; c < cols; c++) u[r * cols + c] = mul(mul(r_factor, rsqrt_(second[rows + c])), g[r * cols + c]);
            }
        } else {
            for (size_t k = 0; k < n; k++) {
                second[k] = fma(sq[k], omb, mul(second[k], bt));
                u[k] = mul(rsqrt_(second[k]), g[k]);
            }
        }
        std::vector<Val> u2(n);
        for (size_t k = 0; k < n; k++) u2[k] = {u[k].v * u[k].v, 2 * std::fabs(u[k].v) * u[k].e + u[k].e * u[k].e};
        Val ratio = div(div(sqrt_(sum_(u2, d.elements(t))), sqrt_n), rounded(cfg.clip_threshold));
        Val divisor = max_(ratio, exact(1.0));
        Val neg_wd_lr = mul(rounded(-cfg.weight_decay), lr);
        for (size_t k = 0; k < n; k++) {
            const size_t i = t.offset + k;
            Val upd = mul(div(u[k], divisor), lr);
            if (cfg.use_first_moment) {
                st.m[i] = fma(upd, rounded(1.0 - cfg.beta1), mul(st.m[i], rounded(cfg.beta1)));
                upd = st.m[i];
            }
            if (t.weight_decay && cfg.weight_decay != 0) st.p[i] = fma(st.p[i], neg_wd_lr, st.p[i]);
            st.p[i] = add(st.p[i], {-upd.v, upd.e});
        }
    }
}

// ----------------------------------------------------------------------------
// Adafactor tests

struct AdafactorRun {
    const char* name;
    AdafactorConfig cfg;
    bool bf16;  // also run with bf16 parameters (the fixture has the bf16-gradient run)
};

static std::vector<std::vector<size_t>> shapes() {
    std::vector<std::vector<size_t>> s;
    for (const Entry& e : kTable) s.push_back(e.shape);
    return s;
}
static std::vector<int> decay_flags() {
    std::vector<int> f;
    for (const Entry& e : kTable) f.push_back(e.weight_decay);
    return f;
}

// Checks out[i] against the reference value ref[i].v within the sum of the given bounds.
static void check_vals(const char* name, const std::vector<float>& out, const std::vector<Val>& ref,
                       const std::vector<const std::vector<Val>*>& bounds) {
    std::vector<double> r, b;
    for (size_t i = 0; i < ref.size(); i++) {
        r.push_back(ref[i].v);
        double e = 0;
        for (const std::vector<Val>* bound : bounds) e += (*bound)[i].e;
        b.push_back(e);
    }
    th::check_budget(name, r, out, b);
}

template <class T>
static void test_adafactor(const AdafactorRun& run, const Fixture& fx) {
    const bool lowp = !std::is_same<T, float>::value;
    const char* dt = th::dtype_name<T>();
    const AdafactorLayout layout = adafactor_layout(shapes(), decay_flags());
    const size_t N = layout.num_params, S = layout.second_moment_size;
    const int num_tensors = (int)layout.tensors.size();
    const bool first_moment = run.cfg.use_first_moment;
    const std::vector<float> p0 = initial_params();
    std::vector<std::vector<float>> grads;
    for (int s = 0; s < kSteps; s++) grads.push_back(gradient(s, lowp));

    // References: the same values, with the kernel's rounding chains and with any order (torch's).
    AdafactorRef ours, torch;
    for (float x : p0) ours.p.push_back(exact(x));
    ours.m.assign(N, exact(0));
    ours.second.assign(S, exact(0));
    torch = ours;
    const Depths d_ours{false}, d_torch{true};
    for (int s = 0; s < kSteps; s++) {
        adafactor_ref_step(ours, layout, grads[s], step_scale(s), run.cfg, s + 1, d_ours);
        adafactor_ref_step(torch, layout, grads[s], step_scale(s), run.cfg, s + 1, d_torch);
    }

    char name[200];
    snprintf(name, sizeof(name), "adafactor %s %s: thread orders", run.name, dt);
    // Returns [weights | params as float | second moment | first moment].
    std::vector<float> out = th::run_orders(name, [&]() {
        th::DeviceBuffer<T> d_params(th::round_to<T>(p0)), d_grads(N);
        th::DeviceBuffer<float> d_master(lowp ? N : 1), d_scale(std::vector<float>{kDeviceScale});
        th::DeviceBuffer<float> d_second(S, th::Fill::Zero), d_exp_avg(first_moment ? N : 1, th::Fill::Zero);
        th::DeviceBuffer<float> d_scratch(layout.scratch_size, th::Fill::NaN);  // nothing may rely on its content
        th::DeviceBuffer<FactoredTensor> d_tensors(layout.tensors);
        if (lowp) d_master.upload(p0);
        for (int s = 0; s < kSteps; s++) {
            d_grads.upload(th::round_to<T>(grads[s]));
            adafactor_update<T>(d_params.ptr, lowp ? d_master.ptr : nullptr, d_grads.ptr,
                                first_moment ? d_exp_avg.ptr : nullptr, d_second.ptr, d_scratch.ptr, d_tensors.ptr,
                                num_tensors, N, run.cfg, kHostScales[s], s + 1, 0,
                                s >= kDeviceScaleFrom ? d_scale.ptr : nullptr);
        }
        cudaCheck(cudaDeviceSynchronize());
        std::vector<float> result = lowp ? d_master.host() : std::vector<float>();
        for (T x : d_params.host()) result.push_back(to_float(x));
        if (!lowp) result.insert(result.end(), result.begin(), result.end());
        std::vector<float> second = d_second.host(), m = first_moment ? d_exp_avg.host() : std::vector<float>();
        result.insert(result.end(), second.begin(), second.end());
        result.insert(result.end(), m.begin(), m.end());
        return result;
    });
    const std::vector<float> weights(out.begin(), out.begin() + N), params(out.begin() + N, out.begin() + 2 * N),
        second(out.begin() + 2 * N, out.begin() + 2 * N + S), m(out.begin() + 2 * N + S, out.end());

    // Kernel vs double, within the kernel's own rounding bound.
    snprintf(name, sizeof(name), "adafactor %s %s: weights vs double (kernel's rounding bound)", run.name, dt);
    check_vals(name, weights, ours.p, {&ours.p});
    snprintf(name, sizeof(name), "adafactor %s %s: second moment vs double (kernel's rounding bound)", run.name, dt);
    check_vals(name, second, ours.second, {&ours.second});
    if (first_moment) {
        snprintf(name, sizeof(name), "adafactor %s %s: first moment vs double (kernel's rounding bound)", run.name, dt);
        check_vals(name, m, ours.m, {&ours.m});
    }
    if (lowp) {
        std::vector<float> rounded_w;
        for (float x : weights) rounded_w.push_back(to_float(from_float<__nv_bfloat16>(x)));
        snprintf(name, sizeof(name), "adafactor %s bf16: params == master rounded to bf16", run.name);
        th::check_close(name, rounded_w.data(), params.data(), N, th::Tol{0, 0});
    }

    // transformers vs double (any summation order), and kernel vs transformers (both bounds).
    const std::vector<size_t> idx = sample_indices();
    const std::string key = std::string("adafactor/") + run.name + "/" + dt + "/";
    const std::vector<Val> ref_w = gather(ours.p, idx), bound_w_ours = ref_w, bound_w_torch = gather(torch.p, idx);
    const std::vector<float> fx_w = fixture_floats(fx, key + "weights", idx.size());
    const std::vector<float> fx_second = fixture_floats(fx, key + "second_moment", S);
    snprintf(name, sizeof(name), "adafactor %s %s: transformers' weights vs double (any-order bound)", run.name, dt);
    check_vals(name, fx_w, ref_w, {&bound_w_torch});
    snprintf(name, sizeof(name), "adafactor %s %s: transformers' second moment vs double (any-order bound)", run.name, dt);
    check_vals(name, fx_second, ours.second, {&torch.second});
    snprintf(name, sizeof(name), "adafactor %s %s: weights vs transformers (fixture samples, both bounds)", run.name, dt);
    const std::vector<float> w_sampled = gather(weights, idx);
    std::vector<Val> fx_w_vals;
    for (float x : fx_w) fx_w_vals.push_back(exact(x));
    check_vals(name, w_sampled, fx_w_vals, {&bound_w_ours, &bound_w_torch});
    std::vector<Val> fx_second_vals;
    for (float x : fx_second) fx_second_vals.push_back(exact(x));
    snprintf(name, sizeof(name), "adafactor %s %s: second moment vs transformers (both bounds)", run.name, dt);
    check_vals(name, second, fx_second_vals, {&ours.second, &torch.second});
    // The 1-D tensors' second moment involves no reduction: the same operations in the same order as
    // transformers, so the same bits.
    std::vector<float> vec_out, vec_fx;
    for (const FactoredTensor& t : layout.tensors)
        for (size_t k = 0; !t.factored && k < (size_t)t.cols; k++) {
            vec_out.push_back(second[t.state_offset + k]);
            vec_fx.push_back(fx_second[t.state_offset + k]);
        }
    snprintf(name, sizeof(name), "adafactor %s %s: 1-D second moments == transformers (no reduction: budget 0)",
             run.name, dt);
    th::check_close(name, vec_fx.data(), vec_out.data(), vec_out.size(), th::Tol{0, 0});
    size_t same_w = 0, same_s = 0;
    for (size_t k = 0; k < idx.size(); k++) same_w += w_sampled[k] == fx_w[k];
    for (size_t k = 0; k < S; k++) same_s += second[k] == fx_second[k];
    printf("  info: bit-identical to transformers: %zu of %zu sampled weights, %zu of %zu second-moment values\n",
           same_w, idx.size(), same_s, S);
    if (first_moment) {
        const std::vector<float> fx_m = fixture_floats(fx, key + "exp_avg", idx.size());
        const std::vector<Val> ref_m = gather(ours.m, idx), bound_m_torch = gather(torch.m, idx);
        snprintf(name, sizeof(name), "adafactor %s %s: transformers' first moment vs double (any-order bound)", run.name, dt);
        check_vals(name, fx_m, ref_m, {&bound_m_torch});
        std::vector<Val> fx_m_vals;
        for (float x : fx_m) fx_m_vals.push_back(exact(x));
        snprintf(name, sizeof(name), "adafactor %s %s: first moment vs transformers (fixture samples, both bounds)",
                 run.name, dt);
        check_vals(name, gather(m, idx), fx_m_vals, {&ref_m, &bound_m_torch});
    }
}

// The state bytes of the table: O(rows + cols) per matrix, n per vector, N more with a first moment.
static void test_adafactor_layout() {
    const AdafactorLayout layout = adafactor_layout(shapes(), decay_flags());
    size_t want_second = 0;
    for (const Entry& e : kTable) want_second += e.shape.size() == 2 ? e.shape[0] + e.shape[1] : e.shape[0];
    const size_t N = total_params();
    const size_t bytes = adafactor_state_bytes(shapes(), false), bytes_m = adafactor_state_bytes(shapes(), true);
    th::report(layout.num_params == N && layout.second_moment_size == want_second && bytes == 4 * want_second &&
                   bytes_m == 4 * (want_second + N),
               "adafactor layout: state bytes for the table", "N=%zu second moment %zu floats (%zu bytes, %zu with "
               "beta1), scratch %zu floats", N, layout.second_moment_size, bytes, bytes_m, layout.scratch_size);
}

// ----------------------------------------------------------------------------
// Errors a caller can make: each stops with a message naming the constraint.

static void test_errors() {
    auto expect_exit = [](const char* name, const char* expect, auto body) {
        th::ChildOutput child = th::run_in_child(body);
        bool ok = WIFEXITED(child.status) && WEXITSTATUS(child.status) == EXIT_FAILURE &&
                  child.text.find(expect) != std::string::npos;
        while (!child.text.empty() && child.text.back() == '\n') child.text.pop_back();
        th::report(ok, name, "stderr: %s", child.text.c_str());
    };
    expect_exit("sgd_update: Nesterov without momentum stops", "Nesterov momentum requires momentum > 0", [] {
        sgd_update<float>(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1, 0.1f, 0.f, 0.f, 0.f, true, 1.f, 1, 0);
    });
    expect_exit("sgd_update: momentum without a buffer stops", "needs a momentum buffer", [] {
        sgd_update<float>(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1, 0.1f, 0.9f, 0.f, 0.f, false, 1.f, 1, 0);
    });
    expect_exit("adafactor_layout: a 3-D shape stops", "must be 1-D or 2-D", [] {
        adafactor_layout({{2, 3, 4}}, {1});
    });
    expect_exit("adafactor_update: an explicit lr with relative_step stops", "cannot be combined with relative_step", [] {
        AdafactorConfig cfg;
        cfg.lr = 1e-3;
        adafactor_update<float>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1, cfg, 1.f, 1, 0);
    });
}

int main() {
    const Fixture sgd_fx = load_fixture(kSgdFixture);
    const SgdRun sgd_runs[] = {
        {"momentum", 0.05f, 0.9f, 0.f, false, 0.01f, true},
        {"nesterov", 0.05f, 0.9f, 0.f, true, 0.01f, true},
        {"plain", 0.1f, 0.f, 0.f, false, 0.1f, true},
        {"dampening", 0.05f, 0.9f, 0.25f, false, 0.01f, false},
    };
    for (const SgdRun& r : sgd_runs) {
        test_sgd<float>(r, sgd_fx);
        if (r.bf16) test_sgd<__nv_bfloat16>(r, sgd_fx);
    }

    const Fixture ada_fx = load_fixture(kAdafactorFixture);
    AdafactorRun defaults{"default", AdafactorConfig(), true};
    AdafactorRun explicit_lr{"lr-beta1-wd", AdafactorConfig(), true};
    explicit_lr.cfg.lr = 1e-2;
    explicit_lr.cfg.relative_step = false;
    explicit_lr.cfg.scale_parameter = false;
    explicit_lr.cfg.use_first_moment = true;
    explicit_lr.cfg.beta1 = 0.9;
    explicit_lr.cfg.weight_decay = 0.1;
    AdafactorRun warmup{"warmup", AdafactorConfig(), false};
    warmup.cfg.warmup_init = true;
    for (const AdafactorRun* r : {&defaults, &explicit_lr, &warmup}) {
        test_adafactor<float>(*r, ada_fx);
        if (r->bf16) test_adafactor<__nv_bfloat16>(*r, ada_fx);
    }
    test_adafactor_layout();
    test_errors();
    return th::finish();
}
