// test/test_adamw8bit.cu — tests llmc/adamw8bit.cuh: the dynamic quantization maps, the block-wise
// quantize/dequantize error against the bound the scheme promises, the fused 8-bit AdamW update
// against a host reference doing the same dequantize -> fp32 AdamW -> requantize (bit-identical,
// under three thread orders, where no value is subnormal: a GPU build flushes those, llmc/adamw.cuh),
// the state planner and launcher checks, and trajectories on a noisy quadratic against fp32 AdamW
// (llmc/adamw.cuh), bounded from the quantization error.
#include "../llmc/adamw8bit.cuh"
#include "harness.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

// ----------------------------------------------------------------------------
// Helpers

// x rounded to the storage type T (nearest even), as a float.
template <class T>
static float round_to_T(float x) { return to_float(from_float<T>(x)); }

// Deterministic random numbers: uniform in (0, 1), standard normal (Box-Muller), standard Cauchy.
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
    double uniform() {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        return ((s >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    }
    double normal() { return std::sqrt(-2 * std::log(uniform())) * std::cos(2 * M_PI * uniform()); }
    double cauchy() { return std::tan(M_PI * (uniform() - 0.5)); }
};

// The code of the map value nearest to n (ties to the lower), by std::upper_bound: written apart
// from the kernel's search, for the host reference.
static uint8_t nearest_code(const float* map, float n) {
    int i = (int)(std::upper_bound(map, map + ADAMW8BIT_MAP_SIZE, n) - map) - 1;
    if (i < 0) i = 0;
    if (i < ADAMW8BIT_MAP_SIZE - 1 && map[i + 1] - n < n - map[i]) i++;
    return (uint8_t)i;
}
// The same for a second moment: a positive value never takes the code of 0 (code 1 instead).
static uint8_t nearest_code_v(const float* map, float n) {
    uint8_t c = nearest_code(map, n);
    return c == 0 && n > 0 ? 1 : c;
}

// Half the widest map gap next to code c: |x / absmax - map[c]| is at most this when c is the
// nearest code to x / absmax.
static double half_gap_at(const float* map, int c) {
    double left = c > 0 ? (double)map[c] - map[c - 1] : 0;
    double right = c < ADAMW8BIT_MAP_SIZE - 1 ? (double)map[c + 1] - map[c] : 0;
    return std::max(left, right) / 2;
}

// The fp32 rounding allowance of one quantize/dequantize round trip, relative to absmax: n = x /
// absmax and map[c] * absmax are each rounded once (2^-24 relative, |n|, |map[c]| <= 1), so
// together they move the result by at most 2 * 2^-24 * absmax = EPS_FP32 * absmax.
static const double ROUNDTRIP_ROUNDING = th::EPS_FP32;

// ----------------------------------------------------------------------------
// Maps

static void test_maps() {
    for (bool is_signed : {true, false}) {
        const std::array<float, ADAMW8BIT_MAP_SIZE>& map = adamw8bit_map(is_signed);
        const char* kind = is_signed ? "signed" : "unsigned";
        bool sorted = true;
        for (int k = 1; k < ADAMW8BIT_MAP_SIZE; k++) sorted = sorted && map[k - 1] < map[k];
        bool has_zero = std::find(map.begin(), map.end(), 0.f) != map.end();
        char name[96];
        snprintf(name, sizeof(name), "map %s: 256 strictly increasing (distinct) values", kind);
        th::report(sorted, name, "first %.9g, last %.9g", map[0], map[255]);
        snprintf(name, sizeof(name), "map %s: covers [%s, 1] and holds 0", kind, is_signed ? "-1" : "0");
        th::report(map[0] == (is_signed ? -1.f : 0.f) && map[255] == 1.f && has_zero, name,
                   "min %.9g max %.9g zero %s", map[0], map[255], has_zero ? "yes" : "no");
        // Dynamic: every decade down to 1e-6 (both signs for the signed map) holds map values, the
        // points per decade halve going down, and the absolute gap is largest in the top decade
        // (0.9 / 64 signed, 0.9 / 128 unsigned).
        bool decades = true;
        int prev_count = 1 << 30;
        for (int E = 0; E < 7; E++) {
            double lo = std::pow(10.0, -(E + 1)), hi = std::pow(10.0, -E);
            int count = 0, count_neg = 0;
            for (float x : map) {
                count += x > lo * (1 + 1e-6) && x <= hi * (1 + 1e-6);
                count_neg += -x > lo * (1 + 1e-6) && -x <= hi * (1 + 1e-6);
            }
            const int want = (is_signed ? 64 : 128) >> E;
            decades = decades && count == want && count < prev_count && (!is_signed || count_neg == want);
            prev_count = count;
        }
        double max_gap = 0;
        for (int k = 1; k < ADAMW8BIT_MAP_SIZE; k++) max_gap = std::max(max_gap, (double)map[k] - map[k - 1]);
        snprintf(name, sizeof(name), "map %s: dynamic (64..1 or 128..2 values per decade down to 1e-6)", kind);
        th::report(decades && std::fabs(max_gap - 0.9 / (is_signed ? 64 : 128)) < 1e-7, name,
                   "largest gap %.6g, smallest positive %.3g", max_gap, *std::upper_bound(map.begin(), map.end(), 0.f));
    }
}

// ----------------------------------------------------------------------------
// Quantize / dequantize round trip

// Block b (one warp) quantizes x[256 b, 256 b + 256) as the update does, 8 elements per lane, with
// the production warp max, quantize (the second moment's variant when !is_signed) and dequantize:
// absmax[b] = max |x|, codes and the dequantized values out.
__global__ void roundtrip_kernel(float* out, uint8_t* codes, float* absmax, const float* x, size_t n,
                                 const float* map, int is_signed) {
    float xr[ADAMW8BIT_PER_LANE], x_max = 0.f;
    for (int r = 0; r < ADAMW8BIT_PER_LANE; r++) {
        const size_t i = (size_t)blockIdx.x * ADAMW8BIT_BLOCK + r * 32 + threadIdx.x;
        xr[r] = i < n ? x[i] : 0.f;
        x_max = fmaxf(x_max, fabsf(xr[r]));
    }
    const float a = adamw8bit_warp_max(x_max, 0.f).x;
    for (int r = 0; r < ADAMW8BIT_PER_LANE; r++) {
        const size_t i = (size_t)blockIdx.x * ADAMW8BIT_BLOCK + r * 32 + threadIdx.x;
        if (i >= n) break;
        uint8_t c = is_signed ? adamw8bit_quantize(map, xr[r], a) : adamw8bit_quantize_v(map, xr[r], a);
        codes[i] = c;
        out[i] = adamw8bit_dequantize(map, c, a);
    }
    if (threadIdx.x == 0) absmax[blockIdx.x] = a;
}

// Quantizes x (one distribution) with the signed or unsigned map and checks every element's error
// against absmax * (half the gap between the map values around x / absmax) + the rounding of the
// round trip, the absmax (exact max |x|), the largest element (exact: +-1 are map values), and
// that every code is the nearest one. The exception: a positive second moment below the smallest
// positive map value rounds up to it, so its error is at most absmax * that value (1e-7).
static void test_roundtrip(const char* dist, bool is_signed, const std::vector<float>& x) {
    const size_t n = x.size(), blocks = CEIL_DIV(n, (size_t)ADAMW8BIT_BLOCK);
    const float* map = adamw8bit_map(is_signed).data();
    char name[128];
    snprintf(name, sizeof(name), "roundtrip %s %s: thread orders", is_signed ? "signed" : "unsigned", dist);
    std::vector<float> got = th::run_orders(name, [&]() {
        th::DeviceBuffer<float> d_x(x), d_out(n, th::Fill::NaN), d_absmax(blocks, th::Fill::NaN),
            d_map(std::vector<float>(map, map + ADAMW8BIT_MAP_SIZE));
        th::DeviceBuffer<uint8_t> d_codes(n);
        cudaCheck(launch_kernel(roundtrip_kernel, dim3((unsigned)blocks), dim3(32), 0, 0, d_out.ptr,
                                d_codes.ptr, d_absmax.ptr, d_x.ptr, n, d_map.ptr, (int)is_signed));
        std::vector<float> r = d_out.host(), a = d_absmax.host();
        for (uint8_t c : d_codes.host()) r.push_back((float)c);
        r.insert(r.end(), a.begin(), a.end());
        return r;
    });
    const float* out = got.data();
    const float* codes = got.data() + n;
    const float* absmax = got.data() + 2 * n;

    size_t bad_absmax = 0, bad_max_elem = 0, bad_nearest = 0;
    std::vector<double> ref(n), budget(n);
    double worst_rel_gap = 0;
    for (size_t b = 0; b < blocks; b++) {
        const size_t begin = b * ADAMW8BIT_BLOCK, end = std::min(n, begin + ADAMW8BIT_BLOCK);
        float a = 0;
        for (size_t i = begin; i < end; i++) a = std::max(a, std::fabs(x[i]));
        bad_absmax += absmax[b] != a;
        for (size_t i = begin; i < end; i++) {
            ref[i] = x[i];
            // The map values around t = x / absmax (in double: the gap the scheme promises).
            const double t = a > 0 ? (double)x[i] / a : 0;
            const float* up =
                std::lower_bound(map, map + ADAMW8BIT_MAP_SIZE, t, [](float m, double v) { return m < v; });
            const double hi = *up, lo = *up == t ? t : *(up - 1);
            const bool rounds_up = !is_signed && t > 0 && lo == 0;
            budget[i] = a * ((rounds_up ? hi : (hi - lo) / 2) + ROUNDTRIP_ROUNDING);
            if (std::fabs(x[i]) == a) bad_max_elem += out[i] != x[i];
            const float nn = a > 0 ? x[i] / a : 0.f;
            bad_nearest += (int)codes[i] != (is_signed ? nearest_code(map, nn) : nearest_code_v(map, nn));
            if (a > 0) worst_rel_gap = std::max(worst_rel_gap, (hi - lo) / 2);
        }
    }
    snprintf(name, sizeof(name), "roundtrip %s %s: absmax == max |x| per block", is_signed ? "signed" : "unsigned",
             dist);
    th::report(bad_absmax == 0, name, "blocks=%zu bad=%zu", blocks, bad_absmax);
    snprintf(name, sizeof(name), "roundtrip %s %s: |x| == absmax stored exactly, codes nearest",
             is_signed ? "signed" : "unsigned", dist);
    th::report(bad_max_elem == 0 && bad_nearest == 0, name, "bad max=%zu bad nearest=%zu", bad_max_elem, bad_nearest);
    std::vector<float> outv(out, out + n);
    snprintf(name, sizeof(name), "roundtrip %s %s: |err| <= absmax * (gap/2 + 2^-23)%s",
             is_signed ? "signed" : "unsigned", dist, is_signed ? "" : " (v < 1e-7 absmax: <= 1e-7 absmax)");
    th::check_budget(name, ref, outv, budget);
}

static void test_roundtrips() {
    const size_t n = 40 * ADAMW8BIT_BLOCK + 77;  // the last block is partial
    Rng rng(5);
    std::vector<float> normal(n), cauchy(n), zero_blocks(n), outlier(n), zeros(n, 0.f);
    for (size_t i = 0; i < n; i++) {
        normal[i] = (float)rng.normal();
        cauchy[i] = (float)rng.cauchy();
        zero_blocks[i] = (i / ADAMW8BIT_BLOCK) % 3 == 1 ? 0.f : (float)rng.normal();
        outlier[i] = (float)(1e-3 * rng.normal());
    }
    // One outlier 10^7 times the others' scale per block, at a random position and sign.
    for (size_t b = 0; b * ADAMW8BIT_BLOCK < n; b++) {
        size_t at = b * ADAMW8BIT_BLOCK + (size_t)(rng.uniform() * ADAMW8BIT_BLOCK);
        if (at < n) outlier[at] = rng.uniform() < 0.5 ? 1e4f : -1e4f;
    }
    struct Dist {
        const char* name;
        const std::vector<float>* x;
    };
    for (Dist d : {Dist{"normal", &normal}, Dist{"cauchy", &cauchy}, Dist{"zero-blocks", &zero_blocks},
                   Dist{"outlier", &outlier}, Dist{"all-zero", &zeros}}) {
        test_roundtrip(d.name, true, *d.x);
        // Second-moment-like data for the unsigned map: squares (twice the dynamic range).
        std::vector<float> sq(n);
        for (size_t i = 0; i < n; i++) sq[i] = (*d.x)[i] * (*d.x)[i];
        test_roundtrip(d.name, false, sq);
    }
}

// ----------------------------------------------------------------------------
// The fused update against a host reference

struct Hyper {
    float lr, beta1, beta2, eps, weight_decay;
};

// The optimizer state on the host, section by section as adamw8bit_plan lays it out.
struct HostState {
    std::vector<float> m32, v32, m_absmax, v_absmax;
    std::vector<uint8_t> m_codes, v_codes;
    explicit HostState(const AdamW8bitLayout& L)
        : m32(L.num_fp32, 0.f), v32(L.num_fp32, 0.f), m_absmax(L.num_absmax, 0.f), v_absmax(L.num_absmax, 0.f),
          m_codes(L.num_quantized, 0), v_codes(L.num_quantized, 0) {}
};

// Copies a host state into the sections of a device state allocation.
static void upload_state(unsigned char* buffer, const AdamW8bitLayout& L, const HostState& h) {
    auto put = [&](size_t at, const void* src, size_t bytes) {
        if (bytes) cudaCheck(cudaMemcpy(buffer + at, src, bytes, cudaMemcpyHostToDevice));
    };
    put(L.m32_at, h.m32.data(), h.m32.size() * 4);
    put(L.v32_at, h.v32.data(), h.v32.size() * 4);
    put(L.m_absmax_at, h.m_absmax.data(), h.m_absmax.size() * 4);
    put(L.v_absmax_at, h.v_absmax.data(), h.v_absmax.size() * 4);
    put(L.m_codes_at, h.m_codes.data(), h.m_codes.size());
    put(L.v_codes_at, h.v_codes.data(), h.v_codes.size());
}

// The host state held by a device state allocation.
static HostState download_state(const unsigned char* buffer, const AdamW8bitLayout& L) {
    HostState h(L);
    auto get = [&](void* dst, size_t at, size_t bytes) {
        if (bytes) cudaCheck(cudaMemcpy(dst, buffer + at, bytes, cudaMemcpyDeviceToHost));
    };
    get(h.m32.data(), L.m32_at, h.m32.size() * 4);
    get(h.v32.data(), L.v32_at, h.v32.size() * 4);
    get(h.m_absmax.data(), L.m_absmax_at, h.m_absmax.size() * 4);
    get(h.v_absmax.data(), L.v_absmax_at, h.v_absmax.size() * 4);
    get(h.m_codes.data(), L.m_codes_at, h.m_codes.size());
    get(h.v_codes.data(), L.v_codes_at, h.v_codes.size());
    return h;
}

// One AdamW element update in torch's order of fp32 operations (llmc/adamw.cuh states the torch code).
struct RefCoef {
    float decay, w1, beta2, w2, bc2_sqrt, eps, neg_step;
};
static RefCoef ref_coef(const Hyper& h, int step) {
    RefCoef c;
    c.decay = (float)(1.0 - (double)h.lr * (double)h.weight_decay);
    c.w1 = (float)(1.0 - (double)h.beta1);
    c.beta2 = h.beta2;
    c.w2 = (float)(1.0 - (double)h.beta2);
    c.bc2_sqrt = (float)std::sqrt(1.0 - std::pow((double)h.beta2, (double)step));
    c.eps = h.eps;
    c.neg_step = (float)(-((double)h.lr / (1.0 - std::pow((double)h.beta1, (double)step))));
    return c;
}
static void ref_element(float& p, float& m, float& v, float g, bool decay, const RefCoef& c) {
    if (decay) p = p * c.decay;
    m = std::fma(c.w1, g - m, m);
    v = v * c.beta2;
    v = v + (c.w2 * g) * g;
    float denom = std::sqrt(v) / c.bc2_sqrt;
    denom = denom + c.eps;
    p = p + (c.neg_step * m) / denom;
}

// One 8-bit AdamW step on the host: per quantization block dequantize, update in fp32, take the
// new absmax, requantize; small tensors update their fp32 moments. p are the fp32 weights, grad the
// gradients as the kernel reads them (rounded to T), scale the total gradient scale.
static void ref_step(std::vector<float>& p, HostState& st, const std::vector<float>& grad,
                     const std::vector<ParamTensor>& tensors, const AdamW8bitLayout& L, const Hyper& h, float scale,
                     int step) {
    const RefCoef c = ref_coef(h, step);
    const float* smap = adamw8bit_map(true).data();
    const float* umap = adamw8bit_map(false).data();
    for (size_t k = 0; k < tensors.size(); k++) {
        const ParamTensor& t = tensors[k];
        const AdamW8bitSlot& s = L.slots[k];
        if (!s.quantized) {
            for (size_t i = 0; i < t.size; i++)
                ref_element(p[t.offset + i], st.m32[s.state_offset + i], st.v32[s.state_offset + i],
                            grad[t.offset + i] * scale, t.weight_decay, c);
            continue;
        }
        for (size_t b = 0; b * ADAMW8BIT_BLOCK < t.size; b++) {
            const size_t begin = b * ADAMW8BIT_BLOCK, end = std::min(t.size, begin + ADAMW8BIT_BLOCK);
            float& am = st.m_absmax[s.absmax_offset + b];
            float& av = st.v_absmax[s.absmax_offset + b];
            float m[ADAMW8BIT_BLOCK], v[ADAMW8BIT_BLOCK], new_am = 0, new_av = 0;
            for (size_t i = begin; i < end; i++) {
                const size_t e = s.state_offset + i;
                float& mi = m[i - begin];
                float& vi = v[i - begin];
                mi = smap[st.m_codes[e]] * am;
                vi = umap[st.v_codes[e]] * av;
                ref_element(p[t.offset + i], mi, vi, grad[t.offset + i] * scale, t.weight_decay, c);
                new_am = std::max(new_am, std::fabs(mi));
                new_av = std::max(new_av, vi);
            }
            for (size_t i = begin; i < end; i++) {
                const size_t e = s.state_offset + i;
                st.m_codes[e] = nearest_code(smap, new_am > 0 ? m[i - begin] / new_am : 0.f);
                st.v_codes[e] = nearest_code_v(umap, new_av > 0 ? v[i - begin] / new_av : 0.f);
            }
            am = new_am;
            av = new_av;
        }
    }
}

// One configuration of the fused-update test.
struct Case {
    const char* name;
    std::vector<size_t> sizes;
    std::vector<int> decay_flags;
    Hyper h;
    int num_steps;
    std::vector<float> grad_scales;
    int device_scale_from;  // from this step index (0-based) on, a device-side scale is passed too
    float device_scale;
    bool fresh_state;  // zero state (a run from step 1) or random codes, absmax and fp32 moments
};

template <class T>
static void test_update(const Case& c) {
    const bool lowp = !std::is_same<T, float>::value;
    std::vector<ParamTensor> tensors;
    size_t N = 0;
    for (size_t k = 0; k < c.sizes.size(); k++) {
        tensors.push_back(ParamTensor{N, c.sizes[k], c.decay_flags[k]});
        N += c.sizes[k];
    }
    const AdamW8bitLayout L = adamw8bit_plan(tensors);

    // Initial weights, state and one gradient per step (rounded to T where T stores them).
    std::vector<float> p0(N);
    th::fill_uniform(p0.data(), N, 1, -1.f, 1.f);
    HostState s0(L);
    if (!c.fresh_state) {
        Rng rng(9);
        for (float& x : s0.m32) x = (float)(0.1 * rng.normal());
        for (float& x : s0.v32) x = (float)(0.01 * rng.uniform());
        for (size_t b = 0; b < L.num_absmax; b++) {
            // Every seventh block all-zero (absmax 0), the others at scales over four decades.
            s0.m_absmax[b] = b % 7 == 3 ? 0.f : (float)(0.1 * std::pow(10.0, -4 * rng.uniform()));
            s0.v_absmax[b] = b % 7 == 3 ? 0.f : (float)(0.01 * std::pow(10.0, -4 * rng.uniform()));
        }
        for (uint8_t& x : s0.m_codes) x = (uint8_t)(rng.uniform() * 256);
        for (uint8_t& x : s0.v_codes) x = (uint8_t)(rng.uniform() * 256);
    }
    if (lowp)
        for (float& x : p0) x = round_to_T<T>(x);  // so params start equal to the master weights
    std::vector<std::vector<float>> grads(c.num_steps, std::vector<float>(N));
    for (int s = 0; s < c.num_steps; s++) {
        th::fill_uniform(grads[s].data(), N, 100 + s, -1.f, 1.f);
        if (lowp)
            for (float& g : grads[s]) g = round_to_T<T>(g);
    }

    // The host reference.
    std::vector<float> rp = p0;
    HostState rs = s0;
    for (int s = 0; s < c.num_steps; s++) {
        float scale = c.grad_scales[s] * (s >= c.device_scale_from ? c.device_scale : 1.f);
        ref_step(rp, rs, grads[s], tensors, L, c.h, scale, s + 1);
    }

    // The kernel, under three thread orders: [params as float, master, the state bytes].
    char name[160];
    char tn[32];
    snprintf(tn, sizeof(tn), "%s%s", th::dtype_name<T>(), lowp ? "+master" : "");
    snprintf(name, sizeof(name), "adamw8bit %s %s: thread orders", c.name, tn);
    std::vector<float> out = th::run_orders(name, [&]() {
        th::DeviceBuffer<T> d_params(th::round_to<T>(p0)), d_grads(N);
        th::DeviceBuffer<float> d_master(lowp ? N : 1), d_scale(std::vector<float>{c.device_scale});
        th::DeviceBuffer<ParamTensor> d_tensors(tensors);
        th::DeviceBuffer<unsigned char> d_state(L.total_bytes, th::Fill::NaN);
        if (lowp) d_master.upload(p0);
        AdamW8bitState state = adamw8bit_init(d_state.ptr, L);
        upload_state(d_state.ptr, L, s0);
        for (int s = 0; s < c.num_steps; s++) {
            d_grads.upload(th::round_to<T>(grads[s]));
            adamw8bit_update<T>(d_params.ptr, lowp ? d_master.ptr : nullptr, d_grads.ptr, state, d_tensors.ptr,
                                (int)tensors.size(), N, c.h.lr, c.h.beta1, c.h.beta2, c.h.eps, c.h.weight_decay,
                                c.grad_scales[s], s + 1, 0, s >= c.device_scale_from ? d_scale.ptr : nullptr);
        }
        cudaCheck(cudaDeviceSynchronize());
        std::vector<float> r;
        for (T x : d_params.host()) r.push_back(to_float(x));
        std::vector<float> master = lowp ? d_master.host() : std::vector<float>(N, 0.f);
        r.insert(r.end(), master.begin(), master.end());
        std::vector<unsigned char> bytes = d_state.host();
        bytes.resize(CEIL_DIV(bytes.size(), (size_t)4) * 4, 0);
        std::vector<float> as_floats(bytes.size() / 4);
        memcpy(as_floats.data(), bytes.data(), bytes.size());
        r.insert(r.end(), as_floats.begin(), as_floats.end());
        return r;
    });
    std::vector<unsigned char> state_bytes(L.total_bytes);
    memcpy(state_bytes.data(), out.data() + 2 * N, L.total_bytes);
    th::DeviceBuffer<unsigned char> d_copy(state_bytes);
    HostState ks = download_state(d_copy.ptr, L);

    // Same operations in the same order: every bit must match.
    const float* o_weights = lowp ? out.data() + N : out.data();
    snprintf(name, sizeof(name), "adamw8bit %s %s: weights == reference", c.name, tn);
    th::check_bitwise(name, rp.data(), o_weights, N * 4);
    if (lowp) {
        std::vector<float> rp_T(N);
        for (size_t i = 0; i < N; i++) rp_T[i] = round_to_T<T>(rp[i]);
        snprintf(name, sizeof(name), "adamw8bit %s %s: params == weights rounded to %s", c.name, tn,
                 th::dtype_name<T>());
        th::check_bitwise(name, rp_T.data(), out.data(), N * 4);
    }
    snprintf(name, sizeof(name), "adamw8bit %s %s: m codes, v codes == reference", c.name, tn);
    th::report(ks.m_codes == rs.m_codes && ks.v_codes == rs.v_codes, name, "%zu quantized elements",
               L.num_quantized);
    snprintf(name, sizeof(name), "adamw8bit %s %s: m absmax, v absmax == reference", c.name, tn);
    th::report(!memcmp(ks.m_absmax.data(), rs.m_absmax.data(), L.num_absmax * 4) &&
                   !memcmp(ks.v_absmax.data(), rs.v_absmax.data(), L.num_absmax * 4),
               name, "%zu blocks", L.num_absmax);
    snprintf(name, sizeof(name), "adamw8bit %s %s: fp32 m, v of small tensors == reference", c.name, tn);
    th::report(!memcmp(ks.m32.data(), rs.m32.data(), L.num_fp32 * 4) &&
                   !memcmp(ks.v32.data(), rs.v32.data(), L.num_fp32 * 4),
               name, "%zu elements", L.num_fp32);
}

// ----------------------------------------------------------------------------
// Planner and launcher checks

// The GPT-2 124M parameter table: llm.c's 16 tensors with the layers stacked (what train_gpt2.cu
// passes), or one tensor per layer and kind (torch's parameters, which bitsandbytes sees).
static std::vector<ParamTensor> gpt2_tensors(bool stacked) {
    const size_t V = 50304, maxT = 1024, L = 12, C = 768;
    std::vector<std::pair<size_t, int>> sizes = {{V * C, 1}, {maxT * C, 1}};
    const std::pair<size_t, int> layer[12] = {{C, 0}, {C, 0}, {3 * C * C, 1}, {3 * C, 0}, {C * C, 1}, {C, 0},
                                              {C, 0}, {C, 0}, {4 * C * C, 1}, {4 * C, 0}, {4 * C * C, 1}, {C, 0}};
    if (stacked)
        for (const auto& kind : layer) sizes.push_back({L * kind.first, kind.second});
    else
        for (size_t l = 0; l < L; l++)
            for (const auto& kind : layer) sizes.push_back(kind);
    sizes.push_back({C, 0});
    sizes.push_back({C, 0});
    std::vector<ParamTensor> t;
    size_t N = 0;
    for (const auto& s : sizes) {
        t.push_back(ParamTensor{N, s.first, s.second});
        N += s.first;
    }
    return t;
}

static void test_plan() {
    for (bool stacked : {true, false}) {
        std::vector<ParamTensor> t = gpt2_tensors(stacked);
        AdamW8bitLayout L = adamw8bit_plan(t);
        const double per_param = (double)L.total_bytes / L.N;
        // 2 code bytes per quantized element, 8 fp32 bytes per small-tensor element, 8 bytes of
        // absmax per block, the tables; every section padded to 16 bytes.
        size_t want = 2 * L.num_quantized + 8 * L.num_fp32 + 8 * L.num_absmax + t.size() * sizeof(AdamW8bitSlot) +
                      2 * 256 * 4;
        char name[128];
        snprintf(name, sizeof(name), "plan GPT-2 124M %s: bytes per parameter", stacked ? "(16 stacked tensors)"
                                                                                         : "(148 per-layer tensors)");
        th::report(L.N == 124475904 && L.total_bytes >= want && L.total_bytes <= want + 8 * 16 &&
                       per_param > 2.0 && per_param < 2.05,
                   name, "N=%zu state=%zu bytes = %.4f bytes/param (fp32 AdamW: 8); %zu elements keep fp32 moments, "
                   "%zu blocks", L.N, L.total_bytes, per_param, L.num_fp32, L.num_absmax);
    }
}

// Misuse stops with a message naming the constraint (run in child processes).
static void test_launcher_checks() {
    std::vector<ParamTensor> t = {{0, 5000, 1}, {5000, 10, 0}};
    AdamW8bitLayout L = adamw8bit_plan(t);
    std::vector<unsigned char> buffer(L.total_bytes);  // never reached: the launcher stops first
    th::ChildOutput r = th::run_in_child([&] {
        AdamW8bitState s = adamw8bit_view(buffer.data(), L);
        adamw8bit_update<float>(nullptr, nullptr, nullptr, s, nullptr, 3, 5010, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.f, 1.f,
                                1, 0);
    });
    th::report(WIFEXITED(r.status) && WEXITSTATUS(r.status) == EXIT_FAILURE &&
                   r.text.find("planned for 2 tensors") != std::string::npos,
               "launcher: a table other than the planned one is rejected", "%s", r.text.c_str());
    r = th::run_in_child([&] {
        AdamW8bitState s = adamw8bit_view(buffer.data(), L);
        adamw8bit_update<__nv_bfloat16>(nullptr, nullptr, nullptr, s, nullptr, 2, 5010, 1e-3f, 0.9f, 0.95f, 1e-8f,
                                        0.f, 1.f, 1, 0);
    });
    th::report(WIFEXITED(r.status) && WEXITSTATUS(r.status) == EXIT_FAILURE &&
                   r.text.find("need fp32 master weights") != std::string::npos,
               "launcher: bf16 parameters without master weights are rejected", "%s", r.text.c_str());
}

// ----------------------------------------------------------------------------
// Trajectory: a noisy quadratic, 8-bit AdamW vs fp32 AdamW

// A noisy quadratic model (the synthetic problem of Zhang et al. 2019 for optimizer studies): loss
// L(x) = sum_j h_j (x_j - c_j)^2 / 2, curvatures h_j spread over h_decades (so gradients, and v over
// twice as many decades, differ inside a quantization block), and at step t the stochastic gradient
// g_j = h_j (x_j - c_j) + sigma_rel h_j xi_tj, the same noise xi for both runs. x starts at 0,
// c ~ N(0, 1); a matrix of 8192 elements (8-bit state, weight decay) and a bias of 100 (fp32 state).
//
// The carried bound (checked when `tight`). The Hessian is diagonal, so the runs' gradients differ
// element-wise by at most h_j |p8_j - p32_j|, and a bound B_j >= |p8_j - p32_j| can be carried
// through the closed loop element by element: from the error of the stored moments (absmax * half
// the map gap next to the code: the quantizer's promise), through the moment recursions (m8 = beta1
// Q(m8) + (1 - beta1) g8 against m32 = beta1 m32 + (1 - beta1) g32: the difference grows by beta1 *
// the quantization error and (1 - beta1) * the gradient difference; v likewise with beta2), to the
// update lr/bc1 * m / (sqrt(v)/bc2s + eps), whose change over the intervals of m and v is bounded.
// The fp32 roundings of either run enter as relative slacks. Then, exactly for a quadratic,
// |L(p8) - L(p32)| <= sum_j |dL/dx_j(p32)| B_j + h_j B_j^2 / 2. The bound is worst case (every
// quantization error of the last 1 / (1 - beta2) = 20 steps adding up), so it stays informative over
// tens of steps on moderately spread gradients; it becomes vacuous over long runs or wide spreads.
//
// The stability check (always). Both runs move an element by about lr per step at most (Adam's
// |m^ / sqrt(v^)| is about 1 at most; the 8-bit run's is within a small factor, since v is never
// stored as 0), so |p8 - p32| <= 2 lr steps. A v rounded to 0 under a nonzero m breaks it by orders
// of magnitude (lr * m / eps): with plain nearest rounding, the wide-spread case moves elements by
// 2000 instead of 1.
static void test_trajectory(const char* name, int steps, double h_decades, double sigma_rel, bool tight) {
    const size_t d_w = 8192, d_b = 100, d = d_w + d_b;
    const std::vector<ParamTensor> tensors = {{0, d_w, 1}, {d_w, d_b, 0}};
    const Hyper hp{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
    Rng rng(77);
    std::vector<double> h(d), c(d);
    for (size_t j = 0; j < d; j++) {
        h[j] = std::pow(10.0, h_decades * (rng.uniform() - 0.5));
        c[j] = rng.normal();
    }
    auto loss = [&](const std::vector<float>& x) {
        double l = 0;
        for (size_t j = 0; j < d; j++) l += h[j] * (x[j] - c[j]) * (x[j] - c[j]) / 2;
        return l;
    };

    const std::vector<float> x0(d, 0.f);
    th::DeviceBuffer<float> p32(x0), m32(d, th::Fill::Zero), v32(d, th::Fill::Zero), p8(x0), g_dev(d);
    th::DeviceBuffer<ParamTensor> d_tensors(tensors);
    const AdamW8bitLayout L = adamw8bit_plan(tensors);
    th::DeviceBuffer<unsigned char> d_state(L.total_bytes);
    AdamW8bitState state = adamw8bit_init(d_state.ptr, L);
    const float* smap = adamw8bit_map(true).data();
    const float* umap = adamw8bit_map(false).data();

    // Per element: Em >= |m8 - m32|, Ev >= |v8 - v32| (m8, v8: the 8-bit run's fp32 moments before
    // requantization), B >= |p8 - p32|; hm, hv the error of the stored 8-bit moments. Lv <= v8 and
    // qv <= the stored v8: a positive v is never stored below map[1] * absmax nor below v / rho, rho
    // the largest x / Q(x) of the unsigned map (3.25, just above map[1]); this keeps the bound finite
    // where v32 - Ev <= 0.
    std::vector<double> Em(d, 0), Ev(d, 0), B(d, 0), hm(d, 0), hv(d, 0), Lv(d, 0), qv(d, 0);
    double rho = 1;
    for (int k = 1; k < ADAMW8BIT_MAP_SIZE - 1; k++)
        rho = std::max(rho, ((double)umap[k] + umap[k + 1]) / (2.0 * umap[k]));
    const double u = th::EPS_FP32 / 2;  // fp32 unit roundoff
    const double low = 1 - 8 * u;       // a few roundings down
    std::vector<float> g8(d), g32(d);
    for (int t = 1; t <= steps; t++) {
        std::vector<float> x8 = p8.host(), x32 = p32.host();
        for (size_t j = 0; j < d; j++) {
            const double noise = sigma_rel * h[j] * rng.normal();
            g8[j] = (float)(h[j] * (x8[j] - c[j]) + noise);
            g32[j] = (float)(h[j] * (x32[j] - c[j]) + noise);
        }
        g_dev.upload(g8);
        adamw8bit_update<float>(p8.ptr, nullptr, g_dev.ptr, state, d_tensors.ptr, 2, d, hp.lr, hp.beta1, hp.beta2,
                                hp.eps, hp.weight_decay, 1.f, t, 0);
        g_dev.upload(g32);
        adamw_update<float>(p32.ptr, nullptr, g_dev.ptr, m32.ptr, v32.ptr, d_tensors.ptr, 2, d, hp.lr, hp.beta1,
                            hp.beta2, hp.eps, hp.weight_decay, 1.f, t, 0);
        if (!tight) continue;

        std::vector<float> mt = m32.host(), vt = v32.host(), pt = p32.host();
        const double bc1 = 1 - std::pow((double)hp.beta1, t), bc2s = std::sqrt(1 - std::pow((double)hp.beta2, t));
        const double decay = 1 - (double)hp.lr * hp.weight_decay;
        for (size_t j = 0; j < d_w; j++) {
            // Gradients: h_j B_j apart, plus the rounding of each to fp32.
            const double dg = h[j] * B[j] + u * (std::fabs(g8[j]) + std::fabs(g32[j]));
            const double g = std::fabs(g32[j]), m = std::fabs(mt[j]), v = vt[j];
            // Each moment update rounds about 4 times in either run: 4u of |m| + |g| (of v + g^2).
            Em[j] = hp.beta1 * (Em[j] + hm[j]) + (1 - hp.beta1) * dg + 8 * u * (m + g);
            Ev[j] = hp.beta2 * (Ev[j] + hv[j]) + (1 - hp.beta2) * (2 * g + dg) * dg + 8 * u * (v + g * g);
            Lv[j] = low * (hp.beta2 * qv[j] + (1 - (double)hp.beta2) * g8[j] * g8[j]);
            const double s = std::sqrt(v) / bc2s + hp.eps;
            const double s_lo = std::sqrt(std::max(v - Ev[j], Lv[j])) / bc2s + hp.eps;
            const double s_hi = std::sqrt(v + Ev[j]) / bc2s + hp.eps;
            const double du = (double)hp.lr / bc1 * (Em[j] / s_lo + m * std::max(s - s_lo, s_hi - s) / (s * s_lo));
            // Weight decay shrinks the earlier difference; in either run the decay and the add round
            // by u of |p| each, the update term's three operations by u of it each.
            const double step_term = (double)hp.lr / bc1 * (m + Em[j]) / s_lo;
            B[j] = decay * B[j] + du + 4 * u * (std::fabs(pt[j]) + B[j]) + 6 * u * step_term;
        }
        // The error and the lower bound of what the 8-bit run just stored, for the next step.
        HostState hs = download_state(d_state.ptr, L);
        for (size_t j = 0; j < d_w; j++) {
            const size_t blk = j / ADAMW8BIT_BLOCK;
            hm[j] = hs.m_absmax[blk] * (half_gap_at(smap, hs.m_codes[j]) + ROUNDTRIP_ROUNDING);
            hv[j] = hs.v_absmax[blk] * (half_gap_at(umap, hs.v_codes[j]) + ROUNDTRIP_ROUNDING);
            qv[j] = Lv[j] > 0 ? low * std::max(Lv[j] / rho, (double)umap[1] * hs.v_absmax[blk]) : 0;
        }
    }
    std::vector<float> x8 = p8.host(), x32 = p32.host();
    const double l0 = loss(x0), l8 = loss(x8), l32 = loss(x32);
    double max_diff = 0, max_move = 0, max_bound = 0, loss_bound = 0;
    for (size_t j = 0; j < d; j++) {
        max_diff = std::max(max_diff, std::fabs((double)x8[j] - x32[j]));
        max_move = std::max(max_move, (double)std::fabs(x32[j] - x0[j]));
        max_bound = std::max(max_bound, B[j]);
        loss_bound += std::fabs(h[j] * (x32[j] - c[j])) * B[j] + h[j] * B[j] * B[j] / 2;
    }
    char title[200];
    snprintf(title, sizeof(title), "trajectory %s (%d steps, h over %g decades): fp32-state bias == fp32 AdamW", name,
             steps, h_decades);
    th::check_bitwise(title, x32.data() + d_w, x8.data() + d_w, d_b * 4);
    if (tight) {
        snprintf(title, sizeof(title), "trajectory %s: |p8 - p32| <= bound carried from the quantization error", name);
        th::check_budget(title, std::vector<double>(x32.begin(), x32.end()), x8, B);
        snprintf(title, sizeof(title), "trajectory %s: final loss difference <= bound", name);
        th::report(std::fabs(l8 - l32) <= loss_bound, title,
                   "|L8 - L32| / L32 = %.3g <= %.3g; max |p8 - p32| %.3g, max bound %.3g", std::fabs(l8 - l32) / l32,
                   loss_bound / l32, max_diff, max_bound);
    }
    snprintf(title, sizeof(title), "trajectory %s: |p8 - p32| <= 2 lr steps (no blown-up update)", name);
    th::report(max_diff <= 2 * hp.lr * steps, title,
               "loss %.6g -> fp32 %.6g, 8-bit %.6g (relative difference %.3g); max |p8 - p32| %.3g, "
               "largest fp32 move %.3g",
               l0, l32, l8, std::fabs(l8 - l32) / l32, max_diff, max_move);
}

int main() {
    test_maps();
    test_roundtrips();
    test_plan();

    // Sizes: below 4096 (fp32 state; 256 is exactly one block, 1, empty), 4095/4096/4097 at the
    // threshold (4096 = exactly 16 quantization blocks, 4097 one element in its last block), 5000
    // (not a multiple of 256), 70001 (> 64K elements).
    const std::vector<size_t> sizes = {1000, 1, 70001, 256, 0, 4096, 4097, 4095, 5000};
    const std::vector<int> flags = {1, 0, 1, 0, 1, 1, 0, 0, 1};
    const Hyper gpt2{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
    Case fresh{"table-from-step-1", sizes, flags, gpt2, 5, {1.f, 0.37f, 1.f, 0.5f, 1.f}, 3, 0.8f, true};
    Case resumed{"table-random-state", sizes, flags, Hyper{6e-4f, 0.9f, 0.999f, 1e-6f, 0.01f}, 5,
                 {1.f, 0.25f, 0.9f, 1.f, 1.f}, 99, 1.f, false};
    for (const Case* c : {&fresh, &resumed}) {
        test_update<float>(*c);
        test_update<__nv_bfloat16>(*c);
        test_update<__half>(*c);
    }
    test_trajectory("tracking", 20, 1, 1.0, true);  // noise-dominated gradients, one decade of curvature
    test_trajectory("wide-spread", 100, 4, 0.1, false);  // gradients over 4 decades, v over 8, in a block
#if defined(SIMT_CPU)
    if (th::can_run_fault_tests()) test_launcher_checks();
#else
    test_launcher_checks();
#endif
    return th::finish();
}
