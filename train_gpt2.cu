// train_gpt2.cu — GPT-2 training: the model, its whole forward and backward pass, the optimizer step
// and the training loop, in one file. Kernels live in llmc/; this file is the model-level tier.
//
// Chapters: configuration · parameters · activations · the model (build, forward, backward, update) ·
// decoding with a KV cache (GPT2Decoder) · initial weights and checkpoints · training (sampling text,
// the loop) · main. The checkpoint formats — llm.c model files, Hugging Face safetensors — are in
// llmc/gpt2_io.h; the command line in llmc/gpt2_options.h.
//
// Mixture of Experts (--moe-experts E > 0): every moe_every-th block's MLP is llmc/moe_layer.cuh's
// MoE layer (router, top-K routing with capacity, E expert MLPs); its load-balancing and z losses
// join the objective. Layout and checkpoint extension: llmc/gpt2_config.h, llmc/gpt2_io.h.
// With --expert-parallel under mpirun -np P, each rank holds E/P experts of every MoE block (the
// last tensors of its parameters, rank-local: llmc/model_state.cuh) and the layer exchanges tokens
// with the experts' ranks (llmc/moe_layer.cuh); model files still hold every expert (gathered for
// writing, sliced when read), each rank's optimizer state file its own experts' state.
//
// Precision is a run-time choice (--precision auto|fp32|tf32|bf16|fp16|fp8): every model-level
// function is a template on the storage type floatX of parameters and activations, and main()
// dispatches once. In bf16 and fp16 the optimizer keeps fp32 master weights and fp32 moments; all
// accumulation is fp32.
//
// CUDA graphs (--cuda-graphs, default 1): after the run's first step, each micro-step's forward and
// backward passes are replayed from a graph captured once per kind of micro-step and loss scale
// (GPT2::train_micro_step); the batch upload (ids, targets, the embedding backward's plan) and the
// optimizer step stay eager.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <sys/stat.h>

#include "llmc/attention.cuh"         // flash attention, forward and backward
#include "llmc/checkpoint.h"          // checkpoint file names, DONE markers, the training-state file
#include "llmc/cli.h"                 // the command-line parser
#include "llmc/cuda_common.h"         // cudaCheck, the launch helper, CEIL_DIV
#include "llmc/dataloader.h"          // token shards -> (B,T) batches; data_error
#include "llmc/encoder.cuh"           // token + position embeddings, forward and backward
#include "llmc/fused_classifier.cuh"  // softmax cross-entropy fused with its backward
#include "llmc/gelu.cuh"              // GELU (tanh form), forward and backward
#include "llmc/gpt2_config.h"         // GPT2Config and the 16 parameter tensors (ParamIndex, param_sizes)
#include "llmc/gpt2_io.h"             // llm.c model files and Hugging Face safetensors, in and out
#include "llmc/gpt2_options.h"        // the command line: TrainOptions, GPT-2's options and defaults
#include "llmc/kv_cache.cuh"          // attention of one new token against a KV cache (decoding)
#include "llmc/layernorm.cuh"         // LayerNorm and the fused residual add, forward and backward
#include "llmc/logger.h"              // the JSON Lines run log
#include "llmc/matmul.cuh"            // linear layers through cuBLASLt (fp8 GEMMs included)
#include "llmc/mfu.h"                 // peak GPU throughput, for MFU
#include "llmc/model_state.cuh"       // parameters, gradients, master weights, optimizers, ZeRO
#include "llmc/moe_layer.cuh"         // the Mixture-of-Experts MLP layer, forward and backward
#include "llmc/precision.cuh"         // storage types and conversions
#include "llmc/rng.h"                 // NormalRNG: the random initialization's normal draws
#include "llmc/run.h"                 // loss scaling, memory report, resume checks, the step reporter
#include "llmc/sampling.h"            // sample_token: the next token from a row of logits
#include "llmc/schedulers.h"          // learning-rate schedules
#include "llmc/staging.h"             // pinned slots for the micro-batches a step uploads
#include "llmc/stop_signal.h"         // Ctrl-C / SIGTERM / SIGUSR1: stop after the step, with a checkpoint
#include "llmc/tokenizer.h"           // GPT-2's BPE tokenizer (prompts and samples)

// ----------------------------------------------------------------------------
// Configuration: GPT2Config (maxT, V, Vp, L, NH, C) is llmc/gpt2_config.h's, shared with the
// checkpoint formats.

// The GPT-2 family by depth: d12 = 124M, d24 = 350M, d36 = 774M, d48 = 1.5B (channels = 64 * depth
// as llm.c's "dNN" shorthand, heads of size 64).
inline bool config_from_depth(const std::string& spec, GPT2Config* c) {
    if (spec.size() < 2 || spec[0] != 'd') return false;
    char* end;
    long depth = strtol(spec.c_str() + 1, &end, 10);
    if (*end || depth <= 0 || depth > 128) return false;
    c->num_layers = (int)depth;
    switch (depth) {
        case 12: c->channels = 768; c->num_heads = 12; break;
        case 24: c->channels = 1024; c->num_heads = 16; break;
        case 36: c->channels = 1280; c->num_heads = 20; break;
        case 48: c->channels = 1600; c->num_heads = 25; break;
        default: c->channels = (int)depth * 64; c->num_heads = (int)depth; break;
    }
    return true;
}

// ----------------------------------------------------------------------------
// Parameters: 16 tensors in one allocation, in llm.c's checkpoint order, then the MoE blocks' 3
// (ParamIndex, and their sizes from model_param_sizes: llmc/gpt2_config.h).

static_assert(GPT2_MOE_MAX_K == MOE_MAX_K, "llmc/gpt2_config.h's limit on K is the MoE layer's");

// Pointers to the 19 tensors inside one buffer (the MoE blocks' empty without experts).
template <class floatX>
using ParameterTensors = TensorViews<floatX, NUM_MODEL_TENSORS>;

// The tensors as the optimizers see them (llmc/model_state.cuh): shapes of one copy, L copies of
// the per-layer tensors. With experts, the dense MLP tensors hold fewer than L copies and the MoE
// tensors Lm: both are then communicated after the layers (GradReady::AfterLayers, ZeRO's per-layer
// groups being L slices of a tensor), one copy per expert matrix (Adafactor's statistics per matrix).
// Over expert_ranks > 1 ranks of expert parallelism the expert tensors hold this rank's E/expert_ranks
// experts per block and are rank-local (never communicated).
inline std::vector<ParamSpec> param_specs(const GPT2Config& c, int expert_ranks = 1) {
    size_t Vp = c.padded_vocab_size, C = c.channels, L = c.num_layers, maxT = c.max_seq_len;
    std::vector<ParamSpec> s(NUM_PARAMETER_TENSORS);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) s[i] = ParamSpec{{C}, L, param_decays(i), GradReady::PerLayer};
    s[WTE].shape = {Vp, C};
    s[WPE].shape = {maxT, C};
    s[WTE].copies = s[WPE].copies = s[LNFW].copies = s[LNFB].copies = 1;
    // The final layernorm's gradients are final before the layers' backward; the embeddings' after
    // them (the tied wte gets the LM head's part first and the encoder's last).
    s[LNFW].ready = s[LNFB].ready = GradReady::BeforeLayers;
    s[WTE].ready = s[WPE].ready = GradReady::AfterLayers;
    s[QKVW].shape = {3 * C, C};
    s[QKVB].shape = {3 * C};
    s[ATTPROJW].shape = {C, C};
    s[FCW].shape = {4 * C, C};
    s[FCB].shape = {4 * C};
    s[FCPROJW].shape = {C, 4 * C};
    if (c.moe_experts > 0) {
        size_t Lm = c.moe_blocks(), E = c.moe_experts, El = E / expert_ranks, H = c.moe_hidden(),
               H1 = c.moe_w1_rows();
        bool local = expert_ranks > 1;
        for (int i : {FCW, FCB, FCPROJW, FCPROJB}) {
            s[i].copies = L - Lm;
            s[i].ready = GradReady::AfterLayers;
        }
        s.push_back(ParamSpec{{E, C}, Lm, param_decays(MOEROUTER), GradReady::AfterLayers});
        s.push_back(ParamSpec{{H1, C}, Lm * El, param_decays(MOEW1), GradReady::AfterLayers, local});
        s.push_back(ParamSpec{{C, H}, Lm * El, param_decays(MOEW2), GradReady::AfterLayers, local});
    }
    return s;
}

// The MoE layer's settings for a model's MoE blocks.
inline MoeConfig moe_config(const GPT2Config& c) {
    MoeConfig m;
    m.C = c.channels;
    m.E = c.moe_experts;
    m.K = c.moe_top_k;
    m.H = c.moe_hidden();
    m.experts = c.moe_swiglu ? MoeExperts::SwiGLU : MoeExperts::Gelu;
    m.capacity_factor = c.moe_capacity;
    m.alpha = c.moe_aux;
    m.beta = c.moe_z;
    return m;
}

// MoE block l's weights (or gradients) inside views t of the model's tensors (the experts of this
// rank of expert_ranks).
template <class floatX>
MoeWeights<floatX> moe_weights(const ParameterTensors<floatX>& t, const GPT2Config& c, int l, int expert_ranks = 1) {
    size_t m = c.moe_index(l), E = c.moe_experts, El = E / expert_ranks, C = c.channels;
    return MoeWeights<floatX>{t.t[MOEROUTER] + m * E * C, t.t[MOEW1] + m * El * c.moe_w1_rows() * C,
                              t.t[MOEW2] + m * El * C * c.moe_hidden()};
}

// Expert parallelism: this rank's parameters (expert_ranks ranks, this one `rank`) from all of them
// (`all`, the model file's layout): every tensor as it is, but of each MoE block's E experts in w1
// and w2 only the E_l = E/expert_ranks of this rank, [rank*E_l, (rank+1)*E_l).
inline std::vector<float> expert_slice(const std::vector<float>& all, const GPT2Config& c, int expert_ranks,
                                       int rank) {
    size_t full[NUM_MODEL_TENSORS], mine[NUM_MODEL_TENSORS];
    model_param_sizes(c, full);
    std::vector<float> out(model_param_sizes(c, mine, expert_ranks));
    const float* src = all.data();
    float* dst = out.data();
    for (int i = 0; i < NUM_MODEL_TENSORS; i++) {
        if (i == MOEW1 || i == MOEW2) {  // (Lm, E, per) -> (Lm, E_l, per)
            size_t per_block = mine[i] / std::max(c.moe_blocks(), 1);
            for (int m = 0; m < c.moe_blocks(); m++)
                std::copy_n(src + m * expert_ranks * per_block + rank * per_block, per_block, dst + m * per_block);
        } else {
            std::copy_n(src, full[i], dst);
        }
        src += full[i];
        dst += mine[i];
    }
    return out;
}

// ----------------------------------------------------------------------------
// Activations: everything the backward pass reads, sized for micro-batch (B, T), one allocation.
//
// Recomputation (Recompute, llmc/model_state.cuh) keeps one layer's worth of an activation instead of
// every layer's and recomputes it in the backward pass from what is kept:
//   gelu   the MLP's GELU output (B,T,4C) per layer -> recomputed from its input (kept)
//   ln     also the two layernorm outputs (B,T,C) per layer -> recomputed from the residual stream
//   layer  everything but each layer's input (the residual stream)
// A MoE block's MLP keeps its own activations (MoeLayer: router state, plan, padded expert rows)
// per MoE block at every level; its input ln2 follows the level as a dense block's.

template <class floatX>
struct Activations {
    floatX* encoded;    // (B,T,C)
    floatX* ln1;        // (L,B,T,C)
    float* ln1_mean;    // (L,B,T)
    float* ln1_rstd;    // (L,B,T)
    floatX* qkv;        // (L,B,T,3C)
    floatX* atty;       // (L,B,T,C)
    float* att_lse;     // (L,B,NH,T) logsumexp per query row, for the attention backward
    floatX* residual2;  // (L,B,T,C)
    floatX* ln2;        // (L,B,T,C)
    float* ln2_mean;    // (L,B,T)
    float* ln2_rstd;    // (L,B,T)
    floatX* fch;        // (L_dense,B,T,4C) pre-GELU, L_dense = the dense (not MoE) blocks
    floatX* fch_gelu;   // (L_dense,B,T,4C)
    floatX* residual3;  // (L,B,T,C)
    floatX* lnf;        // (B,T,C)
    float* lnf_mean;    // (B,T)
    float* lnf_rstd;    // (B,T)
    floatX* logits;     // (B,T,Vp); the classifier turns it into dlogits in place
    float* losses;      // (B,T)
    // Backward-pass buffers, reused by every layer:
    floatX* dresidual;  // (B,T,C) gradient of the residual stream
    floatX* dbtc;       // (B,T,C)
    floatX* dbt4c;      // (B,T,4C) (also holds dqkv (B,T,3C))
    floatX* btc;        // (B,T,C) forward scratch (projection outputs before the residual add)
    void* scratch;      // kernel scratch (layernorm/matmul/attention backward)
    void* wgrad_scratch;  // --overlap-wgrad: the weight stream's bias-gradient partials
    int* inputs;        // (B,T)
    int* targets;       // (B,T)
};

