// test/gpt2_trainer.h — train_gpt2.cu as its tests include it: with TESTING (the program's main is
// train_gpt2_main) and its cudaMalloc calls counted (counted_malloc.h). Once per binary, so that the
// GPT-2 tests can also be built together as one (test/gpt2_suite.cu). Also the token shards the
// tests train on, and a tokenizer for their small vocabularies.
#pragma once
#define TESTING
#include "counted_malloc.h"
#include "../train_gpt2.cu"
#undef cudaMalloc

#include "harness.h"

namespace th {

// Writes a llm.c token shard of n tokens in [0, V) to `path` with something to learn: each token is
// mostly a fixed function of the one before (1 in 8 is random, from `seed`). A small V keeps a
// test's model small: the embedding, the classifier over V logits per token and the optimizer
// step over V·C parameters are most of a tiny model's work at GPT-2's vocabulary.
inline std::string write_token_shard(const std::string& path, size_t n, int V, uint64_t seed) {
    std::vector<int32_t> header(256, 0);
    header[0] = SHARD_MAGIC;
    header[1] = SHARD_VERSION;
    header[2] = (int32_t)n;
    std::vector<uint16_t> tokens(n);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
    uint16_t prev = 0;
    for (uint16_t& t : tokens) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        t = prev = (uint16_t)(x % 8 == 0 ? (x >> 8) % V : (prev * 5 + 3) % V);
    }
    FILE* f = fopen(path.c_str(), "wb");
    bool ok = f && fwrite(header.data(), 4, 256, f) == 256 && fwrite(tokens.data(), 2, n, f) == n;
    if (f) ok = fclose(f) == 0 && ok;
    if (!ok) data_error("cannot write the token shard %s", path.c_str());
    return path;
}

// Writes a llm.c tokenizer (version 2) of V tokens " t0", " t1", ... with <|endoftext|> = V-1 to
// `path`: sampling from a test's small-vocabulary model needs one.
inline std::string write_numbered_tokenizer(const std::string& path, int V) {
    int32_t h[256] = {TOKENIZER_MAGIC, 2, V, V - 1};
    std::string body((const char*)h, sizeof(h));
    for (int i = 0; i < V; i++) {
        std::string t = " t" + std::to_string(i);
        body += (char)t.size();
        body += t;
    }
    FILE* f = fopen(path.c_str(), "wb");
    bool ok = f && fwrite(body.data(), 1, body.size(), f) == body.size();
    if (f) ok = fclose(f) == 0 && ok;
    if (!ok) data_error("cannot write %s", path.c_str());
    return path;
}

}  // namespace th
