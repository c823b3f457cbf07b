// test/fuzz/fuzz_train_state.cpp — libFuzzer target for the training-state parser in
// llmc/checkpoint.h (build and run: test/fuzz/README.md). Each input is a whole state file:
// parse_train_state() must refuse it with a reason, or accept it with master weights and optimizer
// state that account for every byte of the file and header fields inside their documented ranges.
#include "../../llmc/checkpoint.h"

#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    TrainState s;
    std::string err;
    if (!parse_train_state(data, size, &s, &err)) {
        if (err.empty()) abort();
        return 0;
    }
    size_t n = s.num_params;
    if (s.master.size() != (s.has_master ? n : 0)) abort();
    if (size != 1024 + 4 * s.master.size() + s.optimizer_state.size()) abort();
    if (s.world < 1 || s.rank < 0 || s.rank >= s.world || s.B < 1 || s.T < 1 || s.step < 0 || s.tokens_per_step < 1)
        abort();
    size_t mb = 4 * s.master.size();
    if ((mb && memcmp(s.master.data(), data + 1024, mb) != 0) ||
        (!s.optimizer_state.empty() && memcmp(s.optimizer_state.data(), data + 1024 + mb, s.optimizer_state.size()) != 0))
        abort();
    return 0;
}