// Pointers to layer l's slice of the activations (what its forward writes and backward reads).
template <class floatX>
struct LayerActs {
    floatX* residual;   // (B,T,C) the layer's input: the embeddings or the previous residual3
    floatX* ln1;        // (B,T,C)
    float* ln1_mean;    // (B,T)
    float* ln1_rstd;    // (B,T)
    floatX* qkv;        // (B,T,3C)
    floatX* atty;       // (B,T,C)
    float* lse;         // (B,NH,T)
    floatX* residual2;  // (B,T,C)
    floatX* ln2;        // (B,T,C)
    float* ln2_mean;    // (B,T)
    float* ln2_rstd;    // (B,T)
    floatX* fch;        // (B,T,4C)
    floatX* fch_gelu;   // (B,T,4C)
    floatX* residual3;  // (B,T,C)
};

// ----------------------------------------------------------------------------
// The model

// The parameters, gradients, master weights, optimizer and its update are the shared ModelState
// (llmc/model_state.cuh); GPT2 adds the named tensors, the activations and the passes over them.
template <class floatX>
struct GPT2 : ModelState<floatX> {
    using State = ModelState<floatX>;
    using State::num_parameters, State::params_memory, State::grads_memory, State::master, State::opt,
        State::opt_state_bytes, State::mem, State::stream;
    GPT2Config config;
    size_t sizes[NUM_MODEL_TENSORS];
    ParameterTensors<floatX> params, grads;
    Activations<floatX> acts{};
    void* acts_memory = nullptr;
    size_t acts_bytes = 0;
    int B = 0, T = 0;
    Recompute recompute = Recompute::None;  // set before allocate_activations()
    // --precision fp8 (bf16 model only): the blocks' linear layers run fp8 GEMMs, each with its own
    // delayed-scaling state (amax history of 16, margin 0) for input, weight and output gradient.
    bool fp8 = false;                  // set before build()
    std::vector<Fp8Linear> fp8_layers;  // (L, NUM_LINEAR)
    void* fp8_memory = nullptr;         // their device state
    void* fp8_scratch = nullptr;        // the fp8 copies of one GEMM's operands, sized in allocate_activations()
    static constexpr int kFp8History = 16;
    // The MLP's GELU as cuBLASLt's matmul epilogue (one launch) or as llmc/gelu.cuh's kernel after
    // the matmul; recomputation needs the kernel (the backward pass recomputes exactly its bits).
    bool gelu_fusion = true;
    bool fused_gelu() const { return gelu_fusion && recompute == Recompute::None; }
    // The activations' layout: recompute's, or without training (no backward pass reads them) one
    // layer's, each layer's forward overwriting the last's (the residual stream keeps every layer).
    Recompute kept() const { return this->training ? recompute : Recompute::Layer; }
    // The projections' bias gradients from the LayerNorm backward below them (see backward()); set
    // in allocate_activations(): false where its shared memory cannot hold the third sum (huge C).
    bool ln_bias_sums = true;
    // --overlap-wgrad: each dense block's weight and bias gradients on a stream of their own,
    // wgrad_stream, while the model's stream computes the input gradients (see backward()); set before
    // allocate_activations(), which makes the stream. Not with fp8, whose weight gradients share the
    // casts of their operands with the input gradients.
    bool overlap_wgrad = false;
    cudaStream_t wgrad_stream = nullptr;
    std::vector<cudaEvent_t> wgrad_events;  // the fork and join points, reused in turn
    size_t wgrad_next = 0;
    static constexpr int kWgradEvents = 16;  // a layer uses 8; an event is reused two layers later
    EncoderBackwardPlan encoder_plan;
    StagingSlots batch_slots;  // pinned copies of the micro-batches in flight (set_batch)
    // Mixture of Experts: one layer state per MoE block (sized for B*T tokens in
    // allocate_activations), and the weight of a unit of the auxiliary losses in the objective,
    // which forward() derives from the cross-entropy's (see there).
    std::vector<MoeLayer<floatX>> moe;
    float moe_dloss = 0.f;
    // Expert parallelism (set before build): the experts sharded over moe_par.ranks ranks (1: all here).
    MoeParallel moe_par;
    MoeWeights<floatX> moe_params(int l) const { return moe_weights(params, config, l, moe_par.ranks); }
    MoeWeights<floatX> moe_grads(int l) const { return moe_weights(grads, config, l, moe_par.ranks); }

    // Allocates parameters, gradients and optimizer state for config and fills params_memory
    // from the fp32 host values of the whole model (every expert; this rank takes its own).
    void build(const GPT2Config& c, const std::vector<float>& host_params) {
        config = c;
        model_param_sizes(c, sizes, moe_par.ranks);
        this->build_state(param_specs(c, moe_par.ranks),
                          moe_par.ranks > 1 ? expert_slice(host_params, c, moe_par.ranks, moe_par.rank) : host_params);
        params.point_into(params_memory, sizes);
        if (this->training) {
            size_t grad_sizes[NUM_MODEL_TENSORS] = {};  // the MoE tensors' stay 0 without experts
            std::copy(this->grad_sizes.begin(), this->grad_sizes.end(), grad_sizes);
            grads.point_into(grads_memory, grad_sizes, this->grad_layer_slots);
        }
        if (fp8) {
            size_t one = fp8_linear_bytes(kFp8History), n = (size_t)c.num_layers * NUM_LINEAR;
            cudaMallocCheck(&fp8_memory, n * one);
            cudaCheck(cudaMemset(fp8_memory, 0, n * one));  // padding included: checkpoints copy it
            fp8_layers.resize(n);
            for (size_t k = 0; k < n; k++)
                fp8_linear_init(&fp8_layers[k], (char*)fp8_memory + k * one, kFp8History, 0, stream);
            mem.other += n * one;
        }
    }

    // Sizes and allocates the activations for micro-batch (B, T), once.
    void allocate_activations(int B_, int T_) {
        B = B_;
        T = T_;
        std::vector<Region> regions = activation_regions(B, T);
        acts_bytes = regions_bytes(regions);
        if (cudaMalloc(&acts_memory, acts_bytes) != cudaSuccess) {
            size_t free_b, total_b;
            cudaCheck(cudaMemGetInfo(&free_b, &total_b));
            data_error("not enough device memory for the activations: B=%d T=%d needs %.1f MiB, %.1f MiB are free "
                       "(lower --batch-size and keep the tokens per step with --total-batch-size, try --recompute, "
                       "or --batch-size auto)", B, T, acts_bytes / 1048576.0, free_b / 1048576.0);
        }
        carve_regions(acts_memory, regions);
        mem.activations = acts_bytes;
        ln_bias_sums = layernorm_backward_fits_colsum(config.channels);
        moe.resize(config.moe_blocks());
        for (MoeLayer<floatX>& m : moe) moe_layer_init(&m, moe_config(config), B * T, moe_par);
        mem.activations += moe.size() * moe_layer_bytes<floatX>(moe_config(config), B * T, moe_par.ranks);
        mem.other += encoder_backward_plan_reserve(&encoder_plan, B, T, config.channels, config.vocab_size, 0, stream);
        reserve_batch_slots(1);
        if (overlap_wgrad && this->training && !wgrad_stream) {
            // Non-blocking: where the model's stream is the legacy one (no CUDA graphs), the events
            // alone order the two streams, so that they can run at the same time.
            cudaCheck(cudaStreamCreateWithFlags(&wgrad_stream, cudaStreamNonBlocking));
            matmul_add_stream(wgrad_stream);  // its GEMMs run beside the others: a workspace of its own
            wgrad_events.resize(kWgradEvents);
            for (cudaEvent_t& e : wgrad_events) cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        }
        if (fp8 && !fp8_scratch) {
            size_t bytes = fp8_scratch_bytes(B, T);
            if (cudaMalloc(&fp8_scratch, bytes) != cudaSuccess)
                data_error("not enough device memory for the fp8 GEMMs' operand copies: B=%d T=%d needs %.1f MiB more "
                           "(lower --batch-size and keep the tokens per step with --total-batch-size, or --batch-size "
                           "auto)", B, T, bytes / 1048576.0);
            mem.other += bytes;
        }
    }

    // fp8 (--precision fp8): the scratch of the fp8 copies of a GEMM's operands, one buffer for the
    // largest of a block's four GEMMs at micro-batch (B, T); 0 in other precisions.
    size_t fp8_scratch_bytes(int B_, int T_) const {
        if (!fp8) return 0;
        size_t C = config.channels, BT = (size_t)B_ * T_;
        return std::max({matmul_fp8_scratch_bytes((int)BT, (int)C, (int)(3 * C)),
                         matmul_fp8_scratch_bytes((int)BT, (int)C, (int)C),
                         matmul_fp8_scratch_bytes((int)BT, (int)C, (int)(4 * C)),
                         matmul_fp8_scratch_bytes((int)BT, (int)(4 * C), (int)C)});
    }

    // Device bytes allocate_activations(B, T) needs: the activations, the embedding backward's plan,
    // the MoE blocks' buffers and fp8's operand copies.
    size_t activation_bytes(int B_, int T_) {
        size_t plan = encoder_plan_device_bytes(B_, T_, config.channels, false);
        size_t experts = config.moe_blocks() * moe_layer_bytes<floatX>(moe_config(config), B_ * T_, moe_par.ranks);
        return regions_bytes(activation_regions(B_, T_)) + plan + experts + fp8_scratch_bytes(B_, T_);
    }

    // The activation regions for micro-batch (B, T), in allocation order.
    std::vector<Region> activation_regions(int B, int T) {
        size_t L = config.num_layers, C = config.channels, NH = config.num_heads, Vp = config.padded_vocab_size;
        size_t BT = (size_t)B * T;
        size_t scratch = std::max({layernorm_backward_scratch_bytes((int)BT, (int)C),
                                   matmul_backward_scratch_bytes((int)BT, (int)(4 * C)),
                                   matmul_backward_scratch_bytes((int)BT, (int)Vp),
                                   attention_backward_scratch_bytes<floatX>(B, T, (int)C, (int)NH)});
        // Layers kept per activation: L, or 1 when the backward pass recomputes it (see Recompute) or
        // there is no backward pass (kept()). The dense MLP's fch and fch_gelu exist for the dense blocks
        // only (a MoE block's MLP state is its MoeLayer's). The gradients' buffers and the backward's
        // scratch exist only when training.
        size_t Ld = L - config.moe_blocks();
        const Recompute k = kept();
        size_t Lgelu = k >= Recompute::Gelu ? 1 : Ld, Lln = k >= Recompute::LN ? 1 : L,
               Lall = k >= Recompute::Layer ? 1 : L, Lfch = k >= Recompute::Layer ? 1 : Ld;
        const size_t grad = this->training ? 1 : 0;
        return {
            {(void**)&acts.encoded, BT * C * sizeof(floatX)},
            {(void**)&acts.ln1, Lln * BT * C * sizeof(floatX)},
            {(void**)&acts.ln1_mean, Lall * BT * sizeof(float)},
            {(void**)&acts.ln1_rstd, Lall * BT * sizeof(float)},
            {(void**)&acts.qkv, Lall * BT * 3 * C * sizeof(floatX)},
            {(void**)&acts.atty, Lall * BT * C * sizeof(floatX)},
            {(void**)&acts.att_lse, Lall * B * NH * T * sizeof(float)},
            {(void**)&acts.residual2, Lall * BT * C * sizeof(floatX)},
            {(void**)&acts.ln2, Lln * BT * C * sizeof(floatX)},
            {(void**)&acts.ln2_mean, Lall * BT * sizeof(float)},
            {(void**)&acts.ln2_rstd, Lall * BT * sizeof(float)},
            {(void**)&acts.fch, Lfch * BT * 4 * C * sizeof(floatX)},
            {(void**)&acts.fch_gelu, Lgelu * BT * 4 * C * sizeof(floatX)},
            {(void**)&acts.residual3, L * BT * C * sizeof(floatX)},
            {(void**)&acts.lnf, BT * C * sizeof(floatX)},
            {(void**)&acts.lnf_mean, BT * sizeof(float)},
            {(void**)&acts.lnf_rstd, BT * sizeof(float)},
            {(void**)&acts.logits, BT * Vp * sizeof(floatX)},
            {(void**)&acts.losses, BT * sizeof(float)},
            {(void**)&acts.dresidual, grad * BT * C * sizeof(floatX)},
            {(void**)&acts.dbtc, grad * BT * C * sizeof(floatX)},
            {(void**)&acts.dbt4c, grad * BT * 4 * C * sizeof(floatX)},
            {(void**)&acts.btc, BT * C * sizeof(floatX)},
            {(void**)&acts.scratch, grad * scratch},
            {(void**)&acts.wgrad_scratch, grad * overlap_wgrad * matmul_backward_scratch_bytes((int)BT, (int)(4 * C))},
            {(void**)&acts.inputs, BT * sizeof(int)},
            {(void**)&acts.targets, BT * sizeof(int)},
        };
    }

