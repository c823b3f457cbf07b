// llmc/bert_dataloader.h — BERT's data: the shard format dev/data/bert_data.cpp writes (WordPiece
// sequences for MLM pretraining, or labeled sequences for classification) and the loader that makes
// train_bert.cu's batches of them: split across ranks, shuffled every epoch, bucketed by length and
// padded only to a multiple of 8 of the longest sequence, masked anew every epoch for MLM, and
// resumable batch for batch; also the widest sequence a set of shards holds (bert_shards_max_len)
// and --bench's synthetic shard (write_bench_shard). Host C++17 and the standard library only (no
// CUDA): the tool and the tests include it too.
//
// Usage (train_bert.cu; B sequences per batch on this rank, T the model's sequence length):
//
//   BertDataLoader::Options lo;
//   lo.B = B; lo.T = T; lo.rank = rank; lo.world = world; lo.seed = seed; lo.vocab_size = V;
//   BertDataLoader train("dev/data/bert/genre_train.bin", lo);      // a glob: "data/x_train_*.bin"
//   lo.eval = true;
//   BertDataLoader val("dev/data/bert/genre_val.bin", lo);
//   model.allocate_activations(B, T, train.max_masked_rows());       // MLM: the masked rows' bound
//   BertHead head = train.is_mlm() ? BertHead::MLM : BertHead::Classify;
//   for (...) {                                                      // a batch is B x train.T() tokens
//       model.set_batch(train.inputs(), train.token_types(), train.valid_len(), train.targets(), head,
//                       true, train.T());
//       ...; train.next_batch();
//   }
//   val.reset();                                                     // an eval pass: every sequence once
//   for (size_t k = 0; k < val.batches_per_epoch(); k++, val.next_batch()) {
//       model.set_batch(val.inputs(), ..., head, false, val.T());    // count rows [0, val.num_real())
//   }
//
// The current batch (what inputs() etc. return) is there from construction on; next_batch() moves to
// the next one; position() is the index of the current batch counted from the start of epoch 0, and
// seek(position) recreates it exactly, masks included (a checkpoint stores position() and a resumed
// run reads bit-identical batches). There is no prefetch thread: making a batch is a copy of a few
// thousand ids plus the masking, microseconds next to a training step.
//
// A batch, rows b in [0, B), width Tb = T() (a multiple of 8 no narrower than the batch's longest
// sequence, capped at the model's T; Options::pad_to_T makes every batch T wide):
//   inputs (B,Tb)       token ids, [PAD] after each sequence's valid_len (MLM: already masked);
//   token_types (B,Tb)  all 0 (single-segment sequences);
//   valid_len (B)       the tokens of each sequence, [CLS] and [SEP] included, in [2, Tb];
//   targets             MLM: (B,Tb) the original token at each masked position, -100 elsewhere
//                       (transformers' ignore index); classification: (B) labels in [0, num_labels);
//   masked_rows()       MLM: how many targets are not -100 (at most max_masked_rows());
//   num_real()          rows of real data: B, except in an eval pass's last batches, whose rows from
//                       num_real() on are filler ([CLS] [SEP], valid_len 2, MLM targets -100,
//                       classification label 0) to be left out of losses and accuracies; on a
//                       rank whose share of a split's last global batch is empty it is 0 (skip
//                       such a batch, or run it and count nothing).
// The model runs at the batch's width (set_batch's width argument): activations allocated for (B,T)
// hold any narrower batch.
//
// Shard format (little-endian), one file per shard:
//   header      256 x int32: [0] magic 0x54524542 (the bytes "BERT"), [1] version 1, [2] kind
//               (1 MLM, 2 classification), [3] number of sequences N >= 1, [4] max_len (no sequence
//               is longer; >= 3), [5] vocab_size of the WordPiece vocabulary the ids come from
//               (<= 65536), [6] num_labels (classification: >= 1; MLM: 0), [7] total tokens (the sum of
//               the lengths), [8] label-name bytes (classification; MLM: 0), [9..13] the ids of [CLS]
//               [SEP] [PAD] [MASK] [UNK], [14] flags (bit 0: text was lower-cased), [15..16] the
//               vocabulary's fingerprint (WordPiece::fingerprint(), low word first; 0: not recorded,
//               as in shards written before it was), [17..255] zero.
//   tokens      total x uint16: the sequences one after the other, each [CLS] ... [SEP]
//   lengths     N x int32: each sequence's length, in [2, max_len]
//   labels      N x int32 (classification only): each sequence's label, in [0, num_labels)
//   label names num_labels names, each followed by '\n' (classification only): label k's name,
//               so an eval can print "tragedy" rather than 1
// The file size must be exactly what the header says. Every rule above is checked when a shard is
// read (parse_bert_shard: ids below vocab_size, lengths and their sum, [CLS] first and [SEP] last,
// labels in range, names well-formed), and a bad shard stops the loader with one line naming the file
// and the problem.
//
// Batching. Let G = world*B. Each epoch reads the shards (in an order shuffled per epoch), and in
// each shard: the sequences in a random order (seeded by seed, epoch, shard); the last N mod G of that
// order are left out this epoch; the rest is cut into pools of bucket_pool*G sequences, each pool
// stably sorted by length and cut into "global batches" of G sequences, and the global batches of the
// shard are shuffled (Options::shuffle off: file order, pools sorted, batches in order). Rank r's batch is rows [r*B, (r+1)*B) of the current global batch: the ranks
// read disjoint sequences, and together exactly what one rank with world*B reads (each pads to its own
// longest row). An eval loader reads every sequence once per pass: no shuffling, all of a shard sorted
// by length (padding is then minimal), the last global batch filled up with filler rows.
//
// Dynamic masking (MLM). Each sequence is masked from a random stream seeded by (seed, epoch,
// sequence) — the sequence's index among all the shards in file order — so a mask does not depend on
// B, world or the batch a sequence lands in, and changes every epoch; an eval loader uses one fixed
// stream per sequence (the same masks every pass). Of a sequence's n maskable tokens (all but [CLS]
// [SEP] [PAD] [MASK] [UNK]) it masks k = floor(mask_rate*n + u), u uniform in [0,1) — mask_rate*n on
// average, as fairseq's RoBERTa masking — chosen uniformly without replacement; each masked token
// becomes [MASK] with probability mask_token (0.8), a uniformly random id in [0, vocab_size) with
// probability random_token (0.1), and stays itself otherwise (transformers' DataCollatorForLanguage-
// Modeling's split). Since n <= L-2 for the longest sequence L = min(T, max_len), k never exceeds
// ceil(mask_rate*(L-2)): max_masked_rows() = B times that (or times Options::max_predictions if set:
// a sequence that draws more keeps a uniformly random subset of max_predictions of them).
#pragma once
#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <string>
#include <vector>

