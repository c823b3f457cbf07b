// llmc/wordpiece.h — BERT's WordPiece tokenizer from a vocab.txt: text -> token ids exactly as
// transformers' python BertTokenizer (4.45) gives them for the same options, [CLS] a [SEP] and
// [CLS] a [SEP] b [SEP] with token type ids and longest-first truncation, and decoding.
//
// What BertTokenizer does to a text (PreTrainedTokenizer.tokenize, BasicTokenizer,
// WordpieceTokenizer), in the order encode() does it:
//   1. the special tokens [PAD] [UNK] [CLS] [SEP] [MASK] written in the text (case-sensitively)
//      become their ids; the text between them is tokenized piece by piece (no word spans one);
//   2. do_lower_case: str.lower() of every character on its own (tokenize()'s regex lower-cases one
//      character at a time, so a capital sigma always becomes σ, never the final ς);
//   3. clean: drop NUL, U+FFFD and "control" characters — every C* category: Cc, Cf, and also the
//      unassigned and private-use code points — and turn whitespace (\t \n \r, Zs) into spaces;
//   4. tokenize_chinese_chars: spaces around each CJK ideograph (is_cjk(): the ranges of
//      BertTokenizer._is_chinese_char; kana and hangul are not among them);
//   5. NFC;
//   6. split on whitespace, as str.split() does (U+2028 and U+2029 too, which step 3 keeps);
//   7. a word that is a special token stays whole (possible only without lower case, e.g. "[CL\x7fS]"
//      cleaned to "[CLS]"). Other words are lower-cased again (a no-op: python's lower case is
//      idempotent and NFC keeps lower case lower, which dev/data/gen_unicode_tables.py asserts, so
//      it is skipped here) and, if strip_accents (unset: do_lower_case), decomposed (NFD) with the
//      nonspacing marks (Mn) dropped;
//   8. split on punctuation: each punctuation character (category P*, and all of ASCII's
//      non-alphanumeric printables) is a word of its own;
//   9. WordPiece, per word: greedily the longest vocabulary token that starts the word, then the
//      longest "##" token that continues it, and so on; a word longer than 100 code points, or one
//      where nothing matches at some point, is a single [UNK].
// The Unicode data is llmc/unicode_bert.h: Unicode 14.0.0, python 3.11's unicodedata, which is what
// BertTokenizer uses there (test/test_wordpiece.cu checks all this against it, test/oracle_wordpiece.py).
//
// Bytes that are not UTF-8: each ill-formed sequence reads as U+FFFD, which step 3 drops, so
// encode(bytes) is BertTokenizer's encoding of bytes.decode("utf-8", errors="replace").
//
// The vocabulary file is BERT's vocab.txt: one token per line, line k (from 0) is token id k, as
// transformers' load_vocab reads it (a line ends at \n, \r\n or \r). Refused with a reason: an empty
// file, a line that is empty or not UTF-8, a token that appears twice (load_vocab would silently
// keep the later id), a missing [PAD] [UNK] [CLS] [SEP] or [MASK].
#pragma once
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "file_io.h"
#include "unicode_bert.h"

class WordPiece {
  public:
    struct Options {
        bool do_lower_case = true;
        std::optional<bool> strip_accents;  // unset: strip when lower-casing, as BertTokenizer's None
        bool tokenize_chinese_chars = true;
        int max_input_chars_per_word = 100;  // longer words are [UNK]
    };
    // A model input: ids with [CLS]/[SEP] and their token type ids (0 for [CLS] a [SEP], 1 for b [SEP]).
    struct Encoding {
        std::vector<int> ids;
        std::vector<int> type_ids;
    };

    WordPiece() = default;
    explicit WordPiece(const Options& options) : options_(options) {}
    const Options& options() const { return options_; }
    void set_options(const Options& options) { options_ = options; }

    // Loads a vocab.txt; on failure returns false and leaves a one-line reason in *error.
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

