// test/test_train_bert.cu — the train_bert program (train_bert.cu's main), run as a user runs it: this
// binary contains it (train_bert.cu included with TESTING) and runs itself as `test_train_bert
// --train-bert ARGS...` in a child process for each case. On small shards written here (and the
// bundled default task) and the tiny BERT fixtures of test/fixtures:
//   --help lists the options with their defaults; every bad input (a missing or corrupt shard, a label
//   beyond the model's num_labels, a shard of another vocabulary, a corrupt safetensors header, bad
//   option values, shards of the other task, validation shards or a fine-tuned checkpoint whose label
//   names differ from the training shards') stops with one line naming the problem and a non-zero
//   exit; resuming refuses what would silently change the run (another task, model, tf32 for fp32,
//   shards with other label names) and keeps the run's epochs and log label; a short classification run on the bundled task's sentences lowers the loss and reports
//   accuracy, the majority-class rate and F1; a run stopped with --stop-after and resumed is
//   bit-identical to an uninterrupted one (fp32 and bf16, dropout on: the same losses, the same final
//   model and optimizer state, byte for byte), and so is a run SIGUSR1 stopped (with a checkpoint of
//   its step) and resumed; two runs with the same seed are identical and different
//   seeds differ (dropout on); the dropout is the checkpoint's config.json's (hidden, attention and
//   classifier) unless --dropout / --attention-dropout set it, and the run's config.json records it;
//   CUDA graphs on and off are bit-identical (fp16, accumulation, dropout
//   on; classification and MLM); MLM pretraining runs and reports MLM accuracy, and says so where a
//   step or the val split has no masked token; --export-hf writes what our own loader reads back. And in this process, on the model: with dropout on, backward()'s
//   gradient is the gradient of the loss under the masks forward() drew (both heads).
//
// `test_train_bert --export DIR` instead writes what test/hf_train_bert_export.py hands to
// transformers: DIR/cls (fp32) and DIR/mlm (bf16), exports of short fine-tuning / MLM runs, and
// DIR/ours_{cls,mlm}.safetensors: a batch and our logits for it, computed in fp32 from the exported
// weights.
#include "bert_trainer.h"
#include "bert_shards.h"
#include "harness.h"
#include "program_runs.h"

#include <sys/wait.h>