#include "fatal.h"
#include "file_io.h"

constexpr int32_t BERT_SHARD_MAGIC = 0x54524542;  // "BERT" in a little-endian dump
constexpr int32_t BERT_SHARD_VERSION = 1;
constexpr int BERT_SHARD_HEADER_INTS = 256;
constexpr int BERT_IGNORE_INDEX = -100;  // targets[] where nothing is predicted
enum class BertShardKind : int32_t { MLM = 1, Classify = 2 };

// A shard in memory: what write_bert_shard() writes and parse_bert_shard() reads back.
struct BertShard {
    BertShardKind kind = BertShardKind::MLM;
    int max_len = 0;
    int vocab_size = 0;
    int cls_id = 0, sep_id = 0, pad_id = 0, mask_id = 0, unk_id = 0;
    bool lower_case = true;
    uint64_t vocab_fingerprint = 0;        // WordPiece::fingerprint() of the vocabulary (0: not recorded)
    std::vector<uint16_t> tokens;          // every sequence, concatenated
    std::vector<int32_t> lengths;          // (N)
    std::vector<int32_t> labels;           // (N) classification only
    std::vector<std::string> label_names;  // (num_labels) classification only
    std::vector<int64_t> offsets;          // (N+1) where each sequence starts in tokens (filled on read)

    size_t num_sequences() const { return lengths.size(); }
    int num_labels() const { return (int)label_names.size(); }
};

namespace bert_shard_detail {
enum Field { MAGIC, VERSION, KIND, NUM_SEQS, MAX_LEN, VOCAB, NUM_LABELS, TOTAL, NAME_BYTES, CLS, SEP, PAD, MASK, UNK,
             FLAGS, FINGERPRINT_LO, FINGERPRINT_HI, NUM_FIELDS };

inline bool fail(std::string* err, const std::string& why) {
    *err = why;
    return false;
}
}  // namespace bert_shard_detail

