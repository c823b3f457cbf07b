// llmc/gpt2_options.h — train_gpt2's command line: the shared options (llmc/run_options.h) with
// GPT-2's defaults, GPT-2's own options (sequence length, validation, sampling), and the defaults
// that depend on the machine. The options that choose the model (--init and the random model's
// shape) are declared here and read by the trainer, which knows the model families.
#pragma once
#include <string>
#include <vector>

#include "cli.h"
#include "cuda_common.h"
#include "distributed.h"
#include "fp8.cuh"
#include "gpt2_config.h"
#include "run_options.h"
#include "tokenizer.h"

// The options of a GPT-2 run: the shared ones (llmc/run_options.h) and GPT-2's own.
struct TrainOptions : RunOptions {
    int T = 1024;                    // sequence length
    int val_every = 20, val_steps = 20;
    bool shuffle = false, overfit_batch = false;
    int gen_tokens = 64, sample_every = 0;
    float temperature = 1.f;
    int top_k = 0;
    std::string tokenizer_path;
    std::string prompt;              // text that samples continue (after <|endoftext|>)
    std::vector<int> prompt_tokens;  // its GPT-2 tokens (resolve_gpt2_options encodes it)
    bool gelu_fusion = true;
    bool cuda_graphs = true;         // replay the micro-step from a CUDA graph (GPT2::train_micro_step)
    bool overlap_wgrad = false;      // the blocks' weight gradients on a second stream (GPT2::backward)
    bool tf32_flag = false;          // llm.c's -f 1: --precision tf32 by another name
    // Mixture of Experts (--moe-*): the model's settings as the command line gives them; the model's
    // own are GPT2Config's (resolve_moe_options).
    int moe_experts = 0, moe_top_k = 2, moe_every = 2, moe_swiglu = 0;
    float moe_capacity = 1.25f, moe_aux = 0.01f, moe_z = 0.001f;
    bool expert_parallel = false;    // --expert-parallel: the experts sharded over the ranks
};

