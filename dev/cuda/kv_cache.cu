// dev/cuda/kv_cache.cu — attention of one new token against a KV cache (the decoding step): each
// variant against a CPU reference (double), then timed.
//
// Variants:
//   1           one thread per (head, output dim), an online softmax over the keys: every thread of a
//               head recomputes every score
//   production  llmc/kv_cache.cuh: each score computed once (a few lanes per key, 128-bit loads), the
//               weights in shared memory, the value sum split over slices of the keys. Faster: HS
//               times less dot-product work and key loads, and no per-thread serial chain over the
//               keys, so the time approaches one pass over the cache at memory bandwidth.
//
// Build and run: make build/cpu/dev_kv_cache && build/cpu/dev_kv_cache    (CPU backend)
//                make build/gpu/dev_kv_cache && build/gpu/dev_kv_cache    (GPU, nvcc)
// Prints a PASS/FAIL line per checked output and variant (the exit code says whether all passed),
// then times each variant (dev/cuda/README.md).
#include "../../llmc/kv_cache.cuh"
#include "../../test/harness.h"
#include "common.h"

#include <cmath>
#include <vector>

// ----------------------------------------------------------------------------
// CPU reference (double)

// out (C) for the query at row pos of qkv (maxT, 3C): per head, softmax(q k_j / sqrt(HS), j <= pos) · v.
template <class T>
std::vector<double> attention_decode_cpu(const std::vector<T>& qkv, int pos, int C, int NH) {
    int HS = C / NH;
    std::vector<double> out(C), s(pos + 1);
    const T* q = qkv.data() + (size_t)pos * 3 * C;
    for (int h = 0; h < NH; h++) {
        double m = -INFINITY, l = 0;
        for (int j = 0; j <= pos; j++) {
            const T* k = qkv.data() + (size_t)j * 3 * C + C + h * HS;
            double dot = 0;
            for (int d = 0; d < HS; d++) dot += th::to_double(q[h * HS + d]) * th::to_double(k[d]);
            s[j] = dot / std::sqrt((double)HS);
            m = std::fmax(m, s[j]);
        }
        for (int j = 0; j <= pos; j++) l += (s[j] = std::exp(s[j] - m));
        for (int d = 0; d < HS; d++) {
            double acc = 0;
            for (int j = 0; j <= pos; j++) acc += s[j] * th::to_double(qkv[(size_t)j * 3 * C + 2 * C + h * HS + d]);
            out[h * HS + d] = acc / l;
        }
    }
    return out;
}

// ----------------------------------------------------------------------------
// Simpler variant (the production kernel is in llmc/kv_cache.cuh)

// Variant 1: one thread per (head, output dim d), looping over the keys with an online softmax
// (running max and sum, the accumulator rescaled when the max grows): no shared memory, no
// reductions. Every thread of a head recomputes every score q·k_j itself, so a head does HS times the
// dot-product work and issues HS times the key loads (scalar, served from L1 as broadcasts), and the
// scores serialize inside each thread: O(pos * HS) dependent steps per thread. The production kernel
// computes each score once (a few lanes per key, 128-bit loads, 32/G keys per warp in parallel),
// keeps the weights in shared memory, and splits the value sum over slices of the keys, so the time
// approaches one pass over the cache at the memory bandwidth.
template <class T>
__global__ void attention_decode_kernel1(T* out, const T* qkv_cache, int pos, int C, int HS, float scale) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= C) return;
    int h = idx / HS;
    size_t stride = 3 * (size_t)C;
    const T* q = qkv_cache + (size_t)pos * stride + h * HS;
    float m = -INFINITY, l = 0.f, acc = 0.f;
    for (int j = 0; j <= pos; j++) {
        const T* k = qkv_cache + (size_t)j * stride + C + h * HS;
        float s = 0.f;
        for (int d = 0; d < HS; d++) s += to_float(q[d]) * to_float(k[d]);
        s *= scale;
        float m_new = fmaxf(m, s), rescale = expf(m - m_new), p = expf(s - m_new);
        l = l * rescale + p;
        acc = acc * rescale + p * to_float(qkv_cache[(size_t)j * stride + 2 * C + idx]);
        m = m_new;
    }
    out[idx] = from_float<T>(acc / l);
}

template <class T>
void attention_decode1(T* out, const T* qkv_cache, int pos, int C, int NH, cudaStream_t stream) {
    int HS = C / NH;
    cudaCheck(launch_kernel(attention_decode_kernel1<T>, dim3((unsigned)CEIL_DIV(C, 256)), dim3(256), 0, stream, out,
                            qkv_cache, pos, C, HS, (float)(1.0 / std::sqrt((double)HS))));
}

// A (maxT, 3C) cache: rows 0..pos uniform in [-1, 1) (rounded to T), rows after pos NaN, which the
// kernels must never read (a NaN read would spread into the output and fail the check).
template <class T>
std::vector<T> make_cache(int pos, int C, int maxT, uint64_t seed) {
    std::vector<float> f((size_t)maxT * 3 * C, NAN);
    th::fill_uniform(f.data(), (size_t)(pos + 1) * 3 * C, seed);
    return th::round_to<T>(f);
}

