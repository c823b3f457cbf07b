// test/test_attention.cu — flash attention (llmc/attention.cuh), forward and backward, for fp32, bf16
// and fp16, causal or not, with and without padding (valid_len), against a naive CPU reference in double:
// softmax(Q K^T / sqrt(HS) + mask) V and its analytic gradient.
//
// Tolerances, from a first-order rounding-error analysis (|fl(sum x) - sum x| <= n eps sum|x|). Each
// output element is compared with a budget k*eps*mag, where mag is the same formula as the output
// with every term replaced by its absolute value (so cancellation cannot make the budget vanish):
//   out_i:  mag = sum_j p_ij |v_j|
//   dv_j:   mag = sum_i p_ij |dO_i|
//   dq_i:   mag = scale sum_j p_ij A_ij |k_j|,  dk_j: mag = scale sum_i p_ij A_ij |q_i|,
//           A_ij = sum_d |dO_id| (|v_jd| + mag_out_id)   (>= |dP_ij| + |D_i|, with the error of O in D)
//   lse_i:  mag = 1 + |lse_i| + amax
// fp32: every length-n fp32 sum contributes n eps: the sums over T keys (and T/64 rescalings) in the
//   numerator and denominator of out; the HS-long score dot products, whose absolute error becomes
//   relative error of p through exp; exp2, the scaling and the division a few more. So
//   k_fwd = 2 (T + T/64 + HS) + 16, and for the backward, whose P comes from the forward's lse, whose
//   D uses the forward's O, and which sums T terms of HS-long products, k_bwd = 2 k_fwd + T + HS + 4.
//   (The worst case, with every rounding error aligned, multiplies the HS term by the largest
//   |scaled score| sum, amax = max_ij scale sum_d |q_id k_jd|, about 8 here; random rounding errors
//   grow like sqrt(HS), which the factor 2 covers. Observed errors use a few % of this budget.)
// bf16 and fp16: inputs are values of the type, and the reference is computed from those same
//   values, so only the kernel's roundings count: P and dS rounded to the type before their products,
//   the row sum of the rounded P, the rounded outputs; at most about 3 half-ulps lie on any path to an
//   output, so k = 4 with the type's eps (the fp32 roundings above stay below 0.1 of fp16's eps at
//   these T and HS).
// fp16 below its normal range (2^-14): there a rounding errs by up to half the smallest subnormal,
//   2^-25, absolutely, not relative to the value. Outputs that small (a key only a few queries
//   weakly attend to has a tiny dv) get 2^-25; and each P or dS factor of a product sum may be that
//   small (P = exp(s - lse) of a weakly attended key), adding 2^-25 times the other factor's |value|
//   per term: the budget adds 2^-25 (1 + sub) with sub = sum over the terms of that |factor|:
//   out_i: sum_j |v_j|, dv_j: sum_i |dO_i|, dq_i: scale sum_j |k_j|, dk_j: scale sum_i |q_i|.
//   (For fp32 and bf16, whose subnormals start at 2^-126, the term is below 1e-37: nothing.)
//   And, as FlashAttention tests itself: the kernel's max error must be at most 2x the max error of a
//   naive attention in the same type (fp32 math; Q, K, V, dO, P, dS and the outputs rounded to the
//   type), plus an fp32-rounding allowance 2 (HS + T) eps_fp32 max(mag) for cases where the naive error
//   is exactly 0 (a single visible key) while the kernel's summation order leaves fp32 noise.
// Padded rows (t >= valid_len) must be exactly zero in out, lse and dqkv; buffers start as NaN so an
// element the kernels forget to write fails. Every case runs under th::run_orders (bit-identical
// results under forward, reverse and random thread orders).
//
// Dropout on P (AttentionDropout): the references take the mask from dropout_attention_keep, the host
// twin of what the kernels compute per tile, and use the exact 1/(1-p) (the kernels' fp32 rounding of
// it is one more rounding, inside the budgets' constant terms). The magnitudes above then carry the
// mask: p_ij becomes p_ij M_ij/(1-p) in out, dv and A_ij's |v_j| term; dS = p_ij (M_ij dP_ij/(1-p) - D_i).
// Same tolerances; the fp16 subnormal allowance of out and dv grows by 1/(1-p), the factor the kernels
// apply to the rounded P after the product. Also: p = 0 (and a p so small that nothing is dropped and
// 1/(1-p) rounds to 1 in fp32, which runs the dropout kernels) gives the dropout-free bits; the mask
// does not depend on the padded length T; padded rows stay zero; the keep rate of the visible elements
// is within 5 sigma of the binomial's 1-p.
//
// Block shapes (llmc/attention.cuh): the fp32 kernels' shapes chosen on this device (attn_compact_warps)
// and the bf16/fp16 mma.sync kernels' one shape fit its opt-in shared memory per block (and the 16-bit
// ones at HS <= 64 leave room for two blocks per SM on an A100); the compact blocks of a 99 KiB device
// (an L4, RTX 3090), forced here by lowering the limit the launchers plan for, give bit for bit the
// results of the device's own shapes, which the checks above hold to the reference (for the 16-bit
// types, whose shape never changes, this checks that the planned limit changes nothing); on the CPU
// backend a child process runs attention on the L4 profile (SIMT_DEVICE=l4, whose 99 KiB the backend
// enforces) against the reference; a head size that fits no shape stops with one line naming its needs.
//
// The bf16/fp16 backward's dQ slices (attention_dq_splits): small shapes give blocks of one or two key
// tiles, so three cases lower the block target to give blocks more (one slice; two; four), and
// attention_dq_splits' choice is checked on GPT-2's shapes and on ties.
#include "../llmc/attention.cuh"
#include "harness.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

// ----------------------------------------------------------------------------
// Test cases and host data

struct Case {
    int B, T, NH, HS;
    bool causal;
    std::vector<int> valid;  // per sequence; empty: valid_len = nullptr
    float dropout = 0.f;     // drop probability of P (seed and offset: kDropSeed, kDropOffset)
    int C() const { return NH * HS; }
    int valid_of(int b) const { return valid.empty() ? T : std::min(std::max(valid[b], 0), T); }
    std::string name(const char* dtype) const {
        char buf[160];
        std::string v;
        for (size_t b = 0; b < valid.size(); b++) v += (b ? "," : "") + std::to_string(valid[b]);
        snprintf(buf, sizeof(buf), "%s B=%d T=%d NH=%d HS=%d %s valid_len=%s", dtype, B, T, NH, HS,
                 causal ? "causal" : "full", valid.empty() ? "null" : ("{" + v + "}").c_str());
        std::string n = buf;
        if (dropout > 0) n += " dropout=" + std::to_string(dropout).substr(0, 4);
        if (HS == 64 && dropout == 0 && strcmp(dtype, "fp32") != 0) {
            if (attention_forward_wgmma()) n += " (wgmma forward)";
            if (attention_backward_wgmma())
                n += attention_backward_wgmma_defer_dq() ? " (wgmma backward, dQ deferred)" : " (wgmma backward)";
        }
        return n;
    }
};

constexpr uint64_t kDropSeed = 0x5eed0123456789abull, kDropOffset = 42;

// The case's dropout as the launchers take it.
AttentionDropout attention_dropout(const Case& cs) { return AttentionDropout{cs.dropout, kDropSeed, kDropOffset}; }

// The case's mask factor for (b, h, query i, key j): M_ij / (1-p), in double (1 without dropout).
struct MaskFactor {
    const Case& cs;
    DropoutArgs d;
    explicit MaskFactor(const Case& c) : cs(c), d(dropout_args("test", c.dropout, kDropSeed, kDropOffset)) {}
    double operator()(int b, int h, int i, int j) const {
        if (cs.dropout == 0) return 1;
        return dropout_attention_keep(d, b * cs.NH + h, i, j) ? 1 / (1 - (double)cs.dropout) : 0;
    }
};

template <class floatX> float round_to(float x) { return to_float(from_float<floatX>(x)); }

// Results of one implementation, all as float/double on the host: out (B,T,C), lse (B,NH,T), dqkv (B,T,3C).
struct Results {
    std::vector<double> out, lse, dqkv;
};

// The exact reference in double, plus the magnitudes of the tolerance model.
struct Reference {
    Results r;
    std::vector<double> mag_out, mag_lse, mag_dqkv;
    std::vector<double> sub_out, sub_dqkv;  // the sums of |factor| of the subnormal allowance
    double amax = 0;
};

