// test/test_gpt2_moe.cu — GPT-2 with Mixture-of-Experts blocks (--moe-experts): the dense model as an
// oracle by construction, gradients against central differences, KV-cache decoding against the full
// forward pass, training runs, checkpoint round trip and resume, and the refusals.
#include "gpt2_trainer.h"
#include "harness.h"
#include "program_runs.h"

#include <unistd.h>

namespace test_gpt2_moe {

static std::string g_tmp;   // this run's scratch directory
static std::string g_self;  // this binary (the trainer runs are its --train-gpt2)

// A tiny GPT-2: 2 layers, 32 channels, 2 heads, a 64-token vocabulary, 16 positions.
GPT2Config tiny_config() {
    GPT2Config c;
    c.num_layers = 2;
    c.channels = 32;
    c.num_heads = 2;
    c.max_seq_len = 16;
    c.vocab_size = 64;
    c.padded_vocab_size = pad_vocab(64);
    return c;
}
// The same with E experts, top-K, every `every`-th block sparse, dropless unless capacity is given.
GPT2Config moe_tiny(int E, int K, int every, float alpha, float beta, int swiglu = 0, float capacity = 0.f) {
    GPT2Config c = tiny_config();
    c.moe_experts = E;
    c.moe_top_k = K;
    c.moe_every = every;
    c.moe_aux = alpha;
    c.moe_z = beta;
    c.moe_swiglu = swiglu;
    c.moe_capacity = capacity;
    return c;
}

constexpr int kB = 2, kT = 8;
// A fixed batch of (B,T) inputs and targets in [0, V).
void tiny_batch(std::vector<int>* x, std::vector<int>* y, int V) {
    x->resize(kB * kT);
    y->resize(kB * kT);
    for (int i = 0; i < kB * kT; i++) {
        (*x)[i] = (i * 37 + 11) % V;
        (*y)[i] = (i * 53 + 5) % V;
    }
}

// Offsets of the 19 tensors in the flat parameter vector of config c.
std::vector<size_t> tensor_offsets(const GPT2Config& c, size_t sizes[NUM_MODEL_TENSORS]) {
    model_param_sizes(c, sizes);
    std::vector<size_t> off(NUM_MODEL_TENSORS + 1, 0);
    for (int i = 0; i < NUM_MODEL_TENSORS; i++) off[i + 1] = off[i] + sizes[i];
    return off;
}

// The objective the backward differentiates: the mean cross-entropy plus every MoE block's aux and z;
// and (routing) every MoE block's choice of experts per token, appended.
double objective(GPT2<float>& m, std::vector<int>* routing) {
    m.forward(false, 0.f);
    double j = m.mean_loss();
    routing->clear();
    for (MoeLayer<float>& l : m.moe) {
        std::vector<float> losses = th::to_host(l.losses, 2);
        j += (double)losses[0] + losses[1];
        std::vector<int> e = th::to_host(l.expert, (size_t)l.N * l.cfg.K);
        routing->insert(routing->end(), e.begin(), e.end());
    }
    return j;
}

// (a) Every block sparse, every expert a copy of the dense block's MLP, top-2 dropless: the
// renormalized weights sum to 1, so each MoE block computes the dense MLP (biases zero), and with
// alpha = beta = 0 the router gets no gradient: loss, logits and gradients must be the dense model's
// (the experts' gradients summed over experts being the dense MLP's).
void test_identical_experts() {
    GPT2Config dc = tiny_config(), mc = moe_tiny(4, 2, 1, 0.f, 0.f);
    size_t ds[NUM_MODEL_TENSORS], ms[NUM_MODEL_TENSORS];
    std::vector<size_t> doff = tensor_offsets(dc, ds), moff = tensor_offsets(mc, ms);
    std::vector<float> dense = random_init(dc, 7);
    for (int i : {FCB, FCPROJB}) std::fill(dense.begin() + doff[i], dense.begin() + doff[i + 1], 0.f);
    std::vector<float> sparse(moff[NUM_MODEL_TENSORS], 0.f);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++)  // the shared tensors (the MLP's have no copies here)
        if (ms[i]) std::copy(dense.begin() + doff[i], dense.begin() + doff[i + 1], sparse.begin() + moff[i]);
    const size_t C = dc.channels, H = 4 * C, L = dc.num_layers, E = mc.moe_experts;
    th::fill_uniform(sparse.data() + moff[MOEROUTER], ms[MOEROUTER], 3, -0.5f, 0.5f);
    for (size_t l = 0; l < L; l++)
        for (size_t e = 0; e < E; e++) {
            std::copy_n(dense.begin() + doff[FCW] + l * H * C, H * C,
                        sparse.begin() + moff[MOEW1] + (l * E + e) * H * C);
            std::copy_n(dense.begin() + doff[FCPROJW] + l * C * H, C * H,
                        sparse.begin() + moff[MOEW2] + (l * E + e) * C * H);
        }
    std::vector<int> x, y;
    tiny_batch(&x, &y, dc.vocab_size);
    const float dloss = 1.f / (kB * kT);
    GPT2<float> d, m;
    d.build(dc, dense);
    m.build(mc, sparse);
    for (GPT2<float>* g : {&d, &m}) {
        g->allocate_activations(kB, kT);
        g->set_batch(x.data(), y.data());
        g->forward(true, dloss);
        g->backward();
    }
    // Budget: a MoE block's output is w1*v + w2*v with w1 + w2 = 1 to within 2 eps (the renormalization),
    // 2 more roundings in the combine: 4 eps relative per element, where the dense block has 0. The
    // residual stream carries it through L blocks, whose layernorms and linear maps keep relative
    // errors of that order (gain ~1 at this init): 4 * L eps relative on what every later value
    // depends on, as an absolute budget on a tensor's scale (max |ref|), and the same relative.
    const double k = 4.0 * L;
    float dl = d.mean_loss(), ml = m.mean_loss();
    th::check_close("identical experts: loss = the dense model's", &dl, &ml, 1, th::Tol{k * th::EPS_FP32 * dl, 0});
    size_t BT = kB * kT, Vp = dc.padded_vocab_size;
    // after the backward, acts.logits holds dlogits: compare the logits' gradients, which carry the logits
    auto dg = th::to_host(d.acts.logits, BT * Vp), mg = th::to_host(m.acts.logits, BT * Vp);
    double gmax = 0;
    for (float v : dg) gmax = std::max(gmax, (double)std::fabs(v));
    th::check_close("identical experts: dlogits = the dense model's", dg.data(), mg.data(), dg.size(),
                    th::Tol{k * th::EPS_FP32 * gmax, k * th::EPS_FP32});
    auto dgr = th::to_host(d.grads_memory, doff[NUM_MODEL_TENSORS]);
    auto mgr = th::to_host(m.grads_memory, moff[NUM_MODEL_TENSORS]);
    // Gradients: the same k relative, and k eps of the tensor's scale (max |ref|) absolute.
    auto scale = [&](int t) {
        double mx = 0;
        for (size_t q = 0; q < ds[t]; q++) mx = std::max(mx, (double)std::fabs(dgr[doff[t] + q]));
        return mx;
    };
    bool shared_ok = true;
    int worst_tensor = -1;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (!ms[i]) continue;
        double budget_atol = k * th::EPS_FP32 * scale(i);
        for (size_t q = 0; q < ds[i]; q++) {
            double ref = dgr[doff[i] + q];
            if (std::fabs(ref - mgr[moff[i] + q]) > budget_atol + k * th::EPS_FP32 * std::fabs(ref)) {
                shared_ok = false;
                worst_tensor = i;
            }
        }
    }
    th::report(shared_ok, "identical experts: the shared tensors' gradients = the dense model's",
               worst_tensor < 0 ? "" : "tensor %d differs", worst_tensor);
    std::vector<float> sum1(L * H * C, 0.f), sum2(L * C * H, 0.f);
    for (size_t l = 0; l < L; l++)
        for (size_t e = 0; e < E; e++)
            for (size_t q = 0; q < H * C; q++) {
                sum1[l * H * C + q] += mgr[moff[MOEW1] + (l * E + e) * H * C + q];
                sum2[l * C * H + q] += mgr[moff[MOEW2] + (l * E + e) * C * H + q];
            }
    th::check_close("identical experts: sum over experts of dw1 = the dense dfcw", dgr.data() + doff[FCW],
                    sum1.data(), ds[FCW], th::Tol{k * th::EPS_FP32 * scale(FCW), k * th::EPS_FP32});
    th::check_close("identical experts: sum over experts of dw2 = the dense dfcprojw", dgr.data() + doff[FCPROJW],
                    sum2.data(), ds[FCPROJW], th::Tol{k * th::EPS_FP32 * scale(FCPROJW), k * th::EPS_FP32});
    // The router: the K equal expert outputs make the weights' gradient cancel in the renormalization,
    // to within the rounding of dy·ye (relative eps per term): budget k eps of the w1 gradients' scale.
    double rmax = 0, w1max = 0;
    for (size_t q = 0; q < ms[MOEROUTER]; q++) rmax = std::max(rmax, (double)std::fabs(mgr[moff[MOEROUTER] + q]));
    for (size_t q = 0; q < ms[MOEW1]; q++) w1max = std::max(w1max, (double)std::fabs(mgr[moff[MOEW1] + q]));
    th::report(rmax <= k * th::EPS_FP32 * w1max, "identical experts: the router's gradient vanishes",
               "max |drouter| %.3g, budget %.3g", rmax, k * th::EPS_FP32 * w1max);
    d.free_all();
    m.free_all();
}