    // Parses a vocab.txt held in memory (what load() reads); false and a reason on failure, leaving
    // the tokenizer empty.
    bool load_from_memory(const void* data, size_t size, std::string* error) {
        clear();
        if (parse(data, size, error)) return true;
        clear();
        return false;
    }

    int vocab_size() const { return (int)tokens_.size(); }
    // A 64-bit fingerprint of the vocabulary (FNV-1a over the tokens in id order, each followed by a
    // newline; never 0): two vocabularies with the same tokens in the same order have the same one,
    // whatever their files' line endings. BERT shards record it (llmc/bert_dataloader.h), so that
    // shards and a model tokenized with vocabularies of the same size but other tokens are told apart.
    uint64_t fingerprint() const {
        uint64_t h = 0xcbf29ce484222325ull;
        auto mix = [&](unsigned char byte) { h = (h ^ byte) * 0x100000001b3ull; };
        for (const std::string& token : tokens_) {
            for (unsigned char byte : token) mix(byte);
            mix('\n');
        }
        return h ? h : 1;
    }
    int pad_id() const { return special_ids_[PAD]; }
    int unk_id() const { return special_ids_[UNK]; }
    int cls_id() const { return special_ids_[CLS]; }
    int sep_id() const { return special_ids_[SEP]; }
    int mask_id() const { return special_ids_[MASK]; }
    // The text of token id ("[UNK]" for an id outside the vocabulary, as BertTokenizer; "" before a load).
    const std::string& token(int id) const {
        static const std::string none;
        if (tokens_.empty()) return none;
        return id >= 0 && id < vocab_size() ? tokens_[id] : tokens_[unk_id()];
    }
    // The id of a token's text, or -1.
    int token_id(std::string_view text) const { return find(words_, text); }

    // The token ids of text, without special tokens around it (BertTokenizer's
    // encode(text, add_special_tokens=False)). Empty before a vocabulary is loaded.
    std::vector<int> encode(std::string_view text) const {
        std::vector<int> ids;
        if (tokens_.empty()) return ids;
        std::string utf8;
        std::vector<uint32_t> offsets;
        for_each_word(text, [&](const char32_t* w, size_t n, int special) {
            if (special >= 0) ids.push_back(special_ids_[special]);
            else wordpiece(w, n, &utf8, &offsets, &ids);
        });
        return ids;
    }

    // The words WordPiece splits (steps 1-8 of the header comment, special tokens as their text):
    // BertTokenizer's tokenize() without its WordpieceTokenizer, for tests.
    std::vector<std::string> pre_tokenize(std::string_view text) const {
        std::vector<std::string> words;
        for_each_word(text, [&](const char32_t* w, size_t n, int special) {
            if (special >= 0) {
                words.emplace_back(SPECIAL_TEXT[special]);
                return;
            }
            words.emplace_back();
            for (size_t i = 0; i < n; i++) append_utf8(&words.back(), w[i]);
        });
        return words;
    }

    // [CLS] a [SEP], a truncated (from the end) so that the whole is at most max_len tokens
    // (0: no limit) — BertTokenizer's encode_plus(a, max_length=max_len, truncation=True).
    Encoding encode_single(std::string_view a, int max_len = 0) const { return with_special_tokens(encode(a), nullptr, max_len); }
    // [CLS] a [SEP] b [SEP], truncated "longest first" to at most max_len tokens (0: no limit).
    Encoding encode_pair(std::string_view a, std::string_view b, int max_len = 0) const {
        std::vector<int> ids_b = encode(b);
        return with_special_tokens(encode(a), &ids_b, max_len);
    }