// Checks a shard's 1024-byte header against the file size and fills *s's scalars (not its arrays);
// *num_seqs and *total get the counts. False with a one-line reason.
inline bool parse_bert_shard_header(const uint8_t* bytes, size_t file_size, BertShard* s, size_t* num_seqs,
                                    size_t* total, std::string* err) {
    using namespace bert_shard_detail;
    const size_t header_bytes = BERT_SHARD_HEADER_INTS * 4;
    if (file_size < header_bytes)
        return fail(err, "too short for a BERT shard header (" + std::to_string(file_size) + " of " +
                             std::to_string(header_bytes) + " bytes)");
    int32_t h[BERT_SHARD_HEADER_INTS];
    memcpy(h, bytes, sizeof(h));
    auto num = [](int32_t v) { return std::to_string(v); };
    if (h[MAGIC] != BERT_SHARD_MAGIC) {
        if (h[MAGIC] == 20240520) return fail(err, "a GPT-2 token shard (magic 20240520), not a BERT shard");
        return fail(err, "bad magic " + num(h[MAGIC]) + " (a BERT shard starts with the bytes \"BERT\")");
    }
    if (h[VERSION] != BERT_SHARD_VERSION)
        return fail(err, "unsupported BERT shard version " + num(h[VERSION]) + " (this reader knows 1)");
    if (h[KIND] != (int32_t)BertShardKind::MLM && h[KIND] != (int32_t)BertShardKind::Classify)
        return fail(err, "unknown kind " + num(h[KIND]) + " (1: MLM, 2: classification)");
    s->kind = (BertShardKind)h[KIND];
    bool cls = s->kind == BertShardKind::Classify;
    if (h[NUM_SEQS] < 1) return fail(err, "sequence count " + num(h[NUM_SEQS]) + " (must be at least 1)");
    if (h[MAX_LEN] < 3) return fail(err, "max_len " + num(h[MAX_LEN]) + " (must be at least 3)");
    if (h[VOCAB] < 5 || h[VOCAB] > 65536)
        return fail(err, "vocab_size " + num(h[VOCAB]) + " (must be in [5, 65536]: uint16 token ids)");
    if (cls ? h[NUM_LABELS] < 1 : h[NUM_LABELS] != 0)
        return fail(err, "num_labels " + num(h[NUM_LABELS]) + (cls ? " (a classification shard needs at least 1)"
                                                                     : " (an MLM shard has none: must be 0)"));
    if (h[TOTAL] < 2 * (int64_t)h[NUM_SEQS] || h[TOTAL] > (int64_t)h[NUM_SEQS] * h[MAX_LEN])
        return fail(err, "total of " + num(h[TOTAL]) + " tokens is impossible for " + num(h[NUM_SEQS]) +
                             " sequences of 2 to " + num(h[MAX_LEN]) + " tokens");
    if (cls ? h[NAME_BYTES] < 2 * h[NUM_LABELS] : h[NAME_BYTES] != 0)
        return fail(err, "label-name bytes " + num(h[NAME_BYTES]) +
                             (cls ? " (too few for num_labels names of at least one byte and a newline)"
                                  : " (an MLM shard has no label names: must be 0)"));
    const char* special[] = {"[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]"};
    for (int k = 0; k < 5; k++) {
        int32_t id = h[CLS + k];
        if (id < 0 || id >= h[VOCAB])
            return fail(err, std::string("id of ") + special[k] + " " + num(id) + " is outside the vocabulary [0, " +
                                 num(h[VOCAB]) + ")");
        for (int j = 0; j < k; j++)
            if (h[CLS + j] == id)
                return fail(err, std::string(special[j]) + " and " + special[k] + " have the same id " + num(id));
    }
    if (h[FLAGS] & ~1) return fail(err, "unknown flags " + num(h[FLAGS]) + " (bit 0 is the only one)");
    for (int i = NUM_FIELDS; i < BERT_SHARD_HEADER_INTS; i++)
        if (h[i] != 0)
            return fail(err, "header int " + std::to_string(i) + " is " + num(h[i]) + " (reserved: must be 0)");
    s->max_len = h[MAX_LEN];
    s->vocab_size = h[VOCAB];
    s->cls_id = h[CLS];
    s->sep_id = h[SEP];
    s->pad_id = h[PAD];
    s->mask_id = h[MASK];
    s->unk_id = h[UNK];
    s->lower_case = h[FLAGS] & 1;
    s->vocab_fingerprint = (uint64_t)(uint32_t)h[FINGERPRINT_LO] | (uint64_t)(uint32_t)h[FINGERPRINT_HI] << 32;
    *num_seqs = (size_t)h[NUM_SEQS];
    *total = (size_t)h[TOTAL];
    size_t expected = header_bytes + 2 * *total + 4 * *num_seqs * (cls ? 2 : 1) + (size_t)h[NAME_BYTES];
    if (file_size != expected)
        return fail(err, "file is " + std::to_string(file_size) + " bytes but its header promises " +
                             std::to_string(expected) + " (" + num(h[NUM_SEQS]) + " sequences, " + num(h[TOTAL]) +
                             " tokens" + (cls ? ", labels and " + num(h[NAME_BYTES]) + " bytes of label names" : "") +
                             "): truncated or corrupt");
    return true;
}

// Parses and checks a whole shard held in memory into *s. False with a one-line reason (the first
// problem found); nothing exits, so tests and fuzzers can drive it.
inline bool parse_bert_shard(const uint8_t* data, size_t size, BertShard* s, std::string* err) {
    using namespace bert_shard_detail;
    size_t n, total;
    if (!parse_bert_shard_header(data, size, s, &n, &total, err)) return false;
    int32_t h[BERT_SHARD_HEADER_INTS];
    memcpy(h, data, sizeof(h));
    bool cls = s->kind == BertShardKind::Classify;
    const uint8_t* p = data + BERT_SHARD_HEADER_INTS * 4;
    s->tokens.resize(total);
    memcpy(s->tokens.data(), p, 2 * total);
    p += 2 * total;
    s->lengths.resize(n);
    memcpy(s->lengths.data(), p, 4 * n);
    p += 4 * n;
    s->labels.assign(cls ? n : 0, 0);
    if (cls) {
        memcpy(s->labels.data(), p, 4 * n);
        p += 4 * n;
    }
    s->offsets.assign(n + 1, 0);
    for (size_t i = 0; i < n; i++) {
        int32_t len = s->lengths[i];
        if (len < 2 || len > s->max_len)
            return fail(err, "sequence " + std::to_string(i) + " has length " + std::to_string(len) +
                                 " (must be in [2, max_len " + std::to_string(s->max_len) + "]: [CLS] ... [SEP])");
        s->offsets[i + 1] = s->offsets[i] + len;
        if ((size_t)s->offsets[i + 1] > total)
            return fail(err, "the lengths of sequences 0.." + std::to_string(i) + " add up to more than the " +
                                 std::to_string(total) + " tokens of the header");
    }
    if ((size_t)s->offsets[n] != total)
        return fail(err, "the lengths add up to " + std::to_string(s->offsets[n]) + " tokens, the header says " +
                             std::to_string(total));
    for (size_t i = 0; i < total; i++)
        if (s->tokens[i] >= s->vocab_size)
            return fail(err, "token id " + std::to_string(s->tokens[i]) + " at position " + std::to_string(i) +
                                 " is outside the vocabulary (size " + std::to_string(s->vocab_size) + ")");
    for (size_t i = 0; i < n; i++) {
        if (s->tokens[s->offsets[i]] != s->cls_id)
            return fail(err, "sequence " + std::to_string(i) + " does not start with [CLS] (id " +
                                 std::to_string(s->cls_id) + ") but with " + std::to_string(s->tokens[s->offsets[i]]));
        if (s->tokens[s->offsets[i + 1] - 1] != s->sep_id)
            return fail(err, "sequence " + std::to_string(i) + " does not end with [SEP] (id " +
                                 std::to_string(s->sep_id) + ") but with " +
                                 std::to_string(s->tokens[s->offsets[i + 1] - 1]));
        if (cls && (s->labels[i] < 0 || s->labels[i] >= h[NUM_LABELS]))
            return fail(err, "label " + std::to_string(s->labels[i]) + " of sequence " + std::to_string(i) +
                                 " is outside [0, num_labels " + std::to_string(h[NUM_LABELS]) + ")");
    }
    s->label_names.clear();
    const char* names = (const char*)p;
    size_t name_bytes = (size_t)h[NAME_BYTES];
    for (size_t start = 0; start < name_bytes;) {
        const char* nl = (const char*)memchr(names + start, '\n', name_bytes - start);
        if (!nl) return fail(err, "the label names do not end with a newline");
        size_t len = nl - (names + start);
        if (len == 0) return fail(err, "label name " + std::to_string(s->label_names.size()) + " is empty");
        s->label_names.emplace_back(names + start, len);
        start += len + 1;
    }
    if (s->label_names.size() != (size_t)h[NUM_LABELS])
        return fail(err, std::to_string(s->label_names.size()) + " label names for num_labels " +
                             std::to_string(h[NUM_LABELS]));
    for (size_t k = 0; k < s->label_names.size(); k++)
        for (size_t j = 0; j < k; j++)
            if (s->label_names[j] == s->label_names[k])
                return fail(err, "label name '" + s->label_names[k] + "' appears twice (labels " + std::to_string(j) +
                                     " and " + std::to_string(k) + ")");
    return true;
}

