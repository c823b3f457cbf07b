// llmc/checkpoint.h — crash-safe training checkpoints shared by the trainers: file names, atomic
// writes (temp file, fsync, rename), DONE markers, finding the newest complete checkpoint, keeping
// the last K, and the training-state file (optimizer state, data position, RNG) with a strict parser.
//
// A checkpoint of step S in the output directory is, as in llm.c:
//   model_%08d.bin        the model (the trainer's own format; GPT-2: llm.c's model file)
//   state_%08d_%05d.bin   each rank's training state (format below)
//   DONE_%08d             an empty marker, written last
// Every file is written to NAME.tmp, flushed to disk and renamed, and the marker comes after all of
// them: a run killed at any moment (kill -9, power loss) leaves either a complete checkpoint or one
// without its marker, which is never picked for resuming.
//
// Training-state file: a 256 x int32 header (64-bit values take two slots, low word first)
//   [0] magic 20261101  [1] version 2  [2] world size  [3] rank  [4] 1 if master weights follow
//   [5] shuffle  [6] precision code (the trainer's)  [7] B  [8] T
//   [10..11] completed steps  [12..13] N: parameters (master weights) in this file
//   [14..15] seed  [16..17] tokens per optimizer step  [18..19] data position (batches read)
//   [20..21] sampling RNG state  [22] loss scale (fp32 bits)  [23] optimizer steps skipped
//   [24] optimizer code (the trainer's)  [25] loss-scale growth tracker (clean steps since a change)
//   [26..27] bytes of optimizer state  [28] element alignment of the ZeRO shard layout (llmc/zero.h)
//   [29] processes of the run (data-parallel ranks; 0 in files written before they existed: 1)
//   [30] bytes of the recipe text at [32..255] (at most 896; 0 in files written before it existed)
//   [9] and [31] the low and high words of the file's Checksum64 (llmc/file_io.h), taken with these
//   two slots 0 (version 2; version 1 files, which have none, are read unchecked)
// The recipe: the settings a resumed run may change on purpose (learning rate, schedule, optimizer
// hyperparameters, clipping, dropout, ...) as "key=value" pairs one space apart, so that a resumed run
// can say what it changes (llmc/run.h's report_recipe_changes).
// World and rank are the partition's: a state sharded over W ranks (ZeRO-1/2) is W files, one per
// rank, each holding its shard; a replicated state (one process, ZeRO-0) is one file, world 1.
// then, when [4] is 1, fp32 master weights[N], then the optimizer's state as the optimizer keeps it
// on the device (e.g. AdamW: fp32 m[N] then v[N]; the trainer may append more, e.g. fp8 scaling
// states). Slots not listed are 0.
#pragma once
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "file_io.h"

constexpr int TRAIN_STATE_MAGIC = 20261101;
constexpr int TRAIN_STATE_VERSION = 2;
constexpr size_t TRAIN_STATE_RECIPE_BYTES = 1024 - 32 * 4;  // the header's slots 32..255

inline std::string checkpoint_file(const std::string& dir, const char* kind, int step) {
    char name[64];
    snprintf(name, sizeof(name), "/%s_%08d%s", kind, step, strcmp(kind, "DONE") == 0 ? "" : ".bin");
    return dir + name;
}
inline std::string state_file(const std::string& dir, int step, int rank) {
    char name[64];
    snprintf(name, sizeof(name), "/state_%08d_%05d.bin", step, rank);
    return dir + name;
}

// Creates dir (and its parents) if missing; false with a reason otherwise.
inline bool make_dirs(const std::string& dir, std::string* err) {
    for (size_t i = 1; i <= dir.size(); i++) {
        if (i < dir.size() && dir[i] != '/') continue;
        std::string prefix = dir.substr(0, i);
        if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
            *err = "cannot create directory " + prefix + ": " + strerror(errno);
            return false;
        }
    }
    struct stat st;
    if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        *err = dir + " is not a directory";
        return false;
    }
    return true;
}

// Writes a file crash-safely from a list of byte ranges: PATH.tmp, fsync, rename to PATH.
inline bool write_file_atomic(const std::string& path, const std::vector<std::pair<const void*, size_t>>& parts,
                              std::string* err) {
    std::string tmp = path + ".tmp";
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        *err = "cannot write " + tmp + ": " + strerror(errno);
        return false;
    }
    for (const auto& part : parts) {
        const char* p = (const char*)part.first;
        size_t left = part.second;
        while (left > 0) {
            ssize_t n = write(fd, p, left);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                *err = "writing " + tmp + " failed: " + strerror(errno);
                close(fd);
                unlink(tmp.c_str());
                return false;
            }
            p += n;
            left -= (size_t)n;
        }
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        *err = "writing " + tmp + " failed: " + strerror(errno);
        unlink(tmp.c_str());
        return false;
    }
    if (rename(tmp.c_str(), path.c_str()) != 0) {
        *err = "cannot rename " + tmp + " to " + path + ": " + strerror(errno);
        unlink(tmp.c_str());
        return false;
    }
    return true;
}