Reference reference(const Case& cs, const std::vector<float>& qkv, const std::vector<float>& dout) {
    const int B = cs.B, T = cs.T, NH = cs.NH, HS = cs.HS, C = cs.C();
    const double scale = 1.0 / std::sqrt((double)HS);
    const MaskFactor mask(cs);
    const double rp = 1 / (1 - (double)cs.dropout);  // what the rounded P is scaled by, after the product
    Reference ref;
    ref.r.out.assign((size_t)B * T * C, 0);
    ref.r.lse.assign((size_t)B * NH * T, 0);
    ref.r.dqkv.assign((size_t)B * T * 3 * C, 0);
    ref.mag_out = ref.sub_out = ref.r.out;
    ref.mag_dqkv = ref.sub_dqkv = ref.r.dqkv;
    ref.mag_lse.assign(ref.r.lse.size(), 0);
    std::vector<double> s(T), a(T), p(T);
    for (int b = 0; b < B; b++) {
        int valid = cs.valid_of(b);
        for (int h = 0; h < NH; h++) {
            auto q = [&](int t, int d) { return (double)qkv[((size_t)b * T + t) * 3 * C + h * HS + d]; };
            auto k = [&](int t, int d) { return (double)qkv[((size_t)b * T + t) * 3 * C + C + h * HS + d]; };
            auto v = [&](int t, int d) { return (double)qkv[((size_t)b * T + t) * 3 * C + 2 * C + h * HS + d]; };
            auto g = [&](int t, int d) { return (double)dout[((size_t)b * T + t) * C + h * HS + d]; };
            auto at = [&](std::vector<double>& x, int t, int part, int d) -> double& {
                return x[((size_t)b * T + t) * 3 * C + part * C + h * HS + d];
            };
            for (int i = 0; i < valid; i++) {
                int nk = cs.causal ? i + 1 : valid;  // keys 0 .. nk-1 are visible
                double m = -INFINITY;
                for (int j = 0; j < nk; j++) {
                    double dot = 0, adot = 0;
                    for (int d = 0; d < HS; d++) dot += q(i, d) * k(j, d), adot += std::fabs(q(i, d) * k(j, d));
                    s[j] = dot * scale;
                    a[j] = adot * scale;
                    m = std::max(m, s[j]);
                    ref.amax = std::max(ref.amax, a[j]);
                }
                double sum = 0;
                for (int j = 0; j < nk; j++) sum += p[j] = std::exp(s[j] - m);
                for (int j = 0; j < nk; j++) p[j] /= sum;
                size_t lse_i = ((size_t)b * NH + h) * T + i;
                ref.r.lse[lse_i] = m + std::log(sum);
                ref.mag_lse[lse_i] = 1 + std::fabs(ref.r.lse[lse_i]);  // + amax, added below
                std::vector<double> o(HS, 0), mo(HS, 0), so(HS, 0), md(nk);  // md: M_ij / (1-p)
                for (int j = 0; j < nk; j++) {
                    md[j] = mask(b, h, i, j);
                    for (int d = 0; d < HS; d++) {
                        o[d] += p[j] * md[j] * v(j, d), mo[d] += p[j] * md[j] * std::fabs(v(j, d));
                        so[d] += rp * std::fabs(v(j, d));
                    }
                }
                double D = 0;
                for (int d = 0; d < HS; d++) {
                    ref.r.out[((size_t)b * T + i) * C + h * HS + d] = o[d];
                    ref.mag_out[((size_t)b * T + i) * C + h * HS + d] = mo[d];
                    ref.sub_out[((size_t)b * T + i) * C + h * HS + d] = so[d];
                    D += g(i, d) * o[d];
                }
                for (int j = 0; j < nk; j++) {
                    double dp = 0, A = 0;
                    for (int d = 0; d < HS; d++) {
                        dp += g(i, d) * v(j, d);
                        A += std::fabs(g(i, d)) * (md[j] * std::fabs(v(j, d)) + mo[d]);
                    }
                    double ds = p[j] * (md[j] * dp - D);
                    for (int d = 0; d < HS; d++) {
                        at(ref.r.dqkv, i, 0, d) += scale * ds * k(j, d);
                        at(ref.r.dqkv, j, 1, d) += scale * ds * q(i, d);
                        at(ref.r.dqkv, j, 2, d) += p[j] * md[j] * g(i, d);
                        at(ref.mag_dqkv, i, 0, d) += scale * p[j] * A * std::fabs(k(j, d));
                        at(ref.mag_dqkv, j, 1, d) += scale * p[j] * A * std::fabs(q(i, d));
                        at(ref.mag_dqkv, j, 2, d) += p[j] * md[j] * std::fabs(g(i, d));
                        at(ref.sub_dqkv, i, 0, d) += scale * std::fabs(k(j, d));
                        at(ref.sub_dqkv, j, 1, d) += scale * std::fabs(q(i, d));
                        at(ref.sub_dqkv, j, 2, d) += rp * std::fabs(g(i, d));
                    }
                }
            }
        }
    }
    for (double& x : ref.mag_lse)
        if (x > 0) x += ref.amax;
    return ref;
}

// A naive attention in a 16-bit type: the textbook algorithm in fp32 with the operands of every
// product (Q, K, V, dO are floatX values already; P, dropped and scaled, and dS) and every output
// rounded to floatX: the error any attention in that type makes, against which the kernel is judged.
template <class floatX>
Results naive_lowp(const Case& cs, const std::vector<float>& qkv, const std::vector<float>& dout) {
    const int B = cs.B, T = cs.T, NH = cs.NH, HS = cs.HS, C = cs.C();
    const float scale = 1.f / std::sqrt((float)HS);
    const MaskFactor mask(cs);
    Results r;
    r.out.assign((size_t)B * T * C, 0);
    r.dqkv.assign((size_t)B * T * 3 * C, 0);
    std::vector<float> P((size_t)T * T), dS((size_t)T * T), acc(HS);
    for (int b = 0; b < B; b++) {
        int valid = cs.valid_of(b);
        for (int h = 0; h < NH; h++) {
            auto x = [&](int t, int part, int d) { return qkv[((size_t)b * T + t) * 3 * C + part * C + h * HS + d]; };
            auto g = [&](int t, int d) { return dout[((size_t)b * T + t) * C + h * HS + d]; };
            auto nk = [&](int i) { return cs.causal ? i + 1 : valid; };
            std::fill(P.begin(), P.end(), 0.f);
            std::fill(dS.begin(), dS.end(), 0.f);
            for (int i = 0; i < valid; i++) {
                float m = -INFINITY, sum = 0;
                std::vector<float> s(nk(i)), p(nk(i));
                for (int j = 0; j < nk(i); j++) {
                    float dot = 0;
                    for (int d = 0; d < HS; d++) dot += x(i, 0, d) * x(j, 1, d);
                    s[j] = dot * scale;
                    m = std::max(m, s[j]);
                }
                std::vector<float> md(nk(i));  // M_ij / (1-p)
                for (int j = 0; j < nk(i); j++) sum += p[j] = std::exp(s[j] - m);
                for (int j = 0; j < nk(i); j++) {
                    md[j] = (float)mask(b, h, i, j);
                    P[(size_t)i * T + j] = round_to<floatX>((p[j] /= sum) * md[j]);
                }
                for (int d = 0; d < HS; d++) {
                    float o = 0;
                    for (int j = 0; j < nk(i); j++) o += P[(size_t)i * T + j] * x(j, 2, d);
                    r.out[((size_t)b * T + i) * C + h * HS + d] = round_to<floatX>(o);
                }
                // softmax backward: dS = P (dP - rowsum(P dP)), dP = dO V^T
                std::vector<float> dp(nk(i));
                float Dsum = 0;
                for (int j = 0; j < nk(i); j++) {
                    dp[j] = 0;
                    for (int d = 0; d < HS; d++) dp[j] += g(i, d) * x(j, 2, d);
                    dp[j] *= md[j];
                    Dsum += p[j] * dp[j];
                }
                for (int j = 0; j < nk(i); j++) dS[(size_t)i * T + j] = round_to<floatX>(p[j] * (dp[j] - Dsum));
            }
            for (int t = 0; t < valid; t++) {
                for (int part = 0; part < 3; part++) {
                    std::fill(acc.begin(), acc.end(), 0.f);
                    for (int u = 0; u < valid; u++)
                        for (int d = 0; d < HS; d++) {
                            if (part == 0) acc[d] += dS[(size_t)t * T + u] * x(u, 1, d);  // dQ = dS K
                            if (part == 1) acc[d] += dS[(size_t)u * T + t] * x(u, 0, d);  // dK = dS^T Q
                            if (part == 2) acc[d] += P[(size_t)u * T + t] * g(u, d);      // dV = P^T dO
                        }
                    for (int d = 0; d < HS; d++)
                        r.dqkv[((size_t)b * T + t) * 3 * C + part * C + h * HS + d] =
                            round_to<floatX>(part == 2 ? acc[d] : acc[d] * scale);
                }
            }
        }
    }
    return r;
}