// Declares train_gpt2's options, bound to *o (which must outlive cli.parse()).
inline void add_gpt2_options(Cli& cli, TrainOptions* o) {
    // The model: a checkpoint, or a random GPT-2 (what these mean depends on --init: the trainer reads them).
    cli.add("init", "e", "FILE|DIR|dN", "auto",
            "start from a llm.c checkpoint (.bin), a Hugging Face GPT-2 (.safetensors, a sharded save's "
            ".safetensors.index.json, or their directory, with config.json), or dN: a random GPT-2 of depth N "
            "(auto: d12 on a GPU, tiny on the CPU backend: 4 layers, 128 channels, 4 heads, 128 positions)");
    cli.add("layers", nullptr, "INT", "", "random init: number of layers (overrides --init's depth)");
    cli.add("channels", nullptr, "INT", "", "random init: channels C");
    cli.add("heads", nullptr, "INT", "", "random init: attention heads (C must divide by it; head size C/heads 16, "
            "32, 64 or 128)");
    cli.add("max-seq-len", nullptr, "INT", "1024", "random init: positions maxT (the tiny CPU model: 128)");
    cli.add("vocab-size", nullptr, "INT", "50257", "random init: vocabulary size V (padded to a multiple of 128)");
    RunOptionTexts t;
    t.train_data = "dev/data/shakespeare/shakespeare_train.bin";
    t.train_data_help = "training token shards";
    t.val_data = "dev/data/shakespeare/shakespeare_val.bin";
    t.val_data_help = "validation token shards ('' for none)";
    t.batch_size = "4";
    t.batch_help = "micro-batch size B; auto: the largest multiple of 8 that fits in device memory (needs "
                   "--total-batch-size; gradient accumulation makes up the rest)";
    t.batch_auto = true;
    t.batch_unit = "TOKENS";
    t.total_batch_help = "tokens per optimizer step (gradient accumulation); -1: B*T";
    t.lr_help = "peak learning rate (auto: 3e-4 on a GPU, 1e-3 on the CPU backend, whatever the model)";
    t.warmup = "0";
    t.max_steps = "auto";
    t.max_steps_help = "optimizer steps; -1: one epoch of the training data; 0: no training, the model as loaded is "
                       "evaluated, sampled and exported (auto: -1 on a GPU, 150 on the CPU backend)";
    t.precision = "auto";
    t.precision_help = "auto: bf16 on a GPU of compute capability 8.0+, else fp32 | fp32 | tf32 | bf16 | fp16 (with "
                       "dynamic loss scaling) | fp8 (bf16 with the blocks' matmuls in fp8, delayed scaling; compute "
                       "capability 8.9+)";
    t.beta2 = "0.95";
    t.weight_decay = "0.0";
    t.recompute_help = "recompute in the backward pass instead of storing: none | gelu | ln (gelu + layernorms) | "
                       "layer (whole blocks); 0-3 also work (llm.c's -r 0/1/2, and 3 for layer)";
    t.seed_help = "seed for initialization, shuffling and sampling";
    add_run_options(cli, o, t);
    // GPT-2's own
    cli.add("seq-len", "t", "INT", "auto", "sequence length T (auto: 1024 on a GPU, 128 on the CPU backend, at most "
            "the model's positions)", &o->T, 1, 1 << 20);
    cli.add("final-lr-frac", "q", "FLOAT", "1.0", "final learning rate as a fraction of the peak", &o->final_lr_frac, 0,
            1);
    cli.add("val-every", "v", "STEPS", "auto", "evaluate the validation loss every this many steps, 0: never (auto: "
            "20 on a GPU, 25 on the CPU backend)", &o->val_every, 0, 1 << 30);
    cli.add("val-steps", "m", "INT", "auto", "validation batches per evaluation, at most all the validation data "
            "holds (auto: 20 on a GPU, 10 on the CPU backend)", &o->val_steps, 1, 1 << 30);
    cli.add("tf32", "f", "0", "with fp32: TF32 tensor-core matmuls (llm.c's -f; same as --precision tf32)",
            &o->tf32_flag);
    cli.add("gelu-fusion", "ge", "1", "GELU as cuBLASLt's matmul epilogue (1) or a separate kernel (0; always 0 with "
            "--recompute)", &o->gelu_fusion);
    cli.add("cuda-graphs", nullptr, "1", "replay each micro-step's forward and backward passes from a CUDA graph "
            "captured once (1) or launch every kernel from the host (0); the batch upload and the optimizer step stay "
            "eager, and --zero 2 always runs eagerly", &o->cuda_graphs);
    cli.add("overlap-wgrad", nullptr, "0", "compute each block's weight and bias gradients on a second stream, "
            "while the first computes the input gradients below them (1), or all on one stream (0); the same "
            "results; not with --precision fp8", &o->overlap_wgrad);
    cli.add("gen-tokens", "g", "INT", "auto", "tokens to sample after training, 0: none (auto: 256 on a GPU, 64 on "
            "the CPU backend)", &o->gen_tokens, 0, 1 << 20);
    cli.add("sample-every", "s", "STEPS", "0", "also sample every this many steps during training (0: only at the end)",
            &o->sample_every, 0, 1 << 30);
    cli.add("prompt", nullptr, "TEXT", "", "text the samples continue (encoded with --tokenizer)", &o->prompt);
    cli.add("temperature", nullptr, "FLOAT", "1.0", "sampling temperature", &o->temperature, 1e-3, 100);
    cli.add("top-k", nullptr, "INT", "0", "sample among the k most likely tokens only (0: all)", &o->top_k, 0, 1 << 24);
    cli.add("tokenizer", nullptr, "FILE", "dev/data/shakespeare/gpt2_tokenizer.bin",
            "llm.c GPT-2 tokenizer file, to print samples", &o->tokenizer_path);
    // Mixture of Experts (llmc/moe_layer.cuh, doc/gpt2.md)
    cli.add("moe-experts", nullptr, "E", "0", "Mixture of Experts: E experts in the sparse blocks' MLPs (0: every "
            "block dense, GPT-2)", &o->moe_experts, 0, GPT2_MOE_MAX_EXPERTS);
    cli.add("moe-top-k", nullptr, "K", "2", "experts per token (K <= E; weights renormalized to sum 1 when K > 1)",
            &o->moe_top_k, 1, GPT2_MOE_MAX_K);
    cli.add("moe-every", nullptr, "N", "2", "every Nth block is sparse: blocks N-1, 2N-1, ... counting from 0 (1: "
            "all)", &o->moe_every, 1, 1024);
    cli.add("moe-capacity", nullptr, "FLOAT", "1.25", "capacity factor f: an expert keeps its first ceil(f*N*K/E) "
            "of the N*K token assignments of a micro-batch (N = B*T), drops the rest (0: dropless)",
            &o->moe_capacity, 0, 64);
    cli.add("moe-aux-loss", nullptr, "FLOAT", "0.01", "load-balancing loss coefficient alpha (Switch Transformers)",
            &o->moe_aux, 0, 1e3);
    cli.add("moe-z-loss", nullptr, "FLOAT", "0.001", "router z-loss coefficient beta (ST-MoE)", &o->moe_z, 0, 1e3);
    cli.add_choice("moe-expert", nullptr, "KIND", "gelu", "expert MLP: gelu (GPT-2's, H = 4C) | swiglu (Mixtral's, "
                   "H = 4C)", &o->moe_swiglu, {{"gelu", 0}, {"swiglu", 1}});
    cli.add_flag("expert-parallel", nullptr, "under mpirun -np P: shard each MoE block's experts over the P ranks "
                 "(E/P each; tokens exchanged by all-to-all, capacity counted per rank); needs E divisible by P and, "
                 "with P > 1, --zero 0 or 1 and --gen-tokens 0", &o->expert_parallel);
    cli.add_flag("shuffle", nullptr, "shuffle the order of batches and shards every epoch (seeded)", &o->shuffle);
    cli.add_flag("overfit-batch", "a", "train on the first batch only (debugging)", &o->overfit_batch);
}

