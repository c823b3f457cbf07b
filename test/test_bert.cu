// test/test_bert.cu — the whole BERT model of train_bert.cu against Hugging Face transformers (the
// oracle; test/oracle_bert.py wrote the fixtures): a tiny BERT with random weights and a batch of four
// sequences of different lengths (64, 37, 9, 1 valid tokens), BertForMaskedLM's logits at the masked
// positions, loss and every gradient, BertForSequenceClassification's logits, loss and every gradient,
// in fp32 and bf16, and 10 AdamW steps of each; padding invariance (more padding changes nothing);
// transformers' checkpoints in (name variants, refusals) and out (a round trip); bad batches; the
// memory anatomy; determinism; and, when dev/data/bert/minilm/ holds the real all-MiniLM-L6-v2
// weights (dev/data/bert/fetch_minilm.sh), our hidden states for real sentences against BertModel's.
//
// `test_bert --export DIR` instead writes what test/hf_bert_roundtrip.py hands to transformers: DIR/
// {mlm,cls}_{fp32,bf16} (exports of the fixture models after 3 AdamW steps) and DIR/ours_{mlm,cls}_
// {fp32,bf16}.safetensors (the batch and our logits, computed in fp32 from exactly the weights each
// export holds). `test_bert --import mlm|cls DIR OUT` imports the checkpoint transformers saved in DIR
// (hf_bert_roundtrip.py's fp16 and bf16 sharded saves) and writes the batch and our fp32 logits of
// that head to OUT.
#include "bert_trainer.h"
#include "harness.h"

#include <sys/wait.h>

#include <functional>

