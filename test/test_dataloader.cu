// test/test_dataloader.cu — the token-shard dataloader: batches are the right tokens, ranks read
// disjoint tokens that together equal one rank's, shuffling is a seeded permutation, the prefetch
// thread's embedding-backward plans are the batches' own, and every
// malformed input stops with one clear message and a non-zero exit (checked in child processes).
// Also bundled_path (llmc/file_io.h), how the trainers find their default data from any directory.
#include "../llmc/cuda_common.h"
#include "../llmc/dataloader.h"
#include "harness.h"

#include <sys/stat.h>

#include <set>
#include <string>
#include <vector>

static std::string tmpdir;

// Writes a shard with the given header fields and tokens (and optionally fewer bytes than promised).
std::string write_shard(const std::string& name, const std::vector<uint16_t>& tokens, int magic = SHARD_MAGIC,
                        int version = SHARD_VERSION, long header_count = -1, size_t drop_bytes = 0) {
    std::string path = tmpdir + "/" + name;
    FILE* f = fopen(path.c_str(), "wb");
    int32_t h[256] = {};
    h[0] = magic;
    h[1] = version;
    h[2] = header_count >= 0 ? (int32_t)header_count : (int32_t)tokens.size();
    fwrite(h, 4, 256, f);
    size_t bytes = tokens.size() * 2 - std::min(drop_bytes, tokens.size() * 2);
    fwrite(tokens.data(), 1, bytes, f);
    fclose(f);
    return path;
}

std::vector<uint16_t> counting_tokens(size_t n, int vocab) {
    std::vector<uint16_t> t(n);
    for (size_t i = 0; i < n; i++) t[i] = (uint16_t)(i % vocab);
    return t;
}

// Runs `body` in a child process and checks that it exits non-zero with `expect` on stderr.
template <class F>
void expect_error(const char* name, const std::string& expect, F body) {
    th::ChildOutput child = th::run_in_child(body);
    std::string& err = child.text;
    int code = WIFEXITED(child.status) ? WEXITSTATUS(child.status) : -1;
    bool one_line = std::count(err.begin(), err.end(), '\n') == 1;
    bool ok = code != 0 && err.find(expect) != std::string::npos && one_line;
    if (!err.empty() && err.back() == '\n') err.pop_back();
    th::report(ok, name, "exit %d, stderr: %s", code, err.c_str());
}

void test_batches() {
    int B = 2, T = 8, V = 1000;
    std::string path = write_shard("count.bin", counting_tokens(200, V));
    DataLoader dl(path, B, T, 0, 1, false, 0, V);
    bool ok = true;
    for (int batch = 0; batch < 3; batch++) {
        for (int i = 0; i < B * T; i++) {
            int start = batch * B * T;
            ok &= dl.inputs()[i] == (start + i) % V && dl.targets()[i] == (start + i + 1) % V;
        }
        dl.next_batch();
    }
    th::report(ok && dl.batches_per_epoch() == (size_t)((200 - 1) / (B * T)), "dataloader: consecutive (B,T) windows, targets shifted by one",
               "%zu batches per epoch", dl.batches_per_epoch());
    // After an epoch it starts over.
    dl.reset();
    for (size_t k = 0; k < dl.batches_per_epoch(); k++) dl.next_batch();
    th::report(dl.inputs()[0] == 0 && dl.epoch() == 1, "dataloader: wraps to the next epoch", "first token %d, epoch %d",
               dl.inputs()[0], dl.epoch());
}

