// test/test_gpt2.cu — the whole GPT-2 model against Hugging Face transformers' GPT2LMHeadModel (the
// oracle; test/oracle_gpt2.py wrote the fixtures): logits, loss, every parameter's gradient, the
// losses of 10 AdamW steps, in fp32 and bf16; plus gradient accumulation, determinism and the
// micro-step replayed from CUDA graphs against eager launches.
#include "gpt2_trainer.h"
#include "harness.h"

#include <fstream>
#include <sstream>

namespace test_gpt2 {

static const char* kParamNames[NUM_PARAMETER_TENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};
static const char* kFixtures = "test/fixtures/";

// The oracle's batch, logits, loss and gradients (llm.c debug-state format, magic 20240327).
struct DebugState {
    int B, T;
    std::vector<int> x, y;
    std::vector<float> logits;  // (B,T,V)
    float loss;
    std::vector<float> grads;   // all parameters, llm.c order
};

DebugState load_debug_state(const std::string& path, size_t num_params, int V) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) data_error("cannot open %s (run: python3 test/oracle_gpt2.py)", path.c_str());
    int32_t h[256];
    if (fread(h, 4, 256, f) != 256 || h[0] != 20240327 || h[1] != 2) data_error("%s: not a debug state v2", path.c_str());
    DebugState s;
    s.B = h[2];
    s.T = h[3];
    size_t BT = (size_t)s.B * s.T;
    s.x.resize(BT);
    s.y.resize(BT);
    s.logits.resize(BT * V);
    s.grads.resize(num_params);
    bool ok = fread(s.x.data(), 4, BT, f) == BT && fread(s.y.data(), 4, BT, f) == BT &&
              fread(s.logits.data(), 4, BT * V, f) == BT * V && fread(&s.loss, 4, 1, f) == 1 &&
              fread(s.grads.data(), 4, num_params, f) == num_params;
    fclose(f);
    if (!ok) data_error("%s: truncated", path.c_str());
    return s;
}

// The oracle's model and batch: the weights, parameter sizes and debug state, loaded once per test.
struct Fixture {
    GPT2Config config;
    std::vector<float> init;
    size_t sizes[NUM_PARAMETER_TENSORS];
    size_t n;
    DebugState s;
};
Fixture load_fixture() {
    Fixture f;
    f.init = load_checkpoint(std::string(kFixtures) + "gpt2_tiny_model.bin", &f.config);
    f.n = param_sizes(f.config, f.sizes);
    f.s = load_debug_state(std::string(kFixtures) + "gpt2_tiny_debug.bin", f.n, f.config.vocab_size);
    return f;
}

std::vector<float> load_step_losses(const std::string& path) {
    std::ifstream in(path);
    std::vector<float> losses;
    std::string line;
    while (std::getline(in, line))
        if (!line.empty() && line[0] != '#') losses.push_back(std::stof(line));
    if (losses.empty()) data_error("%s: no losses (run: python3 test/oracle_gpt2.py)", path.c_str());
    return losses;
}

