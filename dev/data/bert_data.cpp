// dev/data/bert_data.cpp — text -> BERT shards (the format of llmc/bert_dataloader.h), tokenized
// with the WordPiece of llmc/wordpiece.h (token-for-token transformers' BertTokenizer; no python
// needed). A plain C++17 host program:
//
//   make bert_data        (= g++ -O2 -std=c++17 dev/data/bert_data.cpp -o build/bert_data)
//   build/bert_data mlm --vocab dev/data/bert/vocab.txt --out data/wiki texts/
//   build/bert_data classify --vocab dev/data/bert/vocab.txt --out data/imdb aclImdb/
//
// mlm: pretraining sequences. Inputs are files and folders (every *.txt below them, recursively,
// in sorted path order). A document ends at a blank line (BERT's one-sentence-per-line format) and at
// the end of a file. Documents are tokenized line by line and packed greedily into sequences
// [CLS] ... [SEP] of at most --max-len tokens: whole lines while they fit, a [SEP] between two
// documents sharing a sequence; a line longer than a sequence is cut into pieces (not in the middle
// of a word where a ## piece allows). The lines that start in the first --val-fraction of the input
// bytes go to val. Output PREFIX_val_000000.bin ..., PREFIX_train_000000.bin ..., each at most
// --shard-tokens tokens (a shard is built in memory: 2 bytes per token). A run whose lines all go to
// val (one line of text, or --val-fraction 1) is refused, as classify refuses one with no training
// examples.
//
// classify: labeled sequences [CLS] text [SEP], truncated to --max-len as BertTokenizer's
// encode(text, max_length=L, truncation=True). INPUT is
//   a TSV file   label<TAB>text per line; a first line naming the columns "label" and "text" (or
//                "sentence", as GLUE's SST-2) is a header and may put them in any order;
//   a JSONL file one {"label": ..., "text": ...} object per line (recognized by its first '{');
//   a folder     laid out as IMDB's aclImdb/: train/<label>/*.txt, test/<label>/*.txt (train/unsup,
//                the unlabeled reviews, is skipped); test/ is the val split.
// Labels are integers (every label a non-negative integer: its own class id) or names (mapped to
// 0, 1, ... in sorted byte order, or in the order of --labels). The names are stored in the shards.
// Val is --val FILE, a folder's test/, or else every round(1/F)-th example (--val-fraction F, spread
// evenly over the input, so a file sorted by label still gives a balanced val). Output
// PREFIX_train.bin and PREFIX_val.bin. Every label is checked before anything is written.
//
// Both modes refuse a named input that is clearly not text (a shard, NUL bytes) or one of the run's
// own outputs, and skip a non-text file met in an input folder with a warning; --out is a path
// prefix, never a folder. Both write each shard as PATH.tmp and rename them all into place only once
// the whole run has succeeded: an error leaves an earlier run's shards as they were, never half of
// them replaced.
#include "../../llmc/bert_dataloader.h"
#include "../../llmc/json.h"
#include "../../llmc/wordpiece.h"
#include "tool_main.h"

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace bert_data {

using data_tool::collect_text_files, data_tool::fail, data_tool::make_parent;

const char* USAGE =
    "usage: bert_data mlm --vocab FILE --out PREFIX [--max-len N] [--val-fraction F] [--shard-tokens N]\n"
    "                     [--no-lower-case] INPUT...\n"
    "       bert_data classify --vocab FILE --out PREFIX [--max-len N] [--val FILE | --val-fraction F]\n"
    "                     [--labels A,B,...] [--no-lower-case] INPUT\n"
    "Tokenizes text with BERT's WordPiece into BERT shards (llmc/bert_dataloader.h).\n"
    "  mlm        documents (blank-line separated, or one per file) packed into [CLS] ... [SEP] sequences:\n"
    "             PREFIX_val_000000.bin ..., PREFIX_train_000000.bin ...\n"
    "  classify   labeled texts -> [CLS] text [SEP] + label: PREFIX_train.bin, PREFIX_val.bin\n"
    "  --vocab FILE         BERT vocab.txt (dev/data/bert/vocab.txt: bert-base-uncased)\n"
    "  --out PREFIX         output path prefix, like DIR/NAME; missing folders are created\n"
    "  --max-len N          tokens per sequence at most, [CLS] and [SEP] included (mlm 128, classify 256)\n"
    "  --val-fraction F     mlm: the lines in the first F of the input bytes go to val (default 0.1);\n"
    "                       classify without --val or test/: every round(1/F)-th example (default 0.1)\n"
    "  --shard-tokens N     mlm: tokens per shard at most (default 100000000)\n"
    "  --val FILE           classify: the val split's TSV/JSONL file\n"
    "  --labels A,B,...     classify: the label names in id order (default: sorted, or integer labels)\n"
    "  --lower-case         lower-case and strip accents, as bert-base-uncased (the default)\n"
    "  --no-lower-case      keep case and accents (cased vocabularies)\n"
    "  INPUT                mlm: text files, or folders (every *.txt below them, sorted)\n"
    "                       classify: a TSV (label<TAB>text; a header line naming label and text/sentence\n"
    "                       is allowed), a JSONL ({\"label\": ..., \"text\": ...} per line), or an\n"
    "                       aclImdb-style folder: train/<label>/*.txt, test/<label>/*.txt\n";

enum class Mode { None, MLM, Classify };

struct Options {
    Mode mode = Mode::None;
    std::string vocab, out, val_input;
    int max_len = 0;  // 0: the mode's default
    double val_fraction = 0.1;
    long long shard_tokens = 100000000;
    bool lower_case = true;
    std::vector<std::string> labels;  // --labels
    std::vector<std::string> inputs;
    bool quiet = false;  // no progress or summary lines (tests)
};

// What one split got.
struct SplitStats {
    size_t sequences = 0, tokens = 0, truncated = 0, longest = 0;
    std::vector<size_t> per_label;  // classification: sequences of each label
};

struct Stats {
    size_t files = 0, bytes = 0, documents = 0;
    SplitStats train, val;
    std::vector<std::string> label_names;
    std::vector<std::string> shards;  // written, in order
    double seconds = 0;
};

// Parses the command line; false with a reason (or, for --help, true with *help set).
inline bool parse_args(int argc, char** argv, Options* o, bool* help, std::string* error) {
    *help = false;
    bool val_fraction_given = false;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            *help = true;
            return true;
        }
        if (i == 1 && a[0] != '-') {
            if (a == "mlm") o->mode = Mode::MLM;
            else if (a == "classify") o->mode = Mode::Classify;
            else return fail(error, "unknown command '" + a + "' (mlm or classify; --help)");
            continue;
        }
        if (a == "--lower-case" || a == "--no-lower-case") {
            o->lower_case = a == "--lower-case";
            continue;
        }
        bool takes_value = a == "--vocab" || a == "--out" || a == "--max-len" || a == "--val-fraction" ||
                           a == "--shard-tokens" || a == "--val" || a == "--labels";
        if (!takes_value) {
            if (a.size() > 1 && a[0] == '-') return fail(error, "unknown option " + a + " (--help lists them)");
            o->inputs.push_back(a);
            continue;
        }
        if (i + 1 >= argc) return fail(error, a + " needs a value");
        std::string v = argv[++i];
        if (a == "--vocab") {
            o->vocab = v;
        } else if (a == "--out") {
            o->out = v;
        } else if (a == "--val") {
            o->val_input = v;
        } else if (a == "--max-len") {
            char* end = nullptr;
            long n = strtol(v.c_str(), &end, 10);
            if (*end || v.empty() || n < 3 || n > 65536)
                return fail(error, "--max-len must be an integer in [3, 65536], not '" + v + "'");
            o->max_len = (int)n;
        } else if (a == "--val-fraction") {
            if (!data_tool::parse_val_fraction(v, &o->val_fraction, error)) return false;
            val_fraction_given = true;
        } else if (a == "--shard-tokens") {
            if (!data_tool::parse_shard_tokens(v, &o->shard_tokens, error)) return false;
        } else {  // --labels
            o->labels.clear();
            for (size_t start = 0;;) {
                size_t comma = v.find(',', start);
                o->labels.push_back(v.substr(start, comma - start));
                if (o->labels.back().empty()) return fail(error, "--labels has an empty name: '" + v + "'");
                if (comma == std::string::npos) break;
                start = comma + 1;
            }
            std::set<std::string> unique(o->labels.begin(), o->labels.end());
            if (unique.size() != o->labels.size()) return fail(error, "--labels names a label twice: '" + v + "'");
        }
    }
    if (o->mode == Mode::None) return fail(error, "needs a command: bert_data mlm ... or bert_data classify ... (--help)");
    if (o->vocab.empty() || o->out.empty() || o->inputs.empty())
        return fail(error, "needs --vocab FILE, --out PREFIX and at least one INPUT (--help)");
    if (o->mode == Mode::Classify) {
        if (o->inputs.size() != 1) return fail(error, "classify takes one INPUT (a TSV, a JSONL or an aclImdb-style folder)");
        if (!o->val_input.empty() && val_fraction_given)
            return fail(error, "--val and --val-fraction exclude each other");
    } else if (!o->val_input.empty() || !o->labels.empty()) {
        return fail(error, "--val and --labels are for classify");
    }
    if (o->max_len == 0) o->max_len = o->mode == Mode::MLM ? 128 : 256;
    if (o->shard_tokens < o->max_len)
        return fail(error, "--shard-tokens " + std::to_string(o->shard_tokens) + " cannot hold one sequence of --max-len " +
                               std::to_string(o->max_len));
    return true;
}

