// llmc/tokenizer.h — GPT-2's byte-level BPE tokenizer from llm.c's tokenizer file: decoding (token id
// -> its bytes), encoding exactly as tiktoken's "gpt2"/r50k_base does, and writing the file back.
//
// File format (llm.c, magic 20240328): a 256 x int32 header — [0] magic, [1] version (1: end-of-text
// is 50256; 2: [3] holds it), [2] vocabulary size — then, for every token id in order, one uint8
// length (> 0) followed by that many bytes.
//
// Encoding needs nothing but that file: in GPT-2 (as in tiktoken) a token's id is also its BPE rank,
// so the merge priorities are the ids of the byte strings. encode(text) then
//   1. splits text into pre-tokens with tiktoken's r50k pattern, reproduced by hand (piece_end()):
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      with \p{L}, \p{N} and \s from llmc/unicode_tables.h (read out of tiktoken's own regex engine:
//      Unicode 16.0, not python 3.11's unicodedata 14.0 — see dev/data/gen_unicode_tables.py);
//   2. byte-pair-merges each pre-token: repeatedly join the adjacent pair of parts whose bytes
//      have the lowest rank (the leftmost on ties) until no pair is a token.
// The result is token-for-token tiktoken's encode_ordinary(): "<|endoftext|>" in the text is
// literal text (test/test_tokenizer.cu checks all this against tiktoken's own output).
//
// Invalid UTF-8 (which tiktoken's public API never sees: python strings are valid Unicode).
// Each byte of an ill-formed sequence counts as one character of the [^\s\p{L}\p{N}] class, the
// class of U+FFFD that python's decode(errors="replace") would put there; so the pre-tokens are
// those tiktoken gives the replacement-decoded text, but the BPE runs on the original bytes and
// decode(encode(x)) == x holds for any bytes. (tiktoken's private _encode_bytes instead BPE-merges
// everything from the last pre-token before the first bad byte to the end of the input as one
// piece, quadratic on a large file; it agrees with this on 203 of the fixture's 221 such cases.)
#pragma once
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <queue>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "file_io.h"
#include "unicode_tables.h"

constexpr int TOKENIZER_MAGIC = 20240328;

class Tokenizer {
  public:
    // Loads path; on failure returns false and leaves a one-line reason in *error.
    bool load(const std::string& path, std::string* error) {
        std::vector<uint8_t> data;
        std::string why;
        if (!read_whole_file(path, &data, &why)) return fail(error, why);
        if (!load_from_memory(data.data(), data.size(), error)) {
            *error = path + ": " + *error;
            return false;
        }
        return true;
    }

    // Parses a tokenizer file held in memory (what load() reads); false and a reason on failure,
    // leaving the tokenizer empty.
    bool load_from_memory(const void* data, size_t size, std::string* error) {
        tokens_.clear();
        slots_.clear();
        const unsigned char* p = (const unsigned char*)data;
        int32_t h[256];
        if (size < sizeof(h)) return fail(error, "too short for a tokenizer header");
        memcpy(h, p, sizeof(h));
        if (h[0] != TOKENIZER_MAGIC)
            return fail(error, "bad magic " + std::to_string(h[0]) + " (a llm.c tokenizer starts with " +
                                   std::to_string(TOKENIZER_MAGIC) + ")");
        if (h[1] != 1 && h[1] != 2) return fail(error, "unsupported tokenizer version " + std::to_string(h[1]));
        if (h[2] <= 0 || h[2] > (1 << 24)) return fail(error, "implausible vocabulary size " + std::to_string(h[2]));
        int eot = h[1] == 1 ? 50256 : h[3];
        if (eot < 0 || eot >= h[2])
            return fail(error, "end-of-text id " + std::to_string(eot) + " is outside the vocabulary (size " +
                                   std::to_string(h[2]) + ")");
        size_t pos = sizeof(h);
        tokens_.reserve(std::min<size_t>(h[2], (size - pos) / 2));  // a token takes >= 2 bytes
        for (int i = 0; i < h[2]; i++) {
            if (pos >= size || p[pos] == 0) return fail(error, "token " + std::to_string(i) + " is missing or empty");
            size_t len = p[pos++];
            if (size - pos < len) return fail(error, "truncated at token " + std::to_string(i));
            tokens_.emplace_back((const char*)p + pos, len);
            pos += len;
        }
        eot_ = eot;
        version_ = h[1];
        build_rank_index();
        return true;
    }

    // Writes the tokenizer as llm.c does, in file version 1 (only for end-of-text 50256, which v1
    // implies) or 2; false and a one-line reason on failure.
    bool save(const std::string& path, int version, std::string* error) const {
        std::string out;
        if (!serialize(version, &out, error)) return false;
        FILE* f = fopen(path.c_str(), "wb");
        if (!f) return fail(error, path + ": " + strerror(errno));
        bool ok = fwrite(out.data(), 1, out.size(), f) == out.size();
        ok &= fclose(f) == 0;
        if (!ok) return fail(error, path + ": write failed");
        return true;
    }

    // The bytes save() writes.
    bool serialize(int version, std::string* out, std::string* error) const {
        if (version != 1 && version != 2) return fail(error, "cannot write tokenizer version " + std::to_string(version));
        if (version == 1 && eot_ != 50256)
            return fail(error, "version 1 implies end-of-text 50256 but this tokenizer's is " + std::to_string(eot_) +
                                   ": write version 2");
        if (tokens_.empty()) return fail(error, "no tokenizer loaded");
        int32_t h[256] = {TOKENIZER_MAGIC, version, vocab_size()};
        if (version == 2) h[3] = eot_;
        out->assign((const char*)h, sizeof(h));
        for (const std::string& t : tokens_) {
            *out += (char)(unsigned char)t.size();  // 1..255: load() accepts nothing else
            *out += t;
        }
        return true;
    }

    // The bytes of token id (empty for an id outside the vocabulary).
    const std::string& decode(int id) const {
        static const std::string empty;
        return id >= 0 && id < (int)tokens_.size() ? tokens_[id] : empty;
    }
    // The bytes of a token sequence.
    std::string decode(const std::vector<int>& ids) const {
        std::string s;
        for (int id : ids) s += decode(id);
        return s;
    }
    int eot() const { return eot_; }
    int vocab_size() const { return (int)tokens_.size(); }
    int version() const { return version_; }  // of the file loaded
    // Whether encode() works: every single byte must be a token (GPT-2's files qualify).
    bool can_encode() const { return byte_level_; }

    // The tokens of text, as tiktoken's encode_ordinary() gives them (empty if !can_encode()).
    std::vector<int> encode(std::string_view text) const {
        std::vector<int> ids;
        encode_some(text, true, &ids);
        return ids;
    }

    // Streaming encode: appends to *ids the tokens of the pre-tokens of text that are final and
    // returns how many bytes they cover. With at_end that is all of text; otherwise more text may
    // follow, and pre-tokens that could still change (those ending within 8 bytes of the end:
    // every match decision looks at most one, possibly truncated, character past its piece) are
    // left for the next call, which must start at the returned offset.
    size_t encode_some(std::string_view text, bool at_end, std::vector<int>* ids) const {
        if (!byte_level_) return 0;
        const unsigned char* s = (const unsigned char*)text.data();
        size_t n = text.size(), pos = 0;
        while (pos < n) {
            size_t end = piece_end(s, n, pos);
            if (!at_end && end + 8 > n) break;
            bpe(text.substr(pos, end - pos), ids);
            pos = end;
        }
        return pos;
    }

    // Appends the tokens of one pre-token. Like tiktoken, a piece that is a token is that token;
    // otherwise short pieces merge with a linear scan (fast for the few dozen bytes of real
    // pre-tokens) and long ones with a heap (a megabyte-long run of one letter is one pre-token,
    // quadratic with the scan). Both give the same merges (test_tokenizer checks). Offsets are
    // 32-bit: a pre-token must be shorter than 4 GiB.
    void bpe(std::string_view piece, std::vector<int>* ids) const {
        int whole = rank(piece);
        if (whole >= 0) {
            ids->push_back(whole);
            return;
        }
        if (piece.size() <= SCAN_MAX_BYTES) bpe_scan(piece, ids);
        else bpe_heap(piece, ids);
    }

    // The merge loop as tiktoken writes it: parts as start offsets, each with the rank of itself
    // joined to its right neighbour; join the lowest (leftmost) pair, update its two neighbours'.
    void bpe_scan(std::string_view piece, std::vector<int>* ids) const {
        struct Part {
            uint32_t start;
            int pair_rank;  // rank of this part + the next one, or NONE
        };
        std::vector<Part> heap_parts;
        Part stack_parts[SCAN_MAX_BYTES + 1];  // no allocation for the pieces of real text
        size_t n = piece.size(), nparts = n + 1;   // n parts and an end sentinel
        if (n > SCAN_MAX_BYTES) heap_parts.resize(n + 1);
        Part* parts = n > SCAN_MAX_BYTES ? heap_parts.data() : stack_parts;
        for (size_t i = 0; i <= n; i++) parts[i] = {(uint32_t)i, NONE};
        // The rank of parts i and i+1 joined.
        auto pair_rank = [&](size_t i) {
            if (i + 2 >= nparts) return NONE;
            int r = rank(piece.substr(parts[i].start, parts[i + 2].start - parts[i].start));
            return r >= 0 ? r : NONE;
        };
        for (size_t i = 0; i + 1 < n; i++) parts[i].pair_rank = pair_rank(i);
        for (;;) {
            size_t best = 0;
            for (size_t i = 1; i + 1 < nparts; i++)
                if (parts[i].pair_rank < parts[best].pair_rank) best = i;
            if (parts[best].pair_rank == NONE) break;
            memmove(parts + best + 1, parts + best + 2, (nparts - best - 2) * sizeof(Part));
            nparts--;
            parts[best].pair_rank = pair_rank(best);
            if (best > 0) parts[best - 1].pair_rank = pair_rank(best - 1);
        }
        for (size_t i = 0; i + 1 < nparts; i++)
            ids->push_back(rank(piece.substr(parts[i].start, parts[i + 1].start - parts[i].start)));
    }

    // The same merges in O(n log n): parts as a linked list over start offsets, candidate pairs in
    // a min-heap of (rank, left start, right end) — ties go to the leftmost, as in the scan. A
    // merge makes entries naming the old right end stale; they are skipped when popped (a part's
    // right neighbour only ever ends further right, so a stale end never matches again).
    void bpe_heap(std::string_view piece, std::vector<int>* ids) const {
        size_t n = piece.size();
        std::vector<uint32_t> next(n), prev(n);  // of each live part, by its start offset
        std::vector<char> live(n, 1);
        for (size_t i = 0; i < n; i++) {
            next[i] = (uint32_t)(i + 1);
            prev[i] = (uint32_t)(i - 1);  // wraps for i == 0: never read, part 0 has no left
        }
        using Pair = std::tuple<int, uint32_t, uint32_t>;  // rank, left start, right end
        std::priority_queue<Pair, std::vector<Pair>, std::greater<Pair>> heap;
        auto push = [&](uint32_t left, uint32_t right_end) {
            int r = rank(piece.substr(left, right_end - left));
            if (r >= 0) heap.emplace(r, left, right_end);
        };
        for (uint32_t i = 0; i + 1 < n; i++) push(i, i + 2);
        while (!heap.empty()) {
            auto [r, left, right_end] = heap.top();
            heap.pop();
            uint32_t right = next[left];
            if (!live[left] || right >= n || next[right] != right_end) continue;  // stale
            live[right] = 0;
            next[left] = right_end;
            if (right_end < n) prev[right_end] = left;
            if (left > 0) push(prev[left], right_end);
            if (right_end < n) push(left, next[right_end]);
        }
        for (uint32_t i = 0; i < n; i = next[i]) ids->push_back(rank(piece.substr(i, next[i] - i)));
    }

    // Where the pre-token starting at byte pos of s[0, n) ends: the r50k pattern's leftmost-first
    // match, one alternative after the other.
    static size_t piece_end(const unsigned char* s, size_t n, size_t pos) {
        Unit u = unit_at(s, n, pos);
        if (s[pos] == '\'' && pos + 1 < n) {  // 's 't 'm 'd 're 've 'll (lower case only)
            unsigned char c = s[pos + 1], d = pos + 2 < n ? s[pos + 2] : 0;
            if (c == 's' || c == 't' || c == 'm' || c == 'd') return pos + 2;
            if ((c == 'r' && d == 'e') || (c == 'v' && d == 'e') || (c == 'l' && d == 'l')) return pos + 3;
        }
        if (s[pos] == ' ' && pos + 1 < n) {  // " ?" before a letter, number or other run
            Unit v = unit_at(s, n, pos + 1);
            if (v.cls != SPACE) return run_end(s, n, pos + 1 + v.len, v.cls);
        }
        if (u.cls != SPACE) return run_end(s, n, pos + u.len, u.cls);
        // \s+(?!\S)|\s+ : the whole whitespace run if it ends the text; else the run minus its
        // last character, which then leads the next pre-token (" word"); a single one stays.
        size_t end = pos, last = pos;
        while (end < n) {
            Unit v = unit_at(s, n, end);
            if (v.cls != SPACE) break;
            last = end;
            end += v.len;
        }
        return end == n || last == pos ? end : last;
    }

  private:
    enum Class : uint8_t { LETTER, NUMBER, SPACE, OTHER };  // OTHER: [^\s\p{L}\p{N}], invalid bytes
    struct Unit {
        Class cls;
        uint8_t len;  // bytes: 1-4, 1 for a byte of invalid UTF-8
    };
    static constexpr int NONE = INT32_MAX;               // no rank: not a token
    static constexpr size_t SCAN_MAX_BYTES = 64;         // longer pieces merge with the heap

    static Class classify(uint32_t cp) {
        if (unicode::is_letter(cp)) return LETTER;
        if (unicode::is_number(cp)) return NUMBER;
        if (unicode::is_whitespace(cp)) return SPACE;
        return OTHER;
    }

    // The class of every ASCII character (the fast path of unit_at).
    static const Class* ascii_classes() {
        static const auto table = [] {
            std::vector<Class> t(128);
            for (uint32_t c = 0; c < 128; c++) t[c] = classify(c);
            return t;
        }();
        return table.data();
    }

    // The character (or invalid byte) at s[pos], pos < n: strict UTF-8 as Rust's str accepts it
    // (no overlong forms, no surrogates, nothing past U+10FFFF).
    static Unit unit_at(const unsigned char* s, size_t n, size_t pos) {
        unsigned char b = s[pos];
        if (b < 0x80) return {ascii_classes()[b], 1};
        size_t left = n - pos;
        auto cont = [&](size_t k) { return k < left && (s[pos + k] & 0xC0) == 0x80; };
        if (b >= 0xC2 && b <= 0xDF && cont(1)) return {classify(((b & 0x1Fu) << 6) | (s[pos + 1] & 0x3Fu)), 2};
        if (b >= 0xE0 && b <= 0xEF && cont(1) && cont(2)) {
            uint32_t cp = ((b & 0x0Fu) << 12) | ((s[pos + 1] & 0x3Fu) << 6) | (s[pos + 2] & 0x3Fu);
            if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) return {classify(cp), 3};
        }
        if (b >= 0xF0 && b <= 0xF4 && cont(1) && cont(2) && cont(3)) {
            uint32_t cp = ((b & 0x07u) << 18) | ((s[pos + 1] & 0x3Fu) << 12) | ((s[pos + 2] & 0x3Fu) << 6) |
                          (s[pos + 3] & 0x3Fu);
            if (cp >= 0x10000 && cp <= 0x10FFFF) return {classify(cp), 4};
        }
        return {OTHER, 1};
    }

    // The end of the run of class cls that continues at pos.
    static size_t run_end(const unsigned char* s, size_t n, size_t pos, Class cls) {
        while (pos < n) {
            Unit v = unit_at(s, n, pos);
            if (v.cls != cls) break;
            pos += v.len;
        }
        return pos;
    }

    // Index bytes -> rank: open addressing, at most half full; a slot holds a token id and the
    // high half of its hash (most probes that miss are told apart without comparing bytes). Every
    // id but the end-of-text one is a rank; a byte string that occurs twice keeps its lowest id.
    void build_rank_index() {
        size_t cap = 16;
        while (cap < 2 * tokens_.size()) cap *= 2;
        slots_.assign(cap, Slot{-1, 0});
        for (int id = 0; id < (int)tokens_.size(); id++) {
            if (id == eot_) continue;
            uint64_t h = hash(tokens_[id]);
            size_t i = h & (cap - 1);
            while (slots_[i].id >= 0 && tokens_[slots_[i].id] != tokens_[id]) i = (i + 1) & (cap - 1);
            if (slots_[i].id < 0) slots_[i] = Slot{id, (uint32_t)(h >> 32)};
        }
        byte_level_ = true;
        for (int b = 0; b < 256; b++) byte_level_ &= rank(std::string_view((const char*)&b, 1)) >= 0;
    }

    // The rank (= id) of a byte string, or -1 if it is not a token.
    int rank(std::string_view bytes) const {
        if (slots_.empty()) return -1;
        size_t mask = slots_.size() - 1;
        uint64_t h = hash(bytes);
        for (size_t i = h & mask;; i = (i + 1) & mask) {
            const Slot& s = slots_[i];
            if (s.id < 0 || (s.tag == (uint32_t)(h >> 32) && tokens_[s.id] == bytes)) return s.id;
        }
    }

    static uint64_t hash(std::string_view s) {  // FNV-1a, then a final mix for the low bits
        uint64_t h = 1469598103934665603ull;
        for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
        return h ^ (h >> 29);
    }

    static bool fail(std::string* error, const std::string& why) {
        *error = why;
        return false;
    }

    std::vector<std::string> tokens_;
    struct Slot {
        int32_t id;    // -1: empty
        uint32_t tag;  // high half of the hash of the token's bytes
    };
    std::vector<Slot> slots_;  // the rank index
    int eot_ = 50256;
    int version_ = 0;
    bool byte_level_ = false;
};