// Runs forward (no grad) and compares the logits and loss, then forward+backward and compares every
// gradient tensor, then 10 AdamW steps and compares the losses, for storage type floatX.
// loss_scale multiplies the loss gradient as fp16's dynamic loss scaling does (a power of two, so
// exact), and the gradients are divided by it again for the comparison; the steps use the scaled update.
template <class floatX>
void check_against_oracle(const char* tname, double logit_atol, double loss_atol, double grad_k, double step_atol,
                          float loss_scale = 1.f, bool fp8 = false) {
    Fixture f = load_fixture();
    const GPT2Config& config = f.config;
    const std::vector<float>& init = f.init;
    const size_t* sizes = f.sizes;
    size_t n = f.n;
    const DebugState& s = f.s;
    int V = config.vocab_size, Vp = config.padded_vocab_size;
    size_t BT = (size_t)s.B * s.T;

    GPT2<floatX> model;
    model.fp8 = fp8;
    model.build(config, init);
    model.allocate_activations(s.B, s.T);
    model.set_batch(s.x.data(), s.y.data());
    model.forward(false, 0.f);
    auto logits_p = th::to_host(model.acts.logits, BT * Vp);
    std::vector<float> logits(BT * V);
    for (size_t r = 0; r < BT; r++)
        for (int v = 0; v < V; v++) logits[r * V + v] = to_float(logits_p[r * Vp + v]);
    char name[128];
    snprintf(name, sizeof(name), "gpt2<%s> logits vs transformers", tname);
    th::check_close(name, s.logits.data(), logits.data(), logits.size(), th::Tol{logit_atol, 0});
    float loss = model.mean_loss();
    snprintf(name, sizeof(name), "gpt2<%s> loss vs transformers", tname);
    th::check_close(name, &s.loss, &loss, 1, th::Tol{loss_atol, 0});

    cudaCheck(cudaMemset(model.grads_memory, 0, n * sizeof(floatX)));
    model.forward(true, loss_scale / BT);
    model.backward();
    auto grads_stored = th::to_host(model.grads_memory, n);
    std::vector<double> grads(n);
    for (size_t k = 0; k < n; k++) grads[k] = to_float(grads_stored[k]) / loss_scale;
    size_t offset = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        // A gradient entry is a sum over the B*T tokens of products through the network; both
        // sides round differently. Budget: atol = grad_k * eps * max|g| of the tensor (the
        // tensor's scale), rtol = grad_k * eps.
        double max_ref = 0;
        for (size_t k = 0; k < sizes[i]; k++) max_ref = std::max(max_ref, (double)std::fabs(s.grads[offset + k]));
        double eps = dtype_eps<floatX>();
        snprintf(name, sizeof(name), "gpt2<%s> grad %s vs transformers", tname, kParamNames[i]);
        th::check_close(name, s.grads.data() + offset, grads.data() + offset, sizes[i],
                        th::Tol{grad_k * eps * max_ref, grad_k * eps});
        offset += sizes[i];
    }

    // 10 AdamW steps on the same batch, settings as in the fixture header.
    std::vector<float> expected = load_step_losses(std::string(kFixtures) + "gpt2_tiny_steps.txt");
    GPT2<floatX> fresh;
    fresh.opt.weight_decay = 0.1f;  // the oracle's AdamW: lr 1e-3, betas (0.9, 0.95), eps 1e-8
    fresh.fp8 = fp8;
    fresh.build(config, init);
    fresh.allocate_activations(s.B, s.T);
    fresh.set_batch(s.x.data(), s.y.data());
    std::vector<float> got;
    bool applied = true;  // every scaled update went through (no overflow at this scale)
    for (size_t step = 0; step < expected.size(); step++) {
        cudaCheck(cudaMemset(fresh.grads_memory, 0, n * sizeof(floatX)));
        fresh.forward(true, loss_scale / BT);
        fresh.backward();
        got.push_back(fresh.mean_loss());
        if (loss_scale != 1.f) applied = fresh.update_scaled(1e-3f, 1.f, (int)step + 1, loss_scale) && applied;
        else fresh.update(1e-3f, 1.f, (int)step + 1);
    }
    snprintf(name, sizeof(name), "gpt2<%s> losses of 10 AdamW steps vs torch.optim.AdamW", tname);
    th::check_close(name, expected.data(), got.data(), got.size(), th::Tol{step_atol, 0});
    if (loss_scale != 1.f) {
        snprintf(name, sizeof(name), "gpt2<%s> 10 loss-scaled steps (scale %g): no overflow, all applied", tname,
                 loss_scale);
        th::report(applied, name, "");
    }
    model.free_all();
    fresh.free_all();
}