// Reads and checks the shard at path; false with "PATH: reason".
inline bool read_bert_shard(const std::string& path, BertShard* s, std::string* err) {
    std::vector<uint8_t> data;
    if (!read_whole_file(path, &data, err)) return false;
    if (!parse_bert_shard(data.data(), data.size(), s, err)) {
        *err = path + ": " + *err;
        return false;
    }
    return true;
}

// Writes s (tokens, lengths, labels, label names and scalars; offsets unused) as a shard file at path.
// It does not check the contents: the writer (dev/data/bert_data.cpp) builds them valid, and tests
// write invalid ones on purpose. False with "cannot write PATH: reason".
inline bool write_bert_shard(const std::string& path, const BertShard& s, std::string* err) {
    using namespace bert_shard_detail;
    bool cls = s.kind == BertShardKind::Classify;
    std::string names;
    for (const std::string& name : s.label_names) names += name + "\n";
    int32_t h[BERT_SHARD_HEADER_INTS] = {};
    h[MAGIC] = BERT_SHARD_MAGIC;
    h[VERSION] = BERT_SHARD_VERSION;
    h[KIND] = (int32_t)s.kind;
    h[NUM_SEQS] = (int32_t)s.lengths.size();
    h[MAX_LEN] = s.max_len;
    h[VOCAB] = s.vocab_size;
    h[NUM_LABELS] = (int32_t)s.label_names.size();
    h[TOTAL] = (int32_t)s.tokens.size();
    h[NAME_BYTES] = (int32_t)names.size();
    h[CLS] = s.cls_id;
    h[SEP] = s.sep_id;
    h[PAD] = s.pad_id;
    h[MASK] = s.mask_id;
    h[UNK] = s.unk_id;
    h[FLAGS] = s.lower_case ? 1 : 0;
    h[FINGERPRINT_LO] = (int32_t)(uint32_t)s.vocab_fingerprint;
    h[FINGERPRINT_HI] = (int32_t)(uint32_t)(s.vocab_fingerprint >> 32);
    FILE* f = fopen(path.c_str(), "wb");
    if (!f) return fail(err, "cannot write " + path + ": " + strerror(errno));
    bool ok = fwrite(h, sizeof(h), 1, f) == 1;
    ok = ok && fwrite(s.tokens.data(), 2, s.tokens.size(), f) == s.tokens.size();
    ok = ok && fwrite(s.lengths.data(), 4, s.lengths.size(), f) == s.lengths.size();
    if (cls) ok = ok && fwrite(s.labels.data(), 4, s.labels.size(), f) == s.labels.size();
    ok = ok && fwrite(names.data(), 1, names.size(), f) == names.size();
    int saved = errno;
    if (fclose(f) != 0 && ok) saved = errno, ok = false;
    if (!ok) return fail(err, "cannot write " + path + ": " + strerror(saved));
    return true;
}

// The loader's fatal error: one line "error: ..." and exit (a bad shard is not worth training on).
[[noreturn]] inline void bert_data_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void bert_data_error(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_line_exit(EXIT_FAILURE, fmt, ap);  // "rank R/W: " instead of "error: " when several
}

