// llmc/run_options.h — the options both trainers share, declared once in the llmc/cli.h table and
// bound to RunOptions: data and batch, schedule, optimizer, precision, recompute, seed, checkpoints,
// ranks and the log. Each trainer adds its own options (the model, sampling, the task) around them.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attention.cuh"
#include "checkpoint.h"
#include "cli.h"
#include "dataloader.h"  // data_error
#include "distributed.h"
#include "file_io.h"  // same_file, model_folder
#include "json.h"  // shortest_float
#include "matmul.cuh"  // BiasGradRoute
#include "model_state.cuh"
#include "precision.cuh"
#include "schedulers.h"

// Which kernel the 16-bit attention backward takes (--attention-backward; llmc/attention.cuh): Auto,
// Mma, Mma with dQ's slices summed by the tiles' last writers (MmaSum), Auto's kernel in the fastest of
// its forms on this GPU (Tune: attention_backward_tune times them at the first step), or a form of the
// wgmma kernel —
// its registers capped for 3 blocks per SM (-3), dQ added by reductions in L2 (-red), dQ's slices summed
// by the tiles' last writers (-sum): the bits kWgmma3, kWgmmaRed, kWgmmaSum over Wgmma
// (attention_backward_wgmma_blocks, attention_backward_wgmma_red_dq, attention_backward_sum_dq).
enum class AttentionBackward { Auto, Mma, MmaSum, Tune, Wgmma };
constexpr int kWgmma3 = 1, kWgmmaRed = 2, kWgmmaSum = 4;
inline bool wgmma_form_has(AttentionBackward a, int bit) {
    return (int)a >= (int)AttentionBackward::Wgmma && (((int)a - (int)AttentionBackward::Wgmma) & bit);
}
// Its names on the command line: auto, mma, mma-sum, tune, then wgmma[-3][-red][-sum].
inline const std::vector<std::pair<const char*, AttentionBackward>>& attention_backward_choices() {
    static const std::vector<std::pair<const char*, AttentionBackward>> choices = [] {
        static const char* const wgmma[8] = {"wgmma",     "wgmma-3",     "wgmma-red",     "wgmma-3-red",
                                             "wgmma-sum", "wgmma-3-sum", "wgmma-red-sum", "wgmma-3-red-sum"};
        std::vector<std::pair<const char*, AttentionBackward>> c = {
            {"auto", AttentionBackward::Auto}, {"mma", AttentionBackward::Mma}, {"mma-sum", AttentionBackward::MmaSum},
            {"tune", AttentionBackward::Tune}};
        for (int bits = 0; bits < 8; bits++)
            c.push_back({wgmma[bits], AttentionBackward((int)AttentionBackward::Wgmma + bits)});
        return c;
    }();
    return choices;
}
inline const char* attention_backward_name(AttentionBackward a) {
    for (const auto& [name, value] : attention_backward_choices())
        if (value == a) return name;
    return "?";
}

