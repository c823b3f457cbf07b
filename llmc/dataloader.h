// llmc/dataloader.h — reads llm.c token shards into (B,T) batches of inputs and targets: validated
// up front, split across ranks, optionally shuffled (seeded), prefetched on a background thread
// into pinned host memory while the GPU computes; on request that thread also builds each batch's
// embedding-backward plan (plan_embedding_backward), so the training loop's thread does not.
//
// Shard format (llm.c, dev/data): a 256 x int32 header — [0] magic 20240520, [1] version 1,
// [2] number of tokens — then that many uint16 tokens. The file size must be 1024 + 2 * ntok.
//
// Batches. A shard is cut into consecutive windows of world*B*T tokens; window k gives rank r the
// B*T+1 tokens starting at (k*world + r)*B*T (inputs are the first B*T, targets the same shifted
// by one). So the ranks read disjoint tokens and together read what one rank with world*B would.
// With shuffling, the order of the windows inside each shard and the order of the shards are
// permuted every epoch from the seed (the same on every rank).
#pragma once
#include <cuda_runtime.h>
#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda_common.h"
#include "encoder_plan.h"
#include "file_io.h"

constexpr int SHARD_MAGIC = 20240520;
constexpr int SHARD_VERSION = 1;
constexpr int SHARD_HEADER_INTS = 256;

// Bad input files are not worth continuing with: one line, exit status 1 (in a multi-rank run the line
// names the rank and the whole job stops: llmc/fatal.h).
[[noreturn]] inline void data_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void data_error(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_line_exit(EXIT_FAILURE, fmt, ap);
}

// An option that turns out wrong only once the model, the data or the device are known (a batch that
// does not divide the tokens per step, a kernel this model cannot take): one line, but exit status 2,
// a bad option's.
[[noreturn]] inline void option_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void option_error(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_line_exit(2, fmt, ap);
}

// The files matching a glob pattern, sorted (one file name is a pattern too).
inline std::vector<std::string> glob_files(const std::string& pattern) {
    glob_t g;
    std::vector<std::string> files;
    if (glob(pattern.c_str(), 0, nullptr, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) files.push_back(g.gl_pathv[i]);
        globfree(&g);
    }
    std::sort(files.begin(), files.end());
    return files;
}

// Checks a shard's 1024-byte header against the file's size; the token count goes to *ntok.
// False with the reason in *err (no exit: the fuzz target drives this directly).
inline bool parse_shard_header(const uint8_t* header_bytes, size_t file_size, size_t* ntok, std::string* err) {
    if (file_size < SHARD_HEADER_INTS * 4) {
        *err = "too short for a token shard header (" + std::to_string(SHARD_HEADER_INTS * 4) + " bytes)";
        return false;
    }
    int32_t header[SHARD_HEADER_INTS];
    memcpy(header, header_bytes, sizeof(header));
    if (header[0] != SHARD_MAGIC) {
        // The llm.c files that sit beside shards, which a broad -i pattern also matches, by name.
        const char* what = header[0] == 20240328   ? ": a llm.c tokenizer file, not a token shard"  // llmc/tokenizer.h
                           : header[0] == 20240326 ? ": a llm.c model file, not a token shard"      // llmc/gpt2_io.h
                                                   : "";
        *err = "bad magic " + std::to_string(header[0]) + what + " (a llm.c token shard starts with " +
               std::to_string(SHARD_MAGIC) + ")";
        return false;
    }
    if (header[1] != SHARD_VERSION) {
        *err = "unsupported shard version " + std::to_string(header[1]) + " (expected " +
               std::to_string(SHARD_VERSION) + ": uint16 tokens)";
        return false;
    }
    if (header[2] < 0) {
        *err = "negative token count " + std::to_string(header[2]) + " in header";
        return false;
    }
    *ntok = (size_t)header[2];
    size_t expected = SHARD_HEADER_INTS * 4 + 2 * *ntok;
    if (file_size != expected) {
        *err = "file is " + std::to_string(file_size) + " bytes but its header promises " + std::to_string(*ntok) +
               " tokens (" + std::to_string(expected) + " bytes): truncated or corrupt";
        return false;
    }
    return true;
}

// Reads a shard's header and checks it against the file size; returns its token count (exits with
// one line naming the file and the problem if the shard is unusable).
inline size_t read_shard_header(const std::string& path, FILE* f) {
    uint8_t header[SHARD_HEADER_INTS * 4] = {0};  // a shorter file leaves zeros, refused by its size
    if (fread(header, 1, sizeof(header), f) == 0 && ferror(f)) data_error("%s: read failed", path.c_str());
    if (fseek(f, 0, SEEK_END) != 0) data_error("%s: cannot seek", path.c_str());
    long size = ftell(f);
    size_t ntok;
    std::string err;
    if (!parse_shard_header(header, (size_t)std::max(0L, size), &ntok, &err))
        data_error("%s: %s", path.c_str(), err.c_str());
    return ntok;
}

