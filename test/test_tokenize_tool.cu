// test/test_tokenize_tool.cu — dev/data/tokenize.cpp, the text -> shards tool: run on a small temp
// folder (with text read in tiny chunks, so separators and characters are cut everywhere), its
// shards must pass llmc/dataloader.h's checks and load, decode back to the input with <|endoftext|>
// separators, split val/train where --val-fraction says; it must reproduce the bundled Shakespeare
// val shard (tiktoken's) from the plays' text; and refuse bad inputs with a clear reason.
#include "../llmc/cuda_common.h"
#include "../llmc/dataloader.h"
#define TOKENIZE_NO_MAIN
#include "../dev/data/tokenize.cpp"
#include "harness.h"

#include <unistd.h>

using namespace tokenize_tool;

const char* TOKENIZER_FILE = "dev/data/shakespeare/gpt2_tokenizer.bin";

void write_text(const std::string& path, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    FILE* f = fopen(path.c_str(), "wb");
    fwrite(text.data(), 1, text.size(), f);
    fclose(f);
}

// The tokens of a shard, after llmc/dataloader.h's header and size checks.
std::vector<int> read_shard(const std::string& path) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) return {};
    size_t n = read_shard_header(path, f);
    fseek(f, SHARD_HEADER_INTS * 4, SEEK_SET);
    std::vector<uint16_t> t(n);
    size_t got = fread(t.data(), 2, n, f);
    fclose(f);
    return std::vector<int>(t.begin(), t.begin() + got);
}

// The tokens of every shard of a split, in order.
std::vector<int> read_split(const std::string& prefix, const char* split, size_t* shards) {
    std::vector<int> all;
    std::vector<std::string> files = glob_files(prefix + "_" + split + "_*.bin");
    for (const std::string& f : files) {
        std::vector<int> t = read_shard(f);
        all.insert(all.end(), t.begin(), t.end());
    }
    *shards = files.size();
    return all;
}

// The token count of each shard of a split, in order.
std::vector<long long> shard_sizes(const std::string& prefix, const char* split) {
    std::vector<long long> sizes;
    for (const std::string& f : glob_files(prefix + "_" + split + "_*.bin")) sizes.push_back(read_shard(f).size());
    return sizes;
}

// The shards --shard-tokens m must make of n tokens: m tokens each, and the remainder a shard of its
// own if it is at least half a shard, else part of the last shard (so none is shorter than m/2 unless
// it is the only one).
std::vector<long long> want_shard_sizes(long long n, long long m) {
    std::vector<long long> sizes(n / m, m);
    long long rest = n % m;
    if (sizes.empty() || 2 * rest >= m) {
        if (rest) sizes.push_back(rest);
    } else {
        sizes.back() += rest;
    }
    return sizes;
}

// What the tool must produce for texts: each after <|endoftext|>, with literal <|endoftext|> as
// the token, the rest encoded whole; and into *val how many of those tokens start within the first
// val_bytes input bytes (the inserted <|endoftext|>s stand for no input).
std::vector<int> expected_tokens(const Tokenizer& tok, const std::vector<std::string>& texts, size_t val_bytes,
                                 size_t* val) {
    std::vector<int> ids;
    const std::string& sep = tok.decode(tok.eot());
    size_t consumed = 0;
    *val = 0;
    auto add = [&](int id, size_t bytes) {
        *val += consumed < val_bytes;
        consumed += bytes;
        ids.push_back(id);
    };
    for (const std::string& t : texts) {
        add(tok.eot(), 0);
        size_t from = 0, at;
        while ((at = t.find(sep, from)) != std::string::npos) {
            for (int id : tok.encode(std::string_view(t).substr(from, at - from))) add(id, tok.decode(id).size());
            add(tok.eot(), sep.size());
            from = at + sep.size();
        }
        for (int id : tok.encode(std::string_view(t).substr(from))) add(id, tok.decode(id).size());
    }
    return ids;
}

void expect_error(const char* name, Options o, const std::string& reason) {
    o.quiet = true;
    Stats s;
    std::string error;
    bool ok = run(o, &s, &error);
    th::report(!ok && error.find(reason) != std::string::npos, name, "%s", error.c_str());
}

bool parse(std::vector<const char*> args, Options* o, bool* help, std::string* error) {
    args.insert(args.begin(), "tokenize");
    return parse_args((int)args.size(), (char**)args.data(), o, help, error);
}

