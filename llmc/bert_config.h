// llmc/bert_config.h — BERT as transformers defines it: its configuration, parameter tensors and initial values.
//
// What train_bert.cu's model and llmc/bert_io.h's checkpoint formats share: BertConfig (transformers'
// BertConfig fields this model represents) and which configurations the kernels can run; the layout
// of the parameters in one fp32 buffer (the tensors in order, their sizes, which part of a checkpoint
// each belongs to, which take weight decay); the heads the model can compute; the values
// transformers initializes a BERT with, which from_pretrained also gives the parts a checkpoint lacks;
// and the named shapes --config offers (bert_config_preset).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "dataloader.h"  // data_error
#include "rng.h"         // NormalRNG: the seeded normal draws of the initialization

// ----------------------------------------------------------------------------
// Configuration

// Dropout probabilities in training passes, as transformers' BertConfig names them:
// hidden_dropout_prob (the embeddings' output, and each layer's attention and MLP outputs before their
// residual adds), attention_probs_dropout_prob (the attention probabilities) and classifier_dropout
// (the pooled output before the classifier; null in config.json means the hidden one).
struct BertDropout {
    float hidden = 0.1f;
    float attention = 0.1f;
    float classifier = 0.1f;
    static BertDropout all(float p) { return {p, p, p}; }
    bool any() const { return hidden > 0.f || attention > 0.f || classifier > 0.f; }
    bool operator==(const BertDropout& o) const {
        return hidden == o.hidden && attention == o.attention && classifier == o.classifier;
    }
};

// "dropout 0.1", or "dropout 0.1 hidden, 0 attention, 0.1 classifier" when they differ.
inline std::string bert_dropout_text(const BertDropout& d) {
    char text[96];
    if (d == BertDropout::all(d.hidden))
        snprintf(text, sizeof(text), "dropout %g", d.hidden);
    else
        snprintf(text, sizeof(text), "dropout %g hidden, %g attention, %g classifier", d.hidden, d.attention,
                 d.classifier);
    return text;
}

struct BertConfig {
    int vocab_size = 30522;          // V: real tokens
    int padded_vocab_size = 30592;   // Vp: V rounded up to a multiple of 128 (aligned decoder matmul)
    int max_seq_len = 512;           // maxT: positions the model has embeddings for
    int type_vocab_size = 2;         // token types (segments A and B)
    int num_layers = 12;             // L
    int num_heads = 12;              // NH
    int channels = 768;              // C (hidden size)
    int intermediate = 3072;         // I: the MLP's width
    int num_labels = 2;              // the classification head's outputs
    float layernorm_eps = 1e-12f;
    float initializer_range = 0.02f; // std of the random initialization (transformers' BertConfig)
    BertDropout dropout;             // what config.json says (0.1 each by default, as transformers' BertConfig)
};

// V rounded up to a multiple of 128 (30522 -> 30592).
inline int bert_pad_vocab(int V) { return (V + 127) / 128 * 128; }

// What makes a configuration unusable, or "" if nothing does: sizes out of range, and what the
// kernels require (attention head sizes 16, 32, 64 or 128).
inline std::string bert_config_problem(const BertConfig& c) {
    char why[200] = "";
    if (c.vocab_size <= 0 || c.vocab_size > (1 << 24) || c.padded_vocab_size != bert_pad_vocab(c.vocab_size))
        snprintf(why, sizeof(why), "vocab_size %d must be in [1, 2^24] with the padded size %d = %d rounded up to 128",
                 c.vocab_size, c.padded_vocab_size, c.vocab_size);
    else if (c.max_seq_len <= 0 || c.max_seq_len > (1 << 20))
        snprintf(why, sizeof(why), "max_position_embeddings %d must be in [1, 2^20]", c.max_seq_len);
    else if (c.type_vocab_size <= 0 || c.type_vocab_size > (1 << 20))
        snprintf(why, sizeof(why), "type_vocab_size %d must be in [1, 2^20]", c.type_vocab_size);
    else if (c.num_layers <= 0 || c.num_layers > 1024)
        snprintf(why, sizeof(why), "num_hidden_layers %d must be in [1, 1024]", c.num_layers);
    else if (c.channels <= 0 || c.channels > (1 << 16) || c.intermediate <= 0 || c.intermediate > (1 << 20))
        snprintf(why, sizeof(why), "hidden_size %d and intermediate_size %d must be positive (at most 2^16, 2^20)",
                 c.channels, c.intermediate);
    else if (c.num_heads <= 0 || c.channels % c.num_heads != 0)
        snprintf(why, sizeof(why), "num_attention_heads %d must divide hidden_size %d", c.num_heads, c.channels);
    else if (int hs = c.channels / c.num_heads; hs != 16 && hs != 32 && hs != 64 && hs != 128)
        snprintf(why, sizeof(why), "head size %d (hidden_size / num_attention_heads) is not supported: the attention "
                 "kernel takes 16, 32, 64 or 128", hs);
    else if (c.num_labels < 2 || c.num_labels > (1 << 16))
        snprintf(why, sizeof(why), "num_labels %d must be in [2, 65536] (single-label classification)", c.num_labels);
    else if (!(c.layernorm_eps > 0.f) || !(c.initializer_range >= 0.f))
        snprintf(why, sizeof(why), "layer_norm_eps %g must be positive and initializer_range %g not negative",
                 c.layernorm_eps, c.initializer_range);
    else if (!(c.dropout.hidden >= 0.f && c.dropout.hidden < 1.f) || !(c.dropout.attention >= 0.f &&
             c.dropout.attention < 1.f) || !(c.dropout.classifier >= 0.f && c.dropout.classifier < 1.f))
        snprintf(why, sizeof(why), "hidden_dropout_prob %g, attention_probs_dropout_prob %g and classifier_dropout %g "
                 "must be probabilities below 1", c.dropout.hidden, c.dropout.attention, c.dropout.classifier);
    return why;
}