// splitmix64: the loader's random numbers, the same on every platform (std::shuffle's are not), from
// a state that mixes its keys (seed, epoch, shard or sequence, purpose).
struct BertRng {
    uint64_t state;
    explicit BertRng(std::initializer_list<uint64_t> keys) : state(0x5EED5EED5EED5EEDull) {
        for (uint64_t k : keys) {
            state ^= k;
            next();
        }
    }
    uint64_t next() {
        uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }  // [0,1)
    uint64_t below(uint64_t n) { return (uint64_t)(uniform() * (double)n); }   // [0,n), n < 2^53
    template <class V>
    void shuffle(V* v) {  // Fisher-Yates
        for (size_t i = v->size(); i > 1; i--) std::swap((*v)[i - 1], (*v)[below(i)]);
    }
};

class BertDataLoader {
  public:
    struct Options {
        int B = 0;                 // sequences per batch on this rank
        int T = 0;                 // the model's length: no batch is wider; a longer sequence is cut to
                                   // its first T-1 tokens and its [SEP]
        int rank = 0, world = 1;   // this process among world data-parallel ones
        uint64_t seed = 42;        // order, buckets and masks
        bool eval = false;         // an eval pass: every sequence once, fixed order and masks, filler rows
        bool shuffle = true;       // training: a new order every epoch (false: file order)
        bool bucket = true;        // length bucketing (false: batches in the (shuffled) order as they come)
        int bucket_pool = 64;      // global batches per pool sorted by length
        bool pad_to_T = false;     // every batch T wide (for a model that cannot change its width)
        int vocab_size = 0;        // the model's vocabulary: shards from a larger one are refused (0: no check)
        double mask_rate = 0.15;   // MLM: fraction of the maskable tokens predicted
        double mask_token = 0.8;   // of those: replaced by [MASK]...
        double random_token = 0.1; // ...by a random id; the rest stay unchanged
        int max_predictions = 0;   // MLM: masked tokens per sequence at most (0: ceil(mask_rate*(L-2)))
    };

    // Opens every shard matching `pattern` (a glob; a file name is one), checks their headers and that
    // they agree with each other and with o, and makes batch 0 of epoch 0 current. Exits with one line
    // naming the file and the problem on bad input.
    BertDataLoader(const std::string& pattern, const Options& o) : o_(o) {
        if (o.B < 1 || o.T < 3 || o.world < 1 || o.rank < 0 || o.rank >= o.world || o.bucket_pool < 1)
            bert_data_error("BertDataLoader: need B >= 1, T >= 3, 0 <= rank < world, bucket_pool >= 1 (got B=%d T=%d "
                            "rank=%d world=%d bucket_pool=%d)", o.B, o.T, o.rank, o.world, o.bucket_pool);
        if (!(o.mask_rate >= 0 && o.mask_rate <= 1) || !(o.mask_token >= 0) || !(o.random_token >= 0) ||
            !(o.mask_token + o.random_token <= 1) || o.max_predictions < 0)
            bert_data_error("BertDataLoader: need mask_rate in [0,1], mask_token, random_token >= 0 with sum <= 1, "
                            "max_predictions >= 0 (got %g, %g, %g, %d)", o.mask_rate, o.mask_token, o.random_token,
                            o.max_predictions);
        std::vector<std::string> matched;
        glob_t g;
        if (glob(pattern.c_str(), 0, nullptr, &g) == 0) {
            for (size_t i = 0; i < g.gl_pathc; i++) matched.push_back(g.gl_pathv[i]);
            globfree(&g);
        }
        std::sort(matched.begin(), matched.end());
        if (matched.empty()) bert_data_error("no BERT shards match '%s'", pattern.c_str());
        const size_t G = (size_t)o.world * o.B;
        int max_len = 0;
        std::string first_names;  // the first shard's label names, as stored
        // A training shard with too few sequences for one batch (often a dataset's last) is skipped with
        // a warning while other shards hold batches; when none does, that is an error.
        std::vector<std::string> skipped;  // "PATH: N sequences, too few for one batch (...)"
        for (const std::string& path : matched) {
            BertShard s;
            size_t n, total;
            std::string names;
            read_header(path, &s, &n, &total, &names);
            if (path == matched[0]) info_ = s, first_names = names;
            std::string why;
            if (s.kind != info_.kind) why = "its kind (MLM or classification) differs from " + matched[0] + "'s";
            else if (names != first_names)
                why = "its labels differ from " + matched[0] + "'s (the same names in the same order are needed)";
            else if (s.vocab_size != info_.vocab_size || s.cls_id != info_.cls_id || s.sep_id != info_.sep_id ||
                     s.pad_id != info_.pad_id || s.mask_id != info_.mask_id || s.unk_id != info_.unk_id)
                why = "built with another vocabulary than " + matched[0] + " (vocab_size or special ids differ)";
            else if (s.vocab_fingerprint && info_.vocab_fingerprint && s.vocab_fingerprint != info_.vocab_fingerprint)
                why = "built with another vocabulary than " + matched[0] + " (the same size, other tokens: their "
                      "fingerprints differ)";
            if (!info_.vocab_fingerprint) info_.vocab_fingerprint = s.vocab_fingerprint;
            if (!why.empty()) bert_data_error("%s: %s", path.c_str(), why.c_str());
            if (o.vocab_size > 0 && s.vocab_size > o.vocab_size)
                bert_data_error("%s: built with a vocabulary of %d tokens, the model has %d", path.c_str(),
                                s.vocab_size, o.vocab_size);
            if (!o.eval && n < G) {
                skipped.push_back(path + ": " + std::to_string(n) + " sequences, too few for one batch (B=" +
                                  std::to_string(o.B) + " x " + std::to_string(o.world) +
                                  (o.world > 1 ? " ranks" : " rank") + " = " + std::to_string(G) + ")");
                continue;
            }
            files_.push_back(path);
            max_len = std::max(max_len, s.max_len);
            first_seq_.push_back(total_seqs_);
            total_seqs_ += n;
            counts_.push_back(n);
            batches_.push_back(o.eval ? (n + G - 1) / G : n / G);
        }
        std::string none = report_skipped_shards(skipped, files_.size(), matched.size(), o.rank);
        if (!none.empty()) bert_data_error("%s", none.c_str());
        info_.max_len = max_len;
        // The label names come with the data, which is read lazily: the first shard's now.
        if (info_.kind == BertShardKind::Classify) {
            load_shard(0);
            info_.label_names = shard_.label_names;
        }
        longest_ = std::min(o.T, max_len);
        int bound = (int)std::ceil(o.mask_rate * (longest_ - 2));
        per_seq_cap_ = o.max_predictions > 0 ? std::min(o.max_predictions, bound) : bound;
        reset();
    }

