// test/test_wordpiece.cu — BERT's WordPiece tokenizer (llmc/wordpiece.h) on the bundled bert-base-uncased
// vocabulary (dev/data/bert/vocab.txt): malformed vocabulary files refused with a reason, then
// token-for-token against transformers' python BertTokenizer on the cases of
// test/fixtures/wordpiece_cases.bin (written by test/oracle_wordpiece.py, whose docstring lists
// them: hand-written groups, random strings, invalid UTF-8, four other option sets, 1.8 MB of
// Shakespeare, every code point and every canonical decomposition through the pre-WordPiece
// steps, [CLS]/[SEP] framing with truncation, decoding); one line per group. Also the encoding
// speed on English.
#include "../llmc/cuda_common.h"
#include "../llmc/tokenizer.h"
#include "../llmc/wordpiece.h"
#include "harness.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <map>

const char* VOCAB_FILE = "dev/data/bert/vocab.txt";

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

std::string write_file(const std::string& dir, const char* name, const std::string& body) {
    std::string path = dir + "/" + name;
    FILE* f = fopen(path.c_str(), "wb");
    fwrite(body.data(), 1, body.size(), f);
    fclose(f);
    return path;
}

// Up to 60 bytes of s, C-escaped, for failure messages.
std::string excerpt(const std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size() && i < 60; i++) {
        unsigned char c = s[i];
        char buf[8];
        if (c == '\n') out += "\\n";
        else if (c == '\t') out += "\\t";
        else if (c < 0x20 || c == 0x7f) { snprintf(buf, sizeof(buf), "\\x%02x", c); out += buf; }
        else out += (char)c;
    }
    return s.size() > 60 ? out + "..." : out;
}

// FNV-1a, as test/oracle_wordpiece.py hashes ids (uint32 little-endian) and words (each + 0xFF).
uint64_t fnv1a(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char*)data)[i]) * 0x100000001b3ull;
    return h;
}
uint64_t ids_hash(const std::vector<int>& ids) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int id : ids) {
        uint32_t v = (uint32_t)id;
        h = fnv1a(&v, 4, h);
    }
    return h;
}
uint64_t words_hash(const std::vector<std::string>& words) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const std::string& w : words) h = fnv1a("\xff", 1, fnv1a(w.data(), w.size(), h));
    return h;
}

