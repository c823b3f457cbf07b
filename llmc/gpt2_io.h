// llmc/gpt2_io.h — GPT-2 checkpoint files: llm.c's model files and Hugging Face transformers' safetensors.
//
// llm.c model files (version 3: fp32, version 5: bf16) are what this project's checkpoints hold
// (llmc/checkpoint.h names them model_%08d.bin) and what llm.c reads and writes: parse_gpt2_checkpoint
// (which test/fuzz/fuzz_checkpoint.cpp fuzzes), load_checkpoint, write_gpt2_checkpoint. A transformers
// GPT-2 (model.safetensors or its shards, + config.json) comes in with load_hf_gpt2 and goes out with
// export_hf_gpt2.
// Every reader gives the parameters as fp32 values in llm.c's layout (llmc/gpt2_config.h) and refuses
// a file it cannot represent with one line naming the problem.
#pragma once
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint.h"     // write_file_atomic
#include "dataloader.h"     // data_error
#include "file_io.h"        // read_whole_file
#include "gpt2_config.h"    // GPT2Config, the 16 parameter tensors (ParamIndex, param_sizes)
#include "hf_source.h"      // a transformers model's settings and tokenizer files, carried to the export
#include "json.h"           // config.json
#include "model_state.cuh"  // TensorViews: named pointers to the tensors in one buffer
#include "safetensors.h"    // SafeTensors, SafeTensorsWriter

// ----------------------------------------------------------------------------
// llm.c model files

constexpr int GPT2_CHECKPOINT_MAGIC = 20240326;
// This trainer's extension for Mixture-of-Experts models, which llm.c's format cannot hold: version
// 100 + llm.c's (103 fp32, 105 bf16). Header slots 16..23 (zero in llm.c files) hold the MoE
// settings [E, K, every, swiglu, capacity factor, alpha, beta, H] (the three coefficients as the
// bits of their fp32 values); the body is the 16 tensors (the dense MLP's for the dense blocks only)
// then the MoE blocks' router, w1 and w2 (llmc/gpt2_config.h). llm.c refuses these versions rather
// than misread them. A model without experts is always written as llm.c's 3 or 5.
constexpr int GPT2_MOE_VERSION_OFFSET = 100;
constexpr int GPT2_MOE_HEADER_SLOT = 16;
// Also this trainer's: the file's Checksum64 (llmc/file_io.h), taken with slots 253..255 zero, in
// slots 254 (low word) and 255 (high), with GPT2_CHECKSUM_MARK in slot 253 saying they hold one. llm.c
// leaves them zero and ignores them, so its files are read unchecked and it reads ours; slots that
// hold anything else (a damaged mark) are refused.
constexpr int GPT2_CHECKSUM_SLOT = 253;
constexpr int32_t GPT2_CHECKSUM_MARK = 20261128;

inline int32_t float_bits(float f) {
    int32_t b;
    memcpy(&b, &f, 4);
    return b;
}
inline float bits_float(int32_t b) {
    float f;
    memcpy(&f, &b, 4);
    return f;
}

// What a file given as a model checkpoint is instead, from its first bytes ("" if unknown): the other
// files of llm.c and of this trainer, and the files people bring from transformers.
inline std::string not_a_checkpoint(const uint8_t* data, size_t size) {
    int32_t magic = 0;
    if (size >= 4) memcpy(&magic, data, 4);
    if (magic == GPT2_CHECKPOINT_MAGIC) return "";  // (its later bytes could look like anything)
    if (SafeTensors::is_pickle(data, size))
        return std::string("a PyTorch pickle (as pytorch_model.bin): ") + SafeTensors::kPickleAdvice;
    if (SafeTensors::is_lfs_pointer(data, size)) return SafeTensors::kLfsPointer;
    if (size >= 1 && data[0] == '{')
        return "a JSON file (config.json, model.safetensors.index.json?): for a Hugging Face checkpoint give its "
               "directory";
    if (size >= 9 && data[8] == '{')  // safetensors: an 8-byte header length, then the JSON header
        return "a safetensors file: give it a .safetensors name, or give its directory, to read it as a Hugging Face "
               "checkpoint";
    if (magic == 20240328) return "a llm.c tokenizer file (magic 20240328)";  // llmc/tokenizer.h
    if (magic == SHARD_MAGIC) return "a llm.c token shard (magic 20240520): training data, not a model";
    if (magic == TRAIN_STATE_MAGIC) return "this trainer's training state file (state_*.bin): the model is model_*.bin";
    if (magic == 20240527) return "a llm.c optimizer state file (magic 20240527): the model is model_*.bin";
    if (magic == 20240327) return "a llm.c debug state file (magic 20240327: a batch and its expected outputs)";
    return "";
}