// k micro-batches of B/k sequences accumulate the same gradient as one batch of B (fp32).
void check_gradient_accumulation() {
    Fixture f = load_fixture();
    const GPT2Config& config = f.config;
    const std::vector<float>& init = f.init;
    size_t n = f.n;
    const DebugState& s = f.s;
    int B = s.B, T = s.T;
    GPT2<float> whole, parts;
    whole.build(config, init);
    whole.allocate_activations(B, T);
    whole.set_batch(s.x.data(), s.y.data());
    cudaCheck(cudaMemset(whole.grads_memory, 0, n * sizeof(float)));
    whole.forward(true, 1.f / (B * T));
    whole.backward();
    auto g_whole = th::to_host(whole.grads_memory, n);

    int k = 2, b = B / k;
    parts.build(config, init);
    parts.allocate_activations(b, T);
    cudaCheck(cudaMemset(parts.grads_memory, 0, n * sizeof(float)));
    for (int i = 0; i < k; i++) {
        parts.set_batch(s.x.data() + (size_t)i * b * T, s.y.data() + (size_t)i * b * T);
        parts.forward(true, 1.f / (B * T));
        parts.backward();
    }
    auto g_parts = th::to_host(parts.grads_memory, n);
    // Same arithmetic except the order of the cross-token sums: a few fp32 roundings per entry
    // relative to the tensor's scale.
    double max_ref = 0;
    for (float g : g_whole) max_ref = std::max(max_ref, (double)std::fabs(g));
    th::check_close("gradient accumulation: 2 micro-batches of 2 == 1 batch of 4 (fp32)", g_whole.data(),
                    g_parts.data(), n, th::Tol{64 * th::EPS_FP32 * max_ref, 64 * th::EPS_FP32});
    whole.free_all();
    parts.free_all();
}

// A training step makes the host wait for the device nowhere (the CPU backend counts every call that
// could; under make test's SIMT_STREAMS=adversarial nothing runs before it is forced): set_batch
// stages each micro-batch in a pinned slot of its own, so the caller may overwrite its buffers at
// once — done here with garbage after every set_batch — and two steps of 2 micro-steps still give
// the same parameters, bit for bit, as the same steps fed from buffers left alone.
void check_no_host_waits_in_a_step() {
    Fixture f = load_fixture();
    const DebugState& s = f.s;
    int k = 2, b = s.B / k, T = s.T;
    auto run = [&](bool scribble, long long* waits) {
        GPT2<float> m;
        m.build(f.config, f.init);
        m.allocate_activations(b, T);
        m.reserve_batch_slots(k);
        float* losses;
        cudaCheck(cudaMallocHost(&losses, (size_t)k * b * T * sizeof(float)));
        std::vector<int> x(s.x), y(s.y);
        *waits = 0;
        for (int step = 0; step < 2; step++) {
            long long before = host_sync_count();
            m.zero_grads();
            for (int i = 0; i < k; i++) {
                m.set_batch(x.data() + (size_t)i * b * T, y.data() + (size_t)i * b * T);
                if (scribble)
                    for (size_t j = 0; j < (size_t)b * T; j++) x[i * b * T + j] = y[i * b * T + j] = -1;
                m.forward(true, 1.f / (k * b * T));
                m.backward();
                m.fetch_losses(losses + (size_t)i * b * T);
            }
            m.update(1e-3f, 1.f, step + 1);
            *waits += host_sync_count() - before;
            cudaCheck(cudaStreamSynchronize(m.stream));
            x = s.x, y = s.y;
        }
        std::vector<float> p = m.params_host();
        cudaCheck(cudaFreeHost(losses));
        m.free_all();
        return p;
    };
    long long waits_plain, waits_scribbled;
    std::vector<float> plain = run(false, &waits_plain), scribbled = run(true, &waits_scribbled);
    th::report(waits_scribbled == 0 && plain == scribbled,
               "a step of 2 micro-steps: no host wait, callers' batch buffers free after set_batch (fp32)",
               "%lld host waits in 2 steps, parameters %s", waits_scribbled,
               plain == scribbled ? "bit-identical" : "differ");
}

