// llmc/train_common.h — the host-side parts of a training program that train_gpt2.cu and
// train_bert.cu share: the optimizer, precision and loss-scale options (declared in and read from
// the llmc/cli.h table), fp16's dynamic loss scale, the memory anatomy printout, the check that a
// checkpoint's training state can continue this run, and the step clock behind the ETA.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "cli.h"
#include "dataloader.h"
#include "matmul.cuh"
#include "model_state.cuh"
#include "precision.cuh"

// ----------------------------------------------------------------------------
// Options

// Declares the optimizer options: --optimizer, --weight-decay (-c), AdamW's betas and epsilon, SGD's
// momentum and Nesterov, Adafactor's settings; beta2 and weight decay defaults are the trainer's
// (GPT-2: 0.95 and 0, as llm.c; BERT: 0.999 and 0.01, torch's AdamW and the fine-tuning recipe).
inline void add_optimizer_options(Cli& cli, const char* beta2_default, const char* weight_decay_default) {
    cli.add("optimizer", nullptr, "NAME", "adamw", "adamw | adamw8bit (8-bit moments) | adafactor | sgd");
    cli.add("weight-decay", "c", "FLOAT", weight_decay_default,
            "weight decay, matrices only (AdamW/Adafactor: decoupled; SGD: L2)");
    cli.add("beta1", nullptr, "FLOAT", "0.9", "AdamW beta1");
    cli.add("beta2", nullptr, "FLOAT", beta2_default, "AdamW beta2");
    cli.add("adam-eps", nullptr, "FLOAT", "1e-8", "AdamW epsilon");
    cli.add("momentum", nullptr, "FLOAT", "0.9", "SGD momentum (0: plain SGD)");
    cli.add_flag("nesterov", nullptr, "SGD: Nesterov momentum");
    cli.add("adafactor-beta1", nullptr, "FLOAT", "0", "Adafactor first-moment decay (0: none, as transformers' default)");
    cli.add("adafactor-clip", nullptr, "FLOAT", "1.0", "Adafactor update clipping threshold (RMS)");
    cli.add("adafactor-decay-rate", nullptr, "FLOAT", "-0.8", "Adafactor second-moment decay exponent");
}

// Reads the options of add_optimizer_options into *opt. Adafactor keeps transformers' defaults
// (relative step sizes scaled by each matrix's RMS, no first moment) unless --lr is given, which
// then sets the step size (and the schedule applies).
inline void read_optimizer_options(const Cli& cli, OptimizerConfig* opt) {
    std::string name = cli.str("optimizer");
    if (name == "adamw") opt->kind = OptimizerKind::AdamW;
    else if (name == "adamw8bit") opt->kind = OptimizerKind::AdamW8bit;
    else if (name == "adafactor") opt->kind = OptimizerKind::Adafactor;
    else if (name == "sgd") opt->kind = OptimizerKind::SGD;
    else cli.fail("option --optimizer: '%s' is not one of adamw, adamw8bit, adafactor, sgd", name.c_str());
    opt->weight_decay = (float)cli.number("weight-decay", 0, 10);
    opt->beta1 = (float)cli.number("beta1", 0, 1);
    opt->beta2 = (float)cli.number("beta2", 0, 1);
    opt->eps = (float)cli.number("adam-eps", 0, 1);
    opt->momentum = (float)cli.number("momentum", 0, 1);
    opt->nesterov = cli.flag("nesterov");
    if (opt->nesterov && opt->momentum <= 0) cli.fail("option --nesterov: needs --momentum > 0");
    AdafactorConfig& af = opt->adafactor;
    af.use_first_moment = cli.number("adafactor-beta1", 0, 1) > 0;
    af.beta1 = cli.number("adafactor-beta1", 0, 1);
    af.clip_threshold = cli.number("adafactor-clip", 1e-6, 1e6);
    af.decay_rate = cli.number("adafactor-decay-rate", -1, 0);
    af.relative_step = !cli.given("lr");
}

// What --precision asks for: the storage type, TF32 matmuls (with fp32), fp8 GEMMs (with bf16).
struct PrecisionChoice {
    Precision precision = Precision::FP32;
    bool tf32 = false;
    bool fp8 = false;
};

