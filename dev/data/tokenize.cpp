// dev/data/tokenize.cpp — text files -> llm.c token shards, with the GPT-2 BPE of llmc/tokenizer.h
// (token-for-token tiktoken's; no python needed). A plain C++17 host program:
//
//   make tokenize        (= g++ -O2 -std=c++17 dev/data/tokenize.cpp -o build/tokenize)
//   build/tokenize --tokenizer dev/data/shakespeare/gpt2_tokenizer.bin --out data/mine texts/
//
// Inputs are files (any name) and folders (every *.txt below them, recursively, in sorted path
// order), read as raw bytes in command-line order. A literal <|endoftext|> in the text becomes the
// end-of-text token (how corpora such as TinyStories separate documents; tiktoken's
// encode(text, allowed_special={"<|endoftext|>"}) does the same); --eot-between-files also starts
// every file with one, as llm.c's data scripts start every document.
//
// Output: llm.c shards (256 x int32 header: magic 20240520, version 1, token count; then uint16
// tokens) named PREFIX_val_000000.bin ... and PREFIX_train_000000.bin ..., at most --shard-tokens
// tokens each. The first --val-fraction of the input bytes (in input order) go to val: the split
// falls between two tokens, as llm.c's own scripts split at a token count.
#include "../../llmc/tokenizer.h"
#include "tool_main.h"

#include <chrono>
#include <cinttypes>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace tokenize_tool {

constexpr int32_t SHARD_MAGIC = 20240520;  // llmc/dataloader.h reads these (it needs CUDA headers)
constexpr int32_t SHARD_VERSION = 1;

const char* USAGE =
    "usage: tokenize --tokenizer FILE --out PREFIX [--val-fraction F] [--shard-tokens N]\n"
    "                [--eot-between-files] INPUT...\n"
    "Tokenizes text with GPT-2's BPE into llm.c token shards PREFIX_val_000000.bin, ...,\n"
    "PREFIX_train_000000.bin, ... (uint16 tokens).\n"
    "  --tokenizer FILE       llm.c tokenizer file (dev/data/shakespeare/gpt2_tokenizer.bin)\n"
    "  --out PREFIX           output path prefix; missing folders are created\n"
    "  --val-fraction F       the first F of the input bytes go to val shards (default 0.1; 0: none)\n"
    "  --shard-tokens N       tokens per shard at most (default 100000000)\n"
    "  --eot-between-files    start every file with <|endoftext|>\n"
    "  INPUT                  a text file, or a folder: every *.txt below it, in sorted order\n"
    "A literal <|endoftext|> in the text is the end-of-text token. Invalid UTF-8 is kept byte for byte.\n";

struct Options {
    std::string tokenizer, out;
    double val_fraction = 0.1;
    long long shard_tokens = 100000000;
    bool eot_between_files = false;
    std::vector<std::string> inputs;
    size_t chunk_bytes = 1 << 20;  // read size; tests make it tiny to cut text everywhere
    bool quiet = false;            // no progress lines
};

struct Stats {
    size_t files = 0, bytes = 0, val_tokens = 0, train_tokens = 0;
    std::vector<std::string> shards;  // written, in order
    double seconds = 0;
};

// Parses the command line; false with a reason (or, for --help, an empty one and *help set).
inline bool parse_args(int argc, char** argv, Options* o, bool* help, std::string* error) {
    *help = false;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto value = [&](const char* name) -> const char* {
            if (i + 1 >= argc) {
                *error = std::string(name) + " needs a value";
                return nullptr;
            }
            return argv[++i];
        };
        const char* v = nullptr;
        if (a == "--help" || a == "-h") {
            *help = true;
            return true;
        } else if (a == "--eot-between-files") {
            o->eot_between_files = true;
        } else if (a == "--tokenizer" || a == "--out" || a == "--val-fraction" || a == "--shard-tokens") {
            if (!(v = value(a.c_str()))) return false;
            if (a == "--tokenizer") o->tokenizer = v;
            else if (a == "--out") o->out = v;
            else if (a == "--val-fraction" && !data_tool::parse_val_fraction(v, &o->val_fraction, error)) return false;
            else if (a == "--shard-tokens" && !data_tool::parse_shard_tokens(v, &o->shard_tokens, error)) return false;
        } else if (a.size() > 1 && a[0] == '-') {
            *error = "unknown option " + a + " (--help lists them)";
            return false;
        } else {
            o->inputs.push_back(a);
        }
    }
    if (o->tokenizer.empty() || o->out.empty() || o->inputs.empty()) {
        *error = "needs --tokenizer FILE, --out PREFIX and at least one INPUT (--help)";
        return false;
    }
    return true;
}