// Parses a llm.c model checkpoint held in memory (magic 20240326; version 3 = fp32, 5 = bf16, and
// 103/105 with experts, above): a 256 x int32 header [magic, version, maxT, V, L, NH, C, Vp] then
// the tensors in order. Fills *c and the parameters as fp32 values; false with a reason naming the problem.
inline bool parse_gpt2_checkpoint(const uint8_t* data, size_t size, GPT2Config* c, std::vector<float>* params,
                                  std::string* err, bool* checksummed = nullptr) {
    int32_t h[256];
    std::string other = not_a_checkpoint(data, size);
    if (!other.empty()) {
        *err = "not a llm.c model checkpoint: " + other;
        return false;
    }
    if (size < sizeof(h)) {
        *err = "too short for a model checkpoint header (" + std::to_string(size) + " bytes, need 1024)";
        return false;
    }
    memcpy(h, data, sizeof(h));
    if (h[0] != GPT2_CHECKPOINT_MAGIC) {
        *err = "bad magic " + std::to_string(h[0]) + " (a llm.c GPT-2 checkpoint starts with " +
               std::to_string(GPT2_CHECKPOINT_MAGIC) + ")";
        return false;
    }
    bool moe = h[1] > GPT2_MOE_VERSION_OFFSET;
    int dtype_version = moe ? h[1] - GPT2_MOE_VERSION_OFFSET : h[1];
    if (dtype_version != 3 && dtype_version != 5) {
        *err = "unsupported checkpoint version " + std::to_string(h[1]) +
               " (3 = fp32, 5 = bf16; 103, 105 with Mixture-of-Experts blocks)";
        return false;
    }
    c->max_seq_len = h[2];
    c->vocab_size = h[3];
    c->num_layers = h[4];
    c->num_heads = h[5];
    c->channels = h[6];
    c->padded_vocab_size = h[7];
    if (c->max_seq_len <= 0 || c->vocab_size <= 0 || c->num_layers <= 0 || c->num_heads <= 0 || c->channels <= 0 ||
        c->padded_vocab_size < c->vocab_size || c->channels % c->num_heads != 0 || c->max_seq_len > 1 << 20 ||
        c->channels > 1 << 16 || c->num_layers > 1024 || c->padded_vocab_size > 1 << 24) {
        char shape[160];
        snprintf(shape, sizeof(shape), "implausible model shape in header (maxT=%d V=%d L=%d NH=%d C=%d Vp=%d)",
                 c->max_seq_len, c->vocab_size, c->num_layers, c->num_heads, c->channels, c->padded_vocab_size);
        *err = shape;
        return false;
    }
    c->moe_experts = 0;
    if (moe) {
        const int32_t* m = h + GPT2_MOE_HEADER_SLOT;
        c->moe_experts = m[0];
        c->moe_top_k = m[1];
        c->moe_every = m[2];
        c->moe_swiglu = m[3];
        c->moe_capacity = bits_float(m[4]);
        c->moe_aux = bits_float(m[5]);
        c->moe_z = bits_float(m[6]);
        auto fine = [](float x) { return std::isfinite(x) && x >= 0.f; };
        if (c->moe_experts < 1 || c->moe_experts > GPT2_MOE_MAX_EXPERTS || c->moe_top_k < 1 ||
            c->moe_top_k > std::min(c->moe_experts, GPT2_MOE_MAX_K) || c->moe_every < 1 ||
            c->moe_every > c->num_layers || (c->moe_swiglu != 0 && c->moe_swiglu != 1) || !fine(c->moe_capacity) ||
            !fine(c->moe_aux) || !fine(c->moe_z) || m[7] != c->moe_hidden()) {
            char what[200];
            snprintf(what, sizeof(what), "implausible Mixture-of-Experts settings in header (E=%d K=%d every=%d "
                     "swiglu=%d capacity=%g alpha=%g beta=%g H=%d)", m[0], m[1], m[2], m[3], c->moe_capacity,
                     c->moe_aux, c->moe_z, m[7]);
            *err = what;
            return false;
        }
    }
    size_t sizes[NUM_MODEL_TENSORS];
    size_t n = model_param_sizes(*c, sizes);
    size_t elem = dtype_version == 3 ? 4 : 2;
    if (size != 1024 + n * elem) {
        *err = "file is " + std::to_string(size) + " bytes, the header's model needs " + std::to_string(1024 + n * elem);
        return false;
    }
    const int at = GPT2_CHECKSUM_SLOT;
    if (checksummed) *checksummed = h[at] == GPT2_CHECKSUM_MARK;
    if (h[at] == GPT2_CHECKSUM_MARK) {  // written by this trainer: its checksum
        uint64_t stored = (uint64_t)(uint32_t)h[at + 1] | (uint64_t)(uint32_t)h[at + 2] << 32;
        if (header_file_checksum(h, {at, at + 1, at + 2}, {{data + 1024, size - 1024}}) != stored) {
            *err = "checksum mismatch: the file's bytes are not those the trainer wrote (damaged on disk or in a copy)";
            return false;
        }
    } else if (h[at] != 0 || h[at + 1] != 0 || h[at + 2] != 0) {  // neither llm.c's zeros nor our mark
        *err = "checksum mismatch: header slots 253-255 hold neither llm.c's zeros nor this trainer's checksum "
               "(damaged on disk or in a copy)";
        return false;
    }
    params->resize(n);
    const uint8_t* body = data + 1024;
    if (dtype_version == 3) {
        memcpy(params->data(), body, n * 4);
    } else {
        for (size_t i = 0; i < n; i++) {  // bf16 -> fp32 is exact: the bits become the high half
            uint32_t w = (uint32_t)(body[2 * i] | body[2 * i + 1] << 8) << 16;
            memcpy(&(*params)[i], &w, 4);
        }
    }
    return true;
}

