// dev/data/tokenize.cpp — text files -> llm.c token shards, with the GPT-2 BPE of llmc/tokenizer.h
// (token-for-token tiktoken's; no python needed). A plain C++17 host program:
//
//   make tokenize        (= g++ -O2 -std=c++17 dev/data/tokenize.cpp -o build/tokenize)
//   build/tokenize --tokenizer dev/data/shakespeare/gpt2_tokenizer.bin --out data/mine texts/
//
// Inputs are files (any name) and folders (every *.txt below them, recursively, in sorted path
// order), read as raw bytes in command-line order. A file that is clearly not text (a token shard, a
// NUL byte in its first 8 KiB) is refused when named, skipped with a warning when met in a folder; an
// input that is one of the run's own output files is refused. A literal <|endoftext|> in the text
// becomes the end-of-text token (how corpora such as TinyStories separate documents; tiktoken's
// encode(text, allowed_special={"<|endoftext|>"}) does the same); --eot-between-files also starts
// every file with one, as llm.c's data scripts start every document.
//
// Output: llm.c shards (256 x int32 header: magic 20240520, version 1, token count; then uint16
// tokens) named PREFIX_val_000000.bin ... and PREFIX_train_000000.bin ..., --shard-tokens N tokens
// each but a split's last, which takes a remainder shorter than N/2: every shard holds N/2 to 1.5N
// tokens (a split's only shard: fewer), never a short tail the trainer would skip (it needs B*T+1
// tokens per shard). The first --val-fraction of the input bytes (in input order) go to val: the
// split falls between two tokens, as llm.c's own scripts split at a token count.
#include "../../llmc/tokenizer.h"
#include "tool_main.h"

#include <chrono>
#include <cinttypes>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace tokenize_tool {

constexpr long long MAX_SHARD_TOKENS = 1431655765;  // its last shard, up to 1.5x, still fits the int32 count

const char* USAGE =
    "usage: tokenize --tokenizer FILE --out PREFIX [--val-fraction F] [--shard-tokens N]\n"
    "                [--eot-between-files] INPUT...\n"
    "Tokenizes text with GPT-2's BPE into llm.c token shards PREFIX_val_000000.bin, ...,\n"
    "PREFIX_train_000000.bin, ... (uint16 tokens).\n"
    "  --tokenizer FILE       llm.c tokenizer file (dev/data/shakespeare/gpt2_tokenizer.bin)\n"
    "  --out PREFIX           output path prefix, like DIR/NAME; missing folders are created\n"
    "  --val-fraction F       the first F of the input bytes go to val shards (default 0.1; 0: none)\n"
    "  --shard-tokens N       tokens per shard (default 100000000); a split's last shard takes a\n"
    "                         remainder shorter than N/2, so shards hold N/2 to 1.5N tokens (an only\n"
    "                         shard: fewer); that remainder waits in memory (N bytes at most)\n"
    "  --eot-between-files    start every file with <|endoftext|>\n"
    "  INPUT                  a text file, or a folder: every *.txt below it, in sorted order;\n"
    "                         a file that is not text (NUL bytes) is refused, or skipped in a folder\n"
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
    if (o->shard_tokens > MAX_SHARD_TOKENS) {
        *error = "--shard-tokens must be at most " + std::to_string(MAX_SHARD_TOKENS) +
                 " here: a last shard of up to 1.5x that still fits the header's int32";
        return false;
    }
    if (o->tokenizer.empty() || o->out.empty() || o->inputs.empty()) {
        *error = "needs --tokenizer FILE, --out PREFIX and at least one INPUT (--help)";
        return false;
    }
    return true;
}

// Writes one split's shards: PREFIX_<split>_<index>.bin of shard_tokens tokens each, but the last,
// which takes a remainder shorter than half a shard; each as a pending file (renamed into place when
// the whole run has succeeded: data_tool::PendingFiles). The header's count is written when a shard is
// complete.
class ShardWriter {
  public:
    ShardWriter(std::string prefix, std::string split, long long shard_tokens, data_tool::PendingFiles* files)
        : prefix_(std::move(prefix)), split_(std::move(split)), size_(shard_tokens), files_(files) {}
    ~ShardWriter() {
        if (f_) fclose(f_);
    }

    bool add(int token, std::string* error) {
        if (count_ < size_) return write((uint16_t)token, error);
        // The open shard is full: what follows waits in memory, for the split may end before it is
        // half a shard (close() then appends it). Once it is, it starts the next shard.
        tail_.push_back((uint16_t)token);
        if (2 * (long long)tail_.size() < size_) return true;
        if (!complete(error)) return false;
        std::vector<uint16_t> next;
        next.swap(tail_);
        for (uint16_t t : next)
            if (!write(t, error)) return false;
        return true;
    }

    // Completes the split's last shard, if one is open, with the remainder held back.
    bool close(std::string* error) {
        for (uint16_t t : tail_)
            if (!write(t, error)) return false;
        tail_.clear();
        return complete(error);
    }

    // The file the next shard would be (to warn about a longer earlier run's leftovers).
    std::string next_path() const { return name(index_); }

  private:
    std::string name(int index) const {
        char num[16];
        snprintf(num, sizeof(num), "%06d", index);
        return prefix_ + "_" + split_ + "_" + num + ".bin";
    }
    bool write(uint16_t token, std::string* error) {
        if (!f_ && !open(error)) return false;
        buf_.push_back(token);
        count_++;
        return buf_.size() < (1 << 16) || flush(error);
    }
    // Completes the open shard, if any: its header's count, then the file.
    bool complete(std::string* error) {
        if (!f_) return true;
        int32_t header[256] = {data_tool::TOKEN_SHARD_MAGIC, data_tool::TOKEN_SHARD_VERSION, (int32_t)count_};
        bool ok = flush(error) && fseek(f_, 0, SEEK_SET) == 0 && fwrite(header, sizeof(header), 1, f_) == 1;
        ok &= fclose(f_) == 0;
        f_ = nullptr;
        if (!ok) return fail(error);
        files_->describe(path_, std::to_string(count_) + " tokens");
        index_++;
        return true;
    }
    bool open(std::string* error) {
        path_ = files_->add(name(index_));
        f_ = fopen(path_.c_str(), "wb");
        count_ = 0;
        int32_t header[256] = {data_tool::TOKEN_SHARD_MAGIC, data_tool::TOKEN_SHARD_VERSION, 0};
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
    long long size_, count_ = 0;  // count_: the open shard's tokens, written or in buf_
    int index_ = 0;
    data_tool::PendingFiles* files_;
    FILE* f_ = nullptr;
    std::vector<uint16_t> buf_, tail_;  // buf_: not yet written; tail_: past a full shard, held back
};

// Tokenizes the inputs of o into shards; false with a one-line reason on any error.
inline bool run(const Options& o, Stats* stats, std::string* error) {
    auto t0 = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    if (!data_tool::check_out_prefix(o.out, error)) return false;
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
    if (!data_tool::collect_text_files(o.inputs, &files, &total, error) ||
        !data_tool::check_inputs_not_outputs(o.out, true, files, error) ||
        !data_tool::drop_non_text("tokenize", o.inputs, o.quiet, &files, &total, error))
        return false;
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
    if (o.quiet) return true;
    data_tool::warn_leftovers("tokenize", {val.next_path(), train.next_path()});
    if (o.val_fraction > 0 && stats->val_tokens == 0)
        printf("tokenize: warning: --val-fraction %g is %.3g of the %zu input bytes, rounded to none: no val shard\n",
               o.val_fraction, o.val_fraction * (double)total, total);
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