namespace test_train_bert {

static std::string g_self, g_tmp;
using th::slurp;
static const std::string kFixtures = "test/fixtures/";

// ----------------------------------------------------------------------------
// Shards and runs

// Runs the program with args (this binary, --train-bert mode); returns its status and output
// (stdout and stderr together, or stderr only).
th::ChildOutput run(const std::string& args, bool stderr_only = false) {
    return th::run_command(g_self + " --train-bert " + args + (stderr_only ? " 2>&1 >/dev/null" : " 2>&1"));
}

bool exited(const th::ChildOutput& c, int code) { return WIFEXITED(c.status) && WEXITSTATUS(c.status) == code; }

// The run must fail (non-zero exit; `status` exactly, unless 0) with `expect` in its one line on stderr.
void expect_error(const char* name, const std::string& args, const char* expect, int status = 0) {
    th::ChildOutput c = run(args, true);
    std::string err = c.text;
    while (!err.empty() && err.back() == '\n') err.pop_back();
    bool one_line = !err.empty() && err.find('\n') == std::string::npos;
    bool ok = WIFEXITED(c.status) && WEXITSTATUS(c.status) != 0 && (!status || WEXITSTATUS(c.status) == status) &&
              err.find(expect) != std::string::npos && one_line;
    th::report(ok, name, "exit %d, stderr: %s", WIFEXITED(c.status) ? WEXITSTATUS(c.status) : -1, err.c_str());
}

// The lines of a run's log.jsonl that hold its losses: every "step" line up to its timing fields,
// every "val" line.
std::string losses_of(const std::string& dir) {
    std::string log = slurp(dir + "/log.jsonl"), out;
    for (size_t at = 0; at < log.size();) {
        size_t end = log.find('\n', at);
        std::string line = log.substr(at, end - at);
        if (line.rfind("{\"event\":\"val\"", 0) == 0) out += line + "\n";
        if (line.rfind("{\"event\":\"step\"", 0) == 0) out += line.substr(0, line.find(",\"ms\"")) + "\n";
        at = end == std::string::npos ? log.size() : end + 1;
    }
    return out;
}

// The "loss X" figures of a run's step lines on stdout.
std::vector<double> step_losses(const std::string& out) {
    std::vector<double> losses;
    for (size_t at = out.find("\nstep "); at != std::string::npos; at = out.find("\nstep ", at + 1)) {
        size_t l = out.find("| loss ", at);
        if (l != std::string::npos && l < out.find('\n', at + 1)) losses.push_back(atof(out.c_str() + l + 7));
    }
    return losses;
}

// ----------------------------------------------------------------------------
// The checks

void test_help() {
    th::ChildOutput c = run("--help");
    std::string diff = th::compare_option_listing(c.text, "test/fixtures/train_bert_options.txt");
    th::report(exited(c, 0) && diff.empty(),
               "--help lists the options, values and defaults of test/fixtures/train_bert_options.txt, exit 0", "%s",
               diff.c_str());
}

void test_refusals(const std::string& cls3, const std::string& cls4, const std::string& v200, const std::string& mlm) {
    std::string base = " --eval-first 0 -b 4 -t 32 --max-steps 1 ";
    expect_error("refused: a missing shard", base + "--config tiny -i " + g_tmp + "/nope_*.bin", "no BERT shards match");
    {
        std::string bytes = slurp(cls3);
        std::string cut = g_tmp + "/truncated.bin";
        FILE* f = fopen(cut.c_str(), "wb");
        fwrite(bytes.data(), 1, bytes.size() - 10, f);
        fclose(f);
        expect_error("refused: a truncated shard", base + "--config tiny -i " + cut, "truncated or corrupt");
        std::string bad = bytes;
        bad[0] = 'X';
        std::string junk = g_tmp + "/bad_magic.bin";
        f = fopen(junk.c_str(), "wb");
        fwrite(bad.data(), 1, bad.size(), f);
        fclose(f);
        expect_error("refused: a shard with a bad magic", base + "--config tiny -i " + junk, "bad magic");
    }
    expect_error("refused: labels beyond --num-labels", base + "--config tiny --num-labels 2 -i " + cls3,
                 "outside the model's num_labels 2 (--num-labels)");
    expect_error("refused: labels beyond the checkpoint's classifier",
                 base + "--init " + kFixtures + "bert_tiny_cls -i " + cls4, "outside the model's num_labels 3 (the "
                 "checkpoint's classifier)");
    expect_error("refused: a shard of another vocabulary", base + "--init " + kFixtures + "bert_tiny_mlm -i " + v200,
                 "tokenized with a vocabulary of 200 tokens, the model");
    {
        std::string dir = g_tmp + "/corrupt_model";
        th::run_command("mkdir -p " + dir + " && cp " + kFixtures + "bert_tiny_mlm/* " + dir);
        std::string bytes = slurp(dir + "/model.safetensors");
        uint64_t huge = 1ull << 40;
        memcpy(&bytes[0], &huge, 8);
        FILE* f = fopen((dir + "/model.safetensors").c_str(), "wb");
        fwrite(bytes.data(), 1, bytes.size(), f);
        fclose(f);
        expect_error("refused: a corrupt safetensors header", base + "--init " + dir + " -i " + cls3, "header");
    }
    expect_error("refused: MLM shards for --task classify", base + "--config tiny -i " + mlm,
                 "MLM shards, but --task classify needs classification shards");
    expect_error("refused: classification shards for --task mlm", base + "--task mlm --config tiny -i " + cls3,
                 "classification shards, but --task mlm needs MLM shards");
    expect_error("refused: --task mlm without shards", "--task mlm", "needs MLM shards, -i GLOB");
    expect_error("refused: --dropout out of range", base + "--config tiny -i " + cls3 + " --dropout 1.5",
                 "option --dropout: 1.5 is out of range");
    expect_error("refused: --precision fp8", base + "--config tiny -i " + cls3 + " --precision fp8",
                 "fp8 is not built for BERT");
    expect_error("refused: an unknown --task", "--task ner", "option --task: 'ner' is not one of classify, mlm");
    expect_error("refused: --warmup neither fraction nor steps", "--warmup 2.5", "option --warmup: 2.5 is neither");
    expect_error("refused: --max-len beyond the model's positions",
                 base + "--init " + kFixtures + "bert_tiny_cls -i " + cls3 + " -t 100",
                 "option --max-len: 100 is longer than the model's 64 positions");
    expect_error("refused: --batch-size 0", "-b 0", "option --batch-size: 0 is out of range");
    expect_error("refused: an unknown --config", base + "--config huge -i " + cls3,
                 "option --config: 'huge' is not one of tiny, mini, small, base, large");
    expect_error("refused: --init with --config", "--init x --config tiny", "excludes --init");
    expect_error("refused: an empty --init", "--init ''", "option --init: an empty path");
    expect_error("refused: --resume without --output-dir", "--resume", "option --resume: needs --output-dir");
    expect_error("refused: --total-batch-size not a multiple of B",
                 base + "--config tiny -i " + cls3 + " -d 6", "option --total-batch-size: 6 is not a multiple", 2);
    // Options that would change nothing in the run asked for: refused, not silently ignored.
    expect_error("refused: --mask-rate with --task classify", base + "--config tiny -i " + cls3 + " --mask-rate 0.2",
                 "option --mask-rate: applies to --task mlm only");
    expect_error("refused: --num-labels with --task mlm", base + "--task mlm --config tiny -i " + mlm +
                 " --num-labels 3", "option --num-labels: applies to --task classify only");
    expect_error("refused: --eval-every without validation data", base + "--config tiny -i " + cls3 + " -j '' -v 2",
                 "option --eval-every: there is no validation data (-j '')", 2);
    expect_error("refused: --eval-every with --bench", "--bench --config tiny --eval-every 2",
                 "option --eval-every: --bench does not evaluate");
    expect_error("refused: --loss-scale outside fp16", base + "--config tiny -i " + cls3 + " --loss-scale 1024",
                 "option --loss-scale: applies to --precision fp16 only (this run's precision is fp32)");
    expect_error("refused: --attention-backward wgmma in fp32", base + "--config tiny -i " + cls3 +
                 " --attention-backward wgmma",
                 "option --attention-backward: wgmma applies to --precision bf16 and fp16 only (this run's precision "
                 "is fp32)");
    expect_error("refused: --attention-backward wgmma with attention dropout", base + "--config tiny -i " + cls3 +
                 " --precision bf16 --attention-backward wgmma",
                 "option --attention-backward: wgmma runs the backward without attention dropout; this run has "
                 "attention dropout 0.1 (give --attention-dropout 0)", 2);
    expect_error("refused: --nesterov with AdamW", base + "--config tiny -i " + cls3 + " --nesterov",
                 "option --nesterov: applies to --optimizer sgd only (this run's optimizer is adamw)");
    expect_error("refused: --profile-step past the run's steps", base + "--config tiny -i " + cls3 +
                 " --profile-step 2", "option --profile-step: 2 is past the 1 step this run takes", 2);
    expect_error("refused: an --output-dir that cannot be a directory (under a file)", base + "--config tiny -i " + cls3 +
                 " -o " + kFixtures + "bert_tiny_cls/config.json/run", "option --output-dir: cannot create directory", 2);
    // The run's config.json would replace a model's (-o the directory --init read), or the export's
    // the run's (--export-hf the run's -o): refused, the model's config.json untouched.
    {
        const std::string model = g_tmp + "/model_copy";
        th::run_command("rm -rf " + model + " && cp -r " + kFixtures + "bert_tiny_cls " + model);
        const std::string before = slurp(model + "/config.json");
        expect_error("refused: -o holding a model's config.json (not a run's)",
                     base + "--init " + model + " -i " + cls3 + " -o " + model,
                     "holds a config.json that is not a train_bert run's");
        th::report(slurp(model + "/config.json") == before && before.find("\"architectures\"") != std::string::npos,
                   "the refused run left the model's config.json as it was", "%zu bytes", before.size());
        expect_error("refused: --export-hf the directory --init reads the model from",
                     base + "--init " + model + "/model.safetensors -i " + cls3 + " --export-hf " + model,
                     "which --init reads: give another directory", 2);
        th::report(slurp(model + "/config.json") == before, "... its config.json left as it was");
        const std::string run = g_tmp + "/run_and_export", said = "option --export-hf: " + run + "/. is the run's";
        expect_error("refused: --export-hf the run's -o",
                     base + "--config tiny -i " + cls3 + " -o " + run + " --export-hf " + run + "/.", said.c_str());
        const std::string corrupt = g_tmp + "/corrupt_config";
        th::run_command("mkdir -p " + corrupt + " && printf '{bad' > " + corrupt + "/config.json");
        expect_error("refused: -o holding a config.json that is not JSON, said so", base + "--config tiny -i " + cls3 +
                     " -o " + corrupt + " -y", "holds a config.json that is not JSON (", 2);
    }
}

// A balanced slice of a classification shard: its first per_label sequences of each label, written to
// dst. False with *err if src cannot be read.
bool write_slice(const std::string& src, const std::string& dst, int per_label, std::string* err) {
    BertShard all;
    if (!read_bert_shard(src, &all, err)) return false;
    BertShard part = all;
    part.tokens.clear(), part.lengths.clear(), part.labels.clear();
    std::vector<int> taken(all.num_labels(), 0);
    for (size_t i = 0; i < all.num_sequences(); i++) {
        int label = all.labels[i];
        if (taken[label] == per_label) continue;
        taken[label]++;
        part.tokens.insert(part.tokens.end(), all.tokens.begin() + all.offsets[i], all.tokens.begin() + all.offsets[i + 1]);
        part.lengths.push_back(all.lengths[i]);
        part.labels.push_back(label);
    }
    return write_bert_shard(dst, part, err);
}

// A copy of classification shard src at dst whose labels are named `names` (the same numbers).
void write_renamed(const std::string& src, const std::string& dst, const std::vector<std::string>& names) {
    BertShard s;
    std::string err;
    if (!read_bert_shard(src, &s, &err)) data_error("%s", err.c_str());
    s.label_names = names;
    if (!write_bert_shard(dst, s, &err)) data_error("%s", err.c_str());
}

// The label names must agree wherever a label number crosses from one file to another: validation
// shards with the training shards (else accuracy and F1 count against other labels), and a
// fine-tuned checkpoint's id2label with the shards (else training and --export-hf give each output
// another label's meaning), unless the checkpoint's are transformers' generic LABEL_k.
void test_label_names(const std::string& cls3) {
    std::string reordered = g_tmp + "/cls3_bac.bin", other = g_tmp + "/cls3_xyz.bin";
    write_renamed(cls3, reordered, {"classb", "classa", "classc"});
    write_renamed(cls3, other, {"x", "y", "z"});
    std::string base = " --eval-first 0 -b 4 -t 32 --max-steps 1 --config tiny -i " + cls3;
    expect_error("refused: validation shards with the labels in another order", base + " -j " + reordered,
                 "labels classb, classa, classc, the training shards' are classa, classb, classc");
    expect_error("refused: validation shards with other label names", base + " -j " + other,
                 "labels x, y, z, the training shards' are classa, classb, classc");
    // A checkpoint fine-tuned on cls3 (id2label classa, classb, classc), exported.
    std::string hf = g_tmp + "/labels_hf";
    th::ChildOutput c = run(base + " -j '' --export-hf " + hf);
    th::report(exited(c, 0) && slurp(hf + "/config.json").find("\"0\": \"classa\"") != std::string::npos,
               "a fine-tuned checkpoint exported with its label names", "exit %d", WEXITSTATUS(c.status));
    std::string from = " --eval-first 0 -b 4 -t 32 --max-steps 1 -j '' --init " + hf + " -i ";
    expect_error("refused: a fine-tuned checkpoint on shards with its labels in another order", from + reordered,
                 "the checkpoint's classifier has labels classa, classb, classc (id2label), the shards");
    expect_error("refused: a fine-tuned checkpoint on shards with other label names", from + other,
                 "have x, y, z: each output would change meaning");
    c = run(from + cls3);
    th::report(exited(c, 0), "accepted: a fine-tuned checkpoint on shards with its label names", "exit %d",
               WEXITSTATUS(c.status));
    // test/fixtures/bert_tiny_cls's id2label is LABEL_0, LABEL_1, LABEL_2: no names to keep.
    c = run(" --eval-first 0 -b 4 -t 32 --max-steps 1 -j '' --init " + kFixtures + "bert_tiny_cls -i " + other);
    th::report(exited(c, 0), "accepted: a checkpoint with transformers' generic LABEL_k names on named shards",
               "exit %d", WEXITSTATUS(c.status));
}

// The tiny random BERT on the bundled task's real sentences: trained on a 64-sentence slice of its
// train split (a random BERT needs ~100 steps of the whole split before its loss moves; on a slice it
// fits the sentences in a few epochs), evaluated on a 256-sentence slice of its val split: the loss
// falls, accuracy, the majority-class rate and F1 are reported, and the first lines say which model.
void test_default_task() {
    std::string train = g_tmp + "/genre_train_64.bin", val = g_tmp + "/genre_val_256.bin", err;
    if (!write_slice("dev/data/bert/genre_train.bin", train, 32, &err) ||
        !write_slice("dev/data/bert/genre_val.bin", val, 128, &err)) {
        th::report(false, "bundled task: shards readable", "%s", err.c_str());
        return;
    }
    th::ChildOutput c = run("--config tiny -i " + train + " -j " + val + " -b 16 --max-steps 30 -l 3e-3 -k constant -u 4 --seed 3");
    std::vector<double> l = step_losses(c.text);
    double first = 0, last = 0;
    if (l.size() == 30)
        for (int i = 0; i < 4; i++) first += l[i] / 4, last += l[26 + i] / 4;
    size_t at = c.text.rfind("eval step 30");
    bool reports = at != std::string::npos && c.text.find("accuracy", at) != std::string::npos &&
                   c.text.find("majority class 50.00%", at) != std::string::npos &&
                   c.text.find("F1", at) != std::string::npos && c.text.find("eval step 0 ") != std::string::npos;
    double acc = reports ? atof(c.text.c_str() + c.text.find("accuracy", at) + 9) : 0;
    bool said = c.text.rfind("init: a random tiny BERT", 0) == 0;
    th::report(exited(c, 0) && l.size() == 30 && last < first - 0.2 && reports && said,
               "bundled task (64-sentence slice), tiny BERT, 30 steps: the loss falls; accuracy, majority rate, F1",
               "exit %d, loss %.4f -> %.4f (means of 4 steps), val accuracy %.2f%%", WEXITSTATUS(c.status), first, last,
               acc);
}

// A run of `steps` steps stopped after `stop` and resumed equals an uninterrupted one: losses, final
// model and state bit for bit. `dropout` (options) is given to the first part only: the resumed part
// takes the dropout from the run's config.json.
// How the runs in directories a and b differ at step `step`: "" when their model and state files are
// identical byte for byte and so are their logged losses, else what differs.
std::string run_differences(const std::string& a, const std::string& b, int step) {
    for (std::string f : {checkpoint_file("", "model", step), state_file("", step, 0)}) {
        std::string x = slurp(a + f), y = slurp(b + f);
        if (x.rfind("<missing", 0) == 0 || x != y) return f.substr(1) + " differs";
    }
    if (losses_of(a) != losses_of(b) || losses_of(a).empty()) return "the logged losses differ";
    return "";
}

void test_resume(const char* name, const std::string& args, const std::string& dropout, int steps, int stop) {
    std::string a = g_tmp + "/resume_" + name + "_straight", b = g_tmp + "/resume_" + name + "_parts";
    std::string common = args + " -n 3 ";
    th::ChildOutput straight = run(common + dropout + " -o " + a);
    th::ChildOutput first = run(common + dropout + " -o " + b + " --stop-after " + std::to_string(stop));
    th::ChildOutput second = run(common + "-o " + b + " -y");
    std::string why = run_differences(a, b, steps);
    bool resumed = second.text.find("resuming from") != std::string::npos &&
                   first.text.find("stopped after step " + std::to_string(stop)) != std::string::npos;
    bool ok = exited(straight, 0) && exited(first, 0) && exited(second, 0) && resumed && why.empty();
    std::string label = std::string("resume after --stop-after is bit-identical (") + name + ";" + dropout +
                        " in the first part only)";
    th::report(ok, label.c_str(), "%s%s", why.c_str(),
               ok ? "" : (" | " + second.text.substr(second.text.size() > 300 ? second.text.size() - 300 : 0)).c_str());
    // The batches are staged in pinned slots (llmc/staging.h): under make test's adversarial streams a
    // wait inside the step would be counted. Only the CPU backend counts them (a GPU prints nothing).
    label = std::string("no host wait inside a training step (") + name + ")";
    if (host_sync_count() < 0) {
        printf("SKIP %s: only the CPU backend counts host waits\n", label.c_str());
        return;
    }
    std::string waits = "host waits for the device inside the step: ";
    size_t at = straight.text.find(waits);
    std::string count = at == std::string::npos ? "none printed" : straight.text.substr(at + waits.size(), 2);
    th::report(count == "0 ", label.c_str(), "%s", count.c_str());
}

// SIGUSR1 (a scheduler's warning before its time limit) in the middle of a run with -o and no
// checkpoint due (-n 0): the run stops after the step in progress with a checkpoint of it and exit
// status 138, and resuming from it gives what a run never interrupted gives (model, state, losses).
void test_stop_on_signal(const std::string& cls3) {
    std::string args = "--config tiny -i " + cls3 + " -j '' -b 4 -t 32 --max-steps 5000 --eval-first 0 -l 1e-3 -n 0 ";
    std::string dir = g_tmp + "/signal_run", straight = g_tmp + "/signal_straight";
    th::ChildOutput c = th::signal_when(g_self + " --train-bert " + args + "-o " + dir, g_tmp + "/signal_run.txt",
                                        "/5000 | loss", SIGUSR1);
    long long stopped = th::number_after(c.text, "stopped by SIGUSR1 after step ");
    bool told = c.text.find(" of 5000; continue with --resume (checkpoint in " + dir + ")") != std::string::npos;
    std::vector<int> done = complete_checkpoints(dir);
    bool ok = exited(c, 138) && told && stopped >= 1 && done == std::vector<int>{(int)stopped};
    std::string why = ok ? "" : th::last_lines(c.text);
    if (ok) {
        th::ChildOutput resumed = run(args + "-o " + dir + " -y --stop-after 2");
        th::ChildOutput whole = run(args + "-o " + straight + " --stop-after " + std::to_string(stopped + 2));
        why = exited(resumed, 0) && exited(whole, 0) ? run_differences(straight, dir, (int)stopped + 2)
                                                     : th::last_lines(resumed.text + whole.text);
        ok = why.empty();
    }
    th::report(ok, "SIGUSR1 mid-run: stops after the step with a checkpoint (exit 138); resumed == uninterrupted",
               "stopped after step %lld; %s", stopped,
               ok ? "2 steps on: model, state and losses bit-identical" : why.c_str());
}

// A run directory damaged after it was written is refused on resume with "checksum mismatch", before
// anything in it is used: one byte of config.json (layer_norm_eps, whose change would otherwise
// resume silently with another model), and the model file's checksum key (which would otherwise pass
// the file for one without a checksum).
void test_damaged_resume(const std::string& cls3) {
    std::string args = "--config tiny -i " + cls3 + " -j '' -b 4 -t 32 --max-steps 4 --eval-first 0 -l 1e-3 ";
    std::string dir = g_tmp + "/damage_src";
    th::ChildOutput made = run(args + "-o " + dir + " --stop-after 2");
    struct Damage {
        const char* name;
        std::string file, text;  // in the run directory: the byte at `skip` bytes into the first `text`
        size_t skip;             // changes, a digit to another, a letter to a digit
    };
    const Damage cases[] = {
        {"config.json's layer_norm_eps", "/config.json", "\"layer_norm_eps\": 1e-", 20},
        {"config.json's checksum", "/config.json", "\"checksum\": \"", 13},
        {"the model file's llmc_checksum key", "/model_00000002.bin", "llmc_checksum", 0},
    };
    bool all = exited(made, 0);
    std::string said;
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        const Damage& d = cases[k];
        std::string copy = g_tmp + "/damage_" + std::to_string(k);
        th::run_command("rm -rf " + copy + " && cp -r " + dir + " " + copy);
        std::string bytes = slurp(copy + d.file);
        size_t at = bytes.find(d.text);
        if (at == std::string::npos) {
            all = false;
            said += std::string(d.name) + ": not found | ";
            continue;
        }
        char& byte = bytes[at + d.skip];
        byte = byte == '1' ? '2' : '1';
        FILE* f = fopen((copy + d.file).c_str(), "wb");
        if (f) {
            fwrite(bytes.data(), 1, bytes.size(), f);
            fclose(f);
        }
        th::ChildOutput c = run(args + "-o " + copy + " -y");
        bool ok = exited(c, 1) && c.text.find(copy + d.file + ": checksum mismatch") != std::string::npos &&
                  step_losses(c.text).empty();
        if (!ok) said += std::string(d.name) + ": " + th::last_lines(c.text) + " | ";
        all &= ok;
    }
    th::report(all, "resuming a damaged run directory (config.json, the model's checksum key): checksum mismatch, "
               "exit 1", "%s", said.c_str());
}