// The shards a run writes, as data_tool::PendingFiles (renamed into place only once the whole run has
// succeeded). The output folder is created with the first one (a run refused before it writes
// anything creates nothing).
class PendingShards {
  public:
    PendingShards(const Options& o, Stats* stats) : o_(o), stats_(stats), files_("bert_data", o.quiet) {}

    bool write(const std::string& path, const BertShard& shard, std::string* error) {
        if (!folder_made_ && !make_parent(o_.out, error)) return false;
        folder_made_ = true;
        const std::string tmp = files_.add(path);
        files_.describe(tmp, std::to_string(shard.lengths.size()) + " sequences, " + std::to_string(shard.tokens.size()) +
                        " tokens");
        return write_bert_shard(tmp, shard, error);
    }
    bool commit(std::string* error) { return files_.commit(&stats_->shards, error); }

  private:
    const Options& o_;
    Stats* stats_;
    data_tool::PendingFiles files_;
    bool folder_made_ = false;
};

// A shard being built in memory for one split: sequences (with [CLS]/[SEP]) and their labels.
// Numbered shards (MLM) start a new file when the next sequence would pass max_tokens; a single
// shard (classification) must hold everything.
class ShardWriter {
  public:
    ShardWriter(const WordPiece& wp, const Options& o, BertShardKind kind, const std::string& split,
                PendingShards* pending, SplitStats* split_stats)
        : o_(o), split_(split), numbered_(kind == BertShardKind::MLM), pending_(pending), split_stats_(split_stats) {
        shard_.kind = kind;
        shard_.max_len = o.max_len;
        shard_.vocab_size = wp.vocab_size();
        shard_.cls_id = wp.cls_id();
        shard_.sep_id = wp.sep_id();
        shard_.pad_id = wp.pad_id();
        shard_.mask_id = wp.mask_id();
        shard_.unk_id = wp.unk_id();
        shard_.lower_case = o.lower_case;
        shard_.vocab_fingerprint = wp.fingerprint();
    }