// What a training run is asked to do, as far as both trainers agree on it.
struct RunOptions {
    // Data and batch
    std::string train_pattern, val_pattern;  // shard globs ("" val: no validation)
    int B = 4;                               // micro-batch size in sequences (0: GPT-2's --batch-size auto)
    long long total_batch = -1;              // per optimizer step, summed over ranks (GPT-2: tokens, BERT:
                                             // sequences); -1: one micro-batch on every rank
    // Schedule
    float lr = 3e-4f;
    LRSchedule schedule = LRSchedule::Cosine;
    double warmup = 0;          // linear warmup: below 1 a fraction of the run's steps, else steps
    float final_lr_frac = 0.f;  // the lr at the last step, as a fraction of the peak (GPT-2's --final-lr-frac)
    int max_steps = -1;         // -1: the trainer's own measure (GPT-2: one epoch, BERT: --epochs)
    // Optimizer
    OptimizerConfig opt;
    float grad_clip = 1.f;      // on the global gradient norm (0: off)
    // Precision and memory
    Precision precision = Precision::FP32;
    bool tf32 = false;          // fp32 with TF32 tensor-core matmuls
    bool fp8 = false;           // bf16 with fp8 GEMMs (GPT-2's blocks only)
    float loss_scale = 65536.f; // fp16: initial dynamic loss scale (PyTorch GradScaler's defaults)
    int loss_scale_window = 2000;  // fp16: clean steps before the scale doubles
    Recompute recompute = Recompute::None;
    AttentionBackward attention_backward = AttentionBackward::Auto;  // --attention-backward
    bool gemm_autotune = false;  // time cuBLASLt's candidate algorithms per GEMM shape (llmc/matmul.cuh)
    BiasGradRoute bias_grad = BiasGradRoute::Auto;  // --bias-grad (llmc/matmul.cuh's matmul_bias_grad_in_gemm)
    uint64_t seed = 42;
    // Checkpoints and export
    std::string output_dir;     // log.jsonl and checkpoints go here ("" = nowhere)
    std::string export_hf;      // write a transformers model here after training ("" = no)
    int checkpoint_every = 0;   // steps between checkpoints (0: only at the end of the run)
    int keep_checkpoints = 0;   // keep the newest K checkpoints (0: all)
    int stop_after = 0;         // leave after this many steps of this run, to resume later (0: run to the end)
    bool resume = false;        // continue from the newest complete checkpoint in output_dir
    // Ranks and the log
    int zero = 0;               // data parallel: ZeRO stage (llmc/model_state.cuh)
    bool log_ranks = false;     // with output_dir: every rank also writes its own log (log_rank<R>.jsonl)
    std::string label;          // the run's name in the log
    int profile_step = 0;       // bracket this step of the run with cudaProfilerStart/Stop (0: none)

    // The learning rate of every step of a run of `steps` steps.
    LRScheduler scheduler(int steps) const {
        LRScheduler s;
        s.kind = schedule;
        s.max_lr = lr;
        s.total = steps;
        s.warmup = warmup < 1 ? (int)std::lround(warmup * steps) : (int)warmup;
        s.final_fraction = final_lr_frac;
        return s;
    }
};

// A training-state recipe (llmc/checkpoint.h): "key=value" pairs one space apart, numbers as the
// shortest text of their float value.
class Recipe {
  public:
    Recipe& add(const char* key, const std::string& value) {
        text_ += std::string(text_.empty() ? "" : " ") + key + "=" + value;
        return *this;
    }
    Recipe& add(const char* key, double value) { return add(key, json::shortest_float((float)value)); }
    Recipe& add(const char* key, int value) { return add(key, std::to_string(value)); }
    const std::string& text() const { return text_; }

  private:
    std::string text_;
};

// The shared part of a run's recipe: the schedule as resolved for the run (peak lr, kind, warmup and
// total steps, final fraction), clipping, the optimizer's hyperparameters, fp16's scale window.
inline Recipe run_recipe(const RunOptions& o, const LRScheduler& sched) {
    Recipe r;
    r.add("lr", sched.max_lr).add("schedule", lr_schedule_name(sched.kind)).add("warmup_steps", sched.warmup);
    r.add("steps", sched.total).add("final_lr_frac", sched.final_fraction).add("grad_clip", o.grad_clip);
    const OptimizerConfig& p = o.opt;
    r.add("weight_decay", p.weight_decay);
    switch (p.kind) {
        case OptimizerKind::AdamW:
        case OptimizerKind::AdamW8bit: r.add("beta1", p.beta1).add("beta2", p.beta2).add("eps", p.eps); break;
        case OptimizerKind::SGD: r.add("momentum", p.momentum).add("nesterov", p.nesterov ? 1 : 0); break;
        case OptimizerKind::Adafactor:
            r.add("adafactor_beta1", p.adafactor.use_first_moment ? p.adafactor.beta1 : 0)
                .add("adafactor_clip", p.adafactor.clip_threshold)
                .add("adafactor_decay_rate", p.adafactor.decay_rate);
            break;
    }
    if (o.precision == Precision::FP16) r.add("loss_scale_window", o.loss_scale_window);
    return r;
}

