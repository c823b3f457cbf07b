// llmc/run.h — a training run's host side that train_gpt2.cu and train_bert.cu share: fp16's
// dynamic loss scale, the memory anatomy printout, the check that a checkpoint's training state can
// continue this run, and the step reporter (one timer, the step line, the log line, the ETA).
// The options they share are llmc/run_options.h.
#pragma once
#include <cuda_profiler_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "attention.cuh"  // attention_backward_tune
#include "checkpoint.h"
#include "dataloader.h"
#include "distributed.h"
#include "logger.h"
#include "matmul.cuh"
#include "model_state.cuh"
#include "precision.cuh"

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
    bool training = true;     // false: a run of 0 steps, which keeps no gradients or optimizer state
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
    line("gradients", m.grads, notes.training ? precision_name(precision) : "none (no training)");
    const char* state = opt.kind == OptimizerKind::AdamW       ? "AdamW m, v (fp32)"
                        : opt.kind == OptimizerKind::AdamW8bit ? "AdamW m, v (8-bit blocks of 256 + fp32 absmax)"
                        : opt.kind == OptimizerKind::Adafactor ? "Adafactor row/column statistics (fp32)"
                        : opt.momentum > 0                     ? "SGD momentum (fp32)"
                                                               : "SGD (none)";
    line("optimizer", m.optimizer, notes.training ? state : "none (no training)");
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

// Under data parallelism: how the ranks share the work (rank 0 prints it before the memory anatomy,
// which is then per rank).
inline void print_data_parallel(const Distributed& dist, int zero) {
    if (dist.world <= 1) return;
    int nodes = dist.world / dist.local_world;
    printf("data parallel: %d ranks on %d node%s, ZeRO-%d (%s); memory below is per rank\n", dist.world, nodes,
           nodes > 1 ? "s" : "", zero,
           zero == 0   ? "gradients all-reduced, state replicated"
           : zero == 1 ? "optimizer state and master weights sharded"
                       : "gradients, optimizer state and master weights sharded");
}

// ----------------------------------------------------------------------------
// Resuming

// How a trainer names the settings check_resumable compares (in its messages).
// Where a run's output goes: rank 0 prints (the other ranks' stdout is discarded), a line at a time,
// also into a file or a pipe (a job's log), so that a redirected run shows its banner at once.
inline void route_run_output(const Distributed& dist) {
    if (dist.rank > 0 && !freopen("/dev/null", "w", stdout)) distributed_fatal("cannot silence stdout");
    setvbuf(stdout, nullptr, _IOLBF, 0);
}

// A step whose loss is not finite: the model diverged, or its weights or data hold non-finite values,
// and the update has carried it into the weights, so every later step would train on NaN and every
// checkpoint save it: the run stops before one does. (fp16's overflows are in the gradients, which
// the loss scaler skips: its loss stays finite.)
inline void stop_on_nonfinite_loss(int step, double loss) {
    if (std::isnan(loss)) loss = std::fabs(loss);  // the sign of a NaN means nothing: print "nan"
    if (!std::isfinite(loss))
        data_error("step %d: the loss is %g: training diverged (lower --lr?) or the model or data hold "
                   "non-finite values; stopped, nothing saved from this step on", step, loss);
}

// The same for an evaluation: weights that hold non-finite values (a model file's, with -x 0 nothing
// else shows them) give a non-finite validation loss, which stops the run rather than report it.
inline void stop_on_nonfinite_val_loss(int step, double loss) {
    if (std::isnan(loss)) loss = std::fabs(loss);
    if (!std::isfinite(loss))
        data_error("step %d: the validation loss is %g: the model holds non-finite values (or training diverged); "
                   "stopped, nothing saved from this step on", step, loss);
}

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
    if (s.num_params != now.num_params || s.has_master != now.has_master || s.optimizer_bytes != state_bytes)
        data_error("%s: state for %llu parameters%s and %llu bytes of optimizer state does not fit the model (%llu "
                   "parameters, %zu bytes of %s state)", path.c_str(), (unsigned long long)s.num_params,
                   s.has_master ? " with master weights" : "", (unsigned long long)s.optimizer_bytes,
                   (unsigned long long)now.num_params, state_bytes, optimizer_name((OptimizerKind)now.optimizer));
}