    bool add(const std::vector<int>& ids, int label, std::string* error) {
        size_t limit = numbered_ ? (size_t)o_.shard_tokens : (size_t)INT32_MAX;
        if (shard_.tokens.size() + ids.size() > limit) {
            if (!numbered_)
                return fail(error, "more than 2^31 tokens for one " + split_ + " shard: split the input");
            if (!close(error)) return false;
        }
        shard_.tokens.insert(shard_.tokens.end(), ids.begin(), ids.end());
        shard_.lengths.push_back((int32_t)ids.size());
        if (shard_.kind == BertShardKind::Classify) shard_.labels.push_back(label);
        split_stats_->sequences++;
        split_stats_->tokens += ids.size();
        split_stats_->longest = std::max(split_stats_->longest, ids.size());
        return true;
    }

    // Writes the shard being built, if it has any sequence (as a pending .tmp file).
    bool close(std::string* error, const std::vector<std::string>& label_names = {}) {
        if (shard_.lengths.empty()) return true;
        shard_.label_names = label_names;
        if (!pending_->write(next_path(), shard_, error)) return false;
        index_++;
        shard_.tokens.clear();
        shard_.lengths.clear();
        shard_.labels.clear();
        return true;
    }

    // The file the next shard goes to (also: what an earlier, longer run may have left behind).
    std::string next_path() const {
        if (!numbered_) return o_.out + "_" + split_ + ".bin";
        char num[16];
        snprintf(num, sizeof(num), "%06d", index_);
        return o_.out + "_" + split_ + "_" + num + ".bin";
    }

  private:
    const Options& o_;
    std::string split_;
    bool numbered_;
    PendingShards* pending_;
    SplitStats* split_stats_;
    BertShard shard_;
    int index_ = 0;
};

// Packs one split's documents into MLM sequences (the rules at the top of the file).
class Packer {
  public:
    Packer(const WordPiece& wp, const std::vector<bool>& continuation, int max_len, ShardWriter* out)
        : wp_(wp), continuation_(continuation), cap_((size_t)max_len - 2), out_(out) {}

