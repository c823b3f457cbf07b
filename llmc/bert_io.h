// llmc/bert_io.h — BERT's checkpoint formats: transformers' safetensors and config.json, in and out.
//
// Reading a transformers BERT checkpoint (model.safetensors or its shards, and config.json: BertModel,
// BertForMaskedLM, BertForSequenceClassification or BertForPreTraining) into the fp32 parameter
// layout of llmc/bert_config.h, refusing by name what this model cannot represent; writing the
// parameters back as a checkpoint that from_pretrained loads with nothing missing and nothing
// unexpected (train_bert --export-hf), with the label names in config.json; and train_bert's own run
// files, which are the same format: each checkpoint's model_%08d.bin and the run's config.json.
//
// Names (BertModel; the task models put "bert." before them): embeddings.{word,position,
// token_type}_embeddings.weight, embeddings.LayerNorm.{weight,bias}, encoder.layer.{l}.attention.
// self.{query,key,value}.{weight,bias}, .attention.output.dense.*, .attention.output.LayerNorm.*,
// .intermediate.dense.*, .output.dense.*, .output.LayerNorm.*, pooler.dense.*. BertForMaskedLM adds
// cls.predictions.transform.dense.*, cls.predictions.transform.LayerNorm.*, cls.predictions.bias (and
// the tied cls.predictions.decoder.weight/.bias, which save_pretrained leaves out);
// BertForSequenceClassification adds classifier.*; BertForPreTraining adds the next-sentence head
// cls.seq_relationship.*, which this model does not have (skipped). Checkpoints from the original
// TensorFlow conversion name LayerNorm parameters gamma and beta: both spellings are read.
#pragma once
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "bert_config.h"   // BertConfig, the parameter layout, transformers' initialization
#include "checkpoint.h"    // make_dirs, write_file_atomic
#include "hf_source.h"      // a transformers model's settings and tokenizer files, carried to the export
#include "dataloader.h"    // data_error
#include "file_io.h"       // read_whole_file
#include "json.h"          // config.json
#include "safetensors.h"   // model.safetensors

// ----------------------------------------------------------------------------
// transformers' checkpoints

// One tensor of a transformers checkpoint and where it goes in our parameters.
struct BertHFTensor {
    std::string name;            // without the "bert." prefix for the encoder and pooler
    int param;                   // our tensor
    size_t offset;               // element offset inside our tensor (a layer's slice, q/k/v's rows)
    std::vector<size_t> shape;   // transformers' shape (our layout: no transposes for BERT)
};

// Every tensor transformers' BERT with config c has, in our order.
inline std::vector<BertHFTensor> bert_hf_tensors(const BertConfig& c) {
    size_t V = c.vocab_size, C = c.channels, I = c.intermediate, NL = c.num_labels;
    std::vector<BertHFTensor> list = {
        {"embeddings.word_embeddings.weight", WORD_EMB, 0, {V, C}},
        {"embeddings.position_embeddings.weight", POS_EMB, 0, {(size_t)c.max_seq_len, C}},
        {"embeddings.token_type_embeddings.weight", TYPE_EMB, 0, {(size_t)c.type_vocab_size, C}},
        {"embeddings.LayerNorm.weight", EMB_LNW, 0, {C}},
        {"embeddings.LayerNorm.bias", EMB_LNB, 0, {C}},
    };
    for (int l = 0; l < c.num_layers; l++) {
        std::string p = "encoder.layer." + std::to_string(l) + ".";
        const char* qkv[3] = {"query", "key", "value"};
        for (size_t k = 0; k < 3; k++) {
            list.push_back({p + "attention.self." + qkv[k] + ".weight", QKVW, (l * 3 + k) * C * C, {C, C}});
            list.push_back({p + "attention.self." + qkv[k] + ".bias", QKVB, (l * 3 + k) * C, {C}});
        }
        list.push_back({p + "attention.output.dense.weight", ATTOW, l * C * C, {C, C}});
        list.push_back({p + "attention.output.dense.bias", ATTOB, l * C, {C}});
        list.push_back({p + "attention.output.LayerNorm.weight", ATTLNW, l * C, {C}});
        list.push_back({p + "attention.output.LayerNorm.bias", ATTLNB, l * C, {C}});
        list.push_back({p + "intermediate.dense.weight", INTERW, l * I * C, {I, C}});
        list.push_back({p + "intermediate.dense.bias", INTERB, l * I, {I}});
        list.push_back({p + "output.dense.weight", OUTW, l * C * I, {C, I}});
        list.push_back({p + "output.dense.bias", OUTB, l * C, {C}});
        list.push_back({p + "output.LayerNorm.weight", OUTLNW, l * C, {C}});
        list.push_back({p + "output.LayerNorm.bias", OUTLNB, l * C, {C}});
    }
    list.push_back({"pooler.dense.weight", POOLW, 0, {C, C}});
    list.push_back({"pooler.dense.bias", POOLB, 0, {C}});
    list.push_back({"cls.predictions.transform.dense.weight", MLMW, 0, {C, C}});
    list.push_back({"cls.predictions.transform.dense.bias", MLMB, 0, {C}});
    list.push_back({"cls.predictions.transform.LayerNorm.weight", MLMLNW, 0, {C}});
    list.push_back({"cls.predictions.transform.LayerNorm.bias", MLMLNB, 0, {C}});
    list.push_back({"cls.predictions.bias", MLMDECB, 0, {V}});
    list.push_back({"classifier.weight", CLSW, 0, {NL, C}});
    list.push_back({"classifier.bias", CLSB, 0, {NL}});
    return list;
}

