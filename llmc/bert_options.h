// llmc/bert_options.h — train_bert's command line: the shared options (llmc/run_options.h) with the
// fine-tuning recipe's defaults, and BERT's own (the task, sequence length, epochs, evaluation,
// dropout, masking, CUDA graphs, --bench). The options that choose the model and the data (--init, --config,
// --num-labels, and the "auto" defaults that follow from them) are read by the trainer.
#pragma once
#include "bert_config.h"
#include "cli.h"
#include "distributed.h"
#include "run_options.h"

// The options of a BERT run: the shared ones (llmc/run_options.h) and BERT's own.
struct BertTrainOptions : RunOptions {
    BertHead head = BertHead::Classify;  // --task classify | mlm
    int max_len = 256;                   // T: the widest batch (sequences are cut to it)
    int epochs = 2;
    int eval_every = 0;                  // steps between evaluations besides each epoch's end (0: none)
    bool eval_first = true;              // also evaluate before the first step
    float dropout = 0.1f;                // --dropout and --attention-dropout when given (else the model's
    float attention_dropout = 0.1f;      // config.json; the trainer resolves them into BertConfig::dropout)
    double mask_rate = 0.15;
    bool bench = false;                  // --bench: time the steps only (no evaluation), print a summary line
    bool cuda_graphs = true;             // replay the micro-step from a CUDA graph (BERT::train_micro_step)
    // Not an option: the checkpoint the run started from (absolute path; "" for a random init), which
    // the trainer resolves from --init and records in the run's config.json for a resumed run.
    std::string init_path;
    BertTrainOptions() {
        B = 32;
        lr = 2e-5f;
        warmup = 0.1;
    }
};