// What the shared options differ in between the trainers: defaults, and the words for their units.
struct RunOptionTexts {
    const char* train_data;       // --train-data's default and help
    const char* train_data_help;
    const char* val_data;
    const char* val_data_help;
    const char* batch_size;       // --batch-size's default and help; batch_auto: "auto" is a value (B = 0)
    const char* batch_help;
    bool batch_auto = false;
    const char* batch_unit;       // what --total-batch-size counts: "TOKENS" or "SEQUENCES"
    const char* total_batch_help;
    const char* lr_help;          // --lr's default is auto: the trainer says what it resolves to
    const char* warmup;
    const char* max_steps;
    const char* max_steps_help;
    const char* precision;
    const char* precision_help;
    const char* beta2;            // AdamW's beta2 and the weight decay (GPT-2: llm.c's; BERT: fine-tuning's)
    const char* weight_decay;
    const char* recompute_help;   // what each level keeps differs between the models
    const char* seed_help;
};

// Reads --precision fp32 | tf32 | bf16 | fp16 | fp8 (whether fp8 is available is the trainer's call).
inline void read_precision_option(const Cli& cli, RunOptions* o) {
    std::string name = cli.str("precision");
    o->tf32 = name == "tf32";
    o->fp8 = name == "fp8";
    if (name == "fp32" || name == "tf32") o->precision = Precision::FP32;
    else if (name == "bf16" || name == "fp8") o->precision = Precision::BF16;
    else if (name == "fp16") o->precision = Precision::FP16;
    else cli.fail("option --precision: '%s' is not one of fp32, tf32, bf16, fp16, fp8", name.c_str());
}

// Reads --recompute: a level's name or llm.c's number (0-3).
inline void read_recompute_option(const Cli& cli, Recompute* out) {
    std::string name = cli.str("recompute"), list;
    for (Recompute r : {Recompute::None, Recompute::Gelu, Recompute::LN, Recompute::Layer}) {
        if (name == recompute_name(r) || name == std::to_string((int)r)) {
            *out = r;
            return;
        }
        list += std::string(list.empty() ? "" : ", ") + recompute_name(r) + " (" + std::to_string((int)r) + ")";
    }
    cli.fail("option --recompute: '%s' is not one of %s", name.c_str(), list.c_str());
}

