// test/test_fp8.cu — llmc/fp8.cuh (the fp8 cast with amax, delayed scaling, the capability check) and
// the fp8 linear layers of llmc/matmul.cuh (matmul_forward_fp8 / matmul_backward_fp8).
//
// What is checked, and against what:
//   - the toolkit's float -> E4M3/E5M2 conversion (which the cast kernel calls) against a
//     conversion written here from the formats' definitions, on every bf16 value at four scales;
//   - the cast kernel, bit for bit (up to the sign of zero), against the toolkit's conversion on
//     the host: row-major and transposed outputs with their zero padding, the per-block amaxes
//     reduced to max |x| exactly,
//     for fp32 and bf16 inputs, both formats, shapes that are not multiples of 8/16/64, both the
//     paired and the scalar read paths;
//   - the scale update, bit for bit, against a host model of the recipe (history roll, max, kept
//     scale on 0/inf, subnormal amaxes as 0, the 2^126 cap and the 2^-126 floor, margin, histories
//     longer than the block);
//   - delayed scaling end to end: casts under scales from earlier steps (saturating when a tensor
//     grows, as the recipe accepts), bit for bit against the host model;
//   - the fp8 GEMMs (forward with bias / tanh or erf GELU, dinp with dGELU, dweight accumulation,
//     dbias) against a double reference computed from the same fp8 values and scales, with the
//     accumulation budget of the precision the device's fp8 GEMM keeps (measured first:
//     test/fp8_accumulation.h; fp32 on the CPU backend); and against the bf16 GEMMs of
//     matmul_forward/matmul_backward within the bound E4M3/E5M2 rounding allows;
//   - the fused GELU routes (bias + GELU and dGELU in cuBLASLt's epilogue): which route each GEMM
//     takes, the fallback to the unfused route when cuBLASLt refuses the fused GEMMs, and fused
//     against unfused results;
//   - determinism under thread orders (th::run_orders) for the cast, the update, and whole layers;
//   - the refusals: compute capability below 8.9 (fake capabilities), bad shapes and pointers.
#include "../llmc/matmul.cuh"
#include "fp8_accumulation.h"
#include "harness.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

constexpr double kU32 = 1.0 / (1 << 24);  // fp32 unit roundoff

// ----------------------------------------------------------------------------
// Host references

// The toolkit's conversion, as the kernel calls it (round to nearest even, saturating).
uint8_t toolkit_fp8(float x, __nv_fp8_interpretation_t f) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, f); }

// Two fp8 bytes encode the same value with the same sign, zero excepted: the toolkit's host path
// rounds a negative value that underflows to +0 while the sm_89+ instruction may keep -0.
bool same_fp8(uint8_t a, uint8_t b) { return a == b || ((a & 0x7f) == 0 && (b & 0x7f) == 0); }

// The value of an fp8 byte (every E4M3 and E5M2 value is exact in fp16).
double fp8_value(uint8_t q, __nv_fp8_interpretation_t f) {
    __half h(__nv_cvt_fp8_to_halfraw(q, f));
    return (double)__half2float(h);
}

// x rounded to the format from its definition: p significant bits (4 for E4M3, 3 for E5M2), normal
// exponents down to emin (-6, -14) with subnormals below, ties to even, saturating at the largest
// finite value (448, 57344); NaN stays NaN.
double reference_fp8(double x, __nv_fp8_interpretation_t f) {
    if (std::isnan(x)) return x;
    const int p = f == __NV_E4M3 ? 4 : 3, emin = f == __NV_E4M3 ? -6 : -14;
    const double maxv = f == __NV_E4M3 ? 448.0 : 57344.0;
    double a = std::fabs(x);
    if (a == 0) return 0;
    int e = std::max((int)std::floor(std::log2(a)), emin);
    double ulp = std::ldexp(1.0, e - (p - 1));
    double r = std::nearbyint(a / ulp) * ulp;  // default rounding mode: ties to even
    return std::copysign(std::min(r, maxv), x);
}

// The recipe's update on the host: a subnormal amax counts as 0; history <- (amax, history[:-1]); scale
// from its maximum, clamped to [2^-126, 2^126].
struct HostScaling {
    std::vector<float> history;
    float scale = 1.f, scale_inv = 1.f, scaled_max;
    HostScaling(int h, __nv_fp8_interpretation_t f, int margin)
        : history(h, 0.f), scaled_max(std::ldexp(f == __NV_E4M3 ? 448.f : 57344.f, -margin)) {}
    void update(float amax) {
        history.insert(history.begin(), amax >= FLT_MIN ? amax : 0.f);
        history.pop_back();
        float m = 0.f;
        for (float v : history) m = std::fmax(m, v);
        if (std::isfinite(m) && m > 0.f)
            scale = std::fmax(std::fmin(scaled_max / m, std::ldexp(1.f, 126)), std::ldexp(1.f, -126));
        scale_inv = 1.f / scale;
    }
};

// max |x| of a tensor as the kernel sees it (fmax: NaN ignored).
template <class T>
float host_amax(const std::vector<T>& x) {
    float m = 0.f;
    for (const T& v : x) m = std::fmax(m, std::fabs(to_float(v)));
    return m;
}

// Sets a state's device scale (and its inverse) to s.
void set_scale(const Fp8Scaling& st, float s) {
    float inv = 1.f / s;
    cudaCheck(cudaMemcpy(st.scale, &s, sizeof(s), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(st.scale_inv, &inv, sizeof(inv), cudaMemcpyHostToDevice));
}

float get_scale(const Fp8Scaling& st) {
    float s;
    cudaCheck(cudaMemcpy(&s, st.scale, sizeof(s), cudaMemcpyDeviceToHost));
    return s;
}

bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof(float)) == 0; }

// ----------------------------------------------------------------------------
// The conversion itself

// The toolkit's conversion equals the definition on every bf16 value times four scales (products in
// fp32, as in the kernel). Signed zeros compare equal: the toolkit's host path returns +0 for a
// negative value that underflows.
void check_conversion(__nv_fp8_interpretation_t f) {
    size_t wrong = 0, tested = 0, saturated = 0;
    for (float s : {1.f, 0.03125f, 3.7f, 1000.f})
        for (uint32_t bits = 0; bits < 65536; bits++) {
            __nv_bfloat16_raw raw;
            raw.x = (unsigned short)bits;
            float x = __bfloat162float(__nv_bfloat16(raw)) * s;
            double got = fp8_value(toolkit_fp8(x, f), f), want = reference_fp8(x, f);
            bool ok = std::isnan(want) ? std::isnan(got) : got == want;
            wrong += !ok;
            saturated += std::isfinite(x) && std::fabs(want) == fp8_max(f) && std::fabs(x) > fp8_max(f);
            tested++;
        }
    std::string name = std::string("toolkit float->") + fp8_format_name(f) + " = round-to-nearest-even, saturating";
    th::report(wrong == 0, name.c_str(),
               "%zu values (every bf16 x 4 scales), %zu saturated, %zu differ", tested, saturated, wrong);
}

// ----------------------------------------------------------------------------
// Cast kernel

