// test/test_checkpoint.cu — checkpoints and resuming (train_gpt2.cu + llmc/checkpoint.h): a run
// stopped and resumed is bit-identical to an uninterrupted one (fp32, bf16, shuffling across
// epochs, gradient accumulation), also after kill -9 at random moments and after Ctrl-C (the run
// stops after its step with a checkpoint; llmc/stop_signal.h); a checkpoint without its
// DONE marker is never picked; keep-last-K; refusals; llm.c model files round trip byte for byte
// (but for our checksum's header slots); a bit flipped in a model or state file is refused (checksums).
// Also whole runs with the micro-step replayed from CUDA graphs against eager launches.
#include "gpt2_trainer.h"
#include "harness.h"
#include "program_runs.h"

#include <fcntl.h>
#include <chrono>
#include <functional>
#include <signal.h>
#include <sys/wait.h>

namespace test_checkpoint {

static std::string g_tmp;


GPT2Config tiny_config() {
    GPT2Config c;
    c.num_layers = 1;
    c.channels = 32;
    c.num_heads = 2;
    c.max_seq_len = 16;
    c.vocab_size = 64;
    c.padded_vocab_size = pad_vocab(c.vocab_size);
    return c;
}

TrainOptions tiny_options(const std::string& dir, const std::string& train, const std::string& val) {
    TrainOptions o;
    o.train_pattern = train;
    o.val_pattern = val;
    o.B = 2;
    o.T = 16;
    o.lr = 1e-2f;
    o.warmup = 2;
    o.max_steps = 8;
    o.val_every = 3;
    o.val_steps = 2;
    o.gen_tokens = 0;
    o.output_dir = dir;
    o.checkpoint_every = 2;
    return o;
}

// Runs train() with stdout silenced (the runs print every step).
template <class floatX>
int quiet_train(TrainOptions o, const TrainState* resume = nullptr, const std::string& state_path = "") {
    o.precision = std::is_same<floatX, float>::value           ? Precision::FP32
                  : std::is_same<floatX, __nv_bfloat16>::value ? Precision::BF16
                                                               : Precision::FP16;
    fflush(stdout);
    int saved = dup(1), devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    GPT2Config c = tiny_config();
    if (o.moe_experts > 0) {  // Mixture-of-Experts blocks, as train_gpt2 sets them for a random init
        c.moe_experts = o.moe_experts;
        c.moe_top_k = o.moe_top_k;
        c.moe_every = o.moe_every;
        c.moe_capacity = o.moe_capacity;
    }
    std::vector<float> init = random_init(c, o.seed);
    if (resume) {
        std::vector<int> done = complete_checkpoints(o.output_dir);
        init = load_checkpoint(checkpoint_file(o.output_dir, "model", done.back()), &c);
    }
    Distributed one;  // a single process
    int rc = train<floatX>(o, c, init, one, resume, state_path);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    close(devnull);
    return rc;
}

// Resumes the run in o.output_dir from its newest complete checkpoint, as main() does.
template <class floatX>
int resume_train(const TrainOptions& o) {
    std::vector<int> done = complete_checkpoints(o.output_dir);
    if (done.empty()) return quiet_train<floatX>(o);
    TrainState st;
    std::string err, path = state_file(o.output_dir, done.back(), 0);
    if (!read_train_state(path, &st, &err)) data_error("%s", err.c_str());
    return quiet_train<floatX>(o, &st, path);
}

using th::slurp;

// Writes bytes to path; false if it cannot.
bool write_bytes(const std::string& path, const std::string& bytes) {
    FILE* f = fopen(path.c_str(), "wb");
    bool ok = f && fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    if (f) ok = fclose(f) == 0 && ok;
    return ok;
}

// A copy of model file src at dst whose float at byte `at` is NaN, as a model that diverged would be
// saved: with its checksum, if it has one, made anew. False if src is too short or dst cannot be
// written.
bool write_nan_model(const std::string& src, const std::string& dst, size_t at) {
    std::string bytes = slurp(src);
    const float nan = NAN;
    if (bytes.size() < at + 4 || at < 1024) return false;
    memcpy(&bytes[at], &nan, 4);
    int32_t h[256];
    memcpy(h, bytes.data(), sizeof(h));
    const int slot = GPT2_CHECKSUM_SLOT;
    if (h[slot] == GPT2_CHECKSUM_MARK) {
        uint64_t check = header_file_checksum(h, {slot, slot + 1, slot + 2}, {{&bytes[1024], bytes.size() - 1024}});
        memcpy(&bytes[4 * (slot + 1)], &check, 8);  // low word, then high (little-endian)
    }
    return write_bytes(dst, bytes);
}

// The log's lines of the given events ("step" and "val"), which hold every loss.
std::string losses_of(const std::string& dir) {
    std::string log = slurp(dir + "/log.jsonl"), out;
    size_t at = 0;
    while (at < log.size()) {
        size_t end = log.find('\n', at);
        std::string line = log.substr(at, end - at);
        if (line.rfind("{\"event\":\"val\"", 0) == 0) out += line + "\n";
        if (line.rfind("{\"event\":\"step\"", 0) == 0) out += line.substr(0, line.find(",\"ms\"")) + "\n";
        at = end == std::string::npos ? log.size() : end + 1;
    }
    return out;
}

// Whether two runs ended identically: the final model and state files byte for byte, the losses.
bool same_run(const std::string& a, const std::string& b, int step, std::string* why) {
    for (std::string f : {checkpoint_file("", "model", step), state_file("", step, 0)}) {
        std::string x = slurp(a + f), y = slurp(b + f);
        if (x.rfind("<missing", 0) == 0 || x != y) {
            *why = f.substr(1) + " differs";
            return false;
        }
    }
    if (losses_of(a) != losses_of(b) || losses_of(a).empty()) {
        *why = "the logged losses differ";
        return false;
    }
    return true;
}

template <class floatX>
void test_resume(const char* name, const char* dir, TrainOptions base, int stop_at) {
    std::string straight = g_tmp + "/" + dir + "_straight", resumed = g_tmp + "/" + dir + "_resumed";
    base.output_dir = straight;
    quiet_train<floatX>(base);
    TrainOptions part = base;
    part.output_dir = resumed;
    part.stop_after = stop_at;
    quiet_train<floatX>(part);
    part.stop_after = 0;
    resume_train<floatX>(part);
    std::string why;
    bool ok = same_run(straight, resumed, base.max_steps, &why);
    th::report(ok, name, "stopped after %d of %d steps, resumed: %s", stop_at, base.max_steps,
               ok ? "final model, optimizer state and every loss bit-identical" : why.c_str());
}

// The same run with CUDA graphs (--cuda-graphs 1, the default) and with eager launches: every logged
// loss, the final model and the optimizer state bit-identical; on the CPU backend the graphed run
// issues fewer stream operations (its steps after the second replay the micro-steps).
template <class floatX>
void test_graphs_vs_eager(const char* name, const char* dir, TrainOptions base) {
    std::string graphed = g_tmp + "/" + dir + "_graphs", eager = g_tmp + "/" + dir + "_eager";
    long long ops[2];
    for (bool graphs : {true, false}) {
        base.output_dir = graphs ? graphed : eager;
        base.cuda_graphs = graphs;
        long long ops0 = host_stream_op_count();
        quiet_train<floatX>(base);
        ops[graphs] = host_stream_op_count() - ops0;
    }
    std::string why;
    bool ok = same_run(graphed, eager, base.max_steps, &why);
    bool fewer = !on_cpu_backend() || ops[1] < ops[0];
    th::report(ok && fewer, name, "%d steps: %s; %lld stream operations issued by the host (eager %lld)",
               base.max_steps, ok ? "losses, final model and optimizer state bit-identical" : why.c_str(), ops[1],
               ops[0]);
}

// The kill test's run: checkpoints every step, 10 steps, on the shards main() wrote.
TrainOptions kill_options() {
    TrainOptions k = tiny_options("", g_tmp + "/train.bin", g_tmp + "/val.bin");
    k.checkpoint_every = 1;
    k.max_steps = 10;
    return k;
}

// Starts `test_checkpoint --kill-run TMP OUT_DIR`: a fresh process that resumes (or starts) the kill
// test's run in out_dir. Not a plain fork: a CUDA context does not survive fork(), so on a GPU the
// child must start the device itself, as a user's resumed run does.
pid_t start_kill_run(const std::string& out_dir) {
    const char* tmp = g_tmp.c_str();
    const char* out = out_dir.c_str();
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", "test_checkpoint", "--kill-run", tmp, out, (char*)nullptr);
        _exit(127);
    }
    return pid;
}