// Declares the shared options, bound to *o (which must outlive cli.parse()).
inline void add_run_options(Cli& cli, RunOptions* o, const RunOptionTexts& t) {
    // Data and batch
    cli.add("train-data", "i", "GLOB", t.train_data, t.train_data_help, &o->train_pattern);
    cli.add("val-data", "j", "GLOB", t.val_data, t.val_data_help, &o->val_pattern);
    cli.add("batch-size", "b", t.batch_auto ? "INT|auto" : "INT", t.batch_size, t.batch_help);
    cli.on_value("batch-size", [o, auto_ok = t.batch_auto](const Cli& c) {
        o->B = auto_ok && c.str("batch-size") == "auto" ? 0 : (int)c.integer("batch-size", 1, 1 << 16);
    });
    cli.add("total-batch-size", "d", t.batch_unit, "-1", t.total_batch_help, &o->total_batch, -1, 1ll << 40);
    // Schedule
    cli.add("lr", "l", "FLOAT", "auto", t.lr_help, &o->lr, 0, 10);
    cli.add_choice("lr-schedule", "k", "NAME", "cosine", "cosine | linear | constant | wsd", &o->schedule,
                   {{"cosine", LRSchedule::Cosine}, {"linear", LRSchedule::Linear},
                    {"constant", LRSchedule::Constant}, {"wsd", LRSchedule::WSD}});
    cli.add("warmup", "u", "FRACTION|STEPS", t.warmup,
            "linear warmup: below 1 a fraction of the run's steps, else steps", &o->warmup, 0, 1e9);
    cli.add("max-steps", "x", "INT", t.max_steps, t.max_steps_help, &o->max_steps, -1, 1 << 30);
    // Optimizer
    OptimizerConfig* opt = &o->opt;
    cli.add_choice("optimizer", nullptr, "NAME", "adamw", "adamw | adamw8bit (8-bit moments) | adafactor | sgd",
                   &opt->kind, {{"adamw", OptimizerKind::AdamW}, {"adamw8bit", OptimizerKind::AdamW8bit},
                                {"adafactor", OptimizerKind::Adafactor}, {"sgd", OptimizerKind::SGD}});
    cli.add("weight-decay", "c", "FLOAT", t.weight_decay,
            "weight decay, matrices only (AdamW/Adafactor: decoupled; SGD: L2)", &opt->weight_decay, 0, 10);
    cli.add("beta1", nullptr, "FLOAT", "0.9", "AdamW beta1", &opt->beta1, 0, 1);
    cli.add("beta2", nullptr, "FLOAT", t.beta2, "AdamW beta2", &opt->beta2, 0, 1);
    cli.add("adam-eps", nullptr, "FLOAT", "1e-8", "AdamW epsilon", &opt->eps, 0, 1);
    cli.add("momentum", nullptr, "FLOAT", "0.9", "SGD momentum (0: plain SGD)", &opt->momentum, 0, 1);
    cli.add_flag("nesterov", nullptr, "SGD: Nesterov momentum", &opt->nesterov);
    // Adafactor keeps transformers' defaults (relative step sizes scaled by each matrix's RMS, no
    // first moment) unless --lr is given, which then sets the step size (and the schedule applies).
    AdafactorConfig* af = &opt->adafactor;
    cli.add("adafactor-beta1", nullptr, "FLOAT", "0",
            "Adafactor first-moment decay (0: none, as transformers' default)", &af->beta1, 0, 1);
    cli.add("adafactor-clip", nullptr, "FLOAT", "1.0", "Adafactor update clipping threshold (RMS)", &af->clip_threshold,
            1e-6, 1e6);
    cli.add("adafactor-decay-rate", nullptr, "FLOAT", "-0.8", "Adafactor second-moment decay exponent",
            &af->decay_rate, -1, 0);
    cli.add("grad-clip", nullptr, "FLOAT", "1.0", "clip the global gradient norm to this (0: off)", &o->grad_clip, 0,
            1e9);
    // Precision and memory
    cli.add("precision", nullptr, "NAME", t.precision, t.precision_help);
    cli.on_value("precision", [o](const Cli& c) { read_precision_option(c, o); });
    cli.add("loss-scale", nullptr, "FLOAT", "65536", "fp16: initial loss scale (a power of two)", &o->loss_scale, 1,
            1e30);
    cli.add("loss-scale-window", nullptr, "STEPS", "2000", "fp16: clean steps before the loss scale doubles",
            &o->loss_scale_window, 1, 1 << 30);
    cli.add("recompute", "r", "WHAT", "none", t.recompute_help);
    cli.on_value("recompute", [o](const Cli& c) { read_recompute_option(c, &o->recompute); });
    cli.add_choice("attention-backward", nullptr, "NAME", "auto",
                   "the bf16/fp16 attention backward: auto (wgmma where it applies, else mma) | mma (mma.sync, "
                   "FlashAttention-2 style) | mma-sum (mma with each query tile's dQ summed from its slices by "
                   "the block adding the last of them instead of by a kernel of its own; head size 64) | wgmma (Hopper's warpgroup MMA: an H100/H200 and a build for it; "
                   "head size 64, no attention dropout) | wgmma-3 (wgmma with its registers capped for 3 blocks "
                   "per SM instead of 2) | wgmma-red (wgmma adding dQ by reductions in L2) | wgmma-3-red (both) | "
                   "wgmma-sum, wgmma-3-sum, wgmma-red-sum, wgmma-3-red-sum (those, dQ summed as mma-sum's) | tune "
                   "(auto's kernel in the fastest of its forms, timed at the first step: wgmma's 8 or mma's 2; head "
                   "size 64); mma-sum gives mma's gradients, the wgmma forms and tune auto's",
                   &o->attention_backward, attention_backward_choices());
    cli.add("gemm-autotune", nullptr, "0", "time up to 8 of cuBLASLt's algorithms for each GEMM shape at its first "
            "call (the first step) and keep the fastest (1), or take the heuristic's first choice (0); a tuned run "
            "may differ in the last bits from an untuned one, and a resumed run tunes again", &o->gemm_autotune);
    cli.add_choice("bias-grad", nullptr, "NAME", "auto",
                   "where a linear layer's bias gradient is summed: auto (kernels on an H100/H200, gemm elsewhere) "
                   "| gemm (in the weight-gradient GEMM: cuBLASLt's BGRADB epilogue, where it takes it) | kernels "
                   "(the deterministic reduction kernels); the last bits of a run differ between the two",
                   &o->bias_grad,
                   {{"auto", BiasGradRoute::Auto},
                    {"gemm", BiasGradRoute::InGemm},
                    {"kernels", BiasGradRoute::Kernels}});
    cli.add("seed", nullptr, "INT", "42", t.seed_help, &o->seed, 0, LLONG_MAX);
    // Checkpoints and export
    cli.add("output-dir", "o", "DIR", "", "write log.jsonl and checkpoints here (none: no files written)",
            &o->output_dir);
    cli.add("checkpoint-every", "n", "STEPS", "0",
            "with --output-dir: checkpoint every this many steps (0: only at the end)", &o->checkpoint_every, 0,
            1 << 30);
    cli.add("keep-checkpoints", "nk", "K", "0", "keep only the newest K checkpoints (0: keep all)",
            &o->keep_checkpoints, 0, 1 << 30);
    cli.add_flag("resume", "y", "continue from the newest complete checkpoint in --output-dir (fresh start if none)",
                 &o->resume);
    cli.add("stop-after", nullptr, "STEPS", "0",
            "leave after this many steps of this run (e.g. a job's time limit; 0: run to the end)", &o->stop_after, 0,
            1 << 30);
    cli.add("export-hf", nullptr, "DIR", "",
            "after training, write the model for Hugging Face transformers (model.safetensors + config.json) into DIR",
            &o->export_hf);
    // Ranks and the log
    cli.add("zero", "z", "0|1|2", "0", "data parallel (several ranks): 0 all-reduces the gradients; 1 also shards "
            "the optimizer state and master weights across ranks (ZeRO-1); 2 also the gradients (ZeRO-2)", &o->zero,
            0, 2);
    cli.add_flag("log-ranks", nullptr, "with --output-dir and several ranks: every rank also writes its own "
                 "log_rank<R>.jsonl (its loss and memory)", &o->log_ranks);
    cli.add("label", nullptr, "NAME", "", "the run's name in the log and plots (default: the model and precision)",
            &o->label);
    cli.add("profile-step", nullptr, "N", "0", "bracket the run's Nth step with cudaProfilerStart/Stop, so that a "
            "profiler started with collection off records that step alone, e.g. ncu --profile-from-start off (0: "
            "none; with CUDA graphs, step 3 is the first that only replays them)", &o->profile_step, 0, 1 << 30);
    cli.set_epilog(
        "exit status: 0 the run finished, or left where --stop-after said (its last line then says how to\n"
        "continue); 1 it stopped on an error, named in one line (data, a file, the device, a loss that is\n"
        "not finite); 2 a bad option; 128+N stopped by signal N: Ctrl-C (SIGINT, 130),\n"
        "SIGTERM (143) or SIGUSR1 (138) end the run after the step in progress, with a checkpoint of it when\n"
        "-o is given (continue with --resume); a second signal ends it at once.");
}