// A checkpoint with a vocab.txt beside it: shards that record another vocabulary of the same size (two
// tokens swapped) are refused by name; shards of its own vocabulary, or shards that record none, train.
void test_vocab_fingerprint(const std::string& cls3) {
    std::string dir = g_tmp + "/vocab_model";
    th::run_command("mkdir -p " + dir + " && cp " + kFixtures + "bert_tiny_cls/* " + dir);
    // 500 tokens with bert-base-uncased's special ids (0 [PAD], 100 [UNK], 101 [CLS], 102 [SEP], 103 [MASK])
    auto vocab = [](bool swapped) {
        std::string text;
        for (int id = 0; id < 500; id++) {
            const char* special = id == 0     ? "[PAD]"
                                  : id == 100 ? "[UNK]"
                                  : id == 101 ? "[CLS]"
                                  : id == 102 ? "[SEP]"
                                  : id == 103 ? "[MASK]"
                                              : nullptr;
            int name = swapped && (id == 200 || id == 201) ? 401 - id : id;
            text += (special ? std::string(special) : "w" + std::to_string(name)) + "\n";
        }
        return text;
    };
    WordPiece own, swapped;
    std::string err, own_text = vocab(false), swapped_text = vocab(true);
    bool loaded = write_file_atomic(dir + "/vocab.txt", {{own_text.data(), own_text.size()}}, &err) &&
                  own.load(dir + "/vocab.txt", &err) && swapped.load_from_memory(swapped_text.data(), swapped_text.size(), &err);
    std::string mine = th::write_bert_test_shard(g_tmp, "fp_own.bin", BertShardKind::Classify, 64, 32, 500, 3, 31,
                                                 own.fingerprint());
    std::string theirs = th::write_bert_test_shard(g_tmp, "fp_swapped.bin", BertShardKind::Classify, 64, 32, 500, 3, 31,
                                                   swapped.fingerprint());
    const std::string args = "--init " + dir + " -j '' -b 4 -t 32 --max-steps 1 --eval-first 0 -i ";
    th::ChildOutput refused = run(args + theirs, true);
    bool ok = loaded && !th::exited_ok(refused) &&
              refused.text.find(theirs + ": tokenized with another vocabulary than the model's " + dir + "/vocab.txt "
                                "(both 500 tokens, but other tokens or another order)") != std::string::npos;
    th::report(ok, "refused: shards of another vocabulary of the same size as the model's vocab.txt", "%s%s",
               err.c_str(), th::last_lines(refused.text).c_str());
    const std::string out = g_tmp + "/vocab_run";
    th::ChildOutput a = run(args + mine + " -o " + out), b = run(args + cls3);
    th::report(exited(a, 0) && exited(b, 0), "shards of the model's vocab.txt, or recording none, train beside it");
    // A run from that run's checkpoint checks against the vocab.txt the run keeps in hf_source/.
    refused = run("--init " + checkpoint_file(out, "model", 1) + " -j '' -b 4 -t 32 --max-steps 1 --eval-first 0 -i " +
                  theirs, true);
    th::report(!th::exited_ok(refused) && refused.text.find("another vocabulary than the model's " + out +
                                                            "/hf_source/vocab.txt") != std::string::npos,
               "refused: a run's checkpoint with shards of another vocabulary than its hf_source/vocab.txt", "%s",
               th::last_lines(refused.text).c_str());
    // A vocab.txt of another size than the model's vocab_size is not the model's: refused, naming it.
    std::string shorter = own_text.substr(0, own_text.find("w300\n"));
    bool wrote = write_file_atomic(dir + "/vocab.txt", {{shorter.data(), shorter.size()}}, &err);
    th::ChildOutput c = run(args + mine, true);
    th::report(wrote && exited(c, 1) && c.text.find(dir + "/vocab.txt: 300 tokens, but the model beside it has "
                                                    "vocab_size 500: not the model's vocabulary") != std::string::npos,
               "refused: a vocab.txt beside the model of another size than its vocab_size", "%s",
               th::last_lines(c.text).c_str());
}