// (b) The backward's gradient (aux and z losses included, at their weight) against central
// differences of the objective along a random direction per tensor, fp32 on the CPU backend.
void test_gradients_fd(const char* name, const GPT2Config& c) {
    size_t sizes[NUM_MODEL_TENSORS];
    std::vector<size_t> off = tensor_offsets(c, sizes);
    std::vector<float> p = random_init(c, 11);
    // A router of larger weights: logits O(1) apart, so that no perturbation below changes a token's top K
    // (the objective is piecewise smooth; a switch would break the difference quotient).
    th::fill_uniform(p.data() + off[MOEROUTER], sizes[MOEROUTER], 5, -1.f, 1.f);
    std::vector<int> x, y;
    tiny_batch(&x, &y, c.vocab_size);
    GPT2<float> m;
    m.build(c, p);
    m.allocate_activations(kB, kT);
    m.set_batch(x.data(), y.data());
    cudaCheck(cudaMemset(m.grads_memory, 0, m.num_parameters * sizeof(float)));
    m.forward(true, 1.f / (kB * kT));
    m.backward();
    std::vector<float> g = th::to_host(m.grads_memory, m.num_parameters);
    std::vector<int> routing0, routing;
    double j0 = objective(m, &routing0);
    bool ok = true, same_routing = true;  // same_routing: of the evaluations of the step in use
    std::string detail;
    for (int i : {MOEROUTER, MOEW1, MOEW2, QKVW, LN2W, WTE}) {
        if (!sizes[i]) continue;
        // The direction: the gradient's signs at the tensor's own scale (its RMS), so that a step h is
        // a relative change h of every tensor alike, and the derivative along it, sum |g| * RMS, is
        // the largest such a direction gives (a random one would give about 1/sqrt(size) of it,
        // below the rounding budget for the larger tensors); a gradient off in size or in any
        // entry's sign changes it.
        double ms = 0;
        for (size_t q = 0; q < sizes[i]; q++) ms += (double)p[off[i] + q] * p[off[i] + q];
        float rms = (float)std::sqrt(ms / sizes[i]);
        std::vector<float> dir(sizes[i]);
        for (size_t q = 0; q < sizes[i]; q++) {
            float gq = g[off[i] + q];
            dir[q] = gq > 0 ? rms : gq < 0 ? -rms : 0.f;
        }
        double gd = 0;
        for (size_t q = 0; q < sizes[i]; q++) gd += (double)g[off[i] + q] * dir[q];
        // Central difference at step h: J(p + h d) - J(p - h d) over 2h.
        bool steady = true;  // no evaluation since the last reset changed a token's experts
        auto fd = [&](float h) {
            double j[2];
            for (int s = 0; s < 2; s++) {
                std::vector<float> q = p;
                for (size_t k = 0; k < sizes[i]; k++) q[off[i] + k] += (s ? -h : h) * dir[k];
                cudaCheck(cudaMemcpy(m.params_memory, q.data(), q.size() * sizeof(float), cudaMemcpyHostToDevice));
                j[s] = objective(m, &routing);
                steady &= routing == routing0;
            }
            return (j[0] - j[1]) / (2.0 * h);
        };
        // The largest step from 1e-2 down (halving, 4 tries) whose evaluations all route as p does.
        float h = 1e-2f;
        double f1 = 0, f2 = 0;
        for (int tries = 0; tries < 4; tries++, h /= 2) {
            steady = true;
            f1 = fd(h);
            f2 = fd(h / 2);
            if (steady) break;
        }
        same_routing &= steady;
        // Budget: truncation, O(h^2), estimated from the two steps (Richardson: the error at h/2 is
        // about |f1 - f2| / 3); rounding: each fp32 evaluation of J is off by at most a budget of 64
        // roundings of |J| (the longest chain of dependent roundings of a token's loss here: 2
        // blocks of layernorm, GEMM sums of up to 4C terms pairwise, softmax), over the step 2*(h/2).
        double budget = std::fabs(f1 - f2) / 3 + 2 * 64 * th::EPS_FP32 * std::fabs(j0) / h;
        double err = std::fabs(f2 - gd);
        char line[160];
        snprintf(line, sizeof(line), " %s: g.d %.6g fd %.6g err %.2g budget %.2g;", i == MOEROUTER ? "router"
                 : i == MOEW1 ? "w1" : i == MOEW2 ? "w2" : i == QKVW ? "qkvw" : i == LN2W ? "ln2w" : "wte",
                 gd, f2, err, budget);
        detail += line;
        ok &= err <= budget;
    }
    th::report(ok && same_routing, name, "%s%s", same_routing ? "" : " (a perturbation changed the routing)",
               detail.c_str());
    m.free_all();
}