// An export into the folder the model is read from would replace that model's files with the
// trained ones: refused. model: the path --init names (a checkpoint file or folder), or its default.
// The export writes model.safetensors and config.json; neither may be the folder's own or, through
// symlinks, one of the files the model is read from.
inline void check_export_not_into(const Cli& cli, const RunOptions& o, const std::string& model) {
    struct stat st;
    if (o.export_hf.empty() || stat(model.c_str(), &st) != 0) return;
    std::string folder = model_folder(model);
    std::vector<std::string> read = {folder + "/model.safetensors", folder + "/config.json",
                                     folder + "/model.safetensors.index.json"};
    if (folder != model) read.push_back(model);
    std::string replaced = same_file(folder, o.export_hf) ? "the model in " + folder : "";
    for (const std::string& r : read)
        for (const char* name : {"/model.safetensors", "/config.json"})
            if (replaced.empty() && same_file(r, o.export_hf + name)) replaced = r;
    if (!replaced.empty())
        cli.fail("option --export-hf: the export into %s would replace %s, which --init reads: give another directory",
                 o.export_hf.c_str(), replaced.c_str());
}

// --max-steps 0 (no training: the model as loaded is evaluated, and exported with --export-hf)
// refuses what only training does: resume a run, write checkpoints and a run's log (its figures are
// printed). `other_work` says whether the
// trainer has something to do besides the export (validation data, samples); else the run must be
// asked for one of `choices` (what the trainer can do without training).
inline void check_no_training_options(const Cli& cli, const RunOptions& o, bool other_work, const char* choices) {
    if (o.resume)
        cli.fail("option --resume: a run of --max-steps 0 trains nothing to continue; give its checkpoint with --init");
    for (const char* name : {"output-dir", "checkpoint-every", "keep-checkpoints", "stop-after"})
        if (cli.given(name))
            cli.fail("option --%s: --max-steps 0 trains nothing, so it writes no checkpoints or log", name);
    for (const char* name : {"attention-backward", "bias-grad"})
        if (cli.given(name)) cli.fail("option --%s: --max-steps 0 trains nothing, so it runs no backward", name);
    if (!other_work && o.export_hf.empty())
        cli.fail("option --max-steps: 0 (no training) leaves nothing to do; ask for %s", choices);
}