    // Layer l's slice of every per-layer activation (slot 0 for those kept for one layer only; the
    // dense MLP's by the block's place among the dense blocks, and none in a MoE block).
    LayerActs<floatX> layer_acts(int l) const {
        size_t BT = (size_t)B * T, btc = BT * config.channels, bht = (size_t)B * config.num_heads * T;
        const Recompute keep = kept();
        size_t d = config.dense_index(l), n = keep >= Recompute::LN ? 0 : l, k = keep >= Recompute::Layer ? 0 : l,
               kd = keep >= Recompute::Layer ? 0 : d, gd = keep >= Recompute::Gelu ? 0 : d;
        const bool dense = !config.moe_block(l);
        const Activations<floatX>& a = acts;
        return LayerActs<floatX>{l == 0 ? a.encoded : a.residual3 + (l - 1) * btc,
                                 a.ln1 + n * btc, a.ln1_mean + k * BT, a.ln1_rstd + k * BT,
                                 a.qkv + k * 3 * btc, a.atty + k * btc, a.att_lse + k * bht,
                                 a.residual2 + k * btc, a.ln2 + n * btc, a.ln2_mean + k * BT, a.ln2_rstd + k * BT,
                                 dense ? a.fch + kd * 4 * btc : nullptr, dense ? a.fch_gelu + gd * 4 * btc : nullptr,
                                 a.residual3 + l * btc};
    }

    // Dense block l's MLP tensor i (FCW, FCB, FCPROJW, FCPROJB; per_layer elements a copy), and its
    // gradient: copy l without experts; with experts, the block's place among the dense blocks (the
    // gradients whole, not in ZeRO-2's layer slices: see param_specs).
    floatX* mlp_param(int i, int l, size_t per_layer) const {
        return params.t[i] + (size_t)config.dense_index(l) * per_layer;
    }
    floatX* mlp_grad(int i, int l, size_t per_layer) const {
        return config.moe_experts ? grads.t[i] + (size_t)config.dense_index(l) * per_layer
                                  : grads.layer(i, l, per_layer);
    }

    // The block's forward pass from its first layernorm's output x.ln1 up to the MLP's GELU output
    // x.fch_gelu — or, in a MoE block, up to the MoE layer's output in acts.btc: what forward() does
    // per layer, and what the backward pass reruns for Recompute::Layer. With recomputation the GELU
    // is always the separate kernel (see gelu_fusion).
    void block_forward(int l, const LayerActs<floatX>& x) {
        int C = config.channels, NH = config.num_heads, BT = B * T;
        const float eps = 1e-5f;
        // attention block: qkv = ln1 · qkvwᵀ + qkvb; causal self-attention; projection
        linear_forward(LinQKV, l, x.qkv, x.ln1, params.layer(QKVW, l, 3 * C * C), params.layer(QKVB, l, 3 * C),
                       BT, C, 3 * C);
        attention_forward(x.atty, x.lse, x.qkv, B, T, C, NH, true, (const int*)nullptr, stream);
        linear_forward(LinAttProj, l, acts.btc, x.atty, params.layer(ATTPROJW, l, C * C), params.layer(ATTPROJB, l, C),
                       BT, C, C);
        fused_residual_layernorm_forward(x.residual2, x.ln2, x.ln2_mean, x.ln2_rstd, x.residual, acts.btc,
                                         params.layer(LN2W, l, C), params.layer(LN2B, l, C), BT, C, eps, stream);
        if (config.moe_block(l)) {  // the whole MLP: btc (B,T,C) = MoE(ln2)
            moe_layer_forward(&moe[config.moe_index(l)], acts.btc, x.ln2, moe_params(l), stream);
            return;
        }
        // MLP block, first half: GELU(ln2 · fcwᵀ + fcb)
        if (fused_gelu()) {
            linear_forward(LinFC, l, x.fch_gelu, x.fch, x.ln2, mlp_param(FCW, l, 4 * C * C),
                           mlp_param(FCB, l, 4 * C), BT, C, 4 * C);
        } else {
            linear_forward(LinFC, l, x.fch, x.ln2, mlp_param(FCW, l, 4 * C * C), mlp_param(FCB, l, 4 * C),
                           BT, C, 4 * C);
            gelu_forward(x.fch_gelu, x.fch, (size_t)BT * 4 * C, GeluKind::Tanh, stream);
        }
    }

    // The four linear layers of a block (which Fp8Linear state each uses).
    enum Linear { LinQKV, LinAttProj, LinFC, LinFCProj, NUM_LINEAR };

    // A block's linear layer forward: out = inp · Wᵀ + b (and GELU when pre_gelu is given), through
    // cuBLASLt in the storage precision, or (--precision fp8) through fp8 GEMMs with delayed scaling.
    void linear_forward(Linear which, int l, floatX* out, floatX* pre_gelu, const floatX* inp, const floatX* weight,
                        const floatX* bias, int N, int C, int OC) {
        if constexpr (std::is_same<floatX, __nv_bfloat16>::value) {
            if (fp8) {
                matmul_forward_fp8(out, pre_gelu, inp, weight, bias, N, C, OC, GeluKind::Tanh,
                                   fp8_layers[(size_t)l * NUM_LINEAR + which], fp8_scratch, stream);
                return;
            }
        }
        matmul_forward(out, pre_gelu, inp, weight, bias, N, C, OC, GeluKind::Tanh, stream);
    }
    // The same without an activation: out = inp · Wᵀ + b.
    void linear_forward(Linear which, int l, floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                        int N, int C, int OC) {
        linear_forward(which, l, out, (floatX*)nullptr, inp, weight, bias, N, C, OC);
    }
    // Its backward (see matmul_backward), fp8 as linear_forward.
    void linear_backward(Linear which, int l, floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout,
                         const floatX* inp, const floatX* weight, const floatX* pre_gelu, int N, int C, int OC) {
        if constexpr (std::is_same<floatX, __nv_bfloat16>::value) {
            if (fp8) {
                matmul_backward_fp8(dinp, dweight, dbias, fp8_scratch, dout, inp, weight, pre_gelu, N, C, OC,
                                    GeluKind::Tanh, fp8_layers[(size_t)l * NUM_LINEAR + which], stream);
                return;
            }
        }
        matmul_backward(dinp, dweight, dbias, acts.scratch, dout, inp, weight, pre_gelu, N, C, OC, GeluKind::Tanh,
                        stream);
    }
    // The same without an activation below the layer.
    void linear_backward(Linear which, int l, floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout,
                         const floatX* inp, const floatX* weight, int N, int C, int OC) {
        linear_backward(which, l, dinp, dweight, dbias, dout, inp, weight, (const floatX*)nullptr, N, C, OC);
    }
    // --overlap-wgrad's points of contact between the streams. fork: the weight stream waits for what
    // the model's stream has issued so far (the gradient a weight GEMM reads). mark: an event after what
    // the weight stream has issued so far, which join makes the model's stream wait for before it
    // overwrites what that work reads. Without the overlap all three do nothing.
    bool overlapping() const { return wgrad_stream != nullptr && !fp8; }
    cudaEvent_t wgrad_event() {
        cudaEvent_t e = wgrad_events[wgrad_next];
        wgrad_next = (wgrad_next + 1) % wgrad_events.size();
        return e;
    }
    void wgrad_fork() {
        if (overlapping()) stream_wait(wgrad_stream, stream, wgrad_event());
    }
    cudaEvent_t wgrad_mark() {
        if (!overlapping()) return nullptr;
        cudaEvent_t e = wgrad_event();
        cudaCheck(cudaEventRecord(e, wgrad_stream));
        return e;
    }
    void wgrad_join(cudaEvent_t done) {
        if (done) cudaCheck(cudaStreamWaitEvent(stream, done, 0));
    }
    // A block's linear layer backward with --overlap-wgrad: dweight and dbias on the weight stream,
    // forked once dout is final, and dinp on the model's stream at the same time. Returns the mark of
    // the weight work (nullptr without the overlap, when linear_backward does it all in order).
    cudaEvent_t block_linear_backward(Linear which, int l, floatX* dinp, floatX* dweight, floatX* dbias,
                                      const floatX* dout, const floatX* inp, const floatX* weight,
                                      const floatX* pre_gelu, int N, int C, int OC) {
        if (!overlapping()) {
            linear_backward(which, l, dinp, dweight, dbias, dout, inp, weight, pre_gelu, N, C, OC);
            return nullptr;
        }
        wgrad_fork();
        matmul_backward_weight_bias(dweight, dbias, acts.wgrad_scratch, dout, inp, N, C, OC, wgrad_stream);
        cudaEvent_t done = wgrad_mark();
        matmul_backward_input(dinp, dout, weight, pre_gelu, N, C, OC, GeluKind::Tanh, stream);
        return done;
    }

    // Before layer l's backward pass: recompute what was not kept (see Recompute).
    void recompute_layer(int l, const LayerActs<floatX>& x) {
        int C = config.channels, BT = B * T;
        const float eps = 1e-5f;
        if (recompute == Recompute::Layer) {
            layernorm_forward(x.ln1, x.ln1_mean, x.ln1_rstd, x.residual, params.layer(LN1W, l, C),
                              params.layer(LN1B, l, C), BT, C, eps, stream);
            block_forward(l, x);
            return;
        }
        if (recompute >= Recompute::LN) {
            layernorm_forward(x.ln1, x.ln1_mean, x.ln1_rstd, x.residual, params.layer(LN1W, l, C),
                              params.layer(LN1B, l, C), BT, C, eps, stream);
            layernorm_forward(x.ln2, x.ln2_mean, x.ln2_rstd, x.residual2, params.layer(LN2W, l, C),
                              params.layer(LN2B, l, C), BT, C, eps, stream);
        }
        if (recompute >= Recompute::Gelu && !config.moe_block(l))
            gelu_forward(x.fch_gelu, x.fch, (size_t)BT * 4 * C, GeluKind::Tanh, stream);
    }

