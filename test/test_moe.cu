// test/test_moe.cu — the MoE kernels (llmc/moe.cuh) against a CPU reference in double, for fp32 and
// bf16, under forward/reverse/random thread orders: router top-k, the dispatch plan (with and without
// capacity), permute and its backward, combine and its backward, the auxiliary losses and the
// router's backward; a finite-difference check of the reference router gradient itself. Cases: K = 1
// and 2, experts that receive no token, every token on one expert, tied logits, capacity dropping,
// token counts off the block size.
#include "../llmc/moe.cuh"
#include "harness.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

// ----------------------------------------------------------------------------
// Helpers

// Appends a vector's bytes to buf / reads n elements back from buf at *at (run_orders compares one
// byte vector, so a stage's several outputs travel together).
template <class T>
void put(std::vector<unsigned char>& buf, const std::vector<T>& v) {
    const unsigned char* p = reinterpret_cast<const unsigned char*>(v.data());
    buf.insert(buf.end(), p, p + v.size() * sizeof(T));
}
template <class T>
std::vector<T> take(const std::vector<unsigned char>& buf, size_t* at, size_t n) {
    std::vector<T> v(n);
    if (n) memcpy(v.data(), buf.data() + *at, n * sizeof(T));
    *at += n * sizeof(T);
    return v;
}

// One routing case: N tokens, E experts, K per token, a capacity factor (0: dropless) and how the
// logits are biased.
enum class Bias { None, Cold, Hot, Ties };
struct Case {
    int N, E, K, C;
    float factor;
    Bias bias;
    const char* what;
};

// Router logits (N,E) in [-2, 2): Cold pushes the last two experts to -10 (no token picks them when
// K <= E-2), Hot lifts expert 2 by 10 (every token's first choice), Ties rounds to multiples of 0.5
// (many equal logits, so the lower-index rule decides).
template <class TL>
std::vector<TL> make_logits(const Case& c, uint64_t seed) {
    std::vector<float> f((size_t)c.N * c.E);
    th::fill_uniform(f.data(), f.size(), seed, -2.f, 2.f);
    for (int n = 0; n < c.N; n++)
        for (int e = 0; e < c.E; e++) {
            float& x = f[(size_t)n * c.E + e];
            if (c.bias == Bias::Cold && e >= c.E - 2) x -= 10.f;
            if (c.bias == Bias::Hot && e == 2) x += 10.f;
            if (c.bias == Bias::Ties) x = std::round(x * 2.f) / 2.f;
        }
    return th::round_to<TL>(f);
}

// ----------------------------------------------------------------------------
// CPU reference

// The top K experts of one token by fp32 logit, ties to the lower index.
std::vector<int> ref_topk(const float* x, int E, int K) {
    std::vector<int> idx(E);
    for (int e = 0; e < E; e++) idx[e] = e;
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return x[a] > x[b]; });
    idx.resize(K);
    return idx;
}

// Softmax, logsumexp, top-k and weights of logits x (N,E) in double.
struct RouterRef {
    std::vector<int> expert;
    std::vector<double> weight, probs, lse;
};
RouterRef ref_router(const std::vector<float>& x, int N, int E, int K) {
    RouterRef r{std::vector<int>((size_t)N * K), std::vector<double>((size_t)N * K), std::vector<double>((size_t)N * E),
                std::vector<double>(N)};
    for (int n = 0; n < N; n++) {
        const float* xn = &x[(size_t)n * E];
        double m = *std::max_element(xn, xn + E), s = 0;
        for (int e = 0; e < E; e++) s += std::exp(xn[e] - m);
        for (int e = 0; e < E; e++) r.probs[(size_t)n * E + e] = std::exp(xn[e] - m) / s;
        r.lse[n] = m + std::log(s);
        std::vector<int> top = ref_topk(xn, E, K);
        double chosen = 0;
        for (int k = 0; k < K; k++) chosen += r.probs[(size_t)n * E + top[k]];
        for (int k = 0; k < K; k++) {
            r.expert[(size_t)n * K + k] = top[k];
            r.weight[(size_t)n * K + k] = r.probs[(size_t)n * E + top[k]] / (K > 1 ? chosen : 1.0);
        }
    }
    return r;
}

