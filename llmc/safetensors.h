// llmc/safetensors.h — Hugging Face safetensors files: a strict reader (F32, F16 and BF16 tensors
// read as fp32, one file or the shards of a sharded checkpoint) and a writer of fp32 values as F32 or
// BF16. Host C++17, standard library only.
//
// Format (github.com/huggingface/safetensors): 8 bytes N, little-endian u64; N bytes of UTF-8 JSON
// {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {"key": "value", ...} (optional, strings only)}; then the data, tensors in C
// order, little-endian, offsets relative to the data start. The reference implementation refuses a
// header over 100 MB, and requires the tensors, sorted by offset, to tile the data exactly: the
// first starts at 0, each starts where the previous ended, the last ends at the end of the file (no
// holes, so no polyglot files; no overlaps). Empty tensors (a 0 in the shape) take no bytes, and a
// shape [] is a scalar. Its writer pads the header with spaces to a multiple of 8 bytes so that the
// data is aligned.
//
// Reading refuses, with one line naming the problem: a header length beyond the file or above
// 100 MB, invalid JSON or UTF-8 (llmc/json.h), a missing or mistyped field, an unknown dtype, a
// negative or non-integer number, shape x dtype size != end - begin, offsets beyond the data,
// overlapping or non-contiguous tensors, duplicate names; and it names a PyTorch pickle
// (pytorch_model.bin) and a Git LFS pointer (a hub repository cloned without git-lfs) for what they
// are. Dtypes other than F32/F16/BF16 (I64, U8, F8_E4M3, ...) are valid in a file, and parse, but
// to_float() refuses them by name.
//
// Sharded checkpoints: above max_shard_size, transformers' save_pretrained writes the tensors into
// model-00001-of-0000N.safetensors ... with model.safetensors.index.json beside them,
// {"metadata": {...}, "weight_map": {"tensor name": "shard file name", ...}}. load() of the index reads
// every shard it names, and refuses a shard missing a tensor the map puts there, a tensor the map
// does not list, and a tensor in two shards. hf_weights_file() finds the weights of a save_pretrained
// directory.
//
// Checksum: the writer records the data's Checksum64 (llmc/file_io.h) in __metadata__ as
// "llmc_checksum" (16 hex digits), which the reader verifies where a file has one (this project's
// files: a checkpoint damaged on disk is refused), not where it has none (everyone else's). Other
// readers (transformers) ignore the key.
#pragma once
#include "checkpoint.h"  // complete_checkpoints: a run's output directory
#include "file_io.h"
#include "json.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "llmc/safetensors.h reads and writes little-endian data in place: a big-endian host needs byte swaps"
#endif

// One tensor of a parsed file: a view into the file's bytes.
struct SafeTensor {
    std::string name;
    std::string dtype;            // as in the file: "F32", "BF16", "I64", ...
    size_t elem_size = 0;         // bytes per element
    std::vector<size_t> shape;    // [] for a scalar
    size_t numel = 1;             // product of shape
    size_t begin = 0, end = 0;    // data_offsets, relative to the data start
    const uint8_t* data = nullptr;  // end - begin bytes
};

class SafeTensors {
  public:
    SafeTensors() = default;
    // Moves keep the tensors' views valid (the owned bytes move with them); copies would not.
    SafeTensors(SafeTensors&&) = default;
    SafeTensors& operator=(SafeTensors&&) = default;
    SafeTensors(const SafeTensors&) = delete;
    SafeTensors& operator=(const SafeTensors&) = delete;

    // The header length the reference implementation accepts at most.
    static constexpr uint64_t MAX_HEADER_BYTES = 100000000;

