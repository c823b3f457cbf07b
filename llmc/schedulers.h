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
    int warmup = 0;              // steps of linear warmup from max_lr/warmup to max_lr
    int total = 1;               // total steps of the run
    float final_fraction = 0.f;  // the lr the decay heads for, as a fraction of max_lr
    float stable_fraction = 0.8f;// WSD: the decay starts at this share of the run

    // Learning rate of step (0-based), as llm.c's schedulers compute it: linear warmup for every
    // schedule ((step + 1)/warmup of max_lr), then the schedule's shape at the decay ratio
    // (step - warmup)/(total - warmup), which goes from 0 at the first step after warmup towards 1 at
    // step `total`, one past the last: the last step still has an lr above the final one (a one-step
    // run trains at max_lr), as in llm.c and in transformers' schedules with warmup.
    float lr(int step) const {
        float min_lr = max_lr * final_fraction;
        if (step < warmup) return max_lr * (float)(step + 1) / (float)warmup;
        float ratio = (float)(step - warmup) / (float)(total - warmup);
        if (ratio > 1.f) ratio = 1.f;
        switch (kind) {
            case LRSchedule::Cosine:
                return min_lr + 0.5f * (1.f + std::cos((float)M_PI * ratio)) * (max_lr - min_lr);
            case LRSchedule::Linear:
                return max_lr - ratio * (max_lr - min_lr);
            case LRSchedule::WSD: {
                // warmup, max_lr until the decay point, then the "1 - sqrt" cooldown of Hägele et al.
                // (2024) to min_lr at step `total`
                int decay_point = (int)(stable_fraction * (float)total);
                if (step < decay_point) return max_lr;
                float d = (float)(step - decay_point) / (float)(total - decay_point);
                return min_lr + (1.f - std::sqrt(d > 1.f ? 1.f : d)) * (max_lr - min_lr);
            }
            default: return max_lr;
        }
    }
};