// The dispatch plan by its definition: each expert's assignments in token order, the first `cap`
// kept (all when cap = 0), experts' rows one after another.
struct PlanRef {
    std::vector<int> slot, row_assign, routed, offsets;
};
PlanRef ref_plan(const std::vector<int>& expert, int N, int K, int E, int cap) {
    int NK = N * K;
    PlanRef p{std::vector<int>(NK, -1), {}, std::vector<int>(E, 0), std::vector<int>(E + 1, 0)};
    for (int e = 0; e < E; e++) {
        p.offsets[e] = (int)p.row_assign.size();
        for (int a = 0; a < NK; a++) {
            if (expert[a] != e) continue;
            if (cap == 0 || p.routed[e] < cap) {
                p.slot[a] = (int)p.row_assign.size();
                p.row_assign.push_back(a);
            }
            p.routed[e]++;
        }
    }
    p.offsets[E] = (int)p.row_assign.size();
    return p;
}

// The router loss in double as a function of the logits, for the finite-difference check: sum of
// c[n,k] * weight[n,k] (c stands for the upstream dweight) + aux (f held at `load`) + z.
double ref_router_loss(const std::vector<double>& x, const std::vector<double>& c, const std::vector<double>& load,
                       const std::vector<int>& expert, int N, int E, int K, double alpha, double beta) {
    double loss = 0, zsum = 0;
    std::vector<double> importance(E, 0);
    for (int n = 0; n < N; n++) {
        const double* xn = &x[(size_t)n * E];
        double m = *std::max_element(xn, xn + E), s = 0;
        for (int e = 0; e < E; e++) s += std::exp(xn[e] - m);
        std::vector<double> p(E);
        for (int e = 0; e < E; e++) importance[e] += (p[e] = std::exp(xn[e] - m) / s) / N;
        zsum += (m + std::log(s)) * (m + std::log(s));
        double chosen = 0;
        for (int k = 0; k < K; k++) chosen += p[expert[(size_t)n * K + k]];
        for (int k = 0; k < K; k++)
            loss += c[(size_t)n * K + k] * p[expert[(size_t)n * K + k]] / (K > 1 ? chosen : 1.0);
    }
    for (int e = 0; e < E; e++) loss += alpha * E * load[e] * importance[e];
    return loss + beta * zsum / N;
}

// The router's analytic backward in double from the forward's probs (N,E), weight (N,K) and lse (N),
// as the kernel computes it; mag (N,E) gets, per element, the size of what its rounding errors scale
// with: p_e * (|g_e| + sum_e' p_e' |g_e'| + |dlse|), each g taken as the sum of its terms' sizes.
std::vector<double> ref_router_backward(const std::vector<double>& dweight, const std::vector<int>& expert,
                                        const std::vector<double>& weight, const std::vector<double>& probs,
                                        const std::vector<double>& lse, const std::vector<int>& routed, int N, int E,
                                        int K, double alpha, double beta, double dloss, std::vector<double>* mag) {
    std::vector<double> d((size_t)N * E);
    mag->assign((size_t)N * E, 0);
    for (int n = 0; n < N; n++) {
        const double* p = &probs[(size_t)n * E];
        std::vector<double> g(E), gmag(E);
        double chosen = 0, dot = 0, dotmag = 0;
        for (int k = 0; k < K; k++) {
            chosen += p[expert[(size_t)n * K + k]];
            dot += dweight[(size_t)n * K + k] * weight[(size_t)n * K + k];
            dotmag += std::fabs(dweight[(size_t)n * K + k] * weight[(size_t)n * K + k]);
        }
        for (int e = 0; e < E; e++) g[e] = gmag[e] = dloss * alpha * E * routed[e] / ((double)N * K) / N;
        for (int k = 0; k < K; k++) {
            int e = expert[(size_t)n * K + k];
            double dw = dweight[(size_t)n * K + k];
            g[e] += K > 1 ? (dw - dot) / chosen : dw;
            gmag[e] += K > 1 ? (std::fabs(dw) + dotmag) / chosen : std::fabs(dw);
        }
        double s = 0, smag = 0, dlse = dloss * 2 * beta * lse[n] / N;
        for (int e = 0; e < E; e++) {
            s += p[e] * g[e];
            smag += p[e] * gmag[e];
        }
        for (int e = 0; e < E; e++) {
            d[(size_t)n * E + e] = p[e] * (g[e] - s + dlse);
            (*mag)[(size_t)n * E + e] = p[e] * (gmag[e] + smag + std::fabs(dlse));
        }
    }
    return d;
}