// Steps of the complete checkpoints (those with a DONE marker) in dir, ascending.
inline std::vector<int> complete_checkpoints(const std::string& dir) {
    std::vector<int> steps;
    DIR* d = opendir(dir.c_str());
    if (!d) return steps;
    while (struct dirent* e = readdir(d)) {
        int step;
        char tail;
        if (strlen(e->d_name) == 13 && sscanf(e->d_name, "DONE_%8d%c", &step, &tail) == 1 && step >= 0)
            steps.push_back(step);
    }
    closedir(d);
    std::sort(steps.begin(), steps.end());
    return steps;
}

// After a failed save of checkpoint `step`: deletes the files rank `rank` writes of it (rank 0 the model
// file and a replicated state, each rank its shard of a state sharded over state_world > 1 ranks). No
// DONE marker names them, so a resume would pass them by, but on a full disk they hold the space that
// the next attempt at the same step needs.
inline void remove_failed_checkpoint(const std::string& dir, int step, int rank, int state_world) {
    if (rank == 0) unlink(checkpoint_file(dir, "model", step).c_str());
    if (rank == 0 || state_world > 1) unlink(state_file(dir, step, rank).c_str());
}

// Deletes all but the newest `keep` complete checkpoints of `world` ranks (marker first, so a
// half-deleted checkpoint is never taken for complete); keep <= 0 keeps everything.
inline void prune_checkpoints(const std::string& dir, int keep, int world) {
    if (keep <= 0) return;
    std::vector<int> steps = complete_checkpoints(dir);
    for (size_t i = 0; i + keep < steps.size(); i++) {
        unlink(checkpoint_file(dir, "DONE", steps[i]).c_str());
        unlink(checkpoint_file(dir, "model", steps[i]).c_str());
        for (int r = 0; r < world; r++) unlink(state_file(dir, steps[i], r).c_str());
    }
}

// Everything a run needs besides the model to continue exactly where it stopped.
struct TrainState {
    int version = TRAIN_STATE_VERSION;  // the file's: 2 and later carry checksums (as do their model files)
    int world = 1, rank = 0;
    bool has_master = false, shuffle = false;
    int precision = 0, B = 0, T = 0;
    long long step = 0;           // optimizer steps completed
    long long tokens_per_step = 0;
    uint64_t seed = 0;
    uint64_t data_position = 0;   // batches the training loader has handed out
    uint64_t rng = 0;             // sampling RNG
    float loss_scale = 1.f;
    int skipped_steps = 0;        // steps whose update was skipped (fp16 overflow)
    int growth_tracker = 0;       // clean steps since the loss scale last changed
    int optimizer = 0;
    int shard_align = 0;                  // the shard layout's alignment (llmc/zero.h)
    int ranks = 1;                        // processes of the run that saved it (data parallel)
    uint64_t num_params = 0;              // N, or the shard's size S
    uint64_t optimizer_bytes = 0;         // the optimizer state's size (optimizer_state holds it, when read)
    std::string recipe;                   // "key=value ..." (see the format above; "" when not recorded)
    std::vector<float> master;            // (N) when has_master
    std::vector<uint8_t> optimizer_state;  // the optimizer's device state, byte for byte
};

namespace checkpoint_detail {
inline void put64(int32_t* h, int slot, uint64_t x) {
    h[slot] = (int32_t)(uint32_t)x;
    h[slot + 1] = (int32_t)(uint32_t)(x >> 32);
}
inline uint64_t get64(const int32_t* h, int slot) { return (uint64_t)(uint32_t)h[slot] | (uint64_t)(uint32_t)h[slot + 1] << 32; }
}  // namespace checkpoint_detail

