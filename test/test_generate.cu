// test/test_generate.cu — generation with a KV cache (train_gpt2.cu: GPT2Decoder, generate()) on
// the tiny fixture model (test/fixtures/gpt2_tiny_model.bin: L=2, C=64, NH=4, maxT=64, V=500):
//   1. GPT2Decoder::step's logits at every position t of a 64-token sequence equal row t of the full forward
//      pass's logits, in fp32 and bf16, with recomputation and with either GELU path;
//   2. both are judged against an exact (double) forward pass of the same parameters: decoding may
//      round differently, but not worse than the full forward pass (its error <= 2x the forward's);
//   3. generate() samples exactly the tokens (and text) that sampling from the full forward pass's
//      logits with the same RNG gives, through the window's slides, with and without top-k;
//   4. generate() leaves the training activations alone (same buffer, same bytes).
//
// Tolerance of 1, fp32. Decoding runs forward()'s kernels on one row, so the two differ only in
// summation order: attention_decode's sums against flash attention's (HS-long scores, t+1 weights and
// values), and the matmuls' (cuBLASLt may pick another algorithm for N = 1 than for N = 64 rows, and
// the CPU backend's BLAS does). A length-n fp32 sum errs by at most n eps times the sum of its |terms|,
// and two orders by twice that; the terms of each sum on a logit's path are about as large as the
// row's logits here (layernorm outputs of size 1 times weights of 0.02 summed over C), so the budget
// is k eps S_t, S_t = max_v |logit_t,v| of the row, with k = 2 x the reduction lengths along the path:
// per layer qkv (C) + scores (HS) + weights (t+1) + values (t+1) + projection (C) + fc (C) + fc
// projection (4C), and the LM head (C). A worst case (observed differences are a few eps), so the test
// also checks that it is sharp enough to see a wrong position: every decoded row lies more than 2
// budgets from the next position's forward row (a row decoded at the wrong position would then fail).
// bf16: every activation is rounded to bf16, and the forward's attention rounds its weights P to bf16
// (tensor cores) where decoding keeps them fp32, so any value on the path may differ by an ulp between
// the two. test/test_gpt2.cu bounds the forward's logits at 2 eps of transformers' (a few roundings of
// size-1 values between the tokens and the logits); decoding has the same roundings, so the two are
// within 4 eps of each other: k = 4 of the row's scale max(1, S_t) (the roundings are of size-1 values).
//
// Why the sampled tokens can be equal although the logits are not bit-identical: a draw u picks the
// token whose interval of the cumulative distribution holds u; logits that move by at most delta move
// every interval edge by at most about 4 delta / temperature (as a fraction of the total). So the same
// token comes out unless u lies closer than that to an edge: the test reports the smallest distance
// of all draws and that shift for the largest logit difference check 1 observed, and requires equal
// tokens (a failure with a margin below the shift would be an unlucky draw, not a bug).
#include "gpt2_trainer.h"
#include "harness.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>

namespace test_generate {

static const char* kModel = "test/fixtures/gpt2_tiny_model.bin";

// A token sequence of length n with ids in [0, V), from a fixed seed.
std::vector<int> random_tokens(int n, int V, uint64_t seed) {
    std::vector<int> t(n);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int& x : t) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        x = (int)(s % (uint64_t)V);
    }
    return t;
}

// ----------------------------------------------------------------------------
// The exact forward pass, in double, of the parameters p (llm.c layout) on tokens: logits (T, V).