// The line of out that starts with `prefix` ("" if none).
std::string line_of(const std::string& out, const std::string& prefix) {
    size_t at = out.rfind(prefix, 0) == 0 ? 0 : out.find("\n" + prefix);
    if (at == std::string::npos) return "";
    at += at ? 1 : 0;
    return out.substr(at, out.find('\n', at) - at);
}

// The dropout is the model's config.json's unless --dropout or --attention-dropout say otherwise:
// bert_tiny_cls's (0 everywhere) trains as --dropout 0 does, bit for bit, and not as --dropout 0.1; a
// copy whose config.json has hidden 0.1, attention 0 and classifier 0.2 says so at start-up and its
// run's config.json records them; the options override (--attention-dropout alone, or after
// --dropout); a config.json dropout of 1 or more is refused by name.
void test_dropout_from_config(const std::string& cls3) {
    const std::string base = " -i " + cls3 + " -j '' -b 4 -t 32 --max-steps 3 --eval-first 0 -l 1e-3";
    const std::string fixture = "--init " + kFixtures + "bert_tiny_cls" + base;
    std::vector<double> config0 = step_losses(run(fixture).text);
    std::vector<double> given0 = step_losses(run(fixture + " --dropout 0").text);
    std::vector<double> given1 = step_losses(run(fixture + " --dropout 0.1").text);
    th::report(config0.size() == 3 && config0 == given0 && given1.size() == 3 && given1 != config0,
               "dropout: the checkpoint's config.json (0) is the default: the losses of --dropout 0, not 0.1",
               "step 1: %.6f, --dropout 0 %.6f, --dropout 0.1 %.6f", config0.empty() ? 0 : config0[0],
               given0.empty() ? 0 : given0[0], given1.empty() ? 0 : given1[0]);

    std::string dir = g_tmp + "/dropout_model", out = g_tmp + "/dropout_run";
    th::run_command("mkdir -p " + dir + " && cp " + kFixtures + "bert_tiny_cls/* " + dir);
    std::string config = slurp(dir + "/config.json");
    auto set = [&](const std::string& key, const std::string& value) {
        size_t at = config.find("\"" + key + "\": ");
        if (at == std::string::npos) return;
        at += key.size() + 4;
        config.replace(at, config.find(',', at) - at, value);
    };
    set("hidden_dropout_prob", "0.1");
    set("classifier_dropout", "0.2");
    auto save = [&] {
        std::string err;
        if (!write_file_atomic(dir + "/config.json", {{config.data(), config.size()}}, &err))
            data_error("%s", err.c_str());
    };
    save();
    const std::string mixed = "--init " + dir + base;
    th::ChildOutput c = run(mixed + " -o " + out);
    std::string recorded = slurp(out + "/config.json");
    bool ok = exited(c, 0) && c.text.find("; dropout 0.1 hidden, 0 attention, 0.2 classifier;") != std::string::npos &&
              recorded.find("\"hidden_dropout_prob\": 0.1,") != std::string::npos &&
              recorded.find("\"attention_probs_dropout_prob\": 0,") != std::string::npos &&
              recorded.find("\"classifier_dropout\": 0.2,") != std::string::npos;
    th::report(ok, "dropout: hidden, attention and classifier from config.json, said at start-up and recorded in the "
               "run's config.json", "%s", line_of(c.text, "batch: ").c_str());
    // Resumed with other settings (more steps, another dropout): the run says what it changes, the
    // warmup too (10% of the steps: 0 of 3, 1 of 5).
    c = run(mixed + " -o " + out + " -y --max-steps 5 --dropout 0.2");
    th::report(exited(c, 0) && c.text.find("resume: this run changes warmup_steps 0 -> 1, steps 3 -> 5, hidden_dropout "
                                           "0.1 -> 0.2, attention_dropout 0 -> 0.2 (") != std::string::npos,
               "resume: the changed steps and dropout are said", "%s", line_of(c.text, "resume: ").c_str());
    // Resumed on other training data (here the same shard under another name): said too.
    th::run_command("cp " + cls3 + " " + g_tmp + "/renamed_train.bin");
    c = run("--init " + dir + " -i " + g_tmp + "/renamed_train.bin -j '' -b 4 -t 32 --max-steps 6 --eval-first 0 -l 1e-3 "
            "--dropout 0.2 -o " + out + " -y");
    std::string said = line_of(c.text, "resume: ");
    th::report(exited(c, 0) && said.find("train_data 1shards:") != std::string::npos &&
                   said.find(" -> 1shards:") != std::string::npos,
               "resume: other training data is said", "%s", said.c_str());
    c = run(mixed + " --attention-dropout 0.3");
    th::report(exited(c, 0) && c.text.find("; dropout 0.1 hidden, 0.3 attention, 0.2 classifier;") != std::string::npos,
               "dropout: --attention-dropout alone overrides config.json's attention dropout", "%s",
               line_of(c.text, "batch: ").c_str());
    c = run(mixed + " --dropout 0.05 --attention-dropout 0");
    th::report(exited(c, 0) && c.text.find("; dropout 0.05 hidden, 0 attention, 0.05 classifier;") != std::string::npos,
               "dropout: --dropout sets all three, --attention-dropout then the attention's", "%s",
               line_of(c.text, "batch: ").c_str());
    set("attention_probs_dropout_prob", "1.0");
    save();
    expect_error("refused: a config.json dropout of 1", mixed, "attention_probs_dropout_prob 1 and classifier_dropout "
                 "0.2 must be probabilities below 1");
}

