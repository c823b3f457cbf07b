// test/test_train_bert_ranks.cu — the train_bert program data parallel, run as a user runs it: this
// binary contains it (train_bert.cu included with TESTING) and starts itself as `mpirun -np N
// test_train_bert_ranks --train-bert ARGS...` (or without mpirun for one process) on small
// classification shards (test/bert_shards.h), with a tiny random BERT and dropout off:
//   for ZeRO 0, 1 and 2, 2 ranks of B sequences follow one process of 2B (the same global batches):
//   step losses and the final evaluation's loss within fp32 rounding, parameters within the AdamW
//   bound of test_data_parallel (ZeRO-2 without CUDA graphs, said);
//   2 ranks (--zero 1) stopped (--stop-after) and resumed on 2 ranks are bit-identical to an
//   uninterrupted run (every step's loss, the model file and both state shards, byte for byte);
//   2 ranks x B=3 resumed on 3 ranks x B=2 re-shard the optimizer state and go on with the
//   uninterrupted run's losses; another ranks x B is refused by name; a failing rank brings the job
//   down with its rank in the message;
//   --cuda-graphs 1 == 0 on 2 ranks with 2 micro-steps and dropout on, for ZeRO 0 and 1, bit for bit;
//   --log-ranks gives rank 1 its own log.
#include "bert_trainer.h"
#include "bert_shards.h"
#include "trainer_ranks.h"

namespace test_train_bert_ranks {

using ranks::run, ranks::tmp, ranks::worst_diff, th::exited_ok, th::last_lines, th::step_losses;

// The last evaluation's "val loss X" (NaN if none).
static double val_loss(const std::string& out) {
    size_t at = out.rfind("| val loss ");
    return at == std::string::npos ? NAN : atof(out.c_str() + at + 11);
}

static std::string g_args;  // the model and data of every run (set in checks)

// 2 ranks with B=4 vs one process with B=8: the same global batches.
static void test_stages() {
    const double lr = 1e-3;
    th::ChildOutput one = run(0, g_args + "-b 8 -o " + tmp + "/one");
    std::vector<double> want = step_losses(one.text);
    BertConfig c;
    BertParts parts;
    std::vector<float> p_one = load_hf_bert(tmp + "/one/model_00000006.bin", &c, &parts, 0);
    for (int zero = 0; zero <= 2; zero++) {
        std::string dir = tmp + "/z" + std::to_string(zero);
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
        if (zero < 2) continue;
        size_t at = two.text.find("CUDA graphs: ");
        std::string said =
            at == std::string::npos ? "no CUDA graphs line" : two.text.substr(at, two.text.find('\n', at) - at);
        th::report(said.rfind("CUDA graphs: off (--zero 2: ", 0) == 0,
                   "mpirun -np 2 --zero 2: CUDA graphs off, and the run says why", "%s", said.c_str());
    }
}

// --cuda-graphs 1 (the default) against 0 on 2 ranks with 2 micro-steps of length-bucketed batches
// and dropout 0.1 (each rank's own masks), for ZeRO 0 and 1: the last micro-step's graph holds the
// gradient collectives (the communication stream forked into the capture and joined back); every
// step's loss, the model file and every rank's state file are bit-identical.
static void test_cuda_graphs() {
    for (int zero : {0, 1}) {
        std::string dir = tmp + "/graphs_z" + std::to_string(zero);
        std::string args = g_args + "-b 2 -d 8 --dropout 0.1 --zero " + std::to_string(zero) + " -o " + dir;
        th::ChildOutput on = run(2, args + "_on --cuda-graphs 1"), off = run(2, args + "_off --cuda-graphs 0");
        bool same = exited_ok(on) && exited_ok(off) && step_losses(on.text) == step_losses(off.text) &&
                    step_losses(on.text).size() == 6;
        for (std::string f : {"/model_00000006.bin", "/state_00000006_00000.bin", "/state_00000006_00001.bin"}) {
            if (zero == 0 && f.find("_00001") != std::string::npos) continue;  // replicated state: rank 0's only
            std::string a = th::slurp(dir + "_on" + f), b = th::slurp(dir + "_off" + f);
            same = same && a.rfind("<missing", 0) != 0 && a == b;
        }
        bool graphed = on.text.find("CUDA graphs: micro-steps replayed") != std::string::npos;
        char name[128];
        snprintf(name, sizeof(name), "mpirun -np 2 --zero %d: CUDA graphs == eager, bit for bit (dropout 0.1)", zero);
        th::report(same && graphed, name, "%s%s", same ? "losses, model and state files bit-identical" : "differ",
                   graphed ? "" : " (graphs not used)");
    }
}

static void checks() {
    // Two classes, vocabulary 400, sequences of 3 to 16 tokens.
    std::string train = th::write_bert_test_shard(tmp, "train.bin", BertShardKind::Classify, 96, 16, 400, 2, 1);
    std::string val = th::write_bert_test_shard(tmp, "val.bin", BertShardKind::Classify, 20, 16, 400, 2, 2);
    // A tiny random BERT, 6 AdamW steps of 6 or 8 sequences, dropout off, an evaluation at the end.
    g_args = "--config tiny -i " + train + " -j " + val + " -t 16 -x 6 -l 1e-3 -k constant -u 0 --dropout 0 "
             "--eval-first 0 --seed 7 ";
    test_stages();
    // Stopped after 3 steps and resumed, on 2 ranks with sharded state: bit-identical to uninterrupted.
    ranks::check_resume_same_world(g_args + "-b 4 --zero 1 -n 3 ", "",
                                   "mpirun -np 2 --zero 1: stop after 3 + resume == uninterrupted, bit for bit");
    test_cuda_graphs();
    ranks::check_reshard_2_to_3(g_args + "--zero 1 ");
    ranks::check_failing_rank("--init " + tmp + "/no_such_model.safetensors -b 4", "no_such_model");
    ranks::check_log_ranks(g_args + "-b 4 --zero 1");
    ranks::check_option_errors_once(g_args + "--bogus", "unknown option '--bogus'", g_args + "-b 4 -d 9",
                                    "option --total-batch-size: 9 is not a multiple");
}

int main(int argc, char** argv) { return ranks::main(argc, argv, "--train-bert", train_bert_main, checks); }

}  // namespace test_train_bert_ranks
TH_MAIN(test_train_bert_ranks)