    // Back to the first batch of epoch 0.
    void reset() { seek(0); }

    // Makes batch number `position` (counted from 0 at the start of epoch 0, across epochs) the
    // current one, exactly as if next_batch() had been called that many times after reset().
    void seek(uint64_t position) {
        size_t per_epoch = batches_per_epoch();
        epoch_ = position / per_epoch;
        size_t rest = position % per_epoch;
        plan_epoch();
        order_pos_ = 0;
        while (rest >= batches_[shard_order_[order_pos_]]) rest -= batches_[shard_order_[order_pos_++]];
        plan_shard(shard_order_[order_pos_]);
        batch_pos_ = rest;
        position_ = position;
        make_batch();
    }

    // Makes the next batch current (the first of the next epoch after the last of one).
    void next_batch() {
        if (++batch_pos_ == plan_batches_.size()) {
            batch_pos_ = 0;
            if (++order_pos_ == shard_order_.size()) {
                order_pos_ = 0;
                epoch_++;
                plan_epoch();
            }
            plan_shard(shard_order_[order_pos_]);
        }
        position_++;
        make_batch();
    }

    // The current batch (see the top of the file).
    int B() const { return o_.B; }
    int T() const { return Tb_; }
    const int* inputs() const { return inputs_.data(); }             // (B,T())
    const int* token_types() const { return token_types_.data(); }   // (B,T()) zeros
    const int* valid_len() const { return valid_len_.data(); }       // (B)
    const int* targets() const { return targets_.data(); }           // MLM (B,T()); classification (B)
    int num_real() const { return num_real_; }
    int masked_rows() const { return masked_rows_; }
    // Which sequence (index among all shards in file order) row b holds, or -1 for a filler row.
    long long sequence_id(int b) const { return row_seq_[b]; }

    // About the data.
    bool is_mlm() const { return info_.kind == BertShardKind::MLM; }
    BertShardKind kind() const { return info_.kind; }
    int num_labels() const { return info_.num_labels(); }
    const std::string& label_name(int k) const { return info_.label_names.at(k); }
    const std::vector<std::string>& label_names() const { return info_.label_names; }
    int vocab_size() const { return info_.vocab_size; }  // the shards' vocabulary
    uint64_t vocab_fingerprint() const { return info_.vocab_fingerprint; }  // 0: no shard recorded it
    int pad_id() const { return info_.pad_id; }
    int mask_id() const { return info_.mask_id; }
    size_t num_shards() const { return files_.size(); }
    const std::vector<std::string>& shard_files() const { return files_; }
    size_t num_sequences() const { return total_seqs_; }
    // MLM: the most masked rows a batch can have (B times the per-sequence bound): what to pass to
    // the model's allocate_activations. 0 for classification.
    int max_masked_rows() const { return is_mlm() ? o_.B * per_seq_cap_ : 0; }
    // Batches per epoch on each rank (an eval loader: one pass over every sequence).
    size_t batches_per_epoch() const { return std::accumulate(batches_.begin(), batches_.end(), (size_t)0); }
    uint64_t epoch() const { return epoch_; }
    uint64_t position() const { return position_; }  // index of the current batch (see seek())
    // Whether some shard allows sequences longer than the model's T (those are cut to T when read).
    bool truncates() const { return longest_ < info_.max_len; }

  private:
    static constexpr uint64_t EVAL_EPOCH = ~0ull;  // the masks' epoch key of an eval loader
    enum Purpose : uint64_t { SHARD_ORDER = 1, SEQ_ORDER, BATCH_ORDER, MASKS };