void test_ranks() {
    int B = 2, T = 4, V = 60000, world = 3;
    std::string path = write_shard("ranks.bin", counting_tokens(1000, V));
    std::multiset<int> together;
    for (int r = 0; r < world; r++) {
        DataLoader dl(path, B, T, r, world, false, 0, V);
        for (int k = 0; k < 5; k++) {
            for (int i = 0; i < B * T; i++) together.insert(dl.inputs()[i]);
            dl.next_batch();
        }
    }
    DataLoader single(path, B * world, T, 0, 1, false, 0, V);
    std::multiset<int> one;
    for (int k = 0; k < 5; k++) {
        for (int i = 0; i < B * T * world; i++) one.insert(single.inputs()[i]);
        single.next_batch();
    }
    bool disjoint = together.size() == std::set<int>(together.begin(), together.end()).size();
    th::report(disjoint && together == one, "dataloader: 3 ranks read disjoint tokens that equal one rank's with 3x B",
               "%zu tokens", together.size());
}

void test_shuffle() {
    int B = 1, T = 4, V = 60000;
    std::string a = write_shard("shuf_a.bin", counting_tokens(401, V));
    std::string b = write_shard("shuf_b.bin", counting_tokens(401, V));
    (void)a;
    (void)b;
    auto firsts = [&](uint64_t seed) {
        DataLoader dl(tmpdir + "/shuf_*.bin", B, T, 0, 1, true, seed, V);
        std::vector<int> f;
        for (size_t k = 0; k < dl.batches_per_epoch(); k++) {
            f.push_back(dl.inputs()[0]);
            dl.next_batch();
        }
        return f;
    };
    auto s1 = firsts(7), s2 = firsts(7), s3 = firsts(8);
    std::vector<int> sorted = s1;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int> expect;
    for (int shard = 0; shard < 2; shard++)
        for (int k = 0; k < 100; k++) expect.push_back(k * 4);
    std::sort(expect.begin(), expect.end());
    bool is_perm = sorted == expect;
    bool shuffled = s1 != [&] { std::vector<int> v; for (int s = 0; s < 2; s++) for (int k = 0; k < 100; k++) v.push_back(k * 4); return v; }();
    th::report(is_perm && shuffled && s1 == s2 && s1 != s3,
               "dataloader: shuffling is a seeded permutation of all windows of all shards",
               "permutation %d, differs from sequential %d, same seed same order %d, other seed differs %d", is_perm,
               shuffled, s1 == s2, s1 != s3);
}

// seek(n) must land where n calls of next_batch() do (resuming depends on it), across shards and
// epochs, shuffled; and every epoch reshuffles, also when a single shard stays loaded.
void test_seek() {
    int B = 1, T = 4, V = 60000;
    write_shard("seek_a.bin", counting_tokens(41, V));   // 10 windows
    write_shard("seek_b.bin", counting_tokens(29, V));   // 7 windows
    write_shard("single.bin", counting_tokens(41, V));
    for (const char* pattern : {"/seek_*.bin", "/single.bin"}) {
        DataLoader walk(tmpdir + pattern, B, T, 0, 1, true, 3, V), jump(tmpdir + pattern, B, T, 0, 1, true, 3, V);
        size_t per_epoch = walk.batches_per_epoch(), n = 3 * per_epoch + 2;
        bool same = true;
        std::vector<std::vector<int>> epochs(3);
        for (size_t k = 0; k < n; k++) {
            if (k < 3 * per_epoch) epochs[k / per_epoch].push_back(walk.inputs()[0]);
            jump.seek(k);
            same = same && jump.position() == k && walk.position() == k &&
                   std::equal(walk.inputs(), walk.inputs() + B * T, jump.inputs()) &&
                   std::equal(walk.targets(), walk.targets() + B * T, jump.targets());
            walk.next_batch();
        }
        bool reshuffled = epochs[0] != epochs[1] && epochs[1] != epochs[2];
        th::report(same && reshuffled, pattern[1] == 's' && pattern[2] == 'e'
                                           ? "dataloader: seek(n) = n x next_batch() (2 shards, shuffled, 3 epochs)"
                                           : "dataloader: seek(n) = n x next_batch() (1 shard, shuffled, 3 epochs)",
                   "same batches %d, each epoch in a new order %d", same, reshuffled);
    }
}