// ----------------------------------------------------------------------------
// Parameters: 26 tensors in one allocation, in this order (the layer tensors stacked over L):
//
//   embeddings   word (Vp,C), position (maxT,C), token type (n_types,C); LayerNorm weight, bias (C)
//   per layer    qkv (L,3C,C) + bias (L,3C): transformers' separate query, key and value Linear layers
//                concatenated row-wise; attention output dense (L,C,C) + bias (L,C); attention
//                LayerNorm (L,C) x 2; intermediate dense (L,I,C) + bias (L,I); output dense (L,C,I) +
//                bias (L,C); output LayerNorm (L,C) x 2
//   pooler       dense (C,C) + bias (C)
//   MLM head     transform dense (C,C) + bias (C); transform LayerNorm (C) x 2; decoder bias (Vp); the
//                decoder weight is the word embedding matrix (tied, as transformers ties it)
//   classifier   (num_labels,C) + bias (num_labels)
//
// Linear weights are (out, in), as nn.Linear stores them; the padded vocabulary rows of the word
// embeddings and entries of the decoder bias are zero and stay zero (no token or logit reaches them).

enum BertParam {
    WORD_EMB, POS_EMB, TYPE_EMB, EMB_LNW, EMB_LNB,
    QKVW, QKVB, ATTOW, ATTOB, ATTLNW, ATTLNB, INTERW, INTERB, OUTW, OUTB, OUTLNW, OUTLNB,
    POOLW, POOLB,
    MLMW, MLMB, MLMLNW, MLMLNB, MLMDECB,
    CLSW, CLSB,
    NUM_BERT_TENSORS
};

// Short names of the tensors, for messages and tests.
inline constexpr const char* kBertParamNames[NUM_BERT_TENSORS] = {
    "word_emb", "pos_emb", "type_emb", "emb_lnw", "emb_lnb",
    "qkvw", "qkvb", "attow", "attob", "attlnw", "attlnb", "interw", "interb", "outw", "outb", "outlnw", "outlnb",
    "poolw", "poolb",
    "mlmw", "mlmb", "mlmlnw", "mlmlnb", "mlmdecb",
    "clsw", "clsb"};

// Which part of a checkpoint a tensor belongs to: a BertModel has the encoder and the pooler, a
// BertForMaskedLM the encoder and the MLM head, a BertForSequenceClassification the encoder, the
// pooler and the classifier.
enum BertPart { PART_ENCODER, PART_POOLER, PART_MLM, PART_CLASSIFIER, NUM_BERT_PARTS };
inline constexpr const char* kBertPartNames[NUM_BERT_PARTS] = {"encoder", "pooler", "MLM head", "classifier"};

inline BertPart bert_param_part(int i) {
    if (i == POOLW || i == POOLB) return PART_POOLER;
    if (i >= MLMW && i <= MLMDECB) return PART_MLM;
    if (i == CLSW || i == CLSB) return PART_CLASSIFIER;
    return PART_ENCODER;
}

// Whether tensor i is stacked over the layers.
inline bool bert_param_per_layer(int i) { return i >= QKVW && i <= OUTLNB; }

