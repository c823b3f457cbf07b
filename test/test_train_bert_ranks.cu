// test/test_train_bert_ranks.cu — the train_bert program data parallel, run as a user runs it: this
// binary contains it (train_bert.cu included with TESTING) and starts itself as `mpirun -np N
// test_train_bert_ranks --train-bert ARGS...` (or without mpirun for one process) on small
// classification shards written here, with a tiny random BERT and dropout off:
//   for ZeRO 0, 1 and 2, 2 ranks of B sequences follow one process of 2B (the same global batches):
//   step losses and the final evaluation's loss within fp32 rounding, parameters within the AdamW
//   bound of test_data_parallel;
//   2 ranks (--zero 1) stopped (--stop-after) and resumed on 2 ranks are bit-identical to an
//   uninterrupted run (every step's loss, the model file and both state shards, byte for byte);
//   2 ranks x B=3 resumed on 3 ranks x B=2 re-shard the optimizer state and go on with the
//   uninterrupted run's losses; another ranks x B is refused by name; a failing rank brings the job
//   down with its rank in the message.
#define TESTING
#include "../train_bert.cu"
#include "harness.h"
#include "program_runs.h"

#include <sys/wait.h>

static std::string g_self, g_tmp;
using th::exited_ok, th::last_lines, th::slurp, th::step_losses;

// A run of the program: `ranks` processes under mpirun, or 0 for one process without it.
static th::ChildOutput run(int ranks, const std::string& args) {
    return th::run_command(th::mpirun_prefix(ranks) + g_self + " --train-bert " + args + " 2>&1");
}

// The last evaluation's "val loss X" (NaN if none).
static double val_loss(const std::string& out) {
    size_t at = out.rfind("| val loss ");
    return at == std::string::npos ? NAN : atof(out.c_str() + at + 11);
}

// Largest |difference| of two runs' losses (infinite unless both have `n`).
static double worst_diff(const std::vector<double>& a, const std::vector<double>& b, size_t n) {
    double worst = a.size() == n && b.size() == n ? 0 : INFINITY;
    for (size_t i = 0; i < a.size() && i < b.size(); i++) worst = std::max(worst, std::fabs(a[i] - b[i]));
    return worst;
}

// A classification shard of n sequences of 3 to max_len tokens, vocabulary V (bert-base-uncased's
// special ids), 2 classes whose tokens come from overlapping ranges.
static std::string write_shard(const std::string& name, int n, int max_len, int V, uint64_t seed) {
    BertShard s;
    s.kind = BertShardKind::Classify;
    s.max_len = max_len;
    s.vocab_size = V;
    s.cls_id = 101, s.sep_id = 102, s.pad_id = 0, s.mask_id = 103, s.unk_id = 100;
    BertRng rng({seed, 77});
    int lo = 110, span = V - lo;
    for (int i = 0; i < n; i++) {
        int len = 3 + (int)rng.below(max_len - 2);
        int label = (int)rng.below(2);
        s.tokens.push_back(101);
        for (int t = 1; t < len - 1; t++) s.tokens.push_back((uint16_t)(lo + label * span / 3 + rng.below(2 * span / 3)));
        s.tokens.push_back(102);
        s.lengths.push_back(len);
        s.labels.push_back(label);
    }
    s.label_names = {"even", "odd"};
    std::string path = g_tmp + "/" + name, err;
    if (!write_bert_shard(path, s, &err)) data_error("%s", err.c_str());
    return path;
}

static std::string g_args;  // the model and data of every run (set in main)

// 2 ranks with B=4 vs one process with B=8: the same global batches.
static void test_stages() {
    const double lr = 1e-3;
    th::ChildOutput one = run(0, g_args + "-b 8 -o " + g_tmp + "/one");
    std::vector<double> want = step_losses(one.text);
    BertConfig c;
    BertParts parts;
    std::vector<float> p_one = load_hf_bert(g_tmp + "/one/model_00000006.bin", &c, &parts, 0);
    for (int zero = 0; zero <= 2; zero++) {
        std::string dir = g_tmp + "/z" + std::to_string(zero);
        th::ChildOutput two = run(2, g_args + "-b 4 --zero " + std::to_string(zero) + " -o " + dir);
        std::vector<double> got = step_losses(two.text);
        double worst = worst_diff(want, got, 6), dval = std::fabs(val_loss(one.text) - val_loss(two.text));
        char name[160];
        snprintf(name, sizeof(name), "mpirun -np 2 --zero %d: the step and eval losses of one process with the same "
                 "global batch", zero);
        // losses print with 6 decimals; one process and two differ by fp32 rounding (test_data_parallel)
        th::report(exited_ok(two) && exited_ok(one) && worst <= 2e-6 && dval <= 2e-6, name,
                   "max diff %.2g over %zu steps, val loss diff %.2g%s", worst, got.size(), dval,
                   exited_ok(two) ? "" : (" | " + last_lines(two.text)).c_str());
        BertConfig c2;
        std::vector<float> p_two =
            exited_ok(two) ? load_hf_bert(dir + "/model_00000006.bin", &c2, &parts, 0) : std::vector<float>();
        double diff = p_two.size() == p_one.size() ? 0 : INFINITY;
        for (size_t i = 0; i < p_one.size() && i < p_two.size(); i++)
            diff = std::max(diff, (double)std::fabs(p_one[i] - p_two[i]));
        // AdamW: 1% of the 6 * lr a parameter can move (see test_data_parallel.cu)
        snprintf(name, sizeof(name), "mpirun -np 2 --zero %d: final parameters == one process's", zero);
        th::report(diff <= 0.01 * 6 * lr, name, "max diff %.3g", diff);
    }
}

