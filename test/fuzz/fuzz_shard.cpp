// test/fuzz/fuzz_shard.cpp — libFuzzer target for the token-shard header check in llmc/dataloader.h
// (build and run: test/fuzz/README.md). Each input is a whole shard file: parse_shard_header() must
// refuse it with a reason or accept it only when its size is exactly what the header promises.
#include "../../llmc/dataloader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    size_t ntok = 0;
    std::string err;
    if (!parse_shard_header(data, size, &ntok, &err)) {
        if (err.empty()) abort();
        return 0;
    }
    int32_t h[3];
    memcpy(h, data, sizeof(h));
    if (h[0] != SHARD_MAGIC || h[1] != SHARD_VERSION || ntok != (size_t)h[2] || size != 1024 + 2 * ntok) abort();
    return 0;
}