// KV-cache decoding through MoE blocks (one token at a time) gives the full forward pass's logits
// for every position (dropless: the micro-batch routes exactly as one token does).
void test_decode() {
    GPT2Config c = moe_tiny(4, 2, 2, 0.01f, 0.001f);
    std::vector<float> p = random_init(c, 13);
    std::vector<int> x, y;
    tiny_batch(&x, &y, c.vocab_size);
    GPT2<float> m;
    m.build(c, p);
    m.allocate_activations(1, kT);
    m.set_batch(x.data(), y.data(), false);
    m.forward(false, 0.f);
    size_t Vp = c.padded_vocab_size;
    std::vector<float> full = th::to_host(m.acts.logits, kT * Vp), dec(kT * Vp);
    {
        GPT2Decoder<float> d(m);
        for (int t = 0; t < kT; t++) {
            const float* row = d.step(x[t], t);
            cudaCheck(cudaMemcpy(dec.data() + t * Vp, row, Vp * sizeof(float), cudaMemcpyDeviceToHost));
        }
    }
    // Same ops per row up to summation order (attention_decode's, the GEMMs' for one row): a few eps
    // relative through 2 blocks, on the logits' scale (budget 16 eps of max |logit|, as test_kv_cache's).
    double mx = 0;
    for (int t = 0; t < kT; t++)
        for (int v = 0; v < c.vocab_size; v++) mx = std::max(mx, (double)std::fabs(full[t * Vp + v]));
    std::vector<float> a, b;
    for (int t = 0; t < kT; t++)
        for (int v = 0; v < c.vocab_size; v++) {
            a.push_back(full[t * Vp + v]);
            b.push_back(dec[t * Vp + v]);
        }
    th::check_close("KV-cache decoding through MoE blocks = the full forward pass's logits", a.data(), b.data(),
                    a.size(), th::Tol{16 * th::EPS_FP32 * mx, 16 * th::EPS_FP32});
    m.free_all();
}

