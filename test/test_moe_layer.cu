// test/test_moe_layer.cu — the MoE MLP layer (llmc/moe_layer.cuh) against Hugging Face's own MoE layers
// (fixtures from test/oracle_moe.py): SwitchTransformersSparseMLP (top-1, GELU experts) and
// MixtralSparseMoeBlock (top-2, SwiGLU experts), dropless and with a capacity nothing exceeds, in fp32
// and bf16: output, router logits, both auxiliary losses, and the gradients of the input, the router
// and every expert weight. Then capacity dropping against a CPU reference in double (which choices
// are dropped, y = 0 for a token with none kept, y of the others), and bit-identical results under
// three thread orders.
#include "../llmc/moe_layer.cuh"
#include "../llmc/safetensors.h"
#include "harness.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

// ----------------------------------------------------------------------------
// The fixture

// One oracle file: inputs, weights (our layout), transformers' results and gradients, all fp32.
struct Fixture {
    std::string name;
    MoeConfig cfg;
    int N = 0;
    std::vector<float> x, dy, router, w1, w2, y, logits, dx, drouter, dw1, dw2;
    double aux = 0, z = 0;
};

// Loads test/fixtures/<name>.safetensors; false (with a FAIL line) when it is missing or malformed.
bool load_fixture(const std::string& name, int K, MoeExperts kind, Fixture* f) {
    std::string path = "test/fixtures/" + name + ".safetensors", err;
    SafeTensors st;
    if (!st.load(path, &err)) {
        th::report(false, path.c_str(), "%s (run: /usr/bin/python3 test/oracle_moe.py)", err.c_str());
        return false;
    }
    auto get = [&](const char* t, std::vector<float>* v) {
        const SafeTensor* s = st.find(t);
        return s && SafeTensors::to_float(*s, v, &err);
    };
    std::vector<float> aux, z, alpha, beta;
    bool ok = get("x", &f->x) && get("dy", &f->dy) && get("router", &f->router) && get("w1", &f->w1) &&
              get("w2", &f->w2) && get("y", &f->y) && get("logits", &f->logits) && get("dx", &f->dx) &&
              get("drouter", &f->drouter) && get("dw1", &f->dw1) && get("dw2", &f->dw2) && get("aux", &aux) &&
              get("z", &z) && get("alpha", &alpha) && get("beta", &beta);
    const SafeTensor* x = st.find("x");
    const SafeTensor* w2 = st.find("w2");
    if (!ok || x->shape.size() != 2 || w2->shape.size() != 3) {
        th::report(false, path.c_str(), "missing or malformed tensors %s", err.c_str());
        return false;
    }
    f->name = name;
    f->N = (int)x->shape[0];
    f->cfg.C = (int)x->shape[1];
    f->cfg.E = (int)w2->shape[0];
    f->cfg.H = (int)w2->shape[2];
    f->cfg.K = K;
    f->cfg.experts = kind;
    f->cfg.alpha = alpha[0];
    f->cfg.beta = beta[0];
    f->aux = aux[0];
    f->z = z[0];
    return true;
}

// ----------------------------------------------------------------------------
// Running the layer

// What one forward + backward gives, widened to fp32.
struct Result {
    std::vector<float> y, logits, dx, drouter, dw1, dw2, losses;
    std::vector<int> pslot;  // the padded row of each assignment, -1 when dropped
};

template <class T>
std::vector<float> widen_f(const std::vector<T>& v) {
    std::vector<float> f(v.size());
    for (size_t i = 0; i < v.size(); i++) f[i] = to_float(v[i]);
    return f;
}