    // Forward pass on the micro-batch in acts.inputs/acts.targets: leaves per-token losses in
    // acts.losses and, if with_grad, the logits' gradient (scaled by dloss) in acts.logits.
    // Returns nothing: the caller reads the losses when it needs them (one sync per step).
    // The MoE blocks' auxiliary losses are per micro-batch means as the cross-entropy is, and weigh
    // as much in the objective: dloss weighs one token's loss, so B*T times dloss weighs their unit.
    void forward(bool with_grad, float dloss) {
        moe_dloss = dloss * (float)(B * T);
        const GPT2Config& c = config;
        int L = c.num_layers, C = c.channels, V = c.vocab_size, Vp = c.padded_vocab_size;
        int BT = B * T;
        Activations<floatX>& a = acts;
        const float eps = 1e-5f;
        encoder_forward(a.encoded, a.inputs, params.t[WTE], params.t[WPE], (const int*)nullptr, (const floatX*)nullptr,
                        B, T, C, stream);
        layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.encoded, params.t[LN1W], params.t[LN1B], BT, C, eps, stream);
        for (int l = 0; l < L; l++) {
            LayerActs<floatX> x = layer_acts(l);
            block_forward(l, x);
            // MLP block, second half: · fcprojwᵀ + fcprojb (a MoE block's output is in btc already)
            if (!c.moe_block(l))
                linear_forward(LinFCProj, l, a.btc, x.fch_gelu, mlp_param(FCPROJW, l, 4 * C * C),
                               mlp_param(FCPROJB, l, C), BT, 4 * C, C);
            // The next layer's ln1 (or the final layernorm) is fused with this residual add.
            bool last = l == L - 1;
            LayerActs<floatX> next = layer_acts(last ? l : l + 1);  // its ln1 slot (not used after the last layer)
            fused_residual_layernorm_forward(x.residual3, last ? a.lnf : next.ln1, last ? a.lnf_mean : next.ln1_mean,
                                             last ? a.lnf_rstd : next.ln1_rstd, x.residual2, a.btc,
                                             last ? params.t[LNFW] : params.layer(LN1W, l + 1, C),
                                             last ? params.t[LNFB] : params.layer(LN1B, l + 1, C), BT, C, eps, stream);
        }
        // LM head tied to the token embedding: logits (B,T,Vp) = lnf · wteᵀ
        matmul_forward(a.logits, a.lnf, params.t[WTE], (const floatX*)nullptr, BT, C, Vp, stream);
        fused_classifier(a.logits, a.losses, a.targets, BT, V, Vp, dloss, -1, with_grad, stream);
    }

    // One training micro-step on the batch set_batch() uploaded: forward(true, dloss) and backward().
    // With `graphed`, replayed from a CUDA graph (ModelState::graphed_micro_step), one per value of
    // sync_grads: its kernels read the batch (ids, targets, the embedding backward's plan) from the
    // device buffers set_batch() filled, and every scalar they take is fixed for the run.
    void train_micro_step(float dloss, bool graphed) {
        if (!graphed) {
            forward(true, dloss);
            backward();
            return;
        }
        this->graphed_micro_step(this->sync_grads ? 1 : 0, dloss, [&] {
            forward(true, dloss);
            backward();
        });
    }

    // Backward pass after forward(true, ...): accumulates every parameter's gradient into grads
    // (callers zero grads_memory at the start of a step; micro-batches add up).
    // The two projections that add into the residual stream (attention's and the MLP's) have bias
    // gradients that are column sums of the stream's gradient, which the LayerNorm backward just
    // below them in the stream computes: with ln_bias_sums it sums them as it stores the gradient
    // (layernorm_backward's dinp_colsum), so the projections' backward computes no bias gradient
    // and the (B*T,C) gradient is not read again for it. The final LayerNorm's backward gives the
    // last block's MLP projection bias, ln2's its attention projection bias, and ln1's the MLP
    // projection bias of the block below.
    void backward() {
        const GPT2Config& c = config;
        int L = c.num_layers, C = c.channels, NH = c.num_heads, Vp = c.padded_vocab_size;
        int BT = B * T;
        size_t btc = (size_t)BT * C;
        Activations<floatX>& a = acts;
        // block l's MLP projection bias gradient, where a LayerNorm backward sums it (a dense block)
        auto fcproj_bias_sums = [&](int l) {
            return ln_bias_sums && !c.moe_block(l) ? mlp_grad(FCPROJB, l, C) : (floatX*)nullptr;
        };
        this->grads_begin_backward();
        cudaCheck(cudaMemsetAsync(a.dresidual, 0, btc * sizeof(floatX), stream));
        // LM head and final layernorm
        matmul_backward(a.dbtc, grads.t[WTE], (floatX*)nullptr, a.scratch, a.logits, a.lnf, params.t[WTE],
                        BT, C, Vp, stream);
        this->grads_begin_layer(L - 1);  // the final layernorm writes into the last block's gradients
        layernorm_backward(a.dresidual, grads.t[LNFW], grads.t[LNFB], a.scratch, a.dbtc, a.residual3 + (L - 1) * btc,
                           params.t[LNFW], a.lnf_mean, a.lnf_rstd, BT, C, stream, fcproj_bias_sums(L - 1));
        this->grads_final_before();  // data parallel: the final layernorm's gradients go out now
        // With --overlap-wgrad each linear layer's weight gradient runs on the weight stream beside the
        // input-gradient chain, which waits for it (wgrad_join) only before it overwrites what that GEMM
        // reads: dresidual (the LayerNorm backwards add to it), dbt4c (attention's backward writes dqkv
        // there), and at the end of the block every buffer the layer below reuses (its recomputed
        // activations, dbt4c again), before the block's gradients are handed to the communication.
        for (int l = L - 1; l >= 0; l--) {
            LayerActs<floatX> x = layer_acts(l);
            if (recompute != Recompute::None) recompute_layer(l, x);
            cudaEvent_t fcproj_done = nullptr, fc_done = nullptr;  // marks of the weight stream's work
            // MLP block: dresidual is the gradient of the block's output
            if (c.moe_block(l)) {  // dbtc = the MoE layer's input gradient; its losses' weigh moe_dloss
                moe_layer_backward(&moe[c.moe_index(l)], a.dbtc, moe_grads(l), a.dresidual, x.ln2, moe_params(l),
                                   moe_dloss, stream);
            } else {
                // GELU's backward: fused into the matmul as dGELU when the forward fused it, else the kernel
                floatX* fcproj_bias = fcproj_bias_sums(l) ? (floatX*)nullptr : mlp_grad(FCPROJB, l, C);
                fcproj_done = block_linear_backward(LinFCProj, l, a.dbt4c, mlp_grad(FCPROJW, l, 4 * C * C),
                                                    fcproj_bias, a.dresidual, x.fch_gelu,
                                                    mlp_param(FCPROJW, l, 4 * C * C),
                                                    fused_gelu() ? x.fch : (const floatX*)nullptr, BT, 4 * C, C);
                if (!fused_gelu()) gelu_backward_inplace(a.dbt4c, x.fch, (size_t)BT * 4 * C, GeluKind::Tanh, stream);
                fc_done = block_linear_backward(LinFC, l, a.dbtc, mlp_grad(FCW, l, 4 * C * C), mlp_grad(FCB, l, 4 * C),
                                                a.dbt4c, x.ln2, mlp_param(FCW, l, 4 * C * C), nullptr, BT, C, 4 * C);
            }
            floatX* attproj_bias_sums = ln_bias_sums ? grads.layer(ATTPROJB, l, C) : nullptr;
            wgrad_join(fcproj_done);  // fc proj's weight GEMM has read dresidual
            layernorm_backward(a.dresidual, grads.layer(LN2W, l, C), grads.layer(LN2B, l, C), a.scratch, a.dbtc,
                               x.residual2, params.layer(LN2W, l, C), x.ln2_mean, x.ln2_rstd, BT, C, stream,
                               attproj_bias_sums);
            // attention block
            cudaEvent_t attproj_done =
                block_linear_backward(LinAttProj, l, a.dbtc, grads.layer(ATTPROJW, l, C * C),
                                      attproj_bias_sums ? (floatX*)nullptr : grads.layer(ATTPROJB, l, C), a.dresidual,
                                      x.atty, params.layer(ATTPROJW, l, C * C), nullptr, BT, C, C);
            wgrad_join(fc_done);  // fc's weight GEMM has read dbt4c
            attention_backward(a.dbt4c, a.dbtc, x.qkv, x.atty, x.lse, a.scratch, B, T, C, NH, true, (const int*)nullptr,
                               stream);
            cudaEvent_t qkv_done =
                block_linear_backward(LinQKV, l, a.dbtc, grads.layer(QKVW, l, 3 * C * C), grads.layer(QKVB, l, 3 * C),
                                      a.dbt4c, x.ln1, params.layer(QKVW, l, 3 * C * C), nullptr, BT, C, 3 * C);
            if (l > 0) this->grads_begin_layer(l - 1);  // ln1's backward writes into block l-1's gradients
            wgrad_join(attproj_done);  // att proj's weight GEMM has read dresidual
            layernorm_backward(a.dresidual, grads.layer(LN1W, l, C), grads.layer(LN1B, l, C), a.scratch, a.dbtc,
                               x.residual, params.layer(LN1W, l, C), x.ln1_mean, x.ln1_rstd, BT, C, stream,
                               l > 0 ? fcproj_bias_sums(l - 1) : (floatX*)nullptr);
            wgrad_join(qkv_done);  // the block's weight gradients are all done
            this->grads_final_layer(l);  // ... layer l's, while the layers below compute
        }
        // the embeddings, from the plan set_batch() uploaded
        encoder_backward(grads.t[WTE], grads.t[WPE], (floatX*)nullptr, encoder_plan, a.dresidual, a.inputs,
                         (const int*)nullptr, B, T, C, stream);
        this->grads_final_after();
    }

    // Starts copying the per-token losses of the last forward pass to host (pinned, B*T floats).
    void fetch_losses(float* host) {
        cudaCheck(cudaMemcpyAsync(host, acts.losses, (size_t)B * T * sizeof(float), cudaMemcpyDeviceToHost, stream));
    }

    // Whether writing the model file takes every rank (save_checkpoint): the experts are sharded over
    // the ranks, or an fp16 model's master weights are (ZeRO-1/2).
    bool save_is_collective() const {
        return moe_par.ranks > 1 || (std::is_same<floatX, __half>::value && this->sharded());
    }

    // All parameters in the model file's layout, from `values` (device, this rank's num_parameters:
    // the parameters or the fp32 master weights), on the host. With expert parallelism each MoE
    // block's experts are gathered from every rank, so every rank must call it.
    template <class T>
    std::vector<T> host_with_all_experts(const T* values) const {
        size_t n = this->num_parameters;
        size_t full[NUM_MODEL_TENSORS];
        std::vector<T> out(model_param_sizes(config, full));
        if (moe_par.ranks == 1) {
            cudaCheck(cudaMemcpy(out.data(), values, n * sizeof(T), cudaMemcpyDeviceToHost));
            return out;
        }
        // Everything before the experts' w1 is replicated; w1 and w2 (the last tensors) are gathered
        // block by block: rank r's E_l experts of block m are experts [r*E_l, (r+1)*E_l) of it.
        size_t before = params.t[MOEW1] - params_memory, at = before, at_full = before;
        T* dev;
        cudaMallocCheck(&dev, out.size() * sizeof(T));
        cudaCheck(cudaMemcpyAsync(dev, values, before * sizeof(T), cudaMemcpyDeviceToDevice, stream));
        for (int i : {MOEW1, MOEW2}) {
            all_gather_blocks(*this->dist, values + at, dev + at_full, config.moe_blocks(),
                              sizes[i] / config.moe_blocks(), stream);
            at += sizes[i];
            at_full += full[i];
        }
        cudaCheck(cudaMemcpyAsync(out.data(), dev, out.size() * sizeof(T), cudaMemcpyDeviceToHost, stream));
        cudaCheck(cudaStreamSynchronize(stream));
        cudaCheck(cudaFree(dev));
        return out;
    }

    // Mean of the per-token losses of the last forward pass (syncs with the device).
    float mean_loss() { return this->device_mean(acts.losses, (size_t)B * T); }

    // Floats per forward pass of the MoE blocks' figures: per MoE block {aux, z} and the load f_e
    // (E: the share of the token-to-expert assignments routed to each expert).
    size_t moe_stats_size() const { return moe.size() * (2 + (size_t)config.moe_experts); }
    // Starts copying them to host (pinned, moe_stats_size() floats), as fetch_losses does.
    void fetch_moe_stats(float* host) {
        size_t E = config.moe_experts;
        for (size_t m = 0; m < moe.size(); m++) {
            float* at = host + m * (2 + E);
            cudaCheck(cudaMemcpyAsync(at, moe[m].losses, 2 * sizeof(float), cudaMemcpyDeviceToHost, stream));
            cudaCheck(cudaMemcpyAsync(at + 2, moe[m].load, E * sizeof(float), cudaMemcpyDeviceToHost, stream));
        }
    }

    // Copies a micro-batch's token ids (host, B*T each) to the device; for training, also the
    // embedding backward's plan (which groups positions by token id on the host): `plan`, built by
    // the data loader's thread from these inputs, or else built here. Through a pinned slot: the
    // caller may refill its buffers at once, and the host does not wait for the device.
    void set_batch(const int* inputs, const int* targets, bool for_training = true,
                   const EncoderPlanLists* plan = nullptr) {
        size_t BT = (size_t)B * T;
        int* slot = static_cast<int*>(batch_slots.acquire());  // inputs (B*T) | targets (B*T) | the plan
        memcpy(slot, inputs, BT * sizeof(int));
        memcpy(slot + BT, targets, BT * sizeof(int));
        cudaCheck(cudaMemcpyAsync(acts.inputs, slot, BT * sizeof(int), cudaMemcpyHostToDevice, stream));
        cudaCheck(cudaMemcpyAsync(acts.targets, slot + BT, BT * sizeof(int), cudaMemcpyHostToDevice, stream));
        if (for_training && plan) {
            if (plan->B != B || plan->T != T || plan->has_types) {
                data_error("set_batch: the embedding plan was built for B=%d, T=%d%s; the model runs B=%d, T=%d",
                           plan->B, plan->T, plan->has_types ? " with token types" : "", B, T);
            }
            encoder_backward_plan_upload(&encoder_plan, *plan, config.channels, stream, slot + 2 * BT);
        } else if (for_training) {
            encoder_backward_plan(&encoder_plan, inputs, (const int*)nullptr, B, T, config.channels,
                                  config.vocab_size, 0, stream, slot + 2 * BT);
        }
        batch_slots.release(stream);
    }
    // One pinned slot per micro-step of an optimizer step (llmc/staging.h): no host wait inside a step.
    void reserve_batch_slots(int n) {
        batch_slots.reserve(n, 2 * (size_t)B * T * sizeof(int) + encoder_plan_staging_bytes(B, T, false));
    }

    // Bytes of the fp8 GEMMs' scaling states, and of the state a checkpoint saves besides the master
    // weights (optimizer + fp8 scaling).
    size_t fp8_bytes() const { return fp8_layers.size() * fp8_linear_bytes(kFp8History); }
    size_t state_bytes() const { return opt_state_bytes + fp8_bytes(); }

    // What a checkpoint saves besides the parameters: the optimizer's state, then (fp8) the GEMMs'
    // delayed-scaling states, which a resumed run needs to scale exactly as an uninterrupted one.
    void optimizer_state_host(TrainState* s) const { State::optimizer_state_host(s, fp8_memory, fp8_bytes()); }
    // Restores what optimizer_state_host() saved (sizes checked by the caller): this rank's own
    // state, or (resharded) the shards old[r] of a run with another partition.
    void set_optimizer_state(const TrainState& s) {
        State::set_optimizer_state(s, fp8_memory, fp8_bytes());
        prime_fp8(s.step);
    }
    void set_optimizer_state_resharded(const std::vector<TrainState>& old) {
        State::set_optimizer_state_resharded(old, fp8_memory, fp8_bytes());
        prime_fp8(old[0].step);
    }
    void prime_fp8(long long step) {
        for (Fp8Linear& f : fp8_layers)  // every state was used by the steps before the checkpoint
            f.inp.primed = f.weight.primed = f.grad.primed = step > 0;
    }

    void free_all() {
        this->free_state();
        for (void* p : {fp8_memory, fp8_scratch, acts_memory})
            if (p) cudaCheck(cudaFree(p));
        for (cudaEvent_t e : wgrad_events) cudaCheck(cudaEventDestroy(e));
        wgrad_events.clear();
        if (wgrad_stream) cudaCheck(cudaStreamDestroy(wgrad_stream));
        wgrad_stream = nullptr;
        encoder_backward_plan_free(&encoder_plan);
        batch_slots.free_all();
        for (MoeLayer<floatX>& m : moe) moe_layer_free(&m);
        moe.clear();
    }
};