// ----------------------------------------------------------------------------
// Running the kernels

// Runs forward then backward; returns the raw bytes of out, lse and dqkv back to back (so that
// run_orders can compare them bit for bit).
template <class floatX>
std::vector<unsigned char> run_kernels(const Case& cs, const std::vector<float>& qkv_h,
                                       const std::vector<float>& dout_h,
                                       const AttentionDropout* dropout = nullptr) {
    const int B = cs.B, T = cs.T, NH = cs.NH, C = cs.C();
    size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C, n_lse = (size_t)B * NH * T;
    th::DeviceBuffer<floatX> qkv(th::round_to<floatX>(qkv_h)), dout(th::round_to<floatX>(dout_h));
    th::DeviceBuffer<int> valid(cs.valid);
    // NaN everywhere: an element the kernels do not write shows up.
    th::DeviceBuffer<floatX> out(n_out, th::Fill::NaN), dqkv(n_qkv, th::Fill::NaN);
    th::DeviceBuffer<float> lse(n_lse, th::Fill::NaN);
    th::DeviceBuffer<char> scratch(attention_backward_scratch_bytes<floatX>(B, T, C, NH), th::Fill::NaN);
    const int* valid_len = cs.valid.empty() ? nullptr : valid.ptr;
    if (dropout) {
        attention_forward(out.ptr, lse.ptr, qkv.ptr, B, T, C, NH, cs.causal, valid_len, 0, *dropout);
        attention_backward(dqkv.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr, scratch.ptr, B, T, C, NH, cs.causal,
                           valid_len, 0, *dropout);
    } else {  // the call sites that predate dropout
        attention_forward(out.ptr, lse.ptr, qkv.ptr, B, T, C, NH, cs.causal, valid_len, 0);
        attention_backward(dqkv.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr, scratch.ptr, B, T, C, NH, cs.causal,
                           valid_len, 0);
    }
    cudaCheck(cudaDeviceSynchronize());
    size_t bytes_out = n_out * sizeof(floatX), bytes_lse = n_lse * sizeof(float), bytes_dqkv = n_qkv * sizeof(floatX);
    std::vector<unsigned char> all(bytes_out + bytes_lse + bytes_dqkv);
    cudaCheck(cudaMemcpy(all.data(), out.ptr, bytes_out, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(all.data() + bytes_out, lse.ptr, bytes_lse, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(all.data() + bytes_out + bytes_lse, dqkv.ptr, bytes_dqkv, cudaMemcpyDeviceToHost));
    return all;
}

template <class floatX>
Results unpack(const Case& cs, const std::vector<unsigned char>& all) {
    size_t n_out = (size_t)cs.B * cs.T * cs.C(), n_lse = (size_t)cs.B * cs.NH * cs.T, n_qkv = 3 * n_out;
    Results r;
    const floatX* out = reinterpret_cast<const floatX*>(all.data());
    const float* lse = reinterpret_cast<const float*>(all.data() + n_out * sizeof(floatX));
    const floatX* dqkv = reinterpret_cast<const floatX*>(all.data() + n_out * sizeof(floatX) + n_lse * sizeof(float));
    for (size_t i = 0; i < n_out; i++) r.out.push_back(to_float(out[i]));
    for (size_t i = 0; i < n_lse; i++) r.lse.push_back(lse[i]);
    for (size_t i = 0; i < n_qkv; i++) r.dqkv.push_back(to_float(dqkv[i]));
    return r;
}

// ----------------------------------------------------------------------------
// Checks

// The elements of one tensor that belong to one of q/k/v (part 0/1/2) of dqkv, or all of it (part -1).
std::vector<double> part_of(const std::vector<double>& x, int C, int part) {
    if (part < 0) return x;
    std::vector<double> y;
    for (size_t i = 0; i < x.size(); i++)
        if ((int)(i % (3 * C)) / C == part) y.push_back(x[i]);
    return y;
}

// |out - ref| <= k * eps * mag + half_denorm * (1 + sub) element-wise (sub empty: an fp32 output,
// no subnormal allowance).
bool check_mag(const std::string& name, const std::vector<double>& ref, const std::vector<double>& mag,
               const std::vector<double>& sub, const std::vector<double>& out, double k, double eps,
               double half_denorm) {
    std::vector<double> budget(mag.size());
    for (size_t i = 0; i < mag.size(); i++)
        budget[i] = k * eps * mag[i] + (sub.empty() ? 0 : half_denorm * (1 + sub[i]));
    return th::check_budget(name.c_str(), ref, out, budget);
}

double max_abs_err(const std::vector<double>& a, const std::vector<double>& b) {
    double m = 0;
    for (size_t i = 0; i < a.size(); i++) m = std::max(m, std::isnan(a[i] - b[i]) ? INFINITY : std::fabs(a[i] - b[i]));
    return m;
}

// Rows t >= valid_len[b] of out, lse and dqkv are exactly zero.
bool check_padding_zero(const std::string& name, const Case& cs, const Results& r) {
    size_t nonzero = 0, checked = 0;
    for (int b = 0; b < cs.B; b++)
        for (int t = cs.valid_of(b); t < cs.T; t++) {
            for (int c = 0; c < cs.C(); c++, checked++) nonzero += r.out[((size_t)b * cs.T + t) * cs.C() + c] != 0;
            for (int c = 0; c < 3 * cs.C(); c++, checked++)
                nonzero += r.dqkv[((size_t)b * cs.T + t) * 3 * cs.C() + c] != 0;
            for (int h = 0; h < cs.NH; h++, checked++) nonzero += r.lse[((size_t)b * cs.NH + h) * cs.T + t] != 0;
        }
    return th::report(nonzero == 0, name.c_str(), "%zu of %zu padded-row elements are not exactly 0", nonzero, checked);
}

// Inputs of a case, values of floatX so that the reference sees exactly the kernel's inputs: qkv (B,T,3C)
// and dout (B,T,C). Q and K in [-2, 2) make the scores spread (std ~1.3), so the running max moves and
// rows are peaked.
template <class floatX>
void make_inputs(const Case& cs, uint64_t seed, std::vector<float>& qkv, std::vector<float>& dout) {
    const int C = cs.C();
    qkv.resize((size_t)cs.B * cs.T * 3 * C);
    dout.resize((size_t)cs.B * cs.T * C);
    th::fill_uniform(qkv.data(), qkv.size(), seed, -1.f, 1.f);
    for (size_t i = 0; i < qkv.size(); i++)
        if ((i % (3 * C)) < (size_t)(2 * C)) qkv[i] *= 2.f;
    th::fill_uniform(dout.data(), dout.size(), seed + 1, -1.f, 1.f);
    for (auto* x : {&qkv, &dout})
        for (float& e : *x) e = round_to<floatX>(e);
}

// The share of the case's visible (b, h, query, key) elements the dropout mask keeps must be within 5
// sigma of the binomial's 1-p: |kept/n - (1-p)| <= 5 sqrt(p(1-p)/n) (a false alarm once in ~1.7 million).
void check_keep_rate(const std::string& name, const Case& cs) {
    const MaskFactor mask(cs);
    size_t n = 0, kept = 0;
    for (int b = 0; b < cs.B; b++)
        for (int h = 0; h < cs.NH; h++)
            for (int i = 0; i < cs.valid_of(b); i++)
                for (int j = 0; j < (cs.causal ? i + 1 : cs.valid_of(b)); j++, n++) kept += mask(b, h, i, j) != 0;
    double p = cs.dropout, rate = (double)kept / n, bound = 5 * std::sqrt(p * (1 - p) / n);
    th::report(std::fabs(rate - (1 - p)) <= bound, name.c_str(), "kept %zu of %zu = %.4f, 1-p = %.4f, bound %.4f", kept,
               n, rate, 1 - p, bound);
}

template <class floatX>
void test_case(const Case& cs, uint64_t seed) {
    const bool lowp = !std::is_same<floatX, float>::value;
    const std::string name = cs.name(th::dtype_name<floatX>());
    const int C = cs.C();
    std::vector<float> qkv, dout;
    make_inputs<floatX>(cs, seed, qkv, dout);

    const AttentionDropout dropout = attention_dropout(cs);
    auto raw = th::run_orders((name + " thread orders").c_str(),
                              [&] { return run_kernels<floatX>(cs, qkv, dout, cs.dropout > 0 ? &dropout : nullptr); });
    Results got = unpack<floatX>(cs, raw);
    Reference ref = reference(cs, qkv, dout);

    double k_fwd, k_bwd, eps;
    if (lowp) {
        k_fwd = k_bwd = 4;
        eps = dtype_eps<floatX>();
    } else {
        k_fwd = 2 * (cs.T + cs.T / 64 + cs.HS) + 16;
        k_bwd = 2 * k_fwd + cs.T + cs.HS + 4;
        eps = th::EPS_FP32;
    }
    const char* parts[3] = {"dq", "dk", "dv"};
    const double half_denorm = dtype_denorm_min<floatX>() / 2;
    check_mag(name + " out", ref.r.out, ref.mag_out, ref.sub_out, got.out, k_fwd, eps, half_denorm);
    check_mag(name + " lse", ref.r.lse, ref.mag_lse, {}, got.lse, k_fwd, eps, half_denorm);
    for (int part = 0; part < 3; part++)
        check_mag(name + " " + parts[part], part_of(ref.r.dqkv, C, part), part_of(ref.mag_dqkv, C, part),
                  part_of(ref.sub_dqkv, C, part), part_of(got.dqkv, C, part), k_bwd, eps, half_denorm);
    if (lowp) {
        Results naive = naive_lowp<floatX>(cs, qkv, dout);
        auto compare = [&](const char* what, const std::vector<double>& r, const std::vector<double>& mag,
                           const std::vector<double>& kernel, const std::vector<double>& nv) {
            double e_kernel = max_abs_err(kernel, r), e_naive = max_abs_err(nv, r);
            double slack = 2.0 * (cs.HS + cs.T) * th::EPS_FP32 * *std::max_element(mag.begin(), mag.end());
            std::string check = name + " " + what + " vs naive " + th::dtype_name<floatX>();
            th::report(e_kernel <= 2 * e_naive + slack, check.c_str(),
                       "max_err kernel=%.3g naive=%.3g (limit 2x naive + %.2g)", e_kernel, e_naive, slack);
        };
        compare("out", ref.r.out, ref.mag_out, got.out, naive.out);
        for (int part = 0; part < 3; part++)
            compare(parts[part], part_of(ref.r.dqkv, C, part), part_of(ref.mag_dqkv, C, part),
                    part_of(got.dqkv, C, part), part_of(naive.dqkv, C, part));
    }
    if (!cs.valid.empty()) check_padding_zero(name + " padded rows zero", cs, got);
    if (cs.dropout > 0 && std::is_same<floatX, float>::value) check_keep_rate(name + " dropout keep rate", cs);
}

// Dropout off gives the dropout-free bits: p = 0 with any seed and offset, and p = 1e-9, which runs the
// dropout kernels (threshold round(1e-9 * 2^32) = 4: a word below 4 is dropped, once in ~10^9, and the
// case is checked to drop nothing) with 1/(1-p) = 1 exactly in fp32, so that their extra arithmetic
// (the select of P, dP times 1, out and dV times 1) must change no bit.
template <class floatX>
void test_dropout_off(const Case& cs, uint64_t seed) {
    std::vector<float> qkv, dout;
    make_inputs<floatX>(cs, seed, qkv, dout);
    const std::string name = cs.name(th::dtype_name<floatX>());
    auto plain = run_kernels<floatX>(cs, qkv, dout);
    const AttentionDropout zero{0.f, 1234, 5}, tiny{1e-9f, kDropSeed, kDropOffset};
    auto with_zero = run_kernels<floatX>(cs, qkv, dout, &zero);
    th::check_bitwise((name + " dropout p=0 vs no dropout").c_str(), plain.data(), with_zero.data(), plain.size());
    DropoutArgs d = dropout_args("test", tiny.p, tiny.seed, tiny.offset);
    size_t dropped = 0;
    for (int bh = 0; bh < cs.B * cs.NH; bh++)
        for (int i = 0; i < cs.T; i++)
            for (int j = 0; j < cs.T; j++) dropped += !dropout_attention_keep(d, bh, i, j);
    th::report(dropped == 0 && d.scale == 1.f && d.threshold == 4, (name + " dropout p=1e-9: nothing dropped").c_str(),
               "threshold %u, scale %.9g, %zu dropped", d.threshold, d.scale, dropped);
    auto with_tiny = run_kernels<floatX>(cs, qkv, dout, &tiny);
    th::check_bitwise((name + " dropout p=1e-9 (dropout kernels) vs no dropout").c_str(), plain.data(),
                      with_tiny.data(), plain.size());
}

// The mask depends on (b, h, query, key), not on the padded length: the same sequences padded to T and to
// T2 > T give bit-identical out, lse and dqkv on the valid rows with dropout on. Another offset gives
// another mask: out changes.
template <class floatX>
void test_dropout_padding_invariance(const Case& cs, int T2, uint64_t seed) {
    Case wide = cs;
    wide.T = T2;
    std::vector<float> qkv, dout, qkv2, dout2;
    make_inputs<floatX>(cs, seed, qkv, dout);
    make_inputs<floatX>(wide, seed + 100, qkv2, dout2);  // padding rows: other values
    const int C = cs.C();
    for (int b = 0; b < cs.B; b++)
        for (int t = 0; t < cs.T; t++) {
            std::copy_n(&qkv[((size_t)b * cs.T + t) * 3 * C], 3 * C, &qkv2[((size_t)b * T2 + t) * 3 * C]);
            std::copy_n(&dout[((size_t)b * cs.T + t) * C], C, &dout2[((size_t)b * T2 + t) * C]);
        }
    const AttentionDropout dropout = attention_dropout(cs);
    Results a = unpack<floatX>(cs, run_kernels<floatX>(cs, qkv, dout, &dropout));
    Results w = unpack<floatX>(wide, run_kernels<floatX>(wide, qkv2, dout2, &dropout));
    size_t differ = 0, checked = 0;
    for (int b = 0; b < cs.B; b++)
        for (int t = 0; t < cs.valid_of(b); t++) {
            for (int c = 0; c < C; c++, checked++)
                differ += a.out[((size_t)b * cs.T + t) * C + c] != w.out[((size_t)b * T2 + t) * C + c];
            for (int c = 0; c < 3 * C; c++, checked++)
                differ += a.dqkv[((size_t)b * cs.T + t) * 3 * C + c] != w.dqkv[((size_t)b * T2 + t) * 3 * C + c];
            for (int h = 0; h < cs.NH; h++, checked++)
                differ += a.lse[((size_t)b * cs.NH + h) * cs.T + t] != w.lse[((size_t)b * cs.NH + h) * T2 + t];
        }
    std::string name = cs.name(th::dtype_name<floatX>()) + " dropout mask independent of padding (T=" +
                       std::to_string(T2) + ")";
    th::report(differ == 0, name.c_str(), "%zu of %zu valid-row elements differ", differ, checked);
    AttentionDropout other = dropout;
    other.offset++;
    Results o = unpack<floatX>(cs, run_kernels<floatX>(cs, qkv, dout, &other));
    size_t changed = 0;
    for (size_t i = 0; i < a.out.size(); i++) changed += a.out[i] != o.out[i];
    name = cs.name(th::dtype_name<floatX>()) + " dropout offset+1 changes the mask";
    th::report(changed > a.out.size() / 4, name.c_str(), "%zu of %zu out elements changed", changed, a.out.size());
}

// Valid lengths for B sequences of length T: T and 1 first, then pseudo-random ones in [1, T].
std::vector<int> random_lengths(int B, int T, uint64_t seed) {
    std::vector<float> u(B);
    th::fill_uniform(u.data(), B, seed, 0.f, 1.f);
    std::vector<int> v(B);
    for (int b = 0; b < B; b++) v[b] = b == 0 ? T : b == 1 ? 1 : 1 + std::min(T - 1, (int)(u[b] * T));
    return v;
}

// Loss-scaled fp16 gradients: a dv beyond fp16's range must be stored as inf, not clamped, and an
// inf in dout must reach the gradients, so the trainer's overflow check sees them; heads and
// sequences it does not touch stay finite. B = 2, T = 40, NH = 2, HS = 16, causal. Sequence 0's dout
// is 60000 everywhere: dv_j = sum_i P_ij dO_i is 60000 times the attention key j receives, which
// exceeds 65504 for the early keys (key 0 gets all of query 0's and part of every other query's) and
// not for the late ones; only dv is classified against the reference, because dq and dk go through
// dS, which is stored in fp16 too and may overflow first. Sequence 1's dout holds an inf at t = 5,
// head 0, channel 3: dq of that row and dk of keys 0..5 of head 0 turn non-finite (through D and dS),
// as does channel 3 of those keys' dv; head 1 stays finite. (Other elements of head 0 may turn NaN
// too: the masked entries of P and dS are zeros that meet the inf, and 0 * inf is NaN in IEEE
// arithmetic, as in any matrix product.)
void test_backward_nonfinite_fp16() {
    const Case cs{2, 40, 2, 16, true, {}};
    const int T = cs.T, C = cs.C();
    std::vector<float> qkv((size_t)cs.B * T * 3 * C), dout((size_t)cs.B * T * C);
    th::fill_uniform(qkv.data(), qkv.size(), 81, -1.f, 1.f);
    th::fill_uniform(dout.data(), dout.size(), 82, -1.f, 1.f);
    for (float& e : qkv) e = round_to<__half>(e);
    for (int i = 0; i < T * C; i++) dout[i] = 60000.f;  // sequence 0
    for (float& e : dout) e = round_to<__half>(e);
    dout[((size_t)1 * T + 5) * C + 3] = INFINITY;  // sequence 1, t = 5, head 0
    Results got = unpack<__half>(cs, run_kernels<__half>(cs, qkv, dout));
    std::vector<float> dout0(dout.begin(), dout.begin() + (size_t)T * C);
    const Case first{1, T, cs.NH, cs.HS, true, {}};
    Reference ref = reference(first, std::vector<float>(qkv.begin(), qkv.begin() + (size_t)T * 3 * C), dout0);

    size_t overflow = 0, wrong = 0;  // sequence 0's dv: inf where |ref| > 65520 (rounds to inf), else finite
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)t * 3 * C + 2 * C + c;
            double r = ref.r.dqkv[i], g = got.dqkv[i];
            if (std::fabs(r) > 65520 * (1 + 1e-3)) overflow++, wrong += g != (r > 0 ? INFINITY : -INFINITY);
            else if (std::fabs(r) < 65504 * (1 - 1e-3)) wrong += !std::isfinite(g);
        }
    size_t due_finite = 0, leaked = 0;  // sequence 1: finite where inf/NaN is due, non-finite in head 1
    for (int t = 0; t < T; t++)
        for (int c = 0; c < 3 * C; c++) {
            bool finite = std::isfinite(got.dqkv[((size_t)T + t) * 3 * C + c]);
            int part = c / C, h = (c % C) / cs.HS, d = c % cs.HS;
            bool due = h == 0 && ((part == 0 && t == 5) || (part == 1 && t <= 5) || (part == 2 && t <= 5 && d == 3));
            if (due) due_finite += finite;
            if (h == 1) leaked += !finite;
        }
    bool ok = overflow > 0 && wrong == 0 && due_finite == 0 && leaked == 0;
    th::report(ok, "attention_backward fp16: dv overflow stored as inf, an inf dout reaches dq, dk, dv (no clamping)",
               "seq 0: %zu dv beyond 65504 in the reference, %zu misclassified; "
               "seq 1: %zu finite where inf/NaN is due, %zu non-finite in head 1",
               overflow, wrong, due_finite, leaked);
}