    // Parses a whole file held in data[0, n). The tensors view data, which must outlive this object
    // (load() keeps its own copy). On failure returns false with one line in *err.
    bool parse(const uint8_t* data, size_t n, std::string* err) {
        tensors_.clear();
        metadata_.clear();
        if (n < 8) return fail(err, "file is " + std::to_string(n) + " bytes, too short for the 8-byte header length");
        if (is_pickle(data, n))
            return fail(err, std::string("a PyTorch pickle (as pytorch_model.bin), not a safetensors file: ") +
                                 kPickleAdvice);
        if (is_lfs_pointer(data, n)) return fail(err, kLfsPointer);
        uint64_t header_len = 0;
        memcpy(&header_len, data, 8);
        // Text read as a length is absurd or past the file; a JSON file's first byte names it (a real
        // length of 123 + 256·k also starts with '{', but fits).
        if (data[0] == '{' && (header_len > MAX_HEADER_BYTES || header_len > n - 8))
            return fail(err, "a JSON file (config.json?), not a safetensors file: for a Hugging Face checkpoint "
                             "give its directory");
        if (header_len > MAX_HEADER_BYTES) {
            // This project's data files, given where a model goes, are named by their magic.
            const int32_t gpt2_shard_magic = 20240520;
            if (!memcmp(data, "BERT", 4))
                return fail(err, "a BERT data shard (train_bert's -i), not a safetensors file");
            if (!memcmp(data, &gpt2_shard_magic, 4))
                return fail(err, "a GPT-2 token shard (train_gpt2's -i), not a safetensors file");
            return fail(err, "header length " + std::to_string(header_len) + " is absurd (the format's limit is " +
                                 std::to_string(MAX_HEADER_BYTES) + " bytes)");
        }
        if (header_len > n - 8)
            return fail(err, "header length " + std::to_string(header_len) + " is beyond the file (" +
                                 std::to_string(n - 8) + " bytes after the 8-byte length)");
        const uint8_t* data_start = data + 8 + header_len;
        size_t data_len = n - 8 - (size_t)header_len;

        json::Value root;
        std::string jerr;
        if (!json::parse((const char*)data + 8, (size_t)header_len, &root, &jerr))
            return fail(err, "header: " + jerr);
        if (root.type != json::Value::Object)
            return fail(err, std::string("header is ") + json::type_name(root.type) + ", not a JSON object");

        for (const auto& field : root.fields) {
            const std::string& name = field.first;
            const json::Value& info = field.second;
            if (name == "__metadata__") {
                if (info.type != json::Value::Object)
                    return fail(err, std::string("__metadata__ is ") + json::type_name(info.type) + ", not an object");
                for (const auto& kv : info.fields) {
                    if (kv.second.type != json::Value::String)
                        return fail(err, "__metadata__ value of \"" + kv.first + "\" is " +
                                             json::type_name(kv.second.type) + ", not a string");
                    metadata_[kv.first] = kv.second.str;
                }
                continue;
            }
            SafeTensor t;
            if (!parse_tensor(name, info, data_len, &t, err)) return false;
            t.data = data_start + t.begin;
            tensors_.push_back(std::move(t));
        }

        // Contiguity: sorted by offset, the tensors must tile [0, data_len) exactly.
        std::sort(tensors_.begin(), tensors_.end(), [](const SafeTensor& a, const SafeTensor& b) {
            return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
        });
        size_t covered = 0;
        for (size_t i = 0; i < tensors_.size(); i++) {
            const SafeTensor& t = tensors_[i];
            if (t.begin < covered)
                return fail(err, "tensors \"" + tensors_[i - 1].name + "\" and \"" + t.name + "\" overlap (bytes " +
                                     std::to_string(t.begin) + ".." + std::to_string(covered) + " of the data)");
            if (t.begin > covered) return fail(err, hole(covered, t.begin));
            covered = t.end;
        }
        if (covered != data_len) return fail(err, hole(covered, data_len));
        auto recorded = metadata_.find(kChecksumKey);
        if (recorded != metadata_.end() && recorded->second != checksum_text(Checksum64::of(data_start, data_len)))
            return fail(err, "checksum mismatch: the tensors' bytes are not those that were written (damaged on "
                             "disk or in a copy)");
        return true;
    }

