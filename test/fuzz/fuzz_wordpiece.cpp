// test/fuzz/fuzz_wordpiece.cpp — libFuzzer target for BERT's WordPiece tokenizer (llmc/wordpiece.h):
// `make fuzz-wordpiece` (test/fuzz/README.md). Each input is used twice:
//   1. as a vocab.txt: load_from_memory() must accept it or refuse it with a reason, never crash or
//      read out of bounds. An accepted one has one token per line, each non-empty and found again
//      under its own id, the five special tokens where their ids say, and loads the same when
//      written back with "\n" line ends; the input as text through it checks 2.'s properties.
//   2. as text (after a first byte choosing the options: lower case, strip accents, CJK split)
//      through a small fixed vocabulary. The words before WordPiece (pre_tokenize) hold no
//      whitespace, control character, NUL or U+FFFD; a punctuation character is a word of its own;
//      lower-cased words are lower case and accent-stripped ones hold no Mn (special tokens
//      aside). encode() is, word by word, a plain re-implementation of BertTokenizer's greedy
//      WordpieceTokenizer on those words — so every id is in the vocabulary and [UNK] stands
//      exactly for the words over 100 code points or where no piece matches. decode() and the
//      [CLS]/[SEP] framing run too: at most max_len tokens, token type ids 0...0 1...1.
// A broken property calls abort(), which libFuzzer reports with the input that did it.
//
// Seeds (test/fuzz/seeds_wordpiece/): vocab300.txt, the first 300 lines of dev/data/bert/vocab.txt
// (all five special tokens are among them), made with `head -300 dev/data/bert/vocab.txt`; and
// text.txt, a line of mixed scripts, marks and special tokens.
#include "../../llmc/wordpiece.h"

#include <cstdlib>
#include <unordered_map>

// Text beyond this many bytes adds no new paths (a word of > 100 code points fits) but time.
constexpr size_t MAX_TEXT = 320;

// Stops the run (libFuzzer saves the input) when an invariant does not hold.
static void check(bool ok, const char* what) {
    if (!ok) {
        fprintf(stderr, "invariant violated: %s\n", what);
        abort();
    }
}

// Specials, ASCII, a few words and pieces, and some non-ASCII for the normalization paths.
static std::string mini_vocab() {
    std::string v = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
    for (int c = 33; c < 127; c++) v += std::string(1, (char)c) + "\n";
    for (char c = 'a'; c <= 'z'; c++) v += std::string("##") + c + "\n";
    for (const char* t : {"hello", "world", "un", "##aff", "##able", "ab", "abc", "##bc", "##ing", "the", "é", "##é",
                          "ß", "σ", "ς", "中", "文", "ᄀ", "##ᅡ", "##ᆨ", "각", "ω", "##̇", "😀", "[unused0]"})
        v += std::string(t) + "\n";
    return v;
}

static const WordPiece& mini(uint8_t options_byte) {
    static WordPiece tokenizers[8];
    static bool loaded = false;
    if (!loaded) {
        std::string v = mini_vocab(), error;
        for (int k = 0; k < 8; k++) {
            WordPiece::Options o;
            o.do_lower_case = k & 1;
            if (k & 2) o.strip_accents = (k & 4) == 0;  // given: true or false; else unset
            o.tokenize_chinese_chars = (k & 4) != 0;
            tokenizers[k].set_options(o);
            if (!tokenizers[k].load_from_memory(v.data(), v.size(), &error)) fprintf(stderr, "%s\n", error.c_str());
            check(tokenizers[k].vocab_size() > 0, "the fixed vocabulary loads");
        }
        loaded = true;
    }
    return tokenizers[options_byte & 7];
}

// Decodes UTF-8 that llmc/wordpiece.h produced (valid by construction).
static std::u32string code_points(const std::string& s) {
    std::u32string out;
    for (size_t i = 0; i < s.size();) {
        unsigned char b = s[i];
        int n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
        uint32_t cp = n == 1 ? b : n == 2 ? b & 0x1F : n == 3 ? b & 0x0F : b & 0x07;
        for (int k = 1; k < n && i + k < s.size(); k++) cp = (cp << 6) | (s[i + k] & 0x3F);
        out.push_back(cp);
        i += n;
    }
    return out;
}

static bool is_special(const std::string& w) {
    return w == "[PAD]" || w == "[UNK]" || w == "[CLS]" || w == "[SEP]" || w == "[MASK]";
}

// BertTokenizer's WordpieceTokenizer.tokenize() on one word, as python writes it.
static void reference_wordpiece(const WordPiece& wp, const std::unordered_map<std::string, int>& vocab,
                                const std::string& word, std::vector<int>* ids) {
    std::u32string chars = code_points(word);
    if (chars.size() > 100) {
        ids->push_back(wp.unk_id());
        return;
    }
    std::vector<size_t> offset;  // byte offset of each code point
    for (size_t i = 0, b = 0; i <= chars.size(); i++) {
        offset.push_back(b);
        if (i < chars.size()) b += chars[i] < 0x80 ? 1 : chars[i] < 0x800 ? 2 : chars[i] < 0x10000 ? 3 : 4;
    }
    std::vector<int> pieces;
    for (size_t start = 0; start < chars.size();) {
        size_t end = chars.size();
        int id = -1;
        for (; end > start; end--) {
            std::string sub = word.substr(offset[start], offset[end] - offset[start]);
            auto it = vocab.find(start > 0 ? "##" + sub : sub);
            if (it != vocab.end()) {
                id = it->second;
                break;
            }
        }
        if (id < 0) {
            ids->push_back(wp.unk_id());
            return;
        }
        pieces.push_back(id);
        start = end;
    }
    ids->insert(ids->end(), pieces.begin(), pieces.end());
}