// Whether --attention-backward names a form of the wgmma kernel.
inline bool asks_wgmma(AttentionBackward a) { return (int)a >= (int)AttentionBackward::Wgmma; }

// --attention-backward, once the model and the device are known: auto leaves the choice to
// attention_backward (wgmma where it applies), mma turns wgmma off, tune has each shape's first call
// time the forms (auto's form for shapes met first inside a graph capture), and a form is refused where
// it would change nothing (a head size other than 64; wgmma's with attention dropout) or cannot run (no
// wgmma code for this device). Returns the kernel the run's backward takes, for the trainer's start-up
// lines.
inline std::string apply_attention_backward(const RunOptions& o, int head_size, float attention_dropout) {
    const AttentionBackward a = o.attention_backward;
    const char* name = attention_backward_name(a);
    if ((a == AttentionBackward::MmaSum || a == AttentionBackward::Tune) && head_size != 64)
        option_error("option --attention-backward: %s takes head size 64; this model's is %d%s", name, head_size,
                     a == AttentionBackward::Tune ? " (one form there: nothing to time)" : "");
    if (asks_wgmma(a)) {
        if (head_size != 64)
            option_error("option --attention-backward: %s takes head size 64; this model's is %d", name, head_size);
        if (attention_dropout > 0)
            option_error("option --attention-backward: %s runs the backward without attention dropout; this run "
                         "has attention dropout %g (give --attention-dropout 0)", name, attention_dropout);
        if (!wgmma_supported())
            option_error("option --attention-backward: this device has no wgmma code: %s needs an H100 or H200 "
                         "(compute capability 9.0) and a build for it (make GPU=1 there builds sm_90a)", name);
    }
    const bool three = wgmma_form_has(a, kWgmma3), red = wgmma_form_has(a, kWgmmaRed),
               sum = a == AttentionBackward::MmaSum || wgmma_form_has(a, kWgmmaSum);
    attention_backward_wgmma() = a != AttentionBackward::Mma && a != AttentionBackward::MmaSum;
    attention_backward_wgmma_blocks() = three ? 3 : 2;
    attention_backward_wgmma_red_dq() = red;
    attention_backward_sum_dq() = sum;
    attention_backward_tune().on = a == AttentionBackward::Tune;
    if (o.precision == Precision::FP32 || o.tf32) return "CUDA cores (fp32)";
    if (a == AttentionBackward::Tune)
        return std::string(attention_backward_takes_wgmma(head_size, attention_dropout > 0) ? "wgmma" : "mma.sync") +
               " in the fastest of its " +
               std::to_string(attention_backward_forms(head_size, attention_dropout > 0).size()) +
               " forms, timed at the first step";
    if (!attention_backward_takes_wgmma(head_size, attention_dropout > 0))
        return std::string("mma.sync") + (sum ? ", dQ summed by the tiles' last writers" : "");
    return std::string("wgmma") + (three ? ", registers for 3 blocks per SM" : "") +
           (red ? ", dQ by reductions in L2" : "") + (sum ? ", dQ summed by the tiles' last writers" : "");
}

