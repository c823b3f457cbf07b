// test/test_schedulers.cu — the learning-rate schedules (llmc/schedulers.h) against llm.c's
// definitions, transcribed here in double precision, for every step of runs of several lengths,
// warmups and final fractions; and what those definitions imply at the ends of a run: the first step
// after warmup at the peak, the last step still above the final lr, a one-step run at the peak.
#include "../llmc/schedulers.h"
#include "harness.h"

#include <cmath>
#include <string>

// llm.c's llmc/schedulers.h (get_learning_rate_cosine, _linear, _constant, _wsd), in double: warmup
// (step + 1)/W of the peak, then the decay ratio (step - W)/(N - W); WSD keeps the peak until step
// floor(0.8 N), then decays as 1 - sqrt of (step - that)/(N - that).
double reference_lr(LRSchedule kind, double max_lr, int W, int N, double final_fraction, int step) {
    double min_lr = max_lr * final_fraction;
    if (step < W) return max_lr * (step + 1) / W;
    double ratio = (double)(step - W) / (N - W);
    switch (kind) {
        case LRSchedule::Cosine: return min_lr + 0.5 * (1 + std::cos(M_PI * ratio)) * (max_lr - min_lr);
        case LRSchedule::Linear: return max_lr - ratio * (max_lr - min_lr);
        case LRSchedule::WSD: {
            int decay_point = (int)(0.8f * N);  // llm.c's float product, truncated
            if (step < decay_point) return max_lr;
            return min_lr + (1 - std::sqrt((double)(step - decay_point) / (N - decay_point))) * (max_lr - min_lr);
        }
        default: return max_lr;
    }
}

int main() {
    const LRSchedule kinds[] = {LRSchedule::Cosine, LRSchedule::Linear, LRSchedule::Constant, LRSchedule::WSD};
    struct Run { int total, warmup; float final_fraction; };
    const Run runs[] = {{1, 0, 0.f}, {2, 0, 0.f}, {7, 2, 0.f}, {100, 10, 0.f}, {150, 0, 1.f}, {1000, 37, 0.1f},
                        {5, 5, 0.f}};
    const float max_lr = 3e-4f;
    for (LRSchedule kind : kinds)
        for (const Run& r : runs) {
            LRScheduler s;
            s.kind = kind;
            s.max_lr = max_lr;
            s.total = r.total;
            s.warmup = r.warmup;
            s.final_fraction = r.final_fraction;
            // Each lr is a few float operations (a ratio, a product with pi, a cosine or square root,
            // a multiply-add) on values of at most pi times the peak: 8 float roundings of that.
            const double budget = 8 * std::ldexp(1.0, -24) * M_PI * max_lr;
            double worst = 0;
            int worst_step = 0;
            for (int step = 0; step < r.total; step++) {
                double d = std::fabs(s.lr(step) - reference_lr(kind, max_lr, r.warmup, r.total, r.final_fraction, step));
                if (d > worst) worst = d, worst_step = step;
            }
            char name[128];
            snprintf(name, sizeof(name), "%s, %d steps, warmup %d, final fraction %g: every step's lr == llm.c's",
                     lr_schedule_name(kind), r.total, r.warmup, r.final_fraction);
            th::report(worst <= budget, name, "max |diff| %.3g at step %d (budget %.3g)", worst, worst_step,
                       budget);
        }

    // The ends of a run, decaying to 0 after 10 steps of warmup over 100.
    for (LRSchedule kind : {LRSchedule::Cosine, LRSchedule::Linear, LRSchedule::WSD}) {
        LRScheduler s;
        s.kind = kind;
        s.max_lr = max_lr;
        s.total = 100;
        s.warmup = 10;
        std::string k = lr_schedule_name(kind);
        auto near = [](float a, float b) { return std::fabs(a - b) <= std::ldexp(std::fabs(b), -22); };  // 2 ulps
        th::report(near(s.lr(0), max_lr / 10) && near(s.lr(9), max_lr) && s.lr(10) == max_lr,
                   (k + ": warmup from max/10 reaches the peak at its last step, and the next step is at it").c_str(),
                   "lr(0) %.4g, lr(9) %.4g, lr(10) %.4g", s.lr(0), s.lr(9), s.lr(10));
        th::report(s.lr(99) > 0 && s.lr(99) < s.lr(98),
                   (k + ": the last step's lr is above the final 0 and below the one before").c_str(),
                   "lr(98) %.4g, lr(99) %.4g", s.lr(98), s.lr(99));
        s.total = 1;
        s.warmup = 0;
        th::report(s.lr(0) == max_lr, (k + ": a one-step run trains at the peak lr").c_str(), "lr(0) %.4g", s.lr(0));
    }
    return th::finish();
}