// Stopped after 3 steps and resumed, on 2 ranks with sharded state: bit-identical to uninterrupted.
static void test_resume_same_world() {
    std::string full = g_tmp + "/full", part = g_tmp + "/part";
    std::string args = g_args + "-b 4 --zero 1 -n 3 ";
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
    th::report(exited_ok(a) && exited_ok(b1) && exited_ok(b2) && la == lb && la.size() == 6 && same_files,
               "mpirun -np 2 --zero 1: stop after 3 + resume == uninterrupted, bit for bit",
               "%zu losses equal: %s; model + 2 state shards identical: %s%s%s", la.size(), la == lb ? "yes" : "no",
               same_files ? "yes" : "no", same_files ? "" : (" (" + which + ")").c_str(),
               exited_ok(b2) ? "" : (" | " + last_lines(b2.text)).c_str());
}

// 2 ranks x B=3 stopped after 3 steps, resumed on 3 ranks x B=2: the state is re-sharded and the run
// goes on as the uninterrupted 2-rank run does (fp32 rounding apart: another split of the sums).
static void test_reshard_2_to_3() {
    std::string full = g_tmp + "/r_full", part = g_tmp + "/r_part";
    std::string args = g_args + "--zero 1 ";
    th::ChildOutput a = run(2, args + "-b 3 -o " + full);
    th::ChildOutput b1 = run(2, args + "-b 3 -o " + part + " --stop-after 3");
    th::ChildOutput bad = run(3, args + "-b 1 -o " + part + " -y");
    bool named = bad.text.find("--batch-size x ranks 3 x 2, this run has 1 x 3") != std::string::npos;
    th::report(!exited_ok(bad) && named, "resume on 3 ranks x B=1 after 2 x 3: refused, naming --batch-size x ranks",
               "%s", last_lines(bad.text).c_str());
    th::ChildOutput b2 = run(3, args + "-b 2 -o " + part + " -y");
    std::vector<double> la = step_losses(a.text), lb = step_losses(b1.text + "\n" + b2.text);
    double worst = worst_diff(la, lb, 6);
    bool said = b2.text.find("re-sharded the optimizer state of 2 ranks onto 3") != std::string::npos;
    th::report(exited_ok(a) && exited_ok(b1) && exited_ok(b2) && said && worst <= 2e-6,
               "resume 2 ranks -> 3 ranks (--zero 1): state re-sharded, losses of the uninterrupted run",
               "max diff %.2g over %zu steps%s", worst, lb.size(),
               exited_ok(b2) ? "" : (" | " + last_lines(b2.text)).c_str());
}

// A rank that fails names itself and stops the job.
static void test_failure() {
    th::ChildOutput bad = run(2, "--init " + g_tmp + "/no_such_model.safetensors -b 4");
    bool named = bad.text.find("rank 0/2: ") != std::string::npos || bad.text.find("rank 1/2: ") != std::string::npos;
    th::report(!exited_ok(bad) && named && bad.text.find("no_such_model") != std::string::npos,
               "a rank that fails stops the job with its rank in the message", "%s", last_lines(bad.text).c_str());
}

int main(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "--train-bert") == 0) {
        argv[1] = argv[0];
        return train_bert_main(argc - 1, argv + 1);
    }
    g_self = argv[0];
    char tmpl[] = "/tmp/test_train_bert_ranks_XXXXXX";
    if (!mkdtemp(tmpl)) data_error("mkdtemp failed");
    g_tmp = tmpl;
    std::string train = write_shard("train.bin", 96, 16, 400, 1), val = write_shard("val.bin", 20, 16, 400, 2);
    // A tiny random BERT, 6 AdamW steps of 6 or 8 sequences, dropout off, an evaluation at the end.
    g_args = "--config tiny -i " + train + " -j " + val + " -t 16 -x 6 -l 1e-3 -k constant -u 0 --dropout 0 "
             "--eval-first 0 --seed 7 ";
    test_stages();
    test_resume_same_world();
    test_reshard_2_to_3();
    test_failure();
    th::run_command("rm -rf " + g_tmp);
    return th::finish();
}