std::vector<double> exact_logits(const GPT2Config& c, const std::vector<float>& p, const std::vector<int>& tokens) {
    size_t sizes[NUM_PARAMETER_TENSORS], off[NUM_PARAMETER_TENSORS];
    param_sizes(c, sizes);
    off[0] = 0;
    for (int i = 1; i < NUM_PARAMETER_TENSORS; i++) off[i] = off[i - 1] + sizes[i - 1];
    const int T = (int)tokens.size(), C = c.channels, NH = c.num_heads, HS = C / NH, V = c.vocab_size;
    auto P = [&](int tensor, size_t i) { return (double)p[off[tensor] + i]; };
    auto layernorm = [&](std::vector<double>& out, const std::vector<double>& x, int w, int b, size_t l) {
        for (int t = 0; t < T; t++) {
            double m = 0, var = 0;
            for (int i = 0; i < C; i++) m += x[t * C + i];
            m /= C;
            for (int i = 0; i < C; i++) var += (x[t * C + i] - m) * (x[t * C + i] - m);
            double rstd = 1 / std::sqrt(var / C + 1e-5);
            for (int i = 0; i < C; i++)
                out[t * C + i] = (x[t * C + i] - m) * rstd * P(w, l * C + i) + P(b, l * C + i);
        }
    };
    // out (T, OC) = in (T, IC) · W[l]ᵀ + b[l], W (OC, IC)
    auto linear = [&](std::vector<double>& out, const std::vector<double>& in, int w, int b, size_t l, int IC, int OC) {
        out.assign((size_t)T * OC, 0);
        for (int t = 0; t < T; t++)
            for (int o = 0; o < OC; o++) {
                double s = P(b, l * OC + o);
                for (int i = 0; i < IC; i++) s += in[(size_t)t * IC + i] * P(w, (l * OC + o) * IC + i);
                out[(size_t)t * OC + o] = s;
            }
    };
    std::vector<double> x((size_t)T * C), ln(x.size()), qkv, y(x.size()), proj, h, g;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < C; i++) x[t * C + i] = P(WTE, (size_t)tokens[t] * C + i) + P(WPE, (size_t)t * C + i);
    for (int l = 0; l < c.num_layers; l++) {
        layernorm(ln, x, LN1W, LN1B, l);
        linear(qkv, ln, QKVW, QKVB, l, C, 3 * C);
        for (int t = 0; t < T; t++)
            for (int hd = 0; hd < NH; hd++) {
                std::vector<double> w(t + 1);
                double m = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double s = 0;
                    for (int d = 0; d < HS; d++) s += qkv[t * 3 * C + hd * HS + d] * qkv[j * 3 * C + C + hd * HS + d];
                    w[j] = s / std::sqrt((double)HS);
                    m = std::max(m, w[j]);
                }
                for (int j = 0; j <= t; j++) sum += w[j] = std::exp(w[j] - m);
                for (int d = 0; d < HS; d++) {
                    double o = 0;
                    for (int j = 0; j <= t; j++) o += w[j] * qkv[j * 3 * C + 2 * C + hd * HS + d];
                    y[t * C + hd * HS + d] = o / sum;
                }
            }
        linear(proj, y, ATTPROJW, ATTPROJB, l, C, C);
        for (size_t i = 0; i < x.size(); i++) x[i] += proj[i];
        layernorm(ln, x, LN2W, LN2B, l);
        linear(h, ln, FCW, FCB, l, C, 4 * C);
        g.resize(h.size());
        for (size_t i = 0; i < h.size(); i++)
            g[i] = 0.5 * h[i] * (1 + std::tanh(std::sqrt(2 / M_PI) * (h[i] + 0.044715 * h[i] * h[i] * h[i])));
        linear(proj, g, FCPROJW, FCPROJB, l, 4 * C, C);
        for (size_t i = 0; i < x.size(); i++) x[i] += proj[i];
    }
    layernorm(ln, x, LNFW, LNFB, 0);
    std::vector<double> logits((size_t)T * V);
    for (int t = 0; t < T; t++)
        for (int v = 0; v < V; v++) {
            double s = 0;
            for (int i = 0; i < C; i++) s += ln[t * C + i] * P(WTE, (size_t)v * C + i);
            logits[(size_t)t * V + v] = s;
        }
    return logits;
}

// ----------------------------------------------------------------------------
// 1 and 2: GPT2Decoder::step vs the full forward pass, and both vs the exact logits

// The fp32 budget's k for position t (see the top): twice the reduction lengths on a logit's path.
double fp32_k(const GPT2Config& c, int t) {
    int C = c.channels, HS = C / c.num_heads;
    return 2.0 * (c.num_layers * (C + HS + 2 * (t + 1) + C + C + 4 * C) + C);
}