// After cli.parse(): the machine-dependent defaults (device `prop`), then the checks that involve
// several options; each failure is one error naming the option.
inline void resolve_gpt2_options(Cli& cli, TrainOptions* o, const Distributed& dist, const cudaDeviceProp& prop) {
    // Machine-dependent defaults: a GPU trains GPT-2 124M; the CPU backend a model small enough
    // that the first run finishes in a few minutes.
    bool cpu = on_cpu_backend();
    cli.resolve_auto("init", cpu ? "tiny" : "d12");
    cli.resolve_auto("seq-len", cpu ? "128" : "1024");
    cli.resolve_auto("lr", cpu ? "1e-3" : "3e-4");
    cli.resolve_auto("max-steps", cpu ? "150" : "-1");
    cli.resolve_auto("val-every", cpu ? "25" : "20");
    cli.resolve_auto("val-steps", cpu ? "10" : "20");
    cli.resolve_auto("gen-tokens", cpu ? "64" : "256");
    // bf16 where the GPU has bf16 tensor cores, as llm.c; fp32 on the CPU backend, which has no bf16
    // arithmetic (slower there) and where fp32 is the exact reference.
    cli.resolve_auto("precision", !cpu && prop.major >= 8 ? "bf16" : "fp32");
    // The bundled defaults, found from any working directory.
    if (!cli.given("train-data")) o->train_pattern = bundled_path(o->train_pattern);
    if (!cli.given("val-data")) o->val_pattern = bundled_path(o->val_pattern);
    if (!cli.given("tokenizer")) o->tokenizer_path = bundled_path(o->tokenizer_path);
    check_run_options(cli, o, dist);
    if (o->max_steps == 0) {
        check_no_training_options(cli, *o, o->gen_tokens > 0 || (!o->val_pattern.empty() && o->val_every > 0),
                                  "a validation loss (-j, with -v above 0), a sample (-g) or --export-hf");
        if (cli.given("sample-every")) cli.fail("option --sample-every: --max-steps 0 has no steps to sample between");
    }
    if (o->val_pattern.empty()) {  // no validation data: asking for evaluations would change nothing
        if (cli.given("val-every") && o->val_every > 0)
            cli.fail("option --val-every: there is no validation data (-j '')");
        if (cli.given("val-steps")) cli.fail("option --val-steps: there is no validation data (-j '')");
    }
    if (o->gen_tokens == 0)  // the sampling options would change nothing
        for (const char* name : {"prompt", "temperature", "top-k", "sample-every", "tokenizer"})
            if (cli.given(name)) cli.fail("option --%s: no samples are drawn (--gen-tokens 0)", name);
    if (o->B == 0 && o->total_batch <= 0)
        cli.fail("option --batch-size: auto needs --total-batch-size (the tokens per step to keep)");
    if (!o->prompt.empty()) {  // encoded now, so a bad tokenizer stops the run before training, not after
        Tokenizer tok;
        std::string err;
        if (!tok.load(o->tokenizer_path, &err))
            data_error("option --prompt: cannot load the tokenizer: %s", err.c_str());
        if (!tok.can_encode())
            data_error("option --prompt: %s cannot encode text (not a byte-level BPE)", o->tokenizer_path.c_str());
        o->prompt_tokens = tok.encode(o->prompt);
    } else if (o->gen_tokens > 0 && cli.given("tokenizer")) {
        // Samples come after training: a tokenizer named on the command line that cannot be read
        // stops the run now. (The default is the bundled file, missing only when the program runs
        // from another directory: then the run trains, and says at the end that it skipped them.)
        Tokenizer tok;
        std::string err;
        if (!tok.load(o->tokenizer_path, &err)) data_error("option --tokenizer: %s", err.c_str());
    }
    std::string why;
    if (o->fp8 && !fp8_supported(0, &why)) cli.fail("option --precision: %s", why.c_str());
    if (o->fp8 && o->max_steps == 0)
        cli.fail("option --precision: fp8's delayed scaling takes its scales from earlier steps, which a run of 0 "
                 "steps does not have (evaluate in bf16)");
    if (o->tf32_flag) {
        if (o->precision != Precision::FP32) cli.fail("option --tf32: applies to --precision fp32 only");
        o->tf32 = true;
    }
    if (o->overlap_wgrad) {
        if (o->fp8) cli.fail("option --overlap-wgrad: fp8's weight gradients share their operands' casts with the "
                             "input gradients; it runs with --precision fp32, tf32, bf16 or fp16");
        if (o->max_steps == 0) cli.fail("option --overlap-wgrad: --max-steps 0 trains nothing, so it runs no backward");
    }
}