int main(int argc, char** argv) {
    if (argc >= 2 && strcmp(argv[1], "--train-gpt2") == 0) return train_gpt2_main(argc - 1, argv + 1);
    if (argc == 4 && strcmp(argv[1], "--kill-run") == 0) {
        g_tmp = argv[2];
        matmul_init(false);
        TrainOptions k = kill_options();
        k.output_dir = argv[3];
        return resume_train<float>(k);
    }
    char tmpl[] = "/tmp/test_checkpoint_XXXXXX";
    g_tmp = mkdtemp(tmpl);
    // Removed at exit, by the process that made it only: a forked child inherits the handler, and a
    // process replaying the test for one error case (th::run_in_child) ends there, not here.
    static const pid_t owner = getpid();
    atexit([] {
        if (getpid() == owner && !getenv("KEEP_TMP")) th::run_command("rm -rf " + g_tmp);
    });
    matmul_init(false);
    std::string train = th::write_token_shard(g_tmp + "/train.bin", 600, 64, 1),
                val = th::write_token_shard(g_tmp + "/val.bin", 200, 64, 2);
    TrainOptions o = tiny_options("", train, val);
    {
        const std::string self = th::self_path(argv[0]);
        th::ChildOutput c = th::run_command(self + " --train-gpt2 --help 2>&1");
        std::string diff = th::compare_option_listing(c.text, "test/fixtures/train_gpt2_options.txt");
        th::report(th::exited_ok(c) && diff.empty(),
                   "train_gpt2 --help lists the options, values and defaults of test/fixtures/train_gpt2_options.txt",
                   "%s", diff.c_str());
        th::report(c.text.find("\nexit status: 0 the run finished, or left where --stop-after said") != std::string::npos &&
                       c.text.find("SIGTERM (143) or SIGUSR1 (138) end the run after the step in progress") !=
                           std::string::npos,
                   "train_gpt2 --help ends with the exit statuses, signals included", "%s",
                   th::last_lines(c.text).c_str());
        // --profile-step 3 brackets the run's third step, the first that only replays CUDA graphs: the
        // kernels counted between cudaProfilerStart and cudaProfilerStop are those of that step alone.
        std::string run = self + " --train-gpt2 --layers 1 --channels 32 --heads 2 --max-seq-len 16 "
                          "--vocab-size 64 -t 16 -b 2 -x 3 -v 0 -g 0 -i " + train + " -j '' --profile-step 3 2>&1";
        c = th::run_command(run);
        std::string step3 = "launches per step with CUDA graphs (the run's step 3): ";
        size_t at = c.text.find(step3), prof = c.text.find("profiled step: step 3 ran between cudaProfilerStart");
        long long replayed = at == std::string::npos ? -1 : atoll(c.text.c_str() + at + step3.size());
        size_t k = prof == std::string::npos ? std::string::npos : c.text.find(" (", prof);
        long long profiled = k == std::string::npos ? -2 : atoll(c.text.c_str() + k + 2);
        bool once = prof != std::string::npos && c.text.find("profiled step:", prof + 1) == std::string::npos;
        // Only the CPU backend counts kernels: on a GPU the bracket is checked to be printed once.
        bool counted = kernel_launch_count() >= 0;
        bool ok = th::exited_ok(c) && once && (!counted || (replayed > 0 && profiled == replayed));
        th::report(ok, "train_gpt2 --profile-step 3 brackets step 3 alone for a profiler",
                   "%lld kernels between the brackets, step 3 ran %lld%s%s", profiled, replayed, ok ? "" : "; ",
                   ok ? "" : th::last_lines(c.text).c_str());
    }

    // What would lose a run is refused before it starts: a fresh run into a directory holding another
    // run's checkpoints (its log would be truncated, its checkpoints mixed with the new ones), an
    // --export-hf directory that cannot be written (the export comes after training), and AdamW
    // settings that make every update 0/0.
    {
        const std::string self = th::self_path(argv[0]);
        const std::string tiny = self + " --train-gpt2 --layers 1 --channels 32 --heads 2 --max-seq-len 16 "
                                 "--vocab-size 64 -t 16 -b 2 -x 2 -v 0 -g 0 -i " + train + " -j '' ";
        const std::string dir = g_tmp + "/earlier_run";
        th::ChildOutput first = th::run_command(tiny + "-o " + dir + " 2>&1");
        const std::string log = slurp(dir + "/log.jsonl");
        th::ChildOutput again = th::run_command(tiny + "-o " + dir + " 2>&1");
        bool ok = th::exited_ok(first) && !th::exited_ok(again) && slurp(dir + "/log.jsonl") == log &&
                  again.text.find("holds the checkpoints of an earlier run (the newest at step 2); continue it "
                                  "with --resume") != std::string::npos;
        th::report(ok, "train_gpt2 -o DIR without --resume, DIR holding a run's checkpoints: refused, its log kept",
                   "%s", th::last_lines(again.text).c_str());
        // The run directory of the other trainer (its newest model file safetensors, as train_bert's):
        // refused by name, not misread.
        const std::string bert_dir = g_tmp + "/bert_run";
        th::run_command("rm -rf " + bert_dir + " && cp -r " + dir + " " + bert_dir);
        const std::string bert_model = bert_dir + checkpoint_file("", "model", 2);
        std::string st = slurp(bert_model);
        const uint64_t json_len = 2;
        memcpy(&st[0], &json_len, 8);
        st[8] = '{';
        st[9] = '}';
        write_bytes(bert_model, st);
        th::ChildOutput other = th::run_command(tiny + "-o " + bert_dir + " -y 2>&1");
        th::report(WIFEXITED(other.status) && WEXITSTATUS(other.status) == 1 &&
                       other.text.find(bert_model + ": the run in this directory is a train_bert run (its newest "
                                       "checkpoint, step 2): resume it with train_bert") != std::string::npos,
                   "train_gpt2 -y on a train_bert run's directory: refused, naming the trainer", "%s",
                   th::last_lines(other.text).c_str());
        // A run stopped before its first checkpoint leaves only its log: the next run, fresh or with
        // --resume (nothing to resume), starts over and keeps that log as log.jsonl.1, then .2.
        const std::string ldir = g_tmp + "/log_only";
        th::run_command("mkdir -p " + ldir + " && printf '{\"event\":\"step\",\"step\":1}\\n' > " + ldir +
                        "/log.jsonl");
        const std::string earlier = slurp(ldir + "/log.jsonl");
        th::ChildOutput fresh = th::run_command(tiny + "-o " + ldir + " -n 0 2>&1");
        std::string kept1 = slurp(ldir + "/log.jsonl.1"), run1 = slurp(ldir + "/log.jsonl");
        th::run_command("rm -f " + ldir + "/model_* " + ldir + "/state_* " + ldir + "/DONE_*");
        th::ChildOutput resumed = th::run_command(tiny + "-o " + ldir + " -n 0 -y 2>&1");
        ok = th::exited_ok(fresh) && th::exited_ok(resumed) && earlier.rfind("{\"event\":\"step\"", 0) == 0 &&
             kept1 == earlier && slurp(ldir + "/log.jsonl.2") == run1 &&
             fresh.text.find("held an earlier run's log (no checkpoint to resume from): kept as " + ldir +
                             "/log.jsonl.1") != std::string::npos;
        th::report(ok, "a log without a checkpoint in -o DIR: kept as log.jsonl.1, .2 by the runs that start over",
                   "%s", th::last_lines(fresh.text + resumed.text).c_str());
        // Validation shards the training pattern also matches: trained on, and said so (once).
        th::ChildOutput overlap = th::run_command(tiny + "-j " + train + " -x 1 2>&1");
        const std::string warned = "warning: " + train + " is both a training shard (-i " + train +
                                   ") and a validation shard (-j)";
        th::report(th::exited_ok(overlap) && overlap.text.find(warned) != std::string::npos &&
                       first.text.find("warning:") == std::string::npos,
                   "a validation shard among the training shards: trained on, with one warning line", "%s",
                   th::last_lines(overlap.text).c_str());
        // A model file whose weights hold a NaN (wpe[0][0], which every sequence reads): evaluating it
        // (-x 0) or sampling from it stops with one line, not a NaN loss or a text of one token.
        {
            const std::string fixture = "test/fixtures/gpt2_tiny_model.bin", nan_model = g_tmp + "/nan_wpe_model.bin";
            int32_t header[8];
            memcpy(header, slurp(fixture).data(), sizeof(header));
            bool planted = write_nan_model(fixture, nan_model, 1024 + 4 * (size_t)header[7] * header[6]);  // after wte
            const std::string eval_only = self + " --train-gpt2 -e " + nan_model + " -x 0 -t 16 -b 2 -i " + train;
            th::ChildOutput val = th::run_command(eval_only + " -j " + train + " -g 0 2>&1");
            const std::string tokens = th::write_numbered_tokenizer(g_tmp + "/tokenizer.bin", header[3]);
            th::ChildOutput gen = th::run_command(eval_only + " -j '' -g 4 --tokenizer " + tokens + " 2>&1");
            ok = planted && WIFEXITED(val.status) && WEXITSTATUS(val.status) == 1 &&
                 val.text.find("step 0: the validation loss is nan: the model holds non-finite values") !=
                     std::string::npos &&
                 WIFEXITED(gen.status) && WEXITSTATUS(gen.status) == 1 &&
                 gen.text.find("generation: the logits for token 1 are not finite") != std::string::npos;
            th::report(ok, "a model file with a NaN weight: -x 0's evaluation and sampling stop with one line, exit 1",
                       "exit %d, %d | %s | %s", WEXITSTATUS(val.status), WEXITSTATUS(gen.status),
                       th::last_lines(val.text).c_str(), th::last_lines(gen.text).c_str());
        }
        // A resumed run says what it changes of the recipe its checkpoint recorded (the learning rate
        // and clipping here), and nothing when its command line is the run's.
        const std::string rdir = g_tmp + "/recipe_run";
        const std::string recipe_run = self + " --train-gpt2 --layers 1 --channels 32 --heads 2 --max-seq-len 16 "
                                       "--vocab-size 64 -t 16 -b 2 -x 4 -v 0 -g 0 -i " + train + " -j '' -o " + rdir;
        th::ChildOutput part1 = th::run_command(recipe_run + " --stop-after 1 2>&1");
        th::ChildOutput same = th::run_command(recipe_run + " -y --stop-after 1 2>&1");
        th::ChildOutput changed = th::run_command(recipe_run + " -y -l 2e-3 --grad-clip 0.5 2>&1");
        const std::string notice = "resume: this run changes lr 0.001 -> 0.002, grad_clip 1 -> 0.5 (";
        ok = th::exited_ok(part1) && th::exited_ok(same) && th::exited_ok(changed) &&
             same.text.find("resuming from") != std::string::npos &&
             same.text.find("resume: this run changes") == std::string::npos &&
             changed.text.find(notice) != std::string::npos;
        th::report(ok, "train_gpt2 -y: a changed --lr and --grad-clip are said at resume, the run's own command line "
                   "says nothing", "%s", th::last_lines(changed.text).c_str());
        // Other training data is said too (another shard of the same size, --overfit-batch); the same
        // shard in another folder is the same data.
        std::filesystem::create_directories(g_tmp + "/moved");
        std::filesystem::create_directories(g_tmp + "/other");
        std::filesystem::copy_file(train, g_tmp + "/moved/train.bin");
        const std::string other_data = th::write_token_shard(g_tmp + "/other/train.bin", 600, 64, 5);
        const std::string data_run = recipe_run + " -y --stop-after 1 -x 5 ";
        th::ChildOutput moved = th::run_command(data_run + "-i " + g_tmp + "/moved/train.bin 2>&1");
        th::ChildOutput swapped = th::run_command(data_run + "-x 6 -i " + other_data + " 2>&1");
        th::ChildOutput overfit = th::run_command(data_run + "-x 7 -i " + other_data + " --overfit-batch 2>&1");
        auto said = [](const th::ChildOutput& c) {
            size_t at = c.text.find("resume: this run changes ");
            return at == std::string::npos ? std::string() : c.text.substr(at, c.text.find(" (", at) - at);
        };
        const std::string s1 = said(moved), s2 = said(swapped), s3 = said(overfit);
        ok = th::exited_ok(moved) && th::exited_ok(swapped) && th::exited_ok(overfit) &&
             s1.find("train_data") == std::string::npos &&
             s2.rfind("resume: this run changes steps 5 -> 6, train_data 1shards:", 0) == 0 &&
             s2.find(" -> 1shards:") != std::string::npos && s3 == "resume: this run changes steps 6 -> 7, overfit_batch 0 -> 1";
        th::report(ok, "train_gpt2 -y: other training data and --overfit-batch are said at resume, moved data is not",
                   "%s | %s | %s", s1.c_str(), s2.c_str(), s3.c_str());
        // --gemm-autotune 1: the first step times the GEMMs' candidate algorithms and says so; on the
        // CPU backend, whose candidates compute the same values, the losses are the untuned run's.
        th::ChildOutput untuned = th::run_command(tiny + "-x 3 2>&1"), tuned = th::run_command(tiny + "-x 3 "
                                                                                                "--gemm-autotune 1 2>&1");
        size_t at = tuned.text.find("GEMM autotune: ");
        std::string line = at == std::string::npos ? "" : tuned.text.substr(at, tuned.text.find('\n', at) - at);
        ok = th::exited_ok(untuned) && th::exited_ok(tuned) && line.find(" shapes timed (") != std::string::npos &&
             untuned.text.find("GEMM autotune") == std::string::npos && th::step_losses(tuned.text).size() == 3 &&
             (kernel_launch_count() < 0 || th::step_losses(tuned.text) == th::step_losses(untuned.text));
        th::report(ok, "train_gpt2 --gemm-autotune 1: the first step times the GEMMs and says so; the same losses",
                   "%s", line.c_str());
        FILE* f = fopen((g_tmp + "/a_file").c_str(), "wb");
        if (f) fclose(f);
        th::ChildOutput exp = th::run_command(tiny + "--export-hf " + g_tmp + "/a_file/hf 2>&1");
        ok = !th::exited_ok(exp) && exp.text.find("option --export-hf: cannot create directory") != std::string::npos &&
             th::step_losses(exp.text).empty();
        th::report(ok, "train_gpt2 --export-hf into a path it cannot create: refused before training", "%s",
                   th::last_lines(exp.text).c_str());
        // Also refused by name before anything is allocated: a head size the attention kernels do not
        // have, a shape option that contradicts the model file's shape, a depth out of range, tokens
        // per step that no micro-batch of whole sequences divides.
        const std::string model = dir + "/model_00000002.bin";
        const std::string refused[][2] = {
            {"--beta1 1", "option --beta1: 1, but AdamW's betas must be below 1"},
            {"--beta2 1", "option --beta2: 1, but AdamW's betas must be below 1"},
            {"--adam-eps 0", "option --adam-eps: must be above 0"},
            {"--heads 32", "option --heads: head size C/NH = 32/32 = 1; the attention kernels take 16, 32, 64 or 128"},
            {"-e " + model + " --channels 64", "option --channels: 64, but the model from " + model + " has 32"},
            {"-e d129", "option --init: d129 is not a depth from d1 to d128"},
            {"-b auto -d 40", "option --total-batch-size: 40 tokens per step is not a multiple of T=16"},
            {"-g 4 --tokenizer " + g_tmp + "/no_tokenizer.bin", "option --tokenizer: cannot open " + g_tmp +
                                                                 "/no_tokenizer.bin"},
            // Options that would change nothing in this run: refused, not silently ignored.
            {"--momentum 0.5", "option --momentum: applies to --optimizer sgd only (this run's optimizer is adamw)"},
            {"--optimizer sgd --beta2 0.9", "option --beta2: applies to --optimizer adamw and adamw8bit only"},
            {"--adafactor-clip 2", "option --adafactor-clip: applies to --optimizer adafactor only"},
            {"--loss-scale 1024", "option --loss-scale: applies to --precision fp16 only (this run's precision is "
                                  "fp32)"},
            {"--precision tf32 --loss-scale-window 10", "option --loss-scale-window: applies to --precision fp16 only "
                                                        "(this run's precision is tf32)"},
            {"--prompt hello", "option --prompt: no samples are drawn (--gen-tokens 0)"},
            {"--sample-every 1", "option --sample-every: no samples are drawn (--gen-tokens 0)"},
            {"--moe-top-k 1", "option --moe-top-k: the model has no experts (give --moe-experts E)"},
            {"-e " + model + " --moe-capacity 2", "option --moe-capacity: the model has no experts (none in " + model +
                                                  ")"},
            {"--stop-after 1", "option --stop-after: needs --output-dir"},
            {"--log-ranks", "option --log-ranks: needs --output-dir"},
            {"-x 0", "option --max-steps: 0 (no training) leaves nothing to do; ask for a validation loss (-j, "
                     "with -v above 0), a sample (-g) or --export-hf"},
            {"-v 5", "option --val-every: there is no validation data (-j '')"},
            {"-v 0 -m 3", "option --val-steps: there is no validation data (-j '')"},
            {"-x 0 -g 4 -o " + g_tmp + "/eval_only", "option --output-dir: --max-steps 0 trains nothing, so it "
                                                      "writes no checkpoints or log"},
            {"-x 0 -g 4 -s 1", "option --sample-every: --max-steps 0 has no steps to sample between"},
            {"-x 0 -g 4 --precision fp8", "option --precision: fp8's delayed scaling takes its scales from earlier "
                                          "steps"},
            {"--profile-step 3", "option --profile-step: 3 is past the 2 steps this run takes"},
            {"--attention-backward wgmma", "option --attention-backward: wgmma applies to --precision bf16 and fp16 "
                                           "only (this run's precision is fp32)"},
            {"--precision bf16 --attention-backward wgmma", "option --attention-backward: wgmma takes head size 64; "
                                                            "this model's is 16"},
            {"--attention-backward mma-sum", "option --attention-backward: mma-sum applies to --precision bf16 and "
                                             "fp16 only (this run's precision is fp32)"},
            {"--precision bf16 --attention-backward mma-sum", "option --attention-backward: mma-sum takes head size "
                                                              "64; this model's is 16"},
            {"--attention-backward tune", "option --attention-backward: tune applies to --precision bf16 and fp16 "
                                          "only (this run's precision is fp32)"},
            {"--precision fp16 --attention-backward tune", "option --attention-backward: tune takes head size 64; "
                                                           "this model's is 16 (one form there: nothing to time)"},
            {"--attention-backward mma", "option --attention-backward: mma applies to --precision bf16 and fp16 "
                                         "only (this run's precision is fp32)"},
            {"-x 0 -g 4 --precision bf16 --attention-backward mma", "option --attention-backward: --max-steps 0 "
                                                                    "trains nothing, so it runs no backward"},
            {"-x 0 -g 4 --bias-grad kernels", "option --bias-grad: --max-steps 0 trains nothing, so it runs no "
                                              "backward"},
            {"--bias-grad bgradb", "option --bias-grad: 'bgradb' is not one of auto, gemm, kernels"},
            {"--overlap-wgrad 1 --precision fp8", "option --overlap-wgrad: fp8's weight gradients share their "
                                                  "operands' casts with the input gradients"},
            {"-x 0 -g 4 --overlap-wgrad 1", "option --overlap-wgrad: --max-steps 0 trains nothing, so it runs no "
                                            "backward"}};
        // A model whose first weight (token 0's embedding, tied to the classifier) is NaN: every
        // logits row and so the loss is NaN at step 1. The run stops there, before any checkpoint.
        {
            std::string nan_model = g_tmp + "/nan_model.bin";
            bool planted = write_nan_model(model, nan_model, 1024);  // after llm.c's 256-int header
            th::ChildOutput c = th::run_command(tiny + "-e " + nan_model + " -n 1 -o " + g_tmp + "/nan_run 2>&1");
            bool ok = planted && !th::exited_ok(c) &&
                      c.text.find("step 1: the loss is nan: training diverged") != std::string::npos &&
                      complete_checkpoints(g_tmp + "/nan_run").empty();
            th::report(ok, "train_gpt2: a loss that is not finite stops the run, before any checkpoint", "%s",
                       th::last_lines(c.text).c_str());
        }
        // Device memory too small for the model's state (the CPU backend's virtual device, sized by
        // SIMT_DEVICE_MEMORY): the failed allocation's error also gives its size, the free memory and
        // what helps.
        if (kernel_launch_count() >= 0) {
            th::ChildOutput c = th::run_command("SIMT_DEVICE_MEMORY=1M " + tiny + " 2>&1");
            bool ok = !th::exited_ok(c) && c.text.find("[CUDA ERROR] out of memory") != std::string::npos &&
                      c.text.find("  it asked for ") != std::string::npos &&
                      c.text.find(" MiB; the device has 1.0 MiB free of 1.0 MiB: a smaller model or micro-batch") !=
                          std::string::npos;
            th::report(ok, "train_gpt2 on a device too small for it: out of memory, with the size asked for, the free "
                           "memory and what helps",
                       "%s", th::last_lines(c.text).c_str());
        }
        // A sample asked for (-g N) that the model cannot draw (the bundled tokenizer's <|endoftext|>,
        // 50256, is outside a 64-token vocabulary) is refused before training; the default -g skips it,
        // saying why, after training.
        {
            const std::string small = self + " --train-gpt2 --layers 1 --channels 32 --heads 2 --max-seq-len 16 "
                                      "--vocab-size 64 -t 16 -b 2 -x 2 -v 0 -i " + train + " -j '' ";
            th::ChildOutput asked = th::run_command(small + "-g 4 2>&1"), by_default = th::run_command(small + "2>&1");
            bool ok = WIFEXITED(asked.status) && WEXITSTATUS(asked.status) == 2 &&
                      asked.text.find("option --gen-tokens: token 50256 (<|endoftext|> or the prompt's, from ") !=
                          std::string::npos &&
                      th::step_losses(asked.text).empty() && th::exited_ok(by_default) &&
                      by_default.text.find("sampling skipped: token 50256") != std::string::npos &&
                      th::step_losses(by_default.text).size() == 2;
            th::report(ok, "train_gpt2 -g 4 with a vocabulary the tokenizer's <|endoftext|> is outside: refused before "
                           "training (exit 2); by default the sample is skipped after it", "%s | %s",
                       th::last_lines(asked.text).c_str(), th::last_lines(by_default.text).c_str());
        }
        for (const auto& r : refused) {
            th::ChildOutput c = th::run_command(tiny + r[0] + " 2>&1");
            th::report(!th::exited_ok(c) && c.text.find(r[1]) != std::string::npos && th::step_losses(c.text).empty(),
                       ("train_gpt2 " + r[0] + ": refused").c_str(), "%s", th::last_lines(c.text).c_str());
        }
        // A --tokenizer file that is not one stops the run as every bad file does: one line, exit 1
        // (exit 2 is for a bad option), before training.
        {
            const std::string bad = g_tmp + "/garbage_tokenizer.bin";
            write_bytes(bad, "garbage\n");
            for (const std::string& use : {"-g 4 --tokenizer " + bad, "-g 4 --tokenizer " + bad + " --prompt hi"}) {
                th::ChildOutput c = th::run_command(tiny + use + " 2>&1");
                th::report(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 1 &&
                               c.text.find("error: option --") != std::string::npos &&
                               c.text.find(bad + ": too short for a tokenizer header") != std::string::npos &&
                               th::step_losses(c.text).empty(),
                           use.find("--prompt") == std::string::npos
                               ? "train_gpt2 --tokenizer GARBAGE: one line, exit 1"
                               : "train_gpt2 --tokenizer GARBAGE --prompt hi: one line, exit 1",
                           "exit %d: %s", WEXITSTATUS(c.status), th::last_lines(c.text).c_str());
            }
        }
        // A checkpoint that cannot be written whole (its state file's temporary path taken by a
        // directory, as a full disk would fail it) stops the run, and the model file already written
        // for that step goes too: on a full disk it would hold the space the next attempt needs.
        {
            const std::string fdir = g_tmp + "/failed_save";
            th::run_command("mkdir -p " + fdir + "/state_00000001_00000.bin.tmp");
            th::ChildOutput c = th::run_command(tiny + "-n 1 -o " + fdir + " 2>&1");
            bool gone = access((fdir + "/model_00000001.bin").c_str(), F_OK) != 0;
            th::report(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 1 && gone &&
                           c.text.find("checkpoint at step 1: cannot write " + fdir + "/state_00000001_00000.bin.tmp") !=
                               std::string::npos,
                       "train_gpt2: a checkpoint that fails half-written stops the run and leaves none of its files",
                       "exit %d, model file %s: %s", WEXITSTATUS(c.status), gone ? "removed" : "left",
                       th::last_lines(c.text).c_str());
        }
        // Options found wrong only once the model or the run's steps are known exit 2 as every bad
        // option does (--help's statuses), not 1 as bad data: the tokens per step, the attention
        // backward's head size, --profile-step, an --output-dir that cannot be a directory.
        {
            const std::string a_file = g_tmp + "/a_file";  // the file made above
            const std::vector<std::array<std::string, 2>> late = {
                {"-d 48", "option --total-batch-size: 48 is not a multiple of B*T = 32"},
                {"--precision bf16 --attention-backward wgmma", "option --attention-backward: wgmma takes head size 64"},
                {"--profile-step 3", "option --profile-step: 3 is past the 2 steps this run takes"},
                {"-o " + a_file + "/run", "option --output-dir: cannot create directory " + a_file}};
            for (const auto& r : late) {
                th::ChildOutput c = th::run_command(tiny + r[0] + " 2>&1");
                th::report(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 2 && c.text.find(r[1]) != std::string::npos,
                           ("train_gpt2 " + r[0] + ": refused with exit 2").c_str(), "exit %d: %s",
                           WEXITSTATUS(c.status), th::last_lines(c.text).c_str());
            }
        }
        // The attention backward on a model of head size 64 (bf16): by default (auto) the wgmma kernel
        // where the device has it, and the start-up line says which. The first step's loss (the forward
        // alone) is --attention-backward mma's bit for bit, and the next ones, after updates from
        // gradients whose fp32 sums ran in another order (so a few bf16 elements differ by an ulp, 2^-8
        // relative), within 1e-3 of it; --attention-backward wgmma-3-red-sum (the kernel's registers capped
        // for 3 blocks per SM, dQ added by reductions in L2 and summed from its slices by each query tile's
        // last writer) gives the default's losses bit for bit, and --attention-backward mma-sum mma's. On the
        // CPU backend the kernel is checked to have run; on a GPU this needs wgmma.
        if (wgmma_supported()) {
            const std::string hs64 = self + " --train-gpt2 --layers 1 --channels 128 --heads 2 "
                                     "--max-seq-len 16 --vocab-size 64 -t 16 -b 2 -x 3 -v 0 -g 0 -i " + train +
                                     " -j '' --precision bf16 ";
            const std::string cov = g_tmp + "/wgmma_coverage";
            th::run_command("mkdir -p " + cov);
            th::ChildOutput mma = th::run_command(hs64 + "--attention-backward mma 2>&1");
            th::ChildOutput wg = th::run_command("SIMT_COVERAGE_DIR=" + cov + " " + hs64 + "2>&1");
            th::ChildOutput wg3 = th::run_command(hs64 + "--attention-backward wgmma-3-red-sum 2>&1");
            th::ChildOutput mma_sum = th::run_command(hs64 + "--attention-backward mma-sum 2>&1");
            th::ChildOutput tuned = th::run_command(hs64 + "--attention-backward tune 2>&1");
            std::vector<double> a = th::step_losses(mma.text), b = th::step_losses(wg.text),
                                b3 = th::step_losses(wg3.text), a_sum = th::step_losses(mma_sum.text),
                                b_tuned = th::step_losses(tuned.text);
            bool close = a.size() == 3 && b.size() == 3 && a[0] == b[0];
            for (size_t i = 1; close && i < 3; i++) close = std::fabs(a[i] - b[i]) <= 1e-3 * std::fabs(a[i]);
            bool ran = kernel_launch_count() < 0 ||
                       th::run_command("cat " + cov + "/* | grep -qx attention_backward_wgmma_kernel").status == 0;
            bool said = wg.text.find("| attention backward: wgmma\n") != std::string::npos &&
                        mma.text.find("| attention backward: mma.sync\n") != std::string::npos &&
                        wg3.text.find("| attention backward: wgmma, registers for 3 blocks per SM, dQ by reductions "
                                      "in L2, dQ summed by the tiles' last writers\n") != std::string::npos &&
                        mma_sum.text.find("| attention backward: mma.sync, dQ summed by the tiles' last writers\n") !=
                            std::string::npos &&
                        tuned.text.find("| attention backward: wgmma in the fastest of its 8 forms, timed at the first "
                                        "step\n") != std::string::npos;
            // --attention-backward tune: the one shape timed at the first step (8 forms), the form it took
            // named as --attention-backward takes it, the default's losses bit for bit
            const size_t at = tuned.text.find("attention backward tuned: 1 shape timed in ");
            const size_t form = tuned.text.find("  B=2 T=16 NH=2 HS=64 causal: wgmma", at);
            const bool tune_said = at != std::string::npos && form != std::string::npos &&
                                   tuned.text.find("(8 forms timed", form) != std::string::npos;
            th::report(th::exited_ok(mma) && th::exited_ok(wg) && th::exited_ok(wg3) && th::exited_ok(mma_sum) &&
                           th::exited_ok(tuned) && close && b3 == b && a_sum == a && b_tuned == b && ran && said &&
                           tune_said,
                       "train_gpt2 (HS=64, bf16): the attention backward on wgmma by default, step 1's loss "
                       "--attention-backward mma's, steps 2-3 within 1e-3; wgmma-3-red-sum's and tune's losses the "
                       "default's, mma-sum's mma's; tune names the form it took",
                       "wgmma's losses %s, wgmma-3-red-sum's %s, tune's %s, mma's %s, mma-sum's %s%s%s%s",
                       th::join(b).c_str(), th::join(b3).c_str(), th::join(b_tuned).c_str(), th::join(a).c_str(),
                       th::join(a_sum).c_str(), ran ? "" : "; attention_backward_wgmma_kernel never ran",
                       said ? "" : "; the start-up lines do not name the kernels",
                       tune_said ? "" : "; tune's first step does not say what it took");
        }
        // --bias-grad: the bias gradients in the weight GEMM (gemm) or by the reduction kernels (kernels;
        // auto takes them on Hopper, as the CPU backend's default H100 profile). Both sum the same fp32
        // terms in another order, each within 32 eps of the exact sum at these 32 rows, so step 1's loss
        // (the forward alone) is the same and the next ones, after AdamW updates from those gradients,
        // within 1e-5 (far more than that difference moves them); auto is one of the two bit for bit. On
        // the CPU backend the kernels that ran say which route was taken.
        {
            const std::string run = self + " --train-gpt2 --layers 1 --channels 32 --heads 2 --max-seq-len 16 "
                                    "--vocab-size 64 -t 16 -b 2 -x 3 -v 0 -g 0 -i " + train + " -j '' ";
            std::vector<std::vector<double>> losses;
            std::vector<std::string> ran;  // the bias kernels each run launched, by name
            bool ok = true;
            for (const char* route : {"gemm", "kernels", "auto"}) {
                const std::string cov = g_tmp + "/bias_grad_" + route;
                th::run_command("mkdir -p " + cov);
                th::ChildOutput c = th::run_command("SIMT_COVERAGE_DIR=" + cov + " " + run + "--bias-grad " + route +
                                                    " 2>&1");
                ok = ok && th::exited_ok(c);
                losses.push_back(th::step_losses(c.text));
                ran.push_back(th::run_command("cat " + cov + "/* 2>/dev/null | grep -xE "
                                              "'bias_(backward_partial|accumulate)_kernel' | sort -u | tr '\\n' ' '")
                                  .text);
            }
            bool close = losses[0].size() == 3 && losses[1].size() == 3 && losses[0][0] == losses[1][0];
            for (size_t i = 1; close && i < 3; i++)
                close = std::fabs(losses[0][i] - losses[1][i]) <= 1e-5 * std::fabs(losses[1][i]);
            const bool hopper = !matmul_bias_grad_in_gemm();  // this device's auto
            bool same_as_auto = losses[2] == losses[hopper ? 1 : 0];
            bool routes = kernel_launch_count() < 0 ||
                          (ran[0] == "bias_accumulate_kernel " && ran[1] == "bias_backward_partial_kernel " &&
                           ran[2] == ran[hopper ? 1 : 0]);
            th::report(ok && close && same_as_auto && routes,
                       "train_gpt2 --bias-grad gemm | kernels | auto: step 1's loss the same, steps 2-3 within 1e-5, "
                       "auto one of them bit for bit",
                       "gemm's losses %s (ran %s), kernels' %s (ran %s), auto's %s (ran %s)",
                       th::join(losses[0]).c_str(), ran[0].c_str(), th::join(losses[1]).c_str(), ran[1].c_str(),
                       th::join(losses[2]).c_str(), ran[2].c_str());
        }
        // --overlap-wgrad 1: the blocks' weight gradients on a second stream give the same losses, bit for
        // bit, as one stream does, with the CPU backend running every stream's work as late as the events
        // allow (SIMT_STREAMS=adversarial): a missing wait shows as other numbers. Two blocks (the joins
        // between them), eager and graphed, bf16 with every layer recomputed, two micro-steps with the
        // bias gradients in the GEMMs.
        {
            const std::string run = self + " --train-gpt2 --layers 2 --channels 32 --heads 2 --max-seq-len 16 "
                                    "--vocab-size 64 -t 16 -b 2 -x 3 -v 0 -g 0 -i " + train + " -j '' ";
            for (const char* extra : {"", "--cuda-graphs 0 ", "--precision bf16 --recompute layer ",
                                      "--bias-grad gemm -d 64 "}) {
                th::ChildOutput one = th::run_command(run + extra + "2>&1");
                th::ChildOutput two = th::run_command("SIMT_STREAMS=adversarial " + run + extra + "--overlap-wgrad 1 2>&1");
                std::vector<double> a = th::step_losses(one.text), b = th::step_losses(two.text);
                bool said = two.text.find("| weight gradients: on a second stream\n") != std::string::npos &&
                            one.text.find("weight gradients:") == std::string::npos;
                const bool ran = th::exited_ok(one) && th::exited_ok(two);
                const std::string why = !ran ? "; " + th::last_lines(one.text + two.text)
                                        : !said ? std::string("; the start-up line does not say so") : std::string();
                th::report(ran && a.size() == 3 && a == b && said,
                           ("train_gpt2 " + std::string(extra) + "--overlap-wgrad 1 (adversarial streams): the losses "
                            "of one stream, bit for bit").c_str(),
                           "one stream %s, two %s%s", th::join(a).c_str(), th::join(b).c_str(), why.c_str());
            }
        }
        // -m above what the validation data holds (200 tokens: 6 batches of B=2 x T=16) reads those 6
        // once each, as -m 6 does, instead of reading some twice.
        th::ChildOutput all = th::run_command(tiny + "-j " + val + " -v 2 -m 6 2>&1");
        th::ChildOutput more = th::run_command(tiny + "-j " + val + " -v 2 -m 50 2>&1");
        std::vector<std::string> want = th::val_loss_lines(all.text), got = th::val_loss_lines(more.text);
        ok = th::exited_ok(all) && th::exited_ok(more) && want.size() == 2 && got == want &&
                  more.text.find("validation: 6 batches per evaluation, all that " + val + " holds for B=2 T=16 "
                                 "(--val-steps 50 asked for more)") != std::string::npos &&
                  all.text.find("validation:") == std::string::npos;
        th::report(ok, "train_gpt2 -m above the validation data's batches: each evaluation reads them all once",
                   "%s\n%s", th::last_lines(all.text).c_str(), th::last_lines(more.text).c_str());
        // -x 0: no training. The model of the run above after its 2 steps, loaded and evaluated with no
        // gradients or optimizer state, gives the validation loss that run printed after step 2; and
        // without training data (-i names no file). Its activations are one layer's, with no gradient
        // buffers: fewer bytes than the training run's.
        th::ChildOutput trained = th::run_command(tiny + "-j " + val + " -v 2 -m 6 -o " + g_tmp + "/eval_src 2>&1");
        th::ChildOutput eval = th::run_command(tiny + "-j " + val + " -v 1 -m 6 -x 0 -i " + g_tmp + "/none.bin -e " +
                                               g_tmp + "/eval_src/model_00000002.bin 2>&1");
        std::vector<std::string> before = th::val_loss_lines(trained.text), after = th::val_loss_lines(eval.text);
        ok = th::exited_ok(trained) && th::exited_ok(eval) && before.size() == 2 && after.size() == 1 &&
             after[0].substr(after[0].find("val loss")) == before[1].substr(before[1].find("val loss")) &&
             th::step_losses(eval.text).empty() &&
             eval.text.find("no training (--max-steps 0): the model as loaded, its validation loss") !=
                 std::string::npos &&
             eval.text.find("gradients              0.0 MiB") != std::string::npos &&
             eval.text.find("optimizer              0.0 MiB") != std::string::npos;
        const double train_b = th::anatomy_bytes_per_param(trained.text, "activations"),
                     eval_b = th::anatomy_bytes_per_param(eval.text, "activations");
        ok = ok && eval_b > 0 && eval_b < train_b && eval.text.find("forward only: one layer's") != std::string::npos;
        th::report(ok, "train_gpt2 -x 0 -e MODEL: no training, no gradients or optimizer state, one layer's "
                   "activations; the model's val loss", "activations %.2f B/param (training %.2f)\n%s\n%s", eval_b,
                   train_b, th::last_lines(trained.text).c_str(), th::last_lines(eval.text).c_str());
    }

    // Stop and resume, in each precision and with what moves the data position.
    // A process replaying the test for one run_in_child case below (th::replaying()) needs only the
    // "resume" run's checkpoints: it skips the other runs up to the signal handler's case, which would
    // make every replay nearly as long as the whole test (on a GPU each program run starts a context).
    const bool replaying = th::replaying();
    if (!replaying) test_resume<float>("resume fp32 (stop at a checkpoint)", "at", o, 4);
    test_resume<float>("resume fp32 (stop between checkpoints)", "resume", o, 3);
    if (!replaying) {
        test_resume<__nv_bfloat16>("resume bf16 (master weights)", "bf16", o, 5);
        TrainOptions shuf = o;
        shuf.shuffle = true;
        shuf.total_batch = 2 * o.B * o.T;  // 2 micro-steps: 16 batches over 18 per epoch
        shuf.max_steps = 14;                      // ... so the run crosses into epoch 2
        test_resume<float>("resume with shuffling, accumulation, epoch boundary", "shuffle", shuf, 9);
        // fp16 with a planted huge loss scale: the first steps overflow and are skipped, the scale halves
        // each time, and doubles after every loss_scale_window clean steps; the log counts the skipped
        // steps. Stopping and resuming keeps the scale, its growth tracker and the skip count.
        TrainOptions fp16 = o;
        fp16.loss_scale = 4194304.f;  // 2^22: dlogits of up to 2^22/(B*T) = 2^17 overflow fp16
        fp16.loss_scale_window = 2;
        test_resume<__half>("resume fp16 with dynamic loss scaling", "fp16", fp16, 4);
        {
            std::string log = slurp(g_tmp + "/fp16_straight/log.jsonl");
            std::vector<double> scales;
            std::vector<bool> skipped;
            for (size_t at = log.find("\"loss_scale\":"); at != std::string::npos;
                 at = log.find("\"loss_scale\":", at + 1)) {
                scales.push_back(atof(log.c_str() + at + 13));
                skipped.push_back(log.compare(log.find("\"skipped\":", at) + 10, 4, "true") == 0);
            }
            // Expected: halve after each skipped step, double after 2 clean steps in a row.
            bool ok = scales.size() == 8 && skipped[0];
            int clean = 0;
            for (size_t k = 0; ok && k + 1 < scales.size(); k++) {
                double next = skipped[k] ? scales[k] / 2 : (++clean % 2 == 0 ? scales[k] * 2 : scales[k]);
                if (skipped[k]) clean = 0;
                ok = scales[k + 1] == next;
            }
            int n_skipped = (int)std::count(skipped.begin(), skipped.end(), true);
            th::report(ok && n_skipped > 0 && n_skipped < 8,
                       "fp16 loss scale: halves on overflow (step skipped), doubles "
                       "after 2 clean steps", "%d of %zu steps skipped, scale %g -> %g", n_skipped, scales.size(),
                       scales.empty() ? 0 : scales.front(), scales.empty() ? 0 : scales.back());
        }
        // fp8: the GEMMs' amax histories and scales go through the checkpoint too.
        TrainOptions f8 = o;
        f8.fp8 = true;
        test_resume<__nv_bfloat16>("resume fp8 (delayed-scaling states)", "fp8", f8, 3);
        // Every optimizer's state goes through the checkpoint byte for byte.
        TrainOptions o8 = o, sgd = o, af = o;
        o8.opt.kind = OptimizerKind::AdamW8bit;
        test_resume<__nv_bfloat16>("resume AdamW 8-bit (bf16)", "adamw8bit", o8, 3);
        sgd.opt.kind = OptimizerKind::SGD;
        sgd.opt.nesterov = true;
        test_resume<float>("resume SGD Nesterov momentum", "sgd", sgd, 5);
        af.opt.kind = OptimizerKind::Adafactor;
        af.opt.adafactor.use_first_moment = true;
        af.opt.adafactor.beta1 = 0.9;
        test_resume<float>("resume Adafactor with first moment", "adafactor", af, 3);

        // CUDA graphs against eager launches, for the techniques a micro-step can use.
        test_graphs_vs_eager<float>("CUDA graphs == eager: fp32", "graphs_fp32", o);
        test_graphs_vs_eager<float>("CUDA graphs == eager: gradient accumulation (2 micro-steps)", "graphs_accum",
                                    shuf);
        TrainOptions rc = o;
        rc.recompute = Recompute::Layer;
        test_graphs_vs_eager<float>("CUDA graphs == eager: --recompute layer", "graphs_recompute", rc);
        test_graphs_vs_eager<__nv_bfloat16>("CUDA graphs == eager: bf16", "graphs_bf16", o);
        test_graphs_vs_eager<__half>("CUDA graphs == eager: fp16 with dynamic loss scaling (recaptured per scale)",
                                     "graphs_fp16", fp16);
        test_graphs_vs_eager<__nv_bfloat16>("CUDA graphs == eager: fp8", "graphs_fp8", f8);
        TrainOptions moe = shuf;
        moe.moe_experts = 4;
        moe.moe_every = 1;
        test_graphs_vs_eager<float>("CUDA graphs == eager: Mixture-of-Experts blocks, 2 micro-steps", "graphs_moe",
                                    moe);

        // kill -9 at random moments while checkpointing every step; each time resume where it died.
        {
            std::string straight = g_tmp + "/kill_straight", resumed = g_tmp + "/kill_resumed";
            auto t0 = std::chrono::steady_clock::now();
            int status;
            waitpid(start_kill_run(straight), &status, 0);
            bool straight_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
            // Kill after 10-40% of an uninterrupted run's time (start-up included): on the CPU backend
            // every attempt gets somewhere, on any machine and under ASan, and most die mid-run or
            // mid-write. On a GPU the start-up (the CUDA context, cuBLASLt) is most of so short a run,
            // so while attempts die before checkpointing anything new, the kill moves later by half.
            double run_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
            double later = 1;
            uint64_t x = 99;
            int kills = 0, guard = 0, newest = 0;
            bool finished = false;
            while (straight_ok && !finished && guard++ < 40) {
                pid_t pid = start_kill_run(resumed);
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                usleep((useconds_t)(run_us * later * (0.1 + 0.3 * (x % 1000) / 1000.0)));
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                finished = WIFEXITED(status) && WEXITSTATUS(status) == 0;  // it ended before the kill
                kills += WIFSIGNALED(status);
                std::vector<int> done = complete_checkpoints(resumed);
                int now = done.empty() ? 0 : done.back();
                if (now == newest) later *= 1.5;
                newest = now;
            }
            std::string why = straight_ok ? "" : "the uninterrupted run failed";
            bool ok = straight_ok && same_run(straight, resumed, kill_options().max_steps, &why);
            if (!ok) th::run_command("diff " + straight + "/log.jsonl " + resumed + "/log.jsonl >&2");
            th::report(ok && kills > 0, "kill -9 at random moments, resume each time", "%d kills: %s", kills,
                       ok ? "final model, state and losses bit-identical to the uninterrupted run" : why.c_str());
        }

        // Ctrl-C in the middle of a run with -o and no checkpoint due (-n 0): the run stops after the step
        // in progress with a checkpoint of it and exit status 130, and resuming from that checkpoint gives
        // the model, optimizer state and losses of a run never interrupted. SIGTERM without -o: the run
        // stops after its step, says nothing was saved, exit status 143.
        {
            const std::string self = th::self_path(argv[0]);
            const std::string run = self + " --train-gpt2 --layers 1 --channels 32 --heads 2 --max-seq-len 16 "
                                    "--vocab-size 64 -t 16 -b 2 -x 5000 -v 0 -g 0 -n 0 -i " + train + " -j '' ";
            const std::string dir = g_tmp + "/sigint_run", straight = g_tmp + "/sigint_straight";
            th::ChildOutput c = th::signal_when(run + "-o " + dir, g_tmp + "/sigint_run.txt", "/5000 | loss", SIGINT);
            long long stopped = th::number_after(c.text, "stopped by SIGINT (Ctrl-C) after step ");
            bool told = c.text.find("signal received: stopping after the step in progress") != std::string::npos &&
                        c.text.find(" of 5000; continue with --resume (checkpoint in " + dir + ")") !=
                            std::string::npos;
            std::vector<int> done = complete_checkpoints(dir);
            bool ok = WIFEXITED(c.status) && WEXITSTATUS(c.status) == 130 && told && stopped >= 1 &&
                      done == std::vector<int>{(int)stopped};
            std::string why = ok ? "" : th::last_lines(c.text);
            if (ok) {
                th::ChildOutput resumed = th::run_command(run + "-o " + dir + " -y --stop-after 2 2>&1");
                th::ChildOutput whole = th::run_command(run + "-o " + straight + " --stop-after " +
                                                        std::to_string(stopped + 2) + " 2>&1");
                ok = th::exited_ok(resumed) && th::exited_ok(whole) && same_run(straight, dir, (int)stopped + 2, &why);
            }
            th::report(ok,
                       "Ctrl-C mid-run: stops after the step with a checkpoint (exit 130); resumed == uninterrupted",
                       "stopped after step %lld, %zu checkpoint(s), the newest %d; %s", stopped, done.size(),
                       done.empty() ? 0 : done.back(),
                       ok ? "2 steps on: model, state and losses bit-identical" : why.c_str());

            const std::string no_output = self + " --train-gpt2 --layers 1 --channels 32 --heads 2 --max-seq-len 16 "
                                          "--vocab-size 64 -t 16 -b 2 -x 5000 -v 0 -g 0 -i " + train + " -j ''";
            c = th::signal_when(no_output, g_tmp + "/sigterm_run.txt", "/5000 | loss", SIGTERM);
            ok = WIFEXITED(c.status) && WEXITSTATUS(c.status) == 143 &&
                 th::number_after(c.text, "stopped by SIGTERM after step ") >= 1 &&
                 c.text.find(" of 5000; nothing saved (no --output-dir)") != std::string::npos;
            th::report(ok, "SIGTERM mid-run without -o: stops after the step, says nothing was saved (exit 143)", "%s",
                       th::last_lines(c.text).c_str());

            // Ctrl-C during what follows the last step (here the final validation, long on purpose: a
            // resumed run whose first step validates nothing) ends the run at once, not with exit 0 after
            // it: the last step's checkpoint is written, and --resume does the rest again.
            const std::string big_val = th::write_token_shard(g_tmp + "/big_val.bin", 400000, 64, 9);
            const std::string tail = self + " --train-gpt2 --layers 1 --channels 32 --heads 2 --max-seq-len 16 "
                                     "--vocab-size 64 -t 16 -b 2 -x 3 -g 0 -i " + train + " -o " + g_tmp + "/sig_tail ";
            th::ChildOutput first = th::run_command(tail + "-v 0 -j '' --stop-after 1 2>&1");
            c = th::signal_when(tail + "-y -v 1000 -m 5000 -j " + big_val, g_tmp + "/sig_tail.txt",
                                "checkpoint: " + g_tmp + "/sig_tail/model_00000003.bin", SIGINT);
            std::vector<int> tail_done = complete_checkpoints(g_tmp + "/sig_tail");
            ok = th::exited_ok(first) && c.status != -1 && !(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0) &&
                 c.text.find("step 3 | val loss") == std::string::npos && tail_done == std::vector<int>({1, 3});
            th::report(ok,
                       "Ctrl-C during the final validation: the run ends there (not exit 0), its last checkpoint kept",
                       "status %d, checkpoints %zu, the newest %d", c.status, tail_done.size(),
                       tail_done.empty() ? -1 : tail_done.back());
        }
    }
    // The handler itself: a second signal ends the process at once (the signal's default action);
    // the handlers found are restored when the run's StopOnSignal goes.
    {
        th::ChildOutput twice = th::run_in_child([] {
            Distributed one;
            StopOnSignal stop(one);
            raise(SIGINT);
            if (stop.requested(one) != SIGINT) exit(3);
            raise(SIGINT);
            exit(4);  // not reached
        });
        th::report(WIFSIGNALED(twice.status) && WTERMSIG(twice.status) == SIGINT &&
                       twice.text.find("again to stop at once") != std::string::npos,
                   "a second SIGINT ends the process at once", "status %d: %s", twice.status, twice.text.c_str());
        bool restored = true;
        for (int sig : {SIGINT, SIGTERM, SIGUSR1}) {
            struct sigaction before, after;
            sigaction(sig, nullptr, &before);
            {
                Distributed one;
                StopOnSignal stop(one);
            }
            sigaction(sig, nullptr, &after);
            restored &= before.sa_handler == after.sa_handler;
        }
        th::report(restored, "StopOnSignal restores the SIGINT, SIGTERM and SIGUSR1 handlers it found", "");
    }

    // A checkpoint whose DONE marker is missing (killed between files) or whose files are still
    // temporaries is never the one resumed from.
    {
        std::string dir = g_tmp + "/resume_straight";  // checkpoints 2, 4, 6, 8
        unlink(checkpoint_file(dir, "DONE", 8).c_str());
        rename(checkpoint_file(dir, "model", 6).c_str(), (checkpoint_file(dir, "model", 6) + ".tmp").c_str());
        std::vector<int> done = complete_checkpoints(dir);
        th::report(done == std::vector<int>({2, 4, 6}), "checkpoint without DONE marker is not complete",
                   "complete: %zu checkpoints, newest %d (8 has no marker)", done.size(), done.empty() ? -1 : done.back());
        std::string err;
        TrainState st;
        bool refused = !read_train_state(state_file(dir, 6, 0) + ".missing", &st, &err);
        th::report(refused && err.find("cannot open") != std::string::npos, "missing state file refused", "%s", err.c_str());
    }

    // keep-last-K deletes the older checkpoints, marker first.
    {
        TrainOptions k = o;
        k.output_dir = g_tmp + "/keep";
        k.checkpoint_every = 1;
        k.keep_checkpoints = 2;
        quiet_train<float>(k);
        std::vector<int> done = complete_checkpoints(k.output_dir);
        bool gone = slurp(checkpoint_file(k.output_dir, "model", 5)).rfind("<missing", 0) == 0 &&
                    slurp(state_file(k.output_dir, 5, 0)).rfind("<missing", 0) == 0;
        th::report(done == std::vector<int>({7, 8}) && gone, "keep the newest K checkpoints",
                   "%zu left (newest %d), older model and state files deleted: %s", done.size(), done.back(),
                   gone ? "yes" : "no");
    }

    // Resuming with settings that would change the run is refused with the setting named.
    {
        TrainOptions k = o;
        k.output_dir = g_tmp + "/resume_resumed";
        auto expect_refusal = [&](const char* name, TrainOptions changed, const char* reason) {
            th::ChildOutput child = th::run_in_child([&] { resume_train<float>(changed); });
            bool ok = WIFEXITED(child.status) && WEXITSTATUS(child.status) != 0 &&
                      child.text.find(reason) != std::string::npos;
            while (!child.text.empty() && child.text.back() == '\n') child.text.pop_back();
            th::report(ok, name, "%s", child.text.c_str());
        };
        TrainOptions b = k;
        b.B = 1;
        expect_refusal("resume refuses another batch size", b, "--batch-size 2, this run has 1");
        TrainOptions s = k;
        s.seed = 7;
        expect_refusal("resume refuses another seed", s, "--seed 42, this run has 7");
        TrainOptions tf32 = k;
        tf32.tf32 = true;
        expect_refusal("resume refuses TF32 matmuls on an fp32 run", tf32, "--precision fp32, this run has tf32");
        TrainOptions opt = k;
        opt.opt.kind = OptimizerKind::SGD;
        expect_refusal("resume refuses another optimizer", opt, "--optimizer adamw, this run has sgd");
        TrainOptions d = k;
        d.max_steps = 6;  // the checkpoint is at step 8 already
        expect_refusal("resume past the last step refused", d, "raise --max-steps");
        th::ChildOutput child = th::run_in_child([&] { resume_train<__nv_bfloat16>(k); });
        bool ok = WIFEXITED(child.status) && WEXITSTATUS(child.status) != 0 &&
                  child.text.find("--precision") != std::string::npos;
        th::report(ok, "resume refuses another precision", "%s", child.text.substr(0, child.text.size() - 1).c_str());
        // A state file cut short (a disk that filled up) is refused, not half-read.
        std::string path = state_file(k.output_dir, 8, 0), bytes = slurp(path);
        FILE* f = fopen(path.c_str(), "wb");
        fwrite(bytes.data(), 1, bytes.size() - 100, f);
        fclose(f);
        TrainState st;
        std::string err;
        bool refused = !read_train_state(path, &st, &err);
        th::report(refused && err.find("truncated or corrupt") != std::string::npos, "truncated state file refused",
                   "%s", err.c_str());
        // The recipe text round-trips; a length past the header's room is refused.
        TrainState r;
        r.B = r.T = 1;
        r.tokens_per_step = 1;
        r.recipe = "lr=0.0003 schedule=cosine";
        std::string rpath = g_tmp + "/recipe_state.bin";
        bool round = write_train_state(rpath, r, &err) && read_train_state(rpath, &st, &err) && st.recipe == r.recipe;
        std::string rbytes = slurp(rpath);
        int32_t too_long = (int32_t)TRAIN_STATE_RECIPE_BYTES + 1;
        memcpy(&rbytes[30 * 4], &too_long, 4);
        f = fopen(rpath.c_str(), "wb");
        fwrite(rbytes.data(), 1, rbytes.size(), f);
        fclose(f);
        refused = !read_train_state(rpath, &st, &err) && err.find("recipe 897 bytes") != std::string::npos;
        r.recipe.assign(TRAIN_STATE_RECIPE_BYTES + 1, 'x');
        bool not_written = !write_train_state(rpath + ".long", r, &err);
        th::report(round && refused && not_written, "state file: the recipe round-trips; one past the header's 896 "
                   "bytes is refused (read and write)", "%s", err.c_str());
    }

    // llm.c model files: the oracle's fixture (written in llm.c's format) read and written back is
    // the same file byte for byte but for the 3 header slots of the checksum (which llm.c leaves 0
    // and ignores); bf16 (version 5) round trips exactly.
    {
        GPT2Config c;
        std::string fixture = "test/fixtures/gpt2_tiny_model.bin";
        std::vector<float> p = load_checkpoint(fixture, &c);
        GPT2<float> m32;
        m32.build(c, p);
        std::string err, out = g_tmp + "/fp32.bin";
        bool wrote = save_checkpoint(out, m32, &err);
        std::string a = slurp(fixture), b = slurp(out), b_unmarked = b;
        const size_t at = 4 * GPT2_CHECKSUM_SLOT;
        bool marked = b.size() > 1024 && memcmp(&b[at], &GPT2_CHECKSUM_MARK, 4) == 0;
        if (b.size() > 1024) memset(&b_unmarked[at], 0, 12);
        th::report(wrote && marked && a == b_unmarked && a.size() > 1024,
                   "llm.c v3 (fp32) model file: read + write = same bytes but the checksum's header slots",
                   "%zu bytes", b.size());
        GPT2<__nv_bfloat16> m16;
        m16.build(c, p);
        std::string out16 = g_tmp + "/bf16.bin";
        save_checkpoint(out16, m16, &err);
        GPT2Config c16;
        std::vector<float> p16 = load_checkpoint(out16, &c16);
        std::vector<__nv_bfloat16> bits = m16.params_host();
        bool same = p16.size() == bits.size();
        for (size_t i = 0; same && i < bits.size(); i++) same = p16[i] == __bfloat162float(bits[i]);
        int32_t version;
        memcpy(&version, slurp(out16).data() + 4, 4);
        th::report(same && version == 5 && c16.channels == c.channels && slurp(out16).size() == 1024 + 2 * p.size(),
                   "llm.c v5 (bf16) model file round trip", "version %d, %zu parameters exact", version, p16.size());
        m32.free_all();
        m16.free_all();
    }
    // Malformed model files: each refused with one line naming the file and the problem, exit 1.
    {
        std::string good = slurp("test/fixtures/gpt2_tiny_model.bin");
        auto variant = [&](const char* name, std::function<void(std::string&)> edit) {
            std::string bytes = good;
            edit(bytes);
            std::string path = g_tmp + "/" + name;
            FILE* f = fopen(path.c_str(), "wb");
            fwrite(bytes.data(), 1, bytes.size(), f);
            fclose(f);
            return path;
        };
        auto set = [](int slot, int32_t value) {
            return [=](std::string& b) { memcpy(&b[4 * slot], &value, 4); };
        };
        struct Case { const char* name; std::string path; const char* reason; };
        std::vector<Case> cases = {
            {"model file: bad magic", variant("magic.bin", set(0, 1234)), "bad magic 1234"},
            {"model file: unknown version", variant("version.bin", set(1, 4)), "unsupported checkpoint version 4"},
            {"model file: heads do not divide channels", variant("heads.bin", set(5, 3)), "implausible model shape"},
            {"model file: padded vocab below vocab", variant("vp.bin", set(7, 100)), "implausible model shape"},
            {"model file: negative layers", variant("layers.bin", set(4, -2)), "implausible model shape"},
            {"model file: truncated", variant("short.bin", [](std::string& b) { b.resize(b.size() - 8); }),
             "the header's model needs"},
            {"model file: shorter than a header", variant("tiny.bin", [](std::string& b) { b.resize(100); }),
             "too short for a model checkpoint header"},
            {"model file: missing", g_tmp + "/nonexistent.bin", "No such file or directory"},
        };
        for (const Case& c : cases) {
            th::ChildOutput child = th::run_in_child([&] {
                GPT2Config cfg;
                load_checkpoint(c.path, &cfg);
            });
            while (!child.text.empty() && child.text.back() == '\n') child.text.pop_back();
            bool ok = WIFEXITED(child.status) && WEXITSTATUS(child.status) == 1 &&
                      child.text.find(c.reason) != std::string::npos && child.text.find(c.path) != std::string::npos &&
                      child.text.find('\n') == std::string::npos;
            th::report(ok, c.name, "%s", child.text.c_str());
        }
        TrainState st;
        std::string err, path = variant("state_magic.bin", set(0, 77));
        th::report(!read_train_state(path, &st, &err) && err.find("bad magic 77") != std::string::npos,
                   "state file: bad magic", "%s", err.c_str());
    }
    // Checksums: one bit flipped in the weights of a model file this trainer wrote (fp32.bin above),
    // or in the body or header of a state file, is refused by name; a state file of version 1 (before
    // checksums) is still read.
    {
        std::string model = slurp(g_tmp + "/fp32.bin");
        model[1024 + 4 * 1000 + 3] ^= 0x01;  // the low bit of a weight's top byte
        write_bytes(g_tmp + "/flipped_model.bin", model);
        th::ChildOutput child = th::run_in_child([&] {
            GPT2Config cfg;
            load_checkpoint(g_tmp + "/flipped_model.bin", &cfg);
        });
        th::report(WIFEXITED(child.status) && WEXITSTATUS(child.status) == 1 &&
                       child.text.find(g_tmp + "/flipped_model.bin: checksum mismatch") != std::string::npos,
                   "model file: one bit flipped in a weight: refused, checksum mismatch", "%s", child.text.c_str());

        const std::string state_path = state_file(g_tmp + "/resume_straight", 4, 0);
        const std::string state = slurp(state_path);
        TrainState orig, st;
        std::string err;
        bool read = read_train_state(state_path, &orig, &err);
        std::string flips;
        bool refused = read && state.size() > 2048;
        for (size_t at : {state.size() - 1, (size_t)2048, (size_t)4 * 14}) {  // body: last byte, an early one; the seed
            if (!refused) break;
            std::string bytes = state;
            bytes[at] ^= 0x10;
            write_bytes(g_tmp + "/flipped_state.bin", bytes);
            refused = !read_train_state(g_tmp + "/flipped_state.bin", &st, &err) &&
                      err.find("checksum mismatch") != std::string::npos;
            flips += " byte " + std::to_string(at) + ": " + (refused ? "checksum mismatch" : err) + ";";
        }
        std::string v1 = state;
        const int32_t one = 1, zero = 0;
        if (v1.size() > 1024) {
            memcpy(&v1[4], &one, 4);
            memcpy(&v1[4 * 9], &zero, 4);
            memcpy(&v1[4 * 31], &zero, 4);
        }
        write_bytes(g_tmp + "/v1_state.bin", v1);
        TrainState old;
        bool v1_read = read_train_state(g_tmp + "/v1_state.bin", &old, &err) && old.step == 4 &&
                       old.optimizer_state == orig.optimizer_state;
        th::report(refused && v1_read, "state file: a bit flipped in its body or header: refused (checksum); version "
                   "1 (none) still read", "%s", flips.c_str());
        // The resume point holds the header alone: the arrays would stay in host memory to the run's end.
        ResumePoint r = find_resume_point(true, g_tmp + "/resume_straight");
        th::report(r.found() && r.state.optimizer_bytes == orig.optimizer_bytes && r.state.optimizer_bytes > 0 &&
                       r.state.optimizer_state.empty() && r.state.master.empty(),
                   "the resume point reads the state file's header, not its arrays", "step %d, %llu bytes of state",
                   r.step, (unsigned long long)r.state.optimizer_bytes);
    }
    // A damaged checkpoint resumed by the program: the first message is the damage, not a setting the
    // damaged field seems to hold (B, seed) nor a llm.c file's lack of a checksum (a damaged mark).
    {
        const std::string self = th::self_path(argv[0]);
        const std::string run = self + " --train-gpt2 --layers 1 --channels 32 --heads 2 --max-seq-len 16 "
                                "--vocab-size 64 -t 16 -b 2 -x 4 -v 0 -g 0 -i " + train + " -j '' ";
        const std::string dir = g_tmp + "/damaged_src";
        th::ChildOutput made = th::run_command(run + "-o " + dir + " --stop-after 2 2>&1");
        struct Damage {
            const char* name;
            std::string file;  // in the checkpoint of step 2
            size_t at;         // byte
            int32_t bits;      // xor-ed into the int32 at `at`
        };
        const std::string model = "/model_00000002.bin", state = "/state_00000002_00000.bin";
        const Damage cases[] = {
            {"state file's B (slot 7)", state, 4 * 7, 1},
            {"state file's seed (slot 14)", state, 4 * 14, 1},
            {"model file's checksum mark (slot 253)", model, 4 * 253, 1 << 20},
            {"model file's checksum mark and value zeroed (an unmarked, llm.c-like header)", model, 0, 0},
        };
        bool all = th::exited_ok(made);
        std::string said;
        for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
            const Damage& d = cases[k];
            const std::string copy = g_tmp + "/damaged_" + std::to_string(k);
            th::run_command("rm -rf " + copy + " && cp -r " + dir + " " + copy);
            std::string bytes = slurp(copy + d.file);
            if (d.bits != 0) {
                int32_t v;
                memcpy(&v, &bytes[d.at], 4);
                v ^= d.bits;
                memcpy(&bytes[d.at], &v, 4);
            } else {
                memset(&bytes[4 * 253], 0, 12);
            }
            write_bytes(copy + d.file, bytes);
            th::ChildOutput c = th::run_command(run + "-o " + copy + " -y 2>&1");
            bool ok = WIFEXITED(c.status) && WEXITSTATUS(c.status) == 1 &&
                      c.text.find(copy + d.file + ": checksum mismatch") != std::string::npos &&
                      th::step_losses(c.text).empty();
            if (!ok) said += std::string(d.name) + ": " + th::last_lines(c.text) + " | ";
            all &= ok;
        }
        th::report(all, "resuming a damaged checkpoint (state B, seed; model mark flipped, or zeroed): checksum "
                   "mismatch first, exit 1", "%s", said.c_str());
    }
    return th::finish();
}

}  // namespace test_checkpoint
TH_MAIN(test_checkpoint)