    // Frames already encoded sequences (b: nullptr for a single one) as encode_single/encode_pair
    // do. Truncation as transformers' truncate_sequences (right side): a single sequence loses its
    // last tokens; a pair first loses tokens from the end of the longer one until both are as
    // long, then from both equally, b losing one more for an odd count. max_len must be 0 or at
    // least 3 (transformers leaves a single sequence untruncated, with an error message, for 2).
    Encoding with_special_tokens(std::vector<int> a, const std::vector<int>* b, int max_len) const {
        if (max_len != 0 && max_len < 3) {
            fprintf(stderr, "WordPiece: max_len %d must be 0 (no limit) or at least 3\n", max_len);
            exit(EXIT_FAILURE);
        }
        std::vector<int> bb = b ? *b : std::vector<int>{};
        size_t total = a.size() + bb.size() + (b ? 3 : 2);
        if (max_len > 0 && total > (size_t)max_len) {
            size_t remove = total - (size_t)max_len;
            if (!b) {
                a.resize(a.size() - remove);  // remove < a.size() since max_len >= 3
            } else {
                size_t la = a.size(), lb = bb.size();
                size_t first = std::min(la > lb ? la - lb : lb - la, remove), second = remove - first;
                size_t from_a = la > lb ? first + second / 2 : second / 2;
                size_t from_b = remove - from_a;
                a.resize(la - std::min(from_a, la));
                bb.resize(lb - std::min(from_b, lb));
            }
        }
        Encoding e;
        e.ids.push_back(cls_id());
        e.ids.insert(e.ids.end(), a.begin(), a.end());
        e.ids.push_back(sep_id());
        e.type_ids.assign(e.ids.size(), 0);
        if (b) {
            e.ids.insert(e.ids.end(), bb.begin(), bb.end());
            e.ids.push_back(sep_id());
            e.type_ids.resize(e.ids.size(), 1);
        }
        return e;
    }

    // The text of ids as BertTokenizer's decode(ids, skip_special_tokens) gives it: the tokens
    // joined by spaces with " ##" removed, trimmed, then transformers' clean_up_tokenization (no
    // space before . ? ! , and in n't 'm 's 've 're). Ids outside the vocabulary read as [UNK].
    std::string decode(const std::vector<int>& ids, bool skip_special_tokens = false) const {
        std::string s;
        if (tokens_.empty()) return s;
        bool first = true;
        for (int id : ids) {
            const std::string& t = token(id);
            if (skip_special_tokens && special_index(t) >= 0) continue;
            if (!first) s += ' ';
            s += t;
            first = false;
        }
        replace_all(&s, " ##", "");
        s = strip_python_space(s);
        static const char* const cleanup[][2] = {{" .", "."},   {" ?", "?"},     {" !", "!"},     {" ,", ","},
                                                 {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},   {" 's", "'s"},
                                                 {" 've", "'ve"}, {" 're", "'re"}};
        for (const auto& r : cleanup) replace_all(&s, r[0], r[1]);
        return s;
    }

