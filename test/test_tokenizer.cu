// test/test_tokenizer.cu — the GPT-2 tokenizer (llmc/tokenizer.h) on the bundled llm.c tokenizer file:
// decoding, malformed files refused with a reason, the file written back byte for byte, and the
// encoder token-for-token against tiktoken: the cases of test/fixtures/tokenizer_cases.bin (written
// by test/oracle_tokenizer.py) and the 1.8 MB of Shakespeare in the bundled shards (tiktoken's
// output, see dev/data/prepare_shakespeare.py). Also: streaming encode == whole encode, the heap
// merge == tiktoken's scan merge, and megabyte-long pre-tokens in bounded time.
#include "../llmc/cuda_common.h"
#include "../llmc/tokenizer.h"
#include "harness.h"

#include <unistd.h>

#include <chrono>
#include <map>
#include <random>

const char* TOKENIZER_FILE = "dev/data/shakespeare/gpt2_tokenizer.bin";

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

std::string read_all(const std::string& path) {
    std::string s;
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) return s;
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
    fclose(f);
    return s;
}

void expect_refused(const char* name, const std::string& path, const std::string& reason) {
    Tokenizer tok;
    std::string error;
    bool loaded = tok.load(path, &error);
    th::report(!loaded && error.find(reason) != std::string::npos, name, "%s", error.c_str());
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Up to 60 bytes of s, C-escaped, for failure messages.
std::string excerpt(const std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size() && i < 60; i++) {
        unsigned char c = s[i];
        char buf[8];
        if (c == '\n') out += "\\n";
        else if (c == '\t') out += "\\t";
        else if (c < 0x20 || c >= 0x7f) { snprintf(buf, sizeof(buf), "\\x%02x", c); out += buf; }
        else out += (char)c;
    }
    return s.size() > 60 ? out + "..." : out;
}

// Compares the encoding of text with the expected ids (and decode(encode) with text); on the first
// difference fills *why with where it is.
bool encodes_as(const Tokenizer& tok, const std::string& text, const std::vector<int>& want, std::string* why) {
    std::vector<int> got = tok.encode(text);
    if (got != want) {
        size_t i = 0;
        while (i < got.size() && i < want.size() && got[i] == want[i]) i++;
        char buf[256];
        snprintf(buf, sizeof(buf), "token %zu: got %d '%s', want %d '%s' (%zu vs %zu tokens)", i,
                 i < got.size() ? got[i] : -1, i < got.size() ? excerpt(tok.decode(got[i])).c_str() : "",
                 i < want.size() ? want[i] : -1, i < want.size() ? excerpt(tok.decode(want[i])).c_str() : "",
                 got.size(), want.size());
        *why = "'" + excerpt(text) + "' " + buf;
        return false;
    }
    if (tok.decode(got) != text) {
        *why = "'" + excerpt(text) + "' does not decode back to itself";
        return false;
    }
    return true;
}

struct Case {
    std::string group, text;
    std::vector<int> ids;
};

// test/fixtures/tokenizer_cases.bin (format: test/oracle_tokenizer.py).
std::vector<Case> read_cases(const std::string& path) {
    std::string d = read_all(path);
    std::vector<Case> cases;
    size_t p = 12;
    auto u32 = [&](size_t at) { uint32_t v; memcpy(&v, d.data() + at, 4); return v; };
    if (d.size() < 12 || d.compare(0, 8, "TOKCASE1") != 0) return cases;
    uint32_t n = u32(8);
    for (uint32_t k = 0; k < n && p < d.size(); k++) {
        Case c;
        size_t glen = (unsigned char)d[p];
        c.group = d.substr(p + 1, glen);
        p += 1 + glen;
        uint32_t tlen = u32(p);
        c.text = d.substr(p + 4, tlen);
        p += 4 + tlen;
        uint32_t ntok = u32(p);
        p += 4;
        for (uint32_t i = 0; i < ntok; i++, p += 2) c.ids.push_back((unsigned char)d[p] | ((unsigned char)d[p + 1] << 8));
        cases.push_back(std::move(c));
    }
    return cases;
}