// Reads a llm.c model checkpoint file into fp32 values (exits with one line if it is unusable).
// require_checksum: the file must carry this trainer's checksum (a resumed checkpoint whose state file
// says its run wrote one), so that damage to the mark itself does not pass for a llm.c file.
inline std::vector<float> load_checkpoint(const std::string& path, GPT2Config* c, bool require_checksum = false) {
    std::vector<uint8_t> bytes;
    std::vector<float> p;
    std::string err;
    bool checksummed = false;
    if (!read_whole_file(path, &bytes, &err)) data_error("cannot read model checkpoint: %s", err.c_str());
    if (!parse_gpt2_checkpoint(bytes.data(), bytes.size(), c, &p, &err, &checksummed))
        data_error("%s: %s", path.c_str(), err.c_str());
    if (require_checksum && !checksummed)
        data_error("%s: checksum mismatch: no checksum mark in header slot 253, which the run that wrote this "
                   "checkpoint puts there (damaged on disk or in a copy)", path.c_str());
    return p;
}

// Writes a llm.c model checkpoint (atomically): the header, then the parameters (c's model_param_sizes
// values in order) as fp32, version 3, or as bf16, version 5 — header and tensor order exactly as
// llm.c writes them, so llm.c and train_gpt2.cu read each other's. A model with experts is written
// in the extension above (103, 105), which this trainer reads back.
inline bool write_gpt2_checkpoint(const std::string& path, const GPT2Config& c, const void* params, bool bf16,
                                  std::string* err) {
    size_t sizes[NUM_MODEL_TENSORS];
    size_t n = model_param_sizes(c, sizes);
    bool moe = c.moe_experts > 0;
    int32_t h[256] = {GPT2_CHECKPOINT_MAGIC, (bf16 ? 5 : 3) + (moe ? GPT2_MOE_VERSION_OFFSET : 0), c.max_seq_len,
                      c.vocab_size, c.num_layers, c.num_heads, c.channels, c.padded_vocab_size};
    if (moe) {
        const int32_t m[8] = {c.moe_experts, c.moe_top_k, c.moe_every, c.moe_swiglu, float_bits(c.moe_capacity),
                              float_bits(c.moe_aux), float_bits(c.moe_z), c.moe_hidden()};
        memcpy(h + GPT2_MOE_HEADER_SLOT, m, sizeof(m));
    }
    const int at = GPT2_CHECKSUM_SLOT;
    uint64_t check = header_file_checksum(h, {at, at + 1, at + 2}, {{params, n * (bf16 ? 2 : 4)}});
    h[at] = GPT2_CHECKSUM_MARK;
    h[at + 1] = (int32_t)(uint32_t)check;
    h[at + 2] = (int32_t)(uint32_t)(check >> 32);
    return write_file_atomic(path, {{h, sizeof(h)}, {params, n * (bf16 ? 2 : 4)}}, err);
}