    // The __metadata__ key of the data's checksum, and the checksum as its value: 16 hex digits.
    static constexpr const char* kChecksumKey = "llmc_checksum";
    static std::string checksum_text(uint64_t sum) {
        char text[17];
        snprintf(text, sizeof(text), "%016llx", (unsigned long long)sum);
        return text;
    }

    // Reads the file at path (the whole of it, kept in memory) and parses it; errors start with path.
    // A path ending in .index.json is a sharded checkpoint's index: every shard it names is read, and
    // tensors() holds them all (shard after shard).
    bool load(const std::string& path, std::string* err) {
        tensors_.clear();
        metadata_.clear();
        files_.clear();
        const std::string index = ".index.json";
        if (path.size() >= index.size() && path.compare(path.size() - index.size(), index.size(), index) == 0)
            return load_index(path, err);
        return add_file(path, err);
    }

    // Whether data[0, n) starts as torch.save's files do (pytorch_model.bin): a zip archive, or before
    // torch 1.6 a pickle of protocol 2 whose first value is torch's magic number (80 02 8a 0a: as a
    // safetensors header length, 177 MB, beyond the format's limit).
    static bool is_pickle(const uint8_t* data, size_t n) {
        return n >= 4 && (memcmp(data, "PK\x03\x04", 4) == 0 || memcmp(data, "\x80\x02\x8a\x0a", 4) == 0);
    }

    // Whether data[0, n) is a Git LFS pointer: the few lines of text a repository (the Hugging Face
    // hub's, cloned without git-lfs) holds in place of a large file.
    static bool is_lfs_pointer(const uint8_t* data, size_t n) {
        static const char kStart[] = "version https://git-lfs.github.com/spec/";
        return n >= sizeof(kStart) - 1 && memcmp(data, kStart, sizeof(kStart) - 1) == 0;
    }
    static constexpr const char* kLfsPointer =
        "a Git LFS pointer, not the file itself (a clone without git-lfs): fetch it with git lfs pull";

    // What to do with a pickle instead: the advice of every message about one.
    static constexpr const char* kPickleAdvice =
        "this project reads safetensors only (unpickling can run code): save the model with "
        "save_pretrained(DIR, safe_serialization=True), or convert the file with python3 "
        "scripts/bert_to_safetensors.py FILE (any state dict of tensors; a sharded save: its .index.json)";

    // The tensor called name, or nullptr.
    const SafeTensor* find(const std::string& name) const {
        for (const auto& t : tensors_)
            if (t.name == name) return &t;
        return nullptr;
    }

    // Every tensor, in data order (a sharded checkpoint's shard after shard).
    const std::vector<SafeTensor>& tensors() const { return tensors_; }
    // The __metadata__ strings.
    const std::map<std::string, std::string>& metadata() const { return metadata_; }

    // Converts t's numel elements to fp32 into out (F32 copied, F16 and BF16 widened exactly);
    // refuses other dtypes by name.
    static bool to_float(const SafeTensor& t, float* out, std::string* err) {
        const uint8_t* d = t.data;
        if (t.dtype == "F32") {
            if (t.numel) memcpy(out, d, t.numel * 4);
        } else if (t.dtype == "BF16" || t.dtype == "F16") {
            bool bf = t.dtype == "BF16";
            for (size_t i = 0; i < t.numel; i++) {
                uint16_t h;
                memcpy(&h, d + 2 * i, 2);
                out[i] = bf ? bf16_to_float(h) : f16_to_float(h);
            }
        } else {
            return fail(err, "tensor \"" + t.name + "\" has dtype " + t.dtype +
                                 ", which cannot be read as floats (F32, F16 and BF16 can)");
        }
        return true;
    }

    // t's values as fp32 (see to_float above); false and *err for a non-float dtype.
    static bool to_float(const SafeTensor& t, std::vector<float>* out, std::string* err) {
        out->resize(t.numel);
        return to_float(t, out->data(), err);
    }

