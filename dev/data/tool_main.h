// dev/data/tool_main.h — what the data tools (tokenize.cpp, bert_data.cpp) share: their main (parse,
// --help, run, summary, one "error: ..." line and exit code 1 on failure), the options both take,
// how both read their inputs (and which they refuse), check and create their output prefix, and how
// they write their shards.
#pragma once
#include "../../llmc/file_io.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace data_tool {

// llm.c token shards (what tokenize writes; llmc/dataloader.h reads them, but needs CUDA headers).
constexpr int32_t TOKEN_SHARD_MAGIC = 20240520;
constexpr int32_t TOKEN_SHARD_VERSION = 1;

// Sets *error to `why`; false, for `return fail(error, ...)`.
inline bool fail(std::string* error, const std::string& why) {
    *error = why;
    return false;
}

// --val-fraction's value: a number in [0, 1].
inline bool parse_val_fraction(const std::string& v, double* out, std::string* error) {
    char* end = nullptr;
    *out = strtod(v.c_str(), &end);
    if (*end || v.empty() || !(*out >= 0 && *out <= 1))
        return fail(error, "--val-fraction must be a number in [0, 1], not '" + v + "'");
    return true;
}

// --shard-tokens' value: a shard's token count, which its header holds as an int32.
inline bool parse_shard_tokens(const std::string& v, long long* out, std::string* error) {
    char* end = nullptr;
    *out = strtoll(v.c_str(), &end, 10);
    if (*end || v.empty() || *out < 1 || *out > INT32_MAX)
        return fail(error, "--shard-tokens must be an integer in [1, 2147483647] (the header's int32), not '" + v +
                               "'");
    return true;
}

// The files to read: each INPUT file as given, each folder's *.txt files recursively and sorted;
// adds up their sizes into *bytes.
inline bool collect_text_files(const std::vector<std::string>& inputs, std::vector<std::string>* files, size_t* bytes,
                               std::string* error) {
    namespace fs = std::filesystem;
    std::error_code ec;
    for (const std::string& in : inputs) {
        fs::file_status st = fs::status(in, ec);
        if (ec || !fs::exists(st))
            return fail(error, "cannot read " + in + ": " + (ec ? ec.message() : "no such file or directory"));
        if (!fs::is_directory(st)) {
            files->push_back(in);
            continue;
        }
        std::vector<std::string> found;
        for (fs::recursive_directory_iterator it(in, ec), end; !ec && it != end; it.increment(ec))
            if (it->is_regular_file() && it->path().extension() == ".txt") found.push_back(it->path().string());
        if (ec) return fail(error, "cannot list " + in + ": " + ec.message());
        std::sort(found.begin(), found.end());
        files->insert(files->end(), found.begin(), found.end());
    }
    for (const std::string& f : *files) {
        uintmax_t size = std::filesystem::file_size(f, ec);
        if (ec) return fail(error, "cannot read " + f + ": " + ec.message());
        *bytes += size;
    }
    return true;
}

// Creates the folders of an output prefix.
inline bool make_parent(const std::string& prefix, std::string* error) {
    std::filesystem::path parent = std::filesystem::path(prefix).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (ec) return fail(error, "cannot create the output folder " + parent.string() + ": " + ec.message());
    return true;
}

// Refuses an --out that names a folder (or ends in '/'): it is a path prefix, and a folder would give
// files beside it ("DIR_train...") or hidden-looking ones in it ("DIR/_train...").
inline bool check_out_prefix(const std::string& out, std::string* error) {
    std::error_code ec;
    if (!out.empty() && (out.back() == '/' || std::filesystem::is_directory(out, ec)))
        return fail(error, "--out " + out + " is a folder: --out is a path prefix like DIR/NAME (for "
                                          "DIR/NAME_train*.bin, DIR/NAME_val*.bin)");
    return true;
}

// Why the file at path is clearly not text, or "" when it may be: a trainer's shard (an llm.c token
// shard, magic 20240520 first; a BERT shard, the bytes "BERT" first), or a NUL byte in its first
// 8 KiB (as git and grep tell binary files).
inline std::string not_text(const std::string& path) {
    char head[8192];
    std::unique_ptr<FILE, int (*)(FILE*)> f(fopen(path.c_str(), "rb"), fclose);
    size_t n = f ? fread(head, 1, sizeof(head), f.get()) : 0;  // unreadable: reading it later says why
    int32_t magic = 0;
    if (n >= sizeof(magic)) memcpy(&magic, head, sizeof(magic));
    if (magic == TOKEN_SHARD_MAGIC) return "an llm.c token shard (magic 20240520)";
    if (n >= 4 && memcmp(head, "BERT", 4) == 0) return "a BERT shard";
    if (memchr(head, 0, n)) return "it holds NUL bytes (a binary file, or UTF-16 text)";
    return "";
}

// Drops the files that are clearly not text (not_text) from *files, and their bytes from *total: a
// file named on the command line (one of `named`) is an error (a mistaken argument), one met in a
// folder is skipped with a warning (a stray file should not stop a big run).
inline bool drop_non_text(const char* tool, const std::vector<std::string>& named, bool quiet,
                          std::vector<std::string>* files, size_t* total, std::string* error) {
    std::vector<std::string> text;
    for (const std::string& path : *files) {
        std::string why = not_text(path);
        if (why.empty()) {
            text.push_back(path);
            continue;
        }
        if (std::find(named.begin(), named.end(), path) != named.end())
            return fail(error, path + " is not text: " + why);
        if (!quiet) printf("%s: warning: skipped %s, not text: %s\n", tool, path.c_str(), why.c_str());
        std::error_code ec;
        uintmax_t size = std::filesystem::file_size(path, ec);
        if (!ec) *total -= size;
    }
    files->swap(text);
    return true;
}