int main() {
    Tokenizer tok;
    std::string error;
    if (!tok.load(TOKENIZER_FILE, &error)) {
        th::report(false, "tokenize: bundled tokenizer loads", "%s", error.c_str());
        return th::finish();
    }
    char tmpl[] = "/tmp/llmc_tokenize_XXXXXX";
    std::string dir = mkdtemp(tmpl);

    // A folder: its *.txt files in sorted path order (b/ before c.txt), others ignored.
    std::vector<std::string> texts = {
        "Hello world.\nA second line,  with  double spaces and 'quotes'.\n",
        "Ünïcödé — 中文 😀 and\tmore<|endoftext|>after the separator <|endoftext|><|endoftext|>end",
        "Third file: numbers 1,234.5 and a trailing space ",
        "caf\xc3 invalid UTF-8 \xff kept as bytes",
    };
    write_text(dir + "/in/a.txt", texts[0]);
    write_text(dir + "/in/b/x.txt", texts[1]);
    write_text(dir + "/in/c.txt", texts[2]);
    write_text(dir + "/in/d.txt", texts[3]);
    write_text(dir + "/in/empty.txt", "");  // still a document: an <|endoftext|> of its own
    texts.push_back("");
    write_text(dir + "/in/notes.md", "not a .txt file: skipped");
    size_t total = 0;
    for (const std::string& t : texts) total += t.size();

    for (size_t chunk : {(size_t)1, (size_t)5, (size_t)13, (size_t)1 << 20}) {
        Options o;
        o.tokenizer = TOKENIZER_FILE;
        o.out = dir + "/out" + std::to_string(chunk) + "/tiny";
        o.inputs = {dir + "/in"};
        o.val_fraction = 0.3;
        o.shard_tokens = 16;
        o.eot_between_files = true;
        o.chunk_bytes = chunk;
        o.quiet = true;
        Stats s;
        bool ok = run(o, &s, &error);
        size_t nval, ntrain;
        std::vector<int> val = read_split(o.out, "val", &nval), train = read_split(o.out, "train", &ntrain);
        std::vector<int> all = val;
        all.insert(all.end(), train.begin(), train.end());
        size_t want_val;
        std::vector<int> want = expected_tokens(tok, texts, (size_t)(0.3 * total + 0.5), &want_val);
        std::string want_text;
        for (const std::string& t : texts) want_text += "<|endoftext|>" + t;
        bool split_ok = val.size() == want_val && s.val_tokens == val.size() && s.train_tokens == train.size();
        bool sizes_ok = nval > 0 && shard_sizes(o.out, "val") == want_shard_sizes(val.size(), 16) &&
                        shard_sizes(o.out, "train") == want_shard_sizes(train.size(), 16);
        char name[128];
        snprintf(name, sizeof(name), "tokenize: folder -> shards, read in %zu-byte chunks", chunk);
        th::report(ok && all == want && tok.decode(all) == want_text && split_ok && sizes_ok && s.files == 5, name,
                   "%zu files, %zu val + %zu train tokens in %zu + %zu shards %s", s.files, val.size(), train.size(), nval,
                   ntrain, error.c_str());
    }

    // Each "wrote" line names what its shard holds, the val shards' too (completed after a train
    // shard was opened): the counts of the headers.
    {
        Options o;
        o.tokenizer = TOKENIZER_FILE;
        o.out = dir + "/out_said/tiny";
        o.inputs = {dir + "/in"};
        o.val_fraction = 0.3;
        o.shard_tokens = 16;
        o.eot_between_files = true;
        th::ChildOutput c = th::run_in_child_with_stdout([&] {
            Stats st;
            std::string e;
            run(o, &st, &e);
        });
        int lines = 0, right = 0;
        for (size_t at = c.text.find("tokenize: wrote "); at != std::string::npos;
             at = c.text.find("tokenize: wrote ", at + 1)) {
            size_t path_at = at + 16, paren = c.text.find(" (", path_at), eol = c.text.find('\n', path_at);
            if (paren == std::string::npos || paren > eol) break;
            std::string path = c.text.substr(path_at, paren - path_at);
            std::vector<int> tokens = read_shard(path);
            right += c.text.compare(paren, eol - paren, " (" + std::to_string(tokens.size()) + " tokens)") == 0;
            lines++;
        }
        th::report(lines > 2 && right == lines, "tokenize: every \"wrote\" line says its shard's token count",
                   "%d of %d lines right%s", right, lines, right == lines ? "" : (": " + c.text).c_str());
    }

    // Shard sizes: a remainder shorter than half a shard joins the last shard rather than making a short
    // one (the trainer refuses a shard under B*T+1 tokens); every --shard-tokens, the tokens unchanged.
    {
        size_t want_val;
        std::vector<int> want = expected_tokens(tok, texts, 0, &want_val);
        const long long n = (long long)want.size();
        int right = 0, cases = 0, folded = 0;
        std::string wrong;
        for (long long m : {1LL, 2LL, 3LL, 5LL, 7LL, 10LL, 16LL, 25LL, n / 2 + 1, n - 1, n, n + 1}) {
            Options o;
            o.tokenizer = TOKENIZER_FILE;
            o.out = dir + "/sizes/m" + std::to_string(m);
            o.inputs = {dir + "/in"};
            o.val_fraction = 0;
            o.shard_tokens = m;
            o.eot_between_files = true;
            o.quiet = true;
            Stats s;
            bool ok = run(o, &s, &error);
            size_t nshards;
            std::vector<long long> got = shard_sizes(o.out, "train"), sizes = want_shard_sizes(n, m);
            bool good = ok && got == sizes && read_split(o.out, "train", &nshards) == want;
            folded += n % m != 0 && 2 * (n % m) < m && n > m;
            right += good;
            cases++;
            if (!good && wrong.empty()) {
                wrong = "--shard-tokens " + std::to_string(m) + ": sizes";
                for (long long g : got) wrong += " " + std::to_string(g);
                wrong += " " + error;
            }
        }
        th::report(right == cases && folded > 0,
                   "tokenize: a remainder under half a shard joins the last shard (N/2 to 1.5N tokens each)",
                   "%d of %d --shard-tokens right (%d with a remainder folded) on %lld tokens %s", right, cases,
                   folded, n, wrong.c_str());
    }

    // A file that is clearly not text: named, it is refused (below); met in a folder, it is skipped with a
    // warning naming it, and the rest is tokenized as without it.
    {
        write_text(dir + "/mixed/a.txt", texts[0]);
        write_text(dir + "/mixed/b.txt", std::string("UTF-16\0t\0e\0x\0t\0", 15));
        std::filesystem::copy_file(dir + "/out5/tiny_train_000000.bin", dir + "/mixed/c.txt");
        Options o;
        o.tokenizer = TOKENIZER_FILE;
        o.out = dir + "/mixed_out/x";
        o.inputs = {dir + "/mixed"};
        o.val_fraction = 0;
        th::ChildOutput c = th::run_in_child_with_stdout([&] {
            Stats st;
            std::string e;
            if (!run(o, &st, &e)) printf("error: %s\n", e.c_str());
        });
        size_t n;
        bool warned = c.text.find("tokenize: warning: skipped " + dir + "/mixed/b.txt, not text: it holds NUL bytes") !=
                          std::string::npos &&
                      c.text.find("tokenize: warning: skipped " + dir + "/mixed/c.txt, not text: an llm.c token shard") !=
                          std::string::npos;
        th::report(warned && read_split(o.out, "train", &n) == tok.encode(texts[0]),
                   "tokenize: a binary *.txt in a folder is skipped with a warning naming it", "%s", c.text.c_str());
    }

    // A --val-fraction that rounds to no input byte makes no val shard, and says so (not an error).
    {
        Options o;
        o.tokenizer = TOKENIZER_FILE;
        o.out = dir + "/tinyval/x";
        o.inputs = {dir + "/in"};
        o.val_fraction = 1e-6;
        th::ChildOutput c = th::run_in_child_with_stdout([&] {
            Stats st;
            std::string e;
            if (!run(o, &st, &e)) printf("error: %s\n", e.c_str());
        });
        size_t nval, ntrain;
        read_split(o.out, "val", &nval);
        read_split(o.out, "train", &ntrain);
        th::report(c.text.find("tokenize: warning: --val-fraction 1e-06 is ") != std::string::npos &&
                       c.text.find("no val shard") != std::string::npos && nval == 0 && ntrain == 1,
                   "tokenize: a --val-fraction too small for any val token warns: no val shard", "%s", c.text.c_str());
    }

    // The shards load through the DataLoader: its first batch is the first train tokens.
    {
        std::string prefix = dir + "/out5/tiny";
        std::vector<int> train = read_shard(prefix + "_train_000000.bin");
        DataLoader loader(prefix + "_train_*.bin", 1, 8, 0, 1, false, 0, tok.vocab_size());
        bool same = train.size() >= 9 && loader.num_shards() > 1;
        for (int i = 0; same && i < 8; i++) same = loader.inputs()[i] == train[i] && loader.targets()[i] == train[i + 1];
        th::report(same, "tokenize: shards load through llmc/dataloader.h", "%zu train shards", loader.num_shards());
    }

    // The plays of the bundled val shard, as text files: the tool must give tiktoken's tokens.
    {
        std::vector<int> shard = read_shard("dev/data/shakespeare/shakespeare_val.bin");
        std::vector<std::string> plays;
        for (int t : shard) {
            if (t == tok.eot()) plays.emplace_back();
            else plays.back() += tok.decode(t);
        }
        Options o;
        o.tokenizer = TOKENIZER_FILE;
        o.out = dir + "/shakespeare/val";
        o.val_fraction = 0;
        o.eot_between_files = true;
        o.chunk_bytes = 4099;
        o.quiet = true;
        for (size_t i = 0; i < plays.size(); i++) {
            o.inputs.push_back(dir + "/plays/" + std::to_string(i) + ".txt");
            write_text(o.inputs.back(), plays[i]);
        }
        Stats s;
        bool ok = run(o, &s, &error);
        size_t n;
        th::report(ok && read_split(o.out, "train", &n) == shard && read_split(o.out, "val", &n).empty(),
                   "tokenize: Shakespeare plays -> the bundled val shard (tiktoken's tokens)", "%zu plays, %.2f MB, %.1f MB/s %s",
                   plays.size(), s.bytes / 1e6, s.bytes / 1e6 / s.seconds, error.c_str());
    }

    // Bad inputs, one clear reason each.
    Options base;
    base.tokenizer = TOKENIZER_FILE;
    base.out = dir + "/err/x";
    base.inputs = {dir + "/in"};
    Options o = base;
    o.inputs = {dir + "/nothing_here"};
    expect_error("tokenize refuses: missing input", o, "cannot read " + dir + "/nothing_here");
    write_text(dir + "/blank/e.txt", "");
    o.inputs = {dir + "/blank"};
    expect_error("tokenize refuses: input without text", o, "the inputs hold no text");
    o.inputs = {dir + "/in/b/x.txt/.."};
    expect_error("tokenize refuses: unreadable input", o, "cannot read");
    std::filesystem::create_directories(dir + "/nofiles/sub");
    o.inputs = {dir + "/nofiles"};
    expect_error("tokenize refuses: folder without *.txt", o, "no input files");
    o = base;
    o.out = dir + "/err/";
    expect_error("tokenize refuses: --out ending in /", o, "--out " + dir + "/err/ is a folder: --out is a path prefix like DIR/NAME");
    o.out = dir + "/in";
    expect_error("tokenize refuses: --out an existing folder", o, "--out " + dir + "/in is a folder");
    o.out = base.out;
    o.inputs = {dir + "/out5/tiny_train_000000.bin"};
    expect_error("tokenize refuses: a named token shard as input", o,
                 dir + "/out5/tiny_train_000000.bin is not text: an llm.c token shard");
    write_text(dir + "/nul.txt", std::string("text\0with a NUL", 15));
    o.inputs = {dir + "/nul.txt"};
    expect_error("tokenize refuses: a named input with NUL bytes", o, dir + "/nul.txt is not text: it holds NUL bytes");
    // An input that is one of the run's own shards (or its .tmp), by any name: refused, nothing written.
    {
        const std::map<std::string, std::string> before = th::folder_files(dir + "/out5");
        o.out = dir + "/out5/tiny";
        o.inputs = {dir + "/out5/tiny_train_000001.bin"};
        expect_error("tokenize refuses: --out would overwrite a named input", o,
                     "--out " + dir + "/out5/tiny would overwrite its input " + dir + "/out5/tiny_train_000001.bin");
        std::filesystem::create_directories(dir + "/links");
        std::filesystem::create_symlink("../out5/tiny_val_000000.bin", dir + "/links/l.txt");
        o.inputs = {dir + "/in", dir + "/links"};
        expect_error("tokenize refuses: --out would overwrite an input met in a folder (a symlink)", o,
                     "would overwrite its input " + dir + "/links/l.txt (" + dir + "/out5/tiny_val_000000.bin)");
        write_text(dir + "/out5/tiny_train_000099.bin.tmp", "text, named like a pending shard");
        o.inputs = {dir + "/out5/tiny_train_000099.bin.tmp"};
        expect_error("tokenize refuses: --out would overwrite an input named like its .tmp", o,
                     "would overwrite its input " + dir + "/out5/tiny_train_000099.bin.tmp");
        std::filesystem::remove(dir + "/out5/tiny_train_000099.bin.tmp");
        th::report(th::folder_files(dir + "/out5") == before, "tokenize: a refused self-overwrite leaves the shards as they were");
    }
    o = base;
    o.out = dir + "/in/a.txt/out";  // a file where a folder should be
    expect_error("tokenize refuses: output not writable", o, "cannot create the output folder");
    std::filesystem::create_directories(dir + "/err/x_val_000000.bin.tmp");  // a folder where the shard is written
    expect_error("tokenize refuses: shard not writable", base,
                 "cannot write " + dir + "/err/x_val_000000.bin.tmp: Is a directory");
    // A run that fails after writing some shards leaves an earlier run's shards byte-identical and no
    // .tmp file of its own: its shards are renamed into place only when all are written.
    {
        Options keep = base;
        keep.out = dir + "/keep/x";
        keep.val_fraction = 0.3;
        keep.shard_tokens = 16;
        keep.quiet = true;
        Stats s1;
        bool first = run(keep, &s1, &error);
        const std::map<std::string, std::string> before = th::folder_files(dir + "/keep");
        // The second run reads a longer input (so it would rewrite every shard) and stops at its third
        // train shard, whose pending name is taken by a folder.
        write_text(dir + "/in2/long.txt", std::string(2000, 'a') + " the end");
        keep.inputs = {dir + "/in", dir + "/in2"};
        std::filesystem::create_directories(dir + "/keep/x_train_000002.bin.tmp");
        Stats s2;
        std::string error2;
        bool second = run(keep, &s2, &error2);
        std::filesystem::remove(dir + "/keep/x_train_000002.bin.tmp");
        const std::map<std::string, std::string> after = th::folder_files(dir + "/keep");
        th::report(first && s1.shards.size() >= 3 && !second &&
                       error2.find("x_train_000002.bin.tmp: Is a directory") != std::string::npos && after == before,
                   "tokenize: a run failing after some shards leaves the earlier run's shards byte-identical, no .tmp",
                   "%zu shards before, %zu files after; %s", before.size(), after.size(), error2.c_str());
    }
    o = base;
    o.tokenizer = dir + "/none.bin";
    expect_error("tokenize refuses: missing tokenizer", o, "none.bin: No such file");
    {
        // 65537 tokens: ids past 65535 do not fit uint16.
        int32_t header[256] = {TOKENIZER_MAGIC, 2, 65537, 0};
        std::string body((const char*)header, sizeof(header));
        for (int i = 0; i < 65537; i++) {
            std::string t = i < 256 ? std::string(1, (char)i) : "t" + std::to_string(i);
            body += (char)t.size() + t;
        }
        write_text(dir + "/big_vocab.bin", body);
        o.tokenizer = dir + "/big_vocab.bin";
        expect_error("tokenize refuses: vocabulary too large for uint16", o, "65537 tokens do not fit the shards' uint16");
    }

    // Command line.
    Options p;
    bool help;
    bool ok = parse({"--tokenizer", "t.bin", "--out", "o", "--val-fraction", "0.25", "--shard-tokens", "1000",
                     "--eot-between-files", "a", "b"}, &p, &help, &error);
    th::report(ok && !help && p.tokenizer == "t.bin" && p.out == "o" && p.val_fraction == 0.25 && p.shard_tokens == 1000 &&
                   p.eot_between_files && p.inputs == std::vector<std::string>{"a", "b"},
               "tokenize: command line parsed");
    Options q[6];
    bool refused = !parse({"--tokenizer", "t", "--out", "o", "--val-fraction", "1.5", "a"}, &q[0], &help, &error) &&
                   error.find("--val-fraction must be") != std::string::npos;
    refused &= !parse({"--tokenizer", "t", "--out", "o", "--shard-tokens", "0", "a"}, &q[1], &help, &error) &&
               error.find("--shard-tokens must be") != std::string::npos;
    refused &= !parse({"--tokenizer", "t", "--out", "o", "--shard-tokens", "1431655766", "a"}, &q[2], &help, &error) &&
               error.find("--shard-tokens must be at most 1431655765") != std::string::npos;
    refused &= !parse({"--tokenizer", "t", "--out", "o", "--bogus", "a"}, &q[3], &help, &error) &&
               error.find("unknown option --bogus") != std::string::npos;
    refused &= !parse({"--out", "o", "a"}, &q[4], &help, &error) && error.find("needs --tokenizer") != std::string::npos;
    refused &= parse({"--help"}, &q[5], &help, &error) && help;
    th::report(refused, "tokenize: bad command lines refused, --help recognised", "%s", error.c_str());

    std::string cmd = "rm -rf " + dir;
    if (system(cmd.c_str()) != 0) fprintf(stderr, "could not remove %s\n", dir.c_str());
    return th::finish();
}