// The checkpoint extension: write then parse gives the config and parameters back, bit for bit;
// a llm.c reader's version check refuses it (version 103, not 3).
void test_checkpoint_format() {
    GPT2Config c = moe_tiny(4, 2, 2, 0.02f, 0.003f, 1, 1.5f);
    std::vector<float> p = random_init(c, 17);
    std::string path = g_tmp + "/moe.bin", err;
    bool wrote = write_gpt2_checkpoint(path, c, p.data(), false, &err);
    GPT2Config back;
    std::vector<float> q = load_checkpoint(path, &back);
    bool same = wrote && back.moe_experts == 4 && back.moe_top_k == 2 && back.moe_every == 2 && back.moe_swiglu == 1 &&
                back.moe_capacity == 1.5f && back.moe_aux == 0.02f && back.moe_z == 0.003f && q == p;
    std::string bytes = th::slurp(path);
    int32_t version;
    memcpy(&version, bytes.data() + 4, 4);
    th::report(same && version == 103, "checkpoint extension: version 103, MoE settings and experts read back exactly");
}

// Runs the trainer (this binary's --train-gpt2) with args on the test's tiny data, no samples (the
// GPT-2 tokenizer has no text for a vocabulary of 64); output and status.
th::ChildOutput trainer(const std::string& args) {
    return th::run_command(g_self + " --train-gpt2 -i " + g_tmp + "/train.bin -j " + g_tmp +
                           "/val.bin --vocab-size 64 --layers 2 --channels 32 --heads 2 --max-seq-len 32 -t 16 -b 2 "
                           "--lr 1e-2 --val-steps 2 --gen-tokens 0 " + args + " 2>&1");
}