// Writes one split's shards: PREFIX_<split>_<index>.bin, a new one every max_tokens tokens, each as a
// pending file (renamed into place when the whole run has succeeded: data_tool::PendingFiles). The
// header's count is written when a shard is complete.
class ShardWriter {
  public:
    ShardWriter(std::string prefix, std::string split, long long max_tokens, data_tool::PendingFiles* files)
        : prefix_(std::move(prefix)), split_(std::move(split)), max_(max_tokens), files_(files) {}
    ~ShardWriter() {
        if (f_) fclose(f_);
    }

    bool add(int token, std::string* error) {
        if (!f_ && !open(error)) return false;
        buf_.push_back((uint16_t)token);
        if (buf_.size() == (1 << 16) && !flush(error)) return false;
        if (++count_ == max_) return close(error);
        return true;
    }

    // Completes the current shard, if one is open.
    bool close(std::string* error) {
        if (!f_) return true;
        int32_t header[256] = {SHARD_MAGIC, SHARD_VERSION, (int32_t)count_};
        bool ok = flush(error) && fseek(f_, 0, SEEK_SET) == 0 && fwrite(header, sizeof(header), 1, f_) == 1;
        ok &= fclose(f_) == 0;
        f_ = nullptr;
        if (!ok) return fail(error);
        files_->describe(path_, std::to_string(count_) + " tokens");
        index_++;
        return true;
    }

    // The file the next shard would be (to warn about a longer earlier run's leftovers).
    std::string next_path() const { return name(index_); }

  private:
    std::string name(int index) const {
        char num[16];
        snprintf(num, sizeof(num), "%06d", index);
        return prefix_ + "_" + split_ + "_" + num + ".bin";
    }
    bool open(std::string* error) {
        path_ = files_->add(name(index_));
        f_ = fopen(path_.c_str(), "wb");
        count_ = 0;
        int32_t header[256] = {SHARD_MAGIC, SHARD_VERSION, 0};
        if (!f_ || fwrite(header, sizeof(header), 1, f_) != 1) return fail(error);
        return true;
    }
    bool flush(std::string* error) {
        bool ok = fwrite(buf_.data(), sizeof(uint16_t), buf_.size(), f_) == buf_.size();
        buf_.clear();
        return ok || fail(error);
    }
    bool fail(std::string* error) {
        *error = "cannot write " + path_ + ": " + strerror(errno);
        return false;
    }

    std::string prefix_, split_, path_;  // path_: the open shard's pending (.tmp) name
    long long max_, count_ = 0;
    int index_ = 0;
    data_tool::PendingFiles* files_;
    FILE* f_ = nullptr;
    std::vector<uint16_t> buf_;
};

