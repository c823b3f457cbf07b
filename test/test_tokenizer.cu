// test/test_tokenizer.cu — the GPT-2 decoder (llmc/tokenizer.h) on the bundled llm.c tokenizer file:
// known token ids decode to the bytes tiktoken gives them, and malformed files are refused with a
// reason naming the problem.
#include "../llmc/cuda_common.h"
#include "../llmc/tokenizer.h"
#include "harness.h"

#include <unistd.h>

// Writes a tokenizer file from a header and the raw bytes that follow it.
std::string write_file(const std::string& dir, const char* name, std::vector<int32_t> header,
                       const std::string& body) {
    header.resize(256, 0);
    std::string path = dir + "/" + name;
    FILE* f = fopen(path.c_str(), "wb");
    fwrite(header.data(), 4, 256, f);
    fwrite(body.data(), 1, body.size(), f);
    fclose(f);
    return path;
}

void expect_refused(const char* name, const std::string& path, const std::string& reason) {
    Tokenizer tok;
    std::string error;
    bool loaded = tok.load(path, &error);
    th::report(!loaded && error.find(reason) != std::string::npos, name, "%s", error.c_str());
}

int main() {
    Tokenizer tok;
    std::string error;
    bool ok = tok.load("dev/data/shakespeare/gpt2_tokenizer.bin", &error);
    th::report(ok && tok.vocab_size() == 50257 && tok.eot() == 50256, "tokenizer: bundled GPT-2 file loads",
               "vocab %d, eot %d %s", tok.vocab_size(), tok.eot(), error.c_str());
    // Ids and bytes as tiktoken's r50k_base / GPT-2 encoding defines them.
    struct { int id; const char* bytes; } known[] = {
        {464, "The"}, {13, "."}, {11, ","}, {198, "\n"}, {262, " the"}, {50256, "<|endoftext|>"}, {0, "!"}};
    bool all = ok;
    for (auto& k : known) all &= tok.decode(k.id) == k.bytes;
    th::report(all, "tokenizer: known ids decode to GPT-2's bytes", "464 -> '%s', 262 -> '%s'", tok.decode(464).c_str(),
               tok.decode(262).c_str());
    th::report(tok.decode(-1).empty() && tok.decode(50257).empty(), "tokenizer: ids outside the vocabulary decode to nothing");

    char tmpl[] = "/tmp/llmc_tokenizer_XXXXXX";
    std::string dir = mkdtemp(tmpl);
    expect_refused("tokenizer refuses: missing file", dir + "/none.bin", "No such file");
    expect_refused("tokenizer refuses: bad magic", write_file(dir, "magic.bin", {123, 2, 1, 0}, "\x01" "a"), "bad magic 123");
    expect_refused("tokenizer refuses: unknown version", write_file(dir, "version.bin", {TOKENIZER_MAGIC, 3, 1, 0}, "\x01" "a"),
                   "unsupported tokenizer version 3");
    expect_refused("tokenizer refuses: bad vocabulary size", write_file(dir, "size.bin", {TOKENIZER_MAGIC, 2, -5, 0}, ""),
                   "implausible vocabulary size -5");
    expect_refused("tokenizer refuses: zero-length token", write_file(dir, "empty.bin", {TOKENIZER_MAGIC, 2, 2, 1}, std::string("\x01" "a" "\x00", 3)),
                   "token 1 is missing or empty");
    expect_refused("tokenizer refuses: truncated token", write_file(dir, "trunc.bin", {TOKENIZER_MAGIC, 2, 2, 1}, "\x01" "a" "\x05" "ab"),
                   "truncated at token 1");
    std::string short_path = dir + "/short.bin";
    FILE* f = fopen(short_path.c_str(), "wb");
    fwrite("xyz", 1, 3, f);
    fclose(f);
    expect_refused("tokenizer refuses: shorter than a header", short_path, "too short for a tokenizer header");
    std::string cmd = "rm -rf " + dir;
    if (system(cmd.c_str()) != 0) fprintf(stderr, "could not remove %s\n", dir.c_str());
    return th::finish();
}