void append_utf8(std::string* s, uint32_t cp) {
    if (cp < 0x80) {
        *s += (char)cp;
    } else if (cp < 0x800) {
        *s += (char)(0xC0 | (cp >> 6));
        *s += (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *s += (char)(0xE0 | (cp >> 12));
        *s += (char)(0x80 | ((cp >> 6) & 0x3F));
        *s += (char)(0x80 | (cp & 0x3F));
    } else {
        *s += (char)(0xF0 | (cp >> 18));
        *s += (char)(0x80 | ((cp >> 12) & 0x3F));
        *s += (char)(0x80 | ((cp >> 6) & 0x3F));
        *s += (char)(0x80 | (cp & 0x3F));
    }
}

// The fixture's rule-made texts (test/oracle_wordpiece.py's docstring).
std::string code_point_text(uint32_t lo, uint32_t hi) {
    std::string s;
    for (uint32_t c = lo; c <= hi; c++) {
        if (c >= 0xD800 && c < 0xE000) continue;
        append_utf8(&s, c);
        s += 'a';
        append_utf8(&s, c);
        s += "A ";
    }
    return s;
}
std::string decomposition_text(uint32_t i, uint32_t j) {
    std::string s;
    auto put = [&](std::initializer_list<uint32_t> cps) {
        for (uint32_t c : cps) append_utf8(&s, c);
    };
    for (uint32_t k = i; k < j && k < std::size(unicode::bert::decompositions); k++) {
        const unicode::bert::Decomposition& d = unicode::bert::decompositions[k];
        uint32_t a = d.first, b = d.second, p = d.cp, sp = ' ';
        if (b) put({a, b, sp, a, 0x334, b, sp, a, 0x301, b, sp, a, b, 0x323, sp, p, 0x328, sp, b, a, sp});
        else put({a, sp, p, 0x301, sp});
    }
    return s;
}

// S: the bundled Shakespeare shards decoded with the bundled GPT-2 tokenizer (every token but
// end-of-text; val, then train), the oracle's real-text source.
std::string shakespeare_text() {
    Tokenizer gpt2;
    std::string error, s;
    if (!gpt2.load("dev/data/shakespeare/gpt2_tokenizer.bin", &error)) return s;
    for (const char* shard : {"dev/data/shakespeare/shakespeare_val.bin", "dev/data/shakespeare/shakespeare_train.bin"}) {
        std::string d = read_all(shard);
        for (size_t p = 1024; p + 1 < d.size(); p += 2) {
            int t = (unsigned char)d[p] | ((unsigned char)d[p + 1] << 8);
            if (t != gpt2.eot()) s += gpt2.decode(t);
        }
    }
    return s;
}

enum Kind { ENCODE, ENCODE_HASH, WORDS_HASH, SINGLE, PAIR, DECODE };

struct Case {
    int group;
    Kind kind;
    uint8_t options;
    int max_len;
    std::array<std::string, 2> text;
    std::string source;  // the rule or range that made a text not stored in the fixture, for messages
    std::vector<int> ids;
    uint32_t count = 0;  // ids or words, for the hashed kinds; type-0 ids for single and pair
    uint64_t hash = 0;
    std::string decoded;
};

// Reads test/fixtures/wordpiece_cases.bin (format: test/oracle_wordpiece.py); false if malformed.
bool read_cases(const std::string& path, const std::string& shakespeare, std::vector<std::string>* groups,
                std::vector<Case>* cases) {
    std::string d = read_all(path);
    size_t p = 0;
    bool ok = true;
    auto need = [&](size_t n) { return ok = ok && n <= d.size() - p; };  // p <= d.size() always
    auto u8 = [&]() -> uint32_t { return need(1) ? (unsigned char)d[p++] : 0; };
    auto u32 = [&]() -> uint32_t {
        uint32_t v = 0;
        if (need(4)) memcpy(&v, d.data() + p, 4), p += 4;
        return v;
    };
    auto bytes = [&](size_t n) {
        std::string s = need(n) ? d.substr(p, n) : "";
        if (ok) p += n;
        return s;
    };
    if (bytes(8) != "WPCASES1") return false;
    for (uint32_t g = 0, n = u8(); g < n && ok; g++) groups->push_back(bytes(u8()));
    for (uint32_t k = 0, n = u32(); k < n && ok; k++) {
        Case c;
        c.group = (int)u8();
        c.kind = (Kind)u8();
        c.options = (uint8_t)u8();
        c.max_len = (int)u32();
        int texts = c.kind == PAIR ? 2 : c.kind == DECODE ? 0 : 1;
        for (int t = 0; t < texts && ok; t++) {
            uint32_t source = u8(), x = 0, y = 0;
            if (source == 0) {
                c.text[t] = bytes(u32());
                continue;
            }
            x = u32();
            y = u32();
            char where[64];
            if (source == 1) {
                c.text[t] = code_point_text(x, y);
                snprintf(where, sizeof(where), "U+%04X..U+%04X", x, y);
            } else if (source == 2) {
                c.text[t] = decomposition_text(x, y);
                snprintf(where, sizeof(where), "decompositions[%u..%u)", x, y);
            } else if (source == 3 && x <= shakespeare.size() && y <= shakespeare.size() - x) {
                c.text[t] = shakespeare.substr(x, y);
                snprintf(where, sizeof(where), "shakespeare bytes %u..%u", x, x + y);
            } else if (source == 4 && x < cases->size() && y < 2) {
                c.text[t] = (*cases)[x].text[y];
                continue;  // messages show the text itself, as for stored texts
            } else {
                return false;
            }
            c.source = where;
        }
        if (c.kind == ENCODE || c.kind == SINGLE || c.kind == PAIR) {
            for (uint32_t i = 0, n = u32(); i < n && ok; i++) {
                uint32_t lo = u8();
                c.ids.push_back((int)(lo | u8() << 8));
            }
            if (c.kind != ENCODE) c.count = u32();
        } else if (c.kind == ENCODE_HASH || c.kind == WORDS_HASH) {
            c.count = u32();
            c.hash = u32();
            c.hash |= (uint64_t)u32() << 32;
        } else if (c.kind == DECODE) {
            for (uint32_t i = 0, n = u32(); i < n && ok; i++) c.ids.push_back((int)u32());
            c.decoded = bytes(u32());
        } else {
            return false;
        }
        if (c.group >= (int)groups->size()) return false;
        cases->push_back(std::move(c));
    }
    return ok && p == d.size();
}

WordPiece::Options options_of(uint8_t bits) {
    WordPiece::Options o;
    o.do_lower_case = bits & 1;
    if (bits & 2) o.strip_accents = (bits & 4) != 0;
    o.tokenize_chinese_chars = (bits & 8) != 0;
    return o;
}

// Where two id sequences first differ, with the tokens' text.
std::string first_difference(const WordPiece& wp, const std::vector<int>& got, const std::vector<int>& want) {
    size_t i = 0;
    while (i < got.size() && i < want.size() && got[i] == want[i]) i++;
    char buf[512];
    snprintf(buf, sizeof(buf), "token %zu: got %d '%s', want %d '%s' (%zu vs %zu tokens)", i, i < got.size() ? got[i] : -1,
             i < got.size() ? excerpt(wp.token(got[i])).c_str() : "", i < want.size() ? want[i] : -1,
             i < want.size() ? excerpt(wp.token(want[i])).c_str() : "", got.size(), want.size());
    return buf;
}

// Checks one case; on a mismatch fills *why.
bool check_case(const WordPiece& wp, const Case& c, std::string* why) {
    std::string what = c.source.empty() ? "'" + excerpt(c.text[0]) + "'" : c.source;
    switch (c.kind) {
        case ENCODE: {
            std::vector<int> got = wp.encode(c.text[0]);
            if (got != c.ids) *why = what + " " + first_difference(wp, got, c.ids);
            return got == c.ids;
        }
        case ENCODE_HASH: {
            std::vector<int> got = wp.encode(c.text[0]);
            bool ok = got.size() == c.count && ids_hash(got) == c.hash;
            if (!ok) *why = what + ": " + std::to_string(got.size()) + " tokens, want " + std::to_string(c.count) + " (or another hash)";
            return ok;
        }
        case WORDS_HASH: {
            std::vector<std::string> got = wp.pre_tokenize(c.text[0]);
            bool ok = got.size() == c.count && words_hash(got) == c.hash;
            if (!ok) *why = what + ": " + std::to_string(got.size()) + " words, want " + std::to_string(c.count) + " (or another hash)";
            return ok;
        }
        case SINGLE:
        case PAIR: {
            WordPiece::Encoding e = c.kind == SINGLE ? wp.encode_single(c.text[0], c.max_len)
                                                     : wp.encode_pair(c.text[0], c.text[1], c.max_len);
            std::vector<int> want_types(c.ids.size(), 1);
            std::fill(want_types.begin(), want_types.begin() + std::min<size_t>(c.count, c.ids.size()), 0);
            if (e.ids != c.ids) *why = "'" + excerpt(c.text[0]) + "' / '" + excerpt(c.text[1]) + "' max_len " +
                                       std::to_string(c.max_len) + " " + first_difference(wp, e.ids, c.ids);
            else if (e.type_ids != want_types) *why = "'" + excerpt(c.text[0]) + "': token type ids differ";
            return e.ids == c.ids && e.type_ids == want_types;
        }
        case DECODE: {
            std::string got = wp.decode(c.ids, (c.options & 16) != 0);
            if (got != c.decoded) *why = std::to_string(c.ids.size()) + " ids: got '" + excerpt(got) + "', want '" + excerpt(c.decoded) + "'";
            return got == c.decoded;
        }
    }
    return false;
}

void test_fixture(const std::string& shakespeare) {
    std::vector<std::string> groups;
    std::vector<Case> cases;
    bool read = read_cases("test/fixtures/wordpiece_cases.bin", shakespeare, &groups, &cases);
    th::report(read && cases.size() > 4000, "wordpiece: fixture test/fixtures/wordpiece_cases.bin read", "%zu cases, %zu groups",
               cases.size(), groups.size());
    if (!read) return;
    std::map<uint8_t, WordPiece> by_options;  // one tokenizer per option set
    std::string error;
    std::string vocab = read_all(VOCAB_FILE);
    for (const Case& c : cases) {
        if (by_options.count(c.options & 15)) continue;
        WordPiece& wp = by_options[c.options & 15];
        wp.set_options(options_of(c.options));
        wp.load_from_memory(vocab.data(), vocab.size(), &error);
    }
    for (size_t g = 0; g < groups.size(); g++) {
        size_t n = 0, bytes = 0, bad = 0;
        std::string first;
        auto t0 = std::chrono::steady_clock::now();
        for (const Case& c : cases) {
            if (c.group != (int)g) continue;
            std::string why;
            n++;
            bytes += c.text[0].size() + c.text[1].size();
            if (!check_case(by_options[c.options & 15], c, &why) && bad++ == 0) first = why;
        }
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::string name = "wordpiece == BertTokenizer: " + groups[g];
        th::report(n > 0 && bad == 0, name.c_str(), "%zu cases, %zu bytes, %.2f s%s%s", n, bytes, secs,
                   bad ? "; first mismatch: " : "", first.c_str());
    }
}

void expect_refused(const char* name, const std::string& path, const std::string& reason) {
    WordPiece wp;
    std::string error;
    bool loaded = wp.load(path, &error);
    th::report(!loaded && error.find(reason) != std::string::npos && wp.vocab_size() == 0 && wp.encode("a").empty(), name,
               "%s", error.c_str());
}

// Malformed vocabularies are refused with a reason; other line ends load the same ids.
void test_vocab_files(const std::string& dir) {
    const std::string specials = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
    expect_refused("wordpiece refuses: missing file", dir + "/none.txt", "No such file");
    expect_refused("wordpiece refuses: empty file", write_file(dir, "empty.txt", ""), "empty vocabulary file");
    expect_refused("wordpiece refuses: duplicate token", write_file(dir, "dup.txt", specials + "a\nb\n##a\na\n"),
                   "line 9: token 'a' repeats line 6");
    for (const char* missing : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) {
        std::string body = specials;
        body.erase(body.find(missing), strlen(missing) + 1);
        std::string name = std::string("wordpiece refuses: no ") + missing + " token";
        expect_refused(name.c_str(), write_file(dir, "missing.txt", body + "a\n"),
                       std::string("the vocabulary has no ") + missing + " token");
    }
    expect_refused("wordpiece refuses: a line of invalid UTF-8", write_file(dir, "utf8.txt", specials + "ok\nab\xff" "c\n"),
                   "line 7: invalid UTF-8 at byte 3");
    expect_refused("wordpiece refuses: a surrogate in UTF-8", write_file(dir, "surrogate.txt", specials + "\xed\xa0\x80\n"),
                   "line 6: invalid UTF-8 at byte 1");
    expect_refused("wordpiece refuses: an empty line", write_file(dir, "blank.txt", specials + "a\n\nb\n"), "line 7 is empty");
    expect_refused("wordpiece refuses: a byte order mark", write_file(dir, "bom.txt", "\xEF\xBB\xBF" + specials),
                   "byte order mark");

    // \r\n, \r and a missing final newline end lines as python's universal newlines do.
    std::string lf = specials + "hello\n##s\n\xef\xbf\xbd\n";
    std::vector<int> want;
    bool same = true;
    uint64_t fingerprint = 0;
    bool same_fingerprint = true;
    for (std::string body : {lf, std::string(lf, 0, lf.size() - 1)}) {
        for (const char* eol : {"\n", "\r\n", "\r"}) {
            std::string b = body;
            for (size_t at = 0; (at = b.find('\n', at)) != std::string::npos; at += strlen(eol)) b.replace(at, 1, eol);
            WordPiece wp;
            std::string error;
            bool ok = wp.load(write_file(dir, "eol.txt", b), &error);
            std::vector<int> got = wp.encode("[CLS] hellos helloss");
            if (want.empty()) want = got;
            same &= ok && wp.vocab_size() == 8 && got == want && wp.token(7) == "\xef\xbf\xbd";
            if (!fingerprint) fingerprint = wp.fingerprint();
            same_fingerprint &= ok && wp.fingerprint() == fingerprint;
        }
    }
    th::report(same && want == std::vector<int>{2, 5, 6, 5, 6, 6}, "wordpiece: \\n, \\r\\n, \\r line ends and no final newline load alike");
    // The fingerprint: the same for those files, another for the same tokens in another order or one
    // token changed (the same size either way).
    WordPiece swapped, changed;
    std::string error;
    bool loaded = swapped.load(write_file(dir, "swapped.txt", specials + "##s\nhello\n\xef\xbf\xbd\n"), &error) &&
                  changed.load(write_file(dir, "changed.txt", specials + "hello\n##t\n\xef\xbf\xbd\n"), &error);
    th::report(same_fingerprint && fingerprint != 0 && loaded && swapped.fingerprint() != fingerprint &&
                   changed.fingerprint() != fingerprint && swapped.fingerprint() != changed.fingerprint(),
               "wordpiece: the vocabulary's fingerprint ignores line ends, and tells tokens in another order or a "
               "changed token apart", "%016llx %016llx %016llx", (unsigned long long)fingerprint,
               (unsigned long long)swapped.fingerprint(), (unsigned long long)changed.fingerprint());
}

// The bundled vocabulary, the API around encode(), and English speed.
void test_api(const WordPiece& wp, const std::string& shakespeare) {
    th::report(wp.vocab_size() == 30522 && wp.pad_id() == 0 && wp.unk_id() == 100 && wp.cls_id() == 101 && wp.sep_id() == 102 &&
                   wp.mask_id() == 103,
               "wordpiece: bert-base-uncased vocab: 30522 tokens, [PAD] [UNK] [CLS] [SEP] [MASK] = 0 100 101 102 103");
    th::report(wp.token(-1) == "[UNK]" && wp.token(30522) == "[UNK]" && wp.token(2023) == "this" && wp.token_id("##s") == 2015 &&
                   wp.token_id("nonexistent-token") == -1,
               "wordpiece: token() / token_id()", "2023 -> '%s'", wp.token(2023).c_str());
    WordPiece::Encoding e = wp.encode_pair("Hello world", "How are you?");
    th::report(e.ids == std::vector<int>{101, 7592, 2088, 102, 2129, 2024, 2017, 1029, 102} &&
                   e.type_ids == std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1, 1},
               "wordpiece: encode_pair([CLS] a [SEP] b [SEP]) and token type ids");
    WordPiece empty;
    th::report(empty.encode("hello").empty() && empty.decode({1, 2}).empty() && empty.token(3).empty(),
               "wordpiece: nothing loaded: empty encodings and decodings");
    th::ChildOutput child = th::run_in_child([&] { wp.encode_single("hello", 2); });
    while (!child.text.empty() && child.text.back() == '\n') child.text.pop_back();
    th::report(WIFEXITED(child.status) && WEXITSTATUS(child.status) == EXIT_FAILURE &&
                   child.text.find("max_len 2 must be 0 (no limit) or at least 3") != std::string::npos,
               "wordpiece: max_len 2 stops with a message", "%s", child.text.c_str());

    // English speed: all of the Shakespeare (ASCII prose), best of 5 (the machine may be shared).
    double best = 1e9;
    size_t tokens = 0;
    for (int rep = 0; rep < 5; rep++) {
        auto t0 = std::chrono::steady_clock::now();
        tokens = wp.encode(shakespeare).size();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    th::report(tokens > 300000, "wordpiece: encode speed on English (the 1.8 MB of Shakespeare)", "%zu tokens, %.1f MB/s",
               tokens, shakespeare.size() / 1e6 / best);
}

int main() {
    WordPiece wp;
    std::string error;
    bool ok = wp.load(VOCAB_FILE, &error);
    th::report(ok, "wordpiece: bundled vocabulary dev/data/bert/vocab.txt loads", "%s", error.c_str());
    if (!ok) return th::finish();
    std::string shakespeare = shakespeare_text();
    th::report(shakespeare.size() > 1800000, "wordpiece: the Shakespeare shards decode", "%zu bytes", shakespeare.size());

    char tmpl[] = "/tmp/llmc_wordpiece_XXXXXX";
    std::string dir = mkdtemp(tmpl);
    test_vocab_files(dir);
    test_api(wp, shakespeare);
    std::string cmd = "rm -rf " + dir;
    if (system(cmd.c_str()) != 0) fprintf(stderr, "could not remove %s\n", dir.c_str());

    test_fixture(shakespeare);
    return th::finish();
}