// Inputs in [-2, 2) with planted large values (saturate under a scale of 300) and tiny ones (fp8
// subnormals and underflow), rounded to T.
template <class T>
std::vector<T> cast_input(size_t n, uint64_t seed) {
    std::vector<float> f(n);
    th::fill_uniform(f.data(), n, seed, -2.f, 2.f);
    for (size_t i = 0; i < n; i += 7) f[i] *= 1e-3f;
    for (size_t i = 3; i < n; i += 29) f[i] = (i % 2 ? 1.f : -1.f) * 5.f;
    if (n > 5) f[5] = -9.5f;  // the amax, negative
    return th::round_to<T>(f);
}

// fp8_cast of an (R,S) input at element offset `offset` of its allocation (offset 1: the scalar
// path), with both outputs and the amax, under every thread order; then bit for bit against the host.
template <class T>
void check_cast(int R, int S, __nv_fp8_interpretation_t f, float scale, size_t offset) {
    std::vector<T> x = cast_input<T>((size_t)R * S, 1000 + R * 7 + S);
    th::DeviceView<T> dx(x, offset);
    const int lds = fp8_ld(S), ldr = fp8_ld(R), np = fp8_cast_num_partials(R, S);
    th::DeviceBuffer<char> smem(fp8_scaling_bytes(4));
    Fp8Scaling st;
    fp8_scaling_init(&st, smem.ptr, f, 4, 0, 0);
    set_scale(st, scale);
    char name[160];
    snprintf(name, sizeof(name), "fp8_cast<%s> -> %s R=%d S=%d offset=%zu: thread orders", th::dtype_name<T>(),
             fp8_format_name(f), R, S, offset);
    // One result vector: out, out_t, then the partial amaxes' bytes.
    std::vector<uint8_t> got = th::run_orders(name, [&] {
        th::DeviceBuffer<uint8_t> out((size_t)R * lds), out_t((size_t)S * ldr);
        th::DeviceBuffer<float> partials(np);
        cudaCheck(cudaMemset(out.ptr, 0xab, out.n));  // sentinel: padding the kernel fails to zero shows
        cudaCheck(cudaMemset(out_t.ptr, 0xab, out_t.n));
        fp8_cast(out.ptr, out_t.ptr, partials.ptr, (const T*)dx.ptr, R, S, st, 0);
        std::vector<uint8_t> r = out.host(), t = out_t.host();
        std::vector<float> p = partials.host();
        r.insert(r.end(), t.begin(), t.end());
        r.insert(r.end(), (uint8_t*)p.data(), (uint8_t*)(p.data() + p.size()));
        return r;
    });
    size_t bad_out = 0, bad_t = 0, sat = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < lds; c++) {
            uint8_t want = c < S ? toolkit_fp8(to_float(x[(size_t)r * S + c]) * scale, f) : 0;
            bad_out += !same_fp8(got[(size_t)r * lds + c], want);
            if (c < S) sat += std::fabs(to_float(x[(size_t)r * S + c]) * scale) > fp8_max(f);
        }
    const uint8_t* t = got.data() + (size_t)R * lds;
    for (int c = 0; c < S; c++)
        for (int r = 0; r < ldr; r++) {
            uint8_t want = r < R ? toolkit_fp8(to_float(x[(size_t)r * S + c]) * scale, f) : 0;
            bad_t += !same_fp8(t[(size_t)c * ldr + r], want);
        }
    float amax = 0.f;
    const float* p = reinterpret_cast<const float*>(got.data() + (size_t)R * lds + (size_t)S * ldr);
    for (int i = 0; i < np; i++) amax = std::fmax(amax, p[i]);
    float want_amax = host_amax(x);
    snprintf(name, sizeof(name), "fp8_cast<%s> -> %s R=%d S=%d offset=%zu scale=%g: bit-exact", th::dtype_name<T>(),
             fp8_format_name(f), R, S, offset, scale);
    th::report(bad_out == 0 && bad_t == 0 && same_bits(amax, want_amax), name,
               "row-major (ld %d) %zu bad, transposed (ld %d) %zu bad, %zu saturated; amax %.9g (want %.9g, %d blocks)",
               lds, bad_out, ldr, bad_t, sat, amax, want_amax, np);
}

// ----------------------------------------------------------------------------
// Scale update

// Runs a sequence of updates on device and host, one state with one amax per step (each given as
// `parts` partials: the amax and smaller values), and compares scale, scale_inv and the whole history
// bit for bit after every step.
void check_update_sequence(const char* what, __nv_fp8_interpretation_t f, int H, int margin,
                           const std::vector<float>& amaxes, int parts) {
    auto run = [&] {
        th::DeviceBuffer<char> mem(fp8_scaling_bytes(H));
        Fp8Scaling st;
        fp8_scaling_init(&st, mem.ptr, f, H, margin, 0);
        std::vector<float> trace;  // per step: scale, scale_inv, history
        th::DeviceBuffer<float> partials(parts);
        for (size_t step = 0; step < amaxes.size(); step++) {
            std::vector<float> p(parts);
            const float a = amaxes[step];
            for (int i = 0; i < parts; i++) p[i] = std::isfinite(a) ? a * (float)(i % 5) / 4.f : a;
            if (parts > 1) p[(step * 37) % parts] = NAN;  // ignored by the max, as in the cast's fmaxf
            p[(step * 11 + 1) % parts] = amaxes[step];
            partials.upload(p);
            Fp8AmaxRecord rec{&st, partials.ptr, parts};
            fp8_update_scales(&rec, 1, 0);
            float sc[2];
            cudaCheck(cudaMemcpy(&sc[0], st.scale, sizeof(float), cudaMemcpyDeviceToHost));
            cudaCheck(cudaMemcpy(&sc[1], st.scale_inv, sizeof(float), cudaMemcpyDeviceToHost));
            std::vector<float> h = th::to_host(st.history, H);
            trace.push_back(sc[0]);
            trace.push_back(sc[1]);
            trace.insert(trace.end(), h.begin(), h.end());
        }
        return trace;
    };
    char name[160];
    snprintf(name, sizeof(name), "fp8_update_scales %s (%s, H=%d, margin=%d, %d partials): thread orders", what,
             fp8_format_name(f), H, margin, parts);
    std::vector<float> got = th::run_orders(name, run);
    HostScaling host(H, f, margin);
    size_t bad_steps = 0, at = 0;
    std::string scales;
    for (size_t step = 0; step < amaxes.size(); step++) {
        host.update(amaxes[step]);
        bool ok = same_bits(got[at], host.scale) && same_bits(got[at + 1], host.scale_inv);
        for (int i = 0; i < H; i++) ok = ok && same_bits(got[at + 2 + i], host.history[i]);
        bad_steps += !ok;
        if (step < 8) {
            char b[32];
            snprintf(b, sizeof(b), "%s%.4g", step ? " " : "", got[at]);
            scales += b;
        }
        at += 2 + H;
    }
    snprintf(name, sizeof(name), "fp8_update_scales %s (%s, H=%d, margin=%d): bit-exact vs host recipe", what,
             fp8_format_name(f), H, margin);
    th::report(bad_steps == 0, name, "%zu steps, %zu differ; scales %s%s", amaxes.size(), bad_steps, scales.c_str(),
               amaxes.size() > 8 ? " ..." : "");
}