// The micro-step replayed as a CUDA graph (GPT2::train_micro_step) against eager launches: three
// steps of 2 micro-steps from the same start give bit-identical losses and parameters, with the
// graphs captured in step 2 and replayed in step 3; the graphed steps make the host wait nowhere
// and, on the CPU backend, the replayed step issues far fewer stream operations.
void check_cuda_graphs() {
    Fixture f = load_fixture();
    const DebugState& s = f.s;
    int k = 2, b = s.B / k, T = s.T;
    struct Run {
        std::vector<float> params, losses;
        long long waits = 0, ops_last = 0;
    };
    auto run = [&](bool graphs) {
        Run r;
        GPT2<float> m;
        cudaCheck(cudaStreamCreate(&m.stream));  // the legacy stream cannot capture
        m.build(f.config, f.init);
        m.allocate_activations(b, T);
        m.reserve_batch_slots(k);
        float* losses;
        cudaCheck(cudaMallocHost(&losses, (size_t)k * b * T * sizeof(float)));
        for (int step = 0; step < 3; step++) {
            long long waits0 = host_sync_count(), ops0 = host_stream_op_count();
            m.zero_grads();
            for (int i = 0; i < k; i++) {
                m.sync_grads = i == k - 1;
                m.set_batch(s.x.data() + (size_t)i * b * T, s.y.data() + (size_t)i * b * T);
                m.train_micro_step(1.f / (k * b * T), graphs && step > 0);  // the first step eager
                m.fetch_losses(losses + (size_t)i * b * T);
            }
            m.update(1e-3f, 1.f, step + 1);
            if (step > 0) r.waits += host_sync_count() - waits0;
            r.ops_last = host_stream_op_count() - ops0;
            cudaCheck(cudaStreamSynchronize(m.stream));
            r.losses.insert(r.losses.end(), losses, losses + (size_t)k * b * T);
        }
        r.params = m.params_host();
        cudaCheck(cudaFreeHost(losses));
        m.free_all();
        cudaCheck(cudaStreamDestroy(m.stream));
        return r;
    };
    Run eager = run(false), graphed = run(true);
    bool same = eager.params == graphed.params && eager.losses == graphed.losses;
    bool fewer = !on_cpu_backend() || graphed.ops_last * 4 < eager.ops_last;
    th::report(same && graphed.waits == 0 && fewer,
               "CUDA graphs: 3 steps of 2 micro-steps replayed == eager, bit for bit; no host wait (fp32)",
               "losses and parameters %s; %lld host waits in the graphed steps; step 3 issued %lld stream "
               "operations (eager %lld)", same ? "bit-identical" : "differ", graphed.waits, graphed.ops_last,
               eager.ops_last);
}

// Two runs from the same initialization and data give bit-identical losses.
void check_determinism() {
    Fixture f = load_fixture();
    const GPT2Config& config = f.config;
    const std::vector<float>& init = f.init;
    size_t n = f.n;
    const DebugState& s = f.s;
    auto run = [&] {
        GPT2<__nv_bfloat16> m;
        m.opt.weight_decay = 0.1f;
        m.build(config, init);
        m.allocate_activations(s.B, s.T);
        m.set_batch(s.x.data(), s.y.data());
        std::vector<float> losses;
        for (int step = 0; step < 3; step++) {
            cudaCheck(cudaMemset(m.grads_memory, 0, n * sizeof(__nv_bfloat16)));
            m.forward(true, 1.f / (s.B * s.T));
            m.backward();
            losses.push_back(m.mean_loss());
            m.update(1e-3f, 1.f, step + 1);
        }
        m.free_all();
        return losses;
    };
    auto a = run(), b = run();
    th::check_bitwise("determinism: two bf16 runs give bit-identical losses", a.data(), b.data(), a.size() * 4);
}