// The name a tensor has in a file whose encoder tensors start with `prefix` ("" or "bert."): the
// heads' names never take the prefix.
inline std::string bert_hf_file_name(const BertHFTensor& t, const std::string& prefix) {
    BertPart part = bert_param_part(t.param);
    return part == PART_MLM || part == PART_CLASSIFIER ? t.name : prefix + t.name;
}

// Which parts a checkpoint held, and what its config.json says its labels are.
struct BertParts {
    bool has[NUM_BERT_PARTS] = {};
    // config.json's id2label in label order, when it has one entry per label (num_labels); else empty.
    std::vector<std::string> label_names;
    std::string config_path;  // the config.json read
    bool checksummed = false;  // the weights file records its checksum (this project's own files)
};

// The name transformers gives label k when nobody named it (and bert_config_json writes): LABEL_k.
inline std::string bert_generic_label(int k) { return "LABEL_" + std::to_string(k); }

// The names of a classifier's num_labels outputs given the first names.size() of them: those, then
// LABEL_k for the rest, with "_unused" appended while a given name already has it (a shard may name its
// label LABEL_1): id2label and label2id need distinct names.
inline std::vector<std::string> bert_padded_label_names(std::vector<std::string> names, int num_labels) {
    for (int k = (int)names.size(); k < num_labels; k++) {
        std::string name = bert_generic_label(k);
        while (std::find(names.begin(), names.end(), name) != names.end()) name += "_unused";
        names.push_back(name);
    }
    return names;
}

// Whether labels are named: not only transformers' generic LABEL_0, LABEL_1, ..., which say nothing
// about what each output means.
inline bool bert_labels_named(const std::vector<std::string>& names) {
    for (size_t k = 0; k < names.size(); k++)
        if (names[k] != bert_generic_label((int)k)) return true;
    return false;
}

// Labels as one list for messages: "neg, pos".
inline std::string bert_label_list(const std::vector<std::string>& names) {
    std::string s;
    for (size_t k = 0; k < names.size(); k++) s += (k ? ", " : "") + names[k];
    return s;
}