    // Reads and checks shard path's header (and its file size) into *s, *n sequences, *total tokens, and
    // its label names as stored at the end of the file (newline-terminated; none for MLM) into *names:
    // shards whose labels disagree are refused before training starts, not when they are reached.
    static void read_header(const std::string& path, BertShard* s, size_t* n, size_t* total, std::string* names) {
        uint8_t header[BERT_SHARD_HEADER_INTS * 4] = {};
        std::string why = not_a_regular_file(path);
        if (!why.empty()) bert_data_error("%s: BERT shards are files", why.c_str());
        FILE* f = fopen(path.c_str(), "rb");
        if (!f) bert_data_error("cannot open %s: %s", path.c_str(), strerror(errno));
        bool ok = fread(header, 1, sizeof(header), f) > 0 || !ferror(f);  // a short file is refused by its size
        ok = ok && fseek(f, 0, SEEK_END) == 0;
        long size = ok ? ftell(f) : -1;
        std::string err;
        if (size >= 0 && !parse_bert_shard_header(header, (size_t)size, s, n, total, &err)) {
            fclose(f);
            bert_data_error("%s: %s", path.c_str(), err.c_str());
        }
        int32_t name_bytes = 0;  // checked by the header's parse: the file ends with them
        memcpy(&name_bytes, header + 4 * bert_shard_detail::NAME_BYTES, 4);
        names->assign((size_t)name_bytes, '\0');
        ok = size >= 0 && fseek(f, size - name_bytes, SEEK_SET) == 0 &&
             fread(names->data(), 1, names->size(), f) == names->size();
        fclose(f);
        if (!ok) bert_data_error("%s: read failed", path.c_str());
    }

    // Reads shard k whole and checks every rule of the format, and that it still agrees with the
    // first shard's labels.
    void load_shard(size_t k) {
        if (loaded_ == k) return;
        std::string err;
        if (!read_bert_shard(files_[k], &shard_, &err)) bert_data_error("%s", err.c_str());
        if (shard_.num_sequences() != counts_[k])
            bert_data_error("%s: changed while training (%zu sequences, %zu before)", files_[k].c_str(),
                            shard_.num_sequences(), counts_[k]);
        if (k > 0 && info_.kind == BertShardKind::Classify && shard_.label_names != info_.label_names)
            bert_data_error("%s: its labels differ from %s's (the same names in the same order are needed)",
                            files_[k].c_str(), files_[0].c_str());
        loaded_ = k;
    }

    // This epoch's shard order.
    void plan_epoch() {
        shard_order_.resize(files_.size());
        std::iota(shard_order_.begin(), shard_order_.end(), (size_t)0);
        if (o_.shuffle && !o_.eval) BertRng({o_.seed, epoch_, SHARD_ORDER}).shuffle(&shard_order_);
    }

    // The sequence of every row of every global batch of shard k this epoch (-1: filler), in the
    // order the batches are read.
    void plan_shard(size_t k) {
        load_shard(k);
        const size_t G = (size_t)o_.world * o_.B, n = counts_[k];
        std::vector<int32_t> order(n);
        std::iota(order.begin(), order.end(), 0);
        auto len = [&](int32_t i) { return std::min(shard_.lengths[i], o_.T); };
        auto by_length = [&](int32_t a, int32_t b) { return len(a) < len(b); };
        size_t nb = batches_[k];
        if (o_.eval) {
            if (o_.bucket) std::stable_sort(order.begin(), order.end(), by_length);
            order.resize(nb * G, -1);
        } else {
            if (o_.shuffle) BertRng({o_.seed, epoch_, k, SEQ_ORDER}).shuffle(&order);
            order.resize(nb * G);  // the last n mod G of this epoch's order sit out
            if (o_.bucket) {
                size_t pool = (size_t)o_.bucket_pool * G;
                for (size_t p = 0; p < order.size(); p += pool)
                    std::stable_sort(order.begin() + p, order.begin() + std::min(order.size(), p + pool), by_length);
            }
        }
        std::vector<size_t> batch_order(nb);
        std::iota(batch_order.begin(), batch_order.end(), (size_t)0);
        if (!o_.eval && o_.shuffle && o_.bucket) BertRng({o_.seed, epoch_, k, BATCH_ORDER}).shuffle(&batch_order);
        plan_batches_.assign(nb, {});
        for (size_t g = 0; g < nb; g++)
            plan_batches_[g].assign(order.begin() + batch_order[g] * G + (size_t)o_.rank * o_.B,
                                    order.begin() + batch_order[g] * G + (size_t)(o_.rank + 1) * o_.B);
        plan_shard_ = k;
    }

    // Fills the batch buffers from plan_batches_[batch_pos_].
    void make_batch() {
        const size_t k = plan_shard_;
        const std::vector<int32_t>& rows = plan_batches_[batch_pos_];
        const int B = o_.B;
        int longest = 2;
        num_real_ = 0;
        for (int32_t i : rows)
            if (i >= 0) {
                longest = std::max(longest, std::min(shard_.lengths[i], o_.T));
                num_real_++;
            }
        Tb_ = o_.pad_to_T ? o_.T : std::min(o_.T, (longest + 7) / 8 * 8);
        const size_t BT = (size_t)B * Tb_;
        inputs_.assign(BT, info_.pad_id);
        token_types_.assign(BT, 0);
        valid_len_.assign(B, 2);
        row_seq_.assign(B, -1);
        targets_.assign(is_mlm() ? BT : (size_t)B, is_mlm() ? BERT_IGNORE_INDEX : 0);
        masked_rows_ = 0;
        for (int b = 0; b < B; b++) {
            int* in = inputs_.data() + (size_t)b * Tb_;
            int32_t i = rows[b];
            if (i < 0) {  // filler: [CLS] [SEP]
                in[0] = info_.cls_id;
                in[1] = info_.sep_id;
                continue;
            }
            int len = std::min(shard_.lengths[i], o_.T);
            const uint16_t* seq = shard_.tokens.data() + shard_.offsets[i];
            for (int t = 0; t < len - 1; t++) in[t] = seq[t];
            in[len - 1] = info_.sep_id;  // the sequence's own last token, or the [SEP] that ends a cut one
            valid_len_[b] = len;
            row_seq_[b] = (long long)(first_seq_[k] + i);
            if (is_mlm()) mask(row_seq_[b], in, len, targets_.data() + (size_t)b * Tb_);
            else targets_[b] = shard_.labels[i];
        }
    }