// The layer on the fixture's inputs in storage type T, with capacity factor `factor`; the weight
// gradients start from zero (the layer accumulates into them) and dloss = 1, as in the oracle's loss.
template <class T>
Result run_layer(const Fixture& f, float factor) {
    MoeConfig cfg = f.cfg;
    cfg.capacity_factor = factor;
    MoeLayer<T> L;
    moe_layer_init(&L, cfg, f.N);
    th::DeviceBuffer<T> x(th::round_to<T>(f.x)), dy(th::round_to<T>(f.dy)), router(th::round_to<T>(f.router)),
        w1(th::round_to<T>(f.w1)), w2(th::round_to<T>(f.w2));
    th::DeviceBuffer<T> y(f.y.size(), th::Fill::NaN), dx(f.x.size(), th::Fill::NaN);
    th::DeviceBuffer<T> drouter(f.router.size(), th::Fill::Zero), dw1(f.w1.size(), th::Fill::Zero),
        dw2(f.w2.size(), th::Fill::Zero);
    MoeWeights<T> w{router.ptr, w1.ptr, w2.ptr}, dw{drouter.ptr, dw1.ptr, dw2.ptr};
    moe_layer_forward(&L, y.ptr, x.ptr, w, 0);
    moe_layer_backward(&L, dx.ptr, dw, dy.ptr, x.ptr, w, 1.f, 0);
    Result r{widen_f(y.host()), widen_f(th::to_host(L.logits, f.logits.size())), widen_f(dx.host()),
             widen_f(drouter.host()), widen_f(dw1.host()), widen_f(dw2.host()), th::to_host(L.losses, 2),
             th::to_host(L.pslot, (size_t)f.N * cfg.K)};
    moe_layer_free(&L);
    return r;
}

// ----------------------------------------------------------------------------
// Comparisons

double max_abs(const std::vector<float>& v) {
    double m = 0;
    for (float x : v) m = std::max(m, (double)std::fabs(x));
    return m;
}

// ours vs ref, each element within k roundings (eps) of the tensor's scale plus k of its own size.
bool check_scaled(const std::string& name, const std::vector<float>& ref, const std::vector<float>& ours, double eps,
                  double k) {
    double scale = max_abs(ref);
    std::vector<double> r(ref.begin(), ref.end()), budget(ref.size());
    for (size_t i = 0; i < ref.size(); i++) budget[i] = k * eps * (scale + std::fabs(ref[i]));
    return th::check_budget(name.c_str(), r, ours, budget);
}

// Budgets, in roundings of each tensor's scale (the convention of test_hf_gpt2's logits).
// fp32: both sides compute in fp32 with different summation orders and formulations (cuBLASLt's and
// PyTorch's GEMMs, the two GELU and sigmoid forms). The output sits behind five ops (router GEMM,
// softmax, two expert GEMMs, activation) and the combine, each a few roundings of its scale: k = 8.
// The gradients run that chain back through the same ops and the router's softmax: twice, k = 16.
// The losses are means of N*E fp32 terms: k = 8.
constexpr double kFp32Fwd = 8, kFp32Bwd = 16, kFp32Loss = 8;
// bf16 storage vs transformers' fp32 on bf16-exact inputs and weights: every stored intermediate is
// rounded to bf16 once (eps/2 relative each). The output: the logits (which set the weights), hpre,
// hact, ye and y: five, k = 3 (5 * 1/2, rounded up). The gradients: those five again in the forward
// plus dye, dhact, dhpre, dxe, dlogits and the result's own: eleven, k = 6. The losses: the
// logits' rounding through the softmax (one eps/2 per unit of logit, logits here are O(1)), k = 2.
constexpr double kBf16Fwd = 3, kBf16Bwd = 6, kBf16Loss = 2;