// ----------------------------------------------------------------------------
// Decoding with a KV cache: the model run for one new token at a time (generation)
//
// One sequence: per layer a (maxT, 3C) cache holding every position's qkv row (what attention_decode
// reads), and one row of every activation. The decoder is its own allocation beside the model's, so
// sampling between training steps neither frees nor resizes the training activations, whatever the
// recomputation setting; it reads the model's parameters as they are at each step. MoE blocks run
// the MoE layer on the one token (one layer state for all of them, N = 1): its capacity,
// ceil(f*K/E) >= 1, never drops the token's choices, whereas a training micro-batch may.

template <class floatX>
struct GPT2Decoder {
    const GPT2<floatX>& model;
    void* memory = nullptr;
    size_t bytes = 0;
    floatX* kv_cache = nullptr;   // (L, maxT, 3C)
    floatX* residual = nullptr;   // (C) the residual stream: the embedding, then each layer's output
    floatX* ln = nullptr;         // (C) the current layernorm output (ln1, ln2, lnf)
    floatX* atty = nullptr;       // (C)
    floatX* proj = nullptr;       // (C) the projections' outputs before their residual add
    floatX* residual2 = nullptr;  // (C)
    floatX* fch = nullptr;        // (4C) pre-GELU
    floatX* fch_gelu = nullptr;   // (4C)
    floatX* logits = nullptr;     // (Vp)
    int* token = nullptr;         // (1)
    MoeLayer<floatX> moe;         // the MoE blocks' state for one token (with experts)

    // Allocates the decoding state for the model's shape: one allocation, the cache last.
    explicit GPT2Decoder(const GPT2<floatX>& m) : model(m) {
        const GPT2Config& c = model.config;
        size_t L = c.num_layers, C = c.channels, maxT = c.max_seq_len, Vp = c.padded_vocab_size;
        std::vector<Region> regions = {
            {(void**)&residual, C * sizeof(floatX)},  {(void**)&ln, C * sizeof(floatX)},
            {(void**)&atty, C * sizeof(floatX)},      {(void**)&proj, C * sizeof(floatX)},
            {(void**)&residual2, C * sizeof(floatX)}, {(void**)&fch, 4 * C * sizeof(floatX)},
            {(void**)&fch_gelu, 4 * C * sizeof(floatX)}, {(void**)&logits, Vp * sizeof(floatX)},
            {(void**)&token, sizeof(int)},            {(void**)&kv_cache, L * maxT * 3 * C * sizeof(floatX)},
        };
        bytes = regions_bytes(regions);
        cudaMallocCheck(&memory, bytes);
        carve_regions(memory, regions);
        if (model.moe_par.ranks > 1)  // the options refuse sampling under --expert-parallel
            distributed_fatal("GPT2Decoder: the experts are sharded over %d ranks; decode in a single process",
                              model.moe_par.ranks);
        if (c.moe_experts > 0) moe_layer_init(&moe, moe_config(c), 1);
    }
    ~GPT2Decoder() {
        cudaCheck(cudaFree(memory));
        if (model.config.moe_experts > 0) moe_layer_free(&moe);
    }
    GPT2Decoder(const GPT2Decoder&) = delete;
    GPT2Decoder& operator=(const GPT2Decoder&) = delete;

    // Feeds `tok` at position pos, given that positions 0..pos-1 are in the cache: writes its qkv
    // rows into the cache and returns the device row of its logits (Vp) — or, without with_logits
    // (prefill of a token whose successor is already known), stops once the last layer's cache row is
    // written and returns nullptr. The ops are GPT2::forward()'s for one row, so that decoding agrees
    // with the full forward pass up to summation order (attention_decode's, and the matmuls' for N = 1).
    const floatX* step(int tok, int pos, bool with_logits = true) {
        const GPT2Config& c = model.config;
        const ParameterTensors<floatX>& params = model.params;
        cudaStream_t stream = model.stream;
        int L = c.num_layers, C = c.channels, NH = c.num_heads, maxT = c.max_seq_len, Vp = c.padded_vocab_size;
        if (tok < 0 || tok >= c.vocab_size || pos < 0 || pos >= maxT) {
            fprintf(stderr,
                    "GPT2Decoder::step: token %d must be in [0, %d) and pos %d in [0, %d) (the model's positions)\n",
                    tok, c.vocab_size, pos, maxT);
            exit(EXIT_FAILURE);
        }
        const float eps = 1e-5f;
        // from pageable memory: the copy has taken the value when the call returns
        cudaCheck(cudaMemcpyAsync(token, &tok, sizeof(int), cudaMemcpyHostToDevice, stream));
        // the embedding of one token at position pos: a (1,1) batch whose position table starts at pos
        encoder_forward(residual, token, params.t[WTE], params.t[WPE] + (size_t)pos * C, (const int*)nullptr,
                        (const floatX*)nullptr, 1, 1, C, stream);
        layernorm_forward(ln, (float*)nullptr, (float*)nullptr, residual, params.t[LN1W], params.t[LN1B], 1, C, eps,
                          stream);
        for (int l = 0; l < L; l++) {
            floatX* cache = kv_cache + (size_t)l * maxT * 3 * C;  // (maxT, 3C) of layer l
            matmul_forward(cache + (size_t)pos * 3 * C, ln, params.layer(QKVW, l, 3 * C * C),
                           params.layer(QKVB, l, 3 * C), 1, C, 3 * C, stream);
            if (l == L - 1 && !with_logits) return nullptr;  // later tokens need only the cache rows
            attention_decode(atty, (const floatX*)cache, pos, C, NH, maxT, stream);
            matmul_forward(proj, atty, params.layer(ATTPROJW, l, C * C), params.layer(ATTPROJB, l, C), 1, C, C,
                           stream);
            fused_residual_layernorm_forward(residual2, ln, (float*)nullptr, (float*)nullptr, residual, proj,
                                             params.layer(LN2W, l, C), params.layer(LN2B, l, C), 1, C, eps, stream);
            if (c.moe_block(l)) {
                moe_layer_forward(&moe, proj, ln, model.moe_params(l), stream);
            } else {
                // the GELU that block_forward applies: the same bits as the full forward pass's
                if (model.fused_gelu()) {
                    matmul_forward(fch_gelu, fch, ln, model.mlp_param(FCW, l, 4 * C * C),
                                   model.mlp_param(FCB, l, 4 * C), 1, C, 4 * C, GeluKind::Tanh, stream);
                } else {
                    matmul_forward(fch, ln, model.mlp_param(FCW, l, 4 * C * C), model.mlp_param(FCB, l, 4 * C), 1,
                                   C, 4 * C, stream);
                    gelu_forward(fch_gelu, fch, (size_t)4 * C, GeluKind::Tanh, stream);
                }
                matmul_forward(proj, fch_gelu, model.mlp_param(FCPROJW, l, 4 * C * C),
                               model.mlp_param(FCPROJB, l, C), 1, 4 * C, C, stream);
            }
            bool last = l == L - 1;
            fused_residual_layernorm_forward(residual, ln, (float*)nullptr, (float*)nullptr, residual2, proj,
                                             last ? params.t[LNFW] : params.layer(LN1W, l + 1, C),
                                             last ? params.t[LNFB] : params.layer(LN1B, l + 1, C), 1, C, eps, stream);
        }
        matmul_forward(logits, ln, params.t[WTE], (const floatX*)nullptr, 1, C, Vp, stream);
        return logits;
    }
};

// ----------------------------------------------------------------------------
// Initial weights and checkpoints: random as GPT-2 initializes; the model saved as a llm.c file
//
// The file formats themselves (llm.c model files, Hugging Face safetensors) are llmc/gpt2_io.h's; here
// are the parts that need the model.

// GPT-2 initialization: weights N(0, 0.02), the residual projections N(0, 0.02/sqrt(2L)) — the
// experts' w2 is one —, biases 0, layernorm weight 1 and bias 0; padded vocabulary rows stay 0. The
// MoE router (which does not decay) is a weight like the others: N(0, 0.02).
std::vector<float> random_init(const GPT2Config& c, uint64_t seed) {
    size_t sizes[NUM_MODEL_TENSORS];
    size_t n = model_param_sizes(c, sizes);
    std::vector<float> p(n, 0.f);
    NormalRNG rng(seed);
    size_t offset = 0;
    for (int i = 0; i < NUM_MODEL_TENSORS; i++) {
        float* t = p.data() + offset;
        if (i == LN1W || i == LN2W || i == LNFW) {
            for (size_t k = 0; k < sizes[i]; k++) t[k] = 1.f;
        } else if (param_decays(i) || i == MOEROUTER) {
            bool projection = i == ATTPROJW || i == FCPROJW || i == MOEW2;
            float std = projection ? 0.02f / std::sqrt(2.f * c.num_layers) : 0.02f;
            size_t count = i == WTE ? (size_t)c.vocab_size * c.channels : sizes[i];
            for (size_t k = 0; k < count; k++) t[k] = rng.normal(std);
        }
        offset += sizes[i];
    }
    return p;
}

// Writes the model as a llm.c checkpoint (atomically): version 3 with fp32 parameters, 5 with bf16
// (103 and 105, this trainer's extension, with experts: llmc/gpt2_io.h).
// llm.c has no fp16 version: an fp16 model is written as version 3 from its fp32 master weights
// (the fp16 parameters are those rounded, so loading it gives back the same fp16 parameters).
// Where model.save_is_collective() every rank calls it (sharded experts or fp16 master weights are
// gathered) and only `write` writes.
template <class floatX>
bool save_checkpoint(const std::string& path, const GPT2<floatX>& model, std::string* err, bool write = true) {
    if (std::is_same<floatX, __half>::value) {
        float* full = nullptr;  // ZeRO-1/2: room for the gathered master weights
        if (model.sharded()) cudaMallocCheck(&full, model.num_parameters * sizeof(float));
        std::vector<float> master = model.host_with_all_experts(model.master_of_all(full));
        if (full) cudaCheck(cudaFree(full));
        return !write || write_gpt2_checkpoint(path, model.config, master.data(), false, err);
    }
    std::vector<floatX> p = model.host_with_all_experts((const floatX*)model.params_memory);
    return !write ||
           write_gpt2_checkpoint(path, model.config, p.data(), std::is_same<floatX, __nv_bfloat16>::value, err);
}