// --max-steps 0: no training. A fine-tuned checkpoint evaluated on validation shards alone (they
// stand in for the training shards) gives the evaluation a training run prints before its first step,
// keeping no gradients or optimizer state and one layer's activations; a run with nothing to do, or
// --bench, is refused.
void test_no_training(const std::string& cls3, const std::string& cls3_val) {
    const std::string init = "--init " + kFixtures + "bert_tiny_cls -b 4 -t 32 ";
    th::ChildOutput trained = run(init + "-i " + cls3 + " -j " + cls3_val + " --max-steps 1");
    th::ChildOutput eval = run(init + "-j " + cls3_val + " -x 0");
    // "eval step 0 (epoch 0.00) | val loss X | accuracy ... | T s": the same up to its time
    auto figures = [](const std::string& line) { return line.substr(0, line.rfind(" | ")); };
    std::string want = line_of(trained.text, "eval step 0 "), got = line_of(eval.text, "eval step 0 ");
    bool ok = exited(trained, 0) && exited(eval, 0) && !want.empty() && figures(got) == figures(want) &&
              th::step_losses(eval.text).empty() &&
              eval.text.find("no training (--max-steps 0): the model as loaded, evaluated on " + cls3_val) !=
                  std::string::npos &&
              eval.text.find("the bundled default") == std::string::npos &&  // the task is the given shards
              eval.text.find("gradients              0.0 MiB") != std::string::npos &&
              eval.text.find("optimizer              0.0 MiB") != std::string::npos;
    const double train_b = th::anatomy_bytes_per_param(trained.text, "activations"),
                 eval_b = th::anatomy_bytes_per_param(eval.text, "activations");
    ok = ok && eval_b > 0 && eval_b < train_b && eval.text.find("forward only: one layer's") != std::string::npos;
    th::report(ok, "-x 0: a checkpoint evaluated on validation shards alone, as a training run's first evaluation; "
               "one layer's activations", "activations %.2f B/param (training %.2f)\n%s\n%s", eval_b, train_b,
               want.c_str(), got.c_str());
    expect_error("refused: -x 0 with nothing to do", init + "-i " + cls3 + " -j '' -x 0",
                 "option --max-steps: 0 (no training) leaves nothing to do; ask for validation shards (-j) or "
                 "--export-hf");
    expect_error("refused: -x 0 with --eval-every", init + "-j " + cls3_val + " -x 0 --eval-every 2",
                 "option --eval-every: --max-steps 0 has no steps to evaluate between");
    expect_error("refused: -x 0 with --bench", "--bench --config tiny -x 0",
                 "option --max-steps: --bench needs at least 2 steps");
}

// Resuming takes the model, the task and the schedule from the run: a run of 3 epochs stopped after 2
// steps, resumed with -y alone, keeps its 18 steps (and warmup) and its log label; another task, a
// --config or --init other than the run's, tf32 for fp32 and shards with other label names are refused
// (before anything is written), the run's own --config accepted.
void test_resume_refusals(const std::string& cls3, const std::string& mlm) {
    std::string dir = g_tmp + "/resume_checks", args = "-i " + cls3 + " -j '' -b 16 -t 32 --eval-first 0 -o " + dir;
    th::ChildOutput first = run("--config tiny --epochs 3 -n 1 --stop-after 2 " + args);
    std::string batch = line_of(first.text, "batch: ");
    th::report(exited(first, 0) && batch.find("18 steps (6 per epoch)") != std::string::npos,
               "resume checks: a run of 3 epochs (18 steps) stopped after step 2", "%s", batch.c_str());
    std::string renamed = g_tmp + "/cls3_renamed.bin";
    write_renamed(cls3, renamed, {"classc", "classb", "classa"});
    expect_error("refused on resume: another --task", "--task mlm -y -i " + mlm + " -j '' -b 16 -t 32 -o " + dir,
                 "the run was trained with --task classify, this run has --task mlm (resuming must not change it)");
    expect_error("refused on resume: another --config", "--config mini -y " + args,
                 "option --config: mini is 4 layers, 256 channels, but resuming takes the model from the checkpoint");
    expect_error("refused on resume: --init (the run started from a random init)",
                 "--init " + kFixtures + "bert_tiny_cls -y " + args,
                 "resuming takes the model from the checkpoint (the run started from a random init)");
    expect_error("refused on resume: --precision tf32 for an fp32 run", "--precision tf32 -y " + args,
                 "the checkpoint was trained with --precision fp32, this run has tf32");
    expect_error("refused on resume: shards with other label names",
                 "-y -i " + renamed + " -j '' -b 16 -t 32 --eval-first 0 -o " + dir,
                 "the checkpoint's classifier has labels classa, classb, classc (id2label)");
    th::ChildOutput second = run("--config tiny -y --stop-after 1 " + args);
    std::string log = slurp(dir + "/log.jsonl");
    size_t at = log.find("{\"event\":\"resume\"");
    bool label = at != std::string::npos && log.find("\"label\":\"bert-tiny classify fp32\"", at) != std::string::npos;
    th::report(exited(second, 0) && line_of(second.text, "batch: ") == batch &&
                   second.text.find("stopped after step 3 of 18") != std::string::npos,
               "resumed with -y and the run's own --config: the same 18 steps and warmup (--epochs 3 kept)", "%s",
               line_of(second.text, "batch: ").c_str());
    th::report(label, "the resumed run keeps its log label (bert-tiny classify fp32)", "%s",
               at == std::string::npos ? "no resume line" : log.substr(at, log.find('\n', at) - at).c_str());
    // The run directory of the other trainer: its newest model file a llm.c GPT-2 one (magic 20240326).
    const std::string gpt2_dir = g_tmp + "/gpt2_run";
    th::run_command("rm -rf " + gpt2_dir + " && cp -r " + dir + " " + gpt2_dir);
    std::string model = gpt2_dir + checkpoint_file("", "model", 3), bytes = slurp(model);
    const int32_t gpt2_magic = 20240326;
    memcpy(&bytes[0], &gpt2_magic, 4);
    FILE* f = fopen(model.c_str(), "wb");
    fwrite(bytes.data(), 1, bytes.size(), f);
    fclose(f);
    const std::string said = model + ": the run in this directory is a train_gpt2 run (its newest checkpoint, step "
                                     "3): resume it with train_gpt2";
    expect_error("refused on resume: a train_gpt2 run's directory", "-y -i " + cls3 + " -j '' -b 16 -t 32 -o " +
                 gpt2_dir, said.c_str());
}

// The bundled task with -j '': the task line names the shards used, and no validation.
void test_default_task_without_val() {
    th::ChildOutput c = run("--config tiny -j '' -b 4 -t 32 --max-steps 1");
    std::string task = line_of(c.text, "task: ");
    th::report(exited(c, 0) && task.find("(dev/data/bert/genre_train.bin, no validation:") != std::string::npos &&
                   task.find("genre_val") == std::string::npos,
               "bundled task with -j '': the task line says no validation", "%s", task.c_str());
}

// MLM on sequences with one maskable token at --mask-rate 0.001: steps and the val split without a
// masked token say so instead of printing a NaN loss as if diverged; log.jsonl holds null losses.
void test_no_masked_tokens() {
    std::string mlm3 = th::write_bert_test_shard(g_tmp, "mlm3.bin", BertShardKind::MLM, 64, 3, 500, 0, 7);
    std::string dir = g_tmp + "/no_masked";
    th::ChildOutput c = run("--task mlm --config tiny -i " + mlm3 + " -j " + mlm3 + " -b 2 --max-steps 3 " +
                            "--mask-rate 0.001 -o " + dir);
    std::string log = slurp(dir + "/log.jsonl");
    bool said = c.text.find("loss nan (no masked tokens in this step: no loss, zero gradient) | norm 0.0000") !=
                    std::string::npos &&
                c.text.find("loss nan |") == std::string::npos;
    bool eval = c.text.find("eval step 3 (epoch 0.09) | no masked tokens to evaluate") != std::string::npos;
    bool json = log.find("\"loss\":null") != std::string::npos && log.find("nan") == std::string::npos;
    th::report(exited(c, 0) && said && eval && json,
               "MLM without masked tokens: the step and eval lines say so, log.jsonl has null losses",
               "exit %d, step line %s, eval line %s, log %s", WEXITSTATUS(c.status), said ? "ok" : "missing",
               eval ? "ok" : "missing", json ? "ok" : "not null");
}