// Each recomputation level gives the same gradients as storing everything, bit for bit (the same
// kernels recompute the same values), with fewer activation bytes. Recomputation computes the GELU
// with llmc/gelu.cuh's kernel, so the reference stores everything with that GELU too; cuBLASLt's
// fused GELU epilogue is checked against it separately.
template <class floatX>
void check_recompute(const char* tname, double fusion_k) {
    Fixture f = load_fixture();
    const DebugState& s = f.s;
    auto grads_with = [&](Recompute r, size_t* bytes, bool fusion = false) {
        GPT2<floatX> m;
        m.recompute = r;
        m.gelu_fusion = fusion;
        m.build(f.config, f.init);
        m.allocate_activations(s.B, s.T);
        m.set_batch(s.x.data(), s.y.data());
        cudaCheck(cudaMemset(m.grads_memory, 0, f.n * sizeof(floatX)));
        m.forward(true, 1.f / (s.B * s.T));
        m.backward();
        auto g = th::to_host(m.grads_memory, f.n);
        auto losses = th::to_host(m.acts.losses, (size_t)s.B * s.T);
        *bytes = m.acts_bytes;
        m.free_all();
        std::vector<float> out(losses.begin(), losses.end());
        for (auto x : g) out.push_back(to_float(x));
        return out;
    };
    size_t base_bytes, bytes;
    std::vector<float> base = grads_with(Recompute::None, &base_bytes);
    size_t previous = base_bytes;
    for (Recompute r : {Recompute::Gelu, Recompute::LN, Recompute::Layer}) {
        std::vector<float> got = grads_with(r, &bytes);
        char name[128];
        snprintf(name, sizeof(name), "recompute %s <%s>: losses and gradients bit-identical to none", recompute_name(r),
                 tname);
        bool same = got.size() == base.size() && memcmp(got.data(), base.data(), got.size() * 4) == 0;
        th::report(same && bytes < previous, name, "activations %.2f MiB (none: %.2f MiB)", bytes / 1048576.0,
                   base_bytes / 1048576.0);
        previous = bytes;
    }
    // The fused epilogue's GELU and the kernel's may round differently (by an ulp of the storage
    // type) and those differences propagate: k roundings of each value's scale (losses, then each
    // gradient's), as in the oracle comparison.
    std::vector<float> fused = grads_with(Recompute::None, &bytes, true);
    double max_ref = 0;
    for (float x : base) max_ref = std::max(max_ref, (double)std::fabs(x));
    char name[128];
    snprintf(name, sizeof(name), "gelu fusion <%s>: cuBLASLt's GELU epilogue vs the GELU kernel", tname);
    th::check_close(name, base.data(), fused.data(), base.size(),
                    th::Tol{fusion_k * dtype_eps<floatX>() * max_ref, fusion_k * dtype_eps<floatX>()});
}

// --gelu-fusion decides every GELU of a step, the backward's too: with it off no GEMM may use a
// GELU epilogue (the forward's GELU is then the kernel, so a fused dGELU in the backward would
// differentiate a GELU the forward never computed); with it on, the forward fuses GELU and the
// backward dGELU. The GEMMs a step ran are the keys of matmul.cuh's plan cache.
void check_gelu_fusion_routes() {
    Fixture f = load_fixture();
    const DebugState& s = f.s;
    for (bool fusion : {true, false}) {
        GPT2<float> m;
        m.gelu_fusion = fusion;
        m.build(f.config, f.init);
        m.allocate_activations(s.B, s.T);
        m.set_batch(s.x.data(), s.y.data());
        matmul_forget_plans();
        m.forward(true, 1.f / (s.B * s.T));
        m.backward();
        cudaCheck(cudaDeviceSynchronize());
        int gelu = 0, dgelu = 0;
        for (const auto& entry : matmul_context().plans) {
            int epilogue = std::get<5>(std::get<0>(entry.first));
            gelu += epilogue == CUBLASLT_EPILOGUE_GELU_BIAS || epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
                    epilogue == CUBLASLT_EPILOGUE_GELU || epilogue == CUBLASLT_EPILOGUE_GELU_AUX;
            dgelu += epilogue == CUBLASLT_EPILOGUE_DGELU || epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
        }
        m.free_all();
        char name[128];
        snprintf(name, sizeof(name), "gelu fusion %s: %s", fusion ? "on" : "off",
                 fusion ? "forward GEMM fuses GELU, backward fuses dGELU" : "no GEMM of the step uses a GELU epilogue");
        th::report(fusion ? gelu > 0 && dgelu > 0 : gelu == 0 && dgelu == 0, name,
                   "GEMM shapes with a GELU epilogue: %d, with dGELU: %d", gelu, dgelu);
    }
}