// The layer in storage type T vs transformers, at capacity factor `factor`.
template <class T>
void test_vs_oracle(const Fixture& f, float factor) {
    const bool fp32 = sizeof(T) == 4;
    const double eps = fp32 ? th::EPS_FP32 : th::EPS_BF16;
    const double kf = fp32 ? kFp32Fwd : kBf16Fwd, kb = fp32 ? kFp32Bwd : kBf16Bwd, kl = fp32 ? kFp32Loss : kBf16Loss;
    char tag[160];
    snprintf(tag, sizeof(tag), "moe_layer %s %s factor=%g (cap=%d)", f.name.c_str(), th::dtype_name<T>(), factor,
             moe_capacity(factor, f.N, f.cfg.K, f.cfg.E));
    std::string t = tag;
    Result r = run_layer<T>(f, factor);

    int dropped = (int)std::count(r.pslot.begin(), r.pslot.end(), -1);
    th::report(dropped == 0, (t + ": no choice dropped").c_str(), "%d dropped", dropped);
    check_scaled(t + " y vs transformers", f.y, r.y, eps, kf);
    check_scaled(t + " router logits vs transformers", f.logits, r.logits, eps, kf);
    th::check_each((t + " aux loss vs transformers").c_str(), 1, [&](size_t) { return (double)r.losses[0]; },
                   [&](size_t) { return f.aux; }, [&](size_t) { return kl * eps * std::fabs(f.aux); });
    th::check_each((t + " z loss vs transformers").c_str(), 1, [&](size_t) { return (double)r.losses[1]; },
                   [&](size_t) { return f.z; }, [&](size_t) { return kl * eps * std::fabs(f.z); });
    check_scaled(t + " dx vs transformers", f.dx, r.dx, eps, kb);
    check_scaled(t + " d router vs transformers", f.drouter, r.drouter, eps, kb);
    check_scaled(t + " d w1 vs transformers", f.dw1, r.dw1, eps, kb);
    check_scaled(t + " d w2 vs transformers", f.dw2, r.dw2, eps, kb);
}

// ----------------------------------------------------------------------------
// Capacity dropping: CPU reference in double

// The layer's forward by its definition (llmc/moe_layer.cuh's top comment), in double: which
// assignments are kept (kept (N,K)) and y (N,C); mag (N,C) gets sum over kept choices of |w| *
// sum_j |W2[c,j] act_j|, the size the fp32 rounding errors of y scale with.
void ref_forward(const Fixture& f, int cap, std::vector<char>* kept, std::vector<double>* y,
                 std::vector<double>* mag) {
    const MoeConfig& c = f.cfg;
    const int N = f.N, C = c.C, E = c.E, K = c.K, H = c.H, H1 = c.w1_rows();
    std::vector<int> used(E, 0);
    kept->assign((size_t)N * K, 0);
    y->assign((size_t)N * C, 0);
    mag->assign((size_t)N * C, 0);
    for (int n = 0; n < N; n++) {
        const float* xn = &f.x[(size_t)n * C];
        std::vector<double> logit(E), p(E);
        for (int e = 0; e < E; e++)
            for (int i = 0; i < C; i++) logit[e] += (double)f.router[(size_t)e * C + i] * xn[i];
        double m = *std::max_element(logit.begin(), logit.end()), s = 0;
        for (int e = 0; e < E; e++) s += p[e] = std::exp(logit[e] - m);
        for (int e = 0; e < E; e++) p[e] /= s;
        std::vector<int> order(E);
        for (int e = 0; e < E; e++) order[e] = e;
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logit[a] > logit[b]; });
        double chosen = 0;
        for (int k = 0; k < K; k++) chosen += p[order[k]];
        for (int k = 0; k < K; k++) {
            int e = order[k];
            if (cap > 0 && used[e]++ >= cap) continue;  // the expert is full: tokens keep their order
            (*kept)[(size_t)n * K + k] = 1;
            double w = p[e] / (K > 1 ? chosen : 1.0);
            std::vector<double> pre(H1, 0), act(H);
            for (int j = 0; j < H1; j++)
                for (int i = 0; i < C; i++) pre[j] += (double)f.w1[((size_t)e * H1 + j) * C + i] * xn[i];
            for (int j = 0; j < H; j++) {
                if (c.experts == MoeExperts::Gelu) {
                    double u = 0.7978845608028654 * (pre[j] + 0.044715 * pre[j] * pre[j] * pre[j]);
                    act[j] = 0.5 * pre[j] * (1 + std::tanh(u));
                } else {
                    act[j] = pre[j] / (1 + std::exp(-pre[j])) * pre[H + j];
                }
            }
            for (int i = 0; i < C; i++) {
                double out = 0, terms = 0;
                for (int j = 0; j < H; j++) {
                    out += (double)f.w2[((size_t)e * C + i) * H + j] * act[j];
                    terms += std::fabs((double)f.w2[((size_t)e * C + i) * H + j] * act[j]);
                }
                (*y)[(size_t)n * C + i] += w * out;
                (*mag)[(size_t)n * C + i] += std::fabs(w) * terms;
            }
        }
    }
}