// The block shapes chosen for every head size of floatX fit this device's opt-in shared memory per block
// (queried here, not through the launchers' planned limit). fp32: the chosen shapes, and the compact
// ones fit 99 KiB. bf16/fp16: the mma.sync kernels' one shape fits 99 KiB, and at HS <= 64 two blocks
// (each with the 1 KiB the GPU reserves per block) fit an A100's 164 KiB of shared memory per SM (an
// H100 has 228 KiB), so that two blocks are resident per SM on sm_80 and sm_90.
template <class floatX, int HS>
void check_block_shapes(int device_limit) {
    const std::string name = std::string(th::dtype_name<floatX>()) + " HS=" + std::to_string(HS) +
                             ": block shapes fit the device's shared memory per block";
    if constexpr (std::is_same<floatX, float>::value) {
        using Compact = AttnTile<floatX, HS, attn_compact_warps<floatX, HS>()>;
        AttnLaunch fwd = attn_launch_shape<floatX, HS>("test", false);
        AttnLaunch bwd = attn_launch_shape<floatX, HS>("test", true);
        bool ok = fwd.smem <= (size_t)device_limit && bwd.smem <= (size_t)device_limit &&
                  Compact::kForwardSmem <= kAttnSmallestOptin && Compact::kBackwardSmem <= kAttnSmallestOptin;
        th::report(ok, name.c_str(),
                   "forward %d warps %zu B, backward %d warps %zu B (device %d B); compact %d warps %zu / %zu B",
                   fwd.warps, fwd.smem, bwd.warps, bwd.smem, device_limit, Compact::kWarps, Compact::kForwardSmem,
                   Compact::kBackwardSmem);
    } else {
        using Tile = AttnMmaTile<floatX, HS>;
        const size_t limit = std::min((size_t)device_limit, kAttnSmallestOptin), per_sm_a100 = 164 * 1024;
        bool ok = Tile::kForwardSmem <= limit && Tile::kBackwardSmem <= limit &&
                  (HS > 64 || 2 * (Tile::kBackwardSmem + 1024) <= per_sm_a100);
        th::report(ok, name.c_str(), "mma.sync: forward %zu B, backward %zu B (device %d B, smallest %zu B)",
                   Tile::kForwardSmem, Tile::kBackwardSmem, device_limit, kAttnSmallestOptin);
    }
}

