// test/test_train_gpt2_ranks.cu — the train_gpt2 program data parallel, run as a user runs it: this
// binary contains it (train_gpt2.cu included with TESTING) and starts itself as `mpirun -np N
// test_train_gpt2_ranks --train-gpt2 ARGS...` (or without mpirun for one process) on the bundled
// Shakespeare shards with a small random model:
//   for ZeRO 0, 1 and 2, 2 ranks of B sequences follow one process of 2B (the same global batch):
//   losses within fp32 rounding and parameters within the AdamW bound of test_data_parallel;
//   2 ranks stopped (--stop-after) and resumed on 2 ranks are bit-identical to an uninterrupted run
//   (every step's loss, the model file and every rank's state shard, byte for byte); 2 ranks resumed
//   on 3 (ranks x B kept) re-shard the optimizer state and go on with the uninterrupted run's losses;
//   --log-ranks gives every rank its own log with its memory anatomy; a failing rank brings the job
//   down with its rank in the message; --zero with Adafactor is refused.
#define TESTING
#include "../train_gpt2.cu"
#include "harness.h"
#include "program_runs.h"

#include <sys/wait.h>

static std::string g_self, g_tmp;
using th::exited_ok, th::last_lines, th::slurp, th::step_losses;

// A run of the program: `ranks` processes under mpirun, or 0 for one process without it.
static th::ChildOutput run(int ranks, const std::string& args) {
    return th::run_command(th::mpirun_prefix(ranks) + g_self + " --train-gpt2 " + args + " 2>&1");
}

// A small random GPT-2 on the bundled shards, 6 AdamW steps of 256 tokens, no sampling.
static const std::string kModelArgs = "-e d2 --channels 64 --heads 4 --max-seq-len 64 -t 32 -d 256 -x 6 -v 0 -g 0 "
                                      "-l 1e-3 --seed 7 ";