// ----------------------------------------------------------------------------
// Hugging Face GPT-2: transformers' safetensors checkpoints in and out
//
// GPT2LMHeadModel names its tensors transformer.wte.weight, transformer.h.{l}.attn.c_attn.weight,
// ...; GPT2Model (and the original hub "gpt2" checkpoint) the same without "transformer.". Its
// linear layers are Conv1D modules whose weight is stored (in, out), the transpose of our (out, in).
// The LM head is tied to wte (save_pretrained leaves lm_head.weight out; safetensors' save_model keeps
// it and leaves wte out). Our GPT-2 is exactly that architecture with tanh GELU, layernorm epsilon
// 1e-5, attention scaled by 1/sqrt(head size), an MLP of 4C and a tied head: a config.json asking for
// anything else is refused by name. Its other keys change nothing here: reorder_and_upcast_attn
// computes the same attention in fp32 (what ours does), and the dropout probabilities are training
// settings of a trainer that has no dropout.

// One layer's tensors: which of our parameters, its transformers name after "h.{l}.", and whether it
// is a Conv1D weight (stored transposed).
struct HFLayerTensor {
    int param;
    const char* suffix;
    bool conv1d;
};
inline const HFLayerTensor kHFLayerTensors[] = {
    {LN1W, "ln_1.weight", false},        {LN1B, "ln_1.bias", false},
    {QKVW, "attn.c_attn.weight", true},  {QKVB, "attn.c_attn.bias", false},
    {ATTPROJW, "attn.c_proj.weight", true}, {ATTPROJB, "attn.c_proj.bias", false},
    {LN2W, "ln_2.weight", false},        {LN2B, "ln_2.bias", false},
    {FCW, "mlp.c_fc.weight", true},      {FCB, "mlp.c_fc.bias", false},
    {FCPROJW, "mlp.c_proj.weight", true}, {FCPROJB, "mlp.c_proj.bias", false},
};

// The shape transformers gives one layer's slice of parameter `param`: Conv1D weights (in, out).
inline std::vector<size_t> hf_layer_shape(int param, size_t C) {
    switch (param) {
        case QKVW: return {C, 3 * C};
        case QKVB: return {3 * C};
        case ATTPROJW: return {C, C};
        case FCW: return {C, 4 * C};
        case FCB: return {4 * C};
        case FCPROJW: return {4 * C, C};
        default: return {C};  // layernorm weights and biases, attention and MLP output biases
    }
}

// Copies a (rows, cols) row-major matrix into dst as its (cols, rows) transpose.
inline void transpose_into(float* dst, const float* src, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; r++)
        for (size_t k = 0; k < cols; k++) dst[k * rows + r] = src[r * cols + k];
}