// Reads --precision fp32 | tf32 | bf16 | fp16 | fp8 (whether fp8 is available is the trainer's call).
inline PrecisionChoice read_precision_option(const Cli& cli) {
    PrecisionChoice p;
    std::string name = cli.str("precision");
    if (name == "fp32") p.precision = Precision::FP32;
    else if (name == "tf32") p.precision = Precision::FP32, p.tf32 = true;
    else if (name == "bf16") p.precision = Precision::BF16;
    else if (name == "fp16") p.precision = Precision::FP16;
    else if (name == "fp8") p.precision = Precision::BF16, p.fp8 = true;
    else cli.fail("option --precision: '%s' is not one of fp32, tf32, bf16, fp16, fp8", name.c_str());
    return p;
}

// Recomputation trades compute for memory: instead of keeping an activation for every layer, keep
// one layer's worth and recompute it in the backward pass from what is kept (each trainer's
// activations say which tensors each level drops). Levels, each including the ones before it:
//   gelu   the MLP's GELU output -> recomputed from its input (kept)
//   ln     also the layernorm outputs that can be recomputed from kept inputs
//   layer  everything but each layer's input: the block's forward pass runs again in the backward
//          pass (gradient checkpointing, one checkpoint per layer)
// Recomputing runs the same kernels on the same inputs, so gradients are bit-identical to storing.
enum class Recompute { None, Gelu, LN, Layer };
inline const char* recompute_name(Recompute r) {
    static const char* names[] = {"none", "gelu", "ln", "layer"};
    return names[(int)r];
}

// Reads --recompute: a level's name or llm.c's number (0-3), one of the levels the trainer offers.
inline Recompute read_recompute_option(const Cli& cli, std::initializer_list<Recompute> offered) {
    std::string name = cli.str("recompute"), list;
    for (Recompute r : offered) {
        if (name == recompute_name(r) || name == std::to_string((int)r)) return r;
        list += std::string(list.empty() ? "" : ", ") + recompute_name(r) + " (" + std::to_string((int)r) + ")";
    }
    cli.fail("option --recompute: '%s' is not one of %s", name.c_str(), list.c_str());
}

// Declares fp16's loss-scale options (PyTorch GradScaler's defaults).
inline void add_loss_scale_options(Cli& cli) {
    cli.add("loss-scale", nullptr, "FLOAT", "65536", "fp16: initial loss scale (a power of two)");
    cli.add("loss-scale-window", nullptr, "STEPS", "2000", "fp16: clean steps before the loss scale doubles");
}

// Reads them: the initial scale (a power of two, so that unscaling is exact) and the window.
inline void read_loss_scale_options(const Cli& cli, float* scale, int* window) {
    *scale = (float)cli.number("loss-scale", 1, 1e30);
    int exponent;
    if (std::frexp(*scale, &exponent) != 0.5) cli.fail("option --loss-scale: %g is not a power of two", *scale);
    *window = (int)cli.integer("loss-scale-window", 1, 1 << 30);
}

// ----------------------------------------------------------------------------
// fp16: dynamic loss scaling

// The bookkeeping of torch.cuda.amp.GradScaler around ModelState::update_scaled: the scale halves
// on an overflow (the step is skipped) and doubles after `window` clean steps; the optimizer counts
// applied updates only (its bias correction), as torch's does. Off (any other precision): scale 1.
struct LossScaler {
    bool on = false;
    float scale = 1.f;
    int window = 2000;
    int growth_tracker = 0;  // clean steps since the scale last changed
    int skipped = 0;         // steps whose update was skipped

    LossScaler() = default;
    LossScaler(bool on_, float initial, int window_) : on(on_), scale(on_ ? initial : 1.f), window(window_) {}

    // The optimizer's 1-based update count for (0-based) step.
    int update_number(int step) const { return step + 1 - skipped; }

    // After an update that was applied or skipped (inf/nan gradients).
    void after_update(bool applied) {
        if (!on) return;
        if (!applied) {
            skipped++;
            scale *= 0.5f;
            growth_tracker = 0;
        } else if (++growth_tracker == window) {
            scale *= 2.f;
            growth_tracker = 0;
        }
    }

    // To and from a checkpoint's training state.
    void save(TrainState* s) const {
        s->loss_scale = scale;
        s->growth_tracker = growth_tracker;
        s->skipped_steps = skipped;
    }
    void restore(const TrainState& s) {
        scale = s.loss_scale;
        growth_tracker = s.growth_tracker;
        skipped = s.skipped_steps;
    }
};

// ----------------------------------------------------------------------------
// Memory anatomy

// What the trainer says next to each row of print_memory_anatomy.
struct MemoryNotes {
    const char* activations;  // e.g. "B=4 T=1024, recompute none"
    const char* other;        // what "other" holds
};

