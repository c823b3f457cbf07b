// llmc/gpt2_config.h — GPT-2's shape (GPT2Config), its 16 parameter tensors in llm.c's order, their decay,
// and the 3 tensors of the Mixture-of-Experts blocks that follow them when --moe-experts > 0.
//
// Shared by train_gpt2.cu's model and the checkpoint formats of llmc/gpt2_io.h: a llm.c checkpoint's
// header holds the six numbers of GPT2Config, and its tensors come in this order with these element
// counts, which is also the layout of the model's one parameter buffer. Standard library only.
//
// Mixture of Experts (doc/gpt2.md). With moe_experts E > 0, blocks moe_every-1, 2*moe_every-1, ...
// (the moe_every-th, 2*moe_every-th, ... counting from 1) have llmc/moe_layer.cuh's MoE layer in
// place of the dense MLP. The layout stays llm.c's 16 tensors first — the dense MLP tensors (FCW,
// FCB, FCPROJW, FCPROJB) then hold the L - Lm dense blocks only, in block order — followed by the
// Lm MoE blocks' router (Lm,E,C), expert w1 (Lm,E,H1,C) and w2 (Lm,E,C,H), H = 4C as the dense MLP's,
// H1 = H (GELU) or 2H (SwiGLU's gate and up rows). With E = 0 the layout is exactly llm.c's.
#pragma once
#include <cstddef>

struct GPT2Config {
    int max_seq_len = 1024;        // maxT: positions the model has embeddings for
    int vocab_size = 50257;        // V: real tokens
    int padded_vocab_size = 50304; // Vp: V rounded up to a multiple of 128 (aligned matmuls)
    int num_layers = 12;           // L
    int num_heads = 12;            // NH
    int channels = 768;            // C
    // Mixture of Experts (0 experts: every block dense, llm.c's GPT-2)
    int moe_experts = 0;           // E
    int moe_top_k = 2;             // K experts per token
    int moe_every = 2;             // every moe_every-th block is sparse
    int moe_swiglu = 0;            // experts: 0 GELU MLPs (GPT-2's), 1 SwiGLU
    float moe_capacity = 0.f;      // capacity factor (0: dropless)
    float moe_aux = 0.01f;         // load-balancing loss coefficient alpha
    float moe_z = 0.001f;          // router z-loss coefficient beta

    // Block l's MLP is the MoE layer.
    bool moe_block(int l) const { return moe_experts > 0 && (l + 1) % moe_every == 0; }
    // Lm: the MoE blocks; the index of MoE block l among them (l must be one), and of dense block l
    // among the dense ones (l must be one).
    int moe_blocks() const { return moe_experts > 0 ? num_layers / moe_every : 0; }
    int moe_index(int l) const { return (l + 1) / moe_every - 1; }
    int dense_index(int l) const { return moe_experts > 0 ? l - (l + 1) / moe_every : l; }
    // Expert hidden units H (the dense MLP's 4C) and rows of w1 per expert.
    int moe_hidden() const { return 4 * channels; }
    int moe_w1_rows() const { return moe_swiglu ? 2 * moe_hidden() : moe_hidden(); }
};

// The most experts and experts per token a model may have: K is llmc/moe.cuh's MOE_MAX_K (the
// router keeps its top-K list in registers); E is bounded because every MoE block keeps padded
// expert rows for E blocks of up to B*T tokens (llmc/moe_layer.cuh) — memory grows with E.
constexpr int GPT2_MOE_MAX_EXPERTS = 128;
constexpr int GPT2_MOE_MAX_K = 8;

// V rounded up to a multiple of 128, as llm.c pads (50257 -> 50304).
inline int pad_vocab(int V) { return (V + 127) / 128 * 128; }

// The parameters: 16 tensors in one allocation, in llm.c's checkpoint order, then the MoE blocks' 3.
constexpr int NUM_PARAMETER_TENSORS = 16;
constexpr int NUM_MODEL_TENSORS = 19;
enum ParamIndex {
    WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, LNFW, LNFB,
    MOEROUTER, MOEW1, MOEW2
};
// Element counts of the 16 llm.c tensors (the dense MLP's for the dense blocks only); returns their total.
inline size_t param_sizes(const GPT2Config& c, size_t sizes[NUM_PARAMETER_TENSORS]) {
    size_t Vp = c.padded_vocab_size, C = c.channels, L = c.num_layers, maxT = c.max_seq_len;
    size_t Ld = L - c.moe_blocks();  // blocks with a dense MLP
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
    sizes[FCW] = Ld * 4 * C * C;      // (Ld, 4C, C)
    sizes[FCB] = Ld * 4 * C;
    sizes[FCPROJW] = Ld * C * 4 * C;  // (Ld, C, 4C)
    sizes[FCPROJB] = Ld * C;
    sizes[LNFW] = C;
    sizes[LNFB] = C;
    size_t total = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) total += sizes[i];
    return total;
}

// Element counts of all 19 tensors (the MoE blocks' 0 when E = 0); returns the total. On one of
// expert_ranks ranks of expert parallelism the experts' w1 and w2 hold that rank's E/expert_ranks
// experts per MoE block (the files always hold all: expert_ranks 1).
inline size_t model_param_sizes(const GPT2Config& c, size_t sizes[NUM_MODEL_TENSORS], int expert_ranks = 1) {
    size_t total = param_sizes(c, sizes);
    size_t Lm = c.moe_blocks(), E = c.moe_experts, C = c.channels, H = c.moe_hidden(), H1 = c.moe_w1_rows();
    size_t El = E / expert_ranks;
    sizes[MOEROUTER] = Lm * E * C;    // (Lm, E, C)
    sizes[MOEW1] = Lm * El * H1 * C;  // (Lm, E_l, H1, C)
    sizes[MOEW2] = Lm * El * C * H;   // (Lm, E_l, C, H)
    return total + sizes[MOEROUTER] + sizes[MOEW1] + sizes[MOEW2];
}

// Parameters a token uses: all but the experts it is not routed to, (E-K) of each MoE block's.
inline size_t active_param_count(const GPT2Config& c, size_t total) {
    size_t per_expert = (size_t)c.moe_w1_rows() * c.channels + (size_t)c.channels * c.moe_hidden();
    return total - (size_t)c.moe_blocks() * (c.moe_experts - (c.moe_experts > 0 ? c.moe_top_k : 0)) * per_expert;
}

// Weight decay applies to the matrices (embeddings and linear weights, the experts' included), not
// to biases and layernorm parameters, as in GPT-2 / llm.c; nor to the MoE router: decay would pull
// its logits toward uniform routing, a force the z-loss already applies to their size with its own
// coefficient.
inline bool param_decays(int i) {
    return i == WTE || i == WPE || i == QKVW || i == ATTPROJW || i == FCW || i == FCPROJW || i == MOEW1 || i == MOEW2;
}
