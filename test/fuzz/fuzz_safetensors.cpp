// test/fuzz/fuzz_safetensors.cpp — libFuzzer target for the safetensors parser (llmc/safetensors.h)
// and the JSON reader under it (llmc/json.h), in memory: any input must either be refused with an
// error message or parse into tensors that satisfy the format's invariants; the sanitizers catch
// any out-of-bounds read, overflow or undefined behaviour on the way.
//
//   clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined test/fuzz/fuzz_safetensors.cpp -o /tmp/fuzz_st
//   /tmp/fuzz_st -max_len=8192 -max_total_time=180 CORPUS test/fixtures/hf_gpt2_tiny
//
// Seeds: the fixture files written by transformers (test/fixtures/hf_gpt2_tiny/model.safetensors,
// test/fixtures/hf_gpt2_tiny_logits.safetensors) and any small file from safetensors' save_file.
#include "../../llmc/safetensors.h"

#include <cstdlib>

// Stops the run (libFuzzer saves the input) when an invariant does not hold.
static void check(bool ok, const char* what) {
    if (!ok) {
        fprintf(stderr, "invariant violated: %s\n", what);
        abort();
    }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    SafeTensors st;
    std::string err;
    if (!st.parse(data, size, &err)) {
        check(!err.empty(), "a refused input has an error message");
        return 0;
    }
    // Parsed: the tensors tile the data exactly, each inside the input, sized by shape x dtype.
    uint64_t header_len;
    memcpy(&header_len, data, 8);
    const uint8_t* data_start = data + 8 + header_len;
    size_t covered = 0;
    for (const SafeTensor& t : st.tensors()) {
        check(t.begin == covered && t.end >= t.begin, "tensors are contiguous in data order");
        check(t.data == data_start + t.begin && t.end <= size - 8 - header_len, "tensor data lies inside the input");
        check(t.numel * t.elem_size == t.end - t.begin, "bytes = numel x dtype size");
        check(st.find(t.name) == &t, "find() returns the (unique) tensor of that name");
        covered = t.end;
        std::vector<float> values;
        std::string why;
        bool is_float = t.dtype == "F32" || t.dtype == "F16" || t.dtype == "BF16";
        check(SafeTensors::to_float(t, &values, &why) == is_float, "to_float reads exactly the float dtypes");
        check(is_float || !why.empty(), "a refused dtype has an error message");
        if (is_float) check(values.size() == t.numel, "to_float gives numel values");
    }
    check(covered == size - 8 - header_len, "the tensors cover the data");

    // Writing the F32 tensors again and parsing that must give back the same bytes.
    SafeTensorsWriter w;
    std::vector<const SafeTensor*> f32;
    for (const SafeTensor& t : st.tensors()) {
        if (t.dtype != "F32") continue;
        std::vector<float> values(t.numel);
        std::string why;
        SafeTensors::to_float(t, values.data(), &why);
        w.add(t.name, values.data(), t.shape);
        f32.push_back(&t);
    }
    std::vector<uint8_t> again = w.serialize();
    SafeTensors back;
    check(back.parse(again.data(), again.size(), &err), "the writer's output parses");
    for (const SafeTensor* t : f32) {
        const SafeTensor* u = back.find(t->name);
        check(u && u->shape == t->shape && u->dtype == "F32", "a rewritten tensor keeps its name, shape and dtype");
        check(t->numel == 0 || memcmp(u->data, t->data, t->numel * 4) == 0, "a rewritten F32 tensor keeps its bytes");
    }
    return 0;
}
