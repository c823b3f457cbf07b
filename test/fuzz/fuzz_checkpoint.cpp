// test/fuzz/fuzz_checkpoint.cpp — libFuzzer target for the llm.c GPT-2 model-checkpoint parser in
// llmc/gpt2_io.h (build and run: test/fuzz/README.md; this target needs the CPU backend, see the
// Makefile's fuzz-checkpoint rule). Each input is a whole checkpoint file: parse_gpt2_checkpoint()
// must refuse it with a reason, or accept a plausible shape whose parameters fill the file exactly.
#include "../../llmc/gpt2_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    GPT2Config c;
    std::vector<float> params;
    std::string err;
    if (!parse_gpt2_checkpoint(data, size, &c, &params, &err)) {
        if (err.empty()) abort();
        return 0;
    }
    size_t sizes[NUM_PARAMETER_TENSORS];
    size_t n = param_sizes(c, sizes);
    int32_t version;
    memcpy(&version, data + 4, 4);
    if (params.size() != n || size != 1024 + n * (version == 3 ? 4 : 2)) abort();
    if (c.channels % c.num_heads != 0 || c.padded_vocab_size < c.vocab_size) abort();
    return 0;
}