// 2 ranks with B=2 and 2 micro-steps vs one process with B=4: the same global batches.
static void test_stages() {
    th::ChildOutput one = run(0, kModelArgs + "-b 4 -o " + g_tmp + "/one");
    std::vector<double> want = step_losses(one.text);
    GPT2Config c;
    std::vector<float> p_one = load_checkpoint(g_tmp + "/one/model_00000006.bin", &c);
    for (int zero = 0; zero <= 2; zero++) {
        std::string dir = g_tmp + "/z" + std::to_string(zero);
        th::ChildOutput two = run(2, kModelArgs + "-b 2 --zero " + std::to_string(zero) + " -o " + dir);
        std::vector<double> got = step_losses(two.text);
        double worst = want.size() == 6 && got.size() == 6 ? 0 : INFINITY;
        for (size_t i = 0; i < got.size() && i < want.size(); i++) worst = std::max(worst, std::fabs(got[i] - want[i]));
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

// --batch-size auto on ranks with different free memory: every rank must take the same B (the
// smallest that fits everywhere), or their micro-steps, and so their collectives, would not match.
// Under ZeRO-2, which reduces gradients every micro-step, different B would deadlock the job.
// Rank 0 gets a virtual device with room for B=8 only, rank 1 one with room for B=16 (mpirun's
// multi-program form gives each its own SIMT_DEVICE_MEMORY); the sizes come from one process's
// memory anatomy (activations at B=8 and B=16, and everything else).
static void test_auto_batch_ranks() {
    const std::string args = kModelArgs + "-d 1024 -x 2 ";
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
    std::string both = " " + g_self + " --train-gpt2 " + args + "-b auto --zero 2";  // ZeRO-2: a collective per micro-step
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
        std::string full = g_tmp + "/full" + std::to_string(zero), part = g_tmp + "/part" + std::to_string(zero);
        std::string args = kModelArgs + "-b 2 --zero " + std::to_string(zero) + " --precision bf16 -n 3 ";
        th::ChildOutput a = run(2, args + "-o " + full);
        th::ChildOutput b1 = run(2, args + "-o " + part + " --stop-after 3");
        th::ChildOutput b2 = run(2, args + "-o " + part + " -y");
        std::vector<double> la = step_losses(a.text), lb = step_losses(b1.text + "\n" + b2.text);
        bool same_files = true;
        std::string which;
        for (std::string f : {"/model_00000006.bin", "/state_00000006_00000.bin", "/state_00000006_00001.bin"})
            if (slurp(full + f) != slurp(part + f) || slurp(full + f).rfind("<missing", 0) == 0) {
                same_files = false;
                which += f + " ";
            }
        char name[128];
        snprintf(name, sizeof(name), "mpirun -np 2 --zero %d bf16: stop after 3 + resume == uninterrupted, bit for bit",
                 zero);
        th::report(exited_ok(a) && exited_ok(b1) && exited_ok(b2) && la == lb && la.size() == 6 && same_files, name,
                   "%zu losses equal: %s; model + 2 state shards identical: %s%s", la.size(), la == lb ? "yes" : "no",
                   same_files ? "yes" : "no", same_files ? "" : (" (" + which + ")").c_str());
    }
}

// 2 ranks x B=3 stopped after 3 steps, resumed on 3 ranks x B=2: the state is re-sharded and the run
// goes on as the uninterrupted 2-rank run does (fp32 rounding apart: another split of the sums).
static void test_reshard_2_to_3() {
    std::string full = g_tmp + "/r_full", part = g_tmp + "/r_part";
    std::string args = kModelArgs + "--zero 1 -d 384 ";
    th::ChildOutput a = run(2, args + "-b 3 -o " + full);
    th::ChildOutput b1 = run(2, args + "-b 3 -o " + part + " --stop-after 3");
    // resuming with another ranks x B is refused by name
    th::ChildOutput bad = run(3, args + "-b 1 -o " + part + " -y");
    bool named = bad.text.find("--batch-size x ranks 3 x 2, this run has 1 x 3") != std::string::npos;
    th::report(!exited_ok(bad) && named, "resume on 3 ranks x B=1 after 2 x 3: refused, naming --batch-size x ranks",
               "%s", last_lines(bad.text).c_str());
    th::ChildOutput b2 = run(3, args + "-b 2 -o " + part + " -y");
    std::vector<double> la = step_losses(a.text), lb = step_losses(b1.text + "\n" + b2.text);
    double worst = la.size() == 6 && lb.size() == 6 ? 0 : INFINITY;
    for (size_t i = 0; i < la.size() && i < lb.size(); i++) worst = std::max(worst, std::fabs(la[i] - lb[i]));
    bool said = b2.text.find("re-sharded the optimizer state of 2 ranks onto 3") != std::string::npos;
    th::report(exited_ok(a) && exited_ok(b1) && exited_ok(b2) && said && worst <= 2e-6,
               "resume 2 ranks -> 3 ranks (--zero 1): state re-sharded, losses of the uninterrupted run",
               "max diff %.2g over %zu steps%s", worst, lb.size(),
               exited_ok(b2) ? "" : (" | " + last_lines(b2.text)).c_str());
}

// --log-ranks: every rank logs its own losses and memory; a failing rank names itself; Adafactor and
// --zero are refused together.
static void test_logs_and_failures() {
    std::string dir = g_tmp + "/logs";
    th::ChildOutput c = run(2, kModelArgs + "-b 2 --zero 2 --log-ranks -x 2 -o " + dir);
    std::string r0 = slurp(dir + "/log.jsonl"), r1 = slurp(dir + "/log_rank1.jsonl");
    bool ok = exited_ok(c) && r0.find("\"memory\":{") != std::string::npos &&
              r1.find("\"memory\":{") != std::string::npos && r1.find("\"rank_loss\":") != std::string::npos &&
              r1.find("\"rank\":1") != std::string::npos;
    th::report(ok, "--log-ranks: rank 1 writes log_rank1.jsonl with its memory anatomy and its own loss", "%s",
               ok ? "" : last_lines(c.text + r1).c_str());
    th::ChildOutput bad = run(2, kModelArgs + "-b 2 -i " + g_tmp + "/no_such_shard.bin");
    bool named = bad.text.find("rank 0/2: ") != std::string::npos || bad.text.find("rank 1/2: ") != std::string::npos;
    th::report(!exited_ok(bad) && named && bad.text.find("no_such_shard.bin") != std::string::npos,
               "a rank that fails stops the job with its rank in the message", "%s", last_lines(bad.text).c_str());
    th::ChildOutput af = run(2, kModelArgs + "-b 2 --zero 1 --optimizer adafactor");
    th::report(!exited_ok(af) && af.text.find("option --zero") != std::string::npos,
               "--zero 1 with adafactor on 2 ranks: refused", "%s", last_lines(af.text).c_str());
}

int main(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "--train-gpt2") == 0) {
        argv[1] = argv[0];
        return train_gpt2_main(argc - 1, argv + 1);
    }
    g_self = argv[0];
    char tmpl[] = "/tmp/test_train_gpt2_ranks_XXXXXX";
    if (!mkdtemp(tmpl)) data_error("mkdtemp failed");
    g_tmp = tmpl;
    test_stages();
    test_auto_batch_ranks();
    test_resume_same_world();
    test_reshard_2_to_3();
    test_logs_and_failures();
    th::run_command("rm -rf " + g_tmp);
    return th::finish();
}
