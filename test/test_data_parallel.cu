// test/test_data_parallel.cu — data-parallel GPT-2 training through llmc/model_state.cuh, under
// mpirun with 2 and 3 ranks (scripts/run_tests.sh): for ZeRO-0, 1 and 2, a W-rank run (each rank
// B rows of every global batch, 2 micro-steps per step) follows a single-process run of the same
// model on the whole global batch, built in the same process: the reduced gradients, the losses and
// the parameters after the steps agree within fp32 (bf16) rounding (ZeRO-2 also with 5 layers, which
// reuse its two layers' gradient slices); ZeRO-1/2 keep 1/W of the
// optimizer state (ZeRO-2 also less gradient memory); and optimizer state saved by W-1 ranks is
// re-sharded onto W ranks element for element.
#include "gpt2_trainer.h"
#include "harness.h"
#include "harness_mpi.h"

#include <chrono>

namespace test_data_parallel {

static Distributed g_d;
static const char* kModel = "test/fixtures/gpt2_tiny_model.bin";

// The tokens of step k, micro-step m: Bg rows of T+1 (inputs, and targets shifted by one), the
// same on every rank; rank r's rows are [r*B, (r+1)*B).
struct GlobalBatch {
    std::vector<int> x, y;
};
static GlobalBatch global_batch(int k, int m, int Bg, int T, int V) {
    std::mt19937 rng(1000 * k + m);
    GlobalBatch g;
    for (int b = 0; b < Bg; b++) {
        std::vector<int> row(T + 1);
        for (int& t : row) t = (int)(rng() % V);
        g.x.insert(g.x.end(), row.begin(), row.end() - 1);
        g.y.insert(g.y.end(), row.begin() + 1, row.end());
    }
    return g;
}

// Largest |a - b| and largest |b|.
template <class T>
static void diff_stats(const std::vector<T>& a, const std::vector<T>& b, double* max_diff, double* max_ref) {
    *max_diff = *max_ref = 0;
    for (size_t i = 0; i < a.size(); i++) {
        *max_diff = std::max(*max_diff, std::fabs(th::to_double(a[i]) - th::to_double(b[i])));
        *max_ref = std::max(*max_ref, std::fabs(th::to_double(b[i])));
    }
}

// The reduced gradients this rank holds after a step's backward, at their flat positions (-1: not held).
template <class floatX>
static std::vector<std::pair<size_t, floatX>> held_gradients(const GPT2<floatX>& m) {
    cudaCheck(cudaDeviceSynchronize());
    std::vector<std::pair<size_t, floatX>> out;
    if (!m.sharded()) {
        std::vector<floatX> g = th::to_host(m.grads_memory, m.num_parameters);
        for (size_t i = 0; i < g.size(); i++) out.push_back({i, g[i]});
        return out;
    }
    std::vector<floatX> s = th::to_host(m.shard_grads, m.plan.shard_size);
    for (const ZeroShardPiece& p : zero_shard_pieces(m.plan, m.rank()))
        for (size_t i = 0; i < p.range.size(); i++) out.push_back({p.flat_offset + i, s[p.shard_offset + i]});
    return out;
}

// W ranks with ZeRO stage `zero` vs one process on the global batch: K steps of 2 micro-steps.
// The runs do the same arithmetic except where the sums over tokens are split (per rank, then the
// mean over ranks: one more rounding), so the reduced gradients agree within grad_k eps of the
// tensor's scale (as test_gpt2's accumulation check). Parameters, per optimizer:
//   SGD (momentum 0.9): a parameter moves by lr times a momentum sum of gradients, so after K steps
//     the runs differ by at most lr * sum_k sum_{j<=k} 0.9^(k-j) * (gradient budget) — doubled, as the
//     later steps' gradients are taken at parameters that already differ by that little;
//   AdamW: each step moves a parameter by lr * m/(sqrt(v)+eps) — normalized, so a gradient that is
//     itself at rounding level (cancellation) can move differently in the two runs by up to ~lr;
//     the check is then that no parameter differs by more than 1% of the K*lr the steps can move it.
//   Every parameter is compared on every rank, so the gradient scale is the largest |g| of all ranks'
//   gradients (with ZeRO-2 a rank holds only its shard's). Each step stores the parameter rounded,
//   and two updates that differ by less than that bound can still round to neighbouring values: in
//   fp32 one ulp of |p| more per step; in bf16 the parameters are the fp32 master weights rounded
//   once: one bf16 ulp of |p| more.
// layers > 0: a random model of that many layers instead of the 2-layer fixture (ZeRO-2 reuses its
// two gradient slices from the third layer down; the backward pass writes a layer's gradients from
// the layer above it too, see train_gpt2.cu's backward()).
template <class floatX>
static void check_stage(int zero, OptimizerKind kind, const char* tname, double grad_k, double loss_atol,
                        int layers = 0) {
    GPT2Config config;
    std::vector<float> init;
    if (layers > 0) {
        config.num_layers = layers, config.channels = 64, config.num_heads = 4, config.vocab_size = 500,
        config.padded_vocab_size = pad_vocab(500), config.max_seq_len = 64;
        init = random_init(config, 5);
    } else {
        init = load_checkpoint(kModel, &config);
    }
    const int W = g_d.world, B = 2, T = 32, accum = 2, K = 3;
    const float lr = kind == OptimizerKind::SGD ? 1e-2f : 1e-3f;
    GPT2<floatX> ref, dp;
    ref.opt.kind = dp.opt.kind = kind;
    ref.opt.weight_decay = dp.opt.weight_decay = 0.1f;
    ref.build(config, init);
    ref.allocate_activations(W * B, T);
    dp.dist = &g_d;
    dp.zero = zero;
    dp.build(config, init);
    dp.allocate_activations(B, T);
    double worst_loss = 0, grad_diff = 0, grad_ref = 0;
    for (int k = 0; k < K; k++) {
        double ref_loss = 0, dp_loss = 0;
        ref.zero_grads();
        dp.zero_grads();
        for (int m = 0; m < accum; m++) {
            GlobalBatch g = global_batch(k, m, W * B, T, config.vocab_size);
            ref.set_batch(g.x.data(), g.y.data());
            ref.forward(true, 1.f / (W * B * T * accum));
            ref.backward();
            ref_loss += ref.mean_loss() / accum;
            size_t mine = (size_t)g_d.rank * B * T;
            dp.sync_grads = m == accum - 1;
            dp.set_batch(g.x.data() + mine, g.y.data() + mine);
            dp.forward(true, 1.f / (B * T * accum));
            dp.backward();
            dp_loss += dp.mean_loss() / accum;
        }
        if (k == 0) {  // the reduced gradients of the first step, before any update
            std::vector<floatX> want = th::to_host(ref.grads_memory, ref.num_parameters);
            for (auto& [i, v] : held_gradients(dp)) {
                grad_diff = std::max(grad_diff, std::fabs(th::to_double(v) - th::to_double(want[i])));
                grad_ref = std::max(grad_ref, std::fabs(th::to_double(want[i])));
            }
        }
        worst_loss = std::max(worst_loss, std::fabs(all_reduce_mean_scalar(g_d, dp_loss) - ref_loss));
        ref.update(lr, 0.f, k + 1);
        dp.update(lr, 0.f, k + 1);
    }
    MPI_Allreduce(MPI_IN_PLACE, &grad_ref, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    bool fp32 = std::is_same<floatX, float>::value;
    double eps = fp32 ? th::EPS_FP32 : th::EPS_BF16, grad_budget = grad_k * eps * grad_ref;
    const char* oname = optimizer_name(kind);
    char name[160];
    snprintf(name, sizeof(name), "zero %d <%s>: reduced gradients of step 1 == one process on the global batch", zero,
             tname);
    th::report_all(g_d, name, grad_diff <= grad_budget, "max diff %.3g, budget %.3g (%g eps x max |g| %.3g)",
                   grad_diff, grad_budget, grad_k, grad_ref);
    snprintf(name, sizeof(name), "zero %d <%s>: losses of %d %s steps (%d ranks x B=%d, 2 micro-steps) == one process",
             zero, tname, K, oname, W, B);
    th::report_all(g_d, name, worst_loss <= loss_atol, "max diff %.3g, atol %.3g", worst_loss, loss_atol);
    double moves = 0;  // sum over steps of the momentum sums
    for (int k = 0; k < K; k++)
        for (int j = 0; j <= k; j++) moves += std::pow(0.9, k - j);
    double p_atol = kind == OptimizerKind::SGD ? 2 * lr * moves * grad_budget : 0.01 * K * lr;
    std::vector<floatX> p_dp = dp.params_host(), p_ref = ref.params_host();
    size_t bad = 0;
    double p_diff = 0;
    for (size_t i = 0; i < p_dp.size(); i++) {
        double r = th::to_double(p_ref[i]), d = std::fabs(th::to_double(p_dp[i]) - r);
        // K fp32 ulps of |p|, or one bf16 ulp
        double ulp = fp32 ? K * std::ldexp(1.0, std::ilogb(std::max(std::fabs(r), 1e-30)) - 23)
                          : std::ldexp(1.0, std::ilogb(std::max(std::fabs(r), 1e-30)) - 7);
        p_diff = std::max(p_diff, d);
        bad += d > p_atol + ulp;
    }
    snprintf(name, sizeof(name), "zero %d <%s>: parameters after %d %s steps == one process", zero, tname, K, oname);
    th::report_all(g_d, name, bad == 0, "max diff %.3g, atol %.3g%s, %zu over", p_diff, p_atol,
                   fp32 ? " + 1 fp32 ulp of |p| per step" : " + 1 bf16 ulp of |p|", bad);
    if (zero >= 1 && kind == OptimizerKind::AdamW && fp32) {
        // Optimizer state: 2 fp32 moments per shard element; the shard is at most ceil(N/W) + padding.
        size_t S = dp.plan.shard_size, bound = zero_shard_size_bound(dp.plan);
        size_t padding = bound - (ref.num_parameters + W - 1) / W;
        bool ok = dp.mem.optimizer == 2 * S * sizeof(float) && S <= bound &&
                  dp.mem.optimizer <= ref.mem.optimizer / W + 2 * sizeof(float) * padding;
        snprintf(name, sizeof(name), "zero %d <%s>: optimizer state 1/%d of one process's (+ padding)", zero, tname, W);
        th::report_all(g_d, name, ok, "%zu bytes vs %zu on one process (S %zu, N %zu)", dp.mem.optimizer,
                       ref.mem.optimizer, S, ref.num_parameters);
    }
    ref.free_all();
    dp.free_all();
}

// Memory anatomy of a 12-layer model (built, not trained): ZeRO-1 keeps 1/W of the master weights
// and optimizer state plus padding, ZeRO-2 also replaces the full gradient buffer by two layers'
// slices and the shard.
static void check_memory() {
    GPT2Config c;
    c.num_layers = 12, c.channels = 64, c.num_heads = 4, c.vocab_size = 500, c.padded_vocab_size = pad_vocab(500),
    c.max_seq_len = 64;
    std::vector<float> init = random_init(c, 1);
    GPT2<__nv_bfloat16> one, z1, z2;
    one.build(c, init);
    z1.dist = z2.dist = &g_d;
    z1.zero = 1;
    z2.zero = 2;
    z1.build(c, init);
    z2.build(c, init);
    size_t N = one.num_parameters, S = z1.plan.shard_size, bf = sizeof(__nv_bfloat16);
    size_t layer = 0, other = 0;  // gradient elements of one layer's slices, of the rest
    for (const ParamSpec& s : z1.specs) (s.ready == GradReady::PerLayer ? layer : other) += s.numel() / s.copies;
    bool ok1 = z1.mem.master == S * 4 && z1.mem.optimizer == 2 * S * 4 && S <= zero_shard_size_bound(z1.plan) &&
               z1.mem.grads == (N + S) * bf;
    th::report_all(g_d, "zero 1 memory anatomy (12 layers, bf16): master and AdamW state of the shard", ok1,
                   "master %zu + AdamW %zu bytes (one process: %zu + %zu), shard %zu of %zu", z1.mem.master,
                   z1.mem.optimizer, one.mem.master, one.mem.optimizer, S, N);
    bool ok2 = z2.mem.grads == (other + 2 * layer + S) * bf && z2.mem.grads < one.mem.grads &&
               z2.mem.optimizer == z1.mem.optimizer;
    th::report_all(g_d, "zero 2 memory anatomy (12 layers, bf16): gradients = rest + 2 layers' slices + the shard", ok2,
                   "%zu bytes (one process: %zu, ZeRO-1: %zu)", z2.mem.grads, one.mem.grads, z1.mem.grads);
    one.free_all();
    z1.free_all();
    z2.free_all();
}

// Optimizer state saved by W-1 ranks (ZeRO-1) is re-sharded onto W ranks: every element of each new
// shard's master weights and AdamW moments is the one the old rank holding it saved, bit for bit,
// and the re-sharded model then steps on. The old shards are cut (by llmc/zero.h's pieces) from the
// state of a single-process run, which every rank makes for itself: what W-1 ranks would have
// saved, without a W-1-rank communicator inside this job (the trainer's test resumes a real 2-rank
// run on 3 ranks).
template <class floatX>
static void check_reshard(const char* tname) {
    GPT2Config config;
    std::vector<float> init = load_checkpoint(kModel, &config);
    const int W = g_d.world, W1 = W - 1, B = 2, T = 32;
    GPT2<floatX> old;
    old.build(config, init);
    old.allocate_activations(W1 * B, T);
    for (int k = 0; k < 2; k++) {
        old.zero_grads();
        GlobalBatch g = global_batch(k, 0, W1 * B, T, config.vocab_size);
        old.set_batch(g.x.data(), g.y.data());
        old.forward(true, 1.f / (W1 * B * T));
        old.backward();
        old.update(1e-3f, 1.f, k + 1);
    }
    TrainState flat;
    old.optimizer_state_host(&flat);
    std::vector<float> trained = old.params_host_fp32();
    size_t N = old.num_parameters;
    const float* flat_state = (const float*)flat.optimizer_state.data();  // m (N), v (N)
    ZeroPlan old_plan;
    old.make_plan(W1, &old_plan);
    old.free_all();
    size_t S1 = old_plan.shard_size;
    std::vector<TrainState> saved(W1);
    for (int q = 0; q < W1; q++) {  // rank q's file of a W1-rank run
        TrainState& st = saved[q];
        st.world = W1, st.rank = q, st.shard_align = (int)old_plan.align, st.optimizer = flat.optimizer;
        st.has_master = flat.has_master, st.num_params = S1;
        st.optimizer_state.assign(2 * S1 * sizeof(float), 0);
        st.master.assign(flat.has_master ? S1 : 0, 0.f);
        float* m = (float*)st.optimizer_state.data();
        for (const ZeroShardPiece& p : zero_shard_pieces(old_plan, q))
            for (size_t i = 0; i < p.range.size(); i++) {
                m[p.shard_offset + i] = flat_state[p.flat_offset + i];
                m[S1 + p.shard_offset + i] = flat_state[N + p.flat_offset + i];
                if (flat.has_master) st.master[p.shard_offset + i] = flat.master[p.flat_offset + i];
            }
    }
    GPT2<floatX> now;
    now.dist = &g_d;
    now.zero = 1;
    now.build(config, trained);
    now.allocate_activations(B, T);
    now.set_optimizer_state_resharded(saved);
    size_t S = now.plan.shard_size;
    std::vector<float> state = th::to_host((const float*)now.opt_state, 2 * S);
    std::vector<float> master = now.master ? th::to_host(now.master, S) : std::vector<float>();
    size_t bad = 0, checked = 0;
    for (const ZeroShardPiece& p : zero_shard_pieces(now.plan, g_d.rank))
        for (size_t i = 0; i < p.range.size(); i++, checked++) {
            size_t f = p.flat_offset + i, s = p.shard_offset + i;
            bad += memcmp(&state[s], &flat_state[f], 4) != 0 || memcmp(&state[S + s], &flat_state[N + f], 4) != 0 ||
                   (now.master && memcmp(&master[s], &flat.master[f], 4) != 0);
        }
    char name[160];
    snprintf(name, sizeof(name), "re-shard <%s>: ZeRO-1 state of %d rank%s -> %d ranks, element for element", tname,
             W1, W1 > 1 ? "s" : "", W);
    th::report_all(g_d, name, bad == 0 && checked > 0, "%zu of %zu elements differ", bad, checked);
    // and training goes on from it
    now.zero_grads();
    GlobalBatch g = global_batch(2, 0, W * B, T, config.vocab_size);
    size_t mine = (size_t)g_d.rank * B * T;
    now.set_batch(g.x.data() + mine, g.y.data() + mine);
    now.forward(true, 1.f / (B * T));
    now.backward();
    now.update(1e-3f, 1.f, 3);
    cudaCheck(cudaDeviceSynchronize());
    float norm = now.last_grad_norm();
    snprintf(name, sizeof(name), "re-shard <%s>: the re-sharded run takes its next step", tname);
    th::report_all(g_d, name, std::isfinite(norm) && norm > 0, "grad norm %.4g", norm);
    now.free_all();
}

int main(int argc, char** argv) {
    auto t0 = std::chrono::steady_clock::now();
    g_d = distributed_init(&argc, &argv);
    if (!g_d.mpi || g_d.world < 2) {
        printf("test_data_parallel: run under mpirun with 2 or more ranks (scripts/run_tests.sh: -np 2 and -np 3)\n");
        distributed_finalize(g_d);
        return 1;
    }
    if (g_d.rank == 0) printf("test_data_parallel: %d ranks\n", g_d.world);
    matmul_init(false);
    for (int zero = 0; zero <= 2; zero++) {
        check_stage<float>(zero, OptimizerKind::SGD, "fp32", 64, 1e-5);
        check_stage<float>(zero, OptimizerKind::AdamW, "fp32", 64, 1e-5);
    }
    // bf16: gradients rounded to bf16 on each rank, then their mean rounded again: 2 roundings of
    // the tensor's scale more than one process; losses from bf16 activations, relative 2^-8. SGD,
    // whose parameter differences follow from the gradients' (AdamW's normalized steps turn bf16
    // gradient noise around zero into differences up to lr, a bound that would test nothing).
    check_stage<__nv_bfloat16>(1, OptimizerKind::SGD, "bf16", 8, 0.05);
    check_stage<__nv_bfloat16>(2, OptimizerKind::SGD, "bf16", 8, 0.05);
    check_stage<float>(2, OptimizerKind::SGD, "fp32, 5 layers", 64, 1e-5, 5);
    check_stage<__nv_bfloat16>(2, OptimizerKind::SGD, "bf16, 5 layers", 8, 0.05, 5);
    check_memory();
    check_reshard<float>("fp32");
    check_reshard<__nv_bfloat16>("bf16");
    matmul_destroy();
    int failed = th::n_failed();
    MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
    int rank = g_d.rank;
    distributed_finalize(g_d);
    if (rank != 0) return failed ? 1 : 0;
    printf("test_data_parallel: %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return th::finish();
}

}  // namespace test_data_parallel
TH_MAIN(test_data_parallel)