template <class floatX>
void test_block_shapes() {
    int device = 0, limit = 0;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    check_block_shapes<floatX, 16>(limit);
    check_block_shapes<floatX, 32>(limit);
    check_block_shapes<floatX, 64>(limit);
    check_block_shapes<floatX, 128>(limit);
}

// attention_dq_splits over B·NH from 1 to 2100 and T from 1 to 4096 (the production target): at least
// one slice and at most half the key tiles (rounded up); at least the target's blocks unless that
// bound stops it; under twice the least count that meets the target (the scratch bound); and no
// count in that range shares the key tiles more evenly (a smaller splits · ceil(key_tiles / splits),
// or the same with fewer slices). By hand at GPT-2's B = 8, NH = 12, T = 1024: 16 key tiles, 11
// slices wanted, at most 8; at B = 16, NH = 32: 2.
void test_dq_splits() {
    const int target = attention_dq_target_blocks();
    int bad = 0, first_bh = 0, first_t = 0;
    for (int bh = 1; bh <= 2100; bh += bh < 64 ? 1 : 37) {
        for (int T = 1; T <= 4096; T += T < 256 ? 1 : 61) {
            const int tiles = (T + 63) / 64, most = (tiles + 1) / 2, want = (target + bh - 1) / bh;
            const int s = attention_dq_splits(bh, T, 1);
            auto slots = [&](int n) { return n * ((tiles + n - 1) / n); };
            bool ok = s >= 1 && s <= most && (s == most || ((long long)s * bh >= target && s < 2 * want));
            for (int n = want; n < 2 * want && n <= most && ok; n++)
                ok = slots(n) > slots(s) || (slots(n) == slots(s) && n >= s);
            if (!ok && bad++ == 0) first_bh = bh, first_t = T;
        }
    }
    th::report(bad == 0, "attention_dq_splits: bounds and the most even share of key tiles", "%d bad (first B·NH=%d T=%d)",
               bad, first_bh, first_t);
    th::report(attention_dq_splits(8, 1024, 12) == 8 && attention_dq_splits(16, 1024, 32) == 2,
               "attention_dq_splits at GPT-2's B=8 NH=12 T=1024 is 8, at B=16 NH=32 2", "got %d, %d",
               attention_dq_splits(8, 1024, 12), attention_dq_splits(16, 1024, 32));
}

// The compact blocks, forced by lowering the launchers' planned limit to 99 KiB, give the results of
// the device's own blocks bit for bit (same tiles, summed in the same order), under every thread order.
template <class floatX>
void test_compact_blocks(const Case& cs, uint64_t seed) {
    std::vector<float> qkv, dout;
    make_inputs<floatX>(cs, seed, qkv, dout);
    const AttentionDropout dropout = attention_dropout(cs);
    const AttentionDropout* drop = cs.dropout > 0 ? &dropout : nullptr;
    auto native = run_kernels<floatX>(cs, qkv, dout, drop);
    const int saved = attention_smem_limit();
    attention_smem_limit() = (int)kAttnSmallestOptin;
    const std::string name = cs.name(th::dtype_name<floatX>()) + " compact blocks";
    auto compact = th::run_orders((name + " thread orders").c_str(),
                                  [&] { return run_kernels<floatX>(cs, qkv, dout, drop); });
    attention_smem_limit() = saved;
    th::check_bitwise((name + " = the device's blocks").c_str(), native.data(), compact.data(), native.size());
}