// (c) Training reduces the loss, prints aux and z on every step line and logs the expert load.
void test_training() {
    th::ChildOutput c = trainer("--moe-experts 4 --max-steps 12 --val-every 0 --gen-tokens 0 -o " + g_tmp + "/train");
    std::vector<double> loss = th::step_losses(c.text);
    size_t steps = 0, with_aux = 0;
    for (size_t at = c.text.find("\nstep "); at != std::string::npos; at = c.text.find("\nstep ", at + 1)) {
        size_t eol = c.text.find('\n', at + 1);
        std::string line = c.text.substr(at + 1, eol - at - 1);
        if (line.find("| loss ") == std::string::npos) continue;
        steps++;
        with_aux += line.find("| aux ") != std::string::npos && line.find("| z ") != std::string::npos;
    }
    th::report(th::exited_ok(c) && loss.size() == 12 && loss.back() < loss.front() - 0.1,
               "MoE training: 12 steps lower the loss", "first %.4f last %.4f", loss.empty() ? 0 : loss.front(),
               loss.empty() ? 0 : loss.back());
    th::report(steps == 12 && with_aux == 12, "MoE training: every step line has aux and z", "%zu of %zu", with_aux,
               steps);
    std::string log = th::slurp(g_tmp + "/train/log.jsonl");
    th::report(log.find("\"expert_load\":[[") != std::string::npos && log.find("\"aux_loss\":") != std::string::npos &&
                   log.find("\"active_params\":") != std::string::npos,
               "MoE training: the log has aux_loss, z_loss, expert_load and active_params");
    th::report(c.text.find("active per token") != std::string::npos,
               "MoE training: total and active parameters printed");
}

// (d) Resume from a MoE checkpoint continues bit-identically: the same step losses and final model as
// an uninterrupted run (fp32 and bf16, capacity dropping tokens, SwiGLU experts).
// The resumed run gives run_opts again but not the --moe-* options moe_opts: they come from the checkpoint.
void test_resume(const char* name, const std::string& moe_opts, const std::string& run_opts, const char* tag) {
    std::string a = g_tmp + "/resume_" + tag, b = a + "_stopped";
    std::string common = run_opts + " --max-steps 6 --val-every 3 --gen-tokens 0 -n 2 ";
    th::ChildOutput full = trainer(moe_opts + " " + common + "-o " + a);
    th::ChildOutput first = trainer(moe_opts + " " + common + "-o " + b + " --stop-after 3");
    th::ChildOutput rest = trainer(common + "-o " + b + " --resume");
    std::vector<double> lf = th::step_losses(full.text), l1 = th::step_losses(first.text);
    std::vector<double> l2 = th::step_losses(rest.text);
    l1.insert(l1.end(), l2.begin(), l2.end());
    std::string ma = th::slurp(a + "/model_00000006.bin"), mb = th::slurp(b + "/model_00000006.bin");
    bool ok = th::exited_ok(full) && th::exited_ok(first) && th::exited_ok(rest) && lf.size() == 6 && lf == l1 &&
              ma == mb && ma.size() > 1024;
    th::report(ok, name, "%s", ok ? "" : th::last_lines(rest.text).c_str());
}