class DataLoader {
  public:
    // Opens every file matching `pattern`, validates each header, and prepares rank `rank` of
    // `world` to read (B,T) batches. vocab_size bounds the token ids (checked as shards load).
    DataLoader(const std::string& pattern, int B, int T, int rank, int world, bool shuffle, uint64_t seed,
               int vocab_size)
        : B_(B), T_(T), rank_(rank), world_(world), shuffle_(shuffle), seed_(seed), vocab_(vocab_size) {
        std::vector<std::string> matched = glob_files(pattern);
        if (matched.empty()) data_error("no token shards match '%s'", pattern.c_str());
        // A shard too short for one batch (often a dataset's last, holding the remainder) is skipped
        // with a warning while other shards hold batches; when none does, that is an error.
        size_t window = (size_t)world * B * T;
        std::vector<std::string> skipped;  // "PATH: N tokens, too few for one batch (...)"
        for (const auto& path : matched) {
            std::string why = not_a_regular_file(path);
            if (!why.empty()) data_error("%s: token shards are files", why.c_str());
            FILE* f = fopen(path.c_str(), "rb");
            if (!f) data_error("cannot open %s: %s", path.c_str(), strerror(errno));
            size_t ntok = read_shard_header(path, f);
            fclose(f);
            if (ntok < window + 1) {
                skipped.push_back(path + ": " + std::to_string(ntok) + " tokens, too few for one batch (B=" +
                                  std::to_string(B) + " x T=" + std::to_string(T) + " x " + std::to_string(world) +
                                  (world > 1 ? " ranks" : " rank") + " + 1 = " + std::to_string(window + 1) +
                                  " tokens)");
                continue;
            }
            files_.push_back(path);
            windows_.push_back((ntok - 1) / window);
        }
        std::string none = report_skipped_shards(skipped, files_.size(), matched.size(), rank);
        if (!none.empty()) data_error("%s", none.c_str());
        for (int k = 0; k < 2; k++) {
            cudaCheck(cudaMallocHost(&inputs_[k], (size_t)B * T * sizeof(int)));
            cudaCheck(cudaMallocHost(&targets_[k], (size_t)B * T * sizeof(int)));
        }
        reset();
    }

    ~DataLoader() {
        join();
        for (int k = 0; k < 2; k++) {
            cudaFreeHost(inputs_[k]);
            cudaFreeHost(targets_[k]);
        }
    }

    DataLoader(const DataLoader&) = delete;
    DataLoader& operator=(const DataLoader&) = delete;

    // Back to the first batch of epoch 0.
    void reset() { seek(0); }

    // Makes batch number `position` (counting from 0 at the start of epoch 0, across epochs) the
    // current one, exactly as if next_batch() had been called that many times after reset():
    // a resumed run reads the same batches as an uninterrupted one.
    void seek(uint64_t position) {
        join();
        size_t per_epoch = batches_per_epoch();
        epoch_ = (int)(position / per_epoch);
        size_t rest = position % per_epoch;
        plan_epoch();
        order_pos_ = 0;
        while (rest >= windows_[shard_order_[order_pos_]]) rest -= windows_[shard_order_[order_pos_++]];
        window_pos_ = rest;
        loaded_shard_ = SIZE_MAX;
        prefetch();    // the batch at `position` into the spare buffer...
        next_batch();  // ...made current, and the one after it prefetched
        position_ = position;
    }

    // Makes the next batch current: inputs()/targets() point at it (B*T ints each, pinned), and
    // starts preparing the one after it in the background.
    void next_batch() {
        join();
        current_ = 1 - current_;
        position_++;
        prefetch();
    }

    const int* inputs() const { return inputs_[current_]; }
    const int* targets() const { return targets_[current_]; }