// Element counts of the 26 tensors; returns the total.
inline size_t bert_param_sizes(const BertConfig& c, size_t sizes[NUM_BERT_TENSORS]) {
    size_t Vp = c.padded_vocab_size, C = c.channels, L = c.num_layers, I = c.intermediate;
    sizes[WORD_EMB] = Vp * C;
    sizes[POS_EMB] = (size_t)c.max_seq_len * C;
    sizes[TYPE_EMB] = (size_t)c.type_vocab_size * C;
    sizes[EMB_LNW] = sizes[EMB_LNB] = C;
    sizes[QKVW] = L * 3 * C * C;
    sizes[QKVB] = L * 3 * C;
    sizes[ATTOW] = L * C * C;
    sizes[ATTOB] = sizes[ATTLNW] = sizes[ATTLNB] = L * C;
    sizes[INTERW] = L * I * C;
    sizes[INTERB] = L * I;
    sizes[OUTW] = L * C * I;
    sizes[OUTB] = sizes[OUTLNW] = sizes[OUTLNB] = L * C;
    sizes[POOLW] = C * C;
    sizes[POOLB] = C;
    sizes[MLMW] = C * C;
    sizes[MLMB] = sizes[MLMLNW] = sizes[MLMLNB] = C;
    sizes[MLMDECB] = Vp;
    sizes[CLSW] = (size_t)c.num_labels * C;
    sizes[CLSB] = c.num_labels;
    size_t total = 0;
    for (int i = 0; i < NUM_BERT_TENSORS; i++) total += sizes[i];
    return total;
}

// Weight decay applies to the matrices (embeddings and linear weights), not to biases and LayerNorm
// parameters: the usual BERT recipe (no_decay = ["bias", "LayerNorm.weight"]).
inline bool bert_param_decays(int i) {
    return i == WORD_EMB || i == POS_EMB || i == TYPE_EMB || i == QKVW || i == ATTOW || i == INTERW || i == OUTW ||
           i == POOLW || i == MLMW || i == CLSW;
}

// What the model computes after the encoder: nothing (hidden states only), the MLM loss over the
// masked positions, or the classification loss over the batch.
enum class BertHead { None, MLM, Classify };

// ----------------------------------------------------------------------------
// Initial weights, as transformers initializes BERT

// Initializes the tensors of the parts marked in `parts` as transformers' BertPreTrainedModel.
// _init_weights does: matrices N(0, initializer_range), biases 0, LayerNorm weight 1 and bias 0, the
// [PAD] (id 0) row of the word embeddings 0; padded vocabulary rows and decoder-bias entries 0. Each
// tensor draws from its own stream of the seed, so a part's values do not depend on the others'.
inline void bert_init_parts(const BertConfig& c, uint64_t seed, const bool parts[NUM_BERT_PARTS],
                            std::vector<float>* p) {
    size_t sizes[NUM_BERT_TENSORS];
    if (p->size() != bert_param_sizes(c, sizes)) data_error("bert_init_parts: parameter buffer of the wrong size");
    size_t offset = 0;
    for (int i = 0; i < NUM_BERT_TENSORS; offset += sizes[i], i++) {
        if (!parts[bert_param_part(i)]) continue;
        float* t = p->data() + offset;
        std::fill(t, t + sizes[i], 0.f);
        if (i == EMB_LNW || i == ATTLNW || i == OUTLNW || i == MLMLNW) {
            std::fill(t, t + sizes[i], 1.f);
        } else if (bert_param_decays(i)) {
            NormalRNG rng(seed * 1000003 + i);
            size_t first = i == WORD_EMB ? c.channels : 0;  // the [PAD] row
            size_t count = i == WORD_EMB ? (size_t)c.vocab_size * c.channels : sizes[i];
            for (size_t k = first; k < count; k++) t[k] = rng.normal(c.initializer_range);
        }
    }
}

// The named shapes, all with the bert-base-uncased vocabulary and 512 positions: "base" (bert-base,
// 110M: 12 layers, 768 channels, 12 heads), "large" (bert-large, 340M: 24, 1024, 16) and Google's
// smaller BERTs (Turc et al. 2019, the BERT miniatures) "tiny" (2, 128, 2), "mini" (4, 256, 4) and
// "small" (4, 512, 8); MLP width 4C. "bert-base" and "bert-large" are accepted too. False for any
// other name.
inline bool bert_config_preset(const std::string& name, BertConfig* c) {
    struct Shape { const char* name; int layers, channels, heads; };
    static const Shape shapes[] = {{"tiny", 2, 128, 2},  {"mini", 4, 256, 4},       {"small", 4, 512, 8},
                                   {"base", 12, 768, 12}, {"bert-base", 12, 768, 12}, {"large", 24, 1024, 16},
                                   {"bert-large", 24, 1024, 16}};
    *c = BertConfig();
    for (const Shape& s : shapes)
        if (name == s.name) {
            c->num_layers = s.layers;
            c->channels = s.channels;
            c->num_heads = s.heads;
            c->intermediate = 4 * s.channels;
            return true;
        }
    return false;
}