// ----------------------------------------------------------------------------
// Training

// Why a model of V tokens cannot sample with o's tokenizer and prompt ("" when it can): the tokenizer
// does not load, or <|endoftext|> or a prompt token is outside the model's vocabulary. *tok: the
// tokenizer, loaded.
inline std::string sampling_problem(const TrainOptions& o, int V, Tokenizer* tok) {
    std::string error;
    if (!tok->load(o.tokenizer_path, &error)) return error;
    int outside = tok->eot();
    for (int t : o.prompt_tokens) outside = std::max(outside, t);
    if (outside >= V)
        return "token " + std::to_string(outside) + " (<|endoftext|> or the prompt's, from " + o.tokenizer_path +
               ") is outside the model's vocabulary of " + std::to_string(V);
    return "";
}

// Samples o.gen_tokens tokens from the model, starting from <|endoftext|> and the prompt, prints them
// decoded as they come and returns the text (and appends the sampled ids to *sampled if given).
// *rng_state is the sampling RNG's state (a checkpoint saves it, so a resumed run samples what an
// uninterrupted one would).
// Decoding with a KV cache (GPT2Decoder): the prompt is fed once, token by token (the prefill),
// then each new token runs the model for its own position only, attending to the cached keys and
// values of the earlier positions — instead of rerunning the whole window for every token. The
// training activations are not touched. When the position reaches the model's maxT, the window
// slides: its last maxT/2 tokens are kept and fed again from position 0. Positions are absolute
// (every cached key and value was computed with its position's embedding), so a cache cannot be
// shifted; re-feeding half a window every maxT/2 tokens costs about one extra step per new token.
template <class floatX>
std::string generate(GPT2<floatX>& model, const TrainOptions& o, uint64_t* rng_state,
                     std::vector<int>* sampled = nullptr) {
    const GPT2Config& c = model.config;
    int V = c.vocab_size, maxT = c.max_seq_len;
    Tokenizer tok;
    std::string problem = sampling_problem(o, V, &tok);
    if (!problem.empty()) {
        printf("sampling skipped: %s\n", problem.c_str());
        return "";
    }
    // A model whose vocabulary is larger than the tokenizer's (--vocab-size) can sample ids without text.
    const int tok_V = tok.vocab_size();
    if (V > tok_V)
        printf("(the model's vocabulary of %d is larger than %s's %d: a sampled id past it prints as <|id|>)\n", V,
               o.tokenizer_path.c_str(), tok_V);
    GPT2Decoder<floatX> decoder(model);
    // The tokens at positions 0, 1, ... of the cache: <|endoftext|> and the prompt (its last maxT-1
    // tokens if it is longer).
    std::vector<int> window = {tok.eot()};
    size_t keep = std::min(o.prompt_tokens.size(), (size_t)maxT - 1);
    window.insert(window.end(), o.prompt_tokens.end() - keep, o.prompt_tokens.end());
    size_t cache_bytes = (size_t)c.num_layers * maxT * 3 * c.channels * sizeof(floatX);
    printf("sample (%d tokens, temperature %.2f%s; KV cache: %d positions x %d layers, %.1f MiB):\n---\n",
           o.gen_tokens, o.temperature, o.top_k > 0 ? (", top-k " + std::to_string(o.top_k)).c_str() : "", maxT,
           c.num_layers, cache_bytes / 1048576.0);
    if (keep < o.prompt_tokens.size())
        printf("(the prompt's first %zu tokens do not fit the model's %d positions and are left out)\n",
               o.prompt_tokens.size() - keep, maxT);
    std::string sample;
    for (size_t i = 1; i < window.size(); i++) sample += tok.decode(window[i]);
    fwrite(sample.data(), 1, sample.size(), stdout);
    cudaEvent_t t0, t1;
    cudaCheck(cudaEventCreate(&t0));
    cudaCheck(cudaEventCreate(&t1));
    cudaCheck(cudaEventRecord(t0, model.stream));
    // prefill: every token of the window, the logits of the last one only
    const floatX* logits = nullptr;
    for (size_t p = 0; p < window.size(); p++) logits = decoder.step(window[p], (int)p, p + 1 == window.size());
    std::vector<floatX> row(c.padded_vocab_size);
    uint64_t rng = *rng_state;
    for (int i = 0; i < o.gen_tokens; i++) {
        cudaCheck(cudaMemcpyAsync(row.data(), logits, row.size() * sizeof(floatX), cudaMemcpyDeviceToHost, model.stream));
        cudaCheck(cudaStreamSynchronize(model.stream));
        int next = sample_token(row, V, o.temperature, o.top_k, &rng);
        if (next < 0)
            data_error("generation: the logits for token %d are not finite: the model holds non-finite values", i + 1);
        if (sampled) sampled->push_back(next);
        const std::string text = next == tok.eot() ? std::string("\n<|endoftext|>\n")
                                 : next < tok_V      ? tok.decode(next)
                                                     : "<|" + std::to_string(next) + "|>";
        fwrite(text.data(), 1, text.size(), stdout);
        fflush(stdout);
        sample += text;
        if (i + 1 == o.gen_tokens) break;  // no successor to sample: the last token need not be fed
        if ((int)window.size() == maxT) {  // no position left: slide (see above)
            window.erase(window.begin(), window.end() - maxT / 2);
            for (size_t p = 0; p < window.size(); p++) decoder.step(window[p], (int)p, false);
        }
        window.push_back(next);
        logits = decoder.step(next, (int)window.size() - 1);
    }
    cudaCheck(cudaEventRecord(t1, model.stream));
    cudaCheck(cudaEventSynchronize(t1));
    float ms;
    cudaCheck(cudaEventElapsedTime(&ms, t0, t1));
    cudaCheck(cudaEventDestroy(t0));
    cudaCheck(cudaEventDestroy(t1));
    printf("\n---\n%d tokens in %.2f s: %.1f tokens/s (prompt included)\n", o.gen_tokens, ms / 1000.0,
           o.gen_tokens / (ms / 1000.0));
    *rng_state = rng;
    return sample;
}

// The run's precision as saved in training states: Precision's codes, and 3 for fp8 (bf16 storage
// with fp8 GEMMs), with its name.
// The training state's precision: the storage type's (0-2), fp8 (3), or fp32 with TF32 matmuls (4),
// whose products round differently: a resumed run keeps its precision, TF32 included.
inline int precision_code(const TrainOptions& o) {
    return o.fp8 ? 3 : o.precision == Precision::FP32 && o.tf32 ? 4 : (int)o.precision;
}
inline const char* precision_code_name(int code) {
    return code == 3 ? "fp8" : code == 4 ? "tf32" : code >= 0 && code <= 2 ? precision_name((Precision)code) : "unknown";
}

// A step's MoE figures from its micro-steps' (accum, Lm, 2 + E) values (GPT2::fetch_moe_stats): the
// auxiliary losses summed over the Lm MoE blocks — the objective's terms — and the load f_e per
// block, each averaged over the micro-steps; the load as JSON, one array of E fractions per block.
struct MoeStepFigures {
    double aux = 0, z = 0;
    std::string load_json;
};
inline MoeStepFigures moe_step_figures(const float* v, int accum, int Lm, int E) {
    MoeStepFigures m;
    std::vector<double> load((size_t)Lm * E, 0.0);
    for (int a = 0; a < accum; a++)
        for (int b = 0; b < Lm; b++) {
            const float* at = v + ((size_t)a * Lm + b) * (2 + E);
            m.aux += at[0] / accum;
            m.z += at[1] / accum;
            for (int e = 0; e < E; e++) load[(size_t)b * E + e] += at[2 + e] / accum;
        }
    m.load_json = "[";
    for (int b = 0; b < Lm; b++) {
        m.load_json += b ? ",[" : "[";
        for (int e = 0; e < E; e++) m.load_json += (e ? "," : "") + json_number(load[(size_t)b * E + e], "%.4f");
        m.load_json += "]";
    }
    m.load_json += "]";
    return m;
}

// Checks that a training state can continue this run exactly; exits with the first mismatch.
template <class floatX>
void check_resumable(const TrainState& s, const TrainOptions& o, const GPT2<floatX>& model, long long tokens_per_step,
                     const std::string& path) {
    TrainState now;
    now.precision = precision_code(o);
    now.B = o.B;
    now.T = o.T;
    now.tokens_per_step = tokens_per_step;
    now.seed = o.seed;
    now.shuffle = o.shuffle;
    now.world = model.plan.world;
    now.ranks = model.world();
    now.optimizer = (int)model.opt.kind;
    now.num_params = model.update_size();
    now.has_master = model.master != nullptr;
    check_resumable(s, now, model.state_bytes(), ResumeNames{"--seq-len", "tokens per step", precision_code_name}, path);
}


// Runs the training loop for storage type floatX, from scratch or (resume != nullptr) from a
// checkpoint's training state, the model having been loaded from the same checkpoint.
// --batch-size auto: the largest micro-batch, a multiple of 8, whose activations fit in 90% of the
// device memory left after the model (the rest for cuBLASLt and fragmentation) and that divides the
// tokens per step into micro-steps; below 8, the largest power of two that fits. Exits if none does.
template <class floatX>
int auto_batch_size(GPT2<floatX>& model, int T, long long total_tokens) {
    if (total_tokens % T != 0)
        option_error("option --total-batch-size: %lld tokens per step is not a multiple of T=%d, so no micro-batch "
                     "of whole sequences divides it (--batch-size auto)", total_tokens, T);
    size_t free_b, total_b;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    size_t budget = (size_t)(0.9 * free_b);
    long long max_b = total_tokens / T;
    auto usable = [&](long long b) {
        return b >= 1 && b <= max_b && total_tokens % (b * T) == 0 && model.activation_bytes((int)b, T) <= budget;
    };
    for (long long b = max_b / 8 * 8; b >= 8; b -= 8)
        if (usable(b)) return (int)b;
    for (long long b = 4; b >= 1; b /= 2)
        if (usable(b)) return (int)b;
    data_error("--batch-size auto: not even B=1 fits (T=%d needs %.1f MiB of activations, %.1f MiB are free)", T,
               model.activation_bytes(1, T) / 1048576.0, free_b / 1048576.0);
}