// ----------------------------------------------------------------------------
// The kernels, stage by stage, on one case

// Every kernel of the layer on one case, in storage type T (router logits and activations alike).
template <class T>
void test_case(const Case& cs, uint64_t seed) {
    const int N = cs.N, E = cs.E, K = cs.K, C = cs.C, NK = N * K;
    const int cap = moe_capacity(cs.factor, N, K, E), R = moe_max_rows(N, K, E, cap);
    const float alpha = 0.01f, beta = 0.001f, dloss = 0.5f;
    const double out_eps = sizeof(T) == 4 ? 0.0 : dtype_eps<T>();  // one rounding of a T result
    const double u2 = th::EPS_FP32;  // 2u of fp32: the factor 2 it carries over u is the budgets' spare
    char tag[160], name[320];
    snprintf(tag, sizeof(tag), "%s %s N=%d E=%d K=%d C=%d cap=%d", th::dtype_name<T>(), cs.what, N, E, K, C, cap);

    // Router forward.
    std::vector<T> logits = make_logits<T>(cs, seed);
    std::vector<float> xf(logits.size());
    for (size_t i = 0; i < xf.size(); i++) xf[i] = to_float(logits[i]);
    RouterRef rr = ref_router(xf, N, E, K);
    th::DeviceBuffer<T> d_logits(logits);
    th::DeviceBuffer<int> d_expert(NK), d_slot(NK), d_row(R), d_routed(E), d_offsets(E + 1);
    th::DeviceBuffer<float> d_weight(NK), d_probs((size_t)N * E), d_lse(N);
    snprintf(name, sizeof(name), "moe_router_forward %s: thread orders", tag);
    auto rbytes = th::run_orders(name, [&] {
        moe_router_forward(d_expert.ptr, d_weight.ptr, d_probs.ptr, d_lse.ptr, (const T*)d_logits.ptr, N, E, K, 0);
        std::vector<unsigned char> b;
        put(b, d_expert.host());
        put(b, d_weight.host());
        put(b, d_probs.host());
        put(b, d_lse.host());
        return b;
    });
    size_t at = 0;
    std::vector<int> expert = take<int>(rbytes, &at, NK);
    std::vector<float> weight = take<float>(rbytes, &at, NK), probs = take<float>(rbytes, &at, (size_t)N * E),
                       lse = take<float>(rbytes, &at, N);
    snprintf(name, sizeof(name), "moe_router_forward %s: top-k experts equal the reference's", tag);
    th::check_bitwise(name, rr.expert.data(), expert.data(), NK * sizeof(int));
    // Probabilities: exp(x - m) with x - m rounded (relative error u * |x - m| after exp, |x - m| < 24
    // here), expf's own <= 1 ulp, a sum of E terms ((E-1)u), the reciprocal and the product (2u):
    // (E + 28)u, as k = E/2 + 14 of EPS_FP32 = 2u; the k of the weights adds the K-term sum of chosen
    // probabilities and the division. logsumexp: log of a sum off by (E-1)u relatively is off by (E-1)u
    // absolutely, logf and the final add one rounding each.
    snprintf(name, sizeof(name), "moe_router_forward %s: probs vs double reference", tag);
    th::check_close(name, rr.probs.data(), probs.data(), probs.size(), th::tol(u2, E / 2.0 + 14, 0));
    snprintf(name, sizeof(name), "moe_router_forward %s: weights vs double reference", tag);
    th::check_close(name, rr.weight.data(), weight.data(), weight.size(), th::tol(u2, E + K + 30, 0));
    snprintf(name, sizeof(name), "moe_router_forward %s: logsumexp vs double reference", tag);
    th::check_close(name, rr.lse.data(), lse.data(), lse.size(), th::tol(u2, 2, E * u2));

    // Dispatch plan, from the kernel's experts (equal to the reference's when the check above passed).
    // row_assign is reset each run: rows past M are not written, and must not be compared.
    PlanRef pr = ref_plan(expert, N, K, E, cap);
    int M = pr.offsets[E];
    snprintf(name, sizeof(name), "moe_dispatch_plan %s: thread orders (M=%d of R=%d rows)", tag, M, R);
    auto pbytes = th::run_orders(name, [&] {
        moe_dispatch_plan(d_slot.ptr, d_row.ptr, d_routed.ptr, d_offsets.ptr, d_expert.ptr, N, K, E, cap, 0);
        std::vector<unsigned char> b;
        put(b, d_slot.host());
        put(b, d_routed.host());
        put(b, d_offsets.host());
        std::vector<int> rows = d_row.host();
        rows.resize(std::min(M, R));
        put(b, rows);
        return b;
    });
    std::vector<unsigned char> pref;
    put(pref, pr.slot);
    put(pref, pr.routed);
    put(pref, pr.offsets);
    put(pref, pr.row_assign);
    int dropped = (int)std::count(pr.slot.begin(), pr.slot.end(), -1);
    int idle = (int)std::count(pr.routed.begin(), pr.routed.end(), 0);
    snprintf(name, sizeof(name), "moe_dispatch_plan %s: slots, counts, offsets, rows equal the reference's "
             "(%d dropped, %d idle experts)", tag, dropped, idle);
    if (pref.size() == pbytes.size())
        th::check_bitwise(name, pref.data(), pbytes.data(), pref.size());
    else
        th::report(false, name, "%zu bytes, want %zu", pbytes.size(), pref.size());

    // Permute: a copy, so bit-exact; rows past M zero. The output starts as NaN.
    std::vector<T> x = th::random_tensor<T>((size_t)N * C, seed + 1);
    th::DeviceBuffer<T> d_x(x), d_xe((size_t)R * C), d_dx((size_t)N * C), d_ye((size_t)R * C), d_out((size_t)N * C);
    snprintf(name, sizeof(name), "moe_permute %s: thread orders", tag);
    auto xe = th::run_orders(name, [&] {
        d_xe.upload(std::vector<T>((size_t)R * C, from_float<T>(NAN)));
        moe_permute(d_xe.ptr, (const T*)d_x.ptr, d_row.ptr, d_offsets.ptr, E, K, R, C, 0);
        return d_xe.host();
    });
    std::vector<T> xe_ref((size_t)R * C, from_float<T>(0.f));
    for (int r = 0; r < M; r++)
        std::copy_n(x.begin() + (size_t)(pr.row_assign[r] / K) * C, C, xe_ref.begin() + (size_t)r * C);
    snprintf(name, sizeof(name), "moe_permute %s: token rows in expert order, zeros past M, bit-exact", tag);
    th::check_bitwise(name, xe_ref.data(), xe.data(), xe.size() * sizeof(T));

    // Permute backward: each token's kept rows summed in fp32 ((K+1) roundings of the terms' sizes,
    // gamma bound as in test_encoder), rounded once to T; a token with every choice dropped gets 0.
    std::vector<T> dxe = th::random_tensor<T>((size_t)R * C, seed + 2);
    th::DeviceBuffer<T> d_dxe(dxe);
    snprintf(name, sizeof(name), "moe_permute_backward %s: thread orders", tag);
    auto dx = th::run_orders(name, [&] {
        d_dx.upload(std::vector<T>((size_t)N * C, from_float<T>(NAN)));
        moe_permute_backward(d_dx.ptr, (const T*)d_dxe.ptr, d_slot.ptr, N, K, C, 0);
        return d_dx.host();
    });
    std::vector<double> dx_ref((size_t)N * C, 0), budget((size_t)N * C);
    for (size_t i = 0; i < dx_ref.size(); i++) {
        int n = (int)(i / C), c = (int)(i % C);
        double abs_sum = 0;
        for (int k = 0; k < K; k++) {
            int s = pr.slot[(size_t)n * K + k];
            if (s < 0) continue;
            double v = to_float(dxe[(size_t)s * C + c]);
            dx_ref[i] += v;
            abs_sum += std::fabs(v);
        }
        budget[i] = (K + 1) * u2 * abs_sum + out_eps * std::fabs(dx_ref[i]);
    }
    snprintf(name, sizeof(name), "moe_permute_backward %s: dx vs double reference", tag);
    th::check_budget(name, dx_ref, dx, budget);

    // Combine, with the kernel's weights as the input both see: K products and sums in fp32, (K+2)
    // roundings of sum |w * y| bound them; one rounding to T.
    std::vector<T> ye = th::random_tensor<T>((size_t)R * C, seed + 3);
    d_ye.upload(ye);
    snprintf(name, sizeof(name), "moe_combine %s: thread orders", tag);
    auto out = th::run_orders(name, [&] {
        d_out.upload(std::vector<T>((size_t)N * C, from_float<T>(NAN)));
        moe_combine(d_out.ptr, (const T*)d_ye.ptr, d_weight.ptr, d_slot.ptr, N, K, C, 0);
        return d_out.host();
    });
    std::vector<double> out_ref((size_t)N * C, 0);
    for (size_t i = 0; i < out_ref.size(); i++) {
        int n = (int)(i / C), c = (int)(i % C);
        double abs_sum = 0;
        for (int k = 0; k < K; k++) {
            int s = pr.slot[(size_t)n * K + k];
            if (s < 0) continue;
            double v = (double)weight[(size_t)n * K + k] * to_float(ye[(size_t)s * C + c]);
            out_ref[i] += v;
            abs_sum += std::fabs(v);
        }
        budget[i] = (K + 2) * u2 * abs_sum + out_eps * std::fabs(out_ref[i]);
    }
    snprintf(name, sizeof(name), "moe_combine %s: out vs double reference (dropped choices add nothing)", tag);
    th::check_budget(name, out_ref, out, budget);

    // Combine backward: dye rows are one fp32 product (u; k = 1 of EPS_FP32 = 2u leaves a factor 2)
    // then one rounding to T; dweight a C-term dot product in fp32, in any order within (C+1)u of
    // sum |terms| (C products, C-1 additions), dropped choices exactly 0.
    std::vector<T> dout = th::random_tensor<T>((size_t)N * C, seed + 4);
    th::DeviceBuffer<T> d_dout(dout), d_dye((size_t)R * C);
    th::DeviceBuffer<float> d_dweight(NK);
    snprintf(name, sizeof(name), "moe_combine_backward %s: thread orders", tag);
    auto cbytes = th::run_orders(name, [&] {
        d_dye.upload(std::vector<T>((size_t)R * C, from_float<T>(NAN)));
        d_dweight.upload(std::vector<float>(NK, NAN));
        moe_combine_backward(d_dye.ptr, d_dweight.ptr, (const T*)d_dout.ptr, (const T*)d_ye.ptr, d_weight.ptr,
                             d_slot.ptr, d_row.ptr, d_offsets.ptr, N, K, E, R, C, 0);
        std::vector<unsigned char> b;
        put(b, d_dye.host());
        put(b, d_dweight.host());
        return b;
    });
    at = 0;
    std::vector<T> dye = take<T>(cbytes, &at, (size_t)R * C);
    std::vector<float> dweight = take<float>(cbytes, &at, NK);
    std::vector<double> dye_ref((size_t)R * C, 0), dye_budget((size_t)R * C, 0);
    for (int r = 0; r < M; r++) {
        int a = pr.row_assign[r];
        for (int c = 0; c < C; c++) {
            double v = (double)weight[a] * to_float(dout[(size_t)(a / K) * C + c]);
            dye_ref[(size_t)r * C + c] = v;
            dye_budget[(size_t)r * C + c] = (u2 + out_eps) * std::fabs(v);
        }
    }
    snprintf(name, sizeof(name), "moe_combine_backward %s: dye vs double reference (zeros past M)", tag);
    th::check_budget(name, dye_ref, dye, dye_budget);
    std::vector<double> dw_ref(NK, 0), dw_budget(NK, 0);
    for (int a = 0; a < NK; a++) {
        int s = pr.slot[a];
        if (s < 0) continue;
        for (int c = 0; c < C; c++) {
            double v = (double)to_float(dout[(size_t)(a / K) * C + c]) * to_float(ye[(size_t)s * C + c]);
            dw_ref[a] += v;
            dw_budget[a] += (C + 1) * u2 / 2 * std::fabs(v);
        }
    }
    snprintf(name, sizeof(name), "moe_combine_backward %s: dweight vs double reference (dropped: 0)", tag);
    th::check_budget(name, dw_ref, dweight, dw_budget);

    // Losses, from the kernel's probs and lse: P_e and the mean of lse^2 are sums of N positive terms
    // and a division ((N+2)u of the result); aux adds E products (E+2 more); load is an exact ratio
    // rounded once; beta and alpha*E multiply once more.
    th::DeviceBuffer<float> d_losses(2), d_load(E), d_importance(E);
    snprintf(name, sizeof(name), "moe_router_losses %s: thread orders", tag);
    auto lbytes = th::run_orders(name, [&] {
        moe_router_losses(d_losses.ptr, d_load.ptr, d_importance.ptr, d_probs.ptr, d_lse.ptr, d_routed.ptr, N, E, K,
                          alpha, beta, 0);
        std::vector<unsigned char> b;
        put(b, d_losses.host());
        put(b, d_load.host());
        put(b, d_importance.host());
        return b;
    });
    at = 0;
    std::vector<float> losses = take<float>(lbytes, &at, 2), load = take<float>(lbytes, &at, E),
                       importance = take<float>(lbytes, &at, E);
    std::vector<double> imp_ref(E, 0), load_ref(E), loss_ref(2, 0);
    for (int n = 0; n < N; n++) {
        for (int e = 0; e < E; e++) imp_ref[e] += (double)probs[(size_t)n * E + e] / N;
        loss_ref[1] += beta * (double)lse[n] * lse[n] / N;
    }
    for (int e = 0; e < E; e++) {
        load_ref[e] = (double)pr.routed[e] / NK;
        loss_ref[0] += alpha * E * load_ref[e] * imp_ref[e];
    }
    snprintf(name, sizeof(name), "moe_router_losses %s: load f_e (sums to 1) vs reference", tag);
    th::check_close(name, load_ref.data(), load.data(), E, th::tol(u2, 1, 0));
    snprintf(name, sizeof(name), "moe_router_losses %s: importance P_e vs double reference", tag);
    th::check_close(name, imp_ref.data(), importance.data(), E, th::tol(u2, N / 2.0 + 2, 0));
    snprintf(name, sizeof(name), "moe_router_losses %s: aux %.6g and z %.6g vs double reference", tag, loss_ref[0],
             loss_ref[1]);
    th::check_close(name, loss_ref.data(), losses.data(), 2, th::tol(u2, (N + E) / 2.0 + 8, 0));

    // Router backward, from the kernel's forward outputs and the combine's dweight (0 where dropped).
    // The kernel's roundings: the K-term dot and the division ((2K+6)u of each g's terms' sizes), the
    // E-term sum s ((E+2)u of sum p |g|), the final subtraction and product (3u of the whole): all
    // within (2K + E + 12)u of mag; a bf16 result is rounded once more.
    th::DeviceBuffer<T> d_dlogits((size_t)N * E);
    snprintf(name, sizeof(name), "moe_router_backward %s: thread orders", tag);
    auto dlogits = th::run_orders(name, [&] {
        d_dlogits.upload(std::vector<T>((size_t)N * E, from_float<T>(NAN)));
        moe_router_backward(d_dlogits.ptr, d_dweight.ptr, d_expert.ptr, d_weight.ptr, d_probs.ptr, d_lse.ptr,
                            d_routed.ptr, N, E, K, alpha, beta, dloss, 0);
        return d_dlogits.host();
    });
    std::vector<double> mag;
    std::vector<double> dl_ref = ref_router_backward(th::widen(dweight), expert, th::widen(weight), th::widen(probs),
                                                     th::widen(lse), pr.routed, N, E, K, alpha, beta, dloss, &mag);
    std::vector<double> dl_budget(dl_ref.size());
    for (size_t i = 0; i < dl_ref.size(); i++)
        dl_budget[i] = (2 * K + E + 12) * u2 / 2 * mag[i] + out_eps * std::fabs(dl_ref[i]);
    snprintf(name, sizeof(name), "moe_router_backward %s: dlogits vs double reference", tag);
    th::check_budget(name, dl_ref, dlogits, dl_budget);
}

