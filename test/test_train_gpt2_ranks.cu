// test/test_train_gpt2_ranks.cu — the train_gpt2 program data parallel, run as a user runs it: this
// binary contains it (train_gpt2.cu included with TESTING) and starts itself as `mpirun -np N
// test_train_gpt2_ranks --train-gpt2 ARGS...` (or without mpirun for one process) with a small random
// model on a token shard of vocabulary 64 (th::write_token_shard):
//   for ZeRO 0, 1 and 2, 2 ranks of B sequences follow one process of 2B (the same global batch):
//   losses within fp32 rounding and parameters within the AdamW bound of test_data_parallel;
//   2 ranks stopped (--stop-after) and resumed on 2 ranks are bit-identical to an uninterrupted run
//   (every step's loss, the model file and every rank's state shard, byte for byte); 2 ranks resumed
//   on 3 (ranks x B kept) re-shard the optimizer state and go on with the uninterrupted run's losses;
//   --log-ranks gives every rank its own log with its memory anatomy; a failing rank brings the job
//   down with its rank in the message; --zero with Adafactor is refused; the micro-step replayed from
//   CUDA graphs is bit-identical to eager launches (ZeRO 0 and 1; ZeRO-2 runs eagerly); the weight
//   gradients on a second stream (--overlap-wgrad 1, every stream run as late as its events allow) are
//   bit-identical to one stream (ZeRO 1 graphed, ZeRO 2 eager): each block's gradients reach the
//   communication only once done.
// Expert parallelism (--expert-parallel): a 4-layer model with 6 experts, top-2, every other block
// sparse, on 2 and 3 ranks (dropless and with a capacity factor, --zero 0 and 1) follows one process
// with the same global batch in micro-steps of the same tokens; stopped and resumed it is
// bit-identical; what it cannot do is refused.
#include "gpt2_trainer.h"
#include "trainer_ranks.h"