    // Dynamic masking of one sequence (in: its len tokens) from the stream of (seed, epoch, seq).
    void mask(uint64_t seq, int* in, int len, int* target) {
        BertRng rng({o_.seed, o_.eval ? EVAL_EPOCH : epoch_, seq, MASKS});
        candidates_.clear();
        for (int t = 0; t < len; t++) {
            int id = in[t];
            if (id != info_.cls_id && id != info_.sep_id && id != info_.pad_id && id != info_.mask_id &&
                id != info_.unk_id)
                candidates_.push_back(t);
        }
        size_t n = candidates_.size();
        size_t k = (size_t)std::floor(o_.mask_rate * (double)n + rng.uniform());
        k = std::min({k, n, (size_t)per_seq_cap_});
        for (size_t j = 0; j < k; j++) {  // the first k of a uniformly random permutation
            std::swap(candidates_[j], candidates_[j + rng.below(n - j)]);
            int t = candidates_[j];
            target[t] = in[t];
            double u = rng.uniform();
            if (u < o_.mask_token) in[t] = info_.mask_id;
            else if (u < o_.mask_token + o_.random_token) in[t] = (int)rng.below(info_.vocab_size);
        }
        masked_rows_ += (int)k;
    }

    Options o_;
    std::vector<std::string> files_;
    BertShard info_;                  // the first shard's scalars and label names (max_len: the largest)
    std::vector<size_t> counts_;      // sequences per shard
    std::vector<size_t> first_seq_;   // index of each shard's first sequence among all
    std::vector<size_t> batches_;     // batches per epoch from each shard
    size_t total_seqs_ = 0;
    int longest_ = 0;                 // the longest a batch row can be: min(T, max_len)
    int per_seq_cap_ = 0;             // MLM: masked tokens per sequence at most
    BertShard shard_;                 // the loaded shard
    size_t loaded_ = SIZE_MAX;
    uint64_t epoch_ = 0, position_ = 0;
    std::vector<size_t> shard_order_;  // this epoch's shard order
    size_t order_pos_ = 0;             // index into shard_order_ of the shard being read
    size_t plan_shard_ = 0;            // the shard plan_batches_ is for
    std::vector<std::vector<int32_t>> plan_batches_;  // this rank's rows of each of its batches
    size_t batch_pos_ = 0;             // the current batch's index in plan_batches_
    // The current batch.
    int Tb_ = 0, num_real_ = 0, masked_rows_ = 0;
    std::vector<int> inputs_, token_types_, valid_len_, targets_, candidates_;
    std::vector<long long> row_seq_;
};

// The longest sequence the shards matching pattern allow (their headers' max_len, at most): with
// batches only as wide as their longest row, the activations need no more than this rounded up to 8.
inline int bert_shards_max_len(const std::string& pattern) {
    glob_t g;
    int longest = 0;
    if (glob(pattern.c_str(), 0, nullptr, &g) != 0) return 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        uint8_t header[BERT_SHARD_HEADER_INTS * 4] = {};
        if (!not_a_regular_file(g.gl_pathv[i]).empty()) continue;  // the loader refuses it by name
        FILE* f = fopen(g.gl_pathv[i], "rb");
        if (!f) continue;
        size_t got = fread(header, 1, sizeof(header), f);
        long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
        fclose(f);
        BertShard s;
        size_t n, total;
        std::string err;  // (a bad shard is the loader's to report)
        if (got == sizeof(header) && size > 0 && parse_bert_shard_header(header, (size_t)size, &s, &n, &total, &err))
            longest = std::max(longest, s.max_len);
    }
    globfree(&g);
    return longest;
}

// Writes --bench's synthetic shard to path: n sequences of exactly len tokens ([CLS], ids drawn
// uniformly from the vocabulary's ordinary tokens, [SEP]) with the bert-base-uncased special ids
// (so V must be at least 1000); classification: labels alternating between 2 classes. False, with
// *err, if it cannot.
inline bool write_bench_shard(const std::string& path, BertShardKind kind, size_t n, int len, int V, uint64_t seed,
                              std::string* err) {
    if (V < 1000) {
        *err = "the model's vocabulary (" + std::to_string(V) + ") is smaller than bert-base-uncased's special ids";
        return false;
    }
    BertShard s;
    s.kind = kind;
    s.max_len = len;
    s.vocab_size = V;
    s.cls_id = 101, s.sep_id = 102, s.pad_id = 0, s.mask_id = 103, s.unk_id = 100;
    BertRng rng({seed, 0xBE7C});
    for (size_t i = 0; i < n; i++) {
        s.tokens.push_back((uint16_t)s.cls_id);
        for (int t = 1; t < len - 1; t++) s.tokens.push_back((uint16_t)(999 + rng.below(V - 999)));
        s.tokens.push_back((uint16_t)s.sep_id);
        s.lengths.push_back(len);
        if (kind == BertShardKind::Classify) s.labels.push_back((int32_t)(i % 2));
    }
    if (kind == BertShardKind::Classify) s.label_names = {"even", "odd"};
    return write_bert_shard(path, s, err);
}