// Says what a resumed run changes of the recipe its checkpoint recorded (llmc/checkpoint.h), one line:
// "resume: this run changes lr 0.0006 -> 0.0003, grad_clip 1 -> 0.5 (...)"; nothing when it changes
// nothing, or when the checkpoint recorded no recipe. Keys only one side has (another optimizer's,
// fp16's) are left out: what would make the run another run is refused by check_resumable instead.
inline void report_recipe_changes(const std::string& saved, const std::string& now) {
    auto pairs = [](const std::string& text) {
        std::vector<std::pair<std::string, std::string>> out;
        for (size_t at = 0; at < text.size();) {
            size_t end = text.find(' ', at);
            if (end == std::string::npos) end = text.size();
            std::string pair = text.substr(at, end - at);
            size_t eq = pair.find('=');
            if (eq != std::string::npos) out.push_back({pair.substr(0, eq), pair.substr(eq + 1)});
            at = end + 1;
        }
        return out;
    };
    std::string changes;
    for (const auto& [key, was] : pairs(saved))
        for (const auto& [key2, is] : pairs(now))
            if (key == key2 && was != is) changes += (changes.empty() ? "" : ", ") + key + " " + was + " -> " + is;
    if (!changes.empty())
        printf("resume: this run changes %s (its command line's settings; the checkpoint's run had the first "
               "values)\n", changes.c_str());
}

// Where a run with --resume starts: the newest complete checkpoint in its output directory, with the
// header of the training state rank 0 wrote (the step, data position, the optimizer state's size; not
// the arrays, which the run would otherwise hold in host memory to its end); found() is false when
// there is none (the run starts from scratch, and says so) or the run does not resume.
struct ResumePoint {
    int step = -1;
    std::string model_path, state_path;
    TrainState state;
    bool found() const { return step >= 0; }
    const TrainState* state_or_null() const { return found() ? &state : nullptr; }
};

inline ResumePoint find_resume_point(bool resume, const std::string& output_dir) {
    ResumePoint r;
    if (!resume) return r;
    std::vector<int> done = complete_checkpoints(output_dir);
    if (done.empty()) {
        printf("resume: no complete checkpoint in %s, starting from scratch\n", output_dir.c_str());
        return r;
    }
    r.step = done.back();
    r.model_path = checkpoint_file(output_dir, "model", r.step);
    r.state_path = state_file(output_dir, r.step, 0);
    std::string err;  // the header: restore_optimizer_state reads the arrays (and checks the checksum)
    if (!read_train_state(r.state_path, &r.state, &err, true)) data_error("%s", err.c_str());
    if (r.state.step != r.step)
        data_error("%s: holds step %lld, its name says %d", r.state_path.c_str(), r.state.step, r.step);
    return r;
}

// Stops a resume with a run directory of the other trainer, from its newest model file: a llm.c
// model file (train_gpt2's) or safetensors (train_bert's), rather than let the loader misread it.
inline void check_resume_trainer(const ResumePoint& r, const char* trainer) {
    if (!r.found()) return;
    uint8_t head[9] = {};
    FILE* f = fopen(r.model_path.c_str(), "rb");
    size_t got = f ? fread(head, 1, sizeof(head), f) : 0;
    if (f) fclose(f);
    int32_t magic;
    memcpy(&magic, head, 4);
    const char* owner = got == 9 && magic == 20240326 ? "train_gpt2"  // a llm.c model file (llmc/gpt2_io.h)
                        : got == 9 && head[8] == '{' ? "train_bert"    // safetensors: a length, then JSON
                                                     : nullptr;
    if (owner && strcmp(owner, trainer) != 0)
        data_error("%s: the run in this directory is a %s run (its newest checkpoint, step %d): resume it with %s, "
                   "or give %s another --output-dir", r.model_path.c_str(), owner, r.step, owner, trainer);
}