// Writes s to path (atomically).
inline bool write_train_state(const std::string& path, const TrainState& s, std::string* err) {
    using namespace checkpoint_detail;
    int32_t h[256] = {0};
    h[0] = TRAIN_STATE_MAGIC;
    h[1] = TRAIN_STATE_VERSION;
    h[2] = s.world;
    h[3] = s.rank;
    h[4] = s.has_master;
    h[5] = s.shuffle;
    h[6] = s.precision;
    h[7] = s.B;
    h[8] = s.T;
    put64(h, 10, (uint64_t)s.step);
    put64(h, 12, s.num_params);
    put64(h, 14, s.seed);
    put64(h, 16, (uint64_t)s.tokens_per_step);
    put64(h, 18, s.data_position);
    put64(h, 20, s.rng);
    memcpy(&h[22], &s.loss_scale, 4);
    h[23] = s.skipped_steps;
    h[24] = s.optimizer;
    h[25] = s.growth_tracker;
    put64(h, 26, s.optimizer_state.size());
    h[28] = s.shard_align;
    h[29] = s.ranks;
    if (s.recipe.size() > TRAIN_STATE_RECIPE_BYTES) {
        *err = path + ": the recipe text is " + std::to_string(s.recipe.size()) + " bytes, the header holds " +
               std::to_string(TRAIN_STATE_RECIPE_BYTES);
        return false;
    }
    h[30] = (int32_t)s.recipe.size();
    memcpy(&h[32], s.recipe.data(), s.recipe.size());
    const std::pair<const void*, size_t> master = {s.master.data(), s.has_master ? s.master.size() * sizeof(float) : 0},
                                         state = {s.optimizer_state.data(), s.optimizer_state.size()};
    uint64_t check = header_file_checksum(h, {9, 31}, {master, state});
    h[9] = (int32_t)(uint32_t)check;
    h[31] = (int32_t)(uint32_t)(check >> 32);
    return write_file_atomic(path, {{h, sizeof(h)}, master, state}, err);
}

namespace checkpoint_detail {
// Checks a training-state header h (256 slots) against the size of its file and fills *s from it:
// every field but the two arrays, whose sizes it sets in s->num_params, s->has_master and
// s->optimizer_bytes. False with a reason naming the problem.
inline bool parse_train_state_header(const int32_t* h, uint64_t size, TrainState* s, std::string* err) {
    if (h[0] != TRAIN_STATE_MAGIC) {
        *err = "bad magic " + std::to_string(h[0]) + " (a training-state file starts with " +
               std::to_string(TRAIN_STATE_MAGIC) + ")";
        return false;
    }
    if (h[1] != 1 && h[1] != TRAIN_STATE_VERSION) {
        *err = "unsupported training-state version " + std::to_string(h[1]);
        return false;
    }
    if (h[2] < 1 || h[3] < 0 || h[3] >= h[2] || (h[4] != 0 && h[4] != 1) || (h[5] != 0 && h[5] != 1) || h[7] < 1 ||
        h[8] < 1 || (int64_t)get64(h, 10) < 0 || (int64_t)get64(h, 16) < 1 || h[23] < 0 || h[24] < 0 || h[25] < 0 ||
        h[28] < 0 || h[29] < 0 || h[30] < 0 || h[30] > (int32_t)TRAIN_STATE_RECIPE_BYTES) {
        *err = "implausible header (world " + std::to_string(h[2]) + ", rank " + std::to_string(h[3]) + ", B " +
               std::to_string(h[7]) + ", T " + std::to_string(h[8]) + ", step " +
               std::to_string((int64_t)get64(h, 10)) + ", recipe " + std::to_string(h[30]) + " bytes)";
        return false;
    }
    uint64_t n = get64(h, 12), opt_bytes = get64(h, 26);
    uint64_t master_bytes = h[4] ? n * 4 : 0;
    if (n > (size - 1024) / 4 || opt_bytes > size - 1024 || 1024 + master_bytes + opt_bytes != size) {
        *err = "file is " + std::to_string(size) + " bytes, its header promises " +
               (h[4] ? std::to_string(n) + " master weights and " : std::string()) + std::to_string(opt_bytes) +
               " bytes of optimizer state (" + std::to_string(1024 + master_bytes + opt_bytes) +
               " bytes in all): truncated or corrupt";
        return false;
    }
    s->version = h[1];
    s->world = h[2];
    s->rank = h[3];
    s->has_master = h[4];
    s->shuffle = h[5];
    s->precision = h[6];
    s->B = h[7];
    s->T = h[8];
    s->step = (long long)get64(h, 10);
    s->seed = get64(h, 14);
    s->tokens_per_step = (long long)get64(h, 16);
    s->data_position = get64(h, 18);
    s->rng = get64(h, 20);
    memcpy(&s->loss_scale, &h[22], 4);
    s->skipped_steps = h[23];
    s->optimizer = h[24];
    s->growth_tracker = h[25];
    s->shard_align = h[28];
    s->ranks = h[29] > 0 ? h[29] : 1;
    s->num_params = n;
    s->optimizer_bytes = opt_bytes;
    s->recipe.assign((const char*)&h[32], (size_t)h[30]);
    return true;
}

// Whether `sum`, the Checksum64 of a state file taken with header slots 9 and 31 zero, is the one its
// header h records there (version 2; version 1 files have none to check).
inline bool train_state_checksum_ok(const int32_t* h, uint64_t sum, std::string* err) {
    if (h[1] < 2 || sum == ((uint64_t)(uint32_t)h[9] | (uint64_t)(uint32_t)h[31] << 32)) return true;
    *err = "checksum mismatch: the file's bytes are not those the run wrote (damaged on disk or in a copy)";
    return false;
}
}  // namespace checkpoint_detail