// Declares train_bert's options, bound to *o (which must outlive cli.parse()).
inline void add_bert_options(Cli& cli, BertTrainOptions* o) {
    cli.add_choice("task", nullptr, "NAME", "classify", "classify (sequence classification, classification shards) | "
                   "mlm (masked-language-model pretraining, MLM shards)", &o->head,
                   {{"classify", BertHead::Classify}, {"mlm", BertHead::MLM}});
    // The model: a checkpoint, or a random BERT (read below, with the data).
    cli.add("init", "e", "DIR|FILE", "auto", "start from a Hugging Face BERT checkpoint: a directory with "
            "model.safetensors and config.json, or a .safetensors file with config.json beside it (auto: "
            "dev/data/bert/minilm if fetched, else --config tiny)");
    cli.add("config", nullptr, "NAME", "", "random init instead: tiny (2 layers, 128 channels) | mini (4, 256) | "
            "small (4, 512) | base (12, 768) | large (24, 1024); vocabulary from the shards");
    cli.add("num-labels", nullptr, "INT", "auto", "classifier outputs (auto: the shards' labels, or the checkpoint's "
            "classifier)");
    RunOptionTexts t;
    t.train_data = "auto";
    t.train_data_help = "training shards from build/bert_data (auto: the bundled default task "
                        "dev/data/bert/genre_train.bin for classify; mlm needs -i)";
    t.val_data = "auto";
    t.val_data_help = "validation shards, '' for none (auto: dev/data/bert/genre_val.bin with the default task)";
    t.batch_size = "32";
    t.batch_help = "micro-batch size B in sequences";
    t.batch_unit = "SEQUENCES";
    t.total_batch_help = "sequences per optimizer step (gradient accumulation); -1: B";
    t.lr_help = "peak learning rate (auto: 2e-5 from a pretrained checkpoint, 1e-4 for the CPU backend's shortened "
                "default run; random init: 1e-4 for base/large, 1e-3 for the smaller configs)";
    t.warmup = "0.1";
    t.max_steps = "auto";
    t.max_steps_help = "optimizer steps instead of --epochs, -1: --epochs; 0: no training, the model as loaded is "
                       "evaluated and exported (auto: -1; 100 for the CPU backend's default run from a pretrained "
                       "model; 6 with --bench)";
    t.precision = "fp32";
    t.precision_help = "fp32 | tf32 | bf16 | fp16 (with dynamic loss scaling)";
    t.beta2 = "0.999";
    t.weight_decay = "0.01";
    t.recompute_help = "recompute in the backward pass instead of storing: none | gelu | ln (gelu + the attention "
                       "LayerNorm) | layer (whole layers, gradient checkpointing); llm.c's 0-3 also work";
    t.seed_help = "seed for initialization, data order, masking and dropout";
    add_run_options(cli, o, t);
    // BERT's own
    cli.add("max-len", "t", "INT", "256", "tokens per sequence at most (longer ones are cut; not given: at most the "
            "model's positions); batches are only as wide as their longest sequence, rounded up to a multiple of 8",
            &o->max_len, 3, 1 << 20);
    cli.add("epochs", nullptr, "INT", "2", "passes over the training data", &o->epochs, 1, 1 << 20);
    cli.add("eval-every", "v", "STEPS", "0", "also evaluate every this many steps (0: at each epoch's end only)",
            &o->eval_every, 0, 1 << 30);
    cli.add("eval-first", nullptr, "1", "evaluate before training too (the starting point to compare with)",
            &o->eval_first);
    cli.add("dropout", nullptr, "P", "auto", "dropout in training on the hidden states, the attention probabilities "
            "and the pooled output; 0: off (auto: the model's config.json: transformers' hidden_dropout_prob, "
            "attention_probs_dropout_prob, classifier_dropout; 0.1 for a random init)", &o->dropout, 0, 0.99);
    cli.add("attention-dropout", nullptr, "P", "auto", "dropout on the attention probabilities alone (auto: "
            "--dropout's if given, else the model's config.json); 0 lets an H100's attention backward run on wgmma",
            &o->attention_dropout, 0, 0.99);
    cli.add("mask-rate", nullptr, "FRACTION", "0.15", "mlm: fraction of the tokens to predict (80% [MASK], 10% "
            "random, 10% unchanged; masks drawn anew each epoch)", &o->mask_rate, 0, 1);
    cli.add("cuda-graphs", nullptr, "1", "replay each micro-step's forward and backward passes from a CUDA graph "
            "captured once per batch width (and mlm: masked rows rounded up to 64) (1) or launch every kernel "
            "from the host (0); the batch upload and the optimizer step stay eager, and --zero 2 always runs "
            "eagerly", &o->cuda_graphs);
    cli.add_flag("bench", nullptr, "measure speed: synthetic shards of --max-len tokens per sequence (nothing "
                 "downloaded), --max-steps steps, no evaluation; prints a summary line (scripts/bench_bert.sh)",
                 &o->bench);
}

// After cli.parse(): the checks that involve several options; each failure is one error naming one.
inline void check_bert_options(const Cli& cli, BertTrainOptions* o, const Distributed& dist) {
    check_run_options(cli, o, dist);
    if (o->fp8)
        cli.fail("option --precision: fp8 is not built for BERT (only GPT-2's blocks have fp8 GEMMs); use bf16 or "
                 "fp16");
    if (o->head == BertHead::MLM && o->mask_rate == 0) cli.fail("option --mask-rate: 0 leaves nothing to predict");
    // Options one task (or mode) alone reads would change nothing in another: refused, not ignored.
    if (o->head == BertHead::Classify && cli.given("mask-rate"))
        cli.fail("option --mask-rate: applies to --task mlm only");
    if (o->head == BertHead::MLM && cli.given("num-labels"))
        cli.fail("option --num-labels: applies to --task classify only");
    if (o->bench)
        for (const char* name : {"eval-every", "eval-first"})
            if (cli.given(name)) cli.fail("option --%s: --bench does not evaluate", name);
    if (cli.given("init") && cli.given("config"))
        cli.fail("option --config: excludes --init (a random init or a checkpoint, not both)");
}