// The memory anatomy's figures are what is allocated: the device's bytes in use grow by its total
// when a model is built and its activations allocated (exactly on the CPU backend, to within a page
// per allocation on a GPU: th::device_bytes_match), and not at all during a step.
template <class floatX>
void check_memory_anatomy(const char* tname, Recompute r) {
    Fixture f = load_fixture();
    const DebugState& s = f.s;
    auto used = [] {
        size_t free_b, total_b;
        cudaCheck(cudaMemGetInfo(&free_b, &total_b));
        return total_b - free_b;
    };
    size_t before = used(), allocations = g_device_allocations;
    GPT2<floatX> m;
    m.recompute = r;
    m.build(f.config, f.init);
    m.allocate_activations(s.B, s.T);
    size_t allocated = used() - before;
    allocations = g_device_allocations - allocations;
    m.set_batch(s.x.data(), s.y.data());
    cudaCheck(cudaMemset(m.grads_memory, 0, f.n * sizeof(floatX)));
    m.forward(true, 1.f / (s.B * s.T));
    m.backward();
    m.update(1e-3f, 1.f, 1);
    cudaCheck(cudaDeviceSynchronize());
    size_t after_step = used() - before;
    const MemoryAnatomy& a = m.mem;
    size_t n = f.n, per = sizeof(floatX);
    bool parts = a.weights == n * per && a.grads == n * per && a.master == (per == 4 ? 0 : n * 4) &&
                 a.optimizer == n * 8 && a.activations == m.acts_bytes;
    char name[128];
    snprintf(name, sizeof(name), "memory anatomy <%s, recompute %s> = bytes allocated", tname, recompute_name(r));
    th::report(parts && th::device_bytes_match(allocated, a.total(), allocations) && after_step == allocated, name,
               "anatomy %zu B, allocated %zu B in %zu cudaMallocs, after a step %zu B", a.total(), allocated,
               allocations, after_step);
    m.free_all();
}

// 8-bit AdamW follows fp32 AdamW: 10 steps on the oracle's batch, the same settings. Both moments
// are stored to within half a gap of the dynamic map around value/absmax of their block (at most
// 0.9/128 of the absmax for the first moment), so each update m/sqrt(v) is off by a few percent at
// most, and mostly far less; the losses' decrease over the 10 steps may then differ by as much.
// Bound: |loss8 - loss32| <= 5% of the fp32 run's decrease so far, at every step.
void check_adamw8bit_trajectory() {
    Fixture f = load_fixture();
    const DebugState& s = f.s;
    auto run = [&](OptimizerKind kind) {
        GPT2<float> m;
        m.opt.kind = kind;
        m.opt.weight_decay = 0.1f;
        m.build(f.config, f.init);
        m.allocate_activations(s.B, s.T);
        m.set_batch(s.x.data(), s.y.data());
        std::vector<float> losses;
        for (int step = 0; step < 10; step++) {
            cudaCheck(cudaMemset(m.grads_memory, 0, f.n * sizeof(float)));
            m.forward(true, 1.f / (s.B * s.T));
            m.backward();
            losses.push_back(m.mean_loss());
            m.update(1e-3f, 1.f, step + 1);
        }
        m.free_all();
        return losses;
    };
    std::vector<float> l32 = run(OptimizerKind::AdamW), l8 = run(OptimizerKind::AdamW8bit);
    double worst = 0;  // the largest share of the bound used
    bool ok = l8[0] == l32[0];
    for (size_t k = 1; k < l32.size(); k++)
        worst = std::max(worst, std::fabs(l8[k] - l32[k]) / (0.05 * (l32[0] - l32[k])));
    th::report(ok && worst <= 1.0, "AdamW 8-bit: 10-step losses within 5% of fp32 AdamW's decrease",
               "final %.6f vs %.6f (decrease %.4f), %.2g%% of the bound at worst", l8.back(), l32.back(),
               l32[0] - l32.back(), 100 * worst);
}