// The embedding-backward plan the prefetch thread builds is the one built from the current batch's
// ids: asked for mid-epoch, then across shards, an epoch boundary (shuffled) and a seek.
void test_encoder_plans() {
    int B = 3, T = 4, V = 7;
    write_shard("plan_a.bin", counting_tokens(53, V));  // 4 windows of 12 tokens
    write_shard("plan_b.bin", counting_tokens(29, 5));  // 2 windows, other ids
    DataLoader dl(tmpdir + "/plan_*.bin", B, T, 0, 1, true, 5, V);
    bool none_before = dl.encoder_plan() == nullptr;
    dl.next_batch();
    dl.plan_embedding_backward();
    EncoderPlanLists want;
    auto same = [&](const EncoderPlanLists* p) {
        encoder_plan_build(want, dl.inputs(), nullptr, B, T, V, 0);
        auto seg_eq = [](const EncoderSegment& a, const EncoderSegment& b) {
            return a.table == b.table && a.row == b.row && a.start == b.start && a.count == b.count &&
                   a.partial == b.partial;
        };
        return p && p->B == B && p->T == T && !p->has_types && p->positions == want.positions &&
               p->num_partials == want.num_partials && p->groups.size() == want.groups.size() &&
               std::equal(p->segments.begin(), p->segments.end(), want.segments.begin(), want.segments.end(), seg_eq);
    };
    int batches = 0, good = 0;
    for (int k = 0; k < 14; k++, batches++) {  // more than two epochs of 6 batches
        good += same(dl.encoder_plan());
        if (k == 9) dl.seek(2);
        else dl.next_batch();
    }
    th::report(none_before && good == batches, "dataloader: the prefetch thread's embedding plans == built from the batch",
               "%d of %d batches (mid-epoch start, 2 shards, shuffled epochs, a seek)", good, batches);
}

void test_errors() {
    int B = 2, T = 8, V = 500;
    auto good = counting_tokens(100, V);
    std::string bad_magic = write_shard("bad_magic.bin", good, 12345);
    std::string bad_version = write_shard("bad_version.bin", good, SHARD_MAGIC, 2);
    std::string truncated = write_shard("truncated.bin", good, SHARD_MAGIC, SHARD_VERSION, -1, 10);
    std::string short_header = tmpdir + "/short_header.bin";
    FILE* f = fopen(short_header.c_str(), "wb");
    fwrite("abc", 1, 3, f);
    fclose(f);
    auto big = good;
    big[57] = 777;
    std::string bad_token = write_shard("bad_token.bin", big);
    std::string tiny = write_shard("tiny.bin", counting_tokens(10, V));
    auto open = [&](const std::string& p) { return [=] { DataLoader dl(p, B, T, 0, 1, false, 0, V); }; };
    expect_error("dataloader error: bad magic", "bad magic 12345", open(bad_magic));
    expect_error("dataloader error: the tokenizer beside the shards, matched by -i",
                 "bad magic 20240328: a llm.c tokenizer file, not a token shard",
                 open("dev/data/shakespeare/gpt2_tokenizer.bin"));
    expect_error("dataloader error: bad version", "unsupported shard version 2", open(bad_version));
    expect_error("dataloader error: truncated file", "truncated or corrupt", open(truncated));
    expect_error("dataloader error: file shorter than a header", "too short for a token shard header", open(short_header));
    expect_error("dataloader error: token >= vocab size", "token 777 at position 57 is outside the vocabulary", open(bad_token));
    expect_error("dataloader error: too few tokens for one batch", "too few for one batch", open(tiny));
    // Beside a shard that holds batches, a short one (a dataset's last, say) is skipped with one warning;
    // when every shard of the pattern is short, that is the error.
    {
        write_shard("mixed_a.bin", counting_tokens(41, V));  // 2 windows of B*T = 16 tokens
        write_shard("mixed_b.bin", counting_tokens(10, V));
        th::ChildOutput child = th::run_in_child([&] {
            DataLoader dl(tmpdir + "/mixed_*.bin", B, T, 0, 1, false, 0, V);
            if (dl.num_shards() != 1 || dl.batches_per_epoch() != 2 || dl.inputs()[0] != 0) exit(3);
        });
        std::string warned = "warning: skipped " + tmpdir + "/mixed_b.bin: 10 tokens, too few for one batch (B=2 x "
                             "T=8 x 1 rank + 1 = 17 tokens)\n";
        th::report(WIFEXITED(child.status) && WEXITSTATUS(child.status) == 0 && child.text == warned,
                   "dataloader: a shard too short for one batch beside others is skipped, with one warning",
                   "exit %d, stderr: %s", WEXITSTATUS(child.status), child.text.c_str());
        write_shard("few_a.bin", counting_tokens(12, V));
        write_shard("few_b.bin", counting_tokens(10, V));
        expect_error("dataloader error: every shard of the pattern too short", "few_a.bin: 12 tokens, too few for "
                     "one batch (B=2 x T=8 x 1 rank + 1 = 17 tokens), as every shard of the pattern",
                     open(tmpdir + "/few_*.bin"));
    }
    expect_error("dataloader error: no file matches", "no token shards match", open(tmpdir + "/nothing_*.bin"));
    // What is not a file is refused by name before it is opened: a pipe would block the open forever.
    std::string fifo = tmpdir + "/pipe.bin", folder = tmpdir + "/folder.bin";
    mkfifo(fifo.c_str(), 0600);
    mkdir(folder.c_str(), 0700);
    expect_error("dataloader error: a pipe matching the pattern", fifo + " is not a regular file (a pipe, socket or "
                 "device): token shards are files", open(fifo));
    expect_error("dataloader error: a directory matching the pattern", folder + " is a directory", open(folder));
}