// The documents of a bundled shard: the tokens between <|endoftext|>s.
std::vector<std::vector<int>> shard_documents(const std::string& path, int eot) {
    std::string d = read_all(path);
    std::vector<std::vector<int>> docs;
    for (size_t p = 1024; p + 1 < d.size(); p += 2) {
        int t = (unsigned char)d[p] | ((unsigned char)d[p + 1] << 8);
        if (t == eot) docs.emplace_back();
        else if (!docs.empty()) docs.back().push_back(t);
    }
    return docs;
}

// Encodes text through encode_some() in pieces of random sizes, as a streaming reader would.
std::vector<int> encode_streamed(const Tokenizer& tok, const std::string& text, std::mt19937& rng, int max_chunk) {
    std::vector<int> ids;
    std::string buf;
    size_t fed = 0;
    while (fed < text.size()) {
        size_t chunk = std::min(text.size() - fed, (size_t)(1 + rng() % max_chunk));
        buf.append(text, fed, chunk);
        fed += chunk;
        buf.erase(0, tok.encode_some(buf, false, &ids));
    }
    tok.encode_some(buf, true, &ids);
    return ids;
}

void test_file_format(const Tokenizer& tok, const std::string& dir) {
    expect_refused("tokenizer refuses: missing file", dir + "/none.bin", "No such file");
    expect_refused("tokenizer refuses: bad magic", write_file(dir, "magic.bin", {123, 2, 1, 0}, "\x01" "a"), "bad magic 123");
    expect_refused("tokenizer refuses: unknown version", write_file(dir, "version.bin", {TOKENIZER_MAGIC, 3, 1, 0}, "\x01" "a"),
                   "unsupported tokenizer version 3");
    expect_refused("tokenizer refuses: bad vocabulary size", write_file(dir, "size.bin", {TOKENIZER_MAGIC, 2, -5, 0}, ""),
                   "implausible vocabulary size -5");
    expect_refused("tokenizer refuses: end-of-text outside the vocabulary",
                   write_file(dir, "eot.bin", {TOKENIZER_MAGIC, 2, 2, 7}, "\x01" "a" "\x01" "b"),
                   "end-of-text id 7 is outside the vocabulary (size 2)");
    expect_refused("tokenizer refuses: zero-length token", write_file(dir, "empty.bin", {TOKENIZER_MAGIC, 2, 2, 1}, std::string("\x01" "a" "\x00", 3)),
                   "token 1 is missing or empty");
    expect_refused("tokenizer refuses: truncated token", write_file(dir, "trunc.bin", {TOKENIZER_MAGIC, 2, 2, 1}, "\x01" "a" "\x05" "ab"),
                   "truncated at token 1");
    std::string short_path = dir + "/short.bin";
    FILE* f = fopen(short_path.c_str(), "wb");
    fwrite("xyz", 1, 3, f);
    fclose(f);
    expect_refused("tokenizer refuses: shorter than a header", short_path, "too short for a tokenizer header");

    // Writing: the bundled file is version 2; v2 reproduces it byte for byte, v1 loads back the same.
    std::string error, v2 = dir + "/v2.bin", v1 = dir + "/v1.bin";
    bool ok2 = tok.save(v2, 2, &error);
    th::report(tok.version() == 2 && ok2 && read_all(v2) == read_all(TOKENIZER_FILE),
               "tokenizer: save version 2 == the bundled (version 2) file, byte for byte", "%s", error.c_str());
    Tokenizer back;
    bool ok1 = tok.save(v1, 1, &error) && back.load(v1, &error);
    bool same = ok1 && back.version() == 1 && back.eot() == 50256 && back.vocab_size() == tok.vocab_size();
    for (int i = 0; same && i < tok.vocab_size(); i++) same = back.decode(i) == tok.decode(i);
    th::report(same && back.encode("Hello world") == std::vector<int>{15496, 995},
               "tokenizer: save version 1 loads back with the same tokens", "%zu bytes %s", read_all(v1).size(), error.c_str());
    Tokenizer small;
    bool refused_v1 = small.load(write_file(dir, "small.bin", {TOKENIZER_MAGIC, 2, 2, 1}, "\x01" "a" "\x01" "b"), &error) &&
                      !small.save(dir + "/small_v1.bin", 1, &error) && error.find("write version 2") != std::string::npos;
    th::report(refused_v1 && !small.can_encode() && small.encode("ab").empty(),
               "tokenizer: v1 refused for end-of-text != 50256; no encoding without all 256 byte tokens", "%s", error.c_str());
}

