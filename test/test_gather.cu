// test/test_gather.cu — gather_rows and scatter_rows (llmc/gather.cuh) against a CPU reference, for
// fp32, bf16 and fp16, under forward/reverse/random thread orders, at BERT-like shapes scaled down,
// channel counts off the 128-bit pack, misaligned views (the scalar path), no rows and every row;
// and gather_slot_map's refusals. Both kernels copy values without arithmetic, so every result must
// equal the reference bit for bit.
#include "../llmc/gather.cuh"
#include "harness.h"

#include <algorithm>
#include <string>
#include <vector>

// M distinct rows of [0, N) in a scrambled order (a multiplicative permutation of [0, N) cut to M),
// so the gathered order is not the rows' order.
std::vector<int> pick_rows(int M, int N, uint64_t seed) {
    std::vector<int> all(N);
    for (int i = 0; i < N; i++) all[i] = i;
    std::vector<float> key(N);
    th::fill_uniform(key.data(), N, seed, 0.f, 1.f);
    std::sort(all.begin(), all.end(), [&](int a, int b) { return key[a] < key[b] || (key[a] == key[b] && a < b); });
    all.resize(M);
    return all;
}

// Gather of M rows out of N, then scatter back, at C channels, through views `offset` elements into
// their allocations (offset 1 defeats 128-bit access).
template <class T>
void test_gather(int N, int M, int C, size_t offset, uint64_t seed) {
    // The compact tensors get one spare row when M = 0, so that no buffer or result is empty (the
    // kernels are given M; only the first M rows are compared).
    size_t Mb = (size_t)std::max(M, 1);
    std::vector<T> inp = th::random_tensor<T>((size_t)N * C, seed);
    std::vector<T> dout = th::random_tensor<T>(Mb * C, seed + 1);
    std::vector<int> rows = pick_rows(M, N, seed + 2), slot;
    gather_slot_map(rows.data(), M, N, &slot);
    rows.resize(Mb, 0);
    th::DeviceBuffer<int> d_rows(rows), d_slot(slot);
    char name[160];
    const char* tname = th::dtype_name<T>();

    snprintf(name, sizeof(name), "gather_rows %s N=%d M=%d C=%d offset=%zu: thread orders", tname, N, M, C, offset);
    auto out = th::run_orders(name, [&] {
        th::DeviceView<T> d_inp(inp, offset), d_out(std::vector<T>(Mb * C, from_float<T>(NAN)), offset);
        gather_rows(d_out.ptr, (const T*)d_inp.ptr, d_rows.ptr, M, C, 0);
        return d_out.host();
    });
    std::vector<T> ref((size_t)M * C);
    for (int i = 0; i < M; i++)
        std::copy(inp.begin() + (size_t)rows[i] * C, inp.begin() + (size_t)(rows[i] + 1) * C, ref.begin() + (size_t)i * C);
    snprintf(name, sizeof(name), "gather_rows %s N=%d M=%d C=%d offset=%zu: the listed rows, bit-exact", tname, N, M, C,
             offset);
    th::check_bitwise(name, ref.data(), out.data(), ref.size() * sizeof(T));

    // The destination starts as NaN: every element must be written (zeros for rows not gathered).
    snprintf(name, sizeof(name), "scatter_rows %s N=%d M=%d C=%d offset=%zu: thread orders", tname, N, M, C, offset);
    auto dinp = th::run_orders(name, [&] {
        th::DeviceView<T> d_dout(dout, offset), d_dinp(std::vector<T>((size_t)N * C, from_float<T>(NAN)), offset);
        scatter_rows(d_dinp.ptr, (const T*)d_dout.ptr, d_slot.ptr, N, C, 0);
        return d_dinp.host();
    });
    std::vector<T> ref_d((size_t)N * C, from_float<T>(0.f));
    for (int i = 0; i < M; i++)
        std::copy(dout.begin() + (size_t)i * C, dout.begin() + (size_t)(i + 1) * C, ref_d.begin() + (size_t)rows[i] * C);
    snprintf(name, sizeof(name), "scatter_rows %s N=%d M=%d C=%d offset=%zu: listed rows, zeros elsewhere, bit-exact",
             tname, N, M, C, offset);
    th::check_bitwise(name, ref_d.data(), dinp.data(), ref_d.size() * sizeof(T));
}

// gather_slot_map refuses rows outside [0, N) and repeated rows, naming the entry.
void test_slot_map_refusals() {
    struct Case {
        const char* what;
        std::vector<int> rows;
        const char* expect;
    } cases[] = {
        {"a row past N", {0, 5, 8}, "row 8 (entry 2) is outside [0, 8)"},
        {"a negative row", {-1}, "row -1 (entry 0) is outside [0, 8)"},
        {"a repeated row", {3, 1, 3}, "row 3 is listed twice (entries 0 and 2)"},
    };
    for (const Case& c : cases) {
        th::ChildOutput r = th::run_in_child([&] {
            std::vector<int> slot;
            gather_slot_map(c.rows.data(), (int)c.rows.size(), 8, &slot);
        });
        while (!r.text.empty() && r.text.back() == '\n') r.text.pop_back();
        char name[128];
        snprintf(name, sizeof(name), "gather_slot_map refuses %s", c.what);
        th::report(WIFEXITED(r.status) && WEXITSTATUS(r.status) == EXIT_FAILURE &&
                       r.text.find(c.expect) != std::string::npos,
                   name, "%s", r.text.c_str());
    }
}

int main() {
    test_slot_map_refusals();
    // BERT-like, scaled down: B*T = 4*64 rows of C = 64, 15% of them gathered (MLM), the 4 [CLS]
    // rows (classification); then channels off the pack (4 fp32, 8 bf16/fp16), every row, no row,
    // one row of one, and misaligned views (the scalar path).
    auto all_types = [](int N, int M, int C, size_t offset, uint64_t seed) {
        test_gather<float>(N, M, C, offset, seed);
        test_gather<__nv_bfloat16>(N, M, C, offset, seed);
        test_gather<__half>(N, M, C, offset, seed);
    };
    all_types(256, 38, 64, 0, 1);
    all_types(256, 4, 64, 0, 2);
    all_types(256, 38, 37, 0, 3);
    all_types(130, 130, 24, 0, 4);
    all_types(100, 0, 16, 0, 5);
    all_types(1, 1, 1, 0, 6);
    all_types(77, 20, 64, 1, 7);
    return th::finish();
}
