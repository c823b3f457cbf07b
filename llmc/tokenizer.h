// llmc/tokenizer.h — GPT-2 token decoding from llm.c's tokenizer file: token id -> its bytes.
//
// File format (llm.c, magic 20240328): a 256 x int32 header — [0] magic, [1] version (1: end-of-text
// is 50256; 2: [3] holds it), [2] vocabulary size — then, for every token id in order, one uint8
// length (> 0) followed by that many bytes.
#pragma once
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

constexpr int TOKENIZER_MAGIC = 20240328;

class Tokenizer {
  public:
    // Loads path; on failure returns false and leaves a one-line reason in *error.
    bool load(const std::string& path, std::string* error) {
        FILE* f = fopen(path.c_str(), "rb");
        if (!f) return fail(error, path + ": " + strerror(errno));
        int32_t h[256];
        bool ok = fread(h, sizeof(int32_t), 256, f) == 256;
        if (!ok) return fail(error, path + ": too short for a tokenizer header", f);
        if (h[0] != TOKENIZER_MAGIC)
            return fail(error, path + ": bad magic " + std::to_string(h[0]) + " (a llm.c tokenizer starts with " +
                                   std::to_string(TOKENIZER_MAGIC) + ")", f);
        if (h[1] != 1 && h[1] != 2)
            return fail(error, path + ": unsupported tokenizer version " + std::to_string(h[1]), f);
        if (h[2] <= 0 || h[2] > (1 << 24))
            return fail(error, path + ": implausible vocabulary size " + std::to_string(h[2]), f);
        eot_ = h[1] == 1 ? 50256 : h[3];
        tokens_.resize(h[2]);
        for (int i = 0; i < h[2]; i++) {
            unsigned char len;
            if (fread(&len, 1, 1, f) != 1 || len == 0)
                return fail(error, path + ": token " + std::to_string(i) + " is missing or empty", f);
            tokens_[i].resize(len);
            if (fread(&tokens_[i][0], 1, len, f) != len)
                return fail(error, path + ": truncated at token " + std::to_string(i), f);
        }
        fclose(f);
        return true;
    }

    // The bytes of token id (empty for an id outside the vocabulary).
    const std::string& decode(int id) const {
        static const std::string empty;
        return id >= 0 && id < (int)tokens_.size() ? tokens_[id] : empty;
    }
    int eot() const { return eot_; }
    int vocab_size() const { return (int)tokens_.size(); }

  private:
    static bool fail(std::string* error, const std::string& why, FILE* f = nullptr) {
        if (f) fclose(f);
        *error = why;
        return false;
    }
    std::vector<std::string> tokens_;
    int eot_ = 50256;
};