// fp16 overflow: with a huge planted loss scale the gradients overflow to inf; the scaled update
// must then skip the step, leaving the fp16 weights, the fp32 master weights and the optimizer
// state bit-identical to before (after a normal step, so that the state is not all zeros).
void check_fp16_overflow_skips() {
    Fixture f = load_fixture();
    const DebugState& s = f.s;
    GPT2<__half> m;
    m.build(f.config, f.init);
    m.allocate_activations(s.B, s.T);
    m.set_batch(s.x.data(), s.y.data());
    auto step = [&](float scale, int t) {
        cudaCheck(cudaMemset(m.grads_memory, 0, f.n * sizeof(__half)));
        m.forward(true, scale / (s.B * s.T));
        m.backward();
        return m.update_scaled(1e-3f, 1.f, t, scale);
    };
    bool first = step(65536.f, 1);
    cudaCheck(cudaDeviceSynchronize());
    auto params = th::to_host(m.params_memory, f.n);
    auto master = th::to_host(m.master, f.n);
    std::vector<uint8_t> state((size_t)m.opt_state_bytes);
    cudaCheck(cudaMemcpy(state.data(), m.opt_state, state.size(), cudaMemcpyDeviceToHost));
    bool second = step(1099511627776.f, 2);  // 2^40: the target logits' gradients exceed fp16's range
    cudaCheck(cudaDeviceSynchronize());
    auto params2 = th::to_host(m.params_memory, f.n);
    auto master2 = th::to_host(m.master, f.n);
    std::vector<uint8_t> state2(state.size());
    cudaCheck(cudaMemcpy(state2.data(), m.opt_state, state2.size(), cudaMemcpyDeviceToHost));
    bool same = memcmp(params.data(), params2.data(), f.n * sizeof(__half)) == 0 &&
                memcmp(master.data(), master2.data(), f.n * sizeof(float)) == 0 && state == state2;
    th::report(first && !second && same, "fp16 overflow (loss scale 2^40): step skipped, weights and AdamW state untouched",
               "normal step applied %d, overflowing step applied %d, state bit-identical %d", first, second, same);
    m.free_all();
}

#if defined(SIMT_CPU)
// --batch-size auto on a virtual device of limited memory: the largest multiple of 8 whose
// activations fit in 90% of what the model leaves free, and which divides the tokens per step.
void check_auto_batch() {
    Fixture f = load_fixture();
    GPT2<float> m;
    m.build(f.config, f.init);
    size_t saved = simt::get_device_memory(), free_b, total_b;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    size_t used = total_b - free_b;
    int T = f.s.T;
    size_t per_8 = m.activation_bytes(8, T);
    simt::set_device_memory(used + (size_t)(5.5 * per_8 / 0.9));  // room for about 5 x 8 sequences
    int B = auto_batch_size(m, T, 64LL * T * 3);                  // 192 sequences per step
    size_t budget = (size_t)(0.9 * (simt::get_device_memory() - used));
    bool ok = B % 8 == 0 && (64 * 3) % B == 0 && m.activation_bytes(B, T) <= budget;
    for (int b = B + 8; b <= 192; b += 8)  // no larger candidate both divides and fits
        ok = ok && !(192 % b == 0 && m.activation_bytes(b, T) <= budget);
    th::report(ok, "batch size auto: largest multiple of 8 that fits and divides the step",
               "B=%d of 192 sequences per step, activations %.2f MiB of a %.2f MiB budget", B,
               m.activation_bytes(B, T) / 1048576.0, budget / 1048576.0);
    simt::set_device_memory(saved);
    m.free_all();
}