// Loads the optimizer state of a resumed run into model (a ModelState, e.g. GPT2 or BERT): its own
// file (state file 0, whose header `first` the trainer read to learn the step, or this rank's shard),
// or — when the checkpoint's partition differs (another number of ranks or ZeRO stage) — every old
// shard, re-sharded (llmc/zero.h); optimizers whose state cannot be re-sharded are refused by name.
// The files' arrays are held in host memory only while they go to the device.
template <class Model>
void restore_optimizer_state(Model& model, const TrainState& first, const std::string& dir, const std::string& path) {
    auto read = [&](int r) {
        TrainState st;
        std::string err, file = state_file(dir, (int)first.step, r);
        if (!read_train_state(file, &st, &err)) data_error("%s", err.c_str());
        if (st.step != first.step || st.world != first.world || st.rank != r ||
            st.optimizer_bytes != first.optimizer_bytes)
            data_error("%s: does not belong with %s (step, shard or size differ)", file.c_str(), path.c_str());
        return st;
    };
    if (first.world == model.plan.world) {
        model.set_optimizer_state(read(model.plan.world > 1 ? model.rank() : 0));
        return;
    }
    if (!model.can_reshard())
        data_error("%s: the optimizer state was saved by %d rank%s (ZeRO shards) and this run partitions it over %d; "
                   "%s state cannot be re-sharded (its layout follows the shards): resume with the same number of "
                   "ranks and --zero", path.c_str(), first.world, first.world > 1 ? "s" : "", model.plan.world,
                   optimizer_name(model.opt.kind));
    std::vector<TrainState> old(first.world);
    for (int r = 0; r < first.world; r++) old[r] = read(r);
    model.set_optimizer_state_resharded(old);
    printf("re-sharded the optimizer state of %d rank%s onto %d\n", first.world, first.world > 1 ? "s" : "",
           model.plan.world);
}

// ----------------------------------------------------------------------------
// Progress

// On the CPU backend, the kernels a step ran, the cuBLASLt calls the host made and the stream
// operations it issued (launches0/matmuls0/ops0: the counters before the step). `which` names the
// step when it is not the first: with CUDA graphs the host calls fewer than run.
inline void print_launch_figures(const char* which, long long launches0, long long matmuls0, long long ops0) {
    if (launches0 < 0) return;
    long long kernels = kernel_launch_count() - launches0, matmuls = matmul_context().calls - matmuls0;
    long long ops = host_stream_op_count() - ops0;
    if (!which[0])
        printf("launches per step: %lld kernels + %lld cuBLASLt matmuls, %lld stream operations issued by the host "
               "(counted by the CPU backend)\n", kernels, matmuls, ops);
    else
        printf("launches per step%s: %lld kernels run; the host called %lld cuBLASLt matmuls and issued %lld stream "
               "operations (counted by the CPU backend)\n", which, kernels, matmuls, ops);
}

// After a run's first step: the device memory in use (returned, MiB) and the launch figures.
inline double print_first_step_figures(long long launches0, long long matmuls0, long long ops0) {
    size_t free_b, total_b;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    double used = (total_b - free_b) / 1048576.0;
    printf("device memory in use after the first step: %.1f MiB of %.1f MiB\n", used, total_b / 1048576.0);
    const MatmulContext& mc = matmul_context();
    if (mc.autotune)
        printf("GEMM autotune: %d shapes timed (%d took another algorithm than the heuristic's first), %.0f ms\n",
               mc.autotuned, mc.autotune_changed, mc.autotune_ms);
    print_launch_figures("", launches0, matmuls0, ops0);
    return used;
}