// The fixture bert_tiny_cls in dir, its safetensors' bytes passed through plant(bytes, data_start)
// first (data_start: where the tensors' data begins). False when a file could not be read or written.
template <class Plant>
bool write_planted_cls_model(const std::string& dir, Plant plant) {
    th::run_command("mkdir -p " + dir + " && cp " + kFixtures + "bert_tiny_cls/config.json " + dir);
    std::string bytes = slurp(kFixtures + "bert_tiny_cls/model.safetensors");
    uint64_t header = 0;
    if (bytes.size() < 8) return false;
    memcpy(&header, bytes.data(), 8);
    if (8 + header + 4 > bytes.size() || !plant(bytes, 8 + header)) return false;
    FILE* f = fopen((dir + "/model.safetensors").c_str(), "wb");
    if (!f) return false;
    bool ok = fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    return fclose(f) == 0 && ok;
}

// A model whose weights are all NaN (bert_tiny_cls with its tensors' bytes overwritten): the loss of
// step 1 is NaN, and the run stops there with an error, before it writes a checkpoint. One NaN in
// layer 0's query weight reaches the loss only through the pooler's tanh: an evaluation of that model
// (-x 0) stops on its NaN validation loss too, instead of reporting a finite one.
void test_nan_loss_stops(const std::string& cls3) {
    const float nan = NAN;
    std::string dir = g_tmp + "/nan_model", out = g_tmp + "/nan_run";
    bool planted = write_planted_cls_model(dir, [&](std::string& bytes, size_t data) {
        for (size_t at = data; at + 4 <= bytes.size(); at += 4) memcpy(&bytes[at], &nan, 4);
        return true;
    });
    th::ChildOutput c = run("--init " + dir + " -i " + cls3 + " -j '' -b 4 -t 32 --max-steps 3 --eval-first 0 -n 1 -o " +
                            out);
    bool ok = planted && !th::exited_ok(c) && c.text.find("step 1: the loss is nan: training diverged") != std::string::npos &&
              complete_checkpoints(out).empty();
    th::report(ok, "a loss that is not finite stops the run, before any checkpoint", "%s",
               th::last_lines(c.text).c_str());

    const std::string one = g_tmp + "/one_nan_model", query = "bert.encoder.layer.0.attention.self.query.weight";
    planted = write_planted_cls_model(one, [&](std::string& bytes, size_t data) {
        json::Value h;
        std::string err;
        const json::Value *t, *offsets;
        if (!json::parse(bytes.data() + 8, data - 8, &h, &err) || !(t = h.get(query)) ||
            !(offsets = t->get("data_offsets")) || offsets->items.size() != 2)
            return false;
        size_t at = data + (size_t)offsets->items[0].integer + 4 * 5;  // the weight's element [0][5]
        if (at + 4 > bytes.size()) return false;
        memcpy(&bytes[at], &nan, 4);
        return true;
    });
    c = run("--init " + one + " -i " + cls3 + " -j " + cls3 + " -b 4 -t 32 -x 0");
    ok = planted && WIFEXITED(c.status) && WEXITSTATUS(c.status) == 1 &&
         c.text.find("step 0: the validation loss is nan: the model holds non-finite values") != std::string::npos;
    th::report(ok, "one NaN in a query weight: -x 0's evaluation stops on the NaN validation loss, exit 1",
               "exit %d | %s", WEXITSTATUS(c.status), th::last_lines(c.text).c_str());
}

// Same seed: the same losses; another seed: other losses (dropout on).
void test_seeds(const std::string& args) {
    std::vector<double> a = step_losses(run(args + " --seed 5").text), b = step_losses(run(args + " --seed 5").text),
                        c = step_losses(run(args + " --seed 6").text);
    th::report(a.size() == 4 && a == b, "two runs with the same seed are identical (dropout 0.1)", "%zu steps", a.size());
    th::report(a.size() == 4 && c.size() == 4 && a != c, "runs with different seeds differ (dropout 0.1)",
               "first losses %.6f vs %.6f", a.empty() ? 0 : a[0], c.empty() ? 0 : c[0]);
    // Only the dropout masks differ between these two (same seed for data and init).
    std::vector<double> d = step_losses(run(args + " --seed 5 --dropout 0").text);
    th::report(d.size() == 4 && d != a && d[0] != a[0], "dropout changes the training losses (0.1 vs 0)",
               "step 1: %.6f vs %.6f", a.empty() ? 0 : a[0], d.empty() ? 0 : d[0]);
}

// --cuda-graphs 1 (the default) against 0: fp16 (a loss scale), 2 micro-steps a step, dropout 0.1 and
// length-bucketed batches give the same logged losses, model and state files, byte
// for byte; each run says which it did. MLM: each batch has its own number of masked rows (its loss
// weight, read from device memory by the replays).
void test_cuda_graphs(const char* task, const std::string& args) {
    // Directories of the task's own: a fresh run refuses one that holds another run's checkpoints.
    std::string on = g_tmp + "/graphs_on_" + task, off = g_tmp + "/graphs_off_" + task;
    th::ChildOutput a = run(args + " -o " + on + " --cuda-graphs 1"), b = run(args + " -o " + off + " --cuda-graphs 0");
    std::string why;
    for (std::string f : {checkpoint_file("", "model", 5), state_file("", 5, 0)}) {
        std::string x = slurp(on + f), y = slurp(off + f);
        if (x.rfind("<missing", 0) == 0 || x != y) why = f.substr(1) + " differs";
    }
    if (why.empty() && (losses_of(on) != losses_of(off) || losses_of(on).empty())) why = "the logged losses differ";
    bool said = a.text.find("CUDA graphs: micro-steps replayed") != std::string::npos &&
                b.text.find("CUDA graphs: off (--cuda-graphs 0)") != std::string::npos;
    std::string name = std::string(task) + ": --cuda-graphs 1 == 0, bit for bit (fp16, 2 micro-steps, dropout 0.1, "
                       "length-bucketed)";
    th::report(exited(a, 0) && exited(b, 0) && why.empty() && said, name.c_str(), "%s%s", why.c_str(),
               said ? "" : " (the CUDA graphs line is missing)");
}

// --attention-backward tune on BERT-tiny (head size 64) with attention dropout 0.1, where the backward
// is mma.sync's: each batch width's first micro-step (length-bucketed batches; CUDA graphs on) runs
// eagerly and times its 2 forms (step 1's width, then step 2's, 32, said at that step); the same logged
// losses and model as auto's, bit for bit.
void test_attention_tune(const std::string& cls3) {
    const std::string args = "--config tiny -i " + cls3 + " -j '' -b 4 -t 32 --max-steps 3 --eval-first 0 -l 1e-3 "
                             "--precision bf16 --dropout 0.1 -n 3 -o " + g_tmp + "/tune_";
    th::ChildOutput a = run(args + "auto"), t = run(args + "tuned --attention-backward tune");
    const size_t at = t.text.find("attention backward tuned: ");
    const bool said = at != std::string::npos && t.text.find("(2 forms timed)", at) != std::string::npos &&
                      t.text.find("| attention backward: mma.sync in the fastest of its 2 forms") != std::string::npos &&
                      t.text.find("attention backward tuned at step 2: B=4 T=32 ") != std::string::npos;
    const std::string model = checkpoint_file("", "model", 3);
    const bool same = slurp(g_tmp + "/tune_auto" + model).rfind("<missing", 0) != 0 &&
                      slurp(g_tmp + "/tune_auto" + model) == slurp(g_tmp + "/tune_tuned" + model) &&
                      !losses_of(g_tmp + "/tune_auto").empty() &&
                      losses_of(g_tmp + "/tune_auto") == losses_of(g_tmp + "/tune_tuned");
    th::report(exited(a, 0) && exited(t, 0) && same && said,
               "--attention-backward tune (BERT-tiny, attention dropout: mma.sync's 2 forms) == auto, bit for bit",
               "%s", at == std::string::npos ? th::last_lines(t.text).c_str()
                                              : t.text.substr(at, t.text.find("\n", t.text.find("\n", at) + 1) - at).c_str());
}

void test_mlm(const std::string& mlm_train, const std::string& mlm_val) {
    th::ChildOutput c = run("--task mlm --init " + kFixtures + "bert_tiny_mlm -i " + mlm_train + " -j " + mlm_val +
                            " -b 8 -t 48 --max-steps 6 -l 1e-3 --mask-rate 0.3");
    size_t at = c.text.rfind("eval step 6");
    bool ok = exited(c, 0) && at != std::string::npos && c.text.find("MLM accuracy", at) != std::string::npos &&
              step_losses(c.text).size() == 6;
    th::report(ok, "MLM pretraining runs (dynamic masking, 30%) and reports MLM accuracy", "%s",
               ok ? c.text.substr(at, c.text.find('\n', at) - at).c_str() : c.text.c_str());
}