// Reads config.json (transformers' GPT2Config) into *c, refusing what our GPT-2 cannot represent;
// keys it leaves out take GPT2Config's defaults, as transformers does.
// *defaulted (if given): which shape keys config.json left out, as a note for messages ("" if none).
inline void read_hf_gpt2_config(const std::string& path, GPT2Config* c, std::string* defaulted = nullptr) {
    std::vector<uint8_t> text;
    std::string err;
    if (!read_whole_file(path, &text, &err)) data_error("%s", err.c_str());  // also "PATH is a directory"
    json::Value root;
    if (!json::parse((const char*)text.data(), text.size(), &root, &err)) data_error("%s: %s", path.c_str(), err.c_str());
    if (root.type != json::Value::Object) data_error("%s: not a JSON object", path.c_str());
    auto integer = [&](const char* key, int dflt) {
        const json::Value* v = root.get(key);
        if (!v) return dflt;
        if (!v->is_int || v->integer <= 0 || v->integer > (1 << 30))
            data_error("%s: \"%s\" must be a positive integer", path.c_str(), key);
        return (int)v->integer;
    };
    auto flag = [&](const char* key, bool dflt) {
        const json::Value* v = root.get(key);
        if (!v) return dflt;
        if (v->type != json::Value::Bool) data_error("%s: \"%s\" must be true or false", path.c_str(), key);
        return v->boolean;
    };
    const json::Value* type = root.get("model_type");
    if (type && (type->type != json::Value::String || type->str != "gpt2"))
        data_error("%s: model_type is %s, not \"gpt2\"", path.c_str(),
                   type->type == json::Value::String ? json::quote(type->str).c_str() : json::type_name(type->type));
    // GPT2Config's attribute_map makes hidden_size, max_position_embeddings, num_attention_heads and
    // num_hidden_layers other names of n_embd, n_positions, n_head and n_layer: either spelling sets them.
    std::string absent;  // the keys left out, which take GPT2Config's defaults
    auto dimension = [&](const char* key, const char* alias, int dflt) {
        int value = integer(key, 0), other = alias ? integer(alias, 0) : 0;
        if (value && other && value != other)
            data_error("%s: \"%s\" %d and \"%s\" %d disagree (transformers reads both as %s)", path.c_str(), key, value,
                       alias, other, key);
        if (!value && !other) absent += (absent.empty() ? "" : ", ") + std::string(key);
        return value ? value : other ? other : dflt;
    };
    c->vocab_size = dimension("vocab_size", nullptr, 50257);
    c->max_seq_len = dimension("n_positions", "max_position_embeddings", 1024);
    c->channels = dimension("n_embd", "hidden_size", 768);
    c->num_layers = dimension("n_layer", "num_hidden_layers", 12);
    c->num_heads = dimension("n_head", "num_attention_heads", 12);
    c->padded_vocab_size = pad_vocab(c->vocab_size);
    if (!absent.empty()) absent = " (config.json gives no " + absent + ": GPT2Config's defaults)";
    if (defaulted) *defaulted = absent;
    if (c->channels % c->num_heads != 0)
        data_error("%s: n_embd %d is not a multiple of n_head %d%s", path.c_str(), c->channels, c->num_heads,
                   absent.c_str());
    // gelu_new, gelu_pytorch_tanh and gelu_fast are all 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))).
    const json::Value* act = root.get("activation_function");
    if (act && act->type != json::Value::String) data_error("%s: activation_function is not a string", path.c_str());
    std::string activation = act ? act->str : "gelu_new";
    if (activation != "gelu_new" && activation != "gelu_pytorch_tanh" && activation != "gelu_fast")
        data_error("%s: activation_function \"%s\" cannot be represented: this GPT-2 uses the tanh approximation of "
                   "GELU (gelu_new)", path.c_str(), activation.c_str());
    const json::Value* eps = root.get("layer_norm_epsilon");
    if (eps && eps->type != json::Value::Number) data_error("%s: layer_norm_epsilon is not a number", path.c_str());
    if (eps && std::fabs(eps->number - 1e-5) > 1e-12)
        data_error("%s: layer_norm_epsilon %g cannot be represented: this GPT-2's layernorms use 1e-5", path.c_str(),
                   eps->number);
    const json::Value* inner = root.get("n_inner");
    if (inner && inner->type != json::Value::Null && !(inner->is_int && inner->integer == 4 * c->channels))
        data_error("%s: n_inner must be null or 4 * n_embd = %d (this GPT-2's MLP is 4C wide)", path.c_str(),
                   4 * c->channels);
    if (!flag("scale_attn_weights", true))
        data_error("%s: scale_attn_weights false cannot be represented (attention is scaled by 1/sqrt(head size))",
                   path.c_str());
    if (flag("scale_attn_by_inverse_layer_idx", false))
        data_error("%s: scale_attn_by_inverse_layer_idx cannot be represented", path.c_str());
    if (flag("add_cross_attention", false)) data_error("%s: add_cross_attention cannot be represented", path.c_str());
    if (!flag("tie_word_embeddings", true))
        data_error("%s: tie_word_embeddings false cannot be represented (this GPT-2's LM head is wte)", path.c_str());
}

