// llmc/schedulers.h — learning-rate schedules: cosine (with linear warmup and a final fraction),
// linear, constant, and WSD (warmup-stable-decay).
#pragma once
#include <cmath>
#include <cstring>
#include <string>

enum class LRSchedule { Cosine, Linear, Constant, WSD };

// Parses a schedule name; returns false for an unknown one.
inline bool parse_lr_schedule(const char* name, LRSchedule* out) {
    if (!strcmp(name, "cosine")) *out = LRSchedule::Cosine;
    else if (!strcmp(name, "linear")) *out = LRSchedule::Linear;
    else if (!strcmp(name, "constant")) *out = LRSchedule::Constant;
    else if (!strcmp(name, "wsd")) *out = LRSchedule::WSD;
    else return false;
    return true;
}

inline const char* lr_schedule_name(LRSchedule s) {
    switch (s) {
        case LRSchedule::Cosine: return "cosine";
        case LRSchedule::Linear: return "linear";
        case LRSchedule::Constant: return "constant";
        case LRSchedule::WSD: return "wsd";
    }
    return "?";
}

struct LRScheduler {
    LRSchedule kind = LRSchedule::Cosine;
    float max_lr = 3e-4f;
    int warmup = 0;             // steps of linear warmup from ~0 to max_lr
    int total = 1;              // total steps of the run
    float final_fraction = 0.f; // the lr at the last step, as a fraction of max_lr
    float decay_fraction = 0.2f;// WSD: the share of the run spent decaying at the end

    // Learning rate of step (0-based): linear warmup for every schedule, then the schedule's shape
    // from max_lr down to final_fraction * max_lr at the last step.
    float lr(int step) const {
        float min_lr = max_lr * final_fraction;
        if (step < warmup) return max_lr * (step + 1) / warmup;
        if (kind == LRSchedule::Constant) return max_lr;
        int span = total - warmup;
        float progress = span <= 1 ? 1.f : (float)(step - warmup) / (float)(span - 1);
        if (progress > 1.f) progress = 1.f;
        switch (kind) {
            case LRSchedule::Cosine:
                return min_lr + 0.5f * (max_lr - min_lr) * (1.f + std::cos((float)M_PI * progress));
            case LRSchedule::Linear:
                return max_lr + (min_lr - max_lr) * progress;
            case LRSchedule::WSD: {
                int decay_steps = (int)std::lround(decay_fraction * total);
                int decay_start = total - decay_steps;
                if (step < decay_start || decay_steps <= 0) return max_lr;
                float d = decay_steps <= 1 ? 1.f : (float)(step - decay_start) / (float)(decay_steps - 1);
                return max_lr + (min_lr - max_lr) * (d > 1.f ? 1.f : d);
            }
            default: return max_lr;
        }
    }
};
