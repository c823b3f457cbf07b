// test/bert_shards.h — small synthetic BERT shards for the tests that run train_bert (test_train_bert,
// test_train_bert_ranks): classification a small model can learn, or MLM text. Included after
// train_bert.cu, which brings llmc/bert_dataloader.h's shard writer.
#pragma once
#include <cstdint>
#include <string>

namespace th {

// A shard dir/name of n sequences, vocabulary V (bert-base-uncased's special ids): lengths 3 to
// max_len; classification with `labels` classes, class k's tokens drawn from its own (overlapping)
// range so that a small model can learn it; MLM (labels = 0): tokens from [999, V). The header records
// vocab_fingerprint as the vocabulary's (0: none).
inline std::string write_bert_test_shard(const std::string& dir, const std::string& name, BertShardKind kind, int n,
                                         int max_len, int V, int labels, uint64_t seed,
                                         uint64_t vocab_fingerprint = 0) {
    BertShard s;
    s.vocab_fingerprint = vocab_fingerprint;
    s.kind = kind;
    s.max_len = max_len;
    s.vocab_size = V;
    s.cls_id = 101, s.sep_id = 102, s.pad_id = 0, s.mask_id = 103, s.unk_id = 100;
    BertRng rng({seed, 77});
    int lo = 110, span = V - lo;
    for (int i = 0; i < n; i++) {
        int len = 3 + (int)rng.below(max_len - 2);
        int label = labels ? (int)rng.below(labels) : 0;
        s.tokens.push_back(101);
        for (int t = 1; t < len - 1; t++) {
            int from = labels ? lo + label * span / (labels + 1) : lo;
            int width = labels ? 2 * span / (labels + 1) : span;
            s.tokens.push_back((uint16_t)(from + rng.below(width)));
        }
        s.tokens.push_back(102);
        s.lengths.push_back(len);
        if (labels) s.labels.push_back(label);
    }
    for (int k = 0; k < labels; k++) s.label_names.push_back(std::string("class") + char('a' + k));
    std::string path = dir + "/" + name, err;
    if (!write_bert_shard(path, s, &err)) data_error("%s", err.c_str());
    return path;
}

}  // namespace th