// Tokenizes the inputs of o into shards; false with a one-line reason on any error.
inline bool run(const Options& o, Stats* stats, std::string* error) {
    auto t0 = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    Tokenizer tok;
    if (!tok.load(o.tokenizer, error)) return false;
    if (tok.vocab_size() > 65536) {
        *error = o.tokenizer + ": " + std::to_string(tok.vocab_size()) +
                 " tokens do not fit the shards' uint16 token ids (65536 at most)";
        return false;
    }
    if (!tok.can_encode()) {
        *error = o.tokenizer + ": cannot encode with it: not every single byte is a token (not a byte-level BPE)";
        return false;
    }
    std::vector<std::string> files;
    size_t total = 0;
    if (!data_tool::collect_text_files(o.inputs, &files, &total, error)) return false;
    if (total == 0) {
        *error = files.empty() ? "no input files (folders contribute their *.txt files)" : "the inputs hold no text";
        return false;
    }
    if (!data_tool::make_parent(o.out, error)) return false;

    data_tool::PendingFiles pending("tokenize", o.quiet);
    ShardWriter val(o.out, "val", o.shard_tokens, &pending), train(o.out, "train", o.shard_tokens, &pending);
    const size_t val_bytes = (size_t)(o.val_fraction * (double)total + 0.5);
    size_t consumed = 0;  // input bytes behind the tokens emitted so far
    double last_print = 0;
    // A token, behind `bytes` input bytes, goes to val until val_bytes of input are consumed.
    auto emit = [&](int token, size_t bytes, std::string* err) {
        bool is_val = consumed < val_bytes;
        consumed += bytes;
        (is_val ? stats->val_tokens : stats->train_tokens)++;
        return is_val ? val.add(token, err) : train.add(token, err);
    };
    auto emit_all = [&](const std::vector<int>& ids, std::string* err) {
        for (int id : ids)
            if (!emit(id, tok.decode(id).size(), err)) return false;
        return true;
    };
    const std::string& sep = tok.decode(tok.eot());
    std::vector<int> ids;
    std::string buf;
    std::vector<char> chunk(o.chunk_bytes);
    for (const std::string& path : files) {
        std::unique_ptr<FILE, int (*)(FILE*)> f(fopen(path.c_str(), "rb"), fclose);
        if (!f) {
            *error = "cannot read " + path + ": " + strerror(errno);
            return false;
        }
        if (o.eot_between_files && !emit(tok.eot(), 0, error)) return false;
        bool at_end = false;
        while (!at_end) {
            size_t n = fread(chunk.data(), 1, chunk.size(), f.get());
            if (n < chunk.size()) {
                if (ferror(f.get())) {
                    *error = "cannot read " + path + ": " + strerror(errno);
                    return false;
                }
                at_end = true;
            }
            buf.append(chunk.data(), n);
            stats->bytes += n;
            // Text up to a literal separator is complete; after the last one, encode what cannot
            // change any more, keeping back a possible separator's beginning.
            size_t at;
            while ((at = buf.find(sep)) != std::string::npos) {
                ids.clear();
                tok.encode_some(std::string_view(buf).substr(0, at), true, &ids);
                if (!emit_all(ids, error) || !emit(tok.eot(), sep.size(), error)) return false;
                buf.erase(0, at + sep.size());
            }
            ids.clear();
            size_t safe = at_end ? buf.size() : buf.size() - std::min(buf.size(), sep.size() - 1);
            buf.erase(0, tok.encode_some(std::string_view(buf).substr(0, safe), at_end, &ids));
            if (!emit_all(ids, error)) return false;
            if (!o.quiet && elapsed() - last_print >= 2) {
                last_print = elapsed();
                printf("tokenize: %.1f of %.1f MB (%.0f%%), %zu tokens, %.1f MB/s\n", stats->bytes / 1e6,
                       total / 1e6, 100.0 * stats->bytes / total, stats->val_tokens + stats->train_tokens,
                       stats->bytes / 1e6 / last_print);
                fflush(stdout);
            }
        }
        stats->files++;
    }
    if (!val.close(error) || !train.close(error) || !pending.commit(&stats->shards, error)) return false;
    stats->seconds = elapsed();
    if (!o.quiet) data_tool::warn_leftovers("tokenize", {val.next_path(), train.next_path()});
    return true;
}

// The summary line of a finished run.
inline void print_summary(const Options&, const Stats& s) {
    size_t tokens = s.val_tokens + s.train_tokens;
    printf("tokenize: %zu files, %.2f MB -> %zu tokens (val %zu, train %zu) in %.2f s: %.1f MB/s, %.2fM tokens/s\n",
           s.files, s.bytes / 1e6, tokens, s.val_tokens, s.train_tokens, s.seconds, s.bytes / 1e6 / s.seconds,
           tokens / 1e6 / s.seconds);
}

}  // namespace tokenize_tool

#ifndef TOKENIZE_NO_MAIN
int main(int argc, char** argv) {
    using namespace tokenize_tool;
    return data_tool::run_main(argc, argv, USAGE, parse_args, run, print_summary);
}
#endif
