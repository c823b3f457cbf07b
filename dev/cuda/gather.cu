// dev/cuda/gather.cu — row gather (out = inp[rows]) and its backward (a scatter through a slot map
// that zeroes the rows not gathered): each variant against a CPU reference (bitwise), then timed.
//
// Variants:
//   1           one thread per element, scalar loads and stores, each thread dividing its flat index
//               by C to find its row
//   production  llmc/gather.cuh: one 128-bit pack (4 fp32 / 8 bf16) per thread when C and the pointers
//               allow it. Faster: 4-8x fewer threads, index divisions and memory instructions for the
//               same bytes.
//
// Build and run: make build/cpu/dev_gather && build/cpu/dev_gather    (CPU backend)
//                make build/gpu/dev_gather && build/gpu/dev_gather    (GPU, nvcc)
// Prints a PASS/FAIL line per checked output and variant (the exit code says whether all passed),
// then times each variant (dev/cuda/README.md).
#include "../../llmc/gather.cuh"
#include "../../test/harness.h"
#include "common.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

// ----------------------------------------------------------------------------
// CPU reference

// out (M,C) = inp (N,C) at rows; dinp (N,C) = dout's row i at rows[i], zeros elsewhere.
template <class T>
void gather_rows_cpu(std::vector<T>& out, const std::vector<T>& inp, const std::vector<int>& rows, int C) {
    for (size_t i = 0; i < rows.size(); i++)
        std::copy_n(inp.begin() + (size_t)rows[i] * C, C, out.begin() + i * C);
}
template <class T>
void scatter_rows_cpu(std::vector<T>& dinp, const std::vector<T>& dout, const std::vector<int>& rows, int C) {
    std::fill(dinp.begin(), dinp.end(), from_float<T>(0.f));
    for (size_t i = 0; i < rows.size(); i++)
        std::copy_n(dout.begin() + i * C, C, dinp.begin() + (size_t)rows[i] * C);
}

// ----------------------------------------------------------------------------
// Simpler variant (the production kernels are in llmc/gather.cuh)

// Variant 1: one thread per element, scalar loads and stores, each thread dividing its flat index
// by C to find its row. The production kernels give each thread one 128-bit pack (4 fp32 / 8 bf16
// elements) when C and the pointers allow it: 4-8x fewer threads, index divisions and memory
// instructions for the same bytes. Both are pure copies, so their results are identical.
template <class T>
__global__ void gather_rows_kernel1(T* out, const T* inp, const int* rows, int M, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)M * C) return;
    size_t i = idx / C, c = idx % C;
    out[idx] = inp[(size_t)rows[i] * C + c];
}
template <class T>
__global__ void scatter_rows_kernel1(T* dinp, const T* dout, const int* slot, int N, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * C) return;
    size_t n = idx / C, c = idx % C;
    int s = slot[n];
    dinp[idx] = s >= 0 ? dout[(size_t)s * C + c] : from_float<T>(0.f);
}

template <class T>
void gather_rows1(T* out, const T* inp, const int* rows, int M, int C, cudaStream_t stream) {
    cudaCheck(launch_kernel(gather_rows_kernel1<T>, dim3((unsigned)CEIL_DIV((size_t)M * C, (size_t)256)), dim3(256), 0,
                            stream, out, inp, rows, M, C));
}
template <class T>
void scatter_rows1(T* dinp, const T* dout, const int* slot, int N, int C, cudaStream_t stream) {
    cudaCheck(launch_kernel(scatter_rows_kernel1<T>, dim3((unsigned)CEIL_DIV((size_t)N * C, (size_t)256)), dim3(256),
                            0, stream, dinp, dout, slot, N, C));
}

// M distinct rows of [0, N) in random order (like BERT's masked positions), seeded.
std::vector<int> random_rows(int N, int M, uint64_t seed) {
    std::vector<int> all(N);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), std::mt19937_64(seed));
    return std::vector<int>(all.begin(), all.begin() + M);
}

// ----------------------------------------------------------------------------
// Validation

