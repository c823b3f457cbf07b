// test/fuzz/fuzz_tokenizer.cpp — libFuzzer target for llmc/tokenizer.h (build and run: test/fuzz/README.md).
// Each input is used twice:
//   1. as a tokenizer file: load_from_memory() must accept it or refuse it with a reason, never
//      crash or read out of bounds; a file that loads must serialize and load back to the same
//      tokens, decode any id, and (if it can encode) round-trip a little text through encode();
//   2. as text, through a small fixed byte-level tokenizer: decode(encode(x)) == x for any bytes,
//      streaming encode == whole encode, and the heap merge == tiktoken's scan merge.
// A broken property calls abort(), which libFuzzer reports with the input that did it.
#include "../../llmc/tokenizer.h"

#include <cstdlib>

// A byte-level tokenizer file: the 256 bytes, some merges (English, spaces, UTF-8), end-of-text last.
static std::string mini_tokenizer_file() {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; b++) tokens.push_back(std::string(1, (char)b));
    for (const char* t : {"th", "he", "the", " t", " the", "in", "ing", " a", "an", "er", "'s", "  ", "    ", "\n\n", "aa",
                          "aaaa", "ab", "abab", "\xc3\xa9", "\xe4\xb8", "\xe4\xb8\xad", "12", "123", "!!", " !", "\r\n"})
        tokens.push_back(t);
    tokens.push_back("<|endoftext|>");
    int32_t h[256] = {TOKENIZER_MAGIC, 2, (int32_t)tokens.size(), (int32_t)tokens.size() - 1};
    std::string file((const char*)h, sizeof(h));
    for (const std::string& t : tokens) file += (char)t.size() + t;
    return file;
}

static const Tokenizer& mini() {
    static const Tokenizer tok = [] {
        Tokenizer t;
        std::string file = mini_tokenizer_file(), error;
        if (!t.load_from_memory(file.data(), file.size(), &error) || !t.can_encode()) abort();
        return t;
    }();
    return tok;
}

// The encoding properties every byte-level tokenizer must have on text.
static void check_encoding(const Tokenizer& tok, std::string_view text, size_t chunk) {
    std::vector<int> ids = tok.encode(text);
    if (tok.decode(ids) != text) abort();
    // Streaming re-scans an unfinished pre-token on every call (quadratic in tiny chunks): 256 B.
    std::string_view head = text.substr(0, 256);
    std::vector<int> streamed, whole = head.size() == text.size() ? ids : tok.encode(head);
    std::string buf;
    for (size_t fed = 0; fed < head.size(); fed += chunk) {
        buf.append(head.substr(fed, chunk));
        buf.erase(0, tok.encode_some(buf, false, &streamed));
    }
    tok.encode_some(buf, true, &streamed);
    if (streamed != whole) abort();
    std::string_view piece = text.substr(0, 256);  // the scan merge is quadratic
    std::vector<int> scan, heap;
    tok.bpe_scan(piece, &scan);
    tok.bpe_heap(piece, &heap);
    if (scan != heap || tok.decode(heap) != piece) abort();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    Tokenizer tok;
    std::string error;
    if (tok.load_from_memory(data, size, &error)) {
        // Written back, the tokens are the bytes that were parsed, and they load again the same.
        std::string file;
        Tokenizer back;
        if (!tok.serialize(tok.version(), &file, &error) || file.size() > size ||
            memcmp(file.data() + 1024, data + 1024, file.size() - 1024) != 0)
            abort();
        if (!back.load_from_memory(file.data(), file.size(), &error) || back.vocab_size() != tok.vocab_size() ||
            back.eot() != tok.eot() || back.version() != tok.version())
            abort();
        for (int i = 0; i < tok.vocab_size(); i++)
            if (back.decode(i) != tok.decode(i)) abort();
        if (!tok.decode(-1).empty() || !tok.decode(tok.vocab_size()).empty()) abort();
        if (tok.can_encode()) {
            check_encoding(tok, "Hello world, it's 2024!\n\n  \xe4\xb8\xad\xe6\x96\x87 caf\xc3\xa9 \xff", 3);
            check_encoding(tok, std::string_view((const char*)data + 1024, std::min<size_t>(size - 1024, 256)), 7);
        } else if (!tok.encode("text").empty()) {
            abort();
        }
    } else if (error.empty()) {
        abort();
    }
    check_encoding(mini(), std::string_view((const char*)data, size), 1 + (size ? data[0] % 16 : 0));
    return 0;
}