// Every fixture group token-for-token against tiktoken; one line per group.
void test_fixture(const Tokenizer& tok) {
    std::vector<Case> cases = read_cases("test/fixtures/tokenizer_cases.bin");
    th::report(cases.size() > 1000, "tokenizer: fixture test/fixtures/tokenizer_cases.bin read", "%zu cases", cases.size());
    std::vector<std::string> order;
    std::map<std::string, std::vector<const Case*>> groups;
    for (const Case& c : cases) {
        if (!groups.count(c.group)) order.push_back(c.group);
        groups[c.group].push_back(&c);
    }
    for (const std::string& g : order) {
        size_t bytes = 0, tokens = 0, bad = 0;
        std::string first;
        for (const Case* c : groups[g]) {
            std::string why;
            bytes += c->text.size();
            tokens += c->ids.size();
            if (!encodes_as(tok, c->text, c->ids, &why) && bad++ == 0) first = why;
        }
        std::string name = "encode == tiktoken: " + g;
        th::report(bad == 0, name.c_str(), "%zu cases, %zu bytes, %zu tokens%s%s", groups[g].size(), bytes, tokens,
                   bad ? "; first mismatch: " : "", first.c_str());
    }
    // Streaming in random chunks (1-16 bytes: every cut position) must not change a token.
    std::mt19937 rng(7);
    size_t bad = 0;
    std::string first;
    for (const Case& c : cases) {
        if (encode_streamed(tok, c.text, rng, 16) != c.ids && bad++ == 0) first = excerpt(c.text);
    }
    th::report(bad == 0, "tokenizer: encode_some() in random 1-16 byte chunks == tiktoken on every case", "%zu bad %s",
               bad, first.c_str());
}

// 1.8 MB of real text: the bundled shards decode to Shakespeare and tiktoken encoded it.
void test_shakespeare(const Tokenizer& tok) {
    for (const char* shard : {"dev/data/shakespeare/shakespeare_train.bin", "dev/data/shakespeare/shakespeare_val.bin"}) {
        std::vector<std::vector<int>> docs = shard_documents(shard, tok.eot());
        size_t bytes = 0, tokens = 0, bad = 0;
        std::string first;
        double secs = 0;
        for (const auto& d : docs) {
            std::string text = tok.decode(d);
            auto t0 = std::chrono::steady_clock::now();
            std::vector<int> ids = tok.encode(text);
            secs += seconds_since(t0);
            bytes += text.size();
            tokens += d.size();
            if (!(ids == d && tok.decode(ids) == text) && bad++ == 0) encodes_as(tok, text, d, &first);  // says where
        }
        std::string name = std::string("encode == tiktoken: ") + shard;
        th::report(!docs.empty() && bad == 0, name.c_str(), "%zu documents, %.2f MB, %zu tokens, encode %.1f MB/s%s%s",
                   docs.size(), bytes / 1e6, tokens, bytes / 1e6 / secs, bad ? "; first mismatch: " : "", first.c_str());
    }
    std::vector<std::vector<int>> docs = shard_documents("dev/data/shakespeare/shakespeare_val.bin", tok.eot());
    std::string text = tok.decode(docs.at(0));
    std::mt19937 rng(11);
    th::report(encode_streamed(tok, text, rng, 4096) == docs[0], "tokenizer: encode_some() in random chunks up to 4 KB == whole encode");
}