// Reads transformers' config.json (BertConfig) into *c, refusing by name what this model cannot
// represent; keys it leaves out take BertConfig's defaults, as transformers does. label_names (if
// given): id2label's names in label order, when it has num_labels entries (else none). architecture
// (if given): the class "architectures" names, when it names one (else "").
inline void read_hf_bert_config(const std::string& path, BertConfig* c,
                                std::vector<std::string>* label_names = nullptr,
                                std::string* architecture = nullptr) {
    std::vector<uint8_t> bytes;
    std::string err;
    if (!read_whole_file(path, &bytes, &err)) data_error("%s", err.c_str());  // also "PATH is a directory"
    json::Value root;
    if (!json::parse((const char*)bytes.data(), bytes.size(), &root, &err)) data_error("%s: %s", path.c_str(), err.c_str());
    if (root.type != json::Value::Object) data_error("%s: not a JSON object", path.c_str());
    const char* f = path.c_str();
    auto integer = [&](const char* key, int dflt) {
        const json::Value* v = root.get(key);
        if (!v) return dflt;
        if (!v->is_int || v->integer <= 0 || v->integer > (1 << 30))
            data_error("%s: \"%s\" must be a positive integer", f, key);
        return (int)v->integer;
    };
    auto number = [&](const char* key, double dflt) {
        const json::Value* v = root.get(key);
        if (!v) return dflt;
        if (v->type != json::Value::Number) data_error("%s: \"%s\" must be a number", f, key);
        return v->number;
    };
    auto string = [&](const char* key, const char* dflt) {
        const json::Value* v = root.get(key);
        if (!v || v->type == json::Value::Null) return std::string(dflt);
        if (v->type != json::Value::String) data_error("%s: \"%s\" must be a string", f, key);
        return v->str;
    };
    auto flag = [&](const char* key, bool dflt) {
        const json::Value* v = root.get(key);
        if (!v) return dflt;
        if (v->type != json::Value::Bool) data_error("%s: \"%s\" must be true or false", f, key);
        return v->boolean;
    };
    if (architecture) {
        const json::Value* a = root.get("architectures");
        bool one = a && a->type == json::Value::Array && a->items.size() == 1 && a->items[0].type == json::Value::String;
        *architecture = one ? a->items[0].str : "";
    }
    std::string type = string("model_type", "bert");
    if (type != "bert")
        data_error("%s: model_type is \"%s\", not \"bert\" (its architecture differs from BERT's)", f, type.c_str());
    *c = BertConfig();
    c->vocab_size = integer("vocab_size", 30522);
    c->padded_vocab_size = bert_pad_vocab(c->vocab_size);
    c->channels = integer("hidden_size", 768);
    c->num_layers = integer("num_hidden_layers", 12);
    c->num_heads = integer("num_attention_heads", 12);
    c->intermediate = integer("intermediate_size", 3072);
    c->max_seq_len = integer("max_position_embeddings", 512);
    c->type_vocab_size = integer("type_vocab_size", 2);
    c->layernorm_eps = (float)number("layer_norm_eps", 1e-12);
    c->initializer_range = (float)number("initializer_range", 0.02);
    // transformers' num_labels is the size of id2label (save_pretrained does not store num_labels; a
    // num_labels key is read only without id2label, and one that disagrees with it is ambiguous).
    const json::Value* labels = root.get("id2label");
    if (labels && labels->type != json::Value::Object) data_error("%s: \"id2label\" must be an object", f);
    c->num_labels = labels ? (int)labels->fields.size() : integer("num_labels", 2);
    if (labels && root.get("num_labels") && integer("num_labels", 2) != c->num_labels)
        data_error("%s: num_labels %d and the %d labels of id2label disagree", f, integer("num_labels", 2),
                   c->num_labels);
    // Its keys are the labels' indices (transformers reads them with int()), its values their names.
    std::vector<std::string> names(labels ? labels->fields.size() : 0);
    std::vector<bool> seen(names.size(), false);
    for (size_t i = 0; labels && i < labels->fields.size(); i++) {
        const std::string& key = labels->fields[i].first;
        char* end = nullptr;
        long k = strtol(key.c_str(), &end, 10);
        if (key.empty() || *end || k < 0 || k >= (long)names.size() || seen[k])
            data_error("%s: \"id2label\" key \"%s\" is not one of the label indices 0..%zu (each once)", f,
                       key.c_str(), names.size() - 1);
        if (labels->fields[i].second.type != json::Value::String)
            data_error("%s: \"id2label\" value of label %ld must be a string (its name)", f, k);
        names[k] = labels->fields[i].second.str;
        seen[k] = true;
    }
    if (label_names) *label_names = (int)names.size() == c->num_labels ? names : std::vector<std::string>();
    // "gelu" is the exact erf form (so is "gelu_python", its pure-Python spelling); the tanh
    // approximations and other activations are other functions.
    std::string act = string("hidden_act", "gelu");
    if (act != "gelu" && act != "gelu_python")
        data_error("%s: hidden_act \"%s\" cannot be represented: this BERT uses the exact (erf) GELU, \"gelu\"", f,
                   act.c_str());
    std::string pos = string("position_embedding_type", "absolute");
    if (pos != "absolute")
        data_error("%s: position_embedding_type \"%s\" cannot be represented: this BERT has absolute position "
                   "embeddings only", f, pos.c_str());
    if (flag("is_decoder", false)) data_error("%s: is_decoder true cannot be represented (BERT here is an encoder)", f);
    if (flag("add_cross_attention", false)) data_error("%s: add_cross_attention cannot be represented", f);
    if (!flag("tie_word_embeddings", true))
        data_error("%s: tie_word_embeddings false cannot be represented (the MLM decoder is the word embeddings)", f);
    std::string problem = string("problem_type", "single_label_classification");
    if (problem != "single_label_classification")
        data_error("%s: problem_type \"%s\" cannot be represented: the classification head is single-label "
                   "(softmax cross-entropy)", f, problem.c_str());
    c->dropout.hidden = (float)number("hidden_dropout_prob", 0.1);
    c->dropout.attention = (float)number("attention_probs_dropout_prob", 0.1);
    const json::Value* classifier = root.get("classifier_dropout");
    c->dropout.classifier = classifier && classifier->type != json::Value::Null
                                ? (float)number("classifier_dropout", 0.1) : c->dropout.hidden;
    std::string why = bert_config_problem(*c);
    if (!why.empty()) data_error("%s: %s", f, why.c_str());
}