// Reads a transformers GPT-2 checkpoint: path is a directory save_pretrained wrote (model.safetensors,
// or a sharded model.safetensors.index.json and its shards), or one of those files, with transformers'
// config.json beside it (it alone has the number of heads). F32, F16 and BF16 tensors are read
// (widened exactly). Returns the fp32 parameters in our layout (wte padded to Vp rows with zeros) and
// fills *c; exits with one line naming the problem if the checkpoint is not a GPT-2 this model can
// represent. config.json is read first, so that another architecture is named as such.
inline std::vector<float> load_hf_gpt2(const std::string& path, GPT2Config* c) {
    std::string file, err;
    if (!hf_weights_file(path, &file, &err)) data_error("%s", err.c_str());
    size_t slash = file.rfind('/');
    std::string config_path = (slash == std::string::npos ? std::string(".") : file.substr(0, slash)) + "/config.json";
    const char* f = file.c_str();
    struct stat info;
    if (stat(f, &info) != 0) data_error("%s: cannot open: %s", f, strerror(errno));
    if (stat(config_path.c_str(), &info) != 0)
        data_error("%s: no config.json beside it (%s): it is needed for the number of attention heads, which the "
                   "tensors do not tell", f, config_path.c_str());
    std::string defaulted;
    read_hf_gpt2_config(config_path, c, &defaulted);
    SafeTensors st;
    if (!st.load(file, &err)) data_error("%s", err.c_str());
    std::string prefix = st.find("transformer.wpe.weight") ? "transformer." : "";
    const SafeTensor* wpe = st.find(prefix + "wpe.weight");
    if (!wpe) data_error("%s: missing tensor transformer.wpe.weight (or wpe.weight): not a GPT-2 checkpoint", f);
    // The tied embedding is stored once, under either name: save_pretrained keeps wte, safetensors'
    // save_model keeps lm_head.weight (from_pretrained reads both).
    std::string wte_name = st.find(prefix + "wte.weight") || !st.find("lm_head.weight") ? prefix + "wte.weight"
                                                                                          : "lm_head.weight";
    const SafeTensor* wte = st.find(wte_name);
    if (!wte) data_error("%s: missing tensor %swte.weight", f, prefix.c_str());
    if (wte->shape.size() != 2 || wpe->shape.size() != 2 || wte->shape[1] != wpe->shape[1])
        data_error("%s: wte %s and wpe %s are not (V, C) and (maxT, C)", f, SafeTensors::shape_str(wte->shape).c_str(),
                   SafeTensors::shape_str(wpe->shape).c_str());
    size_t layers = 0;  // 1 + the highest l of any h.{l}.* tensor
    std::string h_prefix = prefix + "h.";
    for (const SafeTensor& x : st.tensors()) {
        if (x.name.compare(0, h_prefix.size(), h_prefix) != 0) continue;
        size_t l = 0, i = h_prefix.size();
        while (i < x.name.size() && isdigit((unsigned char)x.name[i]) && l < (1u << 20)) l = l * 10 + (x.name[i++] - '0');
        if (i > h_prefix.size()) layers = std::max(layers, l + 1);
    }

    // The tensors must be the model config.json describes.
    struct { const char* what; size_t file; int config; } dims[] = {
        {"vocab_size (wte rows)", wte->shape[0], c->vocab_size}, {"n_embd (wte columns)", wte->shape[1], c->channels},
        {"n_positions (wpe rows)", wpe->shape[0], c->max_seq_len}, {"n_layer (h.* blocks)", layers, c->num_layers}};
    for (const auto& d : dims)
        if (d.file != (size_t)d.config)
            data_error("%s: %s is %zu in the tensors but %d in %s%s", f, d.what, d.file, d.config, config_path.c_str(),
                       defaulted.c_str());

    size_t sizes[NUM_PARAMETER_TENSORS];
    size_t n = param_sizes(*c, sizes);
    std::vector<float> p(n, 0.f);
    TensorViews<float, NUM_PARAMETER_TENSORS> t;
    t.point_into(p.data(), sizes);
    size_t C = c->channels, V = c->vocab_size, L = c->num_layers;
    std::vector<std::string> used;
    std::vector<float> tmp;
    // Checks tensor `name` has `shape` and converts it to fp32 (into tmp); returns it.
    auto fetch = [&](const std::string& name, const std::vector<size_t>& shape) -> const std::vector<float>& {
        const SafeTensor* x = st.find(name);
        if (!x) data_error("%s: missing tensor %s", f, name.c_str());
        if (x->shape != shape)
            data_error("%s: tensor %s has shape %s, expected %s", f, name.c_str(),
                       SafeTensors::shape_str(x->shape).c_str(), SafeTensors::shape_str(shape).c_str());
        std::string why;
        if (!SafeTensors::to_float(*x, &tmp, &why)) data_error("%s: %s", f, why.c_str());
        used.push_back(name);
        return tmp;
    };
    const std::vector<float>& wte_values = fetch(wte_name, {V, C});
    std::copy(wte_values.begin(), wte_values.end(), t.t[WTE]);  // rows V..Vp-1 stay zero
    const std::vector<float>& wpe_values = fetch(prefix + "wpe.weight", {(size_t)c->max_seq_len, C});
    std::copy(wpe_values.begin(), wpe_values.end(), t.t[WPE]);
    for (size_t l = 0; l < L; l++) {
        for (const HFLayerTensor& h : kHFLayerTensors) {
            std::vector<size_t> shape = hf_layer_shape(h.param, C);
            const std::vector<float>& v = fetch(prefix + "h." + std::to_string(l) + "." + h.suffix, shape);
            float* dst = t.layer(h.param, (int)l, sizes[h.param] / L);
            if (h.conv1d) transpose_into(dst, v.data(), shape[0], shape[1]);
            else std::copy(v.begin(), v.end(), dst);
        }
    }
    const std::vector<float>& lnfw = fetch(prefix + "ln_f.weight", {C});
    std::copy(lnfw.begin(), lnfw.end(), t.t[LNFW]);
    const std::vector<float>& lnfb = fetch(prefix + "ln_f.bias", {C});
    std::copy(lnfb.begin(), lnfb.end(), t.t[LNFB]);
    if (st.find("lm_head.weight") && wte_name != "lm_head.weight") {
        const std::vector<float>& head = fetch("lm_head.weight", {V, C});
        if (memcmp(head.data(), t.t[WTE], V * C * sizeof(float)) != 0)
            data_error("%s: lm_head.weight differs from %swte.weight: an untied LM head cannot be represented (this "
                       "GPT-2's output embedding is wte)", f, prefix.c_str());
    }
    // Anything else is not part of this model; the attention masks are buffers, not parameters.
    for (const SafeTensor& x : st.tensors()) {
        const std::string& name = x.name;
        auto ends_with = [&](const std::string& s) {
            return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
        };
        if (ends_with(".attn.bias") || ends_with(".attn.masked_bias")) continue;
        if (std::find(used.begin(), used.end(), name) == used.end())
            data_error("%s: unexpected tensor %s (not part of a GPT-2 with the %d layers of %s)", f, name.c_str(),
                       c->num_layers, config_path.c_str());
    }
    return p;
}