    // Bit-exact widenings of the 16-bit float formats.
    static float bf16_to_float(uint16_t h) {
        uint32_t w = (uint32_t)h << 16;
        float f;
        memcpy(&f, &w, 4);
        return f;
    }
    static float f16_to_float(uint16_t h) {
        uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, mant = h & 0x3FF, w;
        if (exp == 0x1F) {
            w = sign | 0x7F800000u | (mant << 13);  // inf, NaN (payload kept)
        } else if (exp != 0) {
            w = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
        } else if (mant == 0) {
            w = sign;  // +-0
        } else {  // subnormal: normalize
            int e = -1;
            do { mant <<= 1; e++; } while (!(mant & 0x400));
            w = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3FF) << 13);
        }
        float f;
        memcpy(&f, &w, 4);
        return f;
    }

    // Bytes per element of the dtypes the format defines, 0 for an unknown name.
    static size_t dtype_size(const std::string& d) {
        static const std::map<std::string, size_t> sizes = {
            {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
            {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4}, {"F64", 8}, {"I64", 8}, {"U64", 8}};
        auto it = sizes.find(d);
        return it == sizes.end() ? 0 : it->second;
    }

  private:
    static bool fail(std::string* err, const std::string& why) {
        if (err) *err = why;
        return false;
    }

    // Reads and parses the file at path, adding its tensors and metadata to this object's.
    bool add_file(const std::string& path, std::string* err) {
        std::string what = not_a_regular_file(path);  // a directory opens, and its "size" is absurd
        if (!what.empty()) return fail(err, what);
        FILE* f = fopen(path.c_str(), "rb");
        if (!f) return fail(err, path + ": cannot open: " + strerror(errno));
        std::vector<uint8_t> bytes;
        bool ok = fseek(f, 0, SEEK_END) == 0;
        long size = ok ? ftell(f) : -1;
        ok = size >= 0 && fseek(f, 0, SEEK_SET) == 0;
        if (ok) {
            bytes.resize((size_t)size);
            ok = fread(bytes.data(), 1, bytes.size(), f) == bytes.size();
        }
        fclose(f);
        if (!ok) return fail(err, path + ": read failed");
        files_.push_back(std::move(bytes));  // the buffer itself does not move: the views stay valid
        SafeTensors part;
        std::string why;
        if (!part.parse(files_.back().data(), files_.back().size(), &why)) return fail(err, path + ": " + why);
        tensors_.insert(tensors_.end(), part.tensors_.begin(), part.tensors_.end());
        metadata_.insert(part.metadata_.begin(), part.metadata_.end());
        return true;
    }

    // Reads a sharded checkpoint: the index at path and every shard its weight_map names (plain file
    // names, beside the index), checking that the shards hold exactly the tensors the map puts there.
    bool load_index(const std::string& path, std::string* err) {
        std::vector<uint8_t> text;
        std::string why;
        if (!read_whole_file(path, &text, &why)) return fail(err, why);
        json::Value root;
        if (!json::parse((const char*)text.data(), text.size(), &root, &why)) return fail(err, path + ": " + why);
        const json::Value* map = root.get("weight_map");
        if (!map || map->type != json::Value::Object || map->fields.empty())
            return fail(err, path + ": no \"weight_map\" object naming the shards (not a sharded checkpoint's index)");
        size_t slash = path.rfind('/');
        std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
        std::vector<std::string> shards;  // in the order the map first names them
        for (const auto& entry : map->fields) {
            const json::Value& shard = entry.second;
            if (shard.type != json::Value::String || shard.str.empty() || shard.str.find('/') != std::string::npos)
                return fail(err, path + ": weight_map's shard of \"" + entry.first +
                                     "\" is not a file name (the shards lie beside the index)");
            if (std::find(shards.begin(), shards.end(), shard.str) == shards.end()) shards.push_back(shard.str);
        }
        std::map<std::string, std::string> shard_of;  // every tensor read, and its shard
        for (const std::string& shard : shards) {
            size_t before = tensors_.size();
            if (!add_file(dir + "/" + shard, err)) return false;
            for (size_t i = before; i < tensors_.size(); i++) {
                const std::string& name = tensors_[i].name;
                if (shard_of.count(name))
                    return fail(err, path + ": tensor \"" + name + "\" is in two shards, " + shard_of[name] + " and " + shard);
                shard_of[name] = shard;
            }
        }
        for (const auto& entry : map->fields) {
            auto it = shard_of.find(entry.first);
            if (it == shard_of.end() || it->second != entry.second.str)
                return fail(err, path + ": weight_map puts tensor \"" + entry.first + "\" in " + entry.second.str +
                                     ", which does not hold it");
        }
        for (const auto& kv : shard_of)
            if (!map->get(kv.first))
                return fail(err, dir + "/" + kv.second + ": tensor \"" + kv.first + "\" is not in the weight_map of " + path);
        return true;
    }

    static std::string hole(size_t from, size_t to) {
        return "bytes " + std::to_string(from) + ".." + std::to_string(to) +
               " of the data belong to no tensor (the format requires the tensors to cover the data contiguously)";
    }

    // A non-negative integer that JSON readers hold exactly (<= 2^53).
    static bool count(const json::Value& v, const std::string& what, uint64_t* out, std::string* err) {
        if (v.type != json::Value::Number) return fail(err, what + " is " + json::type_name(v.type) + ", not an integer");
        if (v.number < 0) return fail(err, what + " is negative");
        if (!v.is_int) return fail(err, what + " is not an integer in [0, 2^53]");
        *out = (uint64_t)v.integer;
        return true;
    }

    // Validates one header entry and fills t (all but t.data).
    static bool parse_tensor(const std::string& name, const json::Value& info, size_t data_len, SafeTensor* t,
                             std::string* err) {
        std::string where = "tensor \"" + name + "\"";
        if (info.type != json::Value::Object)
            return fail(err, where + " is described by " + json::type_name(info.type) + ", not an object");
        t->name = name;
        const json::Value* dtype = info.get("dtype");
        const json::Value* shape = info.get("shape");
        const json::Value* offsets = info.get("data_offsets");
        if (!dtype) return fail(err, where + ": missing field \"dtype\"");
        if (!shape) return fail(err, where + ": missing field \"shape\"");
        if (!offsets) return fail(err, where + ": missing field \"data_offsets\"");
        if (dtype->type != json::Value::String)
            return fail(err, where + ": dtype is " + json::type_name(dtype->type) + ", not a string");
        t->dtype = dtype->str;
        t->elem_size = dtype_size(t->dtype);
        if (!t->elem_size) return fail(err, where + ": unknown dtype \"" + t->dtype + "\"");
        if (shape->type != json::Value::Array)
            return fail(err, where + ": shape is " + json::type_name(shape->type) + ", not an array");
        // numel and bytes checked for overflow: both stay <= 2^53 * 8 when every step is bounded.
        uint64_t numel = 1;
        bool zero = false;
        for (size_t i = 0; i < shape->items.size(); i++) {
            uint64_t dim;
            if (!count(shape->items[i], where + ": shape[" + std::to_string(i) + "]", &dim, err)) return false;
            t->shape.push_back((size_t)dim);
            if (dim == 0) zero = true;
            else if (!zero && numel > json::MAX_EXACT_INT / dim)
                return fail(err, where + ": shape has more than 2^53 elements");
            else if (!zero) numel *= dim;
        }
        t->numel = zero ? 0 : (size_t)numel;
        if (offsets->type != json::Value::Array || offsets->items.size() != 2)
            return fail(err, where + ": data_offsets must be an array [begin, end]");
        uint64_t begin, end;
        if (!count(offsets->items[0], where + ": data_offsets begin", &begin, err)) return false;
        if (!count(offsets->items[1], where + ": data_offsets end", &end, err)) return false;
        if (end < begin)
            return fail(err, where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                                 "] end before they begin");
        if (end > data_len)
            return fail(err, where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                                 "] are out of range (the data is " + std::to_string(data_len) +
                                 " bytes: a truncated file?)");
        uint64_t bytes = (uint64_t)t->numel * t->elem_size;
        if (end - begin != bytes)
            return fail(err, where + ": shape " + shape_str(t->shape) + " of " + t->dtype + " is " +
                                 std::to_string(bytes) + " bytes but data_offsets [" + std::to_string(begin) + ", " +
                                 std::to_string(end) + "] hold " + std::to_string(end - begin));
        t->begin = (size_t)begin;
        t->end = (size_t)end;
        return true;
    }

  public:
    // "[2, 3]" for error messages.
    static std::string shape_str(const std::vector<size_t>& shape) {
        std::string s = "[";
        for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
        return s + "]";
    }

  private:
    std::vector<SafeTensor> tensors_;
    std::map<std::string, std::string> metadata_;
    std::vector<std::vector<uint8_t>> files_;  // the files load() read, which the tensors view
};