namespace test_bert {

static const std::string kFixtures = "test/fixtures/";
static const std::string kMinilmDir = "dev/data/bert/minilm";

// ----------------------------------------------------------------------------
// Fixtures

// Tensor `name` of a fixture file: I32 values as ints, or any float dtype as floats.
std::vector<int> int_tensor(const SafeTensors& st, const std::string& file, const char* name) {
    const SafeTensor* t = st.find(name);
    if (!t || t->dtype != "I32") data_error("%s: no I32 tensor %s (run: /usr/bin/python3 test/oracle_bert.py)", file.c_str(), name);
    std::vector<int> v(t->numel);
    if (t->numel) memcpy(v.data(), t->data, t->numel * 4);  // little-endian I32, as the host's int
    return v;
}
std::vector<float> float_tensor(const SafeTensors& st, const std::string& file, const char* name) {
    const SafeTensor* t = st.find(name);
    std::vector<float> v;
    std::string err;
    if (!t || !SafeTensors::to_float(*t, &v, &err))
        data_error("%s: no float tensor %s (run: /usr/bin/python3 test/oracle_bert.py)", file.c_str(), name);
    return v;
}

// The oracle's batch and what transformers computed for it.
struct Batch {
    int B = 0, T = 0;
    std::vector<int> ids, types, valid, mlm_labels, cls_labels;  // (B,T), (B,T), (B), (B,T), (B)
    std::vector<float> mlm_logits, cls_logits;                   // (M,V) at the masked positions, (B,NL)
    float mlm_loss = 0, cls_loss = 0;
    std::vector<float> mlm_steps, cls_steps;                     // losses before each of 10 AdamW steps
};

Batch load_batch() {
    std::string file = kFixtures + "bert_tiny_batch.safetensors", err;
    SafeTensors st;
    if (!st.load(file, &err)) data_error("%s (run: /usr/bin/python3 test/oracle_bert.py)", err.c_str());
    Batch b;
    b.ids = int_tensor(st, file, "input_ids");
    b.types = int_tensor(st, file, "token_type_ids");
    b.valid = int_tensor(st, file, "valid_len");
    b.mlm_labels = int_tensor(st, file, "mlm_labels");
    b.cls_labels = int_tensor(st, file, "cls_labels");
    b.B = (int)b.valid.size();
    b.T = (int)(b.ids.size() / b.B);
    b.mlm_logits = float_tensor(st, file, "mlm_logits");
    b.cls_logits = float_tensor(st, file, "cls_logits");
    b.mlm_loss = float_tensor(st, file, "mlm_loss")[0];
    b.cls_loss = float_tensor(st, file, "cls_loss")[0];
    b.mlm_steps = float_tensor(st, file, "mlm_steps");
    b.cls_steps = float_tensor(st, file, "cls_steps");
    return b;
}

// A fixture model (the MLM or the classification one), its parts, and transformers' gradients of its
// loss on the batch in our layout (zero for the parts transformers' model does not have).
struct Model {
    BertConfig config;
    std::vector<float> init, grads;
    BertParts parts;
};

const char* head_name(BertHead h) { return h == BertHead::MLM ? "mlm" : h == BertHead::Classify ? "cls" : "none"; }

Model load_model(BertHead head) {
    Model m;
    std::string dir = kFixtures + "bert_tiny_" + head_name(head);
    m.init = load_hf_bert(dir, &m.config, &m.parts);
    std::string file = kFixtures + "bert_tiny_" + head_name(head) + "_grads.safetensors", err;
    SafeTensors st;
    if (!st.load(file, &err)) data_error("%s (run: /usr/bin/python3 test/oracle_bert.py)", err.c_str());
    m.grads.assign(m.init.size(), 0.f);
    read_bert_tensors(st, file, m.config, &m.grads);
    return m;
}

// The batch's labels for a head: (B,T) MLM labels or (B) classes.
const int* labels_of(const Batch& b, BertHead head) {
    return head == BertHead::MLM ? b.mlm_labels.data() : b.cls_labels.data();
}

// The head's logits after forward(false): (M,V) or (B,NL), padding columns dropped, as floats.
template <class floatX>
std::vector<float> head_logits(const BERT<floatX>& m) {
    const BertConfig& c = m.config;
    int R = m.head_rows;
    int width = m.head == BertHead::MLM ? c.vocab_size : c.num_labels;
    int stride = m.head == BertHead::MLM ? c.padded_vocab_size : c.num_labels;
    auto raw = th::to_host(m.head == BertHead::MLM ? m.acts.logits : m.acts.cls_logits, (size_t)R * stride);
    std::vector<float> out((size_t)R * width);
    for (int r = 0; r < R; r++)
        for (int v = 0; v < width; v++) out[(size_t)r * width + v] = to_float(raw[(size_t)r * stride + v]);
    return out;
}

double max_abs(const float* x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = std::max(m, (double)std::fabs(x[i]));
    return m;
}

// ----------------------------------------------------------------------------
// Against transformers

// Budgets of one precision, each k a count of roundings of the compared quantity's own scale (the
// derivations are at the call sites in main).
struct Budget {
    double logit_k;   // logits: atol = k*eps*max|logit|, rtol = k*eps
    double loss_k;    // loss: atol = k*eps*loss
    double grad_k;    // each gradient tensor: atol = k*eps*max|g| of the tensor, rtol = k*eps
    double step_k;    // the 10 AdamW-step losses: atol = k*eps*loss
};

// Forward (logits, loss), forward+backward (every gradient tensor) and 10 AdamW steps of one head,
// for storage type floatX, against the oracle. loss_scale multiplies the loss gradient as fp16's
// dynamic loss scaling does (a power of two, so exact), and the gradients are divided by it again for
// the comparison; the steps then use the scaled update.
template <class floatX>
void check_against_oracle(BertHead head, const Budget& k, float loss_scale = 1.f) {
    const char* tname = th::dtype_name<floatX>();
    const char* hname = head == BertHead::MLM ? "BertForMaskedLM" : "BertForSequenceClassification";
    double eps = dtype_eps<floatX>();
    Model f = load_model(head);
    Batch b = load_batch();
    const std::vector<float>& ref_logits = head == BertHead::MLM ? b.mlm_logits : b.cls_logits;
    float ref_loss = head == BertHead::MLM ? b.mlm_loss : b.cls_loss;

    BERT<floatX> m;
    m.build(f.config, f.init);
    m.allocate_activations(b.B, b.T, 32);  // room for 32 masked positions; the batch has 22
    m.set_batch(b.ids.data(), b.types.data(), b.valid.data(), labels_of(b, head), head);
    m.forward(false, 0.f);
    std::vector<float> logits = head_logits(m);
    char name[160];
    snprintf(name, sizeof(name), "bert<%s> %s logits (%d rows) vs transformers", tname, hname, m.head_rows);
    if (logits.size() != ref_logits.size()) {
        th::report(false, name, "%zu logits, transformers has %zu", logits.size(), ref_logits.size());
        m.free_all();
        return;
    }
    double scale = max_abs(ref_logits.data(), ref_logits.size());
    th::check_close(name, ref_logits.data(), logits.data(), logits.size(),
                    th::Tol{k.logit_k * eps * scale, k.logit_k * eps});
    float loss = m.mean_loss();
    snprintf(name, sizeof(name), "bert<%s> %s loss vs transformers", tname, hname);
    th::check_close(name, &ref_loss, &loss, 1, th::Tol{k.loss_k * eps * ref_loss, 0});

    m.forward(true, loss_scale / m.head_rows);
    m.backward();
    auto g_stored = th::to_host(m.grads_memory, m.num_parameters);
    size_t offset = 0;
    int zero_ok = 0, zero_total = 0;
    for (int i = 0; i < NUM_BERT_TENSORS; i++) {
        size_t n = m.sizes[i];
        std::vector<float> g(n);
        for (size_t e = 0; e < n; e++) g[e] = to_float(g_stored[offset + e]) / loss_scale;
        const float* ref = f.grads.data() + offset;
        if (!f.parts.has[bert_param_part(i)]) {  // the other head's: transformers' model lacks it, ours gets nothing
            zero_total++;
            zero_ok += max_abs(g.data(), n) == 0;
        } else {
            double s = max_abs(ref, n);
            snprintf(name, sizeof(name), "bert<%s> %s grad %s vs transformers", tname, hname, kBertParamNames[i]);
            th::check_close(name, ref, g.data(), n, th::Tol{k.grad_k * eps * s, k.grad_k * eps});
        }
        offset += n;
    }
    snprintf(name, sizeof(name), "bert<%s> %s: the other head's %d tensors get exactly zero gradient", tname, hname,
             zero_total);
    th::report(zero_ok == zero_total, name, "%d of %d are zero", zero_ok, zero_total);
    m.free_all();

    // 10 AdamW steps from the same weights on the same batch, the oracle's settings.
    const std::vector<float>& expected = head == BertHead::MLM ? b.mlm_steps : b.cls_steps;
    BERT<floatX> s;
    s.opt.weight_decay = 0.01f;  // lr 1e-3, betas (0.9, 0.999), eps 1e-8, clip 1.0: see oracle_bert.py
    s.build(f.config, f.init);
    s.allocate_activations(b.B, b.T, 32);
    s.set_batch(b.ids.data(), b.types.data(), b.valid.data(), labels_of(b, head), head);
    std::vector<float> got;
    bool applied = true;  // every scaled update went through (no overflow at this scale)
    for (size_t step = 0; step < expected.size(); step++) {
        cudaCheck(cudaMemset(s.grads_memory, 0, s.num_parameters * sizeof(floatX)));
        s.forward(true, loss_scale / s.head_rows);
        s.backward();
        got.push_back(s.mean_loss());
        if (loss_scale != 1.f) applied = s.update_scaled(1e-3f, 1.f, (int)step + 1, loss_scale) && applied;
        else s.update(1e-3f, 1.f, (int)step + 1);
    }
    snprintf(name, sizeof(name), "bert<%s> %s losses of 10 AdamW steps vs torch.optim.AdamW", tname, hname);
    th::check_close(name, expected.data(), got.data(), got.size(), th::Tol{k.step_k * eps * expected[0], 0});
    if (loss_scale != 1.f) {
        snprintf(name, sizeof(name), "bert<%s> %s: 10 loss-scaled steps (scale %g), no overflow, all applied", tname,
                 hname, loss_scale);
        th::report(applied, name);
    }
    s.free_all();
}

// ----------------------------------------------------------------------------
// Padding invariance

// What one run produces: the head's logits, the per-row losses and every gradient, as floats.
struct RunResult {
    std::vector<float> logits, losses, grads;
};

// Forward and backward of `head` on sequences [first, first+n) of the batch, padded to T tokens.
template <class floatX>
RunResult run_padded(const Model& f, const Batch& b, BertHead head, int first, int n, int T) {
    std::vector<int> ids((size_t)n * T, 0), types((size_t)n * T, 0), labels((size_t)n * T, -100), valid(n), classes(n);
    for (int s = 0; s < n; s++) {
        int src = first + s;
        valid[s] = b.valid[src];
        classes[s] = b.cls_labels[src];
        for (int t = 0; t < std::min(T, b.T); t++) {
            ids[(size_t)s * T + t] = b.ids[(size_t)src * b.T + t];
            types[(size_t)s * T + t] = b.types[(size_t)src * b.T + t];
            labels[(size_t)s * T + t] = b.mlm_labels[(size_t)src * b.T + t];
        }
    }
    BERT<floatX> m;
    m.build(f.config, f.init);
    m.allocate_activations(n, T);
    m.set_batch(ids.data(), types.data(), valid.data(), head == BertHead::MLM ? labels.data() : classes.data(), head);
    m.forward(true, 1.f / m.head_rows);
    m.backward();
    RunResult r;
    auto losses = th::to_host(m.acts.losses, (size_t)m.head_rows);
    r.losses.assign(losses.begin(), losses.end());
    auto g = th::to_host(m.grads_memory, m.num_parameters);
    for (auto x : g) r.grads.push_back(to_float(x));
    // the logits were overwritten by their gradient: run the forward pass again without it
    m.forward(false, 0.f);
    r.logits = head_logits(m);
    m.free_all();
    return r;
}

// Whether a and b agree: bit for bit on the CPU backend (where the GEMM's summation order does not
// depend on the number of rows); on a GPU, cuBLASLt may choose another algorithm for another row count,
// so there within k roundings of the values' scale.
bool padded_same(const char* name, const std::vector<float>& a, const std::vector<float>& b, double k, double eps) {
    if (on_cpu_backend())
        return th::check_bitwise(name, a.data(), b.data(), a.size() == b.size() ? a.size() * sizeof(float) : 0) &&
               a.size() == b.size();
    double s = max_abs(a.data(), a.size());
    return a.size() == b.size() && th::check_close(name, a.data(), b.data(), a.size(), th::Tol{k * eps * s, k * eps});
}

// The three shorter sequences of the batch (37, 9 and 1 valid tokens) padded to T = 40 (the longest
// rounded up to a multiple of 8, as a length-bucketing data pipeline pads) and to T = 64: the logits,
// losses and every gradient must not change. Bit-identical where the kernels' summation orders do not
// depend on the padding; the rest (sums over rows whose grouping depends on B*T) within k_reorder
// roundings of each tensor's scale.
template <class floatX>
void check_padding_invariance(BertHead head, double k_reorder) {
    const char* tname = th::dtype_name<floatX>();
    double eps = dtype_eps<floatX>();
    Model f = load_model(head);
    Batch b = load_batch();
    RunResult a = run_padded<floatX>(f, b, head, 1, 3, 40), c = run_padded<floatX>(f, b, head, 1, 3, 64);
    char name[200];
    snprintf(name, sizeof(name), "padding invariance <%s, %s>: T=40 vs T=64, logits", tname, head_name(head));
    padded_same(name, a.logits, c.logits, k_reorder, eps);
    snprintf(name, sizeof(name), "padding invariance <%s, %s>: T=40 vs T=64, losses", tname, head_name(head));
    padded_same(name, a.losses, c.losses, k_reorder, eps);
    size_t sizes[NUM_BERT_TENSORS];
    bert_param_sizes(f.config, sizes);
    size_t offset = 0;
    std::string identical, within;
    bool ok = true;
    double worst = 0;
    for (int i = 0; i < NUM_BERT_TENSORS; i++) {
        const float* x = a.grads.data() + offset;
        const float* y = c.grads.data() + offset;
        if (memcmp(x, y, sizes[i] * sizeof(float)) == 0) {
            identical += std::string(identical.empty() ? "" : " ") + kBertParamNames[i];
        } else {
            double s = max_abs(x, sizes[i]), err = 0;
            for (size_t e = 0; e < sizes[i]; e++) err = std::max(err, (double)std::fabs(x[e] - y[e]));
            double bound = k_reorder * eps * s;
            ok &= err <= bound;
            worst = std::max(worst, err / bound);
            within += std::string(within.empty() ? "" : " ") + kBertParamNames[i];
        }
        offset += sizes[i];
    }
    snprintf(name, sizeof(name), "padding invariance <%s, %s>: T=40 vs T=64, gradients", tname, head_name(head));
    th::report(ok, name, "bit-identical: %s | within %g eps of the tensor's scale (worst %.0f%% of it): %s",
               identical.empty() ? "none" : identical.c_str(), k_reorder, 100 * worst,
               within.empty() ? "none" : within.c_str());
}

// ----------------------------------------------------------------------------
// Determinism, memory anatomy

// Two bf16 runs of 3 training steps from the same weights give bit-identical losses and weights.
void check_determinism() {
    Model f = load_model(BertHead::MLM);
    Batch b = load_batch();
    auto run = [&] {
        BERT<__nv_bfloat16> m;
        m.build(f.config, f.init);
        m.allocate_activations(b.B, b.T);
        m.set_batch(b.ids.data(), b.types.data(), b.valid.data(), b.mlm_labels.data(), BertHead::MLM);
        std::vector<float> out;
        for (int step = 0; step < 3; step++) {
            cudaCheck(cudaMemset(m.grads_memory, 0, m.num_parameters * sizeof(__nv_bfloat16)));
            m.forward(true, 1.f / m.head_rows);
            m.backward();
            out.push_back(m.mean_loss());
            m.update(1e-3f, 1.f, step + 1);
        }
        std::vector<float> p = m.params_host_fp32();
        out.insert(out.end(), p.begin(), p.end());
        m.free_all();
        return out;
    };
    auto x = run(), y = run();
    th::check_bitwise("determinism: two bf16 runs of 3 MLM steps give bit-identical losses and weights", x.data(),
                      y.data(), x.size() * sizeof(float));
}

// Each recomputation level gives the same losses and gradients as storing everything, bit for bit,
// with dropout on (the recomputed layers redraw the forward's masks from the same offsets), and
// fewer activation bytes than the level before it.
template <class floatX>
void check_recompute(BertHead head) {
    Model f = load_model(head);
    Batch b = load_batch();
    const int* labels = head == BertHead::MLM ? b.mlm_labels.data() : b.cls_labels.data();
    auto grads_with = [&](Recompute r, float dropout, size_t* bytes) {
        BERT<floatX> m;
        m.recompute = r;
        m.dropout = BertDropout::all(dropout);
        m.dropout_seed = 1234;
        m.dropout_pass = 3;
        m.build(f.config, f.init);
        m.allocate_activations(b.B, b.T);
        m.set_batch(b.ids.data(), b.types.data(), b.valid.data(), labels, head);
        cudaCheck(cudaMemset(m.grads_memory, 0, m.num_parameters * sizeof(floatX)));
        m.forward(true, 1.f / m.head_rows);
        m.backward();
        auto g = th::to_host(m.grads_memory, m.num_parameters);
        auto losses = th::to_host(m.acts.losses, (size_t)m.head_rows);
        *bytes = m.acts_bytes;
        m.free_all();
        std::vector<float> out(losses.begin(), losses.end());
        for (auto x : g) out.push_back(to_float(x));
        return out;
    };
    size_t base_bytes, bytes;
    std::vector<float> base = grads_with(Recompute::None, 0.1f, &base_bytes);
    // Dropout must be doing something for the check to mean anything.
    std::vector<float> plain = grads_with(Recompute::None, 0.f, &bytes);
    bool dropped = memcmp(plain.data(), base.data(), base.size() * 4) != 0;
    size_t previous = base_bytes;
    for (Recompute r : {Recompute::Gelu, Recompute::LN, Recompute::Layer}) {
        std::vector<float> got = grads_with(r, 0.1f, &bytes);
        char name[160];
        snprintf(name, sizeof(name), "recompute %s <%s, %s, dropout 0.1>: losses and gradients bit-identical to none",
                 recompute_name(r), th::dtype_name<floatX>(), head_name(head));
        bool same = got.size() == base.size() && memcmp(got.data(), base.data(), got.size() * 4) == 0;
        th::report(dropped && same && bytes < previous, name, "activations %zu B (none: %zu B)", bytes, base_bytes);
        previous = bytes;
    }
}

// CUDA graphs (BERT::train_micro_step): 3 steps of 2 micro-steps, of batch widths 32 and 16, then
// 32 and 24 twice (24 is first seen in a graphed step and captured there), replayed from graphs
// after the eager first step: losses and parameters bit-identical to eager launches, no host wait in
// the graphed steps, and the third step (replays only) issues far fewer stream operations. With
// dropout on, a replay must draw its own pass's masks (the pass's offset is read from device
// memory), or its losses would differ from eager launches'. MLM: every micro-batch has its own
// number of masked rows, so its own loss weight (read from device memory too), while the head's
// computed rows (rounded up to 64) and so the graphs repeat.
void check_cuda_graphs(float dropout, BertHead head) {
    Model f = load_model(head);
    const BertConfig& c = f.config;
    const int B = 4, k = 2, steps = 3, widths[steps][k] = {{32, 16}, {32, 24}, {32, 24}};
    struct MicroBatch {
        int T;
        std::vector<int> ids, valid, labels;
    };
    std::vector<MicroBatch> batches;  // step by step, micro-step by micro-step
    BertRng rng({11});
    for (int step = 0; step < steps; step++)
        for (int i = 0; i < k; i++) {
            MicroBatch mb{widths[step][i], {}, {}, {}};
            mb.ids.assign((size_t)B * mb.T, 0);
            if (head == BertHead::MLM) mb.labels.assign((size_t)B * mb.T, -100);
            for (int b = 0; b < B; b++) {
                int valid = b == 0 ? mb.T : 2 + (int)rng.below(mb.T - 1);  // the widest sequence sets the width
                mb.valid.push_back(valid);
                if (head == BertHead::Classify) mb.labels.push_back((int)rng.below(c.num_labels));
                for (int t = 0; t < valid; t++) {
                    int id = t == 0 ? 101 : 110 + (int)rng.below(c.vocab_size - 110);
                    mb.ids[(size_t)b * mb.T + t] = id;
                    if (head == BertHead::MLM && t > 0 && rng.below(4) == 0) {  // predict ~1 in 4 tokens
                        mb.labels[(size_t)b * mb.T + t] = id;
                        mb.ids[(size_t)b * mb.T + t] = 103;  // [MASK]
                    }
                }
            }
            batches.push_back(mb);
        }
    struct Run {
        std::vector<float> params, losses;
        std::vector<int> rows;  // of each micro-step
        long long waits = 0, ops_last = 0;
        size_t graphs = 0;
    };
    auto run = [&](bool graphed, bool autotune) {
        Run r;
        BERT<float> m;
        cudaStream_t stream;
        cudaCheck(cudaStreamCreate(&stream));  // the legacy stream cannot capture
        matmul_forget_plans();
        matmul_set_autotune(autotune);
        m.eager_first_use = autotune;
        m.stream = stream;
        m.dropout = BertDropout::all(dropout);
        m.dropout_seed = 77;
        m.build(c, f.init);
        m.allocate_activations(B, 32);
        m.reserve_batch_slots(k);
        const size_t max_rows = (size_t)B * 32;
        float* losses;
        cudaCheck(cudaMallocHost(&losses, (size_t)k * max_rows * sizeof(float)));
        for (int step = 0; step < steps; step++) {
            long long waits0 = host_sync_count(), ops0 = host_stream_op_count();
            m.zero_grads();
            for (int i = 0; i < k; i++) {
                const MicroBatch& mb = batches[(size_t)step * k + i];
                m.sync_grads = i == k - 1;
                m.dropout_pass = (uint64_t)step * k + i;
                m.set_batch(mb.ids.data(), nullptr, mb.valid.data(), mb.labels.data(), head, true, mb.T);
                r.rows.push_back(m.head_rows);
                m.train_micro_step(1.f / (m.head_rows * k), graphed && step > 0);  // the first step eager
                m.copy_losses(losses + (size_t)i * max_rows);
            }
            m.update(1e-3f, 1.f, step + 1);
            if (step > 0) r.waits += host_sync_count() - waits0;
            r.ops_last = host_stream_op_count() - ops0;
            cudaCheck(cudaStreamSynchronize(stream));
            for (int i = 0; i < k; i++)
                r.losses.insert(r.losses.end(), losses + i * max_rows, losses + i * max_rows + r.rows[step * k + i]);
        }
        r.params = m.params_host_fp32();
        r.graphs = m.num_micro_graphs();
        cudaCheck(cudaFreeHost(losses));
        m.free_all();
        cudaCheck(cudaStreamDestroy(stream));
        matmul_set_autotune(false);
        return r;
    };
    Run eager = run(false, false), graphed = run(true, false);
    bool same = eager.params == graphed.params && eager.losses == graphed.losses;
    bool fewer = !on_cpu_backend() || graphed.ops_last * 3 < eager.ops_last;
    std::string rows;
    for (int R : graphed.rows) rows += (rows.empty() ? "" : "/") + std::to_string(R);
    char name[200];
    snprintf(name, sizeof(name), "CUDA graphs, %s, dropout %g: 3 steps of 2 micro-steps of widths 32/16/24 replayed "
             "== eager, bit for bit; no host wait (fp32)", head_name(head), dropout);
    th::report(same && graphed.waits == 0 && fewer && graphed.graphs == 2, name,
               "losses and parameters %s; head rows %s; %zu graphs; %lld host waits in the graphed steps; step 3 "
               "issued %lld stream operations (eager %lld)", same ? "bit-identical" : "differ", rows.c_str(),
               graphed.graphs, graphed.waits, graphed.ops_last, eager.ops_last);
    // --gemm-autotune with graphs: a new key's first micro-step runs eagerly (eager_first_use), so
    // the GEMM shapes of width 24, first seen in a graphed step, are timed too, none planned inside a
    // capture. On the CPU backend, whose candidate algorithms compute the same values, bit-identical.
    if (dropout > 0.f || head != BertHead::Classify) return;
    const int timed0 = matmul_context().autotuned, captured0 = matmul_context().autotune_captured;
    Run tuned = run(true, true);
    const int timed = matmul_context().autotuned - timed0, captured = matmul_context().autotune_captured - captured0;
    bool tuned_same = !on_cpu_backend() || (tuned.params == eager.params && tuned.losses == eager.losses);
    th::report(tuned_same && timed > 0 && captured == 0 && tuned.graphs == 2, "CUDA graphs with --gemm-autotune: "
               "each key's first micro-step eager, every GEMM shape timed outside a capture; == eager (CPU backend)",
               "%d shapes timed, %d planned inside a capture, %zu graphs", timed, captured, tuned.graphs);
}

// The memory anatomy's figures are what is allocated: the device's bytes in use grow by its total
// when a model is built and its activations allocated (exactly on the CPU backend, to within a page
// per allocation on a GPU: th::device_bytes_match), and not at all during a step.
template <class floatX>
void check_memory_anatomy(Recompute r) {
    Model f = load_model(BertHead::MLM);
    Batch b = load_batch();
    auto used = [] {
        size_t free_b, total_b;
        cudaCheck(cudaMemGetInfo(&free_b, &total_b));
        return total_b - free_b;
    };
    size_t before = used(), allocations = g_device_allocations;
    BERT<floatX> m;
    m.recompute = r;
    m.build(f.config, f.init);
    m.allocate_activations(b.B, b.T, 32);
    size_t allocated = used() - before;
    allocations = g_device_allocations - allocations;
    m.set_batch(b.ids.data(), b.types.data(), b.valid.data(), b.mlm_labels.data(), BertHead::MLM);
    m.forward(true, 1.f / m.head_rows);
    m.backward();
    m.update(1e-3f, 1.f, 1);
    cudaCheck(cudaDeviceSynchronize());
    size_t after = used() - before;
    const MemoryAnatomy& a = m.mem;
    size_t n = m.num_parameters, per = sizeof(floatX);
    bool parts = a.weights == n * per && a.grads == n * per && a.master == (per == 4 ? 0 : n * 4) &&
                 a.optimizer == n * 8 && a.activations == m.acts_bytes;
    char name[128];
    snprintf(name, sizeof(name), "memory anatomy <%s, recompute %s> = bytes allocated", th::dtype_name<floatX>(),
             recompute_name(r));
    th::report(parts && th::device_bytes_match(allocated, a.total(), allocations) && after == allocated, name,
               "anatomy %zu B (activations %zu B), allocated %zu B in %zu cudaMallocs, after a step %zu B",
               a.total(), a.activations, allocated, allocations, after);
    m.free_all();
}

// ----------------------------------------------------------------------------
// Checkpoints in and out

// A temporary directory for the variants, removed at exit.
std::string temp_dir() {
    static std::string dir;
    if (dir.empty()) {
        char tmpl[] = "/tmp/llmc_test_bert_XXXXXX";
        if (!mkdtemp(tmpl)) data_error("mkdtemp failed");
        dir = tmpl;
        atexit([] { th::run_command("rm -rf " + dir); });
    }
    return dir;
}

std::string read_text(const std::string& path) {
    std::vector<uint8_t> bytes;
    std::string err;
    if (!read_whole_file(path, &bytes, &err)) data_error("%s", err.c_str());
    return std::string(bytes.begin(), bytes.end());
}

void write_text(const std::string& path, const std::string& text) {
    std::string err;
    if (!write_file_atomic(path, {{text.data(), text.size()}}, &err)) data_error("%s", err.c_str());
}

// Renames, drops or changes a fixture tensor: returns false to drop it.
using Edit = std::function<bool(std::string* name, std::vector<float>* values, std::vector<size_t>* shape)>;

// Writes dir/model.safetensors (the fixture model `src`'s tensors passed through edit, plus extra
// tensors) and dir/config.json (the fixture's, with `from` replaced by `to`); returns dir.
std::string write_variant(const std::string& variant, const std::string& src, const Edit& edit,
                          const std::vector<std::pair<std::string, std::vector<size_t>>>& extra = {},
                          const std::string& from = "", const std::string& to = "",
                          const std::function<std::vector<float>(const std::string&)>& extra_values = nullptr) {
    std::string dir = temp_dir() + "/" + variant, err;
    if (!make_dirs(dir, &err)) data_error("%s", err.c_str());
    SafeTensors st;
    if (!st.load(kFixtures + src + "/model.safetensors", &err)) data_error("%s", err.c_str());
    SafeTensorsWriter w;
    for (const SafeTensor& t : st.tensors()) {
        std::string name = t.name;
        std::vector<float> values;
        std::vector<size_t> shape = t.shape;
        if (!SafeTensors::to_float(t, &values, &err)) data_error("%s", err.c_str());
        if (edit && !edit(&name, &values, &shape)) continue;
        w.add(name, values.data(), shape);
    }
    for (const auto& e : extra) {
        size_t n = 1;
        for (size_t d : e.second) n *= d;
        std::vector<float> values = extra_values ? extra_values(e.first) : std::vector<float>(n, 0.f);
        w.add(e.first, values.data(), e.second);
    }
    if (!w.write(dir + "/model.safetensors", &err)) data_error("%s", err.c_str());
    std::string config = read_text(kFixtures + src + "/config.json");
    if (!from.empty()) {
        size_t at = config.find(from);
        if (at == std::string::npos) data_error("%s/config.json has no %s", src.c_str(), from.c_str());
        config.replace(at, from.size(), to);
    }
    write_text(dir + "/config.json", config);
    return dir;
}

// The fixture's tensor called name, as floats.
std::vector<float> fixture_tensor(const std::string& src, const std::string& name) {
    SafeTensors st;
    std::string err;
    if (!st.load(kFixtures + src + "/model.safetensors", &err)) data_error("%s", err.c_str());
    return float_tensor(st, src, name.c_str());
}

// Element offset of tensor i in our layout.
size_t param_offset(const BertConfig& c, int i) {
    size_t sizes[NUM_BERT_TENSORS], off = 0;
    bert_param_sizes(c, sizes);
    for (int k = 0; k < i; k++) off += sizes[k];
    return off;
}

// Whether a and b hold the same values in the tensors of the parts marked in parts.
bool same_parts(const BertConfig& c, const std::vector<float>& a, const std::vector<float>& b,
                std::initializer_list<BertPart> parts) {
    size_t sizes[NUM_BERT_TENSORS], off = 0;
    bert_param_sizes(c, sizes);
    for (int i = 0; i < NUM_BERT_TENSORS; off += sizes[i], i++)
        for (BertPart p : parts)
            if (bert_param_part(i) == p && memcmp(a.data() + off, b.data() + off, sizes[i] * sizeof(float)) != 0)
                return false;
    return true;
}

// Checkpoint variants transformers and the hub use load to the same parameters.
void check_checkpoint_variants() {
    BertConfig c_mlm, c_cls, c;
    BertParts p_mlm, p_cls, p;
    std::vector<float> mlm = load_hf_bert(kFixtures + "bert_tiny_mlm", &c_mlm, &p_mlm);
    std::vector<float> cls = load_hf_bert(kFixtures + "bert_tiny_cls/model.safetensors", &c_cls, &p_cls);
    th::report(p_mlm.has[PART_ENCODER] && p_mlm.has[PART_MLM] && !p_mlm.has[PART_POOLER] && !p_mlm.has[PART_CLASSIFIER] &&
                   p_cls.has[PART_ENCODER] && p_cls.has[PART_POOLER] && p_cls.has[PART_CLASSIFIER] && !p_cls.has[PART_MLM] &&
                   c_cls.num_labels == 3 && c_mlm.num_layers == 2 && c_mlm.intermediate == 128 && c_mlm.vocab_size == 500,
               "hf checkpoints: BertForMaskedLM and BertForSequenceClassification load (their parts, config.json)");
    // BertModel names: no "bert." prefix, no heads; keep the pooler from the classification model.
    std::string dir = write_variant("bertmodel", "bert_tiny_cls", [](std::string* n, std::vector<float>*, std::vector<size_t>*) {
        if (n->compare(0, 5, "bert.") != 0) return false;
        *n = n->substr(5);
        return true;
    });
    std::vector<float> base = load_hf_bert(dir, &c, &p);
    th::report(p.has[PART_ENCODER] && p.has[PART_POOLER] && !p.has[PART_MLM] && !p.has[PART_CLASSIFIER] &&
                   same_parts(c, base, cls, {PART_ENCODER, PART_POOLER}),
               "hf checkpoints: BertModel names (no prefix) load the same encoder and pooler");
    // The original TensorFlow conversion's LayerNorm names (gamma, beta).
    dir = write_variant("gamma_beta", "bert_tiny_mlm", [](std::string* n, std::vector<float>*, std::vector<size_t>*) {
        size_t at = n->rfind("LayerNorm.");
        if (at != std::string::npos) *n = n->substr(0, at + 10) + (n->substr(at + 10) == "weight" ? "gamma" : "beta");
        return true;
    });
    std::vector<float> legacy = load_hf_bert(dir, &c, &p);
    th::report(same_parts(c, legacy, mlm, {PART_ENCODER, PART_MLM}),
               "hf checkpoints: LayerNorm gamma/beta names load the same values");
    // BertForPreTraining: the tied decoder stored, the next-sentence head (skipped), the buffers.
    size_t V = c_mlm.vocab_size, C = c_mlm.channels;
    std::vector<float> word = fixture_tensor("bert_tiny_mlm", "bert.embeddings.word_embeddings.weight");
    std::vector<float> bias = fixture_tensor("bert_tiny_mlm", "cls.predictions.bias");
    dir = write_variant("pretraining", "bert_tiny_mlm", nullptr,
                        {{"cls.predictions.decoder.weight", {V, C}}, {"cls.predictions.decoder.bias", {V}},
                         {"cls.seq_relationship.weight", {2, C}}, {"cls.seq_relationship.bias", {2}},
                         {"bert.embeddings.position_ids", {1, (size_t)c_mlm.max_seq_len}}},
                        "", "", [&](const std::string& n) {
                            if (n == "cls.predictions.decoder.weight") return word;
                            if (n == "cls.predictions.decoder.bias") return bias;
                            return std::vector<float>(n.find("weight") != std::string::npos ? 2 * C
                                                      : n.find("position") != std::string::npos ? c_mlm.max_seq_len : 2,
                                                      0.5f);
                        });
    std::vector<float> pre = load_hf_bert(dir, &c, &p);
    th::report(same_parts(c, pre, mlm, {PART_ENCODER, PART_MLM}),
               "hf checkpoints: BertForPreTraining names (tied decoder stored, next-sentence head and buffers skipped)");
    // A sharded save: the classification model's tensors dealt over two shards, and the index.
    dir = temp_dir() + "/sharded";
    {
        std::string err, map;
        make_dirs(dir, &err);
        SafeTensors st;
        if (!st.load(kFixtures + "bert_tiny_cls/model.safetensors", &err)) data_error("%s", err.c_str());
        SafeTensorsWriter shard[2];
        for (size_t i = 0; i < st.tensors().size(); i++) {
            const SafeTensor& t = st.tensors()[i];
            std::vector<float> v = float_tensor(st, "bert_tiny_cls", t.name.c_str());
            shard[i % 2].add(t.name, v.data(), t.shape);
            map += std::string(i ? ", " : "") + json::quote(t.name) + ": \"model-0000" + std::to_string(i % 2 + 1) +
                   "-of-00002.safetensors\"";
        }
        for (int k = 0; k < 2; k++)
            if (!shard[k].write(dir + "/model-0000" + std::to_string(k + 1) + "-of-00002.safetensors", &err))
                data_error("%s", err.c_str());
        write_text(dir + "/model.safetensors.index.json", "{\"metadata\": {}, \"weight_map\": {" + map + "}}");
        write_text(dir + "/config.json", read_text(kFixtures + "bert_tiny_cls/config.json"));
    }
    std::vector<float> sharded = load_hf_bert(dir, &c, &p);
    th::report(p.has[PART_CLASSIFIER] && same_parts(c, sharded, cls, {PART_ENCODER, PART_POOLER, PART_CLASSIFIER}),
               "hf checkpoints: a sharded save (index + 2 shards) loads the same encoder, pooler and classifier");
    // Absent parts are initialized as transformers does: LayerNorm 1/0, biases 0, matrices ~N(0, 0.02).
    size_t poolw = param_offset(c_mlm, POOLW), poolb = param_offset(c_mlm, POOLB);
    double sum = 0, sq = 0;
    for (size_t k = 0; k < C * C; k++) {
        sum += mlm[poolw + k];
        sq += mlm[poolw + k] * mlm[poolw + k];
    }
    double mean = sum / (C * C), std_ = std::sqrt(sq / (C * C) - mean * mean);
    bool zero_bias = max_abs(mlm.data() + poolb, C) == 0;
    th::report(zero_bias && std::fabs(mean) < 0.002 && std::fabs(std_ - 0.02) < 0.002,
               "hf checkpoints: an absent pooler is initialized as transformers does (N(0, 0.02), bias 0)",
               "mean %.5f std %.5f", mean, std_);
}

// Runs body in a child process; passes when it exits with EXIT_FAILURE and stderr contains expect.
void expect_refusal(const char* name, const char* expect, const std::function<void()>& body) {
    th::ChildOutput r = th::run_in_child(body);
    while (!r.text.empty() && r.text.back() == '\n') r.text.pop_back();
    for (size_t at = r.text.find(temp_dir()); at != std::string::npos; at = r.text.find(temp_dir(), at))
        r.text.replace(at, temp_dir().size(), "TMP");
    th::report(WIFEXITED(r.status) && WEXITSTATUS(r.status) == EXIT_FAILURE && r.text.find(expect) != std::string::npos,
               name, "%s", r.text.c_str());
}

// What this BERT cannot represent, and broken checkpoints, are refused with one line naming the problem.
void check_checkpoint_refusals() {
    auto load = [](const std::string& dir) {
        return [dir] {
            BertConfig c;
            load_hf_bert(dir, &c);
        };
    };
    auto keep = [](std::string*, std::vector<float>*, std::vector<size_t>*) { return true; };
    expect_refusal("hf refuses: hidden_act gelu_new (tanh GELU)", "hidden_act \"gelu_new\" cannot be represented",
                   load(write_variant("act", "bert_tiny_mlm", keep, {}, "\"gelu\"", "\"gelu_new\"")));
    {  // gelu_python is transformers' pure-Python spelling of the same erf GELU: the same weights load
        BertConfig a, b;
        std::vector<float> wa = load_hf_bert(kFixtures + "bert_tiny_mlm", &a),
                           wb = load_hf_bert(write_variant("act_py", "bert_tiny_mlm", keep, {}, "\"gelu\"",
                                                           "\"gelu_python\""), &b);
        th::report(!wa.empty() && wa == wb, "hf: hidden_act gelu_python (the erf GELU) loads as gelu", "%zu values",
                   wb.size());
    }
    expect_refusal("hf refuses: relative position embeddings",
                   "position_embedding_type \"relative_key\" cannot be represented",
                   load(write_variant("pos", "bert_tiny_mlm", keep, {}, "\"absolute\"", "\"relative_key\"")));
    expect_refusal("hf refuses: a dropout probability that is not a number", "\"hidden_dropout_prob\" must be a number",
                   load(write_variant("dropout", "bert_tiny_mlm", keep, {}, "\"hidden_dropout_prob\": 0.0",
                                      "\"hidden_dropout_prob\": \"0.1\"")));
    expect_refusal("hf refuses: another model_type", "model_type is \"roberta\"",
                   load(write_variant("type", "bert_tiny_mlm", keep, {}, "\"bert\"", "\"roberta\"")));
    expect_refusal("hf refuses: a head size the attention kernel lacks (64 channels / 8 heads)",
                   "head size 8 (hidden_size / num_attention_heads) is not supported",
                   load(write_variant("heads", "bert_tiny_mlm", keep, {}, "\"num_attention_heads\": 4",
                                      "\"num_attention_heads\": 8")));
    expect_refusal("hf refuses: config.json's layer count differs from the tensors'",
                   "has 2 encoder layers", load(write_variant("layers", "bert_tiny_mlm", keep, {},
                                                              "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3")));
    expect_refusal("hf refuses: a tensor of the wrong shape", "tensor bert.encoder.layer.1.intermediate.dense.bias has shape [127]",
                   load(write_variant("shape", "bert_tiny_mlm", [](std::string* n, std::vector<float>* v, std::vector<size_t>* s) {
                       if (*n == "bert.encoder.layer.1.intermediate.dense.bias") {
                           v->pop_back();
                           (*s)[0]--;
                       }
                       return true;
                   })));
    expect_refusal("hf refuses: a missing encoder tensor", "the encoder is incomplete: tensor bert.encoder.layer.0.attention.self.key.weight is missing",
                   load(write_variant("missing", "bert_tiny_mlm", [](std::string* n, std::vector<float>*, std::vector<size_t>*) {
                       return *n != "bert.encoder.layer.0.attention.self.key.weight";
                   })));
    expect_refusal("hf refuses: an incomplete MLM head", "the MLM head is incomplete: tensor cls.predictions.bias is missing",
                   load(write_variant("partial", "bert_tiny_mlm", [](std::string* n, std::vector<float>*, std::vector<size_t>*) {
                       return *n != "cls.predictions.bias";
                   })));
    BertConfig c;
    load_hf_bert(kFixtures + "bert_tiny_mlm", &c);
    expect_refusal("hf refuses: an untied MLM decoder", "an untied MLM decoder cannot be represented",
                   load(write_variant("untied", "bert_tiny_mlm", keep,
                                      {{"cls.predictions.decoder.weight", {(size_t)c.vocab_size, (size_t)c.channels}}})));
    expect_refusal("hf refuses: an unexpected tensor", "unexpected tensor bert.encoder.layer.0.attention.self.rotary.weight",
                   load(write_variant("unexpected", "bert_tiny_mlm", keep,
                                      {{"bert.encoder.layer.0.attention.self.rotary.weight", {4}}})));
    expect_refusal("hf refuses: classifier rows that are not config.json's labels",
                   "classifier.weight has 3 rows (labels), TMP/labels/config.json has 2 (id2label)",
                   load(write_variant("labels", "bert_tiny_cls", keep, {}, ",\n    \"2\": \"LABEL_2\"", "")));
    expect_refusal("hf refuses: num_labels that disagrees with id2label",
                   "num_labels 2 and the 3 labels of id2label disagree",
                   load(write_variant("num_labels", "bert_tiny_cls", keep, {}, "\"hidden_act\"",
                                      "\"num_labels\": 2,\n  \"hidden_act\"")));
    expect_refusal("hf refuses: BertForTokenClassification's classifier (per token) as the sequence classifier",
                   "classifier.weight is the head of a BertForTokenClassification",
                   load(write_variant("token", "bert_tiny_cls", keep, {}, "\"BertForSequenceClassification\"",
                                      "\"BertForTokenClassification\"")));
    expect_refusal("hf refuses: a directory with pytorch_model.bin only, saying what to do",
                   "/pickle: holds pytorch_model.bin, a PyTorch pickle, and no model.safetensors: this project reads "
                   "safetensors only (unpickling can run code): save the model with save_pretrained(DIR, "
                   "safe_serialization=True)", [] {
                       BertConfig c2;
                       std::string dir = temp_dir() + "/pickle", err;
                       make_dirs(dir, &err);
                       write_text(dir + "/config.json", read_text(kFixtures + "bert_tiny_cls/config.json"));
                       write_text(dir + "/pytorch_model.bin", "PK\x03\x04 and the rest of a zip archive");
                       load_hf_bert(dir, &c2);
                   });
    expect_refusal("hf refuses: a run's output directory, naming its newest model file",
                   "TMP/run: a run's output directory, not a Hugging Face checkpoint: give its model file, "
                   "TMP/run/model_00000010.bin", [] {
                       BertConfig c2;
                       std::string dir = temp_dir() + "/run", err;
                       make_dirs(dir, &err);
                       write_text(dir + "/config.json", read_text(kFixtures + "bert_tiny_cls/config.json"));
                       for (const char* name : {"/model_00000005.bin", "/DONE_00000005", "/model_00000010.bin", "/DONE_00000010"})
                           write_text(dir + name, "");
                       load_hf_bert(dir, &c2);
                   });
    expect_refusal("hf refuses: a path that does not exist, said as such (not as a missing config.json)",
                   "TMP/nowhere: cannot open: No such file or directory", [] {
                       BertConfig c2;
                       load_hf_bert(temp_dir() + "/nowhere", &c2);
                   });
    expect_refusal("hf refuses: no config.json", "no config.json beside it", [] {
        BertConfig c2;
        std::string dir = temp_dir() + "/noconfig", err;
        make_dirs(dir, &err);
        th::run_command("cp " + kFixtures + "bert_tiny_mlm/model.safetensors " + dir);
        load_hf_bert(dir, &c2);
    });
}

// Export, then import: every exported tensor comes back bit for bit (fp32), for each architecture.
void check_export_import() {
    BertConfig c;
    std::vector<float> cls = load_hf_bert(kFixtures + "bert_tiny_cls", &c);
    std::vector<float> mlm = load_hf_bert(kFixtures + "bert_tiny_mlm", &c);
    struct Case {
        BertHead head;
        const std::vector<float>* params;
        std::initializer_list<BertPart> parts;
    } cases[] = {{BertHead::MLM, &mlm, {PART_ENCODER, PART_MLM}},
                 {BertHead::Classify, &cls, {PART_ENCODER, PART_POOLER, PART_CLASSIFIER}},
                 {BertHead::None, &cls, {PART_ENCODER, PART_POOLER}}};
    for (const Case& k : cases) {
        std::string dir = temp_dir() + "/export_" + head_name(k.head);
        export_hf_bert(dir, c, *k.params, false, k.head);
        BertConfig back;
        BertParts parts;
        std::vector<float> p = load_hf_bert(dir, &back, &parts);
        bool same_config = back.num_layers == c.num_layers && back.channels == c.channels &&
                           back.num_heads == c.num_heads && back.intermediate == c.intermediate &&
                           back.vocab_size == c.vocab_size && back.max_seq_len == c.max_seq_len &&
                           back.type_vocab_size == c.type_vocab_size && back.layernorm_eps == c.layernorm_eps &&
                           back.num_labels == c.num_labels;
        char name[128];
        snprintf(name, sizeof(name), "hf export -> import (%s): config and every exported tensor bit-identical",
                 head_name(k.head));
        th::report(same_config && same_parts(c, p, *k.params, k.parts), name);
    }
}

// Bad batches stop with a message naming the first bad value.
void check_batch_refusals() {
    Model f = load_model(BertHead::MLM);
    Batch b = load_batch();
    auto with = [&](std::function<void(Batch&)> change, BertHead head, int max_masked = -1) {
        return [&f, &b, change, head, max_masked] {
            Batch x = b;
            change(x);
            BERT<float> m;
            m.build(f.config, f.init);
            m.allocate_activations(x.B, x.T, max_masked);
            m.set_batch(x.ids.data(), x.types.data(), x.valid.data(), labels_of(x, head), head);
        };
    };
    expect_refusal("batch refuses: an MLM label in the padding", "MLM label at (b=2, t=20) lies in the padding",
                   with([](Batch& x) { x.mlm_labels[2 * 64 + 20] = 7; }, BertHead::MLM));
    expect_refusal("batch refuses: a sequence without tokens", "sequence 3 has 0 valid tokens, must be in [1, T=64]",
                   with([](Batch& x) { x.valid[3] = 0; }, BertHead::MLM));
    expect_refusal("batch refuses: a token outside the vocabulary", "token id 500 at (b=1, t=3) is outside the vocabulary",
                   with([](Batch& x) { x.ids[64 + 3] = 500; }, BertHead::MLM));
    expect_refusal("batch refuses: a token type outside the table", "token type 2 at (b=0, t=5) is outside [0, 2)",
                   with([](Batch& x) { x.types[5] = 2; }, BertHead::MLM));
    expect_refusal("batch refuses: an MLM label outside the vocabulary", "MLM label 900 at (b=0, t=1)",
                   with([](Batch& x) { x.mlm_labels[1] = 900; }, BertHead::MLM));
    expect_refusal("batch refuses: a class label out of range", "label 3 of sequence 1 is outside [0, 3)",
                   with([](Batch& x) { x.cls_labels[1] = 3; }, BertHead::Classify));
    expect_refusal("batch refuses: more masked positions than reserved",
                   "22 MLM positions, but allocate_activations reserved the MLM head for 16",
                   with([](Batch&) {}, BertHead::MLM, 16));
}

// ----------------------------------------------------------------------------
// The real all-MiniLM-L6-v2

// Our last hidden states and pooled outputs for real sentences against transformers' BertModel.
template <class floatX>
void check_minilm(double k) {
    const char* tname = th::dtype_name<floatX>();
    std::string file = kFixtures + "bert_minilm_sentences.safetensors", err;
    SafeTensors st;
    if (!st.load(file, &err)) data_error("%s (run: /usr/bin/python3 test/oracle_bert.py)", err.c_str());
    std::vector<int> ids = int_tensor(st, file, "input_ids"), types = int_tensor(st, file, "token_type_ids");
    std::vector<int> valid = int_tensor(st, file, "valid_len");
    std::vector<float> hidden = float_tensor(st, file, "hidden"), pooled = float_tensor(st, file, "pooled");
    int B = (int)valid.size(), T = (int)(ids.size() / B);
    BertConfig c;
    BertParts parts;
    std::vector<float> init = load_hf_bert(kMinilmDir, &c, &parts);
    int C = c.channels;
    BERT<floatX> m;
    m.build(c, init);
    m.allocate_activations(B, T, 0);
    std::vector<int> labels(B, 0);  // the classification head's pooler gives pooler_output; labels unused
    m.set_batch(ids.data(), types.data(), valid.data(), labels.data(), BertHead::Classify, false);
    m.forward(false, 0.f);
    auto h = th::to_host(m.hidden(), (size_t)B * T * C);
    auto pool = th::to_host(m.acts.head_act, (size_t)B * C);
    // valid rows only: padded rows are not defined alike (see BERT::hidden)
    std::vector<float> ours, ref;
    for (int b = 0; b < B; b++)
        for (size_t e = (size_t)b * T * C; e < ((size_t)b * T + valid[b]) * C; e++) {
            ours.push_back(to_float(h[e]));
            ref.push_back(hidden[e]);
        }
    double eps = dtype_eps<floatX>(), scale = max_abs(ref.data(), ref.size());
    char name[200];
    snprintf(name, sizeof(name), "all-MiniLM-L6-v2 <%s>: last hidden states of %d real sentences (%zu tokens) vs "
             "transformers' BertModel", tname, B, ref.size() / C);
    th::check_close(name, ref.data(), ours.data(), ref.size(), th::Tol{k * eps * scale, k * eps});
    std::vector<float> pool_f(pool.size());
    for (size_t e = 0; e < pool.size(); e++) pool_f[e] = to_float(pool[e]);
    snprintf(name, sizeof(name), "all-MiniLM-L6-v2 <%s>: pooler output vs transformers' BertModel", tname);
    th::check_close(name, pooled.data(), pool_f.data(), pooled.size(), th::Tol{k * eps, k * eps});
    m.free_all();
}

// ----------------------------------------------------------------------------
// --export DIR: what test/hf_bert_roundtrip.py hands to transformers

// Writes the batch and our head's logits for it, computed in fp32 from params, to path.
void write_our_logits(const std::string& path, const BertConfig& c, const std::vector<float>& params, const Batch& b,
                      BertHead head) {
    BERT<float> e;
    e.build(c, params);
    e.allocate_activations(b.B, b.T);
    e.set_batch(b.ids.data(), b.types.data(), b.valid.data(), labels_of(b, head), head, false);
    e.forward(false, 0.f);
    std::vector<float> logits = head_logits(e);
    size_t R = e.head_rows, width = logits.size() / R;
    e.free_all();
    // ids as F32 (exact below 2^24): the writer stores floats
    auto as_float = [](const std::vector<int>& v) { return std::vector<float>(v.begin(), v.end()); };
    SafeTensorsWriter out;
    out.add("input_ids", as_float(b.ids).data(), {(size_t)b.B, (size_t)b.T});
    out.add("token_type_ids", as_float(b.types).data(), {(size_t)b.B, (size_t)b.T});
    out.add("valid_len", as_float(b.valid).data(), {(size_t)b.B});
    out.add("mlm_labels", as_float(b.mlm_labels).data(), {(size_t)b.B, (size_t)b.T});
    out.add("logits", logits.data(), {R, width});
    std::string err;
    if (!out.write(path, &err)) data_error("%s", err.c_str());
}

int export_mode(const std::string& dir) {
    matmul_init();
    Batch b = load_batch();
    for (BertHead head : {BertHead::MLM, BertHead::Classify}) {
        Model f = load_model(head);
        // 3 AdamW steps, so that the export holds our trained weights rather than the fixture's
        BERT<float> m;
        m.build(f.config, f.init);
        m.allocate_activations(b.B, b.T);
        m.set_batch(b.ids.data(), b.types.data(), b.valid.data(), labels_of(b, head), head);
        for (int step = 0; step < 3; step++) {
            cudaCheck(cudaMemset(m.grads_memory, 0, m.num_parameters * sizeof(float)));
            m.forward(true, 1.f / m.head_rows);
            m.backward();
            m.update(1e-3f, 1.f, step + 1);
        }
        std::vector<float> trained = m.params_host_fp32();
        m.free_all();
        for (bool bf16 : {false, true}) {
            std::string variant = std::string(head_name(head)) + (bf16 ? "_bf16" : "_fp32");
            export_hf_bert(dir + "/" + variant, f.config, trained, bf16, head);
            // our logits in fp32 from exactly the exported weights (rounded to bf16 for the bf16 export)
            std::vector<float> w = trained;
            if (bf16)
                for (float& x : w) x = to_float(from_float<__nv_bfloat16>(x));
            write_our_logits(dir + "/ours_" + variant + ".safetensors", f.config, w, b, head);
        }
    }
    matmul_destroy();
    printf("wrote the exports into %s\n", dir.c_str());
    return 0;
}

// --import mlm|cls DIR OUT: the batch and our logits of that head from the checkpoint in DIR.
int import_mode(const std::string& head_name, const std::string& dir, const std::string& out) {
    if (head_name != "mlm" && head_name != "cls") data_error("--import: the head is mlm or cls, not %s", head_name.c_str());
    BertHead head = head_name == "mlm" ? BertHead::MLM : BertHead::Classify;
    matmul_init();
    BertConfig c;
    BertParts parts;
    std::vector<float> params = load_hf_bert(dir, &c, &parts);
    if (!parts.has[head == BertHead::MLM ? PART_MLM : PART_CLASSIFIER])
        data_error("--import %s: %s has no such head", head_name.c_str(), dir.c_str());
    write_our_logits(out, c, params, load_batch(), head);
    matmul_destroy();
    printf("imported %s (L=%d C=%d NH=%d V=%d) and wrote our %s logits to %s\n", dir.c_str(), c.num_layers, c.channels,
           c.num_heads, c.vocab_size, head_name.c_str(), out.c_str());
    return 0;
}

int main(int argc, char** argv) {
    if (argc == 3 && std::string(argv[1]) == "--export") return export_mode(argv[2]);
    if (argc == 5 && std::string(argv[1]) == "--import") return import_mode(argv[2], argv[3], argv[4]);
    matmul_init();
    // fp32. Both sides compute the same network in fp32 with different summation orders and
    // formulations (transformers' softmax with an additive -3.4e38 mask, its GELU and LayerNorm), so each
    // op adds a few roundings relative to the scale of its output; 2 layers of 4 such ops, the head, and
    // the post-LN normalizations (which rescale errors by rstd) compound them, mostly cancelling: k = 16
    // roundings of the logits' scale, as test_gpt2 allows. The loss, a mean of per-token losses each within
    // a few roundings of its logsumexp: k = 16 of the loss. Gradients: sums over the tokens of products
    // through the network, k = 16 roundings of each tensor's scale (as test_gpt2). 10 AdamW steps: each
    // loss is computed as the first one, from weights that differ from torch's by what ulp differences of
    // the gradients change in the updates (lr times a relative change of m/sqrt(v) of a few ulps), far
    // below the loss's own rounding: k = 16 of the first loss, as for the loss itself.
    check_against_oracle<float>(BertHead::MLM, Budget{16, 16, 16, 16});
    check_against_oracle<float>(BertHead::Classify, Budget{16, 16, 16, 16});
    // bf16: parameters and every activation rounded to bf16 (eps 2^-7), each rounding relative error eps/2.
    // Between the tokens and the logits stand about a dozen roundings (embeddings, LayerNorm outputs, the
    // attention (P and its output), the projections, GELU, the residual sums) that are independent and
    // mostly cancel: k = 2 of the logits' scale (as test_gpt2), and a mean loss within eps/2 (k = 0.5).
    // Gradients: k = 2 roundings of each tensor's scale (as test_gpt2). The steps: the 10 losses of the
    // same bf16 trajectory, each within eps/2 of the loss as the first is (k = 0.5).
    check_against_oracle<__nv_bfloat16>(BertHead::MLM, Budget{2, 0.5, 2, 0.5});
    check_against_oracle<__nv_bfloat16>(BertHead::Classify, Budget{2, 0.5, 2, 0.5});
    // fp16: the same derivation with eps 2^-10, the gradients computed under a loss scale of 2^16 (as
    // training does: unscaled, fp16 flushes the smallest to its subnormals) and divided by it again.
    check_against_oracle<__half>(BertHead::MLM, Budget{2, 0.5, 2, 0.5}, 65536.f);
    check_against_oracle<__half>(BertHead::Classify, Budget{2, 0.5, 2, 0.5}, 65536.f);
    // More padding: the attention skips padded keys and tiles, padded rows pass no gradient, and every
    // per-row op reads its own row only, so logits and losses do not move at all (on the CPU backend; a
    // GPU's cuBLASLt may pick another algorithm for another row count). Sums over rows whose grouping
    // depends on B*T — the LayerNorm parameter gradients (blocks of 32 rows), the token-type embedding's
    // (segments of 32 positions), and on a GPU possibly cuBLASLt's weight gradients — add the same
    // nonzero terms (the padding adds exact zeros) in another grouping: k = 4 roundings of the scale.
    check_padding_invariance<float>(BertHead::MLM, 4);
    check_padding_invariance<float>(BertHead::Classify, 4);
    check_padding_invariance<__nv_bfloat16>(BertHead::MLM, 4);
    check_padding_invariance<__nv_bfloat16>(BertHead::Classify, 4);
    check_determinism();
    check_recompute<float>(BertHead::MLM);
    check_recompute<float>(BertHead::Classify);
    check_recompute<__nv_bfloat16>(BertHead::MLM);
    check_recompute<__nv_bfloat16>(BertHead::Classify);
    check_cuda_graphs(0.f, BertHead::Classify);
    check_cuda_graphs(0.1f, BertHead::Classify);
    check_cuda_graphs(0.1f, BertHead::MLM);
    for (Recompute r : {Recompute::None, Recompute::Gelu, Recompute::LN, Recompute::Layer}) {
        check_memory_anatomy<float>(r);
        check_memory_anatomy<__nv_bfloat16>(r);
    }
    check_checkpoint_variants();
    check_checkpoint_refusals();
    check_export_import();
    check_batch_refusals();
    struct stat info;
    if (stat((kMinilmDir + "/model.safetensors").c_str(), &info) == 0) {
        // A 6-layer model with real weights in fp32: the same per-op roundings as the tiny model above;
        // each post-LN layer renormalizes its output, so the errors of earlier layers are rescaled rather
        // than accumulated: k = 16 roundings of the hidden states' scale, as for the tiny model. bf16:
        // each layer's outputs carry the dozen independent bf16 roundings above, and 6 layers pass them on
        // through their residual paths: twice the tiny model's k = 2.
        check_minilm<float>(16);
        check_minilm<__nv_bfloat16>(4);
    } else {
        printf("SKIP minilm (run dev/data/bert/fetch_minilm.sh)\n");
    }
    matmul_destroy();
    return th::finish();
}

}  // namespace test_bert
TH_MAIN(test_bert)