// Writes our fp32 parameters (llm.c layout) as a transformers GPT-2 checkpoint in dir (created if
// missing): model.safetensors with GPT2LMHeadModel's names, Conv1D weights (in, out), wte unpadded
// (V, C) and no lm_head (tied), as F32 or BF16; and the config.json with which
// GPT2LMHeadModel.from_pretrained(dir) rebuilds this model. A model from transformers (source) keeps
// its config's other settings (token ids, dropouts, generation settings, ...) and its tokenizer files,
// copied into dir; returns the names of those copied. Exits with one line if it cannot write.
inline std::vector<std::string> export_hf_gpt2(const std::string& dir, const GPT2Config& c,
                                               const std::vector<float>& params, bool bf16,
                                               const HFSource& source = HFSource()) {
    if (c.moe_experts > 0)
        data_error("export to %s: a model with Mixture-of-Experts blocks has no Hugging Face GPT-2 form (GPT-2's "
                   "config has no experts); its checkpoints are this trainer's (version 103/105)", dir.c_str());
    size_t sizes[NUM_PARAMETER_TENSORS];
    if (params.size() != param_sizes(c, sizes))
        data_error("export to %s: %zu parameters given, the model has %zu", dir.c_str(), params.size(),
                   param_sizes(c, sizes));
    std::string err;
    if (!make_dirs(dir, &err)) data_error("export to %s: %s", dir.c_str(), err.c_str());

    TensorViews<const float, NUM_PARAMETER_TENSORS> t;
    t.point_into(params.data(), sizes);
    size_t C = c.channels, V = c.vocab_size, L = c.num_layers, maxT = c.max_seq_len;
    SafeTensorsWriter w;
    w.add("transformer.wte.weight", t.t[WTE], {V, C}, bf16);
    w.add("transformer.wpe.weight", t.t[WPE], {maxT, C}, bf16);
    std::vector<float> tmp;
    for (size_t l = 0; l < L; l++) {
        for (const HFLayerTensor& h : kHFLayerTensors) {
            std::vector<size_t> shape = hf_layer_shape(h.param, C);
            const float* src = t.layer(h.param, (int)l, sizes[h.param] / L);
            std::string name = "transformer.h." + std::to_string(l) + "." + h.suffix;
            if (h.conv1d) {  // ours (out, in) = (shape[1], shape[0]) -> (in, out)
                tmp.resize(shape[0] * shape[1]);
                transpose_into(tmp.data(), src, shape[1], shape[0]);
                src = tmp.data();
            }
            w.add(name, src, shape, bf16);
        }
    }
    w.add("transformer.ln_f.weight", t.t[LNFW], {C}, bf16);
    w.add("transformer.ln_f.bias", t.t[LNFB], {C}, bf16);
    if (!w.write(dir + "/model.safetensors", &err)) data_error("export to %s: %s", dir.c_str(), err.c_str());

    // GPT-2's end-of-text token is 50256; a smaller vocabulary (a test model) has no such id, so its
    // last token stands in (transformers would otherwise point generation at an embedding it lacks). A
    // source's own token ids replace these.
    int eot = std::min(50256, c.vocab_size - 1);
    char config[1536];
    snprintf(config, sizeof(config),
             "{\n"
             "  \"activation_function\": \"gelu_new\",\n"
             "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
             "  \"attn_pdrop\": 0.1,\n"
             "  \"bos_token_id\": %d,\n"
             "  \"embd_pdrop\": 0.1,\n"
             "  \"eos_token_id\": %d,\n"
             "  \"initializer_range\": 0.02,\n"
             "  \"layer_norm_epsilon\": 1e-05,\n"
             "  \"model_type\": \"gpt2\",\n"
             "  \"n_ctx\": %d,\n"
             "  \"n_embd\": %d,\n"
             "  \"n_head\": %d,\n"
             "  \"n_inner\": null,\n"
             "  \"n_layer\": %d,\n"
             "  \"n_positions\": %d,\n"
             "  \"reorder_and_upcast_attn\": false,\n"
             "  \"resid_pdrop\": 0.1,\n"
             "  \"scale_attn_by_inverse_layer_idx\": false,\n"
             "  \"scale_attn_weights\": true,\n"
             "  \"tie_word_embeddings\": true,\n"
             "  \"torch_dtype\": \"%s\",\n"
             "  \"use_cache\": true,\n"
             "  \"vocab_size\": %d\n"
             "}\n",
             eot, eot, c.max_seq_len, c.channels, c.num_heads, c.num_layers, c.max_seq_len,
             bf16 ? "bfloat16" : "float32", c.vocab_size);
    // The keys that describe this model are ours; the source's spellings of them (hidden_size for
    // n_embd, dtype for torch_dtype, ...) go, and so do settings it was checked to have.
    std::string text = hf_config_with_source(
        config, source,
        {"activation_function", "add_cross_attention", "architectures", "dtype", "hidden_size", "layer_norm_epsilon",
         "max_position_embeddings", "model_type", "n_ctx", "n_embd", "n_head", "n_inner", "n_layer", "n_positions",
         "num_attention_heads", "num_hidden_layers", "scale_attn_by_inverse_layer_idx", "scale_attn_weights",
         "tie_word_embeddings", "torch_dtype", "vocab_size"});
    std::vector<std::string> copied;
    if (!write_file_atomic(dir + "/config.json", {{text.data(), text.size()}}, &err) ||
        !copy_hf_source_files(source, dir, &copied, &err))
        data_error("export to %s: %s", dir.c_str(), err.c_str());
    return copied;
}