// What allocate_activations takes from the device is what activation_bytes says, by which --batch-size
// auto sizes the batch: with fp8's operand copies too (--precision fp8).
void check_activation_bytes_fp8() {
    Fixture f = load_fixture();
    GPT2<__nv_bfloat16> m;
    m.fp8 = true;
    m.build(f.config, f.init);
    size_t free0, free1, total;
    cudaCheck(cudaMemGetInfo(&free0, &total));
    m.allocate_activations(8, f.s.T);
    cudaCheck(cudaMemGetInfo(&free1, &total));
    size_t taken = free0 - free1, said = m.activation_bytes(8, f.s.T), fp8 = m.fp8_scratch_bytes(8, f.s.T);
    th::report(taken == said && fp8 > 0,
               "fp8: activation_bytes (batch size auto's measure) is what the activations take",
               "B=8: %zu bytes allocated, %zu said (fp8 operand copies %zu)", taken, said, fp8);
    m.free_all();
}
#endif

int main(int argc, char** argv) {
    matmul_init();
    // fp32: the issue's bounds — logits within 1e-4, loss within 1e-5 of transformers. Gradients:
    // both sides sum the same products in different orders; k = 16 fp32 roundings of the tensor's
    // scale. 10 AdamW steps: differences of a few ulp in the gradients, carried through the steps,
    // keep the losses within 1e-5.
    check_against_oracle<float>("fp32", 1e-4, 1e-5, 16, 1e-5);
    // bf16: parameters and every activation are rounded to bf16 (eps 2^-7): each rounding adds at
    // most eps/2 relative error, and a few of them (embedding, layernorm outputs, attention and MLP
    // outputs, residual stream) stand between the tokens and the logits, which are of size ~1:
    // logits within 2*eps; the loss, a mean over 256 tokens, within eps/2; each gradient within
    // k = 2 bf16 roundings of its tensor's scale; the 10-step losses within eps/2.
    check_against_oracle<__nv_bfloat16>("bf16", 2 * th::EPS_BF16, 0.5 * th::EPS_BF16, 2, 0.5 * th::EPS_BF16);
    // fp16: the same derivation with eps 2^-10, gradients computed under a loss scale of 2^16 (as
    // training does: unscaled, fp16 would flush most of them to zero) and divided by it again.
    check_against_oracle<__half>("fp16", 2 * th::EPS_FP16, 0.5 * th::EPS_FP16, 2, 0.5 * th::EPS_FP16, 65536.f);
    // fp8: bf16 with the blocks' GEMM inputs rounded to E4M3 (eps 2^-3 relative, 3 mantissa bits)
    // and the gradients entering the backward GEMMs to E5M2 (eps 2^-2). The bf16 derivation with
    // those eps: logits within 2 * 2^-3, the loss (a mean over 256 tokens) within 2^-3 / 2,
    // gradients within 2 E5M2 roundings of each tensor's scale, the 10-step losses within 2^-3 / 2.
    const double e4m3 = 1.0 / 8, e5m2 = 1.0 / 4;
    check_against_oracle<__nv_bfloat16>("bf16+fp8", 2 * e4m3, 0.5 * e4m3, 2 * e5m2 / th::EPS_BF16, 0.5 * e4m3, 1.f,
                                        true);
    check_gradient_accumulation();
    check_no_host_waits_in_a_step();
    check_cuda_graphs();
    check_determinism();
    check_memory_anatomy<float>("fp32", Recompute::None);
    check_memory_anatomy<__nv_bfloat16>("bf16", Recompute::Layer);
    check_adamw8bit_trajectory();
#if defined(SIMT_CPU)
    check_auto_batch();
    check_activation_bytes_fp8();
#endif
    check_fp16_overflow_skips();
    check_recompute<float>("fp32", 16);
    check_recompute<__nv_bfloat16>("bf16", 2);
    check_gelu_fusion_routes();
    matmul_destroy();
    return th::finish();
}

}  // namespace test_gpt2
TH_MAIN(test_gpt2)