    // Whether BertTokenizer's _is_chinese_char holds: the CJK Unified Ideographs blocks (and
    // extensions A-E), the CJK Compatibility Ideographs and their supplement.
    static bool is_cjk(uint32_t cp) {
        return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
               (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
               (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
    }

  private:
    enum Special { PAD, UNK, CLS, SEP, MASK, NUM_SPECIAL };
    static constexpr std::string_view SPECIAL_TEXT[NUM_SPECIAL] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    // What steps 3 and 6-8 do with an ASCII character (after lower-casing): BertTokenizer's
    // _is_control, _is_whitespace and _is_punctuation on ASCII (the "code points" fixture groups
    // check this against python too).
    enum Ascii : uint8_t { DROP, SPACE, PUNCT, OTHER };
    static constexpr std::array<Ascii, 128> ASCII_CLASS = [] {
        std::array<Ascii, 128> t{};
        for (unsigned c = 0; c < 128; c++)
            t[c] = c == '\t' || c == '\n' || c == '\r' || c == ' ' ? SPACE
                   : c < 32 || c == 127                               ? DROP
                   : (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)
                       ? PUNCT
                       : OTHER;
        return t;
    }();

    // A hash index text -> id over the tokens; the key of a token is its text without the first
    // skip bytes (2 for the "##" continuations). Open addressing, at most half full; a slot holds
    // an id and the high half of its key's hash.
    struct Slot {
        int32_t id;    // -1: empty
        uint32_t tag;  // high half of the hash of the key
    };
    struct Index {
        std::vector<Slot> slots;
        size_t skip;
        size_t max_chars;  // the most code points of any key: longer text cannot match
    };

    void clear() {
        tokens_.clear();
        words_ = Index{{}, 0, 0};
        continuations_ = Index{{}, 2, 0};
        std::fill(special_ids_, special_ids_ + NUM_SPECIAL, -1);
    }

    static uint64_t hash(std::string_view s) {  // FNV-1a, then a final mix for the low bits
        uint64_t h = 1469598103934665603ull;
        for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
        return h ^ (h >> 29);
    }

    std::string_view key(const Index& index, int id) const { return std::string_view(tokens_[id]).substr(index.skip); }

    // Adds token id to the index; returns id, or the id already there under the same key.
    int insert(Index* index, int id) {
        std::string_view k = key(*index, id);
        uint64_t h = hash(k);
        size_t mask = index->slots.size() - 1;
        for (size_t i = h & mask;; i = (i + 1) & mask) {
            Slot& s = index->slots[i];
            if (s.id < 0) {
                s = Slot{id, (uint32_t)(h >> 32)};
                size_t chars = 0;
                for (unsigned char c : k) chars += (c & 0xC0) != 0x80;
                index->max_chars = std::max(index->max_chars, chars);
                return id;
            }
            if (s.tag == (uint32_t)(h >> 32) && key(*index, s.id) == k) return s.id;
        }
    }

    // The id whose key is text, or -1.
    int find(const Index& index, std::string_view text) const {
        if (index.slots.empty()) return -1;
        uint64_t h = hash(text);
        size_t mask = index.slots.size() - 1;
        for (size_t i = h & mask;; i = (i + 1) & mask) {
            const Slot& s = index.slots[i];
            if (s.id < 0 || (s.tag == (uint32_t)(h >> 32) && key(index, s.id) == text)) return s.id;
        }
    }

    // Which special token text is, or -1.
    static int special_index(std::string_view text) {
        for (int k = 0; k < NUM_SPECIAL; k++)
            if (text == SPECIAL_TEXT[k]) return k;
        return -1;
    }
    static int special_index(std::u32string_view text) {
        for (int k = 0; k < NUM_SPECIAL; k++) {
            std::string_view t = SPECIAL_TEXT[k];
            if (text.size() == t.size() && std::equal(t.begin(), t.end(), text.begin())) return k;
        }
        return -1;
    }

    // Steps 1-8: calls emit(word, length, -1) for each word, or emit(nullptr, 0, k) for special token k.
    template <class Emit>
    void for_each_word(std::string_view text, Emit&& emit) const {
        std::u32string buf, tmp, word;
        size_t piece = 0;
        for (size_t pos = text.find('['); pos != std::string_view::npos; pos = text.find('[', pos)) {
            int k = NUM_SPECIAL;
            while (--k >= 0 && text.compare(pos, SPECIAL_TEXT[k].size(), SPECIAL_TEXT[k]) != 0) {}
            if (k < 0) {
                pos++;
                continue;
            }
            words_of_piece(text.substr(piece, pos - piece), &buf, &tmp, &word, emit);
            emit(nullptr, 0, k);
            pos += SPECIAL_TEXT[k].size();
            piece = pos;
        }
        words_of_piece(text.substr(piece), &buf, &tmp, &word, emit);
    }

    // Steps 2-8 on a piece of text without special tokens; buf, tmp, word are scratch.
    template <class Emit>
    void words_of_piece(std::string_view text, std::u32string* buf, std::u32string* tmp, std::u32string* word,
                        Emit&& emit) const {
        bool needs_nfc = clean(text, buf);
        if (needs_nfc) {
            nfd(buf->data(), buf->size(), tmp);
            compose(tmp);
            buf->swap(*tmp);
        }
        bool strip = options_.strip_accents.value_or(options_.do_lower_case);
        const char32_t* s = buf->data();
        size_t n = buf->size();
        for (size_t i = 0; i < n;) {
            while (i < n && is_space(s[i])) i++;
            size_t start = i;
            bool decomposable = false;
            while (i < n && !is_space(s[i])) decomposable |= s[i++] >= unicode::bert::NFD_STABLE_BELOW;
            if (i == start) break;
            std::u32string_view w(s + start, i - start);
            if (special_index(w) >= 0) {  // made by steps 2-5: stays whole and goes to WordPiece (step 7)
                emit(w.data(), w.size(), -1);
                continue;
            }
            if (strip && decomposable) {
                nfd(w.data(), w.size(), tmp);
                word->clear();
                for (char32_t c : *tmp)
                    if (!unicode::bert::is_nonspacing_mark(c)) word->push_back(c);
                w = *word;
            }
            split_on_punctuation(w, emit);
        }
    }

    // Step 8: emits the runs of w between punctuation characters, and each punctuation character.
    // (Python's whitespace split of the result is a no-op: nothing in steps 7-8 makes a space.)
    template <class Emit>
    static void split_on_punctuation(std::u32string_view w, Emit&& emit) {
        size_t start = 0;
        for (size_t i = 0; i < w.size(); i++) {
            char32_t c = w[i];
            if (c < 0x80 ? ASCII_CLASS[c] == PUNCT : unicode::bert::is_punctuation(c)) {
                if (i > start) emit(w.data() + start, i - start, -1);
                emit(w.data() + i, 1, -1);
                start = i + 1;
            }
        }
        if (w.size() > start) emit(w.data() + start, w.size() - start, -1);
    }

    // Steps 2-4 of text into *out (code points); returns whether NFC may change the result.
    bool clean(std::string_view text, std::u32string* out) const {
        out->clear();
        const unsigned char* s = (const unsigned char*)text.data();
        size_t n = text.size(), pos = 0;
        bool needs_nfc = false;
        while (pos < n) {
            unsigned char b = s[pos];
            if (b < 0x80) {  // the fast path: every ASCII character is NFC, none is CJK
                pos++;
                if (options_.do_lower_case && b >= 'A' && b <= 'Z') b += 'a' - 'A';
                if (ASCII_CLASS[b] == SPACE) out->push_back(' ');
                else if (ASCII_CLASS[b] != DROP) out->push_back(b);
                continue;
            }
            uint32_t cp[3] = {next_code_point(s, n, &pos)};
            int k = options_.do_lower_case ? unicode::bert::to_lower(cp[0], cp) : 1;
            for (int i = 0; i < k; i++) {
                uint32_t c = cp[i];
                if (c == 0 || c == 0xFFFD || unicode::bert::is_control(c)) continue;
                if (unicode::bert::is_whitespace(c)) {
                    out->push_back(' ');
                } else if (options_.tokenize_chinese_chars && is_cjk(c)) {
                    out->push_back(' ');
                    out->push_back(c);
                    out->push_back(' ');
                    needs_nfc = true;
                } else {
                    out->push_back(c);
                    needs_nfc |= c >= unicode::bert::NFC_STABLE_BELOW;
                }
            }
        }
        return needs_nfc;
    }

    // Step 9 on one word: appends its WordPiece ids to *ids. utf8 and offsets are scratch.
    void wordpiece(const char32_t* w, size_t n, std::string* utf8, std::vector<uint32_t>* offsets,
                   std::vector<int>* ids) const {
        if (n > (size_t)options_.max_input_chars_per_word) {
            ids->push_back(unk_id());
            return;
        }
        utf8->clear();
        offsets->clear();
        bool ascii = true;
        for (size_t i = 0; i < n; i++) ascii &= w[i] < 0x80;
        if (ascii) {  // code point k is byte k
            utf8->assign(w, w + n);
        } else {
            for (size_t i = 0; i < n; i++) {
                offsets->push_back((uint32_t)utf8->size());
                append_utf8(utf8, w[i]);
            }
            offsets->push_back((uint32_t)utf8->size());
        }
        auto at = [&](size_t k) { return ascii ? k : (size_t)(*offsets)[k]; };  // byte offset of code point k
        size_t first = ids->size();
        for (size_t start = 0; start < n;) {
            const Index& index = start == 0 ? words_ : continuations_;
            int id = -1;
            size_t end = std::min(n, start + index.max_chars);
            for (; end > start; end--) {
                id = find(index, std::string_view(*utf8).substr(at(start), at(end) - at(start)));
                if (id >= 0) break;
            }
            if (id < 0) {  // no token matches here: the whole word is [UNK]
                ids->resize(first);
                ids->push_back(unk_id());
                return;
            }
            ids->push_back(id);
            start = end;
        }
    }

    // Whether str.split() splits at c, after step 3 (which has made every ASCII space a ' ' and
    // dropped the rest of str.isspace()'s ASCII, \v \f \x1c-\x1f, as control characters).
    static bool is_space(char32_t c) { return c < 0x80 ? ASCII_CLASS[c] == SPACE : unicode::bert::is_python_space(c); }


    // ---- Unicode normalization (UAX #15) ----

    static constexpr uint32_t S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7;  // Hangul
    static constexpr uint32_t L_COUNT = 19, V_COUNT = 21, T_COUNT = 28, N_COUNT = V_COUNT * T_COUNT,
                              S_COUNT = L_COUNT * N_COUNT;

    // Appends the full canonical decomposition of cp.
    static void decompose(uint32_t cp, std::u32string* out) {
        if (cp - S_BASE < S_COUNT) {  // Hangul syllable: leading consonant, vowel, trailing consonant
            uint32_t s = cp - S_BASE;
            out->push_back(L_BASE + s / N_COUNT);
            out->push_back(V_BASE + s % N_COUNT / T_COUNT);
            if (s % T_COUNT) out->push_back(T_BASE + s % T_COUNT);
            return;
        }
        if (const unicode::bert::Decomposition* d = unicode::bert::decomposition(cp)) {
            decompose(d->first, out);
            if (d->second) decompose(d->second, out);
            return;
        }
        out->push_back(cp);
    }

    // NFD of s[0, n) into *out: full canonical decomposition, then the canonical order — each run
    // of non-starters stably sorted by combining class (a sort, not insertion: runs can be long).
    static void nfd(const char32_t* s, size_t n, std::u32string* out) {
        out->clear();
        for (size_t i = 0; i < n; i++) decompose(s[i], out);
        std::vector<std::pair<int, char32_t>> run;
        for (size_t i = 0; i < out->size();) {
            int ccc = unicode::bert::combining_class((*out)[i]);
            if (ccc == 0) {
                i++;
                continue;
            }
            size_t start = i;
            run.clear();
            for (; i < out->size() && (ccc = unicode::bert::combining_class((*out)[i])) != 0; i++)
                run.emplace_back(ccc, (*out)[i]);
            if (run.size() > 1) {
                std::stable_sort(run.begin(), run.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
                for (size_t k = 0; k < run.size(); k++) (*out)[start + k] = run[k].second;
            }
        }
    }

    // Canonical composition of an NFD string in place (NFC = this after nfd()): each character
    // joins the last starter before it if that pair has a primary composite and no character in
    // between blocks it (has class 0 or at least its class).
    static void compose(std::u32string* s) {
        size_t out = 0, starter = std::u32string::npos;
        int last_ccc = 0;
        for (size_t i = 0; i < s->size(); i++) {
            char32_t c = (*s)[i];
            int ccc = unicode::bert::combining_class(c);
            if (starter != std::u32string::npos && (out == starter + 1 || (last_ccc != 0 && last_ccc < ccc))) {
                char32_t p = composite((*s)[starter], c);
                if (p) {
                    (*s)[starter] = p;
                    continue;
                }
            }
            if (ccc == 0) starter = out;
            last_ccc = ccc;
            (*s)[out++] = c;
        }
        s->resize(out);
    }

    // The primary composite of a + b, or 0.
    static char32_t composite(char32_t a, char32_t b) {
        if (a - L_BASE < L_COUNT && b - V_BASE < V_COUNT) return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
        if (a - S_BASE < S_COUNT && (a - S_BASE) % T_COUNT == 0 && b - T_BASE - 1 < T_COUNT - 1) return a + (b - T_BASE);
        struct Pair {
            uint32_t first, second, composite;
        };
        static const std::vector<Pair> pairs = [] {  // the composites of unicode_bert.h, sorted by pair
            std::vector<Pair> v;
            for (const unicode::bert::Decomposition& d : unicode::bert::decompositions)
                if (d.composes) v.push_back({d.first, d.second, d.cp});
            std::sort(v.begin(), v.end(), [](const Pair& x, const Pair& y) {
                return x.first != y.first ? x.first < y.first : x.second < y.second;
            });
            return v;
        }();
        auto it = std::lower_bound(pairs.begin(), pairs.end(), std::make_pair((uint32_t)a, (uint32_t)b),
                                   [](const Pair& x, const std::pair<uint32_t, uint32_t>& y) {
                                       return x.first != y.first ? x.first < y.first : x.second < y.second;
                                   });
        return it != pairs.end() && it->first == a && it->second == b ? it->composite : 0;
    }

    // ---- UTF-8 ----

    // The code point at s[*pos] (pos < n), advancing *pos past it: strict UTF-8 as python decodes
    // it (no overlong forms, surrogates or values past U+10FFFF); an ill-formed byte reads as U+FFFD
    // and advances one byte (python's "replace" makes one U+FFFD of a maximal ill-formed
    // subsequence instead: step 3 drops them all, so the count does not matter).
    static uint32_t next_code_point(const unsigned char* s, size_t n, size_t* pos) {
        size_t p = *pos, left = n - p;
        unsigned char b = s[p];
        auto cont = [&](size_t k) { return k < left && (s[p + k] & 0xC0) == 0x80; };
        uint32_t cp = 0xFFFD;
        size_t len = 1;
        if (b < 0x80) {
            cp = b;
        } else if (b >= 0xC2 && b <= 0xDF && cont(1)) {
            cp = ((b & 0x1Fu) << 6) | (s[p + 1] & 0x3Fu);
            len = 2;
        } else if (b >= 0xE0 && b <= 0xEF && cont(1) && cont(2)) {
            uint32_t c = ((b & 0x0Fu) << 12) | ((s[p + 1] & 0x3Fu) << 6) | (s[p + 2] & 0x3Fu);
            if (c >= 0x800 && (c < 0xD800 || c > 0xDFFF)) cp = c, len = 3;
        } else if (b >= 0xF0 && b <= 0xF4 && cont(1) && cont(2) && cont(3)) {
            uint32_t c = ((b & 0x07u) << 18) | ((s[p + 1] & 0x3Fu) << 12) | ((s[p + 2] & 0x3Fu) << 6) | (s[p + 3] & 0x3Fu);
            if (c >= 0x10000 && c <= 0x10FFFF) cp = c, len = 4;
        }
        *pos = p + len;
        return cp;
    }

    // The offset of the first ill-formed UTF-8 byte of s, or npos.
    static size_t invalid_utf8_at(std::string_view s) {
        const unsigned char* u = (const unsigned char*)s.data();
        for (size_t pos = 0; pos < s.size();) {
            size_t at = pos;
            if (next_code_point(u, s.size(), &pos) == 0xFFFD && !(pos - at == 3 && memcmp(u + at, "\xEF\xBF\xBD", 3) == 0))
                return at;
        }
        return std::string_view::npos;
    }

    static void append_utf8(std::string* s, uint32_t cp) {
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

    // Python's str.replace(from, to) in place: left to right, without overlaps.
    static void replace_all(std::string* s, std::string_view from, std::string_view to) {
        std::string out;
        size_t pos = 0;
        for (size_t hit; (hit = s->find(from, pos)) != std::string::npos; pos = hit + from.size()) {
            out.append(*s, pos, hit - pos);
            out += to;
        }
        if (pos == 0) return;
        out.append(*s, pos, std::string::npos);
        s->swap(out);
    }

    // Python's str.strip(): s without the str.isspace() characters at either end (s is UTF-8).
    static std::string strip_python_space(const std::string& s) {
        const unsigned char* u = (const unsigned char*)s.data();
        size_t begin = 0, end = s.size();
        while (begin < end) {
            size_t next = begin;
            if (!is_space(next_code_point(u, end, &next))) break;
            begin = next;
        }
        while (end > begin) {
            size_t start = end - 1;
            while (start > begin && (u[start] & 0xC0) == 0x80) start--;
            size_t next = start;
            if (!is_space(next_code_point(u, end, &next))) break;
            end = start;
        }
        return s.substr(begin, end - begin);
    }

    // load_from_memory() but for the clean-up on failure.
    bool parse(const void* data, size_t size, std::string* error) {
        const char* p = (const char*)data;
        if (size == 0) return fail(error, "empty vocabulary file");
        if (size >= 3 && memcmp(p, "\xEF\xBB\xBF", 3) == 0)
            return fail(error, "starts with a UTF-8 byte order mark (BertTokenizer would read it as part of the first token)");
        for (size_t pos = 0, line = 1; pos < size; line++) {
            size_t end = pos;
            while (end < size && p[end] != '\n' && p[end] != '\r') end++;
            std::string_view token(p + pos, end - pos);
            if (token.empty()) return fail(error, "line " + std::to_string(line) + " is empty");
            size_t bad = invalid_utf8_at(token);
            if (bad != std::string_view::npos)
                return fail(error, "line " + std::to_string(line) + ": invalid UTF-8 at byte " + std::to_string(bad + 1));
            tokens_.emplace_back(token);
            pos = end + (end + 1 < size && p[end] == '\r' && p[end + 1] == '\n' ? 2 : 1);
        }
        size_t cap = 16;
        while (cap < 2 * tokens_.size()) cap *= 2;
        words_.slots.assign(cap, Slot{-1, 0});
        continuations_.slots.assign(cap, Slot{-1, 0});
        for (int id = 0; id < (int)tokens_.size(); id++) {
            int first = insert(&words_, id);
            if (first != id)
                return fail(error, "line " + std::to_string(id + 1) + ": token '" + tokens_[id] + "' repeats line " +
                                       std::to_string(first + 1));
            if (tokens_[id].compare(0, 2, "##") == 0) insert(&continuations_, id);
        }
        for (int k = 0; k < NUM_SPECIAL; k++) {
            special_ids_[k] = token_id(SPECIAL_TEXT[k]);
            if (special_ids_[k] < 0) return fail(error, "the vocabulary has no " + std::string(SPECIAL_TEXT[k]) + " token");
        }
        return true;
    }

    static bool fail(std::string* error, const std::string& why) {
        *error = why;
        return false;
    }

    Options options_;
    std::vector<std::string> tokens_;  // by id
    Index words_{{}, 0, 0};            // every token by its text: the first piece of a word
    Index continuations_{{}, 2, 0};    // the "##" tokens by their text after "##": the later pieces
    int special_ids_[NUM_SPECIAL] = {-1, -1, -1, -1, -1};
};
