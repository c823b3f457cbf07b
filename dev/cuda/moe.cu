// dev/cuda/moe.cu — the Mixture-of-Experts kernel layer (router top-k, dispatch plan, permute,
// combine, their backwards): the dispatch plan's variants against a CPU reference, then every stage
// timed. test/test_moe.cu checks the numerics of each kernel.
//
// Variants (of the dispatch plan; the other stages are timed as production has them):
//   1           the whole counting sort in one thread: count, prefix sum, place
//   production  llmc/moe.cuh: the ranking spread over E blocks of 256 threads (a ballot per warp per
//               chunk), the placement over one thread per assignment. Faster: N*K dependent steps on
//               one thread become a few parallel passes.
//
// Build and run: make build/cpu/dev_moe && build/cpu/dev_moe    (CPU backend)
//                make build/gpu/dev_moe && build/gpu/dev_moe    (GPU, nvcc)
// Prints a PASS/FAIL line per checked output and variant (the exit code says whether all passed),
// then times each stage (dev/cuda/README.md).
#include "../../llmc/moe.cuh"
#include "../../test/harness.h"
#include "common.h"

#include <vector>

// ----------------------------------------------------------------------------
// CPU reference

// The plan by its definition: each expert's assignments in token order, the first cap kept (all
// when cap = 0); slot (NK) per assignment, -1 if dropped; offsets (E+1).
void moe_plan_cpu(std::vector<int>& slot, std::vector<int>& offsets, const std::vector<int>& expert, int E, int cap) {
    int NK = (int)expert.size(), rows = 0;
    slot.assign(NK, -1);
    offsets.assign(E + 1, 0);
    for (int e = 0; e < E; e++) {
        offsets[e] = rows;
        int routed = 0;
        for (int a = 0; a < NK; a++)
            if (expert[a] == e && (cap == 0 || routed++ < cap)) slot[a] = rows++;
    }
    offsets[E] = rows;
}

// ----------------------------------------------------------------------------
// Simpler variant (the production kernels are in llmc/moe.cuh)

// Variant 1: the whole counting sort in one thread — count, prefix sum, place — as a CPU would do
// it. Same result (it visits the assignments in the same order), but N*K dependent steps on one
// thread; the production plan spreads the ranking over E blocks of 256 threads (a ballot per warp
// per chunk) and the placement over one thread per assignment.
__global__ void moe_plan_kernel1(int* slot, int* row_assign, int* routed, int* offsets, const int* expert, int NK,
                                 int E, int cap) {
    for (int e = 0; e < E; e++) routed[e] = 0;
    for (int a = 0; a < NK; a++) slot[a] = routed[expert[a]]++;
    int sum = 0;
    for (int e = 0; e < E; e++) {
        offsets[e] = sum;
        sum += cap > 0 && routed[e] > cap ? cap : routed[e];
    }
    offsets[E] = sum;
    for (int a = 0; a < NK; a++) {
        if (cap > 0 && slot[a] >= cap) {
            slot[a] = -1;
            continue;
        }
        slot[a] += offsets[expert[a]];
        row_assign[slot[a]] = a;
    }
}

void moe_plan1(int* slot, int* row_assign, int* routed, int* offsets, const int* expert, int NK, int E, int cap,
               cudaStream_t stream) {
    cudaCheck(launch_kernel(moe_plan_kernel1, dim3(1), dim3(1), 0, stream, slot, row_assign, routed, offsets, expert,
                            NK, E, cap));
}

// Router logits (N,E) in [-2, 2), expert 0 lifted by `hot` (a skewed load, so capacity drops).
template <class T>
std::vector<T> make_logits(int N, int E, float hot) {
    std::vector<float> f((size_t)N * E);
    th::fill_uniform(f.data(), f.size(), 7, -2.f, 2.f);
    for (int n = 0; n < N; n++) f[(size_t)n * E] += hot;
    return th::round_to<T>(f);
}

// ----------------------------------------------------------------------------
// Validation

// Both plans against the reference (integers: bitwise) from the router's choices at N tokens, E
// experts, K per token, capacity factor `factor`.
void validate(int N, int E, int K, float factor) {
    int NK = N * K, cap = moe_capacity(factor, N, K, E), R = moe_max_rows(N, K, E, cap);
    th::DeviceBuffer<float> logits(make_logits<float>(N, E, 1.f)), weight(NK), probs((size_t)N * E), lse(N);
    th::DeviceBuffer<int> expert(NK);
    moe_router_forward(expert.ptr, weight.ptr, probs.ptr, lse.ptr, (const float*)logits.ptr, N, E, K, 0);
    std::vector<int> ref_slot, ref_offsets;
    moe_plan_cpu(ref_slot, ref_offsets, expert.host(), E, cap);
    char name[160];
    for (int variant = 1; variant <= 2; variant++) {
        const char* vname = variant == 1 ? "variant 1" : "(llmc)";
        th::DeviceBuffer<int> slot(NK, th::Fill::NaN), rows(R, th::Fill::NaN), routed(E), offsets(E + 1);
        if (variant == 1)
            moe_plan1(slot.ptr, rows.ptr, routed.ptr, offsets.ptr, expert.ptr, NK, E, cap, 0);
        else
            moe_dispatch_plan(slot.ptr, rows.ptr, routed.ptr, offsets.ptr, expert.ptr, N, K, E, cap, 0);
        snprintf(name, sizeof(name), "moe plan %s N=%d E=%d K=%d cap=%d: slots", vname, N, E, K, cap);
        th::check_bitwise(name, ref_slot.data(), slot.host().data(), NK * sizeof(int));
        snprintf(name, sizeof(name), "moe plan %s N=%d E=%d K=%d cap=%d: offsets", vname, N, E, K, cap);
        th::check_bitwise(name, ref_offsets.data(), offsets.host().data(), (E + 1) * sizeof(int));
    }
}