    // A non-blank line of the current document, as token ids.
    bool line(const std::vector<int>& ids, std::string* error) {
        for (size_t pos = 0; pos < ids.size();) {
            size_t end = std::min(ids.size(), pos + cap_);
            // Cut before a word's first piece when one is in the second half of the piece.
            for (size_t e = end; end < ids.size() && e > pos + cap_ / 2; e--)
                if (!continuation_[ids[e]]) {
                    end = e;
                    break;
                }
            if (!piece(ids.data() + pos, end - pos, error)) return false;
            pos = end;
        }
        return true;
    }

    void end_document() { document_break_ = true; }

    // Emits the sequence being filled, if any.
    bool flush(std::string* error) {
        if (body_.empty()) return true;
        seq_.assign(1, wp_.cls_id());
        seq_.insert(seq_.end(), body_.begin(), body_.end());
        seq_.push_back(wp_.sep_id());
        body_.clear();
        return out_->add(seq_, 0, error);
    }

  private:
    bool piece(const int* ids, size_t n, std::string* error) {
        bool sep = document_break_ && !body_.empty();
        if (body_.size() + sep + n > cap_) {
            if (!flush(error)) return false;
            sep = false;
        }
        if (sep) body_.push_back(wp_.sep_id());
        document_break_ = false;
        body_.insert(body_.end(), ids, ids + n);
        return true;
    }

    const WordPiece& wp_;
    const std::vector<bool>& continuation_;
    size_t cap_;  // tokens between [CLS] and [SEP]
    ShardWriter* out_;
    std::vector<int> body_, seq_;
    bool document_break_ = false;
};

// Whether a line holds only whitespace (a document break).
inline bool blank(const char* s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n' && s[i] != '\f' && s[i] != '\v') return false;
    return true;
}

// Prints progress every 2 s (not when quiet).
struct Progress {
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    double last = 0;
    double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
    void maybe(const Options& o, const char* what, size_t count, size_t bytes, size_t total) {
        if (o.quiet || elapsed() - last < 2) return;
        last = elapsed();
        printf("bert_data: %zu %s, %.1f of %.1f MB (%.0f%%), %.1f MB/s\n", count, what, bytes / 1e6, total / 1e6,
               total ? 100.0 * bytes / total : 100.0, bytes / 1e6 / last);
        fflush(stdout);
    }
};

// --val-fraction's value as given ("0.1", not to_string's "0.100000"), for messages.
inline std::string fraction_text(double f) {
    char s[32];
    snprintf(s, sizeof(s), "%g", f);
    return s;
}

inline bool run_mlm(const Options& o, const WordPiece& wp, Stats* stats, std::string* error) {
    std::vector<std::string> files;
    size_t total = 0;
    if (!collect_text_files(o.inputs, &files, &total, error) ||
        !data_tool::check_inputs_not_outputs(o.out, true, files, error) ||
        !data_tool::drop_non_text("bert_data", o.inputs, o.quiet, &files, &total, error))
        return false;
    if (files.empty()) return fail(error, "no input files (folders contribute their *.txt files)");
    if (total == 0) return fail(error, "the inputs hold no text");
    std::vector<bool> continuation(wp.vocab_size());
    for (int id = 0; id < wp.vocab_size(); id++) continuation[id] = wp.token(id).compare(0, 2, "##") == 0;
    PendingShards pending(o, stats);
    ShardWriter val_out(wp, o, BertShardKind::MLM, "val", &pending, &stats->val),
        train_out(wp, o, BertShardKind::MLM, "train", &pending, &stats->train);
    Packer val(wp, continuation, o.max_len, &val_out), train(wp, continuation, o.max_len, &train_out);
    const size_t val_bytes = (size_t)(o.val_fraction * (double)total + 0.5);
    Progress progress;
    bool in_document = false;
    struct LineBuffer {  // getline()'s buffer
        char* p = nullptr;
        size_t cap = 0;
        ~LineBuffer() { free(p); }
    } buf;
    for (const std::string& path : files) {
        std::unique_ptr<FILE, int (*)(FILE*)> f(fopen(path.c_str(), "rb"), fclose);
        if (!f) return fail(error, "cannot read " + path + ": " + strerror(errno));
        ssize_t n;
        while ((n = getline(&buf.p, &buf.cap, f.get())) > 0) {
            const char* line = buf.p;
            size_t start = stats->bytes;
            stats->bytes += (size_t)n;
            if (blank(line, (size_t)n)) {
                if (in_document) stats->documents++;
                in_document = false;
                val.end_document();
                train.end_document();
                continue;
            }
            std::vector<int> ids = wp.encode(std::string_view(line, (size_t)n));
            if (ids.empty()) continue;  // only characters WordPiece drops
            in_document = true;
            if (!(start < val_bytes ? val : train).line(ids, error)) return false;
            progress.maybe(o, "sequences", stats->train.sequences + stats->val.sequences, stats->bytes, total);
        }
        if (ferror(f.get())) return fail(error, "cannot read " + path + ": " + strerror(errno));
        if (in_document) stats->documents++;
        in_document = false;
        val.end_document();
        train.end_document();
        stats->files++;
    }
    if (!val.flush(error) || !train.flush(error)) return false;
    if (stats->val.sequences + stats->train.sequences == 0)
        return fail(error, "the inputs hold no text (only blank lines or characters WordPiece drops)");
    // As classify: a run with no training data is a mistake (one line of input, --val-fraction 1),
    // not something to hand to the trainer as a lone val shard.
    if (stats->train.sequences == 0)
        return fail(error, "--val-fraction " + fraction_text(o.val_fraction) +
                               " leaves no training sequences: every line of text starts in the first " +
                               std::to_string(val_bytes) + " of the " + std::to_string(total) +
                               " input bytes, which go to val (give more text or a smaller --val-fraction)");
    if (!val_out.close(error) || !train_out.close(error) || !pending.commit(error)) return false;
    if (!o.quiet) data_tool::warn_leftovers("bert_data", {val_out.next_path(), train_out.next_path()});
    return true;
}

