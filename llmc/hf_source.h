// llmc/hf_source.h — what a model that came from transformers brings besides its weights, carried into
// --export-hf: the keys of its config.json that our models do not set themselves (token ids, dropout
// settings GPT-2 here does not use, generation and task settings, ...) and its tokenizer and
// generation files. A training run keeps them beside its checkpoints (OUTDIR/hf_source/), so a
// resumed run, or a run started from one of its checkpoints, exports them too.
#pragma once
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "checkpoint.h"  // make_dirs, write_file_atomic
#include "dataloader.h"  // data_error
#include "file_io.h"
#include "json.h"

// The folder of a run's output directory that keeps its model's transformers source.
constexpr const char kHFSourceDir[] = "hf_source";

// The files besides config.json that go with a transformers model and stay valid when its weights
// are trained: the tokenizer's (GPT-2's BPE, BERT's WordPiece, the fast tokenizer's one file) and the
// generation settings.
inline const char* const kHFSourceFiles[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json",     "merges.txt",            "vocab.txt",               "generation_config.json"};

struct HFSource {
    std::string dir;     // the folder its files are in ("" when the model has no transformers source)
    json::Value config;  // its config.json, an object (without a train_bert run's llmc_run)
    bool found() const { return !dir.empty(); }
};

// The transformers source of the model read from path (a model file, or the folder of a transformers
// checkpoint): the hf_source folder a run keeps beside its checkpoints, when there is one; else, when
// the model is a transformers checkpoint (from_transformers), the folder with its config.json; else
// none. Exits with one line if that config.json is unreadable or not a JSON object.
inline HFSource find_hf_source(const std::string& path, bool from_transformers) {
    std::string dir = model_folder(path);
    HFSource s;
    struct stat st;
    if (stat((dir + "/" + kHFSourceDir + "/config.json").c_str(), &st) == 0) s.dir = dir + "/" + kHFSourceDir;
    else if (from_transformers && stat((dir + "/config.json").c_str(), &st) == 0) s.dir = dir;
    else return s;
    std::string file = s.dir + "/config.json", err;
    std::vector<uint8_t> text;
    if (!read_whole_file(file, &text, &err)) data_error("%s", err.c_str());
    if (!json::parse((const char*)text.data(), text.size(), &s.config, &err))
        data_error("%s: %s", file.c_str(), err.c_str());
    if (s.config.type != json::Value::Object) data_error("%s: not a JSON object", file.c_str());
    auto& fields = s.config.fields;
    fields.erase(std::remove_if(fields.begin(), fields.end(), [](const auto& f) { return f.first == "llmc_run"; }),
                 fields.end());
    return s;
}

// Copies the kHFSourceFiles that src has into dir (which exists), replacing what is there; returns
// their names. Nothing to do when dir is src's own folder. False with *err if a copy fails.
inline bool copy_hf_source_files(const HFSource& src, const std::string& dir, std::vector<std::string>* copied,
                                 std::string* err) {
    copied->clear();
    if (!src.found() || same_file(src.dir, dir)) return true;
    for (const char* name : kHFSourceFiles) {
        std::string from = src.dir + "/" + name;
        struct stat st;
        if (stat(from.c_str(), &st) != 0) continue;
        std::vector<uint8_t> bytes;
        if (!read_whole_file(from, &bytes, err) ||
            !write_file_atomic(dir + "/" + name, {{bytes.data(), bytes.size()}}, err))
            return false;
        copied->push_back(name);
    }
    return true;
}

// Keeps src in run_dir/hf_source (its config.json and files) for the run's resumes and for runs that
// start from its checkpoints; with no source, removes what an earlier run left there, so that this
// run's checkpoints are not exported with another model's settings. False with *err if it cannot.
inline bool save_hf_source(const std::string& run_dir, const HFSource& src, std::string* err) {
    std::string dir = run_dir + "/" + kHFSourceDir;
    if (!src.found()) {
        if (!is_directory(dir)) return true;
        unlink((dir + "/config.json").c_str());
        for (const char* name : kHFSourceFiles) unlink((dir + "/" + name).c_str());
        rmdir(dir.c_str());  // left in place if someone put other files there
        return true;
    }
    if (same_file(src.dir, dir)) return true;  // a resumed run: already kept
    if (!make_dirs(dir, err)) return false;
    for (const char* name : kHFSourceFiles) unlink((dir + "/" + name).c_str());  // an earlier source's
    std::string config = json::write(src.config) + "\n";
    std::vector<std::string> copied;
    return write_file_atomic(dir + "/config.json", {{config.data(), config.size()}}, err) &&
           copy_hf_source_files(src, dir, &copied, err);
}

// The config.json text to export: ours (the complete config of our model, JSON object text) with every
// key of src's config that ours_only does not name added, or replacing ours; keys sorted, as
// transformers writes them. ours_only: the keys that describe our model (shape, architecture, the
// settings it runs with), whose source values may no longer hold (or were other names for them).
inline std::string hf_config_with_source(const std::string& ours, const HFSource& src,
                                         std::initializer_list<const char*> ours_only) {
    json::Value config;
    std::string err;
    if (!json::parse(ours.data(), ours.size(), &config, &err) || config.type != json::Value::Object)
        data_error("internal error: the exported config.json is not a JSON object: %s", err.c_str());
    for (const auto& field : src.config.fields) {
        if (std::any_of(ours_only.begin(), ours_only.end(), [&](const char* k) { return field.first == k; })) continue;
        auto at = std::find_if(config.fields.begin(), config.fields.end(),
                               [&](const auto& f) { return f.first == field.first; });
        if (at != config.fields.end()) at->second = field.second;
        else config.fields.push_back(field);
    }
    std::sort(config.fields.begin(), config.fields.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    return json::write(config) + "\n";
}

// Reports an export into dir: "exported for transformers: DIR/model.safetensors + config.json" with
// `what` (e.g. the architecture) and what it carried from src ("the settings of SRC/config.json; its
// vocab.json, merges.txt"), then a warning naming the tokenizer and generation files in dir that it
// did not write: an earlier export's, or someone's own, which transformers would take for this
// model's. They are left in place (they may be right: a tokenizer put there for a random init).
inline void report_hf_export(const std::string& dir, const std::string& what, const HFSource& src,
                             const std::vector<std::string>& copied) {
    std::vector<std::string> notes;
    if (!what.empty()) notes.push_back(what);
    if (src.found()) {
        std::string carried = "the settings of " + src.dir + "/config.json";
        for (size_t i = 0; i < copied.size(); i++) carried += (i ? ", " : "; its ") + copied[i];
        notes.push_back(carried);
    }
    std::string line = "exported for transformers: " + dir + "/model.safetensors + config.json";
    for (size_t i = 0; i < notes.size(); i++) line += (i ? "; " : " (") + notes[i] + (i + 1 == notes.size() ? ")" : "");
    printf("%s\n", line.c_str());
    std::string others;
    for (const char* name : kHFSourceFiles) {
        struct stat st;
        if (std::find(copied.begin(), copied.end(), name) == copied.end() &&
            stat((dir + "/" + name).c_str(), &st) == 0)
            others += (others.empty() ? "" : ", ") + std::string(name);
    }
    if (!others.empty())
        printf("warning: %s also holds %s, which this export did not write (an earlier one's?): transformers will "
               "use them with this model; remove them if they are not its\n", dir.c_str(), others.c_str());
}