// Two states updated by one launch (one block each) get what two separate updates would give.
void check_update_batch() {
    th::DeviceBuffer<char> mem(2 * fp8_scaling_bytes(3));
    Fp8Scaling a, b;
    fp8_scaling_init(&a, mem.ptr, __NV_E4M3, 3, 0, 0);
    fp8_scaling_init(&b, mem.ptr + fp8_scaling_bytes(3), __NV_E5M2, 3, 1, 0);
    th::DeviceBuffer<float> pa(std::vector<float>{0.5f, 2.5f, 1.f}), pb(std::vector<float>{3e-5f});
    Fp8AmaxRecord recs[2] = {{&a, pa.ptr, 3}, {&b, pb.ptr, 1}};
    fp8_update_scales(recs, 2, 0);
    HostScaling ha(3, __NV_E4M3, 0), hb(3, __NV_E5M2, 1);
    ha.update(2.5f);
    hb.update(3e-5f);
    float sa = get_scale(a), sb = get_scale(b);
    th::report(same_bits(sa, ha.scale) && same_bits(sb, hb.scale), "fp8_update_scales: two states in one launch",
               "E4M3 scale %.9g (want %.9g), E5M2 margin 1 scale %.9g (want %.9g)", sa, ha.scale, sb, hb.scale);
}

// ----------------------------------------------------------------------------
// Delayed scaling through the casts

// Six steps of prime (first step only), cast and update on a tensor whose magnitude changes
// (x1, x1, x8, x8, x0.25, x1) with history length 2: each cast must use the scale of the earlier
// steps (saturating at the step where the tensor grew eightfold), bit for bit as the host recipe says.
void check_delayed_scaling() {
    const int R = 48, S = 80, H = 2;
    const float mult[] = {1.f, 1.f, 8.f, 8.f, 0.25f, 1.f};
    std::vector<float> base((size_t)R * S);
    th::fill_uniform(base.data(), base.size(), 77, -3.f, 3.f);
    th::DeviceBuffer<char> mem(fp8_scaling_bytes(H));
    Fp8Scaling st;
    fp8_scaling_init(&st, mem.ptr, __NV_E4M3, H, 0, 0);
    th::DeviceBuffer<float> partials(fp8_cast_num_partials(R, S));
    th::DeviceBuffer<uint8_t> out((size_t)R * fp8_ld(S));
    HostScaling host(H, __NV_E4M3, 0);
    size_t bad = 0, bad_scale = 0, sat_growth = 0, sat_other = 0;
    std::string used;
    for (int step = 0; step < 6; step++) {
        std::vector<__nv_bfloat16> x((size_t)R * S);
        for (size_t i = 0; i < x.size(); i++) x[i] = from_float<__nv_bfloat16>(base[i] * mult[step]);
        th::DeviceBuffer<__nv_bfloat16> dx(x);
        float amax = host_amax(x);
        if (step == 0) host.update(amax);  // priming
        fp8_prime(st, partials.ptr, (const __nv_bfloat16*)dx.ptr, R, S, 0);
        bad_scale += !same_bits(get_scale(st), host.scale);
        fp8_cast(out.ptr, (__nv_fp8_storage_t*)nullptr, partials.ptr, (const __nv_bfloat16*)dx.ptr, R, S, st, 0);
        std::vector<uint8_t> q = out.host();
        for (int r = 0; r < R; r++)
            for (int c = 0; c < S; c++) {
                float v = to_float(x[(size_t)r * S + c]);
                bad += !same_fp8(q[(size_t)r * fp8_ld(S) + c], toolkit_fp8(v * host.scale, __NV_E4M3));
                bool sat = std::fabs(v * host.scale) > 448.f;
                (step == 2 ? sat_growth : sat_other) += sat;
            }
        char b[48];
        snprintf(b, sizeof(b), "%s%.4g", step ? " " : "", host.scale);
        used += b;
        Fp8AmaxRecord rec{&st, partials.ptr, fp8_cast_num_partials(R, S)};
        fp8_update_scales(&rec, 1, 0);
        host.update(amax);
    }
    bad_scale += !same_bits(get_scale(st), host.scale);
    th::report(bad == 0 && bad_scale == 0 && sat_growth > 0 && sat_other == 0,
               "delayed scaling: 6 steps of prime/cast/update (H=2), magnitudes x1 x1 x8 x8 x0.25 x1",
               "scales used %s; %zu bytes and %zu scales differ from the host recipe; %zu values saturate at the "
               "x8 step (the recipe's lag), %zu elsewhere",
               used.c_str(), bad, bad_scale, sat_growth, sat_other);
}

// ----------------------------------------------------------------------------
// fp8 linear layers

double gelu_tanh(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double gelu_tanh_grad(double x) {
    double u = 0.7978845608028654 * (x + 0.044715 * x * x * x), t = std::tanh(u);
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}
double gelu_erf(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_erf_grad(double x) {
    return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}
constexpr double kGeluLipschitz = 1.13;  // max |gelu'| (both forms)
// How far cuBLASLt's fused tanh GELU may be from the exact one, relative to |x|: its tanh is the
// hardware approximation (PTX tanh.approx.f32, relative error <= 2^-11), which moves
// x (1 + tanh) / 2 by at most 2^-12 |x| (see test_cublaslt.cu).
constexpr double kGeluEpilogueTanh = 1.0 / 4096;

// a (rows, K) row-major times b (cols, K) row-major transposed: out[i][j] = sum_k a[i][k] b[j][k],
// and mag[i][j] = sum_k |a[i][k] b[j][k]| (what fp32 accumulation errors scale with).
void gemm_nt(const std::vector<double>& a, const std::vector<double>& b, int rows, int cols, int K,
             std::vector<double>& out, std::vector<double>& mag) {
    out.assign((size_t)rows * cols, 0);
    mag.assign((size_t)rows * cols, 0);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            double s = 0, m = 0;
            for (int k = 0; k < K; k++) {
                double p = a[(size_t)i * K + k] * b[(size_t)j * K + k];
                s += p;
                m += std::fabs(p);
            }
            out[(size_t)i * cols + j] = s;
            mag[(size_t)i * cols + j] = m;
        }
}

// (rows, cols) -> (cols, rows).
std::vector<double> transpose(const std::vector<double>& a, int rows, int cols) {
    std::vector<double> t(a.size());
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) t[(size_t)j * rows + i] = a[(size_t)i * cols + j];
    return t;
}

// The fp8 values the GEMM sees (scaled) and a bound on each element's quantization error |q/s - x|:
// half an fp8 ulp (u = 2^-4 for E4M3, 2^-3 for E5M2, relative: k = 1/2 of the format's eps) or, below
// the normal range, half the smallest subnormal, divided by the scale; plus the fp32 rounding of x*s.
struct Quantized {
    std::vector<double> q;    // fp8 value as stored (scaled)
    std::vector<double> err;  // bound on |q/s - x|
};
template <class T>
Quantized quantize(const std::vector<T>& x, float s, __nv_fp8_interpretation_t f) {
    const double u = f == __NV_E4M3 ? th::EPS_E4M3 / 2 : th::EPS_E5M2 / 2;
    const double half_sub = f == __NV_E4M3 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -17);
    Quantized r;
    for (const T& v : x) {
        float xv = to_float(v);
        r.q.push_back(fp8_value(toolkit_fp8(xv * s, f), f));
        r.err.push_back(((u + 2 * kU32) * std::fabs(xv * (double)s) + half_sub) / s);
    }
    return r;
}