// One labeled text, tokenized.
struct Example {
    std::string label;
    std::vector<int> ids;  // [CLS] ... [SEP], truncated
    bool truncated;
    std::string where;  // FILE:LINE or FILE, for messages
    int label_id = -1;  // set once every split is read
};

inline std::string trim(std::string_view s) {
    size_t b = 0, e = s.size();
    while (b < e && (s[b] == ' ' || s[b] == '\t' || s[b] == '\r' || s[b] == '\n')) b++;
    while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r' || s[e - 1] == '\n')) e--;
    return std::string(s.substr(b, e - b));
}

// Tokenizes one example's text and appends it; false for an empty text or a bad label.
inline bool add_example(const WordPiece& wp, const Options& o, std::string label, std::string_view text,
                        const std::string& where, std::vector<Example>* out, std::string* error) {
    label = trim(label);
    if (label.empty()) return fail(error, where + ": empty label");
    if (label.find('\n') != std::string::npos) return fail(error, where + ": the label has a newline in it");
    if (trim(text).empty()) return fail(error, where + ": empty text");
    std::vector<int> ids = wp.encode(text);
    if (ids.empty()) return fail(error, where + ": the text has no tokens (only characters WordPiece drops)");
    size_t full = ids.size() + 2;
    WordPiece::Encoding e = wp.with_special_tokens(std::move(ids), nullptr, o.max_len);
    out->push_back(Example{std::move(label), std::move(e.ids), full > (size_t)o.max_len, where});
    return true;
}

