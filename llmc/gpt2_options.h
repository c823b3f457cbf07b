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
    bool log_ranks = false;          // with --output-dir: every rank writes its own log (log_rank<r>.jsonl)
    bool tf32_flag = false;          // llm.c's -f 1: --precision tf32 by another name
};

// Declares train_gpt2's options, bound to *o (which must outlive cli.parse()).
inline void add_gpt2_options(Cli& cli, TrainOptions* o) {
    // The model: a checkpoint, or a random GPT-2 (what these mean depends on --init: the trainer reads them).
    cli.add("init", "e", "FILE|DIR|dN", "auto",
            "start from a llm.c checkpoint (.bin), a Hugging Face GPT-2 (.safetensors, or a directory with "
            "model.safetensors and config.json), or dN: a random GPT-2 of depth N (auto: d12 on a GPU, tiny on "
            "the CPU backend: 4 layers, 128 channels, 4 heads, 128 positions)");
    cli.add("layers", nullptr, "INT", "", "random init: number of layers (overrides --init's depth)");
    cli.add("channels", nullptr, "INT", "", "random init: channels C");
    cli.add("heads", nullptr, "INT", "", "random init: attention heads (C must divide by it)");
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
    t.lr_help = "peak learning rate (auto: 3e-4 on a GPU, 1e-3 for the CPU backend's tiny model)";
    t.warmup = "0";
    t.max_steps = "auto";
    t.max_steps_help = "optimizer steps; -1: one epoch of the training data (auto: -1 on a GPU, 150 on the CPU "
                       "backend)";
    t.precision = "auto";
    t.precision_help = "auto: bf16 on a GPU of compute capability 8.0+, else fp32 | fp32 | tf32 | bf16 | fp16 (with "
                       "dynamic loss scaling) | fp8 (bf16 with the blocks' matmuls in fp8, delayed scaling; compute "
                       "capability 8.9+)";
    t.beta2 = "0.95";
    t.weight_decay = "0.0";
    t.recompute_help = "recompute in the backward pass instead of storing: none | gelu | ln (gelu + layernorms) | "
                       "layer (whole blocks); llm.c's 0/1/2 also work";
    t.seed_help = "seed for initialization, shuffling and sampling";
    add_run_options(cli, o, t);
    // GPT-2's own
    cli.add("seq-len", "t", "INT", "auto", "sequence length T (auto: 1024 on a GPU, 128 on the CPU backend)", &o->T, 1,
            1 << 20);
    cli.add("final-lr-frac", "q", "FLOAT", "1.0", "final learning rate as a fraction of the peak", &o->final_lr_frac, 0,
            1);
    cli.add("val-every", "v", "STEPS", "auto", "evaluate the validation loss every this many steps, 0: never (auto: "
            "20 on a GPU, 25 on the CPU backend)", &o->val_every, 0, 1 << 30);
    cli.add("val-steps", "m", "INT", "auto", "validation batches per evaluation (auto: 20 on a GPU, 10 on the CPU "
            "backend)", &o->val_steps, 1, 1 << 30);
    cli.add("tf32", "f", "0", "with fp32: TF32 tensor-core matmuls (llm.c's -f; same as --precision tf32)",
            &o->tf32_flag);
    cli.add("gelu-fusion", "ge", "1", "GELU as cuBLASLt's matmul epilogue (1) or a separate kernel (0; always 0 with "
            "--recompute)", &o->gelu_fusion);
    cli.add("gen-tokens", "g", "INT", "auto", "tokens to sample after training, 0: none (auto: 256 on a GPU, 64 on "
            "the CPU backend)", &o->gen_tokens, 0, 1 << 20);
    cli.add("sample-every", "s", "STEPS", "0", "also sample every this many steps during training (0: only at the end)",
            &o->sample_every, 0, 1 << 30);
    cli.add("prompt", nullptr, "TEXT", "", "text the samples continue (encoded with --tokenizer)", &o->prompt);
    cli.add("temperature", nullptr, "FLOAT", "1.0", "sampling temperature", &o->temperature, 1e-3, 100);
    cli.add("top-k", nullptr, "INT", "0", "sample among the k most likely tokens only (0: all)", &o->top_k, 0, 1 << 24);
    cli.add("tokenizer", nullptr, "FILE", "dev/data/shakespeare/gpt2_tokenizer.bin",
            "llm.c GPT-2 tokenizer file, to print samples", &o->tokenizer_path);
    cli.add_flag("log-ranks", nullptr, "with --output-dir and several ranks: every rank also writes its own "
                 "log_rank<R>.jsonl (its loss and memory)", &o->log_ranks);
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
    check_run_options(cli, o, dist);
    if (o->B == 0 && o->total_batch <= 0)
        cli.fail("option --batch-size: auto needs --total-batch-size (the tokens per step to keep)");
    if (!o->prompt.empty()) {  // encoded now, so a bad tokenizer stops the run before training, not after
        Tokenizer tok;
        std::string err;
        if (!tok.load(o->tokenizer_path, &err)) cli.fail("option --prompt: cannot load the tokenizer: %s", err.c_str());
        if (!tok.can_encode())
            cli.fail("option --prompt: %s cannot encode text (not a byte-level BPE)", o->tokenizer_path.c_str());
        o->prompt_tokens = tok.encode(o->prompt);
    }
    std::string why;
    if (o->fp8 && !fp8_supported(0, &why)) cli.fail("option --precision: %s", why.c_str());
    if (o->tf32_flag) {
        if (o->precision != Precision::FP32) cli.fail("option --tf32: applies to --precision fp32 only");
        o->tf32 = true;
    }
}