// fp32 layer with capacity factor `factor` (small enough to drop) against the double reference.
void test_dropping(const Fixture& f, float factor) {
    const int N = f.N, K = f.cfg.K, C = f.cfg.C, cap = moe_capacity(factor, N, K, f.cfg.E);
    char tag[160];
    snprintf(tag, sizeof(tag), "moe_layer %s fp32 dropping factor=%g (cap=%d)", f.name.c_str(), factor, cap);
    std::string t = tag;
    Result r = run_layer<float>(f, factor);
    std::vector<char> kept;
    std::vector<double> y, mag;
    ref_forward(f, cap, &kept, &y, &mag);

    int dropped = 0, mismatched = 0, empty_tokens = 0, empty_nonzero = 0;
    for (int a = 0; a < N * K; a++) {
        dropped += !kept[a];
        mismatched += kept[a] != (r.pslot[a] >= 0);
    }
    for (int n = 0; n < N; n++) {
        bool none = true;
        for (int k = 0; k < K; k++) none = none && !kept[(size_t)n * K + k];
        if (!none) continue;
        empty_tokens++;
        for (int i = 0; i < C; i++) empty_nonzero += r.y[(size_t)n * C + i] != 0.f;
    }
    th::report(dropped > 0 && mismatched == 0, (t + ": the dropped choices are the reference's").c_str(),
               "%d of %d dropped, %d differ", dropped, N * K, mismatched);
    th::report(empty_tokens > 0 && empty_nonzero == 0, (t + ": y = 0 exactly for tokens with every choice dropped").c_str(),
               "%d such tokens, %d nonzero values", empty_tokens, empty_nonzero);
    // fp32 vs double: the router GEMM (C terms), softmax, the expert GEMMs (C and H terms) and the
    // weighting, each within a few roundings of its terms' sizes: 2 * (C + H) roundings of mag bound
    // the dot products' worst case (fp32 accumulation of C + H terms in the two GEMMs) with room for
    // the activation and weight roundings (a few each).
    std::vector<double> budget(y.size());
    for (size_t i = 0; i < y.size(); i++) budget[i] = 2.0 * (C + f.cfg.H) * th::EPS_FP32 * mag[i];
    th::check_budget((t + " y vs double reference").c_str(), y, r.y, budget);
}

// ----------------------------------------------------------------------------
// Determinism

// Every output of a forward + backward (with dropping) is the same bits under three thread orders.
void test_orders(const Fixture& f, float factor) {
    char name[160];
    snprintf(name, sizeof(name), "moe_layer %s fp32 factor=%g forward + backward: thread orders", f.name.c_str(),
             factor);
    th::run_orders(name, [&] {
        Result r = run_layer<float>(f, factor);
        std::vector<float> all;
        for (const auto* v : {&r.y, &r.logits, &r.dx, &r.drouter, &r.dw1, &r.dw2, &r.losses})
            all.insert(all.end(), v->begin(), v->end());
        return all;
    });
}

int main() {
    matmul_init();
    Fixture sw, mx;
    bool have_sw = load_fixture("moe_switch", 1, MoeExperts::Gelu, &sw);
    bool have_mx = load_fixture("moe_mixtral", 2, MoeExperts::SwiGLU, &mx);
    for (const Fixture* f : {&sw, &mx}) {
        if (!(f == &sw ? have_sw : have_mx)) continue;
        // Dropless, and a capacity factor of E/K: cap = N, which no expert can exceed.
        for (float factor : {0.f, (float)f->cfg.E / f->cfg.K}) {
            test_vs_oracle<float>(*f, factor);
            test_vs_oracle<__nv_bfloat16>(*f, factor);
        }
        test_dropping(*f, 0.5f);
        test_orders(*f, 0.5f);
    }
    matmul_destroy();
    return th::finish();
}