// Reads a TSV or a JSONL file (a first non-blank character '{' means JSONL) into *out.
inline bool read_table(const WordPiece& wp, const Options& o, const std::string& path, std::vector<Example>* out,
                       Stats* stats, size_t total, Progress* progress, std::string* error) {
    std::vector<uint8_t> data;
    if (!read_whole_file(path, &data, error)) return false;
    std::string_view all((const char*)data.data(), data.size());
    if (all.substr(0, 3) == "\xEF\xBB\xBF") all.remove_prefix(3);  // a UTF-8 byte order mark
    size_t first = all.find_first_not_of(" \t\r\n");
    if (first == std::string_view::npos) return fail(error, path + ": no examples (the file is empty)");
    bool jsonl = all[first] == '{';
    int label_col = 0, text_col = 1;  // TSV columns
    bool header_checked = false;
    size_t before = out->size();
    for (size_t pos = 0, lineno = 1; pos < all.size(); lineno++) {
        size_t nl = all.find('\n', pos);
        std::string_view line = all.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
        pos = nl == std::string_view::npos ? all.size() : nl + 1;
        stats->bytes += line.size() + 1;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (trim(line).empty()) continue;
        std::string where = path + ":" + std::to_string(lineno);
        if (jsonl) {
            json::Value v;
            std::string why;
            if (!json::parse(line.data(), line.size(), &v, &why)) return fail(error, where + ": invalid JSON: " + why);
            if (v.type != json::Value::Object) return fail(error, where + ": expected a JSON object {\"label\": ..., \"text\": ...}");
            const json::Value* label = v.get("label");
            const json::Value* text = v.get("text") ? v.get("text") : v.get("sentence");
            if (!label) return fail(error, where + ": no \"label\" field");
            if (!text) return fail(error, where + ": no \"text\" field");
            if (text->type != json::Value::String) return fail(error, where + ": \"text\" must be a string");
            std::string name;
            if (label->type == json::Value::String) name = label->str;
            else if (label->type == json::Value::Number && label->is_int && label->integer >= 0) name = std::to_string(label->integer);
            else return fail(error, where + ": \"label\" must be a string or a non-negative integer");
            if (!add_example(wp, o, name, text->str, where, out, error)) return false;
        } else {
            std::vector<std::string_view> fields;
            for (size_t s = 0;;) {
                size_t tab = line.find('\t', s);
                fields.push_back(line.substr(s, tab == std::string_view::npos ? std::string_view::npos : tab - s));
                if (tab == std::string_view::npos) break;
                s = tab + 1;
            }
            if (!header_checked) {
                header_checked = true;
                int l = -1, t = -1;
                for (size_t k = 0; k < fields.size(); k++) {
                    std::string f = trim(fields[k]);
                    for (char& c : f) c = (char)tolower((unsigned char)c);
                    if (f == "label" && l < 0) l = (int)k;
                    if ((f == "text" || f == "sentence") && t < 0) t = (int)k;
                }
                if (l >= 0 && t >= 0) {
                    label_col = l;
                    text_col = t;
                    continue;
                }
            }
            if (label_col == 0 && text_col == 1) {  // no header: label, then the text (which may hold tabs)
                size_t tab = line.find('\t');
                if (tab == std::string_view::npos) return fail(error, where + ": no tab: expected label<TAB>text");
                if (!add_example(wp, o, std::string(line.substr(0, tab)), line.substr(tab + 1), where, out, error))
                    return false;
            } else {
                if ((int)fields.size() <= std::max(label_col, text_col))
                    return fail(error, where + ": " + std::to_string(fields.size()) + " fields, but the header puts " +
                                           "label in column " + std::to_string(label_col + 1) + " and text in column " +
                                           std::to_string(text_col + 1));
                if (!add_example(wp, o, std::string(fields[label_col]), fields[text_col], where, out, error))
                    return false;
            }
        }
        progress->maybe(o, "examples", out->size(), stats->bytes, total);
    }
    if (out->size() == before) return fail(error, path + ": no examples (only a header or blank lines)");
    stats->files++;
    return true;
}

// Reads one split of an aclImdb-style folder: dir/<label>/*.txt for every label folder (but unsup).
inline bool read_folder_split(const WordPiece& wp, const Options& o, const std::string& dir, std::vector<Example>* out,
                              Stats* stats, size_t total, Progress* progress, std::string* error) {
    namespace fs = std::filesystem;
    std::error_code ec;
    std::vector<std::string> labels;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
        if (it->is_directory() && it->path().filename() != "unsup") labels.push_back(it->path().filename().string());
    if (ec) return fail(error, "cannot list " + dir + ": " + ec.message());
    std::sort(labels.begin(), labels.end());
    if (labels.empty()) return fail(error, dir + ": no label folders (expected e.g. " + dir + "/pos/*.txt, " + dir + "/neg/*.txt)");
    for (const std::string& label : labels) {
        std::vector<std::string> files;
        for (fs::directory_iterator it(dir + "/" + label, ec), end; !ec && it != end; it.increment(ec))
            if (it->is_regular_file() && it->path().extension() == ".txt") files.push_back(it->path().string());
        if (ec) return fail(error, "cannot list " + dir + "/" + label + ": " + ec.message());
        if (files.empty()) return fail(error, dir + "/" + label + ": no *.txt files");
        std::sort(files.begin(), files.end());
        size_t unused_total = 0;
        if (!data_tool::drop_non_text("bert_data", {}, o.quiet, &files, &unused_total, error)) return false;
        if (files.empty()) return fail(error, dir + "/" + label + ": no text files");
        std::vector<uint8_t> data;
        for (const std::string& f : files) {
            if (!read_whole_file(f, &data, error)) return false;
            stats->bytes += data.size();
            stats->files++;
            if (!add_example(wp, o, label, std::string_view((const char*)data.data(), data.size()), f, out, error))
                return false;
            progress->maybe(o, "examples", out->size(), stats->bytes, total);
        }
    }
    return true;
}

// Whether a label is an integer class id (digits only); its value in *v.
inline bool integer_label(const std::string& s, long* v) {
    if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return false;
    *v = strtol(s.c_str(), nullptr, 10);
    return true;
}