// Bound on |sum_k a'_k b'_k - sum_k a_k b_k| with |a' - a| <= ea, |b' - b| <= eb, for every (i, j)
// of the products a (rows, K) · b (cols, K)ᵀ.
std::vector<double> product_error(const std::vector<double>& a, const std::vector<double>& ea,
                                  const std::vector<double>& b, const std::vector<double>& eb, int rows, int cols,
                                  int K) {
    std::vector<double> e((size_t)rows * cols, 0);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) {
                size_t ik = (size_t)i * K + k, jk = (size_t)j * K + k;
                s += ea[ik] * std::fabs(b[jk]) + std::fabs(a[ik]) * eb[jk] + ea[ik] * eb[jk];
            }
            e[(size_t)i * cols + j] = s;
        }
    return e;
}

// One forward + backward of an fp8 layer at (N, C, OC): gelu 0 none, 1 tanh, 2 erf.
void check_fp8_linear(int N, int C, int OC, bool use_bias, int gelu) {
    using bf16 = __nv_bfloat16;
    const GeluKind kind = gelu == 2 ? GeluKind::Erf : GeluKind::Tanh;
    double (*g)(double) = gelu == 2 ? gelu_erf : gelu_tanh;
    double (*gd)(double) = gelu == 2 ? gelu_erf_grad : gelu_tanh_grad;
    auto inp = th::random_tensor<bf16>((size_t)N * C, 11 + N);
    auto w = th::random_tensor<bf16>((size_t)OC * C, 12, -0.5f, 0.5f), b = th::random_tensor<bf16>(OC, 13);
    auto dw0 = th::random_tensor<bf16>((size_t)OC * C, 15, -0.01f, 0.01f), db0 = th::random_tensor<bf16>(OC, 16, -0.01f, 0.01f);
    auto pre_below = th::random_tensor<bf16>((size_t)N * C, 17, -3.f, 3.f);
    // Gradients of typical size: 1e-5 and below, under E5M2's 2^-16 floor without a scale.
    auto dout = th::random_tensor<bf16>((size_t)N * OC, 14, -2e-5f, 2e-5f);
    const bf16* no_bias = nullptr;
    char name[200], shape[96];
    snprintf(shape, sizeof(shape), "N=%d C=%d OC=%d%s%s", N, C, OC, use_bias ? " +bias" : "",
             gelu == 1 ? " +gelu_tanh" : gelu == 2 ? " +gelu_erf" : "");

    th::DeviceBuffer<bf16> d_inp(inp), d_w(w), d_b(b), d_dout(dout), d_pre_below(pre_below);
    th::DeviceBuffer<char> scratch(matmul_fp8_scratch_bytes(N, C, OC)), smem(fp8_linear_bytes(16));
    Fp8Linear st;
    // The whole layer, from fresh states, under every thread order: out, pre, dinp, dweight, dbias.
    snprintf(name, sizeof(name), "fp8 linear %s: forward+backward thread orders", shape);
    std::vector<bf16> all = th::run_orders(name, [&] {
        fp8_linear_init(&st, smem.ptr, 16, 0, 0);
        // NaN-filled: an element the layer fails to write shows (pre stays NaN without GELU).
        th::DeviceBuffer<bf16> out((size_t)N * OC, th::Fill::NaN), pre((size_t)N * OC, th::Fill::NaN),
            dinp((size_t)N * C, th::Fill::NaN), dw(dw0), db(db0);
        matmul_forward_fp8(out.ptr, gelu ? pre.ptr : nullptr, d_inp.ptr, d_w.ptr, use_bias ? d_b.ptr : no_bias, N, C,
                           OC, kind, st, scratch.ptr, 0);
        matmul_backward_fp8(dinp.ptr, dw.ptr, use_bias ? db.ptr : nullptr, scratch.ptr, d_dout.ptr, d_inp.ptr, d_w.ptr,
                            gelu ? d_pre_below.ptr : nullptr, N, C, OC, kind, st, 0);
        std::vector<bf16> r = out.host(), p = pre.host(), x = dinp.host(), y = dw.host(), z = db.host();
        for (auto* v : {&p, &x, &y, &z}) r.insert(r.end(), v->begin(), v->end());
        return r;
    });
    size_t at = 0;
    auto take = [&](size_t n) {
        std::vector<bf16> v(all.begin() + at, all.begin() + at + n);
        at += n;
        return v;
    };
    std::vector<bf16> out = take((size_t)N * OC), pre = take((size_t)N * OC), dinp = take((size_t)N * C),
                      dw = take((size_t)OC * C), db = take(OC);

    // The scales: primed from each tensor's own amax (and unchanged by the update after the first
    // use, which records the same amax), so the casts used exactly fp8_max / amax.
    const float sx = 448.f / host_amax(inp), sw = 448.f / host_amax(w), sg = 57344.f / host_amax(dout);
    float dev[3] = {get_scale(st.inp), get_scale(st.weight), get_scale(st.grad)};
    snprintf(name, sizeof(name), "fp8 linear %s: primed scales = fp8_max / amax", shape);
    th::report(same_bits(dev[0], sx) && same_bits(dev[1], sw) && same_bits(dev[2], sg), name,
               "inp %.6g (want %.6g) weight %.6g (want %.6g) grad %.6g (want %.6g)", dev[0], sx, dev[1], sw, dev[2], sg);
    const float sxi = 1.f / sx, swi = 1.f / sw, sgi = 1.f / sg;
    // cuBLASLt multiplies the two scale_inv in fp32 first (one rounding, folded into the k below).
    const double sxw = (double)swi * sxi, sgw = (double)swi * sgi, sgx = (double)sxi * sgi;

    Quantized qx = quantize(inp, sx, __NV_E4M3), qw = quantize(w, sw, __NV_E4M3), qg = quantize(dout, sg, __NV_E5M2);
    const double eps = th::EPS_BF16;
    const double kUacc = th::fp8_accumulation().unit;  // the fp8 GEMMs' (test/fp8_accumulation.h)

    // --- Against the double reference from the same fp8 values. Per element: the accumulation of
    // K terms <= (K+4) u S (S: sum of |terms| times the scales, plus |bias| / |C|; u: the fp8 GEMM's
    // accumulation unit, fp32's 2^-24 unless the probe measured less, test/fp8_accumulation.h), then one
    // rounding to bf16 (k = 1/2). Where a bias or C is added, cuBLASLt may round the product to bf16
    // first (measured on an H100, see test_cublaslt.cu): half an ulp of bf16 at the product's size.
    std::vector<double> acc, mag;
    gemm_nt(qx.q, qw.q, N, OC, C, acc, mag);  // (N, OC)
    std::vector<double> pre_ref(acc.size()), pre_budget(acc.size()), out_ref(acc.size()), out_budget(acc.size());
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            size_t i = (size_t)n * OC + o;
            double bias = use_bias ? to_float(b[o]) : 0;
            double v = acc[i] * sxw + bias, S = mag[i] * sxw + std::fabs(bias);
            double e = (C + 4) * kUacc * S + (use_bias ? 0.5 * eps * std::fabs(acc[i] * sxw) : 0);
            pre_ref[i] = v;
            pre_budget[i] = e + 0.5 * eps * std::fabs(v);
            // GELU: the input error (plus the unfused path's rounding of pre to bf16) through
            // |gelu'| <= 1.13, a few fp32 ulps of the GELU itself, one rounding of the output; the
            // tanh GELU fused into cuBLASLt's epilogue may be off by 2^-12 |v| (the hardware tanh
            // approximation, see test_cublaslt.cu).
            out_ref[i] = gelu ? g(v) : v;
            out_budget[i] = gelu ? kGeluLipschitz * (e + 0.5 * eps * std::fabs(v)) + 8 * kU32 * std::fabs(v) +
                                       (gelu == 1 ? kGeluEpilogueTanh * std::fabs(v) : 0) +
                                       0.5 * eps * std::fabs(out_ref[i])
                                 : pre_budget[i];
        }
    snprintf(name, sizeof(name), "matmul_forward_fp8 %s: out vs double ref on the fp8 values", shape);
    th::check_budget(name, out_ref, out, out_budget);
    if (gelu) {
        snprintf(name, sizeof(name), "matmul_forward_fp8 %s: pre-GELU vs double ref on the fp8 values", shape);
        th::check_budget(name, pre_ref, pre, pre_budget);
    }

    // dinp (N,C) = dout · W: K = OC terms.
    std::vector<double> qwT = transpose(qw.q, OC, C), ewT = transpose(qw.err, OC, C);
    gemm_nt(qg.q, qwT, N, C, OC, acc, mag);
    std::vector<double> dinp_ref(acc.size()), dinp_budget(acc.size());
    for (size_t i = 0; i < acc.size(); i++) {
        double v = acc[i] * sgw, e = (OC + 4) * kUacc * mag[i] * sgw;
        double d = gelu ? gd(to_float(pre_below[i])) : 1.0;
        dinp_ref[i] = v * d;
        // Unfused dGELU rounds v to bf16 before multiplying by gelu' (computed in fp32, a few ulps).
        dinp_budget[i] = gelu ? std::fabs(d) * (e + 0.5 * eps * std::fabs(v)) + 8 * kU32 * std::fabs(v * d) +
                                    0.5 * eps * std::fabs(v * d)
                              : e + 0.5 * eps * std::fabs(v);
    }
    snprintf(name, sizeof(name), "matmul_backward_fp8 %s: dinp vs double ref on the fp8 values", shape);
    th::check_budget(name, dinp_ref, dinp, dinp_budget);

    // dweight (OC,C) = dw0 + doutᵀ · inp: K = N terms, plus beta * C.
    std::vector<double> qgT = transpose(qg.q, N, OC), qxT = transpose(qx.q, N, C);
    gemm_nt(qgT, qxT, OC, C, N, acc, mag);
    std::vector<double> dw_ref(acc.size()), dw_budget(acc.size());
    for (size_t i = 0; i < acc.size(); i++) {
        double c0 = to_float(dw0[i]);
        dw_ref[i] = c0 + acc[i] * sgx;
        dw_budget[i] = (N + 4) * kUacc * (mag[i] * sgx + std::fabs(c0)) + 0.5 * eps * std::fabs(acc[i] * sgx) +
                       0.5 * eps * std::fabs(dw_ref[i]);
    }
    snprintf(name, sizeof(name), "matmul_backward_fp8 %s: dweight += vs double ref on the fp8 values", shape);
    th::check_budget(name, dw_ref, dw, dw_budget);
    if (use_bias) {
        // Column sums of the bf16 dout (no fp8): N+1 terms in fp32, one rounding to bf16.
        std::vector<double> db_ref(OC), db_budget(OC);
        for (int o = 0; o < OC; o++) {
            double s = to_float(db0[o]), m = std::fabs(s);
            for (int n = 0; n < N; n++) {
                s += to_float(dout[(size_t)n * OC + o]);
                m += std::fabs(to_float(dout[(size_t)n * OC + o]));
            }
            db_ref[o] = s;
            db_budget[o] = (N + 2) * kU32 * m + 0.5 * eps * std::fabs(s);
        }
        snprintf(name, sizeof(name), "matmul_backward_fp8 %s: dbias += (bf16 dout)", shape);
        th::check_budget(name, db_ref, db, db_budget);
    }

    // --- Against the bf16 layer (matmul_forward / matmul_backward) on the same bf16 inputs. The fp8
    // operands differ from the bf16 ones by at most the quantization bound (k = 1/2 of eps_E4M3 =
    // 2^-3 and of eps_E5M2 = 2^-2, relative, per element, plus half a subnormal), so the products'
    // sums differ by at most product_error; add both layers' fp32 accumulation and bf16 rounding
    // errors (GELU outputs through |gelu'| <= 1.13).
    th::DeviceBuffer<bf16> out16((size_t)N * OC), pre16((size_t)N * OC), dinp16((size_t)N * C), dw16(dw0), db16(db0);
    th::DeviceBuffer<char> scratch16(matmul_backward_scratch_bytes(N, OC));
    matmul_forward(out16.ptr, gelu ? pre16.ptr : nullptr, d_inp.ptr, d_w.ptr, use_bias ? d_b.ptr : no_bias, N, C, OC,
                   kind, 0);
    matmul_backward(dinp16.ptr, dw16.ptr, use_bias ? db16.ptr : nullptr, scratch16.ptr, d_dout.ptr, d_inp.ptr, d_w.ptr,
                    gelu ? d_pre_below.ptr : nullptr, N, C, OC, kind, 0);
    std::vector<double> x = th::widen(inp), wv = th::widen(w), gv = th::widen(dout);
    std::vector<double> xq(x.size()), wq(wv.size()), gq(gv.size());
    for (size_t i = 0; i < x.size(); i++) xq[i] = qx.q[i] * sxi;
    for (size_t i = 0; i < wv.size(); i++) wq[i] = qw.q[i] * swi;
    for (size_t i = 0; i < gv.size(); i++) gq[i] = qg.q[i] * sgi;
    std::vector<bf16> o16 = out16.host(), i16 = dinp16.host(), w16 = dw16.host();

    // Each comparison: D = |sum of quantized products - exact sum| + both layers' fp32 accumulation +
    // both bf16 roundings (of the output, or of the GELU input where a path is unfused) + where a bias
    // or C is added, both layers' rounding of the product to bf16 first (prod: a bound on its size);
    // GELU and dGELU carry D through |gelu'| (<= 1.13) and add their own fp32 ulps (fused on a GPU,
    // the epilogue's tanh approximation) and output rounding.
    auto bound = [&](double qerr, double fp32, double v, double prod) {
        return qerr + fp32 + eps * (v + prod + qerr + fp32) * (1 + eps);
    };
    std::vector<double> qerr = product_error(x, qx.err, wv, qw.err, N, OC, C), exact, m2;
    gemm_nt(x, wv, N, OC, C, exact, m2);
    std::vector<double> ref16(o16.size()), budget16(o16.size());
    for (size_t i = 0; i < o16.size(); i++) {
        ref16[i] = to_float(o16[i]);
        double bias = use_bias ? to_float(b[i % OC]) : 0, v = exact[i] + bias;
        double D = bound(qerr[i], (C + 4) * (kU32 + kUacc) * (m2[i] + qerr[i] + std::fabs(bias)), std::fabs(v),
                         use_bias ? std::fabs(exact[i]) + qerr[i] : 0);
        double approx = gelu == 1 ? 2 * kGeluEpilogueTanh * std::fabs(v) : 0;
        budget16[i] = gelu ? kGeluLipschitz * D + 16 * kU32 * std::fabs(v) + approx +
                                 eps * (std::fabs(g(v)) + kGeluLipschitz * D + approx)
                           : D;
    }
    snprintf(name, sizeof(name), "matmul_forward_fp8 %s: out vs bf16 layer within the E4M3 bound", shape);
    th::check_budget(name, ref16, out, budget16);

    std::vector<double> wvT = transpose(wv, OC, C);
    qerr = product_error(gv, qg.err, wvT, ewT, N, C, OC);
    gemm_nt(gv, wvT, N, C, OC, exact, m2);
    ref16.assign(i16.size(), 0);
    budget16.assign(i16.size(), 0);
    for (size_t i = 0; i < i16.size(); i++) {
        ref16[i] = to_float(i16[i]);
        double v = std::fabs(exact[i]), D = bound(qerr[i], (OC + 4) * (kU32 + kUacc) * (m2[i] + qerr[i]), v, 0);
        double d = gelu ? std::fabs(gd(to_float(pre_below[i]))) : 1.0;
        budget16[i] = gelu ? d * D + 16 * kU32 * d * (v + qerr[i]) + eps * d * (v + D) : D;
    }
    snprintf(name, sizeof(name), "matmul_backward_fp8 %s: dinp vs bf16 layer within the E5M2 x E4M3 bound", shape);
    th::check_budget(name, ref16, dinp, budget16);

    std::vector<double> gT = transpose(gv, N, OC), egT = transpose(qg.err, N, OC), xT = transpose(x, N, C),
                        exT = transpose(qx.err, N, C);
    qerr = product_error(gT, egT, xT, exT, OC, C, N);
    gemm_nt(gT, xT, OC, C, N, exact, m2);
    ref16.assign(w16.size(), 0);
    budget16.assign(w16.size(), 0);
    for (size_t i = 0; i < w16.size(); i++) {
        ref16[i] = to_float(w16[i]);
        double c0 = to_float(dw0[i]);
        budget16[i] = bound(qerr[i], (N + 4) * (kU32 + kUacc) * (m2[i] + qerr[i] + std::fabs(c0)), std::fabs(exact[i] + c0),
                            std::fabs(exact[i]) + qerr[i]);
    }
    snprintf(name, sizeof(name), "matmul_backward_fp8 %s: dweight vs bf16 layer within the E5M2 x E4M3 bound", shape);
    th::check_budget(name, ref16, dw, budget16);
}