// Recomputation reruns a MoE block's forward from kept state: --recompute layer trains exactly as none
// (the GELU as a separate kernel in both, as recomputation needs).
void test_recompute() {
    std::string common = "--moe-experts 4 --max-steps 4 --val-every 0 --gen-tokens 0 --gelu-fusion 0 ";
    th::ChildOutput none = trainer(common), layer = trainer(common + "--recompute layer");
    std::vector<double> a = th::step_losses(none.text), b = th::step_losses(layer.text);
    th::report(th::exited_ok(none) && th::exited_ok(layer) && a.size() == 4 && a == b,
               "MoE training: --recompute layer gives the losses of none, bit for bit");
}

// (e) What MoE cannot do is refused with one message naming the option.
void test_refusals() {
    struct {
        const char* args;
        const char* expect;
    } cases[] = {
        {"--moe-experts 4 --moe-top-k 5", "option --moe-top-k: 5 is more than the 4 experts"},
        {"--moe-experts 200", "option --moe-experts: 200 is out of range"},
        {"--moe-experts 4 --moe-every 3", "option --moe-every: 3 is more than the 2 layers"},
        {"--moe-experts 4 --precision fp8", "option --precision: fp8 GEMMs are for the dense blocks"},
        {"--moe-experts 4 --export-hf /tmp/none", "option --export-hf: a model with Mixture-of-Experts blocks"},
        {"--moe-experts 4 --init test/fixtures/gpt2_tiny_model.bin", "a llm.c checkpoint without experts"},
        {"--moe-expert relu --moe-experts 4", "option --moe-expert: 'relu' is not one of gelu, swiglu"},
    };
    for (const auto& t : cases) {
        th::ChildOutput c = trainer(std::string(t.args) + " --max-steps 1");
        bool ok = !th::exited_ok(c) && c.text.find(t.expect) != std::string::npos;
        th::report(ok, (std::string("refused: ") + t.args).c_str(), "%s", ok ? "" : th::last_lines(c.text).c_str());
    }
    // A MoE checkpoint fixes the model's shape: another expert count on resume is refused.
    th::ChildOutput c = trainer("--moe-experts 2 --max-steps 6 -o " + g_tmp + "/train --resume");
    th::report(!th::exited_ok(c) && c.text.find("option --moe-experts: ") != std::string::npos &&
                   c.text.find("has 4 (the model's shape comes from its checkpoint)") != std::string::npos,
               "refused: resuming a 4-expert checkpoint with --moe-experts 2");
}


int main(int argc, char** argv) {
    if (argc >= 2 && strcmp(argv[1], "--train-gpt2") == 0) return train_gpt2_main(argc - 1, argv + 1);
    char tmpl[] = "/tmp/test_gpt2_moe_XXXXXX";
    if (!mkdtemp(tmpl)) data_error("cannot create a temporary directory");
    g_tmp = tmpl;
    g_self = th::self_path(argv[0]);
    static const pid_t owner = getpid();
    atexit([] {
        if (getpid() == owner && !getenv("KEEP_TMP")) th::run_command("rm -rf " + g_tmp);
    });
    matmul_init(false);
    th::write_token_shard(g_tmp + "/train.bin", 2000, 64, 1);
    th::write_token_shard(g_tmp + "/val.bin", 400, 64, 2);

    test_identical_experts();
    test_gradients_fd("gradients = central differences (GELU experts every 2nd block, aux and z on)",
                      moe_tiny(4, 2, 2, 0.1f, 0.05f));
    test_gradients_fd("gradients = central differences (SwiGLU experts in every block, top-1)",
                      moe_tiny(4, 1, 1, 0.1f, 0.05f, 1));
    test_decode();
    test_checkpoint_format();
    test_training();
    test_resume("resume bit-identical (fp32, dropless GELU experts)", "--moe-experts 4 --moe-capacity 0", "", "fp32");
    test_resume("resume bit-identical (bf16, capacity 1.0, SwiGLU experts, top-1)",
                "--moe-experts 4 --moe-top-k 1 --moe-capacity 1 --moe-expert swiglu", "--precision bf16", "bf16");
    test_recompute();
    test_refusals();
    matmul_destroy();
    return th::finish();
}

}  // namespace test_gpt2_moe
TH_MAIN(test_gpt2_moe)