inline bool run_classify(const Options& o, const WordPiece& wp, Stats* stats, std::string* error) {
    namespace fs = std::filesystem;
    const std::string& in = o.inputs[0];
    std::error_code ec;
    fs::file_status st = fs::status(in, ec);
    if (ec || !fs::exists(st)) return fail(error, "cannot read " + in + ": " + (ec ? ec.message() : "no such file or directory"));
    bool folder = fs::is_directory(st);
    if (folder && !o.val_input.empty()) return fail(error, "--val is for a TSV/JSONL input: a folder's test/ is its val split");
    if (!folder) {
        std::vector<std::string> named = {in};
        if (!o.val_input.empty()) named.push_back(o.val_input);
        for (const std::string& path : named) {
            std::string why = data_tool::not_text(path);
            if (!why.empty()) return fail(error, path + " is not text: " + why);
        }
        if (!data_tool::check_inputs_not_outputs(o.out, false, named, error)) return false;
    }
    // Sizes, for progress.
    size_t total = 0;
    if (folder) {
        for (fs::recursive_directory_iterator it(in, ec), end; !ec && it != end; it.increment(ec))
            if (it->is_regular_file() && it->path().extension() == ".txt") total += it->file_size(ec);
    } else {
        total = fs::file_size(in, ec) + (o.val_input.empty() ? 0 : fs::file_size(o.val_input, ec));
    }
    Progress progress;
    std::vector<Example> train, val;
    bool have_val = false;  // a val split of its own (not cut from the training input)
    if (folder) {
        if (!fs::is_directory(in + "/train"))
            return fail(error, in + ": a folder input needs train/<label>/*.txt (aclImdb's layout), and has no train/");
        if (!read_folder_split(wp, o, in + "/train", &train, stats, total, &progress, error)) return false;
        if (fs::is_directory(in + "/test")) {
            if (!read_folder_split(wp, o, in + "/test", &val, stats, total, &progress, error)) return false;
            have_val = true;
        }
    } else {
        if (!read_table(wp, o, in, &train, stats, total, &progress, error)) return false;
        if (!o.val_input.empty()) {
            if (!read_table(wp, o, o.val_input, &val, stats, total, &progress, error)) return false;
            have_val = true;
        }
    }
    if (!have_val && o.val_fraction > 0) {  // every round(1/F)-th example, evenly spread
        std::vector<Example> rest;
        for (size_t i = 0; i < train.size(); i++) {
            bool to_val = (size_t)((double)(i + 1) * o.val_fraction) > (size_t)((double)i * o.val_fraction);
            (to_val ? val : rest).push_back(std::move(train[i]));
        }
        train.swap(rest);
        if (train.empty()) return fail(error, "--val-fraction " + fraction_text(o.val_fraction) + " leaves no training examples");
        if (val.empty() && !o.quiet)
            printf("bert_data: warning: --val-fraction %s of %zu examples is none: no _val.bin is written (train with "
                   "-j '', or give more examples or a larger --val-fraction)\n",
                   fraction_text(o.val_fraction).c_str(), train.size());
    }

    // Label ids: --labels, else integers as themselves, else names in sorted order (from the
    // examples the training split was read from).
    std::vector<std::string> names = o.labels;
    std::map<std::string, int> id;
    bool integers = false;
    if (names.empty()) {
        std::set<std::string> seen;
        for (const std::vector<Example>* split : {&train, have_val ? nullptr : &val})
            if (split)
                for (const Example& e : *split) seen.insert(e.label);
        long v, most = -1;
        integers = true;
        for (const std::string& s : seen) {
            integers = integers && integer_label(s, &v);
            if (integers) most = std::max(most, v);
        }
        if (integers && most >= 65536) {
            const Example& e = *std::find_if(train.begin(), train.end(), [&](const Example& x) {
                long w;
                return integer_label(x.label, &w) && w == most;
            });
            return fail(error, e.where + ": integer label " + e.label + " is too large (integer labels are class ids, "
                                         "at most 65535; use --labels for names)");
        }
        if (integers) {
            for (long k = 0; k <= most; k++) names.push_back(std::to_string(k));
        } else {
            names.assign(seen.begin(), seen.end());
        }
    }
    for (size_t k = 0; k < names.size(); k++) id[names[k]] = (int)k;
    auto label_id = [&](const Example& e, int* out) {
        long v;
        auto it = id.find(e.label);
        if (it != id.end()) *out = it->second;
        else if (integers && integer_label(e.label, &v) && v < (long)names.size()) *out = (int)v;
        else {
            std::string known;
            for (size_t k = 0; k < names.size() && k < 20; k++) known += (k ? ", " : "") + names[k];
            if (names.size() > 20) known += ", ...";
            return fail(error, e.where + ": unknown label '" + e.label + "' (" +
                                   (o.labels.empty() ? "the training labels are " : "--labels: ") + known + ")");
        }
        return true;
    };
    // Every split's labels before any shard is written: an unknown label in val must not cost a good
    // _train.bin from an earlier run (and PendingShards keeps a failed write from replacing one).
    for (std::vector<Example>* split : {&train, &val})
        for (Example& e : *split)
            if (!label_id(e, &e.label_id)) return false;
    stats->label_names = names;
    stats->train.per_label.assign(names.size(), 0);
    stats->val.per_label.assign(names.size(), 0);
    PendingShards pending(o, stats);
    std::string stale_val;  // an earlier run's val shard when this run has none
    for (int s = 0; s < 2; s++) {
        std::vector<Example>& split = s == 0 ? train : val;
        SplitStats& ss = s == 0 ? stats->train : stats->val;
        ShardWriter out(wp, o, BertShardKind::Classify, s == 0 ? "train" : "val", &pending, &ss);
        for (const Example& e : split) {
            if (!out.add(e.ids, e.label_id, error)) return false;
            ss.per_label[e.label_id]++;
            ss.truncated += e.truncated;
        }
        if (!out.close(error, names)) return false;
        if (s == 1 && split.empty() && fs::exists(out.next_path())) stale_val = out.next_path();
    }
    if (!pending.commit(error)) return false;
    if (!stale_val.empty() && !o.quiet)
        printf("bert_data: warning: %s is left from an earlier run (this one has no val split): delete it\n",
               stale_val.c_str());
    stats->documents = train.size() + val.size();
    return true;
}