// Runs the full forward pass on tokens (B=1, T=maxT) and GPT2Decoder::step at every position, compares them
// row by row and against the exact logits; returns the largest difference (for the sampling test).
template <class floatX>
double check_decode(const char* tname, const GPT2Config& config, const std::vector<float>& init, Recompute r,
                    bool fusion) {
    const int T = config.max_seq_len, V = config.vocab_size, Vp = config.padded_vocab_size;
    const bool fp32 = std::is_same<floatX, float>::value;
    std::vector<int> tokens = random_tokens(T, V, 7), targets(T, 0);
    GPT2<floatX> m;
    m.recompute = r;
    m.gelu_fusion = fusion;
    m.build(config, init);
    m.allocate_activations(1, T);
    m.set_batch(tokens.data(), targets.data(), false);
    m.forward(false, 0.f);
    std::vector<floatX> full = th::to_host(m.acts.logits, (size_t)T * Vp);
    std::vector<unsigned char> acts_before((size_t)m.acts_bytes);
    cudaCheck(cudaMemcpy(acts_before.data(), m.acts_memory, m.acts_bytes, cudaMemcpyDeviceToHost));
    std::vector<floatX> dec((size_t)T * Vp);
    {
        GPT2Decoder<floatX> decoder(m);
        for (int t = 0; t < T; t++) {
            const floatX* row = decoder.step(tokens[t], t);
            cudaCheck(cudaMemcpy(dec.data() + (size_t)t * Vp, row, Vp * sizeof(floatX), cudaMemcpyDeviceToHost));
        }
    }
    std::vector<unsigned char> acts_after((size_t)m.acts_bytes);
    cudaCheck(cudaMemcpy(acts_after.data(), m.acts_memory, m.acts_bytes, cudaMemcpyDeviceToHost));

    // 1: decode vs forward, row by row, each row under its own budget; and the neighbour rows apart.
    std::vector<double> ref, got, budget;
    double min_apart = INFINITY;  // smallest max|forward row t+1 - decode row t| in budgets of row t
    for (int t = 0; t < T; t++) {
        double S = 0;
        for (int v = 0; v < V; v++) S = std::max(S, (double)std::fabs(to_float(full[(size_t)t * Vp + v])));
        double b = fp32 ? fp32_k(config, t) * th::EPS_FP32 * S : 4 * th::EPS_BF16 * std::max(1.0, S);
        double apart = 0;
        for (int v = 0; v < V; v++) {
            ref.push_back(to_float(full[(size_t)t * Vp + v]));
            got.push_back(to_float(dec[(size_t)t * Vp + v]));
            budget.push_back(b);
            if (t + 1 < T) apart = std::max(apart, std::fabs(to_float(full[(size_t)(t + 1) * Vp + v]) - got.back()));
        }
        if (t + 1 < T) min_apart = std::min(min_apart, apart / b);
    }
    char name[200];
    const char* setting = r == Recompute::None ? (fusion ? "recompute none, fused GELU" : "recompute none, GELU kernel")
                                               : (r == Recompute::Layer ? "recompute layer" : "recompute gelu");
    snprintf(name, sizeof(name), "GPT2Decoder::step<%s, %s> logits == full forward's, every position", tname, setting);
    th::check_budget(name, ref, got, budget);
    snprintf(name, sizeof(name), "GPT2Decoder::step<%s, %s> vs the next position's forward row: apart", tname, setting);
    th::report(min_apart > 2, name, "every decoded row is >= %.1f budgets from the next position's forward row "
               "(needs > 2)", min_apart);
    double worst = 0;
    for (size_t i = 0; i < ref.size(); i++) worst = std::max(worst, std::fabs(ref[i] - got[i]));

    // 2: both against the exact logits of the same parameters (as rounded to floatX).
    std::vector<float> rounded(init.size());
    for (size_t i = 0; i < init.size(); i++) rounded[i] = to_float(from_float<floatX>(init[i]));
    std::vector<double> exact = exact_logits(config, rounded, tokens);
    double err_fwd = 0, err_dec = 0;
    for (int t = 0; t < T; t++)
        for (int v = 0; v < V; v++) {
            double e = exact[(size_t)t * V + v];
            err_fwd = std::max(err_fwd, std::fabs(to_float(full[(size_t)t * Vp + v]) - e));
            err_dec = std::max(err_dec, std::fabs(to_float(dec[(size_t)t * Vp + v]) - e));
        }
    snprintf(name, sizeof(name), "GPT2Decoder::step<%s, %s> error vs exact <= 2x the full forward's", tname, setting);
    th::report(err_dec <= 2 * err_fwd, name, "max |decode - exact| %.3g, max |forward - exact| %.3g, max |decode - "
               "forward| %.3g", err_dec, err_fwd, worst);

    // 4 (decoding part): the training activations are untouched.
    snprintf(name, sizeof(name), "GPT2Decoder::step<%s, %s> leaves the training activations alone", tname, setting);
    th::check_bitwise(name, acts_before.data(), acts_after.data(), acts_before.size());
    m.free_all();
    return worst;
}

// ----------------------------------------------------------------------------
// 3: generate() vs sampling from the full forward pass