// The checks of the shared options that involve more than one of them, after cli.parse() (and the
// trainer's resolve_auto calls): each failure is one error naming the option.
inline void check_run_options(const Cli& cli, RunOptions* o, const Distributed& dist) {
    if (o->total_batch == 0)
        cli.fail("option --total-batch-size: 0 leaves nothing to train on per step (give a positive count, or -1 "
                 "for one micro-batch on every rank)");
    if (o->warmup >= 1 && o->warmup != std::floor(o->warmup))
        cli.fail("option --warmup: %g is neither a fraction below 1 nor a whole number of steps", o->warmup);
    AdafactorConfig& af = o->opt.adafactor;
    af.use_first_moment = af.beta1 > 0;
    af.relative_step = !cli.given("lr");
    // Options that one optimizer or precision alone reads: given for another, they would change
    // nothing without a word, so the command line is refused instead.
    const OptimizerKind kind = o->opt.kind;
    const bool adamw = kind == OptimizerKind::AdamW || kind == OptimizerKind::AdamW8bit;
    const std::string optimizer = std::string("this run's optimizer is ") + optimizer_name(kind);
    const std::string precision = std::string("this run's precision is ") +
                                  (o->tf32 ? "tf32" : o->fp8 ? "fp8" : precision_name(o->precision));
    const struct { const char* option; bool applies; const char* only; const std::string& run; } only_for[] = {
        {"momentum", kind == OptimizerKind::SGD, "--optimizer sgd", optimizer},
        {"nesterov", kind == OptimizerKind::SGD, "--optimizer sgd", optimizer},
        {"beta1", adamw, "--optimizer adamw and adamw8bit", optimizer},
        {"beta2", adamw, "--optimizer adamw and adamw8bit", optimizer},
        {"adam-eps", adamw, "--optimizer adamw and adamw8bit", optimizer},
        {"adafactor-beta1", kind == OptimizerKind::Adafactor, "--optimizer adafactor", optimizer},
        {"adafactor-clip", kind == OptimizerKind::Adafactor, "--optimizer adafactor", optimizer},
        {"adafactor-decay-rate", kind == OptimizerKind::Adafactor, "--optimizer adafactor", optimizer},
        {"loss-scale", o->precision == Precision::FP16, "--precision fp16", precision},
        {"loss-scale-window", o->precision == Precision::FP16, "--precision fp16", precision}};
    for (const auto& x : only_for)
        if (cli.given(x.option) && !x.applies)
            cli.fail("option --%s: applies to %s only (%s)", x.option, x.only, x.run.c_str());
    if (o->attention_backward != AttentionBackward::Auto && (o->precision == Precision::FP32 || o->tf32))
        cli.fail("option --attention-backward: %s applies to --precision bf16 and fp16 only (%s)",
                 attention_backward_name(o->attention_backward), precision.c_str());
    if (o->opt.nesterov && o->opt.momentum <= 0) cli.fail("option --nesterov: needs --momentum > 0");
    if (o->zero > 0 && o->opt.kind == OptimizerKind::Adafactor && dist.world > 1)
        cli.fail("option --zero: %d shards the optimizer state element by element, and Adafactor's factored "
                 "statistics need whole matrices (use --zero 0 with adafactor)", o->zero);
    int exponent;
    if (std::frexp(o->loss_scale, &exponent) != 0.5)
        cli.fail("option --loss-scale: %g is not a power of two (so that unscaling is exact)", o->loss_scale);
    const OptimizerConfig& opt = o->opt;
    if (opt.kind == OptimizerKind::AdamW || opt.kind == OptimizerKind::AdamW8bit) {
        // beta = 1 leaves a moment at 0 and its bias correction 1 - beta^t at 0: 0/0 in every update;
        // eps = 0 divides 0 by 0 for every parameter whose gradient is 0.
        if (opt.beta1 >= 1 || opt.beta2 >= 1)
            cli.fail("option --%s: %g, but AdamW's betas must be below 1", opt.beta1 >= 1 ? "beta1" : "beta2",
                     opt.beta1 >= 1 ? opt.beta1 : opt.beta2);
        if (opt.eps <= 0) cli.fail("option --adam-eps: must be above 0 (AdamW divides by sqrt(v) + eps, and v can be 0)");
    }
    if (o->resume && o->output_dir.empty()) cli.fail("option --resume: needs --output-dir (where the checkpoints are)");
    if (cli.given("init") && cli.str("init").empty())
        cli.fail("option --init: an empty path (give a checkpoint, or leave --init out for the default)");
    // A training pattern that also matches the validation shards (-i 'dir/name_*.bin' next to
    // name_val.bin) is legal, and sometimes meant (a check that a model can fit its data), but
    // mostly not: said once, by file.
    if (!o->val_pattern.empty()) {
        std::vector<std::string> train = glob_files(o->train_pattern), val = glob_files(o->val_pattern);
        for (const std::string& v : val)
            if (std::any_of(train.begin(), train.end(), [&](const std::string& t) { return same_file(t, v); })) {
                printf("warning: %s is both a training shard (-i %s) and a validation shard (-j): the validation "
                       "loss measures data the model trains on\n", v.c_str(), o->train_pattern.c_str());
                break;
            }
    }
    // A fresh run would truncate the log of the run whose checkpoints the directory holds and mix its
    // own checkpoints with that run's, which --resume would then take for one run.
    if (!o->resume && !o->output_dir.empty()) {
        std::vector<int> done = complete_checkpoints(o->output_dir);
        if (!done.empty())
            cli.fail("option --output-dir: %s holds the checkpoints of an earlier run (the newest at step %d); "
                     "continue it with --resume, or give another directory", o->output_dir.c_str(), done.back());
    }
    if (cli.given("init")) check_export_not_into(cli, *o, cli.str("init"));
    // The export comes after training: a directory it cannot write must fail now, not then.
    if (!o->export_hf.empty() && dist.rank == 0) {
        std::string err, probe = o->export_hf + "/.write_test";
        if (!make_dirs(o->export_hf, &err)) cli.fail("option --export-hf: %s", err.c_str());
        FILE* f = fopen(probe.c_str(), "wb");
        if (!f) cli.fail("option --export-hf: cannot write into %s: %s", o->export_hf.c_str(), strerror(errno));
        fclose(f);
        unlink(probe.c_str());
    }
    if ((cli.given("checkpoint-every") || cli.given("keep-checkpoints")) && o->output_dir.empty())
        cli.fail("option --%s: needs --output-dir (where to write them)",
                 cli.given("checkpoint-every") ? "checkpoint-every" : "keep-checkpoints");
    if (o->stop_after > 0 && o->output_dir.empty())
        cli.fail("option --stop-after: needs --output-dir (the checkpoint that --resume continues from goes there)");
    if (o->log_ranks && o->output_dir.empty()) cli.fail("option --log-ranks: needs --output-dir (where the logs go)");
}