// bundled_path: a relative path that exists from the working directory stays as given; one that
// exists only beside the program (a file made there for the test) becomes that file's path; one that
// exists nowhere, or an absolute one, stays as given.
void test_bundled_path() {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    exe[n > 0 ? n : 0] = 0;
    const std::string dir(exe, strrchr(exe, '/') ? strrchr(exe, '/') - exe : 0);
    const std::string probe = "bundled_path_probe_" + std::to_string(getpid()) + ".bin";
    FILE* f = fopen((dir + "/" + probe).c_str(), "wb");
    if (f) fclose(f);
    char cwd[4096];
    bool moved = getcwd(cwd, sizeof(cwd)) && chdir(tmpdir.c_str()) == 0;  // where the probe is not
    FILE* here = fopen("here.bin", "wb");
    if (here) fclose(here);
    std::string beside = bundled_path(probe), as_here = bundled_path("here.bin"), nowhere = bundled_path("no/such.bin"),
                absolute = bundled_path("/no/such.bin");
    bool back = moved && chdir(cwd) == 0;
    unlink((dir + "/" + probe).c_str());
    th::report(f && back && beside == dir + "/" + probe && as_here == "here.bin" && nowhere == "no/such.bin" &&
                   absolute == "/no/such.bin",
               "bundled_path: from here if it is here, else beside the program, else as given",
               "beside: %s", beside.c_str());
}

int main() {
    char tmpl[] = "/tmp/llmc_dataloader_XXXXXX";
    tmpdir = mkdtemp(tmpl);
    // Removed at exit, by the process that made it only: a forked child inherits the handler, and a
    // process replaying the test for one error case (th::run_in_child) ends there, not here.
    static const pid_t owner = getpid();
    atexit([] {
        if (getpid() == owner && system(("rm -rf " + tmpdir).c_str()) != 0)
            fprintf(stderr, "could not remove %s\n", tmpdir.c_str());
    });
    test_batches();
    test_ranks();
    test_shuffle();
    test_seek();
    test_encoder_plans();
    test_errors();
    test_bundled_path();
    return th::finish();
}