// Runs f() with the CPU backend's blocks on 2 worker threads at once (shared counters and atomics
// exercised for real), and returns its result; on a GPU, where blocks always run concurrently, just f().
template <class F>
auto on_two_workers(F f) {
#if defined(SIMT_CPU)
    const int saved = simt::get_workers();
    simt::set_workers(2);
    auto r = f();
    simt::set_workers(saved);
    return r;
#else
    return f();
#endif
}

// The wgmma backward with each query tile's dQ deferred to the next tile gives the same bits as with it
// added at once: the same products, and the same adds to each dQ slice in the same order; and so do
// the kernels adding it at once with their registers capped for 3 blocks per SM instead of 2 (the same
// code: on a GPU, another register allocation and schedule) and adding the rows by reductions in L2
// (each slice has one writer, whose adds keep their order), each and both; and, each of those four,
// summing the slices in the block that writes a query tile's last contribution instead of in the
// reduce kernel (the same sums in the same order), under every thread order and with blocks on two
// worker threads at once (the tiles' counters shared between them). The kernels capped for 3 blocks run
// the same code here as those capped for 2, so only the cases with `all_caps` run each of them; the run on
// two workers takes one in every case.
template <class floatX>
void test_wgmma_variants_same_bits(const Case& cs, uint64_t seed, bool all_caps = false) {
    std::vector<float> qkv, dout;
    make_inputs<floatX>(cs, seed, qkv, dout);
    const bool saved_defer = attention_backward_wgmma_defer_dq(), saved_red = attention_backward_wgmma_red_dq(),
               saved_sum = attention_backward_sum_dq();
    const int saved_blocks = attention_backward_wgmma_blocks();
    auto run = [&](bool defer, int blocks, bool red, bool sum) {
        attention_backward_wgmma_defer_dq() = defer;
        attention_backward_wgmma_blocks() = blocks;
        attention_backward_wgmma_red_dq() = red;
        attention_backward_sum_dq() = sum;
        return run_kernels<floatX>(cs, qkv, dout, nullptr);
    };
    auto at_once = run(false, 2, false, false);
    const std::string name = cs.name(th::dtype_name<floatX>());
    struct Variant {
        const char* what;
        bool defer;
        int blocks;
        bool red, sum;
    };
    for (const Variant& v : {Variant{"dQ deferred", true, 2, false, false},
                             Variant{"registers for 3 blocks per SM", false, 3, false, false},
                             Variant{"dQ by reductions in L2", false, 2, true, false},
                             Variant{"registers for 3 blocks, dQ by reductions", false, 3, true, false},
                             Variant{"dQ summed by the tiles' last writers", false, 2, false, true},
                             Variant{"registers for 3 blocks, dQ summed by the last writers", false, 3, false, true},
                             Variant{"dQ by reductions, summed by the last writers", false, 2, true, true},
                             Variant{"3 blocks, dQ by reductions, summed by the last writers", false, 3, true, true}}) {
        if (v.blocks == 3 && !all_caps) continue;
        auto other = run(v.defer, v.blocks, v.red, v.sum);
        th::check_bitwise((name + " " + v.what + " = dQ at once").c_str(), at_once.data(), other.data(),
                          at_once.size());
    }
    auto orders = th::run_orders((name + " dQ summed by the last writers, thread orders").c_str(),
                                 [&] { return run(false, 2, true, true); });
    th::check_bitwise((name + " dQ summed by the last writers, thread orders = dQ at once").c_str(), at_once.data(),
                      orders.data(), at_once.size());
    auto concurrent = on_two_workers([&] { return run(false, 3, false, true); });
    th::check_bitwise((name + " dQ summed by the last writers, blocks on 2 threads = dQ at once").c_str(),
                      at_once.data(), concurrent.data(), at_once.size());
    attention_backward_wgmma_defer_dq() = saved_defer;
    attention_backward_wgmma_blocks() = saved_blocks;
    attention_backward_wgmma_red_dq() = saved_red;
    attention_backward_sum_dq() = saved_sum;
}

// The mma.sync backward at head size 64 summing dQ's slices in the block that writes a query tile's last
// contribution (attention_backward_sum_dq) gives its bits with the reduce kernel, dropout on or off, under
// every thread order and with blocks on two worker threads at once.
template <class floatX>
void test_mma_sum_same_bits(const Case& cs, uint64_t seed) {
    std::vector<float> qkv, dout;
    make_inputs<floatX>(cs, seed, qkv, dout);
    const AttentionDropout drop = attention_dropout(cs);
    const AttentionDropout* d = cs.dropout > 0 ? &drop : nullptr;
    const bool saved_wgmma = attention_backward_wgmma(), saved_sum = attention_backward_sum_dq();
    attention_backward_wgmma() = false;
    attention_backward_sum_dq() = false;
    auto reduced = run_kernels<floatX>(cs, qkv, dout, d);
    attention_backward_sum_dq() = true;
    const std::string name = cs.name(th::dtype_name<floatX>()) + " (mma.sync backward) dQ summed by the last writers";
    auto summed =
        th::run_orders((name + ", thread orders").c_str(), [&] { return run_kernels<floatX>(cs, qkv, dout, d); });
    th::check_bitwise((name + " = by the reduce kernel").c_str(), reduced.data(), summed.data(), reduced.size());
    auto concurrent = on_two_workers([&] { return run_kernels<floatX>(cs, qkv, dout, d); });
    th::check_bitwise((name + ", blocks on 2 threads = by the reduce kernel").c_str(), reduced.data(),
                      concurrent.data(), reduced.size());
    attention_backward_wgmma() = saved_wgmma;
    attention_backward_sum_dq() = saved_sum;
}

// The forms --attention-backward tune chooses from (attention_backward_forms), those of the default
// form's kernel, each a distinct name --attention-backward takes: at head size 64 without dropout where
// wgmma runs, the wgmma kernel's 8 forms adding dQ at once; else at head size 64 mma.sync with and
// without the sum (also where the default is mma.sync without dropout); one form at other head sizes.
void test_tune_forms() {
    auto names = [](int hs, bool dropout) {
        std::vector<std::string> n;
        for (const AttnBackwardForm& f : attention_backward_forms(hs, dropout))
            n.push_back(attention_backward_form_name(f));
        return n;
    };
    const std::vector<std::string> mma = {"mma", "mma-sum"};
    const std::vector<std::string> wgmma = {"wgmma",     "wgmma-3",     "wgmma-red",     "wgmma-3-red",
                                            "wgmma-sum", "wgmma-3-sum", "wgmma-red-sum", "wgmma-3-red-sum"};
    const bool saved = attention_backward_wgmma();
    attention_backward_wgmma() = true;
    bool ok = names(64, false) == (wgmma_supported() ? wgmma : mma) && names(64, true) == mma &&
              names(32, false) == std::vector<std::string>{"mma"} && names(128, true).size() == 1;
    attention_backward_wgmma() = false;
    ok = ok && names(64, false) == mma;
    attention_backward_wgmma() = saved;
    th::report(ok, (std::string("tune: the forms timed (HS 64: ") + (wgmma_supported() ? "wgmma's 8, " : "") +
                    "mma's 2 with dropout or where mma is the default; one at HS 32 and 128)").c_str());
}