// The weights file of the transformers checkpoint at path: path itself unless it is a directory;
// in a directory save_pretrained wrote, model.safetensors, or model.safetensors.index.json for a
// sharded save. False with one line in *err for a directory holding neither: one with only
// pytorch_model.bin (safe_serialization=False) is told what to do instead, and a run's output
// directory (-o) is told its newest model file.
inline bool hf_weights_file(const std::string& path, std::string* file, std::string* err) {
    struct stat info;
    if (stat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
        // One shard of a sharded save (NAME-00001-of-00003.safetensors) is a part of the model.
        unsigned part = 0, parts = 0;
        char tail[16] = "";
        size_t slash = path.rfind('/');
        const std::string name = path.substr(slash == std::string::npos ? 0 : slash + 1);
        size_t of = name.rfind("-of-");
        size_t dash = of == std::string::npos || of == 0 ? std::string::npos : name.rfind('-', of - 1);
        if (dash != std::string::npos && sscanf(name.c_str() + dash, "-%5u-of-%5u%15s", &part, &parts, tail) == 3 &&
            strcmp(tail, ".safetensors") == 0 && parts > 1) {
            const std::string folder = slash == std::string::npos ? "." : path.substr(0, slash);
            *err = path + ": one shard (" + std::to_string(part) + " of " + std::to_string(parts) +
                   ") of a sharded save, a part of the model: give its folder, " + folder + ", or its " +
                   "model.safetensors.index.json";
            return false;
        }
        *file = path;  // a file (or nothing: load() says it cannot open it)
        return true;
    }
    for (const char* name : {"model.safetensors", "model.safetensors.index.json"}) {
        *file = path + "/" + name;
        if (stat(file->c_str(), &info) == 0) return true;
    }
    for (const char* name : {"pytorch_model.bin", "pytorch_model.bin.index.json"})
        if (stat((path + "/" + name).c_str(), &info) == 0) {
            *err = path + ": holds " + name + ", a PyTorch pickle, and no model.safetensors: " +
                   SafeTensors::kPickleAdvice;
            return false;
        }
    std::vector<int> steps = complete_checkpoints(path);
    if (!steps.empty()) {
        *err = path + ": a run's output directory, not a Hugging Face checkpoint: give its model file, " +
               checkpoint_file(path, "model", steps.back()) + " (-y -o " + path + " resumes the run instead)";
        return false;
    }
    *err = path + ": holds no model.safetensors (nor model.safetensors.index.json, a sharded checkpoint's index)";
    return false;
}