// Copies the BERT tensors of a parsed safetensors file (named `file` in messages) into p, which holds
// bert_param_sizes(c) values (entries of absent parts are left as they are), and returns which parts
// the file has. Exits with one line naming the problem: a tensor of the wrong shape, a part present
// only in part, a decoder weight not tied to the word embeddings, an unexpected tensor.
inline BertParts read_bert_tensors(const SafeTensors& st, const std::string& file, const BertConfig& c,
                                   std::vector<float>* p) {
    const char* f = file.c_str();
    size_t sizes[NUM_BERT_TENSORS];
    if (p->size() != bert_param_sizes(c, sizes)) data_error("read_bert_tensors: parameter buffer of the wrong size");
    std::vector<size_t> start(NUM_BERT_TENSORS, 0);
    for (int i = 1; i < NUM_BERT_TENSORS; i++) start[i] = start[i - 1] + sizes[i - 1];
    std::string prefix = st.find("bert.embeddings.word_embeddings.weight") ? "bert." : "";
    // The legacy LayerNorm spelling (gamma/beta) of a name, or "" if it has none.
    auto legacy = [](const std::string& name) {
        size_t at = name.rfind("LayerNorm.");
        if (at == std::string::npos) return std::string();
        std::string tail = name.substr(at + 10);
        return tail == "weight" ? name.substr(0, at + 10) + "gamma" : tail == "bias" ? name.substr(0, at + 10) + "beta"
                                                                                     : std::string();
    };
    std::vector<BertHFTensor> list = bert_hf_tensors(c);
    std::vector<std::string> used;
    BertParts parts;
    int found[NUM_BERT_PARTS] = {}, total[NUM_BERT_PARTS] = {};
    std::string first_missing[NUM_BERT_PARTS];
    std::vector<float> tmp;
    for (const BertHFTensor& t : list) {
        BertPart part = bert_param_part(t.param);
        total[part]++;
        std::string name = bert_hf_file_name(t, prefix);
        const SafeTensor* x = st.find(name);
        if (!x && !legacy(name).empty() && st.find(legacy(name))) {
            name = legacy(name);
            x = st.find(name);
        }
        if (!x) {
            if (first_missing[part].empty()) first_missing[part] = name;
            continue;
        }
        if (x->shape != t.shape)
            data_error("%s: tensor %s has shape %s, expected %s (config.json's model)", f, name.c_str(),
                       SafeTensors::shape_str(x->shape).c_str(), SafeTensors::shape_str(t.shape).c_str());
        std::string why;
        tmp.resize(x->numel);
        if (!SafeTensors::to_float(*x, tmp.data(), &why)) data_error("%s: %s", f, why.c_str());
        std::copy(tmp.begin(), tmp.end(), p->begin() + start[t.param] + t.offset);
        used.push_back(name);
        found[part]++;
    }
    for (int part = 0; part < NUM_BERT_PARTS; part++) {
        if (found[part] > 0 && found[part] < total[part])
            data_error("%s: the %s is incomplete: tensor %s is missing", f, kBertPartNames[part],
                       first_missing[part].c_str());
        parts.has[part] = found[part] == total[part];
    }
    if (!parts.has[PART_ENCODER])
        data_error("%s: missing tensor %s: not a BERT checkpoint (or not the model of config.json)", f,
                   first_missing[PART_ENCODER].c_str());
    // The decoder is the word embedding matrix (and its bias cls.predictions.bias): a file that stores
    // them must store the same values.
    const float* word = p->data() + start[WORD_EMB];
    size_t V = c.vocab_size, C = c.channels;
    if (const SafeTensor* dec = st.find("cls.predictions.decoder.weight")) {
        std::string why;
        if (dec->shape != std::vector<size_t>{V, C}) data_error("%s: cls.predictions.decoder.weight is not (V, C)", f);
        tmp.resize(dec->numel);
        if (!SafeTensors::to_float(*dec, tmp.data(), &why)) data_error("%s: %s", f, why.c_str());
        if (memcmp(tmp.data(), word, V * C * sizeof(float)) != 0)
            data_error("%s: cls.predictions.decoder.weight differs from %sembeddings.word_embeddings.weight: an untied "
                       "MLM decoder cannot be represented", f, prefix.c_str());
        used.push_back(dec->name);
    }
    if (const SafeTensor* dec = st.find("cls.predictions.decoder.bias")) {
        std::string why;
        if (!parts.has[PART_MLM] || dec->shape != std::vector<size_t>{V})
            data_error("%s: cls.predictions.decoder.bias without the MLM head, or not (V)", f);
        tmp.resize(dec->numel);
        if (!SafeTensors::to_float(*dec, tmp.data(), &why)) data_error("%s: %s", f, why.c_str());
        if (memcmp(tmp.data(), p->data() + start[MLMDECB], V * sizeof(float)) != 0)
            data_error("%s: cls.predictions.decoder.bias differs from cls.predictions.bias (transformers ties them)", f);
        used.push_back(dec->name);
    }
    // Anything else is not part of this model: buffers (position_ids, token_type_ids) and the
    // next-sentence head of BertForPreTraining are skipped, the rest refused.
    for (const SafeTensor& x : st.tensors()) {
        const std::string& name = x.name;
        auto ends_with = [&](const std::string& s) {
            return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
        };
        if (ends_with("embeddings.position_ids") || ends_with("embeddings.token_type_ids") ||
            name.compare(0, 20, "cls.seq_relationship") == 0)
            continue;
        if (std::find(used.begin(), used.end(), name) == used.end())
            data_error("%s: unexpected tensor %s (not part of a BERT with the %d layers of config.json)", f,
                       name.c_str(), c.num_layers);
    }
    return parts;
}