// Parses a training-state file's bytes into *s; false with a reason naming the problem. The
// checksum is checked last: a damaged header or size has its own message first.
inline bool parse_train_state(const uint8_t* data, size_t size, TrainState* s, std::string* err) {
    using namespace checkpoint_detail;
    if (size < 1024) {
        *err = "too short for a training-state header (" + std::to_string(size) + " bytes, need 1024)";
        return false;
    }
    int32_t h[256];
    memcpy(h, data, sizeof(h));
    if (!parse_train_state_header(h, size, s, err)) return false;
    if (h[1] >= 2 && !train_state_checksum_ok(h, header_file_checksum(h, {9, 31}, {{data + 1024, size - 1024}}), err))
        return false;
    size_t master_bytes = s->has_master ? s->num_params * 4 : 0;
    const uint8_t* body = data + 1024;  // memcpy: the buffer need not be float-aligned
    s->master.resize(s->has_master ? s->num_params : 0);
    s->optimizer_state.resize(s->optimizer_bytes);
    // (an empty vector's data() may be null, which memcpy must not get even for 0 bytes)
    if (master_bytes) memcpy(s->master.data(), body, master_bytes);
    if (s->optimizer_bytes) memcpy(s->optimizer_state.data(), body + master_bytes, s->optimizer_bytes);
    return true;
}

// Reads a training-state file; false with a reason (prefixed with the path) if it is unusable. The
// arrays are read straight into *s (a GPT-2 1.5B's fp32 AdamW state is 18 GB: held once, not twice).
// header_only: the header's fields alone (the arrays left empty, their sizes set), the checksum checked
// by streaming the body through a small buffer: the fields are trusted, and compared with a run's
// settings, only once the file is known to be undamaged.
inline bool read_train_state(const std::string& path, TrainState* s, std::string* err, bool header_only = false) {
    using namespace checkpoint_detail;
    *err = not_a_regular_file(path);
    if (!err->empty()) return false;
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) {
        *err = "cannot open " + path + ": " + strerror(errno);
        return false;
    }
    struct stat st;
    int32_t h[256];
    bool ok = fstat(fileno(f), &st) == 0;
    if (ok && (uint64_t)st.st_size < sizeof(h)) {
        *err = path + ": too short for a training-state header (" + std::to_string(st.st_size) + " bytes, need 1024)";
        fclose(f);
        return false;
    }
    ok = ok && fread(h, 1, sizeof(h), f) == sizeof(h);
    if (ok && !parse_train_state_header(h, (uint64_t)st.st_size, s, err)) {
        *err = path + ": " + *err;
        fclose(f);
        return false;
    }
    s->master.clear();
    s->optimizer_state.clear();
    if (ok && header_only && h[1] >= 2) {
        Checksum64 sum = header_checksum(h, {9, 31});
        std::vector<uint8_t> buf(1 << 20);
        size_t got;
        while ((got = fread(buf.data(), 1, buf.size(), f)) > 0) sum.add(buf.data(), got);
        ok = !ferror(f);
        if (ok && !train_state_checksum_ok(h, sum.value(), err)) {
            *err = path + ": " + *err;
            fclose(f);
            return false;
        }
    }
    if (ok && !header_only) {
        s->master.resize(s->has_master ? s->num_params : 0);
        s->optimizer_state.resize(s->optimizer_bytes);
        size_t master_bytes = s->master.size() * sizeof(float);
        ok = (!master_bytes || fread(s->master.data(), 1, master_bytes, f) == master_bytes) &&
             (!s->optimizer_bytes || fread(s->optimizer_state.data(), 1, s->optimizer_bytes, f) == s->optimizer_bytes);
        if (ok && h[1] >= 2 &&
            !train_state_checksum_ok(h, header_file_checksum(h, {9, 31}, {{s->master.data(), master_bytes},
                                                                          {s->optimizer_state.data(), s->optimizer_bytes}}),
                                     err)) {
            *err = path + ": " + *err;
            s->master.clear();
            s->optimizer_state.clear();
            fclose(f);
            return false;
        }
    }
    fclose(f);
    if (!ok) *err = "reading " + path + " failed";
    return ok;
}