// The reference router gradient (what the kernel is compared with) against central finite
// differences of ref_router_loss in double, with the top-k choices and f_e held fixed (the logits
// are well separated, so a step of h changes no choice; checked).
void test_reference_gradient(int N, int E, int K, uint64_t seed) {
    const double alpha = 0.3, beta = 0.2, h = 1e-5;
    std::vector<float> xf((size_t)N * E), cf((size_t)N * K);
    th::fill_uniform(xf.data(), xf.size(), seed, -2.f, 2.f);
    th::fill_uniform(cf.data(), cf.size(), seed + 1, -1.f, 1.f);
    std::vector<double> x(xf.begin(), xf.end()), c(cf.begin(), cf.end());
    RouterRef rr = ref_router(xf, N, E, K);
    PlanRef pr = ref_plan(rr.expert, N, K, E, 0);
    std::vector<double> load(E), mag;
    for (int e = 0; e < E; e++) load[e] = (double)pr.routed[e] / (N * K);
    std::vector<double> grad =
        ref_router_backward(c, rr.expert, rr.weight, rr.probs, rr.lse, pr.routed, N, E, K, alpha, beta, 1.0, &mag);
    std::vector<double> fd(x.size());
    int changed = 0;
    for (size_t i = 0; i < x.size(); i++) {
        std::vector<double> xp = x, xm = x;
        xp[i] += h;
        xm[i] -= h;
        std::vector<float> xpf(xp.begin(), xp.end()), xmf(xm.begin(), xm.end());
        changed += ref_router(xpf, N, E, K).expert != rr.expert || ref_router(xmf, N, E, K).expert != rr.expert;
        fd[i] = (ref_router_loss(xp, c, load, rr.expert, N, E, K, alpha, beta) -
                 ref_router_loss(xm, c, load, rr.expert, N, E, K, alpha, beta)) / (2 * h);
    }
    // Central differences err by h^2/6 * f''' (~1e-10 here, the loss's derivatives being O(1)) plus
    // the loss's rounding over 2h (~1e-16 * |loss| / 1e-5): 1e-8 covers both with room.
    char name[160];
    snprintf(name, sizeof(name), "reference router gradient N=%d E=%d K=%d vs finite differences (%d choices moved)", N,
             E, K, changed);
    std::vector<double> budget(x.size(), 1e-8);
    th::check_budget(name, fd, grad, budget);
    if (changed) th::report(false, name, "a step of h changed the top-k choice: pick other logits");
}