// The file `name` in the directory of a checkpoint's weights file (its config.json, its vocab.txt).
inline std::string hf_file_beside(const std::string& file, const char* name) {
    size_t slash = file.rfind('/');
    return (slash == std::string::npos ? std::string(".") : file.substr(0, slash)) + "/" + name;
}

// Reads a transformers BERT checkpoint: path is a directory save_pretrained wrote (model.safetensors,
// or a sharded model.safetensors.index.json and its shards), or one of those files, with
// transformers' config.json beside it. F32, F16 and BF16 tensors are read (widened exactly). Returns
// the fp32 parameters in our layout and fills *c (and *parts, if given, with which parts the file
// had). Parts the checkpoint lacks — the MLM head of a BertModel, the pooler and classifier of a
// BertForMaskedLM — are initialized as transformers initializes them (seeded), as from_pretrained
// does for a task model. Exits with one line naming the problem if the checkpoint is not a BERT this
// model can represent.
inline std::vector<float> load_hf_bert(const std::string& path, BertConfig* c, BertParts* parts = nullptr,
                                       uint64_t seed = 42) {
    std::string file, err;
    if (!hf_weights_file(path, &file, &err)) data_error("%s", err.c_str());
    struct stat info;
    if (stat(file.c_str(), &info) != 0) data_error("%s: cannot open: %s", file.c_str(), strerror(errno));
    std::string config_path = hf_file_beside(file, "config.json");
    if (stat(config_path.c_str(), &info) != 0)
        data_error("%s: no config.json beside it (%s): it is needed for the number of attention heads and the "
                   "activation, which the tensors do not tell", file.c_str(), config_path.c_str());
    std::vector<std::string> label_names;
    std::string architecture;
    read_hf_bert_config(config_path, c, &label_names, &architecture);
    SafeTensors st;
    if (!st.load(file, &err)) data_error("%s", err.c_str());
    // The layer count the tensors have must be config.json's (the list checks every other size).
    int layers = 0;
    for (const SafeTensor& x : st.tensors()) {
        size_t at = x.name.find("encoder.layer.");
        if (at == std::string::npos) continue;
        int l = atoi(x.name.c_str() + at + 14);
        layers = std::max(layers, l + 1);
    }
    if (layers != c->num_layers)
        data_error("%s: has %d encoder layers, %s says num_hidden_layers %d", file.c_str(), layers, config_path.c_str(),
                   c->num_layers);
    // transformers calls other heads "classifier" too (BertForTokenClassification's scores every token,
    // BertForMultipleChoice's each choice): on the pooled [CLS], as ours is used, one would mean
    // something else. (train_bert's own checkpoints hold every part whatever their architecture.)
    if (st.find("classifier.weight") &&
        (architecture == "BertForTokenClassification" || architecture == "BertForMultipleChoice"))
        data_error("%s: classifier.weight is the head of a %s (%s), not of a BertForSequenceClassification: it cannot "
                   "be used as the sequence classifier (remove classifier.* to start from the encoder alone)",
                   file.c_str(), architecture.c_str(), config_path.c_str());
    // A classifier's rows must be config.json's labels: said here, more clearly than a shape mismatch.
    if (const SafeTensor* cls = st.find("classifier.weight"))
        if (cls->shape.size() == 2 && cls->shape[0] != (size_t)c->num_labels)
            data_error("%s: classifier.weight has %zu rows (labels), %s has %d (id2label)", file.c_str(),
                       cls->shape[0], config_path.c_str(), c->num_labels);
    size_t sizes[NUM_BERT_TENSORS];
    std::vector<float> p(bert_param_sizes(*c, sizes), 0.f);
    BertParts found = read_bert_tensors(st, file, *c, &p);
    bool absent[NUM_BERT_PARTS];
    for (int k = 0; k < NUM_BERT_PARTS; k++) absent[k] = !found.has[k];
    bert_init_parts(*c, seed, absent, &p);
    found.label_names = label_names;
    found.config_path = config_path;
    found.checksummed = st.metadata().count(SafeTensors::kChecksumKey) > 0;
    if (parts) *parts = found;
    return p;
}

