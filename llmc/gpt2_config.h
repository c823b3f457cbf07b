// llmc/gpt2_config.h — GPT-2's shape (GPT2Config), its 16 parameter tensors in llm.c's order, their decay.
//
// Shared by train_gpt2.cu's model and the checkpoint formats of llmc/gpt2_io.h: a llm.c checkpoint's
// header holds the six numbers of GPT2Config, and its tensors come in this order with these element
// counts, which is also the layout of the model's one parameter buffer. Standard library only.
#pragma once
#include <cstddef>

struct GPT2Config {
    int max_seq_len = 1024;        // maxT: positions the model has embeddings for
    int vocab_size = 50257;        // V: real tokens
    int padded_vocab_size = 50304; // Vp: V rounded up to a multiple of 128 (aligned matmuls)
    int num_layers = 12;           // L
    int num_heads = 12;            // NH
    int channels = 768;            // C
};

// V rounded up to a multiple of 128, as llm.c pads (50257 -> 50304).
inline int pad_vocab(int V) { return (V + 127) / 128 * 128; }

// The parameters: 16 tensors in one allocation, in llm.c's checkpoint order.
constexpr int NUM_PARAMETER_TENSORS = 16;
enum ParamIndex { WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, LNFW, LNFB };
// Element counts of the 16 tensors; returns the total.
inline size_t param_sizes(const GPT2Config& c, size_t sizes[NUM_PARAMETER_TENSORS]) {
    size_t Vp = c.padded_vocab_size, C = c.channels, L = c.num_layers, maxT = c.max_seq_len;
    sizes[WTE] = Vp * C;             // (Vp, C)
    sizes[WPE] = maxT * C;           // (maxT, C)
    sizes[LN1W] = L * C;             // (L, C)
    sizes[LN1B] = L * C;
    sizes[QKVW] = L * 3 * C * C;     // (L, 3C, C)
    sizes[QKVB] = L * 3 * C;         // (L, 3C)
    sizes[ATTPROJW] = L * C * C;     // (L, C, C)
    sizes[ATTPROJB] = L * C;
    sizes[LN2W] = L * C;
    sizes[LN2B] = L * C;
    sizes[FCW] = L * 4 * C * C;      // (L, 4C, C)
    sizes[FCB] = L * 4 * C;
    sizes[FCPROJW] = L * C * 4 * C;  // (L, C, 4C)
    sizes[FCPROJB] = L * C;
    sizes[LNFW] = C;
    sizes[LNFB] = C;
    size_t total = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) total += sizes[i];
    return total;
}

// Weight decay applies to the matrices (embeddings and linear weights), not to biases and
// layernorm parameters, as in GPT-2 / llm.c.
inline bool param_decays(int i) {
    return i == WTE || i == WPE || i == QKVW || i == ATTPROJW || i == FCW || i == FCPROJW;
}