int main() {
    // Shapes: N off the block size of 256 (300, 257), a single token, GPT-2-like channels scaled down
    // (C = 64), and C = 12 (off bf16's 8-wide pack: the scalar path).
    const Case cases[] = {
        {300, 8, 2, 64, 0.f, Bias::None, "dropless"},
        {300, 8, 1, 64, 0.f, Bias::None, "dropless"},
        {257, 8, 2, 64, 0.f, Bias::Cold, "two idle experts"},
        {257, 8, 1, 64, 0.f, Bias::Hot, "all tokens on one expert"},
        {300, 8, 2, 12, 0.f, Bias::Hot, "one hot expert"},
        {300, 6, 2, 64, 1.0f, Bias::Hot, "capacity drops"},
        {300, 8, 1, 12, 1.25f, Bias::Cold, "capacity drops"},
        {200, 4, 2, 64, 0.f, Bias::Ties, "tied logits"},
        {1, 4, 2, 8, 0.f, Bias::None, "one token"},
        {1, 4, 1, 8, 1.0f, Bias::Hot, "one token"},
    };
    uint64_t seed = 1;
    for (const Case& c : cases) {
        test_case<float>(c, seed);
        test_case<__nv_bfloat16>(c, seed);
        seed += 10;
    }
    test_reference_gradient(5, 6, 1, 101);
    test_reference_gradient(5, 6, 2, 102);
    return th::finish();
}