// Every property of part 2 of the header comment, for text through wp.
static void check_text(const WordPiece& wp, std::string_view text, int max_len) {
    std::unordered_map<std::string, int> vocab;
    for (int id = 0; id < wp.vocab_size(); id++) vocab.emplace(wp.token(id), id);
    const WordPiece::Options& o = wp.options();
    bool strip = o.strip_accents.value_or(o.do_lower_case);
    std::vector<std::string> words = wp.pre_tokenize(text);
    std::vector<int> want;
    for (const std::string& w : words) {
        check(!w.empty(), "no empty word");
        if (is_special(w)) {
            want.push_back(vocab.at(w));
            continue;
        }
        std::u32string cps = code_points(w);
        for (char32_t c : cps) {
            check(c != 0 && c != 0xFFFD && !unicode::bert::is_control(c) && !unicode::bert::is_python_space(c) &&
                      !unicode::bert::is_whitespace(c),
                  "no space, control, NUL or U+FFFD in a word");
            check(!unicode::bert::is_punctuation(c) || cps.size() == 1, "punctuation is a word of its own");
            check(!strip || !unicode::bert::is_nonspacing_mark(c), "no Mn after strip_accents");
            uint32_t low[3];
            check(!o.do_lower_case || (unicode::bert::to_lower(c, low) == 1 && low[0] == c), "lower case after lower-casing");
        }
        reference_wordpiece(wp, vocab, w, &want);
    }
    std::vector<int> ids = wp.encode(text);
    check(ids == want, "encode() == the words through python's greedy WordPiece");
    for (int id : ids) check(id >= 0 && id < wp.vocab_size(), "ids are in the vocabulary");
    wp.decode(ids, true);
    std::string decoded = wp.decode(ids);
    check(ids.empty() || !decoded.empty(), "tokens decode to something");

    std::vector<int> b_ids = wp.encode(text.substr(text.size() / 2));
    WordPiece::Encoding single = wp.with_special_tokens(ids, nullptr, max_len);
    WordPiece::Encoding pair = wp.with_special_tokens(ids, &b_ids, max_len);
    for (const WordPiece::Encoding* e : {&single, &pair}) {
        check(e->ids.size() == e->type_ids.size() && e->ids.front() == wp.cls_id() && e->ids.back() == wp.sep_id(),
              "[CLS] ... [SEP], a type id per id");
        check(max_len == 0 || e->ids.size() <= (size_t)max_len, "at most max_len tokens");
        check(std::is_sorted(e->type_ids.begin(), e->type_ids.end()) && e->type_ids.back() == (e == &pair),
              "token type ids 0...0 (1...1)");
    }
    size_t total = ids.size() + b_ids.size() + 3;
    check(max_len > 0 ? pair.ids.size() == std::min(total, (size_t)max_len) : pair.ids.size() == total,
          "truncation removes just enough");
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string_view input((const char*)data, size);
    int max_len = size ? (data[0] >> 3) % 24 : 0;
    max_len = max_len < 3 ? 0 : max_len;

    // 1. The input as a vocabulary.
    WordPiece wp;
    std::string error;
    if (wp.load_from_memory(data, size, &error)) {
        size_t lines = 0;
        for (size_t i = 0; i < size; i++)
            lines += data[i] == '\n' || (data[i] == '\r' && !(i + 1 < size && data[i + 1] == '\n'));
        lines += data[size - 1] != '\n' && data[size - 1] != '\r';
        check((size_t)wp.vocab_size() == lines, "one token per line");
        std::string rewritten;
        for (int id = 0; id < wp.vocab_size(); id++) {
            check(!wp.token(id).empty() && wp.token_id(wp.token(id)) == id, "tokens are unique and found under their id");
            rewritten += wp.token(id) + "\n";
        }
        check(wp.token(wp.pad_id()) == "[PAD]" && wp.token(wp.unk_id()) == "[UNK]" && wp.token(wp.cls_id()) == "[CLS]" &&
                  wp.token(wp.sep_id()) == "[SEP]" && wp.token(wp.mask_id()) == "[MASK]",
              "the special ids name the special tokens");
        WordPiece back;
        check(back.load_from_memory(rewritten.data(), rewritten.size(), &error) && back.vocab_size() == wp.vocab_size(),
              "written back with \\n line ends, it loads again");
        for (int id = 0; id < wp.vocab_size(); id++) check(back.token(id) == wp.token(id), "... to the same tokens");
        check_text(wp, input.substr(0, MAX_TEXT), max_len);
    } else {
        check(!error.empty() && wp.vocab_size() == 0 && wp.encode("a").empty(), "a refused vocabulary has a reason, no tokens");
    }

    // 2. The input as text through the fixed vocabulary.
    check_text(mini(size ? data[0] : 0), input.substr(size ? 1 : 0, MAX_TEXT), max_len);
    return 0;
}