// Prints where device memory goes (MemoryAnatomy), with bytes per parameter for the model state —
// compare with 16 B/param for fp32 AdamW and 18 B/param for mixed precision with fp32 master weights.
inline void print_memory_anatomy(const MemoryAnatomy& m, size_t num_parameters, size_t workspace, Precision precision,
                                 const OptimizerConfig& opt, const MemoryNotes& notes) {
    auto line = [&](const char* what, size_t bytes, const char* note) {
        printf("  %-15s %10.1f MiB  %5.2f B/param  %s\n", what, bytes / 1048576.0, (double)bytes / num_parameters, note);
    };
    printf("memory anatomy (device):\n");
    line("weights", m.weights, precision_name(precision));
    if (m.master) line("master weights", m.master, "fp32");
    line("gradients", m.grads, precision_name(precision));
    const char* state = opt.kind == OptimizerKind::AdamW       ? "AdamW m, v (fp32)"
                        : opt.kind == OptimizerKind::AdamW8bit ? "AdamW m, v (8-bit blocks of 256 + fp32 absmax)"
                        : opt.kind == OptimizerKind::Adafactor ? "Adafactor row/column statistics (fp32)"
                        : opt.momentum > 0                     ? "SGD momentum (fp32)"
                                                               : "SGD (none)";
    line("optimizer", m.optimizer, state);
    line("= model state", m.model_state(), "");
    line("activations", m.activations, notes.activations);
    line("other", m.other, notes.other);
    line("workspace", workspace, "cuBLASLt");
    line("= total", m.total() + workspace, "");
}

// The memory anatomy as a JSON object, for the run's log (each rank's, with --log-ranks).
inline std::string memory_json(const MemoryAnatomy& m) {
    return "{\"weights\":" + std::to_string(m.weights) + ",\"master\":" + std::to_string(m.master) +
           ",\"grads\":" + std::to_string(m.grads) + ",\"optimizer\":" + std::to_string(m.optimizer) +
           ",\"activations\":" + std::to_string(m.activations) + ",\"other\":" + std::to_string(m.other) + "}";
}

// ----------------------------------------------------------------------------
// Resuming

// How a trainer names the settings check_resumable compares (in its messages).
struct ResumeNames {
    const char* seq_len_option;   // "--seq-len" (GPT-2) or "--max-len" (BERT)
    const char* per_step;         // "tokens per step", "sequences per step"
    const char* (*precision_name)(int code);
};

// Checks that the training state `saved` (read from path) can continue a run whose own settings are
// `now` (precision code, B, T, tokens_per_step, seed, shuffle, ranks, world (the partition),
// optimizer, num_params, has_master) with state_bytes of optimizer state; exits with the first
// mismatch, named.
inline void check_resumable(const TrainState& saved, const TrainState& now, size_t state_bytes,
                            const ResumeNames& names, const std::string& path) {
    auto refuse = [&](const char* what, const std::string& was, const std::string& is) {
        data_error("%s: the checkpoint was trained with %s %s, this run has %s (resuming must not change it)",
                   path.c_str(), what, was.c_str(), is.c_str());
    };
    const TrainState& s = saved;
    if (s.precision != now.precision)
        refuse("--precision", names.precision_name(s.precision), names.precision_name(now.precision));
    // The data position counts windows of ranks x B sequences: another number of ranks resumes at the
    // same place when ranks x B stays the same.
    if ((long long)s.B * s.ranks != (long long)now.B * now.ranks)
        refuse(s.ranks == now.ranks ? "--batch-size" : "--batch-size x ranks",
               s.ranks == now.ranks ? std::to_string(s.B) : std::to_string(s.B) + " x " + std::to_string(s.ranks),
               s.ranks == now.ranks ? std::to_string(now.B) : std::to_string(now.B) + " x " + std::to_string(now.ranks));
    if (s.T != now.T) refuse(names.seq_len_option, std::to_string(s.T), std::to_string(now.T));
    if (s.tokens_per_step != now.tokens_per_step)
        refuse(names.per_step, std::to_string(s.tokens_per_step), std::to_string(now.tokens_per_step));
    if (s.seed != now.seed) refuse("--seed", std::to_string(s.seed), std::to_string(now.seed));
    if (s.shuffle != now.shuffle) refuse("--shuffle", s.shuffle ? "on" : "off", now.shuffle ? "on" : "off");
    if (s.optimizer != now.optimizer)
        refuse("--optimizer", optimizer_name((OptimizerKind)s.optimizer), optimizer_name((OptimizerKind)now.optimizer));
    // Under the same partition the state must fit exactly; another partition is re-sharded by the caller.
    if (s.world != now.world) return;
    if (s.num_params != now.num_params || s.has_master != now.has_master || s.optimizer_state.size() != state_bytes)
        data_error("%s: state for %llu parameters%s and %zu bytes of optimizer state does not fit the model (%llu "
                   "parameters, %zu bytes of %s state)", path.c_str(), (unsigned long long)s.num_params,
                   s.has_master ? " with master weights" : "", s.optimizer_state.size(),
                   (unsigned long long)now.num_params, state_bytes, optimizer_name((OptimizerKind)now.optimizer));
}