// The safetensors file of our fp32 parameters with transformers' names, the tensors of the parts
// marked in `part` (each F32, or BF16 if bf16), the encoder's and pooler's names after `prefix`.
inline SafeTensorsWriter bert_safetensors(const BertConfig& c, const std::vector<float>& params, bool bf16,
                                          const bool part[NUM_BERT_PARTS], const std::string& prefix) {
    size_t sizes[NUM_BERT_TENSORS];
    if (params.size() != bert_param_sizes(c, sizes))
        data_error("BERT safetensors: %zu parameters given, the model has %zu", params.size(), bert_param_sizes(c, sizes));
    std::vector<size_t> start(NUM_BERT_TENSORS, 0);
    for (int i = 1; i < NUM_BERT_TENSORS; i++) start[i] = start[i - 1] + sizes[i - 1];
    SafeTensorsWriter w;
    for (const BertHFTensor& t : bert_hf_tensors(c))
        if (part[bert_param_part(t.param)])
            w.add(bert_hf_file_name(t, prefix), params.data() + start[t.param] + t.offset, t.shape, bf16);
    return w;
}

// transformers' config.json for c as architecture `arch` (c.dropout its dropout probabilities), its
// labels named label_names (default LABEL_k, as save_pretrained writes them); extra: more keys
// ("  \"key\": value,\n" lines; transformers keeps unknown keys as attributes).
inline std::string bert_config_json(const BertConfig& c, const char* arch, bool bf16,
                                    const std::vector<std::string>& label_names = {}, const std::string& extra = "") {
    // The labels (transformers derives num_labels from id2label), for every architecture.
    std::string id2label, label2id;
    const std::vector<std::string> names = bert_padded_label_names(label_names, c.num_labels);
    for (int k = 0; k < c.num_labels; k++) {
        std::string sep = k ? ", " : "";
        std::string name = json::quote(names[k]);
        id2label += sep + "\"" + std::to_string(k) + "\": " + name;
        label2id += sep + name + ": " + std::to_string(k);
    }
    std::string labels = "  \"id2label\": {" + id2label + "},\n  \"label2id\": {" + label2id + "},\n";
    if (!strcmp(arch, "BertForSequenceClassification"))
        labels += "  \"problem_type\": \"single_label_classification\",\n";
    using json::shortest_float;
    char body[1024];
    snprintf(body, sizeof(body),
             "  \"attention_probs_dropout_prob\": %s,\n"
             "  \"classifier_dropout\": %s,\n"
             "  \"hidden_act\": \"gelu\",\n"
             "  \"hidden_dropout_prob\": %s,\n"
             "  \"hidden_size\": %d,\n"
             "  \"initializer_range\": %s,\n"
             "  \"intermediate_size\": %d,\n"
             "  \"layer_norm_eps\": %s,\n"
             "  \"max_position_embeddings\": %d,\n"
             "  \"model_type\": \"bert\",\n"
             "  \"num_attention_heads\": %d,\n"
             "  \"num_hidden_layers\": %d,\n"
             "  \"pad_token_id\": 0,\n"
             "  \"position_embedding_type\": \"absolute\",\n"
             "  \"torch_dtype\": \"%s\",\n"
             "  \"type_vocab_size\": %d,\n"
             "  \"use_cache\": true,\n"
             "  \"vocab_size\": %d\n",
             shortest_float(c.dropout.attention).c_str(),
             c.dropout.classifier == c.dropout.hidden ? "null" : shortest_float(c.dropout.classifier).c_str(),
             shortest_float(c.dropout.hidden).c_str(), c.channels, shortest_float(c.initializer_range).c_str(),
             c.intermediate, shortest_float(c.layernorm_eps).c_str(),
             c.max_seq_len, c.num_heads, c.num_layers, bf16 ? "bfloat16" : "float32", c.type_vocab_size, c.vocab_size);
    return std::string("{\n  \"architectures\": [\"") + arch + "\"],\n" + labels + extra + body + "}\n";
}