// How the plan cache of llmc/matmul.cuh records the fp8 GEMM (m, n, k) with `epilogue`: 1 run,
// -1 refused (its caller took another route), 0 never asked for. fp8 entries are those whose type
// slot is 2^16 or more (see cublaslt_matmul_fp8).
int fp8_route(int m, int n, int k, cublasLtEpilogue_t epilogue) {
    for (const auto& [cache_key, entry] : matmul_context().plans) {
        const MatmulKey& key = std::get<0>(cache_key);
        if (std::get<6>(key) >= (1 << 16) && std::get<0>(key) == m && std::get<1>(key) == n &&
            std::get<2>(key) == k && std::get<5>(key) == (int)epilogue)
            return entry.ok ? 1 : -1;
    }
    return 0;
}

const char* route_name(int r) { return r > 0 ? "run" : r < 0 ? "refused" : "not asked"; }

// Marks every cached fp8 GEMM with `epilogue` refused, as cublaslt_run does when cublasLtMatmul
// returns NOT_SUPPORTED or INVALID_VALUE for an algorithm the heuristic offered.
void refuse_fp8(cublasLtEpilogue_t epilogue) {
    for (auto& [cache_key, entry] : matmul_context().plans)
        if (std::get<6>(std::get<0>(cache_key)) >= (1 << 16) && std::get<5>(std::get<0>(cache_key)) == (int)epilogue)
            entry.ok = false;
}