// --export-hf writes a BertForSequenceClassification that our loader reads back with the labels'
// names, bit-identical to the final checkpoint's tensors.
void test_export(const std::string& cls3) {
    std::string out = g_tmp + "/export_run", hf = g_tmp + "/export_hf";
    th::ChildOutput c = run("--init " + kFixtures + "bert_tiny_cls -i " + cls3 + " -b 4 -t 32 --max-steps 2 " +
                            "--eval-first 0 -o " + out + " --export-hf " + hf);
    BertConfig a, b;
    BertParts pa, pb;
    std::vector<float> exported = load_hf_bert(hf, &a, &pa), checkpoint = load_hf_bert(checkpoint_file(out, "model", 2), &b, &pb);
    // The export holds the classification model only: compare the encoder, pooler and classifier.
    size_t sizes[NUM_BERT_TENSORS];
    bert_param_sizes(a, sizes);
    bool same = exported.size() == checkpoint.size() && pa.has[PART_CLASSIFIER] && !pa.has[PART_MLM];
    size_t at = 0;
    for (int i = 0; i < NUM_BERT_TENSORS && same; at += sizes[i], i++)
        if (bert_param_part(i) != PART_MLM)
            same = memcmp(exported.data() + at, checkpoint.data() + at, sizes[i] * sizeof(float)) == 0;
    std::string config = slurp(hf + "/config.json");
    bool names = config.find("\"0\": \"classa\"") != std::string::npos &&
                 config.find("\"BertForSequenceClassification\"") != std::string::npos;
    th::report(exited(c, 0) && same && names, "--export-hf: our loader reads it back, label names in config.json",
               "exit %d", WEXITSTATUS(c.status));
}

// A transformers BERT's settings that the model does not set (pad_token_id, tokenizer_class, ...) and
// its tokenizer files go out with --export-hf, from the run and from its resume (OUTDIR/hf_source);
// what the run decides (dropout, labels) is the run's.
void test_export_carries_source(const std::string& cls3) {
    const std::string src = g_tmp + "/carry_src", out = g_tmp + "/carry_run";
    std::string config = slurp(kFixtures + "bert_tiny_cls/config.json"), err;
    const std::pair<std::string, std::string> edits[] = {
        {"\"pad_token_id\": 0", "\"pad_token_id\": 1"},
        {"\"use_cache\": true", "\"tokenizer_class\": \"BertTokenizer\",\n  \"use_cache\": false"}};
    for (const auto& e : edits) {
        size_t at = config.find(e.first);
        if (at == std::string::npos) data_error("config.json has no %s", e.first.c_str());
        config.replace(at, e.first.size(), e.second);
    }
    const std::string weights = slurp(kFixtures + "bert_tiny_cls/model.safetensors");
    const std::vector<std::pair<std::string, std::string>> files = {
        {"model.safetensors", weights}, {"config.json", config},
        {"tokenizer_config.json", "{\"do_lower_case\": true}"}, {"special_tokens_map.json", "{\"pad_token\": \"[PAD]\"}"}};
    bool written = make_dirs(src, &err);
    for (const auto& f : files)
        written = written && write_file_atomic(src + "/" + f.first, {{f.second.data(), f.second.size()}}, &err);
    auto problems = [&](const th::ChildOutput& c, const std::string& hf) {
        if (!exited(c, 0)) return th::last_lines(c.text);
        std::string text = slurp(hf + "/config.json"), why;
        json::Value v;
        if (!json::parse(text.data(), text.size(), &v, &err)) return hf + "/config.json: " + err;
        const json::Value *pad = v.get("pad_token_id"), *cls = v.get("tokenizer_class"), *cache = v.get("use_cache"),
                          *drop = v.get("hidden_dropout_prob"), *labels = v.get("id2label");
        if (!pad || pad->integer != 1 || !cls || cls->str != "BertTokenizer" || !cache || cache->boolean)
            why += " the source's pad_token_id, tokenizer_class or use_cache not carried;";
        if (!drop || drop->number != 0.05 || !labels || !labels->get("0") || labels->get("0")->str != "classa")
            why += " the run's dropout or label names not the export's;";
        for (size_t k = 2; k < files.size(); k++)
            if (slurp(hf + "/" + files[k].first) != files[k].second) why += " " + files[k].first + " not copied;";
        return why;
    };
    const std::string args = "--init " + src + " -i " + cls3 + " -b 4 -t 32 --eval-first 0 -j '' --dropout 0.05 -o " + out;
    std::string why = written ? problems(run(args + " --max-steps 2 --export-hf " + g_tmp + "/carry_hf"),
                                         g_tmp + "/carry_hf")
                              : err;
    th::report(why.empty(), "--export-hf of a transformers BERT: its other settings and tokenizer files carried over",
               "%s", why.c_str());
    why = problems(run(args + " --max-steps 3 --resume --export-hf " + g_tmp + "/carry_hf_resumed"),
                   g_tmp + "/carry_hf_resumed");
    th::report(why.empty(), "... and by a resumed run (from its output directory's hf_source)", "%s", why.c_str());
}

// Shards whose one label is named LABEL_1, transformers' generic name of output 1: the export names
// output 1 otherwise (id2label and label2id need distinct names), and the export loads back.
void test_export_generic_label_name() {
    std::string path = th::write_bert_test_shard(g_tmp, "label_1.bin", BertShardKind::Classify, 32, 32, 500, 1, 5);
    BertShard shard;
    std::string err, hf = g_tmp + "/export_label_1";
    bool renamed = read_bert_shard(path, &shard, &err);
    shard.label_names = {"LABEL_1"};
    renamed = renamed && write_bert_shard(path, shard, &err);
    th::ChildOutput a = run("--config tiny -i " + path + " -j '' -b 4 -t 32 -x 1 --export-hf " + hf);
    th::ChildOutput b = run("--init " + hf + " -i " + path + " -j '' -b 4 -t 32 -x 1");
    std::string config = slurp(hf + "/config.json");
    json::Value v;
    const json::Value* id2label = json::parse(config.data(), config.size(), &v, &err) ? v.get("id2label") : nullptr;
    bool names = id2label && id2label->fields.size() == 2 && id2label->get("0") && id2label->get("1") &&
                 id2label->get("0")->str == "LABEL_1" && id2label->get("1")->str == "LABEL_1_unused";
    th::report(renamed && exited(a, 0) && exited(b, 0) && names,
               "--export-hf of shards labelled LABEL_1: output 1 named LABEL_1_unused, and the export loads back",
               "exit %d, %d | %s", WEXITSTATUS(a.status), WEXITSTATUS(b.status), th::last_lines(b.text).c_str());
}

// The gradients with dropout on are those of the loss with those masks: backward() redraws every
// site's mask as forward() drew it. Checked as a directional derivative over all parameters at once
// (the tiny fixture model, a batch of uneven lengths, p = 0.2): g·v from backward() against the central
// difference (L(θ + hv) - L(θ - hv)) / 2h of training passes with the same dropout_pass (the same masks).
// The difference's own error at h = 1e-3: truncation ~h^2 (measured 2.3e-2, 3e-3, 8.7e-4 relative at h =
// 1e-2, 3e-3, 1e-3: it shrinks as h^2 towards g·v) plus fp32 rounding of the two losses (~1e-6) / 2h,
// ~5e-4 absolute, up to 6e-3 of the classification's |g·v| ~ 0.08: hence 1e-2 relative. A mask applied
// at the wrong site or with the wrong offset in the backward is off by about as much as dropping no mask
// at all (30-70% here), which the check requires to be 20x the error.
void test_dropout_gradients(BertHead head) {
    BertConfig c;
    std::vector<float> p = load_hf_bert(kFixtures + (head == BertHead::MLM ? "bert_tiny_mlm" : "bert_tiny_cls"), &c);
    const int B = 4, T = 32;
    matmul_init(false);
    BERT<float> m;
    m.dropout = BertDropout::all(0.2f);
    m.dropout_seed = 99;
    m.dropout_pass = 7;
    m.build(c, p);
    m.allocate_activations(B, T);
    std::vector<int> ids(B * T, 0), valid = {32, 20, 9, 3}, targets(head == BertHead::MLM ? B * T : B, -100);
    BertRng rng({5});
    for (int b = 0; b < B; b++)
        for (int t = 0; t < valid[b]; t++) ids[b * T + t] = t == 0 ? 101 : 110 + (int)rng.below(c.vocab_size - 110);
    if (head == BertHead::MLM) {
        for (int b = 0; b < B; b++)
            for (int t = 1; t < valid[b]; t += 3) targets[b * T + t] = ids[b * T + t];
    } else {
        for (int b = 0; b < B; b++) targets[b] = b % c.num_labels;
    }
    m.set_batch(ids.data(), nullptr, valid.data(), targets.data(), head);
    auto loss_at = [&](const std::vector<float>& params) {
        cudaCheck(cudaMemcpy(m.params_memory, params.data(), params.size() * sizeof(float), cudaMemcpyHostToDevice));
        m.forward(true, 1.f / m.head_rows);
        return (double)m.mean_loss();
    };
    loss_at(p);
    cudaCheck(cudaMemset(m.grads_memory, 0, m.num_parameters * sizeof(float)));
    m.backward();
    std::vector<float> g(m.num_parameters);
    cudaCheck(cudaMemcpy(g.data(), m.grads_memory, g.size() * sizeof(float), cudaMemcpyDeviceToHost));
    std::vector<float> v(p.size()), plus(p.size()), minus(p.size());
    double gv = 0, h = 1e-3;
    for (size_t i = 0; i < p.size(); i++) {
        v[i] = (float)(rng.uniform() * 2 - 1);
        gv += (double)g[i] * v[i];
        plus[i] = p[i] + (float)h * v[i];
        minus[i] = p[i] - (float)h * v[i];
    }
    double fd = (loss_at(plus) - loss_at(minus)) / (2 * h);
    // and the same at p = 0 (the eval-mode model): the two must differ, or no mask was applied
    m.dropout = BertDropout::all(0.f);
    double no_drop = (loss_at(plus) - loss_at(minus)) / (2 * h);
    double err = std::fabs(gv - fd) / std::fabs(fd);
    char name[128];
    snprintf(name, sizeof(name), "dropout 0.2, %s head: backward's gradient = the masked loss's (directional derivative)",
             head == BertHead::MLM ? "MLM" : "classification");
    th::report(err < 1e-2 && std::fabs(no_drop - fd) > 20 * std::fabs(gv - fd), name,
               "g.v %.7g, central difference %.7g (rel err %.1e); without dropout %.7g", gv, fd, err, no_drop);
    m.free_all();
    matmul_destroy();
}