// Writes our fp32 parameters as a transformers checkpoint in dir (created if missing): model.safetensors
// (F32, or BF16 if bf16) and config.json, for the architecture of `head`: BertForMaskedLM (MLM: the
// encoder and the MLM head, "bert." names), BertForSequenceClassification (Classify: encoder, pooler,
// classifier) or BertModel (None: encoder and pooler). from_pretrained(dir) of that class loads it
// with nothing missing and nothing unexpected. label_names: id2label's names (default LABEL_k). A
// model from transformers (source) keeps its config's other settings (pad_token_id, ...) and its
// tokenizer files, copied into dir; returns the names of those copied. Exits with one line if it
// cannot write.
inline std::vector<std::string> export_hf_bert(const std::string& dir, const BertConfig& c,
                                               const std::vector<float>& params, bool bf16, BertHead head,
                                               const std::vector<std::string>& label_names = {},
                                               const HFSource& source = HFSource()) {
    std::string err;
    if (!make_dirs(dir, &err)) data_error("export to %s: %s", dir.c_str(), err.c_str());
    bool part[NUM_BERT_PARTS] = {true, head != BertHead::MLM, head == BertHead::MLM, head == BertHead::Classify};
    SafeTensorsWriter w = bert_safetensors(c, params, bf16, part, head == BertHead::None ? "" : "bert.");
    if (!w.write(dir + "/model.safetensors", &err)) data_error("export to %s: %s", dir.c_str(), err.c_str());
    const char* arch = head == BertHead::MLM        ? "BertForMaskedLM"
                       : head == BertHead::Classify ? "BertForSequenceClassification"
                                                    : "BertModel";
    // The keys that describe this model and how it was trained are ours (the labels and dropouts
    // included: the run may have changed them); the source's other settings stay.
    std::string config = hf_config_with_source(
        bert_config_json(c, arch, bf16, label_names), source,
        {"architectures", "attention_probs_dropout_prob", "classifier_dropout", "dtype", "hidden_act",
         "hidden_dropout_prob", "hidden_size", "id2label", "initializer_range", "intermediate_size", "label2id",
         "layer_norm_eps", "max_position_embeddings", "model_type", "num_attention_heads", "num_hidden_layers",
         "num_labels", "position_embedding_type", "problem_type", "torch_dtype", "type_vocab_size", "vocab_size"});
    std::vector<std::string> copied;
    if (!write_file_atomic(dir + "/config.json", {{config.data(), config.size()}}, &err) ||
        !copy_hf_source_files(source, dir, &copied, &err))
        data_error("export to %s: %s", dir.c_str(), err.c_str());
    return copied;
}

// ----------------------------------------------------------------------------
// train_bert's run files: a checkpoint's model_%08d.bin is a transformers checkpoint of every part,
// read back with load_hf_bert; the run's config.json beside it is transformers' config plus the run's
// settings that a resumed run needs.

// Writes a checkpoint's model file: every tensor as F32 in a safetensors file with transformers'
// names ("bert." before the encoder's and pooler's) — the run's compute-precision values widened
// exactly, so a resumed run continues from the same bits. False with *err if it cannot write.
inline bool write_bert_model_file(const std::string& path, const BertConfig& c, const std::vector<float>& params,
                                  std::string* err) {
    const bool all[NUM_BERT_PARTS] = {true, true, true, true};
    SafeTensorsWriter w = bert_safetensors(c, params, false, all, "bert.");
    return w.write(path, err);
}

// What a run records in its config.json (llmc_run) for a resumed run, as strings ("" where the file
// has none): the learning rate, step count and epochs the run was given, whose defaults depend on
// where the run started, which a resumed run no longer sees; and what a resumed run must keep: the
// task ("classify" or "mlm"), the checkpoint the run started from (init: its absolute path, "" for a
// random init) and the log label. (A file written before epochs, task, init and label were recorded
// has lr and max_steps only.)
struct BertRunSettings {
    std::string lr, max_steps, epochs, task, init, label;
};

