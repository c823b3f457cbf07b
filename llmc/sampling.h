// llmc/sampling.h — drawing the next token from a row of logits on the host (temperature, top-k),
// with a seeded xorshift generator so that a seed gives the same text whatever computed the logits.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "precision.cuh"

// Draws the next token from a row of logits (host, at least V values): softmax(logits / temperature)
// over the real vocabulary V, among the top_k largest only if top_k > 0, with one step of the
// xorshift generator *rng per token (so a seed gives the same sample whatever computed the logits).
// margin, if given, receives how far the draw lies from the nearest edge of the chosen token's
// interval, as a fraction of the total probability: how much the probabilities may move (from
// rounding differences in the logits) before the same draw picks another token. -1 when the row holds
// a non-finite logit (a model with non-finite weights): there is no distribution to draw from.
template <class floatX>
int sample_token(const std::vector<floatX>& row, int V, float temperature, int top_k, uint64_t* rng,
                 double* margin = nullptr) {
    std::vector<float> probs(V);
    float cutoff = -INFINITY;
    if (top_k > 0 && top_k < V) {
        std::vector<float> sorted(V);
        for (int v = 0; v < V; v++) sorted[v] = to_float(row[v]);
        std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<float>());
        cutoff = sorted[top_k - 1];
    }
    float maxl = -INFINITY;
    for (int v = 0; v < V; v++) maxl = std::max(maxl, to_float(row[v]));
    double sum = 0;
    for (int v = 0; v < V; v++) {
        float l = to_float(row[v]);
        probs[v] = l < cutoff ? 0.f : std::exp((l - maxl) / temperature);
        sum += probs[v];
    }
    if (!(sum > 0 && std::isfinite(sum))) return -1;  // a non-finite logit: no distribution to draw from
    uint64_t r = *rng;
    r ^= r << 13; r ^= r >> 7; r ^= r << 17;
    *rng = r;
    double u = (r >> 11) * (1.0 / 9007199254740992.0) * sum, acc = 0;
    int next = V - 1;
    for (int v = 0; v < V; v++) {
        acc += probs[v];
        if (u < acc) { next = v; break; }
    }
    if (margin) *margin = std::min(u - (acc - probs[next]), acc - u) / sum;
    return next;
}
