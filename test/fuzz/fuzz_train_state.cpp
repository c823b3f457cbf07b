// test/fuzz/fuzz_train_state.cpp — libFuzzer target for the training-state parser in
// llmc/checkpoint.h (build and run: test/fuzz/README.md). Each input is a whole state file:
// parse_train_state() must refuse it with a reason, or accept it with arrays that account for every
// byte of the file and header fields inside their documented ranges.
#include "../../llmc/checkpoint.h"

#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    TrainState s;
    std::string err;
    if (!parse_train_state(data, size, &s, &err)) {
        if (err.empty()) abort();
        return 0;
    }
    size_t n = s.m.size();
    if (s.v.size() != n || s.master.size() != (s.has_master ? n : 0)) abort();
    if (size != 1024 + 4 * n * (2 + (s.has_master ? 1 : 0))) abort();
    if (s.world < 1 || s.rank < 0 || s.rank >= s.world || s.B < 1 || s.T < 1 || s.step < 0 || s.tokens_per_step < 1)
        abort();
    if (n > 0 && (memcmp(s.m.data(), data + 1024, 4 * n) != 0 || memcmp(s.v.data(), data + 1024 + 4 * n, 4 * n) != 0))
        abort();
    return 0;
}