// ----------------------------------------------------------------------------
// Benchmark

// Every stage at N tokens of C channels, E experts, K per token, dropless. Bytes: what each stage
// must read and write (rows of C in T, the fp32 router tensors, 4-byte indices).
template <class T>
void benchmark(int N, int C, int E, int K, int reps) {
    int NK = N * K, R = moe_max_rows(N, K, E, 0);
    double S = sizeof(T);
    printf("%s, N=%d tokens, C=%d, E=%d experts, K=%d:\n", th::dtype_name<T>(), N, C, E, K);
    th::DeviceBuffer<T> logits(make_logits<T>(N, E, 0.f)), dlogits((size_t)N * E);
    th::DeviceBuffer<T> x(th::random_tensor<T>((size_t)N * C, 1)), xe((size_t)R * C), dye((size_t)R * C),
        out((size_t)N * C);
    th::DeviceBuffer<float> weight(NK), dweight(NK), probs((size_t)N * E), lse(N);
    th::DeviceBuffer<int> expert(NK), slot(NK), rows(R), routed(E), offsets(E + 1);
    moe_router_forward(expert.ptr, weight.ptr, probs.ptr, lse.ptr, (const T*)logits.ptr, N, E, K, 0);
    moe_dispatch_plan(slot.ptr, rows.ptr, routed.ptr, offsets.ptr, expert.ptr, N, K, E, 0, 0);
    double rows_bytes = (double)R * C * S, tok_bytes = (double)N * C * S;
    bench_line("router forward (llmc)",
               time_ms([&] { moe_router_forward(expert.ptr, weight.ptr, probs.ptr, lse.ptr, (const T*)logits.ptr, N,
                                                E, K, 0); }, reps),
               N * E * (S + 4.0) + 4.0 * N + 8.0 * NK);
    bench_line("plan variant 1 (one thread)",
               time_ms([&] { moe_plan1(slot.ptr, rows.ptr, routed.ptr, offsets.ptr, expert.ptr, NK, E, 0, 0); }, reps),
               12.0 * NK);
    bench_line("plan (llmc)",
               time_ms([&] { moe_dispatch_plan(slot.ptr, rows.ptr, routed.ptr, offsets.ptr, expert.ptr, N, K, E, 0,
                                               0); }, reps),
               12.0 * NK);
    bench_line("permute (llmc)",
               time_ms([&] { moe_permute(xe.ptr, (const T*)x.ptr, rows.ptr, offsets.ptr, E, K, R, C, 0); }, reps),
               2 * rows_bytes + 4.0 * R);
    bench_line("permute backward (llmc)",
               time_ms([&] { moe_permute_backward(out.ptr, (const T*)xe.ptr, slot.ptr, N, K, C, 0); }, reps),
               rows_bytes + tok_bytes + 4.0 * NK);
    bench_line("combine (llmc)",
               time_ms([&] { moe_combine(out.ptr, (const T*)xe.ptr, weight.ptr, slot.ptr, N, K, C, 0); }, reps),
               rows_bytes + tok_bytes + 8.0 * NK);
    bench_line("combine backward (llmc)",
               time_ms([&] { moe_combine_backward(dye.ptr, dweight.ptr, (const T*)out.ptr, (const T*)xe.ptr,
                                                  weight.ptr, slot.ptr, rows.ptr, offsets.ptr, N, K, E, R, C, 0); },
                       reps),
               2 * rows_bytes + 2 * tok_bytes + 12.0 * NK);
    bench_line("router backward (llmc)",
               time_ms([&] { moe_router_backward(dlogits.ptr, dweight.ptr, expert.ptr, weight.ptr, probs.ptr, lse.ptr,
                                                 routed.ptr, N, E, K, 0.01f, 0.001f, 1.f, 0); }, reps),
               N * E * (S + 4.0) + 4.0 * N + 12.0 * NK);
}

int main(int argc, char** argv) {
    dev_command_line(argc, argv,
        "The Mixture-of-Experts kernels (router top-k, dispatch plan, permute, combine, their backwards):\n"
        "the dispatch plan's variant 1 (one thread) and production (llmc/moe.cuh) against a CPU reference,\n"
        "then every stage timed in GB/s.\n" DEV_VALIDATES);
    // Validation: token counts off the block size, K = 1 and 2, dropless and with a capacity factor
    // that drops part of the hot expert's tokens.
    validate(1000, 8, 2, 0.f);
    validate(1000, 8, 2, 1.25f);
    validate(777, 16, 1, 1.0f);

    // Benchmark: a GPT-2 small MoE layer (B=8, T=1024, C=768, 8 experts, top-2) on a GPU; a slice on
    // the CPU backend.
#if defined(SIMT_CPU)
    printf("benchmark (CPU backend: times are for the simulator, not for any GPU)\n");
    benchmark<__nv_bfloat16>(512, 768, 8, 2, 2);
#else
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("benchmark on %s\n", prop.name);
    benchmark<__nv_bfloat16>(8 * 1024, 768, 8, 2, 50);
    benchmark<float>(8 * 1024, 768, 8, 2, 50);
#endif
    return th::finish();
}