// The tokens and text generate() should give: the same window policy (<|endoftext|>, the prompt's last
// maxT-1 tokens, slide to the last maxT/2 when full) with the full forward pass over a (1, maxT)
// window for every token, advancing *rng. *min_margin: the smallest distance of a draw from an edge.
template <class floatX>
std::vector<int> full_forward_samples(GPT2<floatX>& m, const TrainOptions& o, uint64_t* rng, double* min_margin) {
    const GPT2Config& c = m.config;
    int maxT = c.max_seq_len, eot = c.vocab_size - 1;
    std::vector<int> window = {eot};
    size_t keep = std::min(o.prompt_tokens.size(), (size_t)maxT - 1);
    window.insert(window.end(), o.prompt_tokens.end() - keep, o.prompt_tokens.end());
    std::vector<int> batch(maxT), targets(maxT, 0), out;
    std::vector<floatX> row(c.padded_vocab_size);
    *min_margin = INFINITY;
    for (int i = 0; i < o.gen_tokens; i++) {
        std::fill(batch.begin(), batch.end(), 0);
        std::copy(window.begin(), window.end(), batch.begin());
        m.set_batch(batch.data(), targets.data(), false);
        m.forward(false, 0.f);
        cudaCheck(cudaMemcpy(row.data(), m.acts.logits + (window.size() - 1) * c.padded_vocab_size,
                             row.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
        double margin;
        int next = sample_token(row, c.vocab_size, o.temperature, o.top_k, rng, &margin);
        *min_margin = std::min(*min_margin, margin);
        out.push_back(next);
        if ((int)window.size() == maxT) window.erase(window.begin(), window.end() - maxT / 2);
        window.push_back(next);
    }
    return out;
}

// Runs generate() (its printing sent to /dev/null) and the full-forward sampler with the same RNG
// state; compares tokens, text, the RNG state after, and the training activations.
void check_generate(const char* what, const GPT2Config& config, const std::vector<float>& init, TrainOptions o,
                    double logit_diff) {
    GPT2<float> m;
    m.build(config, init);
    m.allocate_activations(2, 16);  // a training shape unlike the sampling window's
    std::vector<int> tokens = random_tokens(32, config.vocab_size, 3), targets(32, 0);
    m.set_batch(tokens.data(), targets.data(), false);
    m.forward(false, 0.f);
    void* acts_memory = m.acts_memory;
    std::vector<unsigned char> acts_before((size_t)m.acts_bytes), acts_after(acts_before.size());
    cudaCheck(cudaMemcpy(acts_before.data(), m.acts_memory, m.acts_bytes, cudaMemcpyDeviceToHost));

    uint64_t rng0 = 0x1234567887654321ull, rng_gen = rng0;
    std::vector<int> sampled;
    fflush(stdout);
    int saved = dup(1), devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    close(devnull);
    auto t0 = std::chrono::steady_clock::now();
    std::string text = generate(m, o, &rng_gen, &sampled);
    auto t1 = std::chrono::steady_clock::now();
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    cudaCheck(cudaMemcpy(acts_after.data(), m.acts_memory, m.acts_bytes, cudaMemcpyDeviceToHost));
    bool acts_same = acts_memory == m.acts_memory && m.B == 2 && m.T == 16 &&
                     memcmp(acts_before.data(), acts_after.data(), acts_before.size()) == 0;

    GPT2<float> full;
    full.build(config, init);
    full.allocate_activations(1, config.max_seq_len);
    double margin;
    uint64_t rng_ref = rng0;
    auto t2 = std::chrono::steady_clock::now();
    std::vector<int> expected = full_forward_samples(full, o, &rng_ref, &margin);
    auto t3 = std::chrono::steady_clock::now();
    std::string expected_text;
    size_t keep = std::min(o.prompt_tokens.size(), (size_t)config.max_seq_len - 1);
    for (size_t i = o.prompt_tokens.size() - keep; i < o.prompt_tokens.size(); i++)
        expected_text += " t" + std::to_string(o.prompt_tokens[i]);
    for (int t : expected)
        expected_text += t == config.vocab_size - 1 ? std::string("\n<|endoftext|>\n") : " t" + std::to_string(t);

    size_t first_diff = 0;
    while (first_diff < expected.size() && first_diff < sampled.size() && sampled[first_diff] == expected[first_diff])
        first_diff++;
    double shift = 4 * logit_diff / o.temperature;
    char name[200];
    snprintf(name, sizeof(name), "generate() %s: the tokens of sampling the full forward pass's logits", what);
    th::report(sampled == expected, name, "%zu of %d tokens equal; smallest draw margin %.2g, edge shift %.2g%s",
               first_diff, o.gen_tokens, margin, shift,
               sampled == expected ? "" : (margin < shift ? " (an unlucky draw)" : " (a bug)"));
    snprintf(name, sizeof(name), "generate() %s: text and RNG state", what);
    th::report(text == expected_text && rng_gen == rng_ref, name, "%zu bytes of text", text.size());
    snprintf(name, sizeof(name), "generate() %s: training activations untouched", what);
    th::report(acts_same, name, "same buffer, same %zu bytes, B=%d T=%d", acts_before.size(), m.B, m.T);
    printf("INFO generate() %s: KV cache %.0f tokens/s, full forward per token %.0f tokens/s (CPU backend)\n", what,
           o.gen_tokens / std::chrono::duration<double>(t1 - t0).count(),
           o.gen_tokens / std::chrono::duration<double>(t3 - t2).count());
    m.free_all();
    full.free_all();
}

int main(int argc, char** argv) {
    matmul_init();
    GPT2Config config;
    std::vector<float> init = load_checkpoint(kModel, &config);
    double diff = check_decode<float>("fp32", config, init, Recompute::None, true);
    diff = std::max(diff, check_decode<float>("fp32", config, init, Recompute::None, false));
    diff = std::max(diff, check_decode<float>("fp32", config, init, Recompute::Layer, true));
    check_decode<__nv_bfloat16>("bf16", config, init, Recompute::None, true);
    check_decode<__nv_bfloat16>("bf16", config, init, Recompute::Gelu, true);

    std::string tokenizer = th::write_numbered_tokenizer(
        "/tmp/test_generate_tokenizer_" + std::to_string(getpid()) + ".bin", config.vocab_size);
    TrainOptions o;
    o.tokenizer_path = tokenizer;
    o.gen_tokens = 70;  // the window (11 tokens at first) is full after 53: one slide
    o.prompt_tokens = random_tokens(10, config.vocab_size - 1, 11);
    check_generate("T=1.0, 10-token prompt", config, init, o, diff);
    o.temperature = 0.8f;
    o.top_k = 20;
    o.gen_tokens = 30;
    o.prompt_tokens = random_tokens(70, config.vocab_size - 1, 12);  // longer than the window: truncated,
    check_generate("T=0.8 top-k 20, 70-token prompt", config, init, o, diff);  // and a slide at once
    remove(tokenizer.c_str());

    // A tokenizer smaller than the model's vocabulary: a sampled id past it is printed as <|id|>, not
    // as nothing.
    {
        GPT2<float> m;
        m.build(config, init);
        TrainOptions small = o;
        small.prompt_tokens.clear();
        small.gen_tokens = 40;
        small.tokenizer_path = th::write_numbered_tokenizer(
            "/tmp/test_generate_small_tokenizer_" + std::to_string(getpid()) + ".bin", config.vocab_size - 100);
        uint64_t rng = 7;
        std::vector<int> sampled;
        fflush(stdout);
        int saved = dup(1), devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        close(devnull);
        std::string text = generate(m, small, &rng, &sampled);
        fflush(stdout);
        dup2(saved, 1);
        close(saved);
        remove(small.tokenizer_path.c_str());
        int past = 0, shown = 0;
        for (int id : sampled)
            if (id >= config.vocab_size - 100) {
                past++;
                shown += text.find("<|" + std::to_string(id) + "|>") != std::string::npos;
            }
        th::report(past > 0 && shown == past, "generate: ids past a smaller tokenizer's vocabulary print as <|id|>",
                   "%d of %d sampled ids past it shown", shown, past);
        m.free_all();
    }

    // A row with a non-finite logit has no distribution: -1, whatever the top-k.
    for (float bad : {NAN, INFINITY, -INFINITY}) {
        std::vector<float> row(8, 0.5f);
        row[3] = bad;
        uint64_t rng = 1;
        int all = sample_token(row, 8, 1.f, 0, &rng), top2 = sample_token(row, 8, 1.f, 2, &rng);
        bool neg_inf = bad < 0;  // -inf is a probability of 0, a valid row
        char name[96];
        snprintf(name, sizeof(name), "sample_token: a logit of %g %s", bad,
                 neg_inf ? "draws one of the others" : "gives -1");
        th::report(neg_inf ? all >= 0 && all != 3 && top2 >= 0 && top2 != 3 : all == -1 && top2 == -1, name,
                   "full %d, top-2 %d", all, top2);
    }
    matmul_destroy();
    return th::finish();
}

}  // namespace test_generate
TH_MAIN(test_generate)