// Builds the shards o asks for; false with a one-line reason on any error.
inline bool run(const Options& o, Stats* stats, std::string* error) {
    auto t0 = std::chrono::steady_clock::now();
    if (!data_tool::check_out_prefix(o.out, error)) return false;
    WordPiece wp(WordPiece::Options{o.lower_case, std::nullopt, true, 100});
    if (!wp.load(o.vocab, error)) return false;
    if (wp.vocab_size() > 65536)
        return fail(error, o.vocab + ": " + std::to_string(wp.vocab_size()) +
                               " tokens do not fit the shards' uint16 token ids (65536 at most)");
    bool ok = o.mode == Mode::MLM ? run_mlm(o, wp, stats, error) : run_classify(o, wp, stats, error);
    stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return ok;
}

// Prints what a run made (sequences, tokens, lengths, labels).
inline void print_summary(const Options& o, const Stats& s) {
    for (int k = 0; k < 2; k++) {
        const SplitStats& ss = k == 0 ? s.train : s.val;
        if (ss.sequences == 0) continue;
        printf("bert_data: %-5s %zu sequences, %zu tokens, mean length %.1f, longest %zu", k == 0 ? "train" : "val",
               ss.sequences, ss.tokens, (double)ss.tokens / ss.sequences, ss.longest);
        if (o.mode == Mode::Classify) {
            printf(", %zu truncated to --max-len %d\n", ss.truncated, o.max_len);
            size_t most = *std::max_element(ss.per_label.begin(), ss.per_label.end());
            printf("bert_data:       labels:");
            for (size_t l = 0; l < s.label_names.size(); l++)
                printf(" %zu %s (%zu)", l, s.label_names[l].c_str(), ss.per_label[l]);
            printf("; majority class %.1f%%\n", 100.0 * most / ss.sequences);
        } else {
            printf("\n");
        }
    }
    printf("bert_data: %zu files, %.2f MB, %zu %s in %.2f s (%.1f MB/s)\n", s.files, s.bytes / 1e6, s.documents,
           o.mode == Mode::MLM ? "documents" : "examples", s.seconds, s.bytes / 1e6 / std::max(s.seconds, 1e-9));
}

// The command: parses argv, runs, prints the summary (unless quiet); returns the exit code (0, or 1
// after one "error: ..." line).
inline int main_entry(int argc, char** argv) {
    auto summary = [](const Options& o, const Stats& s) {
        if (!o.quiet) print_summary(o, s);
    };
    return data_tool::run_main<Options, Stats>(argc, argv, USAGE, parse_args, run, summary);
}

}  // namespace bert_data

#ifndef BERT_DATA_NO_MAIN
int main(int argc, char** argv) { return bert_data::main_entry(argc, argv); }
#endif