// ----------------------------------------------------------------------------
// Export mode for test/hf_train_bert_export.py

// Our fp32 logits for a batch of `n` sequences of shard `path` (width T) from the export in dir.
void write_ours(const std::string& dir, const std::string& path, BertHead head, const std::string& out) {
    BertConfig c;
    std::vector<float> p = load_hf_bert(dir, &c);
    BertDataLoader::Options lo;
    lo.B = 4;
    lo.T = 32;
    lo.eval = true;
    lo.mask_rate = 0.3;
    BertDataLoader data(path, lo);
    matmul_init(false);
    BERT<float> m;
    m.build(c, p);
    m.allocate_activations(lo.B, lo.T, data.max_masked_rows() ? data.max_masked_rows() : -1);
    m.set_batch(data.inputs(), data.token_types(), data.valid_len(), data.targets(), head, false, data.T());
    m.forward(false, 0.f);
    int R = m.head_rows, W = head == BertHead::MLM ? c.padded_vocab_size : c.num_labels;
    int V = head == BertHead::MLM ? c.vocab_size : c.num_labels;
    std::vector<float> logits((size_t)R * W), real((size_t)R * V);
    cudaCheck(cudaMemcpy(logits.data(), head == BertHead::MLM ? m.acts.logits : m.acts.cls_logits,
                         logits.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (int r = 0; r < R; r++) std::copy(logits.begin() + (size_t)r * W, logits.begin() + (size_t)r * W + V, real.begin() + (size_t)r * V);
    int B = lo.B, T = data.T();
    std::vector<float> ids(data.inputs(), data.inputs() + B * T), valid(data.valid_len(), data.valid_len() + B);
    bool per_token = head == BertHead::MLM;
    std::vector<float> labels(data.targets(), data.targets() + (per_token ? B * T : B));
    SafeTensorsWriter w;
    w.add("input_ids", ids.data(), {(size_t)B, (size_t)T});
    w.add("valid_len", valid.data(), {(size_t)B});
    w.add("labels", labels.data(), per_token ? std::vector<size_t>{(size_t)B, (size_t)T} : std::vector<size_t>{(size_t)B});
    w.add("logits", real.data(), {(size_t)R, (size_t)V});
    std::string err;
    if (!w.write(out, &err)) data_error("%s", err.c_str());
    m.free_all();
    matmul_destroy();
}

int export_mode(const std::string& dir) {
    g_tmp = dir;
    std::string cls3 = th::write_bert_test_shard(g_tmp, "cls3.bin", BertShardKind::Classify, 96, 32, 500, 3, 1);
    std::string mlm = th::write_bert_test_shard(g_tmp, "mlm.bin", BertShardKind::MLM, 96, 48, 500, 0, 2);
    std::string self = g_self;
    if (run("--init " + kFixtures + "bert_tiny_cls -i " + cls3 + " -b 4 -t 32 --max-steps 3 --eval-first 0 " +
            "--export-hf " + dir + "/cls").status != 0 ||
        run("--task mlm --init " + kFixtures + "bert_tiny_mlm -i " + mlm + " -b 4 -t 32 --max-steps 3 " +
            "--precision bf16 --mask-rate 0.3 --export-hf " + dir + "/mlm").status != 0) {
        fprintf(stderr, "the training runs failed\n");
        return 1;
    }
    write_ours(dir + "/cls", cls3, BertHead::Classify, dir + "/ours_cls.safetensors");
    write_ours(dir + "/mlm", mlm, BertHead::MLM, dir + "/ours_mlm.safetensors");
    return 0;
}

int main(int argc, char** argv) {
    g_self = argv[0];
    if (argc >= 2 && !strcmp(argv[1], "--train-bert")) return train_bert_main(argc - 1, argv + 1);
    if (argc == 3 && !strcmp(argv[1], "--export")) return export_mode(argv[2]);
    char tmpl[] = "/tmp/test_train_bert_XXXXXX";
    if (!mkdtemp(tmpl)) data_error("cannot create a temporary directory");
    g_tmp = tmpl;

    std::string cls3 = th::write_bert_test_shard(g_tmp, "cls3.bin", BertShardKind::Classify, 96, 32, 500, 3, 1);
    std::string cls3_val = th::write_bert_test_shard(g_tmp, "cls3_val.bin", BertShardKind::Classify, 24, 32, 500, 3, 11);
    std::string cls4 = th::write_bert_test_shard(g_tmp, "cls4.bin", BertShardKind::Classify, 64, 32, 500, 4, 3);
    std::string v200 = th::write_bert_test_shard(g_tmp, "v200.bin", BertShardKind::Classify, 64, 32, 200, 2, 4);
    std::string mlm = th::write_bert_test_shard(g_tmp, "mlm.bin", BertShardKind::MLM, 96, 48, 500, 0, 5);
    std::string mlm_val = th::write_bert_test_shard(g_tmp, "mlm_val.bin", BertShardKind::MLM, 24, 48, 500, 0, 6);

    test_help();
    test_refusals(cls3, cls4, v200, mlm);
    test_default_task();
    test_default_task_without_val();
    test_label_names(cls3);
    std::string fixture = "--init " + kFixtures + "bert_tiny_cls -i " + cls3 + " -j " + cls3_val + " -b 4 -t 32";
    // fp32: one epoch (24 steps) with --lr and --max-steps left at auto (the resumed run must take the
    // first part's values, though it no longer starts from a pretrained checkpoint); bf16: gradient
    // accumulation, 5 steps.
    test_resume("fp32", fixture + " --epochs 1", " --dropout 0.1", 24, 4);
    test_resume("bf16", fixture + " -l 1e-3 --precision bf16 -d 8 --max-steps 5",
                " --dropout 0.1 --attention-dropout 0.05", 5, 2);
    test_stop_on_signal(cls3);
    test_damaged_resume(cls3);
    test_dropout_from_config(cls3);
    test_vocab_fingerprint(cls3);
    test_resume_refusals(cls3, mlm);
    test_no_training(cls3, cls3_val);
    test_cuda_graphs("classify", fixture + " -l 1e-3 --precision fp16 -d 8 --max-steps 5 --eval-first 0 --dropout 0.1");
    test_cuda_graphs("mlm", "--task mlm --init " + kFixtures + "bert_tiny_mlm -i " + mlm + " -j " + mlm_val +
                                " -b 4 -t 48 -l 1e-3 --precision fp16 -d 8 --max-steps 5 --eval-first 0 "
                                "--mask-rate 0.3 --dropout 0.1");
    test_seeds("--config tiny -i " + cls3 + " -b 4 -t 32 --max-steps 4 --eval-first 0 -l 1e-3");
    test_attention_tune(cls3);
    test_mlm(mlm, mlm_val);
    test_no_masked_tokens();
    test_nan_loss_stops(cls3);
    test_dropout_gradients(BertHead::Classify);
    test_dropout_gradients(BertHead::MLM);
    test_export(cls3);
    test_export_carries_source(cls3);
    test_export_generic_label_name();

    if (!getenv("KEEP_TMP")) th::run_command("rm -rf " + g_tmp);
    return th::finish();
}

}  // namespace test_train_bert
TH_MAIN(test_train_bert)
