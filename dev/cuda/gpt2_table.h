// dev/cuda/gpt2_table.h — GPT-2's parameter table as the optimizer benchmarks see it: llm.c's 16
// tensors (llmc/gpt2_config.h's sizes and order), layers stacked, weight decay on the matrices.
#pragma once
#include "../../llmc/adamw.cuh"
#include "../../llmc/gpt2_config.h"

#include <vector>

struct Table {
    std::vector<ParamTensor> tensors;
    size_t N = 0;  // elements in all tensors
};

// The table for (padded) vocabulary V, context maxT, L layers, C channels.
inline Table gpt2_table(size_t V, size_t maxT, size_t L, size_t C) {
    GPT2Config c;
    c.padded_vocab_size = (int)V;
    c.max_seq_len = (int)maxT;
    c.num_layers = (int)L;
    c.channels = (int)C;
    size_t sizes[NUM_PARAMETER_TENSORS];
    param_sizes(c, sizes);
    Table t;
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
        t.tensors.push_back(ParamTensor{t.N, sizes[k], param_decays(k) ? 1 : 0});
        t.N += sizes[k];
    }
    return t;
}