namespace test_train_gpt2_ranks {

using ranks::run, ranks::tmp, th::exited_ok, th::last_lines, th::slurp, th::step_losses;

// A small random GPT-2, 6 AdamW steps of 256 tokens, no validation, no sampling. Its vocabulary is
// 64 (the shard's, which checks() writes into the scratch folder), not GPT-2's 50257: at GPT-2's the
// classifier and the embedding's optimizer step are most of each run's work, and what the runs here
// check, how ranks split and share the work, does not depend on the vocabulary's size.
static std::string model_args() {
    return "-e d2 --channels 64 --heads 4 --max-seq-len 64 --vocab-size 64 -i " + ranks::tmp +
           "/train.bin -j '' -t 32 -d 256 -x 6 -v 0 -g 0 -l 1e-3 --seed 7 ";
}

// 2 ranks with B=2 and 2 micro-steps vs one process with B=4: the same global batches.
static void test_stages() {
    th::ChildOutput one = run(0, model_args() + "-b 4 -o " + tmp + "/one");
    std::vector<double> want = step_losses(one.text);
    GPT2Config c;
    std::vector<float> p_one = load_checkpoint(tmp + "/one/model_00000006.bin", &c);
    for (int zero = 0; zero <= 2; zero++) {
        std::string dir = tmp + "/z" + std::to_string(zero);
        th::ChildOutput two = run(2, model_args() + "-b 2 --zero " + std::to_string(zero) + " -o " + dir);
        std::vector<double> got = step_losses(two.text);
        double worst = ranks::worst_diff(want, got, 6);
        char name[128];
        snprintf(name, sizeof(name), "mpirun -np 2 --zero %d: the losses of one process with the same global batch",
                 zero);
        // losses print with 6 decimals; one process and two differ by fp32 rounding (test_data_parallel)
        th::report(exited_ok(two) && exited_ok(one) && worst <= 2e-6, name, "max diff %.2g over %zu steps%s", worst,
                   got.size(), exited_ok(two) ? "" : (" | " + last_lines(two.text)).c_str());
        GPT2Config c2;
        std::vector<float> p_two = exited_ok(two) ? load_checkpoint(dir + "/model_00000006.bin", &c2) : p_one;
        double diff = 0;
        for (size_t i = 0; i < p_one.size(); i++) diff = std::max(diff, (double)std::fabs(p_one[i] - p_two[i]));
        // AdamW: 1% of the 6 * lr a parameter can move (see test_data_parallel.cu)
        snprintf(name, sizeof(name), "mpirun -np 2 --zero %d: final parameters == one process's", zero);
        th::report(exited_ok(two) && diff <= 0.01 * 6 * 1e-3, name, "max diff %.3g", diff);
    }
}

// fp16 keeps fp32 master weights, which ZeRO-1 shards; the model file is written from all of them
// (gathered from the ranks): byte for byte ZeRO-0's file, where every rank holds them all. Without
// gradient clipping the two runs do the same arithmetic per element (the backend's reductions add
// the ranks in rank order whichever collective asks); with it, the norm's other summation order
// would change the clip factor in its last bits.
static void test_fp16_sharded_master_file() {
    const std::string args = model_args() + "-x 3 -b 2 --precision fp16 --grad-clip 0 ";
    th::ChildOutput z0 = run(2, args + "--zero 0 -o " + tmp + "/f16z0");
    th::ChildOutput z1 = run(2, args + "--zero 1 -o " + tmp + "/f16z1");
    GPT2Config c0, c1;
    std::vector<float> p0, p1;
    if (exited_ok(z0) && exited_ok(z1)) {
        p0 = load_checkpoint(tmp + "/f16z0/model_00000003.bin", &c0);
        p1 = load_checkpoint(tmp + "/f16z1/model_00000003.bin", &c1);
    }
    double diff = p0.size() == p1.size() && !p0.empty() ? 0 : INFINITY;
    for (size_t i = 0; i < p0.size() && i < p1.size(); i++) diff = std::max(diff, (double)std::fabs(p0[i] - p1[i]));
    th::report(diff == 0, "fp16, 2 ranks: the --zero 1 model file (sharded master weights) == --zero 0's",
               "max diff %.3g over %zu parameters%s", diff, p1.size(),
               exited_ok(z1) ? "" : (" | " + last_lines(z1.text)).c_str());
}

// --batch-size auto on ranks with different free memory: every rank must take the same B (the
// smallest that fits everywhere), or their micro-steps, and so their collectives, would not match.
// Under ZeRO-2, which reduces gradients every micro-step, different B would deadlock the job.
// Rank 0 gets a virtual device with room for B=8 only, rank 1 one with room for B=16 (mpirun's
// multi-program form gives each its own SIMT_DEVICE_MEMORY); the sizes come from one process's
// memory anatomy (activations at B=8 and B=16, and everything else).
static void test_auto_batch_ranks() {
    const std::string args = model_args() + "-d 1024 -x 2 ";
    auto mib = [](const std::string& out, const char* row) {
        size_t at = out.find(row);
        return at == std::string::npos ? -1.0 : atof(out.c_str() + at + strlen(row));
    };
    th::ChildOutput b8 = run(0, args + "-b 8"), b16 = run(0, args + "-b 16");
    double a8 = mib(b8.text, "\n  activations"), a16 = mib(b16.text, "\n  activations"),
           rest = mib(b8.text, "\n  = total") - a8;
    // auto takes the largest multiple of 8 whose activations fit 90% of the free memory
    char small[32];
    snprintf(small, sizeof(small), "%.0fM", rest + (a8 + a16) / 2 / 0.9);
    std::string both = " " + ranks::self + " --train-gpt2 " + args + "-b auto --zero 2";  // ZeRO-2: a collective per micro-step
    std::string cmd = th::mpirun_prefix(1) + "-x SIMT_DEVICE_MEMORY=" + small + both + " : -np 1" +
                      th::mpirun_context_options() + " -x SIMT_DEVICE_MEMORY=80G" + both;
    th::ChildOutput two = th::run_command("timeout 120 " + cmd + " 2>&1");
    bool ok = a8 > 0 && a16 > a8 && rest > 0 && exited_ok(two) && two.text.find("batch size auto: B=8 ") != std::string::npos &&
              step_losses(two.text).size() == 2;
    th::report(ok, "--batch-size auto on 2 ranks with different free memory: both take the smaller B",
               "rank 0 with %s (activations %.1f MiB at B=8, %.1f at B=16), rank 1 with 80G: %s", small, a8, a16,
               ok ? "B=8 on both, 2 steps" : last_lines(two.text).c_str());
}

// Stopped after 3 steps and resumed, on 2 ranks with sharded state: bit-identical to uninterrupted.
static void test_resume_same_world() {
    for (int zero : {1, 2}) {
        char name[128];
        snprintf(name, sizeof(name), "mpirun -np 2 --zero %d bf16: stop after 3 + resume == uninterrupted, bit for bit",
                 zero);
        ranks::check_resume_same_world(model_args() + "-b 2 --zero " + std::to_string(zero) + " --precision bf16 -n 3 ",
                                       std::to_string(zero), name);
    }
}

// --cuda-graphs 1 (the default) against 0 on 2 ranks with 2 micro-steps, for ZeRO 0 and 1: the last
// micro-step's graph holds the gradient collectives (the communication stream forked into the
// capture and joined back); every step's loss, the model file and every rank's state file are
// bit-identical. ZeRO-2 runs eagerly and says so.
static void test_cuda_graphs() {
    for (int zero : {0, 1}) {
        std::string dir = tmp + "/graphs_z" + std::to_string(zero);
        std::string args = model_args() + "-b 2 --zero " + std::to_string(zero) + " -o " + dir;
        th::ChildOutput on = run(2, args + "_on --cuda-graphs 1"), off = run(2, args + "_off --cuda-graphs 0");
        bool same = exited_ok(on) && exited_ok(off) && step_losses(on.text) == step_losses(off.text) &&
                    step_losses(on.text).size() == 6;
        for (std::string f : {"/model_00000006.bin", "/state_00000006_00000.bin", "/state_00000006_00001.bin"}) {
            std::string a = slurp(dir + "_on" + f), b = slurp(dir + "_off" + f);
            if (zero == 0 && f.find("_00001") != std::string::npos) continue;  // replicated state: rank 0's only
            same = same && a.rfind("<missing", 0) != 0 && a == b;
        }
        bool graphed = on.text.find("CUDA graphs: micro-steps replayed") != std::string::npos;
        char name[128];
        snprintf(name, sizeof(name), "mpirun -np 2 --zero %d: CUDA graphs == eager, bit for bit", zero);
        th::report(same && graphed, name, "%s%s", same ? "losses, model and state files bit-identical" : "differ",
                   graphed ? "" : " (graphs not used)");
    }
}

static void test_overlap_wgrad() {
    for (int zero : {1, 2}) {
        std::string dir = tmp + "/overlap_z" + std::to_string(zero);
        std::string args = model_args() + "-b 2 --zero " + std::to_string(zero) + " -o " + dir;
        th::ChildOutput one = run(2, args + "_one");
        th::ChildOutput two =
            th::run_command("SIMT_STREAMS=adversarial " + th::mpirun_prefix(2) + ranks::self + " " + ranks::flag +
                            " " + args + "_two --overlap-wgrad 1 2>&1");
        bool same = exited_ok(one) && exited_ok(two) && step_losses(one.text) == step_losses(two.text) &&
                    step_losses(one.text).size() == 6;
        std::string a = slurp(dir + "_one/model_00000006.bin"), b = slurp(dir + "_two/model_00000006.bin");
        same = same && a.rfind("<missing", 0) != 0 && a == b;
        char name[128];
        snprintf(name, sizeof(name), "mpirun -np 2 --zero %d --overlap-wgrad 1: one stream's run, bit for bit", zero);
        const std::string why = exited_ok(two) ? std::string() : " | " + last_lines(two.text);
        th::report(same, name, "%s%s", same ? "losses and model file bit-identical" : "differ", why.c_str());
    }
}

// --log-ranks: every rank logs its own losses and memory; a failing rank names itself; Adafactor and
// --zero are refused together.
static void test_logs_and_failures() {
    th::ChildOutput c = ranks::check_log_ranks(model_args() + "-b 2 --zero 2 -x 2");
    size_t at = c.text.find("CUDA graphs: ");
    std::string said = at == std::string::npos ? "no CUDA graphs line" : c.text.substr(at, c.text.find('\n', at) - at);
    th::report(said.rfind("CUDA graphs: off (--zero 2: ", 0) == 0,
               "--zero 2 on 2 ranks: CUDA graphs off, and the run says why", "%s", said.c_str());
    ranks::check_failing_rank(model_args() + "-b 2 -i " + tmp + "/no_such_shard.bin", "no_such_shard.bin");
    th::ChildOutput af = run(2, model_args() + "-b 2 --zero 1 --optimizer adafactor");
    th::report(!exited_ok(af) && af.text.find("option --zero") != std::string::npos,
               "--zero 1 with adafactor on 2 ranks: refused", "%s", last_lines(af.text).c_str());
    ranks::check_option_errors_once(model_args() + "--bogus", "unknown option '--bogus'", model_args() + "-b 2 -d 1000",
                                    "option --total-batch-size: 1000 is not a multiple");
}

// The MoE model of the expert-parallel checks: 4 layers, blocks 1 and 3 with 6 GELU experts, top-2.
static std::string moe_args() { return model_args() + "--layers 4 --moe-experts 6 --moe-top-k 2 --moe-every 2 "; }

// P ranks of B=2 with --expert-parallel vs one process of B=2 and P micro-steps: rank r's tokens are
// the single process's micro-step r (the data loader splits a global batch the same way), routed
// and capacity-limited over the same N = 64 tokens, so the two runs compute the same model; only
// the fp32 summation orders differ (gradient averaging over ranks, the experts' 1/P scaling, the
// expert GEMMs over P*Rb rows per expert). Bounds as test_stages': losses printed with 6 decimals
// within 2e-6, parameters within 1% of the 6 * lr AdamW lets a parameter move in 6 steps.
static void test_expert_parallel() {
    struct Case { int ranks; const char* capacity; int zero; } cases[] = {
        {2, "0", 0}, {3, "1.25", 0}, {2, "1.25", 1}, {3, "0", 1}};
    for (const Case& k : cases) {
        std::string args = moe_args() + "-b 2 -d " + std::to_string(64 * k.ranks) + " --moe-capacity " + k.capacity + " ";
        std::string tag = std::to_string(k.ranks) + "_" + k.capacity + "_" + std::to_string(k.zero);
        std::string one_dir = tmp + "/ep_one" + tag, ep_dir = tmp + "/ep" + tag;
        th::ChildOutput one = run(0, args + "-o " + one_dir);
        th::ChildOutput ep = run(k.ranks, args + "--expert-parallel --zero " + std::to_string(k.zero) + " -o " + ep_dir);
        std::vector<double> want = step_losses(one.text), got = step_losses(ep.text);
        double worst = ranks::worst_diff(want, got, 6);
        char what[128];
        snprintf(what, sizeof(what), "--expert-parallel on %d ranks, capacity %s, --zero %d", k.ranks, k.capacity,
                 k.zero);
        char expect[96];
        snprintf(expect, sizeof(expect), "the 6 experts of each MoE block over %d ranks, %d per rank", k.ranks,
                 6 / k.ranks);
        bool said = ep.text.find(expect) != std::string::npos;
        th::report(exited_ok(one) && exited_ok(ep) && said && worst <= 2e-6,
                   (std::string(what) + ": the losses of one process with the same global batch").c_str(),
                   "max diff %.2g over %zu steps%s%s", worst, got.size(), said ? "" : ", no expert-parallel line",
                   exited_ok(ep) ? "" : (" | " + last_lines(ep.text)).c_str());
        GPT2Config c1, c2;
        std::vector<float> p_one = exited_ok(one) ? load_checkpoint(one_dir + "/model_00000006.bin", &c1)
                                                  : std::vector<float>();
        std::vector<float> p_ep = exited_ok(ep) ? load_checkpoint(ep_dir + "/model_00000006.bin", &c2)
                                                : std::vector<float>();
        double diff = p_one.size() == p_ep.size() && !p_one.empty() ? 0 : INFINITY;
        for (size_t i = 0; i < p_one.size() && i < p_ep.size(); i++)
            diff = std::max(diff, (double)std::fabs(p_one[i] - p_ep[i]));
        th::report(diff <= 0.01 * 6 * 1e-3,
                   (std::string(what) + ": the model file (every expert) == one process's").c_str(),
                   "%zu parameters, max diff %.3g", p_ep.size(), diff);
    }
}

// Expert parallelism stopped after 3 steps and resumed (bf16, capacity, each rank's own state file):
// bit-identical to the uninterrupted run. Then what it cannot do, one clear error each.
static void test_expert_parallel_resume_and_refusals() {
    const std::string args = moe_args() + "-b 2 -d 128 --moe-capacity 1.25 --expert-parallel --precision bf16 -n 3 ";
    ranks::check_resume_same_world(args, "_ep",
                                   "--expert-parallel on 2 ranks bf16: stop after 3 + resume == uninterrupted, bit for "
                                   "bit");
    struct Refusal { int ranks; std::string args, says; const char* name; } refusals[] = {
        {2, model_args() + "-b 2 --expert-parallel", "option --expert-parallel: the model has no experts",
         "--expert-parallel without experts: refused"},
        {3, model_args() + "--layers 4 --moe-experts 4 -b 2 --expert-parallel", "the 4 experts do not divide over 3 ranks",
         "--expert-parallel with 4 experts on 3 ranks: refused"},
        {2, moe_args() + "-b 2 --expert-parallel --zero 2", "option --expert-parallel: not with --zero 2",
         "--expert-parallel with --zero 2: refused"},
        {2, moe_args() + "-b 2 --expert-parallel -g 8", "sampling needs every expert on one rank",
         "--expert-parallel with --gen-tokens 8: refused, naming the alternative"},
        {3, args + "-y -o " + tmp + "/part_ep", "the checkpoint was trained on 2 ranks",
         "--expert-parallel: resuming a 2-rank checkpoint on 3 ranks: refused"},
    };
    for (const Refusal& r : refusals) {
        th::ChildOutput out = run(r.ranks, r.args);
        th::report(!exited_ok(out) && out.text.find(r.says) != std::string::npos, r.name, "%s",
                   last_lines(out.text).c_str());
    }
}

static void checks() {
    th::write_token_shard(ranks::tmp + "/train.bin", 16384, 64, 1);
    test_stages();
    test_fp16_sharded_master_file();
    test_auto_batch_ranks();
    test_resume_same_world();
    test_cuda_graphs();
    test_overlap_wgrad();
    ranks::check_reshard_2_to_3(model_args() + "--zero 1 -d 384 ");
    test_logs_and_failures();
    test_expert_parallel();
    test_expert_parallel_resume_and_refusals();
}

int main(int argc, char** argv) { return ranks::main(argc, argv, "--train-gpt2", train_gpt2_main, checks); }

}  // namespace test_train_gpt2_ranks
TH_MAIN(test_train_gpt2_ranks)