template <class floatX>
int train(TrainOptions o, const GPT2Config& config, const std::vector<float>& init, const Distributed& dist,
          const TrainState* resume = nullptr, const std::string& resume_path = "",
          const HFSource& source = HFSource()) {
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, dist.device));
    matmul_init(o.tf32);
    matmul_set_autotune(o.gemm_autotune);
    matmul_bias_grad_route() = o.bias_grad;
    GPT2<floatX> model;
    model.dist = &dist;
    model.zero = o.zero;
    if (o.expert_parallel && dist.world > 1) {  // the exchange gets its own communicator (distributed.h)
        if (resume && resume->ranks != dist.world)
            data_error("%s: --expert-parallel: the checkpoint was trained on %d ranks and each rank's state file "
                       "holds its own experts' optimizer state; resume on %d ranks", resume_path.c_str(),
                       resume->ranks, resume->ranks);
        model.moe_par = MoeParallel{dist.world, dist.rank, distributed_new_comm(dist)};
    }
    // --max-steps 0: no training, so no gradients or optimizer state; the model as loaded is
    // evaluated, sampled and exported.
    const bool training = o.max_steps != 0;
    model.training = training;
    model.fp8 = o.fp8;
    model.opt = o.opt;
    model.recompute = o.recompute;
    // a graphed key runs eagerly once: its new GEMM shapes and attention shapes are timed
    model.eager_first_use = o.gemm_autotune || o.attention_backward == AttentionBackward::Tune;
    model.gelu_fusion = o.gelu_fusion;
    model.overlap_wgrad = o.overlap_wgrad;
    const std::string attention_kernel = apply_attention_backward(o, config.channels / config.num_heads, 0.f);
    model.build(config, init);
    // CUDA graphs (--cuda-graphs): the model's work moves to a stream of its own, since the legacy
    // default stream cannot capture (a blocking stream: ordered with the legacy stream as before).
    const char* no_graphs = o.cuda_graphs ? model.graphs_unsupported() : nullptr;
    const bool graphs = o.cuda_graphs && !no_graphs;
    if (graphs) cudaCheck(cudaStreamCreate(&model.stream));
    if (o.B == 0) {  // --batch-size auto
        // The smallest choice over the ranks: every rank must run the same micro-steps (each one a
        // collective under ZeRO-2), and GPUs differ in free memory. A B that fits one rank fits any
        // rank with more room, and divides the same tokens.
        o.B = -all_reduce_max_scalar(dist, -auto_batch_size(model, o.T, o.total_batch / dist.world));
        printf("batch size auto: B=%d (the largest %s that fits and divides %lld tokens per step%s)\n", o.B,
               o.B % 8 == 0 ? "multiple of 8" : "power of two below 8 (no multiple of 8 does)",
               o.total_batch / dist.world, dist.world > 1 ? " and rank" : "");
    }
    model.allocate_activations(o.B, o.T);
    const GPT2Config& c = model.config;

    // Tokens per micro-step on this rank and on all of them; --total-batch-size is the global batch,
    // whatever the number of ranks (each reads a disjoint part of every batch: llmc/dataloader.h).
    long long tokens_per_micro = (long long)o.B * o.T, global_micro = tokens_per_micro * dist.world;
    long long total = o.total_batch > 0 ? o.total_batch : global_micro;
    if (total % global_micro != 0)
        option_error("option --total-batch-size: %lld is not a multiple of B*T%s = %lld", total,
                     dist.world > 1 ? "*ranks" : "", global_micro);
    int accum = (int)(total / global_micro);
    model.reserve_batch_slots(accum);

    std::unique_ptr<DataLoader> train_loader, val_loader;
    if (training) {
        train_loader.reset(new DataLoader(o.train_pattern, o.B, o.T, dist.rank, dist.world, o.shuffle, o.seed,
                                          c.vocab_size));
        train_loader->plan_embedding_backward();  // on its prefetch thread, off this one
    }
    if (!o.val_pattern.empty())
        val_loader.reset(new DataLoader(o.val_pattern, o.B, o.T, dist.rank, dist.world, false, 0, c.vocab_size));
    // An evaluation reads at most all the validation data: more batches would read the same ones
    // again and weight them twice in the mean.
    bool validate = val_loader && o.val_every > 0;
    int val_steps = validate ? (int)std::min<size_t>(o.val_steps, val_loader->batches_per_epoch()) : 0;
    int steps = !training ? 0 : o.max_steps > 0 ? o.max_steps
                                                : (int)std::max<size_t>(1, train_loader->batches_per_epoch() / accum);
    LRScheduler sched = o.scheduler(steps);
    Recipe this_run = run_recipe(o, sched);  // saved with each checkpoint's state
    if (training) {  // what it reads: a resume onto other data says so
        this_run.add("train_data", data_fingerprint(train_loader->shard_files()));
        this_run.add("overfit_batch", o.overfit_batch ? 1 : 0);
    }
    const std::string recipe = this_run.text();

    // Where the run starts: step 0, or the checkpoint's step with its optimizer state, data
    // position and sampling RNG.
    int start_step = 0;
    uint64_t rng = o.seed * 0x9E3779B97F4A7C15ull + 1;
    // fp16: dynamic loss scaling (see GPT2::update_scaled): the scale halves on an overflow (the step
    // is skipped) and doubles after loss_scale_window clean steps.
    const bool scaling = std::is_same<floatX, __half>::value;
    LossScaler scaler(scaling, o.loss_scale, o.loss_scale_window);
    if (resume) {
        scaler.restore(*resume);
        check_resumable(*resume, o, model, total, resume_path);
        restore_optimizer_state(model, *resume, o.output_dir, resume_path);
        train_loader->seek(resume->data_position);
        start_step = (int)resume->step;
        rng = resume->rng;
        if (start_step > steps)
            data_error("%s: the checkpoint is at step %d, past the run's %d steps (raise --max-steps to go on)",
                       resume_path.c_str(), start_step, steps);
    }
    // The log: rank 0's log.jsonl (global losses), and with --log-ranks every other rank's own.
    RunLog log;
    if (!o.output_dir.empty() && (dist.rank == 0 || o.log_ranks)) {
        std::string err;
        if (!make_dirs(o.output_dir, &err)) option_error("option --output-dir: %s", err.c_str());
        std::string name = dist.rank == 0 ? "/log.jsonl" : "/log_rank" + std::to_string(dist.rank) + ".jsonl";
        if (!log.open(o.output_dir + name, resume ? start_step : -1, &err)) data_error("%s", err.c_str());
        // The model's transformers settings and tokenizer files go with its checkpoints (resumed runs
        // keep what the first run kept).
        if (dist.rank == 0 && training && !resume && !save_hf_source(o.output_dir, source, &err))
            data_error("option --output-dir: %s", err.c_str());
    }

    // All the model's parameters (with expert parallelism each rank holds the experts' share only).
    size_t all_sizes[NUM_MODEL_TENSORS], total_params = model_param_sizes(c, all_sizes);
    printf("model: L=%d C=%d NH=%d maxT=%d V=%d (padded %d), %.2fM parameters\n", c.num_layers, c.channels,
           c.num_heads, c.max_seq_len, c.vocab_size, c.padded_vocab_size, total_params / 1e6);
    // A token uses K of each MoE block's E experts: the active parameters, which MFU counts.
    size_t active_params = active_param_count(c, total_params);
    if (c.moe_experts > 0) {
        char capacity[32] = "dropless";
        if (c.moe_capacity > 0) snprintf(capacity, sizeof(capacity), "factor %g", c.moe_capacity);
        printf("MoE: %d of %d blocks (every %d, from block %d) with %d %s experts, top-%d, capacity %s, aux loss %g, "
               "z-loss %g; %.2fM parameters in total, %.2fM active per token\n", c.moe_blocks(), c.num_layers,
               c.moe_every, c.moe_every - 1, c.moe_experts, c.moe_swiglu ? "SwiGLU" : "GELU", c.moe_top_k, capacity,
               c.moe_aux, c.moe_z, total_params / 1e6, active_params / 1e6);
    }
    if (model.moe_par.ranks > 1)
        printf("expert parallel: the %d experts of each MoE block over %d ranks, %d per rank (tokens exchanged "
               "all-to-all, capacity per rank; their gradients and optimizer state stay on their rank); %.2fM "
               "parameters on each rank\n", c.moe_experts, model.moe_par.ranks,
               c.moe_experts / model.moe_par.ranks, model.num_parameters / 1e6);
    printf("precision: %s%s | device: %s%s%s%s\n", precision_name(o.precision),
           o.tf32 ? " (tf32 matmuls)" : o.fp8 ? " with fp8 GEMMs in the blocks (E4M3 forward, E5M2 gradients)" : "",
           prop.name, training ? " | attention backward: " : "", training ? attention_kernel.c_str() : "",
           model.overlapping() ? " | weight gradients: on a second stream" : "");
    print_data_parallel(dist, o.zero);
    char activations_note[64];
    snprintf(activations_note, sizeof(activations_note), "B=%d T=%d, %s%s", o.B, o.T,
             training ? "recompute " : "forward only: one layer's", training ? recompute_name(o.recompute) : "");
    print_memory_anatomy(model.mem, model.num_parameters, matmul_workspace_bytes(), o.precision, o.opt,
                         {activations_note, !training ? "parameter table, embedding-backward plan"
                                            : o.fp8 ? "optimizer table, norm scratch, embedding-backward plan, fp8 "
                                                      "scaling + scratch"
                                                    : "optimizer table, norm scratch, embedding-backward plan",
                          training});
    if (training) {
        printf("batch: B=%d T=%d, %d micro-step%s -> %lld tokens per step; %d steps; lr %s max %.2e warmup %d\n",
               o.B, o.T, accum, accum > 1 ? "s" : "", total, steps, lr_schedule_name(sched.kind), sched.max_lr,
               sched.warmup);
        if (graphs)
            printf("CUDA graphs: micro-steps replayed from graphs after the first step (the batch upload and the "
                   "optimizer step eager)\n");
        else
            printf("CUDA graphs: off (%s)\n", no_graphs ? no_graphs : "--cuda-graphs 0");
    } else {
        std::string what = validate ? ", its validation loss on " + o.val_pattern : "";
        if (o.gen_tokens > 0) what += ", a sample";
        if (!o.export_hf.empty()) what += ", the export to " + o.export_hf;
        printf("no training (--max-steps 0): the model as loaded%s\n", what.c_str());
    }
    if (validate && val_steps < o.val_steps)
        printf("validation: %d batch%s per evaluation, all that %s holds for B=%d T=%d (--val-steps %d asked for "
               "more)\n", val_steps, val_steps > 1 ? "es" : "", o.val_pattern.c_str(), o.B, o.T, o.val_steps);
    if (resume) {
        printf("resuming from %s at step %d\n", resume_path.c_str(), start_step);
        report_recipe_changes(resume->recipe, recipe);
    }
    if (log.is_open()) {
        log.write(resume ? "resume" : "run", start_step,
                  JsonFields()
                      .text("label", o.label)
                      .integer("params", total_params)
                      .integer("rank_params", model.num_parameters)
                      .integer("expert_ranks", model.moe_par.ranks)
                      .append(c.moe_experts > 0 ? JsonFields().integer("active_params", active_params) : JsonFields())
                      .integer("rank", dist.rank)
                      .integer("ranks", dist.world)
                      .integer("zero", o.zero)
                      .raw("memory", memory_json(model.mem))
                      .text("precision", std::string(precision_name(o.precision)) +
                                             (o.tf32 ? "+tf32" : o.fp8 ? "+fp8" : ""))
                      .integer("B", o.B)
                      .integer("T", o.T)
                      .integer("tokens_per_step", total)
                      .integer("steps", steps)
                      .text("device", prop.name));
        printf("log: %s/log.jsonl\n", o.output_dir.c_str());
    }

    // Writes checkpoint `done` (steps completed): model, training state, then the DONE marker.
    auto save = [&](int done) {
        std::string err, model_path = checkpoint_file(o.output_dir, "model", done);
        TrainState st;
        st.precision = precision_code(o);
        st.shuffle = o.shuffle;
        st.B = o.B;
        st.T = o.T;
        st.step = done;
        st.tokens_per_step = total;
        st.seed = o.seed;
        st.data_position = train_loader->position();
        st.rng = rng;
        st.recipe = recipe;
        scaler.save(&st);
        model.optimizer_state_host(&st);  // sets world/rank: the shard's, or 1/0 when every rank holds all
        // Rank 0 writes the model and, when the state is replicated, the state; with sharded state
        // every rank writes its shard. DONE comes last, after every rank has written.
        bool ok = true;
        if (dist.rank == 0 || model.save_is_collective()) ok = save_checkpoint(model_path, model, &err, dist.rank == 0);
        if (ok && (dist.rank == 0 || st.world > 1))
            ok = write_train_state(state_file(o.output_dir, done, st.rank), st, &err);
        if (!ok) {
            remove_failed_checkpoint(o.output_dir, done, dist.rank, st.world);
            data_error("checkpoint at step %d: %s", done, err.c_str());
        }
        all_reduce_max_scalar(dist, 0);  // a barrier: every rank's files are on disk
        if (dist.rank == 0) {
            if (!write_file_atomic(checkpoint_file(o.output_dir, "DONE", done), {}, &err)) {
                remove_failed_checkpoint(o.output_dir, done, dist.rank, st.world);
                data_error("checkpoint at step %d: %s", done, err.c_str());
            }
            prune_checkpoints(o.output_dir, o.keep_checkpoints, std::max(st.world, 1));
        }
        printf("checkpoint: %s (+ %s, DONE)\n", model_path.c_str(),
               st.world > 1 ? (std::to_string(st.world) + " state shards").c_str() : "state");
        log.write("checkpoint", done, JsonFields().text("path", model_path));
    };

    double flops_per_token = 6.0 * active_params + 6.0 * c.num_layers * c.channels * o.T;
    float* step_losses;  // (accum, B*T) pinned: every micro-step's losses, summed after the step
    cudaCheck(cudaMallocHost(&step_losses, (size_t)accum * tokens_per_micro * sizeof(float)));
    // (accum, moe_stats_size()) pinned: every micro-step's MoE figures, averaged after the step
    float* step_moe = nullptr;
    if (c.moe_experts > 0) cudaCheck(cudaMallocHost(&step_moe, (size_t)accum * model.moe_stats_size() * sizeof(float)));
    // Mean validation loss over val_steps batches from the start of the validation data.
    auto evaluate = [&](int step) {
        val_loader->reset();
        double sum = 0;
        for (int k = 0; k < val_steps; k++) {
            model.set_batch(val_loader->inputs(), val_loader->targets(), false);
            model.forward(false, 0.f);
            sum += model.mean_loss();
            val_loader->next_batch();
        }
        double val = all_reduce_mean_scalar(dist, sum / val_steps);  // every rank read its own windows
        printf("step %d | val loss %.6f\n", step, val);
        fflush(stdout);
        log.write("val", step, JsonFields().number("loss", val));
        stop_on_nonfinite_val_loss(step, val);
    };
    int end_step = o.stop_after > 0 ? std::min(steps, start_step + o.stop_after) : steps;
    check_profile_step(o.profile_step, end_step - start_step);
    StepReporter reporter(model.stream, steps, end_step, peak_tflops(prop.name, o.precision, o.tf32),
                          {"tok/s", "%.0f", "tokens_per_s", "%.1f"}, &log);
    // The run's first step is eager (it allocates, plans the GEMMs, primes fp8), the second captures
    // the graphs, the third only replays them.
    if (graphs) reporter.report_launches_at(start_step + 3, " with CUDA graphs (the run's step 3)");
    reporter.profile_at(o.profile_step);
    StopOnSignal stop(dist);  // Ctrl-C, SIGTERM, SIGUSR1: stop after the step, with a checkpoint
    int stopped_by = 0, stopped_after = 0;
    for (int step = start_step; step < end_step; step++) {
        if (validate && step % o.val_every == 0) evaluate(step);
        reporter.begin();
        model.zero_grads();
        for (int micro = 0; micro < accum; micro++) {
            model.sync_grads = micro == accum - 1;  // gradients are communicated on the last micro-step only
            model.set_batch(train_loader->inputs(), train_loader->targets(), true, train_loader->encoder_plan());
            model.train_micro_step(scaler.scale / (float)(tokens_per_micro * accum), graphs && step > start_step);
            model.fetch_losses(step_losses + (size_t)micro * tokens_per_micro);
            if (step_moe) model.fetch_moe_stats(step_moe + (size_t)micro * model.moe_stats_size());
            if (!o.overfit_batch) train_loader->next_batch();  // set_batch took its own copy
        }
        StepFigures f;
        f.done = step + 1;
        f.lr = sched.lr(step);
        f.scaling = scaling;
        f.scale = scaler.scale;
        if (scaling) {  // the optimizer counts applied updates only (its bias correction), as torch's does
            f.applied = model.update_scaled(f.lr, o.grad_clip, scaler.update_number(step), scaler.scale);
            scaler.after_update(f.applied);
        } else {
            model.update(f.lr, o.grad_clip, step + 1);
        }
        reporter.end();
        double local_loss = 0;
        for (size_t i = 0; i < (size_t)accum * tokens_per_micro; i++) local_loss += step_losses[i];
        local_loss /= (double)accum * tokens_per_micro;
        f.loss = all_reduce_mean_scalar(dist, local_loss);
        f.norm = model.last_grad_norm();
        f.units = (double)total;
        f.flops = flops_per_token * total / dist.world;
        JsonFields extra;
        extra.integer("tokens", (long long)f.done * total);
        if (dist.rank > 0) extra.number("rank_loss", local_loss);
        if (step_moe) {  // aux and z summed over the MoE blocks, all ranks; the load this rank's
            MoeStepFigures m = moe_step_figures(step_moe, accum, (int)model.moe.size(), c.moe_experts);
            m.aux = all_reduce_mean_scalar(dist, m.aux);
            m.z = all_reduce_mean_scalar(dist, m.z);
            char note[64];
            snprintf(note, sizeof(note), " | aux %.6f | z %.6f", m.aux, m.z);
            f.note = note;
            extra.number("aux_loss", m.aux).number("z_loss", m.z).raw("expert_load", m.load_json);
        }
        reporter.report(f, extra);
        stop_on_nonfinite_loss(f.done, f.loss);
        int done = f.done;
        bool last = done == end_step;
        bool due = last || (o.checkpoint_every > 0 && done % o.checkpoint_every == 0);
        if (!o.output_dir.empty() && due) save(done);
        if (o.sample_every > 0 && done % o.sample_every == 0 && done < steps && o.gen_tokens > 0 && dist.rank == 0)
            log.write("sample", done, JsonFields().text("text", generate(model, o, &rng)));
        // After the sample: a signal during it stops the run here, not a step later.
        if (int stop_sig = stop.requested(dist)) {
            if (!o.output_dir.empty() && !due) save(done);
            stopped_by = stop_sig;
            stopped_after = done;
            break;
        }
    }
    // What follows the steps (the final validation, samples, export) ends at once on a signal: the last
    // step's checkpoint is written, and --resume does the rest again.
    stop.uninstall();
    int status = 0;
    if (stopped_by) {
        status = report_stop_on_signal(stopped_by, stopped_after, steps, o.output_dir);
    } else if (end_step < steps) {
        printf("stopped after step %d of %d (--stop-after %d)%s\n", end_step, steps, o.stop_after,
               o.output_dir.empty() ? "" : "; continue with --resume");
    } else {
        if (validate) evaluate(steps);
        if (o.gen_tokens > 0 && dist.rank == 0)
            log.write("sample", steps, JsonFields().text("text", generate(model, o, &rng)));
        if (!o.export_hf.empty() && dist.rank == 0) {  // the parameters as trained: fp32, or bf16 written as BF16
            std::vector<floatX> p = model.params_host();
            std::vector<float> p32(p.size());
            for (size_t i = 0; i < p.size(); i++) p32[i] = to_float(p[i]);
            std::vector<std::string> copied = export_hf_gpt2(o.export_hf, c, p32, !std::is_same<floatX, float>::value,
                                                             source);
            report_hf_export(o.export_hf, "", source, copied);
        }
    }
    cudaCheck(cudaFreeHost(step_losses));
    if (step_moe) cudaCheck(cudaFreeHost(step_moe));
    model.free_all();
    distributed_comm_destroy(model.moe_par.comm);
    if (graphs) cudaCheck(cudaStreamDestroy(model.stream));
    matmul_destroy();
    return status;
}