// Loads the optimizer state of a resumed run into model (a ModelState, e.g. GPT2 or BERT): its own
// file (first: state file 0, which the trainer read to learn the step, or this rank's shard), or —
// when the checkpoint's partition differs (another number of ranks or ZeRO stage) — every old shard,
// re-sharded (llmc/zero.h); optimizers whose state cannot be re-sharded are refused by name.
template <class Model>
void restore_optimizer_state(Model& model, const TrainState& first, const std::string& dir, const std::string& path) {
    auto read = [&](int r) {
        TrainState st;
        std::string err, file = state_file(dir, (int)first.step, r);
        if (!read_train_state(file, &st, &err)) data_error("%s", err.c_str());
        if (st.step != first.step || st.world != first.world || st.rank != r || st.optimizer_state.size() !=
            first.optimizer_state.size())
            data_error("%s: does not belong with %s (step, shard or size differ)", file.c_str(), path.c_str());
        return st;
    };
    if (first.world == model.plan.world) {
        model.set_optimizer_state(model.plan.world > 1 && model.rank() > 0 ? read(model.rank()) : first);
        return;
    }
    if (!model.can_reshard())
        data_error("%s: the optimizer state was saved by %d rank%s (ZeRO shards) and this run partitions it over %d; "
                   "%s state cannot be re-sharded (its layout follows the shards): resume with the same number of "
                   "ranks and --zero", path.c_str(), first.world, first.world > 1 ? "s" : "", model.plan.world,
                   optimizer_name(model.opt.kind));
    std::vector<TrainState> old(first.world);
    old[0] = first;
    for (int r = 1; r < first.world; r++) old[r] = read(r);
    model.set_optimizer_state_resharded(old);
    printf("re-sharded the optimizer state of %d rank%s onto %d\n", first.world, first.world > 1 ? "s" : "",
           model.plan.world);
}

// ----------------------------------------------------------------------------
// Progress

// After a run's first step: the device memory in use (returned, MiB) and, on the CPU backend, the
// kernel launches and cuBLASLt calls the step made (launches0/matmuls0: the counters before it).
inline double print_first_step_figures(long long launches0, long long matmuls0) {
    size_t free_b, total_b;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    double used = (total_b - free_b) / 1048576.0;
    printf("device memory in use after the first step: %.1f MiB of %.1f MiB\n", used, total_b / 1048576.0);
    if (launches0 >= 0)
        printf("launches per step: %lld kernels + %lld cuBLASLt matmuls (counted by the CPU backend)\n",
               kernel_launch_count() - launches0, matmul_context().calls - matmuls0);
    return used;
}

// Step times of a run, for the time left: the mean step time so far, leaving out the run's first
// step (warm-up: allocations, cuBLASLt heuristics) once there is another.
struct StepClock {
    double timed_ms = 0;  // sum of step times after the first
    int timed = 0;
    bool first = true;

    // Records a step's time; returns the ETA of `steps_left` more steps as "1h02m" or "3m07s".
    std::string add(double ms, int steps_left) {
        if (!first) {
            timed_ms += ms;
            timed++;
        }
        first = false;
        return eta(steps_left, ms);
    }
    // Mean ms per step (the first step's ms if it is the only one).
    double mean_ms(double last_ms) const { return timed > 0 ? timed_ms / timed : last_ms; }
    std::string eta(int steps_left, double last_ms) const {
        long s = (long)(mean_ms(last_ms) * steps_left / 1000.0);
        char buf[32];
        if (s >= 3600) snprintf(buf, sizeof(buf), "%ldh%02ldm", s / 3600, s / 60 % 60);
        else snprintf(buf, sizeof(buf), "%ldm%02lds", s / 60, s % 60);
        return buf;
    }
};