    // From now on, the prefetch thread also builds each batch's embedding-backward lists
    // (llmc/encoder_plan.h; GPT-2: no token types) next to its ids; encoder_plan() returns the
    // current batch's. The current and the prefetched batch get theirs here.
    void plan_embedding_backward() {
        join();
        plan_encoder_ = true;
        for (int k = 0; k < 2; k++) encoder_plan_build(plans_[k], inputs_[k], nullptr, B_, T_, vocab_, 0);
    }
    // The current batch's plan, or nullptr unless plan_embedding_backward() was called.
    const EncoderPlanLists* encoder_plan() const { return plan_encoder_ ? &plans_[current_] : nullptr; }
    size_t num_shards() const { return files_.size(); }  // the shards read (not those skipped as too short)
    const std::vector<std::string>& shard_files() const { return files_; }
    // Batches this rank gets per epoch (all shards).
    size_t batches_per_epoch() const { return std::accumulate(windows_.begin(), windows_.end(), (size_t)0); }
    int epoch() const { return epoch_; }
    // Index of the current batch (see seek()).
    uint64_t position() const { return position_; }

  private:
    // Shard order and per-shard window orders for the current epoch.
    void plan_epoch() {
        shard_order_.resize(files_.size());
        std::iota(shard_order_.begin(), shard_order_.end(), (size_t)0);
        if (shuffle_) {
            std::mt19937_64 rng(seed_ * 1000003 + epoch_);
            std::shuffle(shard_order_.begin(), shard_order_.end(), rng);
        }
    }

    // Window permutation of shard s in the current epoch.
    void plan_windows(size_t s) {
        window_order_.resize(windows_[s]);
        std::iota(window_order_.begin(), window_order_.end(), (size_t)0);
        if (shuffle_) {
            std::mt19937_64 rng(seed_ * 7919 + epoch_ * 104729 + s);
            std::shuffle(window_order_.begin(), window_order_.end(), rng);
        }
    }

    // Reads shard s fully and checks every token id against the vocabulary.
    void load_shard(size_t s) {
        const std::string& path = files_[s];
        FILE* f = fopen(path.c_str(), "rb");
        if (!f) data_error("cannot open %s: %s", path.c_str(), strerror(errno));
        size_t ntok = read_shard_header(path, f);
        fseek(f, SHARD_HEADER_INTS * 4, SEEK_SET);
        tokens_.resize(ntok);
        if (fread(tokens_.data(), sizeof(uint16_t), ntok, f) != ntok) data_error("%s: read failed", path.c_str());
        fclose(f);
        for (size_t i = 0; i < ntok; i++)
            if (tokens_[i] >= vocab_)
                data_error("%s: token %u at position %zu is outside the vocabulary (size %d)", path.c_str(),
                           tokens_[i], i, vocab_);
        loaded_shard_ = s;
        plan_windows(s);
    }

    // Fills buffer 1-current_ with the batch at the read position, then advances the position.
    void produce() {
        size_t s = shard_order_[order_pos_];
        if (loaded_shard_ != s) load_shard(s);
        size_t window = window_order_[window_pos_];
        size_t start = (window * world_ + rank_) * (size_t)B_ * T_;
        int k = 1 - current_;
        for (size_t i = 0; i < (size_t)B_ * T_; i++) {
            inputs_[k][i] = tokens_[start + i];
            targets_[k][i] = tokens_[start + i + 1];
        }
        if (plan_encoder_) encoder_plan_build(plans_[k], inputs_[k], nullptr, B_, T_, vocab_, 0);
        if (++window_pos_ == windows_[s]) {
            window_pos_ = 0;
            if (++order_pos_ == files_.size()) {
                order_pos_ = 0;
                epoch_++;
                plan_epoch();
                loaded_shard_ = SIZE_MAX;  // re-plan its windows for the new epoch even if it stays loaded
            }
        }
    }

    void prefetch() { worker_ = std::thread([this] { produce(); }); }
    void join() {
        if (worker_.joinable()) worker_.join();
    }

    int B_, T_, rank_, world_;
    bool shuffle_;
    uint64_t seed_;
    int vocab_;
    std::vector<std::string> files_;
    std::vector<size_t> windows_;       // windows per shard
    std::vector<size_t> shard_order_;   // this epoch's shard order
    std::vector<size_t> window_order_;  // the loaded shard's window order
    std::vector<uint16_t> tokens_;      // the loaded shard
    size_t loaded_shard_ = SIZE_MAX;
    int epoch_ = 0;
    size_t order_pos_ = 0, window_pos_ = 0;  // read position: shard_order_ index, window index
    int* inputs_[2] = {nullptr, nullptr};    // double buffer (pinned): current_ and the prefetch
    int* targets_[2] = {nullptr, nullptr};
    int current_ = 0;  // the buffer inputs()/targets() return; the worker fills the other one
    uint64_t position_ = 0;  // index of the current batch
    bool plan_encoder_ = false;      // the worker builds plans_[k] with inputs_[k]
    EncoderPlanLists plans_[2];
    std::thread worker_;
};