// ----------------------------------------------------------------------------
// main: the program (tests that include this file with -DTESTING run it as train_gpt2_main)

int train_gpt2_main(int argc, char** argv) {
    Cli cli("train_gpt2", "Trains GPT-2 on llm.c token shards, on a GPU or on the CPU backend (make builds for "
                          "it where it finds no GPU). Data parallel on N GPUs: mpirun -np N ./train_gpt2 ... "
                          "(scripts/run_multi_gpu.sh).");
    TrainOptions o;
    add_gpt2_options(cli, &o);
    cli.help_if_asked(argc, argv);
    // One process per GPU under mpirun/srun (data parallel), else a single process without MPI.
    Distributed dist = distributed_init(&argc, &argv);
    route_run_output(dist);
    cli.parse(argc, argv);
    use_all_cpu_cores(dist.local_world);
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, dist.device));
    resolve_gpt2_options(cli, &o, dist, prop);
    std::string prec = cli.str("precision");

    // The model: from the newest complete checkpoint when resuming, else --init.
    GPT2Config config;
    std::vector<float> init;
    ResumePoint from = find_resume_point(o.resume, o.output_dir);
    check_resume_trainer(from, "train_gpt2");
    std::string spec = cli.str("init");
    bool tiny = spec == "tiny";
    std::string from_file;  // the checkpoint the model comes from ("" for a random init)
    bool llmc_file = true;
    if (spec.size() >= 2 && spec[0] == 'd' && spec.find_first_not_of("0123456789", 1) == std::string::npos &&
        !config_from_depth(spec, &config))
        cli.fail("option --init: %s is not a depth from d1 to d128", spec.c_str());
    if (from.found()) {
        init = load_checkpoint(from.model_path, &config, from.state.version >= 2);
        from_file = from.model_path;
    } else if (tiny || config_from_depth(spec, &config)) {
        if (tiny) {
            config_from_depth("d4", &config);
            config.channels = 128;
            config.num_heads = 4;
        }
        if (cli.given("layers")) config.num_layers = (int)cli.integer("layers", 1, 1024);
        if (cli.given("channels")) config.channels = (int)cli.integer("channels", 1, 1 << 16);
        if (cli.given("heads")) config.num_heads = (int)cli.integer("heads", 1, 1024);
        config.max_seq_len = tiny && !cli.given("max-seq-len") ? 128 : (int)cli.integer("max-seq-len", 1, 1 << 20);
        config.vocab_size = (int)cli.integer("vocab-size", 1, 1 << 24);
        config.padded_vocab_size = pad_vocab(config.vocab_size);
        if (config.channels % config.num_heads != 0) {
            if (cli.given("heads"))
                cli.fail("option --heads: %d does not divide channels %d", config.num_heads, config.channels);
            cli.fail("option --channels: %d is not a multiple of the %d heads of %s (give --heads)", config.channels,
                     config.num_heads, spec.c_str());
        }
        int hs = config.channels / config.num_heads;
        if (!attention_head_size_supported(hs))
            cli.fail("option --%s: head size C/NH = %d/%d = %d; the attention kernels take 16, 32, 64 or 128",
                     cli.given("heads") ? "heads" : "channels", config.channels, config.num_heads, hs);
        resolve_moe_options(cli, o, &config, "", false);
        init = random_init(config, o.seed);
    } else {
        // A Hugging Face checkpoint: its directory, its weights, or a sharded save's index.
        auto ends_with = [&](const std::string& tail) {
            return spec.size() > tail.size() && spec.compare(spec.size() - tail.size(), tail.size(), tail) == 0;
        };
        struct stat info;
        bool hf = (stat(spec.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) || ends_with(".safetensors") ||
                  ends_with(".safetensors.index.json");
        init = hf ? load_hf_gpt2(spec, &config) : load_checkpoint(spec, &config);
        from_file = spec;
        llmc_file = !hf;
    }
    if (!from_file.empty()) {
        resolve_moe_options(cli, o, &config, from_file, llmc_file);
        // The shape options make a random init; a model from a file has its shape. Given anyway (one
        // command line for a job restarted with -y), they must describe that shape.
        const struct { const char* name; int value; } shape[] = {
            {"layers", config.num_layers}, {"channels", config.channels}, {"heads", config.num_heads},
            {"max-seq-len", config.max_seq_len}, {"vocab-size", config.vocab_size}};
        for (const auto& k : shape)
            if (cli.given(k.name) && cli.integer(k.name, 1, 1 << 24) != k.value)
                cli.fail("option --%s: %lld, but the model from %s has %d (the shape options set a random init's)",
                         k.name, cli.integer(k.name, 1, 1 << 24), from_file.c_str(), k.value);
        int hs = config.num_heads > 0 ? config.channels / config.num_heads : 0;
        if (!attention_head_size_supported(hs))
            data_error("%s: head size C/NH = %d/%d = %d; the attention kernels take 16, 32, 64 or 128",
                       from_file.c_str(), config.channels, config.num_heads, hs);
    }
    resolve_expert_parallel(cli, o, config, dist.world);
    if (cli.given("gen-tokens") && o.gen_tokens > 0) {  // asked for: a sample that cannot be drawn is an error now
        Tokenizer tok;
        std::string problem = sampling_problem(o, config.vocab_size, &tok);
        if (!problem.empty()) cli.fail("option --gen-tokens: %s", problem.c_str());
    }
    if (o.T > config.max_seq_len && !cli.given("seq-len")) o.T = config.max_seq_len;  // auto: what the model takes
    if (o.T > config.max_seq_len)
        cli.fail("option --seq-len: %d is longer than the model's %d positions", o.T, config.max_seq_len);
    if (!cli.given("label"))
        o.label = "L" + std::to_string(config.num_layers) + " C" + std::to_string(config.channels) + " " + prec +
                  (o.tf32 && prec == "fp32" ? "+tf32" : "");
    // --batch-size auto resumes with the checkpoint's batch (the same global batch on other ranks).
    // What a model from transformers brings besides its weights, which the export and the run's
    // checkpoints carry on (llmc/hf_source.h).
    HFSource source = from.found()       ? find_hf_source(from.model_path, false)
                      : from_file.empty() ? HFSource()
                                          : find_hf_source(from_file, !llmc_file);
    const TrainState* resume = from.state_or_null();
    if (o.B == 0 && resume) o.B = resume->ranks == dist.world ? resume->B : resume->B * resume->ranks / dist.world;
    int rc;
    switch (o.precision) {
        case Precision::BF16: rc = train<__nv_bfloat16>(o, config, init, dist, resume, from.state_path, source); break;
        case Precision::FP16: rc = train<__half>(o, config, init, dist, resume, from.state_path, source); break;
        default: rc = train<float>(o, config, init, dist, resume, from.state_path, source); break;
    }
    distributed_finalize(dist);
    return rc;
}

#ifndef TESTING
int main(int argc, char** argv) { return train_gpt2_main(argc, argv); }
#endif  // TESTING