// --attention-backward tune: the shapes timed since the lines printed so far (*printed): at the run's
// first step under a heading, later (a new batch width, BERT's) a line each.
inline void print_attention_tuned(bool first, int step, size_t* printed) {
    const AttnTuneState& at = attention_backward_tune();
    if (!at.on || (!first && at.report.size() == *printed)) return;
    if (first) {
        printf("attention backward tuned: %zu shape%s timed in %.0f ms (the trial runs are part of this step)",
               at.report.size(), at.report.size() == 1 ? "" : "s", at.host_ms);
        if (!at.captured.empty())
            printf("; %zu first met inside a graph capture took auto's form", at.captured.size());
        printf("\n");
    }
    for (size_t i = *printed; i < at.report.size(); i++)
        if (first) printf("  %s\n", at.report[i].c_str());
        else printf("attention backward tuned at step %d: %s\n", step, at.report[i].c_str());
    *printed = at.report.size();
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

// How a trainer counts its throughput on the step line and in the log: GPT-2 in tokens, BERT in
// sequences.
struct Throughput {
    const char* unit;      // "tok/s"
    const char* line_fmt;  // how the step line prints it, "%.0f"
    const char* json_key;  // "tokens_per_s"
    const char* json_fmt;  // "%.1f"
};

// What a finished optimizer step reports.
struct StepFigures {
    int done;              // steps completed, this one included
    double loss;           // mean over the step's predictions, all ranks
    float norm, lr;        // the global gradient norm before clipping, the step's learning rate
    double units;          // tokens or sequences the step trained on, all ranks
    double flops;          // the step's model FLOPs on this rank, for MFU
    bool scaling = false;  // fp16's dynamic loss scale: the scale the step used, whether it applied
    float scale = 1.f;
    bool applied = true;
    std::string note;      // the trainer's own figures, printed after the loss (e.g. " | aux 0.01 | z 0.002")
};

// --profile-step N brackets this process's Nth step: one past the steps it runs would bracket
// nothing, and the profiler would record an empty session.
inline void check_profile_step(int nth, int steps_this_run) {
    if (nth > steps_this_run)
        option_error("option --profile-step: %d is past the %d step%s this run takes", nth, steps_this_run,
                     steps_this_run == 1 ? "" : "s");
}

// The end of every optimizer step, one way for both trainers: the step is timed by two CUDA events
// on the model's stream (begin() before its first work, end() after the update, which waits for it),
// then report() prints the step line, writes the log line (with the trainer's own fields), keeps the
// ETA, and after the run's first step prints the memory in use and, on the CPU backend, the launches
// and the times the host waited for the device inside the step (llmc/staging.h says why none should).
// One step can be bracketed for a profiler (--profile-step): cudaProfilerStart in begin(), and
// cudaProfilerStop in end() once the step's work is done, so the profiler sees that step's kernels alone.
class StepReporter {
  public:
    StepReporter(cudaStream_t stream, int steps, int end_step, float peak_tflops, Throughput rate, RunLog* log)
        : stream_(stream), steps_(steps), end_step_(end_step), peak_(peak_tflops), rate_(rate), log_(log) {
        cudaCheck(cudaEventCreate(&t0_));
        cudaCheck(cudaEventCreate(&t1_));
    }
    ~StepReporter() {
        cudaCheck(cudaEventDestroy(t0_));
        cudaCheck(cudaEventDestroy(t1_));
    }
    StepReporter(const StepReporter&) = delete;
    StepReporter& operator=(const StepReporter&) = delete;

    // Also print the launch figures after step `done` (1-based), as `which` (e.g. the first step that
    // replays CUDA graphs, after an eager first step).
    void report_launches_at(int done, const char* which) {
        again_done_ = done;
        again_which_ = which;
    }

    // Bracket the run's `nth` step (1-based, counted from this run's first; 0: none) for a profiler.
    void profile_at(int nth) { profile_nth_ = nth; }

    void begin() {
        begun_++;
        if (begun_ == profile_nth_) cudaCheck(cudaProfilerStart());
        syncs0_ = host_sync_count();
        launches0_ = kernel_launch_count();
        matmuls0_ = matmul_context().calls;
        ops0_ = host_stream_op_count();
        cudaCheck(cudaEventRecord(t0_, stream_));
    }
    // Waits until the step's work is done; returns its time in ms.
    double end() {
        host_waits_ = syncs0_ >= 0 ? host_sync_count() - syncs0_ : -1;
        cudaCheck(cudaEventRecord(t1_, stream_));
        cudaCheck(cudaEventSynchronize(t1_));
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, t0_, t1_));
        if (begun_ == profile_nth_) {
            cudaCheck(cudaProfilerStop());
            profiled_kernels_ = launches0_ >= 0 ? kernel_launch_count() - launches0_ : -1;
        }
        ms_ = ms;
        return ms_;
    }

    void report(const StepFigures& f, const JsonFields& extra = JsonFields()) {
        double per_s = f.units / (ms_ / 1000.0);
        double mfu_pct = peak_ > 0 ? 100.0 * f.flops / (ms_ / 1000.0) / (peak_ * 1e12) : NAN;
        char mfu[48];
        if (peak_ > 0) snprintf(mfu, sizeof(mfu), "MFU %.1f%%", mfu_pct);
        else snprintf(mfu, sizeof(mfu), on_cpu_backend() ? "MFU n/a (CPU backend)" : "MFU n/a (unknown GPU)");
        char rate[48];
        snprintf(rate, sizeof(rate), rate_.line_fmt, per_s);
        std::string eta = clock_.add(ms_, end_step_ - f.done);
        char scale[64] = "";
        if (f.scaling)
            snprintf(scale, sizeof(scale), " | scale %g%s", f.scale, f.applied ? "" : " SKIPPED (inf/nan gradients)");
        printf("step %4d/%d | loss %.6f%s | norm %.4f | lr %.2e | %.1f ms | %s %s | %s | eta %s%s\n", f.done, steps_,
               f.loss, f.note.c_str(), f.norm, f.lr, ms_, rate, rate_.unit, mfu, eta.c_str(), scale);
        JsonFields fields;
        fields.number("loss", f.loss).number("grad_norm", f.norm).number("lr", f.lr).number("ms", ms_, "%.3f");
        fields.number(rate_.json_key, per_s, rate_.json_fmt).number("mfu", mfu_pct, "%.3f").append(extra);
        if (f.scaling) fields.number("loss_scale", f.scale).boolean("skipped", !f.applied);
        log_->write("step", f.done, fields);
        if (first_) {
            first_step_mib_ = print_first_step_figures(launches0_, matmuls0_, ops0_);
            if (host_waits_ >= 0)
                printf("host waits for the device inside the step: %lld (counted by the CPU backend)\n", host_waits_);
        } else if (f.done == again_done_) {
            print_launch_figures(again_which_.c_str(), launches0_, matmuls0_, ops0_);
            if (host_waits_ >= 0)
                printf("host waits for the device inside the step%s: %lld (counted by the CPU backend)\n",
                       again_which_.c_str(), host_waits_);
        }
        print_attention_tuned(first_, f.done, &attention_tuned_printed_);
        if (begun_ == profile_nth_) {
            printf("profiled step: step %d ran between cudaProfilerStart and cudaProfilerStop", f.done);
            if (profiled_kernels_ >= 0) printf(" (%lld kernels, counted by the CPU backend)", profiled_kernels_);
            printf("\n");
        }
        first_ = false;
        fflush(stdout);
    }

    // The mean step time, leaving out the first step (warm-up) once there is another.
    double mean_ms() const { return clock_.mean_ms(ms_); }
    // Device memory in use after the run's first step (MiB).
    double first_step_mib() const { return first_step_mib_; }

  private:
    cudaStream_t stream_;
    cudaEvent_t t0_, t1_;
    int steps_, end_step_;
    float peak_;
    Throughput rate_;
    RunLog* log_;
    StepClock clock_;
    double ms_ = 0, first_step_mib_ = 0;
    bool first_ = true;
    long long launches0_ = 0, matmuls0_ = 0, ops0_ = 0;
    int again_done_ = -1;  // report_launches_at
    int begun_ = 0, profile_nth_ = 0;  // steps begun; the one profile_at brackets
    long long profiled_kernels_ = -1;  // kernels that step ran (CPU backend)
    std::string again_which_;
    long long syncs0_ = -1, host_waits_ = -1;  // host_sync_count() at begin(); the waits begin()..end()
    size_t attention_tuned_printed_ = 0;        // print_attention_tuned's
};