// Writes the run's config.json into dir, when the run starts (and again when it resumes): transformers'
// config of the run's architecture (BertForMaskedLM or BertForSequenceClassification) and llmc_run,
// the run's settings. False with *err if it cannot write.
// The run's config.json records its own checksum, as the checkpoint files do (a resumed run takes the
// model's shape and the run's settings from it): llmc_run's "checksum", 16 hex digits, the Checksum64
// of the file's text with those digits 0.
constexpr const char kRunConfigChecksum[] = "\"checksum\": \"";
inline bool run_config_checksum_at(const std::string& text, size_t* at) {
    size_t key = text.find(kRunConfigChecksum);
    *at = key + sizeof(kRunConfigChecksum) - 1;
    return key != std::string::npos && *at + 16 <= text.size();
}
inline std::string run_config_checksum(std::string text, size_t at) {
    text.replace(at, 16, 16, '0');
    char hex[17];
    snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)Checksum64::of(text.data(), text.size()));
    return hex;
}

inline bool write_bert_run_config(const std::string& dir, const BertConfig& c, BertHead head,
                                  const std::vector<std::string>& label_names, const BertRunSettings& r,
                                  std::string* err) {
    std::string run = "  \"llmc_run\": {\"lr\": " + json::quote(r.lr) + ", \"max_steps\": " + json::quote(r.max_steps) +
                      ", \"epochs\": " + json::quote(r.epochs) + ", \"task\": " + json::quote(r.task) +
                      ", \"init\": " + json::quote(r.init) + ", \"label\": " + json::quote(r.label) + ", " +
                      kRunConfigChecksum + std::string(16, '0') + "\"},\n";
    std::string json = bert_config_json(c, head == BertHead::MLM ? "BertForMaskedLM" : "BertForSequenceClassification",
                                        false, label_names, run);
    size_t at;
    if (run_config_checksum_at(json, &at)) json.replace(at, 16, run_config_checksum(json, at));
    return write_file_atomic(dir + "/config.json", {{json.data(), json.size()}}, err);
}

// Checks the run's config.json in dir against its checksum before a resumed run reads it; `required`
// (a checkpoint that carries checksums: its run wrote this file with one) makes a missing checksum an
// error too. Exits with one line naming the file.
inline void check_bert_run_config(const std::string& dir, bool required) {
    std::vector<uint8_t> bytes;
    std::string err, path = dir + "/config.json";
    if (!read_whole_file(path, &bytes, &err)) data_error("%s", err.c_str());
    std::string text(bytes.begin(), bytes.end());
    size_t at;
    if (!run_config_checksum_at(text, &at)) {
        if (required)
            data_error("%s: checksum mismatch: llmc_run has no checksum, which the run wrote (damaged on disk or in "
                       "a copy)", path.c_str());
        return;
    }
    if (text.compare(at, 16, run_config_checksum(text, at)) != 0)
        data_error("%s: checksum mismatch: the file's bytes are not those the run wrote (damaged on disk or in a "
                   "copy, or edited)", path.c_str());
}

// What dir's config.json is when it is not a train_bert run's, which a run writing its own config.json
// there would replace: "not JSON (...)", or "not a train_bert run's (a model's?)" (no llmc_run: e.g. the
// directory --init read). "" for a run's, or no config.json.
inline std::string foreign_config(const std::string& dir) {
    std::vector<uint8_t> bytes;
    json::Value root;
    std::string err;
    if (!read_whole_file(dir + "/config.json", &bytes, &err)) return "";
    if (!json::parse((const char*)bytes.data(), bytes.size(), &root, &err)) return "not JSON (" + err + ")";
    return root.get("llmc_run") ? "" : "not a train_bert run's (a model's?)";
}

// The llmc_run settings of the run's config.json in dir, those present; all "" if the file cannot be
// read or parsed. A file without llmc_run's task (written before it was recorded) gives the task of
// its architecture.
inline BertRunSettings read_bert_run_settings(const std::string& dir) {
    BertRunSettings r;
    std::vector<uint8_t> bytes;
    json::Value root;
    std::string err;
    if (!read_whole_file(dir + "/config.json", &bytes, &err) ||
        !json::parse((const char*)bytes.data(), bytes.size(), &root, &err))
        return r;
    if (const json::Value* run = root.get("llmc_run")) {
        std::pair<const char*, std::string*> keys[] = {{"lr", &r.lr},     {"max_steps", &r.max_steps},
                                                       {"epochs", &r.epochs}, {"task", &r.task},
                                                       {"init", &r.init}, {"label", &r.label}};
        for (auto& [key, field] : keys) {
            const json::Value* v = run->get(key);
            if (v && v->type == json::Value::String) *field = v->str;
        }
    }
    const json::Value* arch = root.get("architectures");
    if (r.task.empty() && arch && arch->type == json::Value::Array && arch->items.size() == 1 &&
        arch->items[0].type == json::Value::String)
        r.task = arch->items[0].str == "BertForMaskedLM"                 ? "mlm"
                 : arch->items[0].str == "BertForSequenceClassification" ? "classify"
                                                                          : "";
    return r;
}