// --attention-backward tune (attention_backward_tune): the first call at a shape times the shape's
// forms and keeps one for it, the next calls time nothing, and the results are the default form's bit
// for bit; a shape first met inside a graph capture is not timed (counted) and takes the default form;
// a shape with one form (fp32, head size 32) is not timed.
template <class floatX>
void test_tune(const Case& cs, uint64_t seed) {
    std::vector<float> qkv, dout;
    make_inputs<floatX>(cs, seed, qkv, dout);
    const AttentionDropout drop = attention_dropout(cs);
    const AttentionDropout* d = cs.dropout > 0 ? &drop : nullptr;
    const std::string name = cs.name(th::dtype_name<floatX>()) + " tune";
    auto plain = run_kernels<floatX>(cs, qkv, dout, d);
    AttnTuneState& tune = attention_backward_tune();
    tune = AttnTuneState{};
    tune.on = true;
    auto tuned = run_kernels<floatX>(cs, qkv, dout, d);
    const size_t n_forms = attention_backward_forms(cs.HS, cs.dropout > 0).size();
    const bool timed = !std::is_same<floatX, float>::value && n_forms > 1;
    std::string chosen = tune.chosen.empty() ? "none" : attention_backward_form_name(tune.chosen.begin()->second);
    bool known = false;
    for (const AttnBackwardForm& f : attention_backward_forms(cs.HS, cs.dropout > 0))
        known = known || attention_backward_form_name(f) == chosen;
    const std::string what = name + ": " +
                             (timed ? "times the shape's " + std::to_string(n_forms) + " forms" : "times nothing");
    th::report(timed ? tune.report.size() == 1 && tune.chosen.size() == 1 && known : tune.report.empty(),
               what.c_str(), "%s", tune.report.empty() ? "no line" : tune.report[0].c_str());
    th::check_bitwise((name + " = the default form").c_str(), plain.data(), tuned.data(), plain.size());
    auto again = run_kernels<floatX>(cs, qkv, dout, d);
    th::report(tune.report.size() == (timed ? 1u : 0u), (name + ": the second call times nothing").c_str());
    th::check_bitwise((name + ", second call = the default form").c_str(), plain.data(), again.data(), plain.size());
    // The form kept for the shape is the one that runs: kept with dQ summed in the kernel, a call launches
    // one kernel less (no reduce kernel) than kept without (the CPU backend counts launches).
    if (timed && kernel_launch_count() >= 0) {
        AttnBackwardForm& kept = tune.chosen.begin()->second;
        long long launches[2];
        for (int sum = 0; sum < 2; sum++) {
            kept.sum = sum;
            const long long before = kernel_launch_count();
            run_kernels<floatX>(cs, qkv, dout, d);
            launches[sum] = kernel_launch_count() - before;
        }
        th::report(launches[1] == launches[0] - 1, (name + ": the kept form runs").c_str(),
                   "launches of a call with the kept form's dQ summed %lld, not summed %lld", launches[1], launches[0]);
    }
    // A new shape (one sequence more) met first inside a capture, by two calls
    Case wider = cs;
    wider.B += 1;
    if (!wider.valid.empty()) wider.valid.push_back(cs.T);
    const int B = wider.B, T = wider.T, NH = wider.NH, C = wider.C();
    th::DeviceBuffer<floatX> in((size_t)B * T * 3 * C, th::Fill::Zero), grad((size_t)B * T * 3 * C),
        out((size_t)B * T * C, th::Fill::Zero);
    th::DeviceBuffer<float> lse((size_t)B * NH * T, th::Fill::Zero);
    th::DeviceBuffer<char> scratch(attention_backward_scratch_bytes<floatX>(B, T, C, NH));
    th::DeviceBuffer<int> valid(wider.valid);
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    cudaGraph_t graph;
    cudaCheck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int layer = 0; layer < 2; layer++)  // two calls, one shape
        attention_backward(grad.ptr, out.ptr, in.ptr, out.ptr, lse.ptr, scratch.ptr, B, T, C, NH, wider.causal,
                           wider.valid.empty() ? nullptr : valid.ptr, stream, d ? *d : AttentionDropout());
    cudaCheck(cudaStreamEndCapture(stream, &graph));
    cudaCheck(cudaGraphDestroy(graph));
    cudaCheck(cudaStreamDestroy(stream));
    th::report(tune.captured.size() == (timed ? 1u : 0u) && tune.report.size() == (timed ? 1u : 0u),
               (name + ": a shape first met in a graph capture is not timed").c_str(), "%zu counted",
               tune.captured.size());
    tune = AttnTuneState{};
}

// The (dtype, head size) pairs whose 4-warp backward needs more than 99 KiB, checked against the
// reference: what the child process on the L4 profile runs.
void l4_cases() {
    test_case<float>({2, 100, 2, 64, true, {65, 100}}, 101);
    test_case<float>({3, 130, 2, 64, true, random_lengths(3, 130, 12), 0.1f}, 103);
    test_case<float>({2, 70, 2, 128, true, {70, 9}}, 105);
    test_case<__nv_bfloat16>({2, 70, 2, 128, true, {70, 9}}, 105);
    test_case<__half>({2, 100, 2, 128, false, {100, 45}, 0.1f}, 107);
}

#if defined(SIMT_CPU)
// On the L4 profile (99 KiB per block, enforced by the backend as by the GPU) attention runs and
// matches the reference; before the compact blocks, fp32 at HS = 64 stopped in cudaFuncSetAttribute.
void test_l4_profile(const char* self) {
    th::ChildOutput child = th::run_command("SIMT_DEVICE=l4 " + std::string(self) + " --l4-cases 2>&1");
    const std::string& out = child.text;
    size_t at = std::min(out.find("FAIL"), out.find("ERROR"));  // the line to show: the first failure,
    bool ok = child.status == 0 && at == std::string::npos && out.find(" passed, 0 failed") != std::string::npos;
    if (at == std::string::npos) at = out.rfind('\n', out.size() >= 2 ? out.size() - 2 : 0) + 1;  // else the last
    th::report(ok, "SIMT_DEVICE=l4 (child): fp32 HS=64 and HS=128, bf16/fp16 HS=128 against the reference", "%s",
               out.substr(at, out.find('\n', at) - at).c_str());
}
#endif

// A head size whose compact blocks do not fit the device's shared memory stops the program with one
// line naming the head size, the dtype, the bytes needed and the device's limit.
void test_no_shape_fits(const char* self) {
    th::ChildOutput child = th::run_command(std::string(self) + " --small-smem 2>&1");
    const std::string& out = child.text;
    const char* expect = "attention_backward: head size 128 in fp32 needs 98560 bytes of shared memory per block, "
                         "the device allows 65536";
    bool ok = child.status != 0 && out.find(expect) != std::string::npos;
    th::report(ok, "no block shape fits (fp32 HS=128 with 64 KiB per block): exits with one line", "%s",
               out.substr(0, out.find('\n')).c_str());
}

// An unsupported head size must stop the program with a message naming the constraint.
void test_bad_head_size(const char* self) {
    th::ChildOutput child = th::run_command(std::string(self) + " --bad-head-size 2>&1");
    const std::string& out = child.text;
    bool ok = child.status != 0 && out.find("head size HS = C/NH must be 16, 32, 64 or 128") != std::string::npos;
    th::report(ok, "unsupported head size (HS=48) exits with a message", "%s", out.substr(0, out.find('\n')).c_str());
}