// Collects named fp32 tensors and writes them as one safetensors file, each as F32 or BF16
// (rounded to nearest even, as torch's .to(torch.bfloat16) rounds), with metadata {"format": "pt"}
// (transformers' loader expects it).
class SafeTensorsWriter {
  public:
    SafeTensorsWriter() { metadata_["format"] = "pt"; }

    // Adds a tensor of prod(shape) values (copied now) stored as BF16 if bf16, else F32.
    void add(const std::string& name, const float* values, const std::vector<size_t>& shape, bool bf16 = false) {
        size_t n = 1;
        for (size_t d : shape) n *= d;
        Entry e{name, bf16 ? "BF16" : "F32", shape, {}};
        if (bf16) {
            e.bytes.resize(2 * n);
            for (size_t i = 0; i < n; i++) {
                uint16_t h = float_to_bf16(values[i]);
                memcpy(e.bytes.data() + 2 * i, &h, 2);
            }
        } else {
            e.bytes.resize(4 * n);
            if (n) memcpy(e.bytes.data(), values, 4 * n);
        }
        entries_.push_back(std::move(e));
    }

    // Sets a __metadata__ entry.
    void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

    // The whole file as bytes: length, header padded with spaces to a multiple of 8, data.
    std::vector<uint8_t> serialize() const {
        Checksum64 sum;
        for (const Entry* e : data_order()) sum.add(e->bytes.data(), e->bytes.size());
        std::map<std::string, std::string> metadata = metadata_;
        metadata[SafeTensors::kChecksumKey] = SafeTensors::checksum_text(sum.value());
        std::string header = "{\"__metadata__\":{";
        bool first = true;
        for (const auto& kv : metadata) {
            header += (first ? "" : ",") + json::quote(kv.first) + ":" + json::quote(kv.second);
            first = false;
        }
        header += "}";
        size_t offset = 0;
        for (const Entry* e : data_order()) {
            header += "," + json::quote(e->name) + ":{\"dtype\":\"" + e->dtype + "\",\"shape\":[";
            for (size_t i = 0; i < e->shape.size(); i++) header += (i ? "," : "") + std::to_string(e->shape[i]);
            header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + e->bytes.size()) + "]}";
            offset += e->bytes.size();
        }
        header += "}";
        header.append((8 - header.size() % 8) % 8, ' ');
        uint64_t n = header.size();
        std::vector<uint8_t> out(8 + header.size() + offset);
        memcpy(out.data(), &n, 8);
        memcpy(out.data() + 8, header.data(), header.size());
        uint8_t* p = out.data() + 8 + header.size();
        for (const Entry* e : data_order()) {
            if (!e->bytes.empty()) memcpy(p, e->bytes.data(), e->bytes.size());
            p += e->bytes.size();
        }
        return out;
    }

    // Writes the file crash-safely (write_file_atomic: path + ".tmp", flushed to disk, renamed), so
    // a crash never leaves a partial file under the real name. On failure returns false with one line
    // in *err.
    bool write(const std::string& path, std::string* err) const {
        std::vector<uint8_t> bytes = serialize();
        std::string why;
        if (!write_file_atomic(path, {{bytes.data(), bytes.size()}}, &why)) return fail(err, why);
        return true;
    }

    // fp32 -> bf16 rounded to nearest, ties to even; NaN stays a (quiet) NaN of the same sign.
    static uint16_t float_to_bf16(float f) {
        uint32_t w;
        memcpy(&w, &f, 4);
        if ((w & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((w >> 16) | 0x0040);
        w += 0x7FFFu + ((w >> 16) & 1);
        return (uint16_t)(w >> 16);
    }

  private:
    static bool fail(std::string* err, const std::string& why) {
        if (err) *err = why;
        return false;
    }
    struct Entry {
        std::string name, dtype;
        std::vector<size_t> shape;
        std::vector<uint8_t> bytes;
    };
    // F32 tensors first, then BF16, each group in the order added: with the data start 8-byte
    // aligned, every tensor then starts aligned to its element size (as the reference orders by
    // alignment), so a reader can use the bytes in place.
    std::vector<const Entry*> data_order() const {
        std::vector<const Entry*> order;
        for (const char* dtype : {"F32", "BF16"})
            for (const auto& e : entries_)
                if (e.dtype == dtype) order.push_back(&e);
        return order;
    }

    std::vector<Entry> entries_;
    std::map<std::string, std::string> metadata_;
};