// After the model's config is known (a random init's, or a checkpoint's: `from_file` names the file,
// "" for random init): puts the --moe-* settings into *c and refuses what the model cannot do. A
// checkpoint fixes the model's shape (E, K, every, experts): options that disagree are refused, the
// coefficients (capacity, alpha, beta) are the file's unless given.
inline void resolve_moe_options(const Cli& cli, const TrainOptions& o, GPT2Config* c, const std::string& from_file,
                                bool llmc_file) {
    if (from_file.empty()) {
        c->moe_experts = o.moe_experts;
        c->moe_top_k = o.moe_top_k;
        c->moe_every = o.moe_every;
        c->moe_swiglu = o.moe_swiglu;
    } else if (c->moe_experts == 0) {
        if (o.moe_experts > 0)
            cli.fail("option --moe-experts: %s is a %s without experts; a Mixture-of-Experts model starts from a "
                     "random init (--init dN) or from a checkpoint of this trainer with experts", from_file.c_str(),
                     llmc_file ? "llm.c checkpoint" : "Hugging Face GPT-2");
    } else {
        const struct { const char* name; int given, file; } shape[] = {
            {"moe-experts", o.moe_experts, c->moe_experts}, {"moe-top-k", o.moe_top_k, c->moe_top_k},
            {"moe-every", o.moe_every, c->moe_every}, {"moe-expert", o.moe_swiglu, c->moe_swiglu}};
        for (const auto& s : shape)
            if (cli.given(s.name) && s.given != s.file)
                cli.fail("option --%s: %s has %d (the model's shape comes from its checkpoint)", s.name,
                         from_file.c_str(), s.file);
    }
    if (c->moe_experts == 0) {  // a dense model: the other --moe-* options would change nothing
        for (const char* name : {"moe-top-k", "moe-every", "moe-capacity", "moe-aux-loss", "moe-z-loss", "moe-expert"})
            if (cli.given(name))
                cli.fail("option --%s: the model has no experts (%s)", name,
                         from_file.empty() ? "give --moe-experts E" : ("none in " + from_file).c_str());
        return;
    }
    if (from_file.empty() || cli.given("moe-capacity")) c->moe_capacity = o.moe_capacity;
    if (from_file.empty() || cli.given("moe-aux-loss")) c->moe_aux = o.moe_aux;
    if (from_file.empty() || cli.given("moe-z-loss")) c->moe_z = o.moe_z;
    if (c->moe_top_k > c->moe_experts)
        cli.fail("option --moe-top-k: %d is more than the %d experts", c->moe_top_k, c->moe_experts);
    if (c->moe_every > c->num_layers)
        cli.fail("option --moe-every: %d is more than the %d layers (no block would be sparse)", c->moe_every,
                 c->num_layers);
    if (o.fp8)
        cli.fail("option --precision: fp8 GEMMs are for the dense blocks' linear layers; the MoE layer's batched "
                 "expert GEMMs have no fp8 path (use bf16 with --moe-experts)");
    if (!o.export_hf.empty())
        cli.fail("option --export-hf: a model with Mixture-of-Experts blocks has no Hugging Face GPT-2 form; its "
                 "checkpoints are this trainer's (--output-dir)");
}

// After resolve_moe_options: refuses --expert-parallel where it cannot work on `ranks` ranks (one
// rank holds every expert: accepted, nothing changes).
inline void resolve_expert_parallel(const Cli& cli, const TrainOptions& o, const GPT2Config& c, int ranks) {
    if (!o.expert_parallel) return;
    if (c.moe_experts == 0)
        cli.fail("option --expert-parallel: the model has no experts (give --moe-experts E)");
    if (c.moe_experts % ranks != 0)
        cli.fail("option --expert-parallel: the %d experts do not divide over %d ranks", c.moe_experts, ranks);
    if (ranks == 1) return;  // every expert on the one rank: nothing is sharded
    if (o.zero == 2)
        cli.fail("option --expert-parallel: not with --zero 2 (its per-micro-step gradient slices have no place "
                 "for rank-local experts); use --zero 0 or 1");
    if (o.gen_tokens > 0)
        cli.fail("option --expert-parallel: sampling needs every expert on one rank; give --gen-tokens 0 and sample "
                 "from a checkpoint in a single process (--init FILE -x 0)");
}