int main(int argc, char** argv) {
    if (argc == 2 && std::string(argv[1]) == "--bad-head-size") {
        float* x;
        cudaCheck(cudaMalloc(&x, 1024 * sizeof(float)));
        attention_forward(x, x, x, 1, 2, 96, 2, false, nullptr, 0);  // HS = 48
        return 0;
    }
    if (argc == 2 && std::string(argv[1]) == "--small-smem") {  // as a device with 64 KiB per block
        float* x;
        cudaCheck(cudaMalloc(&x, 3 * 256 * sizeof(float)));
        attention_smem_limit() = 64 * 1024;
        attention_backward(x, x, x, x, x, x, 1, 1, 256, 2, true, nullptr, 0);  // HS = 128
        return 0;
    }
    if (argc == 2 && std::string(argv[1]) == "--l4-cases") {
        l4_cases();
        return th::finish();
    }
    // The 16-bit backward on mma.sync (production where wgmma is off, or does not apply); the wgmma
    // kernel's cases follow these.
    attention_backward_wgmma() = false;
    // GPT-2-like shapes scaled down; T not a multiple of the 64-row tile; valid lengths T, 1 and
    // values that are not multiples of a tile (and 0, a sequence that is all padding).
    const std::vector<Case> cases = {
        {2, 17, 2, 16, false, {}},
        {2, 17, 2, 16, true, {}},
        {2, 17, 2, 32, false, {40, 16}},  // a valid length above T counts as T
        {2, 1, 3, 32, false, {}},
        {2, 1, 3, 32, true, {1, 1}},
        {2, 100, 3, 32, true, {}},
        {2, 100, 3, 32, false, {100, 37}},
        {3, 64, 4, 16, false, {64, 1, 33}},
        {3, 64, 2, 16, true, {0, 64, 50}},
        {2, 128, 2, 64, true, {}},
        {3, 130, 2, 64, false, {130, 1, 77}},
        {2, 100, 2, 64, true, {65, 100}},
        {2, 70, 2, 128, true, {70, 9}},
        {2, 200, 2, 32, true, {200, 131}},  // 4 key tiles: the running max moves across several
    };
    uint64_t seed = 1;
    for (const Case& cs : cases) {
        test_case<float>(cs, seed);
        test_case<__nv_bfloat16>(cs, seed);
        test_case<__half>(cs, seed);
        seed += 2;
    }
    // Dropout on P: BERT's p = 0.1 and heavier ones; random valid lengths including 1 and T; causal and
    // padded; every head size; T across several tiles and not a multiple of 64.
    const std::vector<Case> dropout_cases = {
        {2, 17, 2, 16, false, {}, 0.1f},
        {4, 100, 2, 32, false, random_lengths(4, 100, 11), 0.1f},
        {3, 130, 2, 64, true, random_lengths(3, 130, 12), 0.1f},
        {2, 77, 3, 16, true, {}, 0.5f},
        {3, 70, 2, 128, false, random_lengths(3, 70, 13), 0.25f},
        {2, 150, 2, 32, true, random_lengths(2, 150, 14), 0.1f},
    };
    for (const Case& cs : dropout_cases) {
        test_case<float>(cs, seed);
        test_case<__nv_bfloat16>(cs, seed);
        test_case<__half>(cs, seed);
        seed += 2;
    }
    // The 16-bit backward's dQ slices with several key tiles per block (the later ones adding to the
    // block's slice), as on shapes with B·NH >= 256: the target block count lowered to B·NH gives one
    // slice (one block per head takes all 4 key tiles); to 2·B·NH over 5 key tiles two (2 and 3 tie on
    // balance; blocks of key tiles {0, 3, 4}, {1, 2}: the snake order's second round runs backwards, a
    // third, forwards again, only block 0 reaches); to 3·B·NH over 7 key tiles four (blocks {0},
    // {1, 6}, {2, 5}, {3, 4}: 3 slices would give one block 3 tiles).
    const int saved_target = attention_dq_target_blocks();
    attention_dq_target_blocks() = 4;
    test_case<__nv_bfloat16>({2, 200, 2, 64, true, {200, 131}}, seed++);
    attention_dq_target_blocks() = 8;
    test_case<__half>({2, 300, 2, 128, false, random_lengths(2, 300, 16), 0.1f}, seed++);
    attention_dq_target_blocks() = 12;
    test_case<__nv_bfloat16>({2, 400, 2, 64, true, {400, 333}}, seed++);
    attention_dq_target_blocks() = saved_target;
    // The wgmma backward (attention_backward_wgmma; HS = 64, no dropout), on the same checks: causal and
    // not, T below one tile, across tiles and not a multiple of 64, valid lengths 1 and mid-tile, and
    // blocks with several key tiles adding to their dQ slice; then the forward on wgmma
    // (attention_forward_wgmma) before it, causal with one partial tile and not with three and valid
    // lengths T, 1 and mid-tile. The backward deferring dQ (attention_backward_wgmma_defer_dq), the one
    // with registers for 3 blocks per SM (attention_backward_wgmma_blocks) and the ones adding dQ by
    // reductions in L2 (attention_backward_wgmma_red_dq) give the same bits as this one: checked on
    // three shapes.
    attention_backward_wgmma() = true;
    for (const Case& cs : std::vector<Case>{{2, 33, 3, 64, true, {33, 1}},  // one partial tile
                                            {2, 128, 2, 64, true, {}},
                                            {3, 130, 2, 64, false, {130, 1, 77}},
                                            {2, 100, 2, 64, true, {65, 100}}}) {
        test_case<__nv_bfloat16>(cs, seed);
        test_case<__half>(cs, seed);
        seed += 2;
    }
    attention_forward_wgmma() = true;
    for (const Case& cs : std::vector<Case>{{2, 33, 3, 64, true, {33, 1}}, {3, 130, 2, 64, false, {130, 1, 77}}}) {
        test_case<__nv_bfloat16>(cs, seed);
        test_case<__half>(cs, seed);
        seed += 2;
    }
    attention_forward_wgmma() = false;
    attention_dq_target_blocks() = 12;
    test_case<__nv_bfloat16>({2, 400, 2, 64, true, {400, 333}}, seed++);
    attention_dq_target_blocks() = 4;
    test_case<__half>({2, 300, 2, 64, false, random_lengths(2, 300, 16)}, seed++);
    test_wgmma_variants_same_bits<__nv_bfloat16>({2, 300, 2, 64, true, {300, 170}}, seed++, true);
    attention_dq_target_blocks() = saved_target;
    test_wgmma_variants_same_bits<__half>({3, 130, 2, 64, false, {130, 1, 77}}, seed++);
    test_wgmma_variants_same_bits<__nv_bfloat16>({2, 33, 3, 64, true, {33, 1}}, seed++);
    test_wgmma_variants_same_bits<__half>({3, 200, 2, 64, true, {0, 200, 129}}, seed++);  // a sequence without keys
    // 3 dQ slices (5 and 6 key tiles): tiles with an odd number of writers, summed two slices at a time
    test_wgmma_variants_same_bits<__nv_bfloat16>({2, 320, 2, 64, true, {320, 250}}, seed++);
    test_wgmma_variants_same_bits<__half>({2, 330, 1, 64, false, {330, 200}}, seed++);
    test_mma_sum_same_bits<__nv_bfloat16>({2, 320, 2, 64, true, {320, 250}}, seed++);
    test_mma_sum_same_bits<__half>({3, 200, 2, 64, false, {0, 200, 129}, 0.1f}, seed++);
    test_mma_sum_same_bits<__nv_bfloat16>({2, 330, 1, 64, true, {330, 1}, 0.2f}, seed++);
    test_tune_forms();
    test_tune<__nv_bfloat16>({2, 130, 2, 64, true, {130, 77}}, seed++);
    test_tune<__half>({2, 100, 2, 64, false, {100, 40}, 0.1f}, seed++);
    test_tune<float>({2, 70, 2, 64, true, {}}, seed++);
    test_tune<__nv_bfloat16>({2, 70, 2, 32, true, {}}, seed++);
    attention_backward_wgmma() = false;
    test_dropout_off<float>({2, 100, 2, 32, true, {100, 37}}, seed);
    test_dropout_off<__nv_bfloat16>({2, 70, 2, 64, false, {70, 9}}, seed);
    test_dropout_off<__half>({1, 130, 2, 128, true, {}}, seed);
    test_dropout_padding_invariance<float>({2, 40, 2, 32, false, {33, 17}, 0.1f}, 130, seed);
    test_dropout_padding_invariance<__nv_bfloat16>({2, 40, 2, 64, true, {40, 1}, 0.1f}, 72, seed);
    // Several key tiles per block of the mma.sync backward (a target of 1 block: one dQ slice, so every
    // block walks all its key tiles, at either padded length): the tiles past the valid length are
    // skipped, so padding to 260 (5 key tiles) changes no bit of the valid rows.
    attention_dq_target_blocks() = 1;
    test_dropout_padding_invariance<__nv_bfloat16>({2, 100, 2, 64, false, {100, 70}, 0.1f}, 260, seed);
    test_dropout_padding_invariance<__half>({1, 130, 2, 128, true, {97}, 0.1f}, 300, seed);
    attention_dq_target_blocks() = saved_target;
    test_backward_nonfinite_fp16();
    test_dq_splits();
    test_block_shapes<float>();
    test_block_shapes<__nv_bfloat16>();
    test_block_shapes<__half>();
    // The compact blocks: 2 warps for fp32 at HS = 64 and 16-bit types at HS = 128, 1 for fp32 at HS = 128;
    // causal (the dK/dV kernel's first query tile), padded, dropout, T not a multiple of the block rows.
    for (const Case& cs : std::vector<Case>{{2, 33, 3, 64, true, {33, 1}},  // one partial tile
                                            {2, 128, 2, 64, true, {}},
                                            {3, 130, 2, 64, false, {130, 1, 77}},
                                            {2, 100, 2, 64, true, {65, 100}},
                                            {3, 130, 2, 64, true, random_lengths(3, 130, 12), 0.1f}})
        test_compact_blocks<float>(cs, seed++);
    for (const Case& cs : std::vector<Case>{{2, 70, 2, 128, true, {70, 9}},
                                            {2, 100, 2, 128, true, {100, 45}, 0.1f},
                                            {3, 70, 2, 128, false, random_lengths(3, 70, 13), 0.25f}}) {
        test_compact_blocks<float>(cs, seed);
        test_compact_blocks<__nv_bfloat16>(cs, seed);
        test_compact_blocks<__half>(cs, seed++);
    }
#if defined(SIMT_CPU)
    test_l4_profile(argv[0]);
#endif
    test_no_shape_fits(argv[0]);
    test_bad_head_size(argv[0]);
    return th::finish();
}