// ----------------------------------------------------------------------------
// Validation

// Both variants against the double reference. Tolerance, first order in eps = eps_fp32, inputs in
// [-1, 1): a score is a length-HS dot product (|terms| <= 1), so its error is <= HS eps, times the
// scale 1/sqrt(HS): sqrt(HS) eps absolute, which becomes a relative error of sqrt(HS) eps in each
// weight after exp (plus a few eps for exp itself and the max subtraction); the weighted sum of
// pos+1 values and the sum of weights add at most (pos + 1) eps each, relative to sum p |v| <= l.
// So |out - ref| <= k eps with k = 2 (sqrt(HS) + 2 (pos + 1) + 8), 2 for margin; for bf16 plus the
// one final rounding, eps_bf16 / 2 of |ref| (rtol = eps_bf16 leaves room for the fp32 part).
template <class T>
void validate(int C, int NH, int pos, int maxT) {
    auto cache = make_cache<T>(pos, C, maxT, 7);
    std::vector<double> ref = attention_decode_cpu(cache, pos, C, NH);
    int HS = C / NH;
    double k = 2 * (std::sqrt((double)HS) + 2 * (pos + 1) + 8);
    th::Tol tol{k * th::EPS_FP32, sizeof(T) == 4 ? 0.0 : dtype_eps<T>()};
    th::DeviceBuffer<T> d_cache(cache);
    char name[160];
    for (int variant = 1; variant <= 2; variant++) {
        const char* vname = variant == 1 ? "variant 1" : "(llmc)";
        th::DeviceBuffer<T> d_out(C, th::Fill::NaN);
        if (variant == 1) attention_decode1(d_out.ptr, (const T*)d_cache.ptr, pos, C, NH, 0);
        else attention_decode(d_out.ptr, (const T*)d_cache.ptr, pos, C, NH, maxT, 0);
        snprintf(name, sizeof(name), "attention_decode %s %s C=%d NH=%d HS=%d pos=%d maxT=%d", vname,
                 th::dtype_name<T>(), C, NH, HS, pos, maxT);
        th::check_close(name, ref.data(), d_out.host().data(), C, tol);
    }
}

// ----------------------------------------------------------------------------
// Benchmark

// Bytes: the keys and values of positions 0..pos (2C each), the query and the output (C each).
template <class T>
void benchmark(int C, int NH, int pos, int maxT, int reps) {
    size_t S = sizeof(T);
    printf("%s, C=%d NH=%d pos=%d:\n", th::dtype_name<T>(), C, NH, pos);
    th::DeviceBuffer<T> cache(make_cache<T>(pos, C, maxT, 7)), out(C, th::Fill::Zero);
    double bytes = ((double)(pos + 1) * 2 * C + 2.0 * C) * S;
    bench_line("attention_decode variant 1 (thread per output)",
               time_ms([&] { attention_decode1(out.ptr, (const T*)cache.ptr, pos, C, NH, 0); }, reps), bytes);
    bench_line("attention_decode (llmc)",
               time_ms([&] { attention_decode(out.ptr, (const T*)cache.ptr, pos, C, NH, maxT, 0); }, reps), bytes);
}

int main(int argc, char** argv) {
    dev_command_line(argc, argv,
        "Attention of one new token against a KV cache (decoding): variant 1 (thread per output) and\n"
        "production (llmc/kv_cache.cuh), timed in GB/s.\n" DEV_VALIDATES);
    // Validation: GPT-2's head size 64 with a window scaled down (C=256, 4 heads); HS=24 (packed for
    // fp32 and bf16, 3 chunks of 8 in bf16: not a power of two); HS=20 (not a multiple of 8: bf16
    // takes the scalar path); pos = 0 (a single key).
    for (int pos : {0, 300}) {
        validate<float>(256, 4, pos, 320);
        validate<__nv_bfloat16>(256, 4, pos, 320);
    }
    validate<float>(120, 5, 77, 100);
    validate<__nv_bfloat16>(120, 5, 77, 100);
    validate<float>(60, 3, 129, 131);
    validate<__nv_bfloat16>(60, 3, 129, 131);

    // Benchmark: GPT-2 124M (C=768, 12 heads) at the last position of a 1024 window on a GPU; a
    // shorter window on the CPU backend.
#if defined(SIMT_CPU)
    printf("benchmark (CPU backend: times are for the simulator, not for any GPU)\n");
    benchmark<__nv_bfloat16>(768, 12, 127, 128, 2);
#else
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("benchmark on %s\n", prop.name);
    benchmark<__nv_bfloat16>(768, 12, 1023, 1024, 50);
    benchmark<float>(768, 12, 1023, 1024, 50);
#endif
    return th::finish();
}