// The fused GELU routes of the fp8 layer (N, C, OC) with bias and the tanh GELU: matmul_forward_fp8
// puts bias and GELU into the fp8 GEMM's epilogue (GELU_AUX_BIAS: out = GELU(v), pre = v) and
// matmul_backward_fp8 multiplies by gelu'(pre_below) there (DGELU); the CPU backend runs both, as
// cuBLAS 12.8+ must (NVIDIA's fp8 epilogue tests, see llmc/simt/cublaslt.cpp). Checked: the route
// each GEMM took (the plan cache); that once cuBLASLt refuses the fused GEMMs the layer falls
// back to the unfused route (the same fp8 GEMM with BIAS or DEFAULT, then gelu_forward /
// gelu_backward_inplace) and leaves dweight and dbias as they were; and that the fused and unfused
// results agree within what separates them, per element, where v is the exact GEMM (+ bias) on the
// fp8 values and S its sum of |terms| (scales included, + |bias|):
//   - each route's fp32 v: within dv = (K+4) u S, plus, where a bias is added, half a bf16 ulp of the
//     product (cuBLASLt may round it to bf16 first, see test_cublaslt.cu);
//   - pre (both: v rounded to bf16): 2 dv + two half ulps of bf16 at |v| + dv;
//   - out: the GELU inputs differ by 2 dv + the unfused route's rounding of v to bf16, carried through
//     |gelu'| <= 1.13; each GELU is a few fp32 ulps off (8 u |v| each), the fused one on a GPU up to
//     2^-12 |v| (hardware tanh); then both outputs are rounded to bf16;
//   - dinp (K = OC): the products w = dout W differ by 2 dw, dw = (OC+4) u S + the rounding of w to
//     bf16 (unfused, and fused on a GPU); each gelu'(x) is a few fp32 ulps of its largest term
//     (8 u (1 + |x| du/dx) each); then both are rounded to bf16.
void check_fp8_gelu_routes(int N, int C, int OC) {
    using bf16 = __nv_bfloat16;
    const int ldc = fp8_ld(C), ldo = fp8_ld(OC);
    auto inp = th::random_tensor<bf16>((size_t)N * C, 21), w = th::random_tensor<bf16>((size_t)OC * C, 22, -0.5f, 0.5f);
    auto b = th::random_tensor<bf16>(OC, 23), pre_below = th::random_tensor<bf16>((size_t)N * C, 24, -3.f, 3.f);
    auto dout = th::random_tensor<bf16>((size_t)N * OC, 25, -2e-5f, 2e-5f);
    auto dw0 = th::random_tensor<bf16>((size_t)OC * C, 26, -0.01f, 0.01f);
    auto db0 = th::random_tensor<bf16>(OC, 27, -0.01f, 0.01f);
    th::DeviceBuffer<bf16> d_inp(inp), d_w(w), d_b(b), d_dout(dout), d_pre_below(pre_below);
    th::DeviceBuffer<char> scratch(matmul_fp8_scratch_bytes(N, C, OC)), smem(fp8_linear_bytes(16));
    struct Results {
        std::vector<bf16> out, pre, dinp, dw, db;
    };
    // One forward and backward from fresh states (primed from these tensors: the same scales each time).
    auto layer = [&] {
        Fp8Linear st;
        fp8_linear_init(&st, smem.ptr, 16, 0, 0);
        th::DeviceBuffer<bf16> out((size_t)N * OC, th::Fill::NaN), pre((size_t)N * OC, th::Fill::NaN),
            dinp((size_t)N * C, th::Fill::NaN), dw(dw0), db(db0);
        matmul_forward_fp8(out.ptr, pre.ptr, d_inp.ptr, d_w.ptr, d_b.ptr, N, C, OC, GeluKind::Tanh, st, scratch.ptr, 0);
        matmul_backward_fp8(dinp.ptr, dw.ptr, db.ptr, scratch.ptr, d_dout.ptr, d_inp.ptr, d_w.ptr, d_pre_below.ptr, N,
                            C, OC, GeluKind::Tanh, st, 0);
        return Results{out.host(), pre.host(), dinp.host(), dw.host(), db.host()};
    };
    char name[200], shape[64];
    snprintf(shape, sizeof(shape), "N=%d C=%d OC=%d +bias +gelu_tanh", N, C, OC);

    matmul_forget_plans();
    const Results fused = layer();
    const int fwd_fused = fp8_route(OC, N, ldc, CUBLASLT_EPILOGUE_GELU_AUX_BIAS),
              fwd_plain = fp8_route(OC, N, ldc, CUBLASLT_EPILOGUE_BIAS),
              bwd_fused = fp8_route(C, N, ldo, CUBLASLT_EPILOGUE_DGELU),
              bwd_plain = fp8_route(C, N, ldo, CUBLASLT_EPILOGUE_DEFAULT);
    // The CPU backend runs the fused GEMMs; a GPU may refuse them (then the unfused GEMM must have run).
#if defined(SIMT_CPU)
    const bool fwd_ok = fwd_fused == 1 && fwd_plain == 0, bwd_ok = bwd_fused == 1 && bwd_plain == 0;
#else
    const bool fwd_ok = (fwd_fused == 1 && fwd_plain == 0) || (fwd_fused == -1 && fwd_plain == 1);
    const bool bwd_ok = (bwd_fused == 1 && bwd_plain == 0) || (bwd_fused == -1 && bwd_plain == 1);
#endif
    snprintf(name, sizeof(name), "matmul_forward_fp8 %s: bias and GELU fused into the fp8 GEMM", shape);
    th::report(fwd_ok, name, "GELU_AUX_BIAS %s, BIAS %s", route_name(fwd_fused), route_name(fwd_plain));
    snprintf(name, sizeof(name), "matmul_backward_fp8 %s: gelu' fused into the dinp fp8 GEMM", shape);
    th::report(bwd_ok, name, "DGELU %s, DEFAULT %s", route_name(bwd_fused), route_name(bwd_plain));

    refuse_fp8(CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
    refuse_fp8(CUBLASLT_EPILOGUE_DGELU);
    const Results unfused = layer();
    const int fwd_after = fp8_route(OC, N, ldc, CUBLASLT_EPILOGUE_BIAS),
              bwd_after = fp8_route(C, N, ldo, CUBLASLT_EPILOGUE_DEFAULT);
    snprintf(name, sizeof(name), "fp8 linear %s: fused GEMMs refused -> unfused fp8 GEMMs (BIAS, DEFAULT)", shape);
    th::report(fwd_after == 1 && bwd_after == 1, name, "BIAS %s, DEFAULT %s", route_name(fwd_after),
               route_name(bwd_after));
    snprintf(name, sizeof(name), "fp8 linear %s: the fallback leaves dweight and dbias bit for bit", shape);
    th::report(memcmp(fused.dw.data(), unfused.dw.data(), fused.dw.size() * sizeof(bf16)) == 0 &&
                   memcmp(fused.db.data(), unfused.db.data(), fused.db.size() * sizeof(bf16)) == 0,
               name);

    // The budgets (see above), from the fp8 values the GEMMs saw: primed scales fp8_max / amax.
    const float sx = 448.f / host_amax(inp), sw = 448.f / host_amax(w), sg = 57344.f / host_amax(dout);
    const double sxw = (double)(1.f / sw) * (1.f / sx), sgw = (double)(1.f / sw) * (1.f / sg);
    const double eps = th::EPS_BF16;
    const double kUacc = th::fp8_accumulation().unit;  // the fp8 GEMMs' (test/fp8_accumulation.h)
    Quantized qx = quantize(inp, sx, __NV_E4M3), qw = quantize(w, sw, __NV_E4M3), qg = quantize(dout, sg, __NV_E5M2);
    std::vector<double> acc, mag;
    gemm_nt(qx.q, qw.q, N, OC, C, acc, mag);
    std::vector<double> ref_pre(acc.size()), ref_out(acc.size()), budget_pre(acc.size()), budget_out(acc.size());
    for (size_t i = 0; i < acc.size(); i++) {
        const double bias = to_float(b[i % OC]), p = acc[i] * sxw, v = std::fabs(p + bias);
        const double dv = (C + 4) * kUacc * (mag[i] * sxw + std::fabs(bias)) + 0.5 * eps * std::fabs(p);
        ref_pre[i] = to_float(unfused.pre[i]);
        budget_pre[i] = 2 * dv + eps * (v + dv);
        const double gelu_in = 2 * dv + 0.5 * eps * (v + dv);
        const double d_out = kGeluLipschitz * gelu_in + (16 * kU32 + kGeluEpilogueTanh) * v;
        ref_out[i] = to_float(unfused.out[i]);
        budget_out[i] = d_out + eps * (std::fabs(gelu_tanh(p + bias)) + d_out);
    }
    snprintf(name, sizeof(name), "matmul_forward_fp8 %s: fused pre-GELU vs unfused", shape);
    th::check_budget(name, ref_pre, fused.pre, budget_pre);
    snprintf(name, sizeof(name), "matmul_forward_fp8 %s: fused GELU vs unfused (gelu_forward)", shape);
    th::check_budget(name, ref_out, fused.out, budget_out);

    gemm_nt(qg.q, transpose(qw.q, OC, C), N, C, OC, acc, mag);
    std::vector<double> ref_dinp(acc.size()), budget_dinp(acc.size());
    for (size_t i = 0; i < acc.size(); i++) {
        const double x = to_float(pre_below[i]), p = std::fabs(acc[i] * sgw);
        const double e = (OC + 4) * kUacc * mag[i] * sgw, dw = e + 0.5 * eps * (p + e);
        const double du = 0.7978845608028654 * (1 + 3 * 0.044715 * x * x), gd_err = 8 * kU32 * (1 + std::fabs(x) * du);
        const double g = std::fabs(gelu_tanh_grad(x));
        const double d_dinp = (g + gd_err) * 2 * dw + (p + dw) * 2 * gd_err;
        ref_dinp[i] = to_float(unfused.dinp[i]);
        budget_dinp[i] = d_dinp + eps * (p * g + d_dinp);
    }
    snprintf(name, sizeof(name), "matmul_backward_fp8 %s: fused dGELU vs unfused (gelu_backward_inplace)", shape);
    th::check_budget(name, ref_dinp, fused.dinp, budget_dinp);
    matmul_forget_plans();  // forget the refusals planted above
}

// ----------------------------------------------------------------------------
// Refusals

void check_capability() {
    std::string why;
    struct Case {
        int major, minor;
        bool ok;
    } cases[] = {{7, 0, false}, {8, 0, false}, {8, 6, false}, {8, 7, false}, {8, 9, true},
                 {9, 0, true},  {10, 0, true}, {12, 0, true}};
    bool all = true;
    for (const Case& c : cases) all = all && fp8_supported_cc(c.major, c.minor, nullptr) == c.ok;
    bool refused = !fp8_supported_cc(8, 0, &why);
    bool says = why.find("8.9") != std::string::npos && why.find("8.0") != std::string::npos &&
                why.find("--precision bf16") != std::string::npos;
    th::report(all && refused && says, "fp8_supported_cc: refuses below 8.9 (7.0 8.0 8.6 8.7), accepts 8.9 9.0 10.0 12.0",
               "A100's message: \"%s\"", why.c_str());
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    std::string why_dev;
    bool dev = fp8_supported(0, &why_dev);
    bool consistent = dev == fp8_supported_cc(prop.major, prop.minor, nullptr);
    th::report(consistent && (dev || why_dev.find(prop.name) != std::string::npos),
               "fp8_supported(device 0) follows the device's compute capability", "cc %d.%d -> %s%s", prop.major,
               prop.minor, dev ? "supported" : "refused: ", why_dev.c_str());
}

// A call that must stop with `expect` on stderr (exit status 1) before launching anything.
template <class F>
void expect_refusal(const char* name, const char* expect, F body) {
    th::ChildOutput r = th::run_in_child(body);
    std::string& err = r.text;
    while (!err.empty() && err.back() == '\n') err.pop_back();
    bool ok = WIFEXITED(r.status) && WEXITSTATUS(r.status) == EXIT_FAILURE && err.find(expect) != std::string::npos;
    th::report(ok, name, "stderr: %s", err.c_str());
}

void check_refusals() {
    using bf16 = __nv_bfloat16;
    const int N = 16, C = 16, OC = 16;
    th::DeviceBuffer<bf16> x((size_t)N * C + 8, th::Fill::Zero), w((size_t)OC * C, th::Fill::Zero),
        out((size_t)N * OC + 8, th::Fill::Zero);
    th::DeviceBuffer<char> scratch(matmul_fp8_scratch_bytes(N, 24, OC)), mem(fp8_linear_bytes(4));
    Fp8Linear st;
    fp8_linear_init(&st, mem.ptr, 4, 0, 0);
    expect_refusal("matmul_forward_fp8 refuses C=12 (not a multiple of 8)", "multiples of 8", [&] {
        matmul_forward_fp8(out.ptr, nullptr, x.ptr, w.ptr, nullptr, N, 12, OC, GeluKind::Tanh, st, scratch.ptr, 0);
    });
    expect_refusal("matmul_forward_fp8 refuses an output that is not 16-byte aligned", "16-byte aligned", [&] {
        matmul_forward_fp8(out.ptr + 1, nullptr, x.ptr, w.ptr, nullptr, N, C, OC, GeluKind::Tanh, st, scratch.ptr, 0);
    });
    expect_refusal("matmul_backward_fp8 refuses states no forward pass has set", "run matmul_forward_fp8", [&] {
        matmul_backward_fp8(x.ptr, w.ptr, nullptr, scratch.ptr, out.ptr, x.ptr, w.ptr, nullptr, N, C, OC,
                            GeluKind::Tanh, st, 0);
    });
    expect_refusal("fp8_scaling_init refuses a history longer than the update kernel holds", "history length", [&] {
        Fp8Scaling s;
        fp8_scaling_init(&s, mem.ptr, __NV_E4M3, FP8_MAX_HISTORY + 1, 0, 0);
    });
}

// The probe the fp8 GEMM budgets take their accumulation unit from (test/fp8_accumulation.h). The CPU
// backend accumulates in fp32, so there it must find every sum exact, or, with
// SIMT_FP8_ACCUMULATION_BITS=n (a narrow accumulator, as Hopper's), exactly n bits; a GPU's
// accumulator must keep at least the 8 bits of the probe's first step (fewer would leave the budgets
// no bound worth the name), and the line says what it measured.
void check_accumulation_probe() {
    const th::Fp8Accumulation& acc = th::fp8_accumulation();
    if (!acc.measured) {
        printf("SKIP fp8 accumulation probe: %s\n", acc.why.c_str());
        return;
    }
    const char* narrow = getenv("SIMT_FP8_ACCUMULATION_BITS");
    const int bits = on_cpu_backend() && narrow && *narrow ? atoi(narrow) : 0;
    bool ok = !on_cpu_backend() ? acc.kept >= 8
              : bits == 0       ? acc.first_lost == 0
                                : acc.kept == std::min(bits, 18) && acc.first_lost == (bits < 18 ? bits + 1 : 0);
    std::string expect = !on_cpu_backend() ? ""
                         : bits == 0       ? " (CPU backend: fp32, as required)"
                                           : " (CPU backend: SIMT_FP8_ACCUMULATION_BITS=" + std::to_string(bits) + ")";
    th::report(ok, "fp8 accumulation probe: the budgets' accumulation unit",
               "sums exact for j <= %d (first lost: %s): unit %.3g%s", acc.kept,
               acc.first_lost ? std::to_string(acc.first_lost).c_str() : "none", acc.unit, expect.c_str());
}

int main() {
    matmul_init();
    check_capability();
    check_conversion(__NV_E4M3);
    check_conversion(__NV_E5M2);

    for (auto f : {__NV_E4M3, __NV_E5M2}) {
        float big = f == __NV_E4M3 ? 300.f : 20000.f;  // saturates the planted 5.0 and 9.5
        check_cast<__nv_bfloat16>(37, 100, f, big, 0);
        check_cast<__nv_bfloat16>(64, 64, f, 1.f, 0);
        check_cast<__nv_bfloat16>(130, 48, f, 40.f, 1);  // odd offset: the scalar read path
        check_cast<__nv_bfloat16>(3, 7, f, 2.f, 0);       // odd width: the scalar read path
        check_cast<float>(65, 129, f, big, 0);
        check_cast<float>(70, 30, f, 0.125f, 0);
    }

    check_update_sequence("steps", __NV_E4M3, 4, 0,
                          {3.f, 0.5f, 0.f, 7.f, 0.1f, 0.1f, 0.1f, 0.1f, INFINITY, 0.2f, 0.2f, 0.2f, 0.2f, 1e-3f}, 5);
    check_update_sequence("amax 1e-37 (scale capped at 2^126), then 0", __NV_E5M2, 1, 0, {1e-37f, 0.f, 2.f}, 1);
    // Subnormal amaxes count as 0 on every backend (a flush-to-zero GPU and the CPU backend agree): the
    // scale from 2 stays while 2 is in the history, and after it.
    check_update_sequence("subnormal amaxes 1e-38, 1e-40 (count as 0)", __NV_E4M3, 2, 0, {2.f, 1e-38f, 1e-40f, 3.f},
                          3);
    check_update_sequence("amax 1e38, margin 10 (scale floored at 2^-126)", __NV_E4M3, 1, 10, {1e38f, 1.f}, 1);
    check_update_sequence("600 partials", __NV_E4M3, 16, 0, {1.5f, 2e-3f, 80.f, 80.f, 3.f}, 600);
    check_update_sequence("long history", __NV_E5M2, 1000, 2, {1e-6f, 3e-6f, 2e-7f, 4e-6f, 1e-6f, 5e-7f}, 3);
    check_update_batch();
    check_delayed_scaling();

    check_accumulation_probe();
    // Shapes: nothing a multiple of 16 (padding of every reduction), aligned, GPT-2-like scaled down.
    check_fp8_linear(37, 72, 40, false, 0);
    check_fp8_linear(37, 72, 40, true, 0);
    check_fp8_linear(64, 64, 128, true, 1);
    check_fp8_linear(50, 48, 24, true, 2);
    check_fp8_linear(128, 96, 384, true, 1);
    check_fp8_gelu_routes(64, 96, 128);

    check_refusals();
    matmul_destroy();
    return th::finish();
}