// Every variant, gather and scatter, against the reference at N rows of C channels, M of them
// gathered. Copies are exact, so the check is bitwise. The scatter's output starts as NaN bytes, so
// an element no thread writes shows.
template <class T>
void validate(int N, int M, int C) {
    auto inp = th::random_tensor<T>((size_t)N * C, 1), dout = th::random_tensor<T>((size_t)M * C, 2);
    std::vector<int> rows = random_rows(N, M, 3), slot;
    gather_slot_map(rows.data(), M, N, &slot);
    std::vector<T> ref_out((size_t)M * C), ref_dinp((size_t)N * C);
    gather_rows_cpu(ref_out, inp, rows, C);
    scatter_rows_cpu(ref_dinp, dout, rows, C);

    th::DeviceBuffer<T> d_inp(inp), d_dout(dout);
    th::DeviceBuffer<int> d_rows(rows), d_slot(slot);
    char name[160];
    for (int variant = 1; variant <= 2; variant++) {
        const char* vname = variant == 1 ? "variant 1" : "(llmc)";
        th::DeviceBuffer<T> d_out((size_t)M * C, th::Fill::NaN), d_dinp((size_t)N * C, th::Fill::NaN);
        if (variant == 1) {
            gather_rows1(d_out.ptr, (const T*)d_inp.ptr, d_rows.ptr, M, C, 0);
            scatter_rows1(d_dinp.ptr, (const T*)d_dout.ptr, d_slot.ptr, N, C, 0);
        } else {
            gather_rows(d_out.ptr, (const T*)d_inp.ptr, d_rows.ptr, M, C, 0);
            scatter_rows(d_dinp.ptr, (const T*)d_dout.ptr, d_slot.ptr, N, C, 0);
        }
        snprintf(name, sizeof(name), "gather_rows %s %s N=%d M=%d C=%d", vname, th::dtype_name<T>(), N, M, C);
        th::check_bitwise(name, ref_out.data(), d_out.host().data(), ref_out.size() * sizeof(T));
        snprintf(name, sizeof(name), "scatter_rows %s %s N=%d M=%d C=%d", vname, th::dtype_name<T>(), N, M, C);
        th::check_bitwise(name, ref_dinp.data(), d_dinp.host().data(), ref_dinp.size() * sizeof(T));
    }
}

// ----------------------------------------------------------------------------
// Benchmark

// Bytes: the gather reads and writes M rows (plus M indices); the scatter writes N rows, reads the M
// gathered ones and the N-entry slot map.
template <class T>
void benchmark(int N, int M, int C, int reps) {
    size_t S = sizeof(T);
    printf("%s, N=%d rows, M=%d gathered, C=%d:\n", th::dtype_name<T>(), N, M, C);
    std::vector<int> rows = random_rows(N, M, 3), slot;
    gather_slot_map(rows.data(), M, N, &slot);
    th::DeviceBuffer<T> inp(th::random_tensor<T>((size_t)N * C, 1)), out((size_t)M * C, th::Fill::Zero),
        dinp((size_t)N * C, th::Fill::Zero);
    th::DeviceBuffer<int> d_rows(rows), d_slot(slot);
    double gather_bytes = 2.0 * M * C * S + 4.0 * M, scatter_bytes = (double)(N + M) * C * S + 4.0 * N;
    bench_line("gather_rows variant 1 (scalar)",
               time_ms([&] { gather_rows1(out.ptr, (const T*)inp.ptr, d_rows.ptr, M, C, 0); }, reps), gather_bytes);
    bench_line("gather_rows (llmc)",
               time_ms([&] { gather_rows(out.ptr, (const T*)inp.ptr, d_rows.ptr, M, C, 0); }, reps), gather_bytes);
    bench_line("scatter_rows variant 1 (scalar)",
               time_ms([&] { scatter_rows1(dinp.ptr, (const T*)out.ptr, d_slot.ptr, N, C, 0); }, reps), scatter_bytes);
    bench_line("scatter_rows (llmc)",
               time_ms([&] { scatter_rows(dinp.ptr, (const T*)out.ptr, d_slot.ptr, N, C, 0); }, reps), scatter_bytes);
}

int main(int argc, char** argv) {
    dev_command_line(argc, argv,
        "Row gather and its backward (a scatter): variant 1 (scalar) and production (llmc/gather.cuh),\n"
        "bit for bit, timed in GB/s.\n" DEV_VALIDATES);
    // Validation: BERT-like shapes scaled down (B*T = 4*64 rows, ~15% gathered), C = 768 (the
    // packed path), C = 100 (packed for fp32, scalar for bf16: not a multiple of 8) and C = 99
    // (scalar for both); and a gather of a few rows only, as many as the [CLS] rows of 4 sequences.
    for (int C : {768, 100, 99}) {
        validate<float>(256, 38, C);
        validate<__nv_bfloat16>(256, 38, C);
    }
    validate<__nv_bfloat16>(256, 4, 768);

    // Benchmark: BERT-base's MLM gather (B=32, T=512, 15% masked, C=768) on a GPU; a slice on the
    // CPU backend.
#if defined(SIMT_CPU)
    printf("benchmark (CPU backend: times are for the simulator, not for any GPU)\n");
    benchmark<__nv_bfloat16>(512, 77, 768, 2);
#else
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("benchmark on %s\n", prop.name);
    benchmark<__nv_bfloat16>(32 * 512, 2458, 768, 50);
    benchmark<float>(32 * 512, 2458, 768, 50);
#endif
    return th::finish();
}