// The heap merge against tiktoken's scan on random pieces built to have many equal-rank pairs and
// deep merge trees; then megabyte-long pre-tokens, which must not go quadratic.
void test_merges(const Tokenizer& tok) {
    std::mt19937 rng(3);
    const char* alphabets[] = {"ab", "a", "abc", "etaoinshrdlu", "0123456789", "!?.", "\xe4\xb8\xad\xe6\x96\x87"};
    size_t bad = 0, pieces = 0;
    std::string first;
    for (const char* alpha : alphabets) {
        size_t na = strlen(alpha);
        for (int k = 0; k < 60; k++) {
            size_t len = 2 + rng() % 400;
            std::string piece;
            for (size_t i = 0; i < len; i++) piece += alpha[rng() % na];
            std::vector<int> scan, heap;
            tok.bpe_scan(piece, &scan);
            tok.bpe_heap(piece, &heap);
            pieces++;
            if (scan != heap && bad++ == 0) first = excerpt(piece);
        }
    }
    for (int k = 0; k < 200; k++) {  // arbitrary bytes
        std::string piece(2 + rng() % 200, '\0');
        for (char& c : piece) c = (char)(rng() % 256);
        std::vector<int> scan, heap;
        tok.bpe_scan(piece, &scan);
        tok.bpe_heap(piece, &heap);
        pieces++;
        if ((scan != heap || tok.decode(heap) != piece) && bad++ == 0) first = excerpt(piece);
    }
    th::report(bad == 0, "tokenizer: heap merge == scan merge (tiktoken's loop)", "%zu pieces, %zu differ %s", pieces, bad,
               first.c_str());

    // 1 MB of one letter (the case that would hang a quadratic merge), 256 KB of other runs.
    for (const char* unit : {"a", " ", "7", "!", "ab", "\xc3\xa9"}) {
        std::string text;
        while (text.size() < (unit[0] == 'a' && !unit[1] ? 1u << 20 : 1u << 18)) text += unit;
        auto t0 = std::chrono::steady_clock::now();
        std::vector<int> ids = tok.encode(text);
        double secs = seconds_since(t0);
        std::string name = "tokenizer: a " + std::to_string(text.size() >> 10) + " KB run of '" + excerpt(unit) +
                           "' encodes in bounded time and decodes back";
        th::report(tok.decode(ids) == text && secs < 10, name.c_str(), "%zu tokens in %.2f s", ids.size(), secs);
    }
}

int main() {
    Tokenizer tok;
    std::string error;
    bool ok = tok.load(TOKENIZER_FILE, &error);
    th::report(ok && tok.vocab_size() == 50257 && tok.eot() == 50256 && tok.can_encode(),
               "tokenizer: bundled GPT-2 file loads", "vocab %d, eot %d %s", tok.vocab_size(), tok.eot(), error.c_str());
    if (!ok) return th::finish();
    // Ids and bytes as tiktoken's r50k_base / GPT-2 encoding defines them.
    struct { int id; const char* bytes; } known[] = {
        {464, "The"}, {13, "."}, {11, ","}, {198, "\n"}, {262, " the"}, {50256, "<|endoftext|>"}, {0, "!"}};
    bool all = true;
    for (auto& k : known) all &= tok.decode(k.id) == k.bytes;
    th::report(all, "tokenizer: known ids decode to GPT-2's bytes", "464 -> '%s', 262 -> '%s'", tok.decode(464).c_str(),
               tok.decode(262).c_str());
    th::report(tok.decode(-1).empty() && tok.decode(50257).empty(), "tokenizer: ids outside the vocabulary decode to nothing");

    char tmpl[] = "/tmp/llmc_tokenizer_XXXXXX";
    std::string dir = mkdtemp(tmpl);
    test_file_format(tok, dir);
    std::string cmd = "rm -rf " + dir;
    if (system(cmd.c_str()) != 0) fprintf(stderr, "could not remove %s\n", dir.c_str());

    test_fixture(tok);
    test_shakespeare(tok);
    test_merges(tok);
    return th::finish();
}