// Whether `name` is that of a file a run with an --out named `stem` writes: stem_val_000000.bin (any
// index; `numbered`) or stem_val.bin (not), the same for _train, or their pending .tmp.
inline bool is_shard_name(const std::string& stem, const std::string& name, bool numbered) {
    for (const char* split : {"_val", "_train"}) {
        std::string start = stem + split;
        if (name.compare(0, start.size(), start) != 0) continue;
        size_t end = start.size();
        if (numbered) {
            if (name.compare(end, 1, "_") != 0) continue;
            end = name.find_first_not_of("0123456789", end + 1);
            if (end == std::string::npos || end < start.size() + 7) continue;
        }
        if (name.compare(end, std::string::npos, ".bin") == 0 || name.compare(end, std::string::npos, ".bin.tmp") == 0)
            return true;
    }
    return false;
}

// Refuses an input that is (by device and inode) an existing output file of --out (is_shard_name):
// the run would replace the file it reads.
inline bool check_inputs_not_outputs(const std::string& prefix, bool numbered, const std::vector<std::string>& files,
                                     std::string* error) {
    namespace fs = std::filesystem;
    const fs::path folder = fs::path(prefix).parent_path();
    const std::string stem = fs::path(prefix).filename().string();
    std::error_code ec;
    for (fs::directory_iterator it(folder.empty() ? "." : folder, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (!is_shard_name(stem, name, numbered)) continue;
        const std::string shard = (folder / name).string();
        for (const std::string& in : files)
            if (same_file(in, shard))
                return fail(error, "--out " + prefix + " would overwrite its input " + in +
                                       (in == shard ? "" : " (" + shard + ")") + ": choose another --out");
    }
    return true;
}

// The files a run writes, each first as PATH.tmp beside its final PATH: commit() renames them all into
// place once the whole run has succeeded; a run that fails before that removes its .tmp files (the
// destructor), so an error leaves an earlier run's files as they were and no new ones (never a new
// train shard beside an old val shard).
class PendingFiles {
  public:
    PendingFiles(const char* tool, bool quiet) : tool_(tool), quiet_(quiet) {}
    ~PendingFiles() {
        std::error_code ec;
        for (const Pending& p : pending_) std::filesystem::remove(p.path + ".tmp", ec);
    }
    PendingFiles(const PendingFiles&) = delete;
    PendingFiles& operator=(const PendingFiles&) = delete;

    // The name to write `path` under until commit().
    std::string add(const std::string& path) {
        pending_.push_back(Pending{path, ""});
        return path + ".tmp";
    }
    // What the file add() named `tmp` holds, for its "wrote" line (e.g. "1000 tokens"). By that name,
    // not "the last one added": a split's shard may be completed after another split's was added.
    void describe(const std::string& tmp, std::string what) {
        for (Pending& p : pending_)
            if (p.path + ".tmp" == tmp) p.what = std::move(what);
    }

    // Renames every file added into place, in the order added, and appends its path to *done.
    bool commit(std::vector<std::string>* done, std::string* error) {
        for (size_t i = 0; i < pending_.size(); i++) {
            const Pending& p = pending_[i];
            std::error_code ec;
            std::filesystem::rename(p.path + ".tmp", p.path, ec);
            if (ec) {
                fail(error, "cannot rename " + p.path + ".tmp to " + p.path + ": " + ec.message());
                pending_.erase(pending_.begin(), pending_.begin() + i);  // the destructor removes the rest
                return false;
            }
            if (!quiet_) printf("%s: wrote %s (%s)\n", tool_, p.path.c_str(), p.what.c_str());
            done->push_back(p.path);
        }
        pending_.clear();
        return true;
    }

  private:
    struct Pending {
        std::string path, what;
    };
    const char* tool_;
    bool quiet_;
    std::vector<Pending> pending_;
};

// Warns about the shard files a longer earlier run left after this run's last ones (`next_paths`, the
// files each split would write next): a loader's glob would read them with this run's.
inline void warn_leftovers(const char* tool, const std::vector<std::string>& next_paths) {
    for (const std::string& stale : next_paths)
        if (std::filesystem::exists(stale))
            printf("%s: warning: %s (maybe more after it) is left from an earlier run: delete it, a loader's glob "
                   "would read it\n",
                   tool, stale.c_str());
}

// A tool's main: parse_args fills the options (or asks for --help, which prints usage), run does the
// work, summary prints what it made. Returns the exit code: 0, or 1 after one "error: ..." line.
template <class Options, class Stats>
int run_main(int argc, char** argv, const char* usage,
             bool (*parse_args)(int, char**, Options*, bool* help, std::string* error),
             bool (*run)(const Options&, Stats*, std::string* error), void (*summary)(const Options&, const Stats&)) {
    Options o;
    bool help;
    std::string error;
    if (!parse_args(argc, argv, &o, &help, &error)) {
        fprintf(stderr, "error: %s\n", error.c_str());
        return 1;
    }
    if (help) {
        fputs(usage, stdout);
        return 0;
    }
    Stats s;
    if (!run(o, &s, &error)) {
        fprintf(stderr, "error: %s\n", error.c_str());
        return 1;
    }
    summary(o, s);
    return 0;
}

}  // namespace data_tool
