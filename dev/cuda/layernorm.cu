// dev/cuda/layernorm.cu — LayerNorm forward and backward, the residual add, and the two fused: each
// variant against a CPU reference (double), then timed.
//
// Variants:
//   forward 1   one thread per row, three passes over the row in global memory
//   forward     llmc/layernorm.cuh: a warp per row, the row read from DRAM once into shared memory,
//   production  shuffle reductions. Faster: a warp's loads are 512 contiguous bytes (128-bit each)
//               where variant 1's 32 threads read 32 rows, 32 sectors for 32 useful elements
//   residual 1  one element per thread, scalar loads
//   residual    llmc/layernorm.cuh: 16 bytes per operand per thread. Faster: one 128-bit instruction
//   production  instead of 4 or 8, fewer threads for the same bytes
//   backward 1  dinp with one thread per row (uncoalesced, as forward 1); dweight and dbias with one
//               thread per channel walking the N rows, a second read of dout and inp
//   backward 2  llmc/layernorm.cuh's streaming kernel: dweight and dbias folded into the dinp pass
//               (per-warp shared-memory accumulators, per-block partials, a small fixed-order
//               reduction). Faster than 1: one read of dout and inp, the whole GPU busy instead of C
//               threads; production where a row does not fit in registers
//   backward    llmc/layernorm.cuh: variant 2 with each row in registers (C <= 1024 in bf16): dout, inp
//   production  and dinp loaded at once, one trip to DRAM per row instead of two waits; bit-identical
//               to variant 2. On an H200 (bf16, N = 8192, C = 768): 0.0308 ms against 0.0385. Tried
//               too: also loading the warp's next row while it computes this one (196 registers
//               against 121), 0.0315 ms there: no faster, dropped
//   backward 3  production with its column sums (dweight, dbias, dinp's) in registers until the warp's
//               last row, where production loads and stores a shared-memory accumulator per sum,
//               element and row (LayernormBackwardKernel::SumsInRegisters; bit-identical). Untimed
//   fused 1     the residual add, then LayerNorm reading the residual back
//   fused prod. llmc/layernorm.cuh: the add and the LayerNorm in one pass. Faster: no re-read of the
//               residual it just wrote
//
// Build and run: make build/cpu/dev_layernorm && build/cpu/dev_layernorm    (CPU backend)
//                make build/gpu/dev_layernorm && build/gpu/dev_layernorm    (GPU, nvcc)
// Prints a PASS/FAIL line per checked output and variant (the exit code says whether all passed),
// then times each variant (dev/cuda/README.md).
#include "../../llmc/layernorm.cuh"
#include "../../test/harness.h"
#include "common.h"

#include <cmath>
#include <vector>

// ----------------------------------------------------------------------------
// CPU reference (double)

// LayerNorm of each row of x (N,C): out (N,C), mean (N), rstd (N).
void layernorm_forward_cpu(std::vector<double>& out, std::vector<double>& mean, std::vector<double>& rstd,
                           const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                           int N, int C, double eps) {
    out.resize((size_t)N * C), mean.resize(N), rstd.resize(N);
    for (int n = 0; n < N; n++) {
        const double* row = &x[(size_t)n * C];
        double m = 0, v = 0;
        for (int c = 0; c < C; c++) m += row[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (row[c] - m) * (row[c] - m);
        double s = 1 / std::sqrt(v / C + eps);
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] = (row[c] - m) * s * w[c] + b[c];
        mean[n] = m, rstd[n] = s;
    }
}

// The analytic LayerNorm gradient, accumulated: dinp (N,C) +=, dweight (C) +=, dbias (C) +=.
void layernorm_backward_cpu(std::vector<double>& dinp, std::vector<double>& dweight, std::vector<double>& dbias,
                            const std::vector<double>& dout, const std::vector<double>& x, const std::vector<double>& w,
                            const std::vector<double>& mean, const std::vector<double>& rstd, int N, int C) {
    for (int n = 0; n < N; n++) {
        size_t o = (size_t)n * C;
        double m = mean[n], s = rstd[n], mean_dnorm = 0, mean_dnorm_xhat = 0;
        for (int c = 0; c < C; c++) {
            double xhat = (x[o + c] - m) * s, dnorm = dout[o + c] * w[c];
            mean_dnorm += dnorm / C, mean_dnorm_xhat += dnorm * xhat / C;
            dweight[c] += dout[o + c] * xhat, dbias[c] += dout[o + c];
        }
        for (int c = 0; c < C; c++) {
            double xhat = (x[o + c] - m) * s;
            dinp[o + c] += s * (dout[o + c] * w[c] - mean_dnorm - xhat * mean_dnorm_xhat);
        }
    }
}

// ----------------------------------------------------------------------------
// Simpler variants (the production kernels are in llmc/layernorm.cuh)

// Forward variant 1: one thread per row, three passes over the row in global memory. Simple, but
// at each step a warp's 32 threads read 32 different rows: every load instruction touches 32
// sectors for 32 useful elements, and only the cache softens the two re-reads. The production
// kernel gives each row a warp (coalesced 128-bit loads, 512 contiguous bytes per instruction),
// reads the row from DRAM once into shared memory, and reduces with shuffles.
template <class T>
__global__ void layernorm_forward_kernel1(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                                          const T* bias, int N, int C, float eps) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) return;
    const T* x = inp + (size_t)row * C;
    float m = 0.f, v = 0.f;
    for (int c = 0; c < C; c++) m += to_float(x[c]);
    m /= C;
    for (int c = 0; c < C; c++) v += (to_float(x[c]) - m) * (to_float(x[c]) - m);
    float s = rsqrtf(v / C + eps);
    for (int c = 0; c < C; c++)
        out[(size_t)row * C + c] = from_float<T>((to_float(x[c]) - m) * s * to_float(weight[c]) + to_float(bias[c]));
    mean[row] = m;
    rstd[row] = s;
}

// Residual variant 1: one element per thread, scalar loads. The production kernel moves 16 bytes
// per operand per thread (one 128-bit instruction instead of 4 or 8), so fewer instructions and
// threads carry the same bytes.
template <class T>
__global__ void residual_forward_kernel1(T* out, const T* inp1, const T* inp2, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) out[i] = from_float<T>(to_float(inp1[i]) + to_float(inp2[i]));
}

// Backward variant 1, first kernel: dinp with one thread per row (two passes over the row),
// uncoalesced like forward variant 1.
template <class T>
__global__ void layernorm_backward_dinp_kernel1(T* dinp, const T* dout, const T* inp, const T* weight,
                                                const float* mean, const float* rstd, int N, int C) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) return;
    size_t o = (size_t)row * C;
    float m = mean[row], s = rstd[row], mean_dnorm = 0.f, mean_dnorm_xhat = 0.f;
    for (int c = 0; c < C; c++) {
        float dnorm = to_float(dout[o + c]) * to_float(weight[c]);
        mean_dnorm += dnorm;
        mean_dnorm_xhat += dnorm * (to_float(inp[o + c]) - m) * s;
    }
    mean_dnorm /= C;
    mean_dnorm_xhat /= C;
    for (int c = 0; c < C; c++) {
        float xhat = (to_float(inp[o + c]) - m) * s;
        float dx = s * (to_float(dout[o + c]) * to_float(weight[c]) - mean_dnorm - xhat * mean_dnorm_xhat);
        dinp[o + c] = from_float<T>(to_float(dinp[o + c]) + dx);
    }
}

// Backward variant 1, second kernel: dweight and dbias with one thread per channel summing the N
// rows in order. Deterministic and coalesced across channels, but only C threads (a few SMs'
// worth of a GPU) each walk all N rows serially, and dout/inp are read a second time. The
// production kernel folds these sums into the dinp pass (per-warp shared-memory accumulators,
// per-block partials, then a small fixed-order reduction): one read of dout/inp, the whole GPU busy.
template <class T>
__global__ void layernorm_backward_params_kernel1(T* dweight, T* dbias, const T* dout, const T* inp,
                                                  const float* mean, const float* rstd, int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float dw = 0.f, db = 0.f;
    for (int n = 0; n < N; n++) {
        float dy = to_float(dout[(size_t)n * C + c]);
        dw += dy * (to_float(inp[(size_t)n * C + c]) - mean[n]) * rstd[n];
        db += dy;
    }
    dweight[c] = from_float<T>(to_float(dweight[c]) + dw);
    dbias[c] = from_float<T>(to_float(dbias[c]) + db);
}

template <class T>
void layernorm_forward1(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N, int C,
                        float eps, cudaStream_t stream) {
    cudaCheck(launch_kernel(layernorm_forward_kernel1<T>, dim3(CEIL_DIV(N, 256)), dim3(256), 0, stream, out, mean, rstd,
                            inp, weight, bias, N, C, eps));
}
template <class T>
void residual_forward1(T* out, const T* inp1, const T* inp2, size_t N, cudaStream_t stream) {
    cudaCheck(launch_kernel(residual_forward_kernel1<T>, dim3((unsigned)CEIL_DIV(N, (size_t)256)), dim3(256), 0, stream,
                            out, inp1, inp2, N));
}
// Fused-residual variant 1: the residual add, then LayerNorm reading the residual back.
template <class T>
void fused_residual_layernorm_forward1(T* residual, T* out, float* mean, float* rstd, const T* inp1, const T* inp2,
                                       const T* weight, const T* bias, int N, int C, float eps, cudaStream_t stream) {
    residual_forward(residual, inp1, inp2, (size_t)N * C, stream);
    layernorm_forward(out, mean, rstd, (const T*)residual, weight, bias, N, C, eps, stream);
}
template <class T>
void layernorm_backward1(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                         const float* mean, const float* rstd, int N, int C, cudaStream_t stream) {
    cudaCheck(launch_kernel(layernorm_backward_dinp_kernel1<T>, dim3(CEIL_DIV(N, 256)), dim3(256), 0, stream, dinp,
                            dout, inp, weight, mean, rstd, N, C));
    cudaCheck(launch_kernel(layernorm_backward_params_kernel1<T>, dim3(CEIL_DIV(C, 256)), dim3(256), 0, stream, dweight,
                            dbias, dout, inp, mean, rstd, N, C));
}

// ----------------------------------------------------------------------------
// Validation

// Every variant against the double reference at (N, C). Tolerances: outputs are O(1) and every
// variant sums rows (or N rows for the parameter gradients) in fp32, which is within
// (terms) * eps_fp32 of the sum of |terms| in the worst case (atol); bf16 and fp16 results add one
// rounding (rtol = the type's eps; fp32: 8 eps for the few roundings after the sums).
template <class T>
void validate(int N, int C, float eps) {
    size_t NC = (size_t)N * C;
    auto inp1 = th::random_tensor<T>(NC, 1, -2.f, 2.f), inp2 = th::random_tensor<T>(NC, 2, -0.1f, 0.1f);
    auto w = th::random_tensor<T>(C, 3), b = th::random_tensor<T>(C, 4), dout = th::random_tensor<T>(NC, 5);
    auto dinp0 = th::random_tensor<T>(NC, 6), dw0 = th::random_tensor<T>(C, 7), db0 = th::random_tensor<T>(C, 8);
    double rtol = sizeof(T) == 4 ? 8 * th::EPS_FP32 : dtype_eps<T>();
    th::Tol row_tol{4 * C * th::EPS_FP32, rtol}, param_tol{4.0 * (N + C) * th::EPS_FP32, rtol};
    char name[160];

    // Reference: residual rounded to T as every variant stores it, then LayerNorm and backward of it.
    std::vector<T> residual(NC);
    for (size_t i = 0; i < NC; i++) residual[i] = from_float<T>(to_float(inp1[i]) + to_float(inp2[i]));
    std::vector<double> out_ref, mean_ref, rstd_ref;
    layernorm_forward_cpu(out_ref, mean_ref, rstd_ref, th::widen(residual), th::widen(w), th::widen(b), N, C, eps);
    std::vector<double> dinp_ref = th::widen(dinp0), dw_ref = th::widen(dw0), db_ref = th::widen(db0);
    std::vector<float> mean_f(mean_ref.begin(), mean_ref.end()), rstd_f(rstd_ref.begin(), rstd_ref.end());
    layernorm_backward_cpu(dinp_ref, dw_ref, db_ref, th::widen(dout), th::widen(residual), th::widen(w),
                           std::vector<double>(mean_f.begin(), mean_f.end()),
                           std::vector<double>(rstd_f.begin(), rstd_f.end()), N, C);

    using Forward = void (*)(T*, float*, float*, const T*, const T*, const T*, int, int, float, cudaStream_t);
    const std::pair<const char*, Forward> forwards[] = {{"layernorm_forward variant 1", layernorm_forward1<T>},
                                                        {"layernorm_forward (llmc)", layernorm_forward<T>}};
    for (auto& [label, fn] : forwards) {
        th::DeviceBuffer<T> d_inp(residual), d_w(w), d_b(b), d_out(NC, th::Fill::Zero);
        th::DeviceBuffer<float> d_mean(N, th::Fill::Zero), d_rstd(N, th::Fill::Zero);
        fn(d_out.ptr, d_mean.ptr, d_rstd.ptr, d_inp.ptr, d_w.ptr, d_b.ptr, N, C, eps, 0);
        snprintf(name, sizeof(name), "%s %s N=%d C=%d: out", label, th::dtype_name<T>(), N, C);
        th::check_close(name, out_ref.data(), d_out.host().data(), NC, row_tol);
        snprintf(name, sizeof(name), "%s %s N=%d C=%d: rstd", label, th::dtype_name<T>(), N, C);
        th::check_close(name, rstd_ref.data(), d_rstd.host().data(), N, th::Tol{0, row_tol.atol + rtol});
    }

    using Fused = void (*)(T*, T*, float*, float*, const T*, const T*, const T*, const T*, int, int, float, cudaStream_t);
    const std::pair<const char*, Fused> fused[] = {
        {"fused_residual_layernorm variant 1 (two kernels)", fused_residual_layernorm_forward1<T>},
        {"fused_residual_layernorm_forward (llmc)", fused_residual_layernorm_forward<T>}};
    for (auto& [label, fn] : fused) {
        th::DeviceBuffer<T> d_in1(inp1), d_in2(inp2), d_w(w), d_b(b);
        th::DeviceBuffer<T> d_res(NC, th::Fill::Zero), d_out(NC, th::Fill::Zero);
        th::DeviceBuffer<float> d_mean(N, th::Fill::Zero), d_rstd(N, th::Fill::Zero);
        fn(d_res.ptr, d_out.ptr, d_mean.ptr, d_rstd.ptr, d_in1.ptr, d_in2.ptr, d_w.ptr, d_b.ptr, N, C, eps, 0);
        snprintf(name, sizeof(name), "%s %s N=%d C=%d: residual", label, th::dtype_name<T>(), N, C);
        th::check_bitwise(name, d_res.host().data(), residual.data(), NC * sizeof(T));
        snprintf(name, sizeof(name), "%s %s N=%d C=%d: out", label, th::dtype_name<T>(), N, C);
        th::check_close(name, out_ref.data(), d_out.host().data(), NC, row_tol);
    }

    using Residual = void (*)(T*, const T*, const T*, size_t, cudaStream_t);
    const std::pair<const char*, Residual> residuals[] = {{"residual_forward variant 1", residual_forward1<T>},
                                                          {"residual_forward (llmc)", residual_forward<T>}};
    for (auto& [label, fn] : residuals) {
        th::DeviceBuffer<T> d_in1(inp1), d_in2(inp2), d_out(NC, th::Fill::Zero);
        fn(d_out.ptr, d_in1.ptr, d_in2.ptr, NC, 0);
        snprintf(name, sizeof(name), "%s %s N=%zu", label, th::dtype_name<T>(), NC);
        th::check_bitwise(name, d_out.host().data(), residual.data(), NC * sizeof(T));
    }

    // Production and variant 3 are also compared with variant 2 bit for bit (dinp, dweight, dbias and,
    // with a third column sum, dinp's column sums).
    std::vector<T> streamed_out;
    for (int variant = 1; variant <= 4; variant++) {
        const char* label = variant == 1   ? "layernorm_backward variant 1"
                            : variant == 2 ? "layernorm_backward variant 2 (streamed, llmc)"
                            : variant == 3 ? "layernorm_backward variant 3 (sums in registers, llmc)"
                                           : "layernorm_backward (llmc)";
        const LayernormBackwardKernel which = variant == 2   ? LayernormBackwardKernel::Streamed
                                              : variant == 3 ? LayernormBackwardKernel::SumsInRegisters
                                                             : LayernormBackwardKernel::Auto;
        th::DeviceBuffer<T> d_dinp(dinp0), d_dw(dw0), d_db(db0), d_dout(dout), d_inp(residual), d_w(w),
            d_colsum(C, th::Fill::Zero);
        th::DeviceBuffer<float> d_mean(mean_f), d_rstd(rstd_f);
        th::DeviceBuffer<char> scratch(layernorm_backward_scratch_bytes(N, C), th::Fill::Zero);
        if (variant == 1)
            layernorm_backward1(d_dinp.ptr, d_dw.ptr, d_db.ptr, d_dout.ptr, d_inp.ptr, d_w.ptr, d_mean.ptr, d_rstd.ptr,
                                N, C, 0);
        else
            layernorm_backward(d_dinp.ptr, d_dw.ptr, d_db.ptr, (void*)scratch.ptr, d_dout.ptr, d_inp.ptr, d_w.ptr,
                               d_mean.ptr, d_rstd.ptr, N, C, 0, d_colsum.ptr, which);
        snprintf(name, sizeof(name), "%s %s N=%d C=%d: dinp", label, th::dtype_name<T>(), N, C);
        th::check_close(name, dinp_ref.data(), d_dinp.host().data(), NC, row_tol);
        snprintf(name, sizeof(name), "%s %s N=%d C=%d: dweight", label, th::dtype_name<T>(), N, C);
        th::check_close(name, dw_ref.data(), d_dw.host().data(), C, param_tol);
        snprintf(name, sizeof(name), "%s %s N=%d C=%d: dbias", label, th::dtype_name<T>(), N, C);
        th::check_close(name, db_ref.data(), d_db.host().data(), C, param_tol);
        std::vector<T> all = d_dinp.host(), dw = d_dw.host(), db = d_db.host(), cs = d_colsum.host();
        all.insert(all.end(), dw.begin(), dw.end());
        all.insert(all.end(), db.begin(), db.end());
        all.insert(all.end(), cs.begin(), cs.end());
        if (variant == 2) streamed_out = all;
        if (variant >= 3) {
            snprintf(name, sizeof(name), "%s %s N=%d C=%d: = variant 2, bit for bit", label, th::dtype_name<T>(), N, C);
            th::check_bitwise(name, all.data(), streamed_out.data(), all.size() * sizeof(T));
        }
    }
}

// ----------------------------------------------------------------------------
// Benchmark

template <class T>
void benchmark(int N, int C, int reps) {
    size_t NC = (size_t)N * C, S = sizeof(T);
    printf("%s, N=%d C=%d:\n", th::dtype_name<T>(), N, C);
    th::DeviceBuffer<T> a(th::random_tensor<T>(NC, 1)), b(th::random_tensor<T>(NC, 2)), w(th::random_tensor<T>(C, 3)),
        bias(th::random_tensor<T>(C, 4));
    th::DeviceBuffer<T> out(NC, th::Fill::Zero), res(NC, th::Fill::Zero), dinp(NC, th::Fill::Zero),
        dw(C, th::Fill::Zero), db(C, th::Fill::Zero);
    th::DeviceBuffer<float> mean(N, th::Fill::Zero), rstd(N, th::Fill::Zero);
    th::DeviceBuffer<char> scratch(layernorm_backward_scratch_bytes(N, C), th::Fill::Zero);
    double stats = 8.0 * N, params = 2.0 * C * S;

    bench_line("layernorm_forward variant 1 (thread per row)",
               time_ms([&] { layernorm_forward1(out.ptr, mean.ptr, rstd.ptr, a.ptr, w.ptr, bias.ptr, N, C, 1e-5f, 0); }, reps),
               2.0 * NC * S + params + stats);
    bench_line("layernorm_forward (llmc)",
               time_ms([&] { layernorm_forward(out.ptr, mean.ptr, rstd.ptr, a.ptr, w.ptr, bias.ptr, N, C, 1e-5f, 0); }, reps),
               2.0 * NC * S + params + stats);
    // Both fused variants are charged the fused kernel's necessary bytes (read 2, write 2), so the
    // two-kernel variant's extra write+read of the residual shows as lower bandwidth.
    bench_line("fused residual+layernorm variant 1 (two kernels)",
               time_ms([&] { fused_residual_layernorm_forward1(res.ptr, out.ptr, mean.ptr, rstd.ptr, a.ptr, b.ptr, w.ptr,
                                                               bias.ptr, N, C, 1e-5f, 0); }, reps),
               4.0 * NC * S + params + stats);
    bench_line("fused_residual_layernorm_forward (llmc)",
               time_ms([&] { fused_residual_layernorm_forward(res.ptr, out.ptr, mean.ptr, rstd.ptr, a.ptr, b.ptr, w.ptr,
                                                              bias.ptr, N, C, 1e-5f, 0); }, reps),
               4.0 * NC * S + params + stats);
    bench_line("residual_forward variant 1 (scalar)",
               time_ms([&] { residual_forward1(res.ptr, a.ptr, b.ptr, NC, 0); }, reps), 3.0 * NC * S);
    bench_line("residual_forward (llmc)", time_ms([&] { residual_forward(res.ptr, a.ptr, b.ptr, NC, 0); }, reps),
               3.0 * NC * S);
    // Backward: reads dout, inp, dinp and writes dinp.
    bench_line("layernorm_backward variant 1 (thread per row/channel)",
               time_ms([&] { layernorm_backward1(dinp.ptr, dw.ptr, db.ptr, a.ptr, b.ptr, w.ptr, mean.ptr, rstd.ptr, N, C, 0); },
                       reps),
               4.0 * NC * S + 2 * params + stats);
    auto backward = [&](LayernormBackwardKernel which, T* colsum) {
        layernorm_backward(dinp.ptr, dw.ptr, db.ptr, (void*)scratch.ptr, a.ptr, b.ptr, w.ptr, mean.ptr, rstd.ptr, N, C,
                           0, colsum, which);
    };
    const auto streamed = LayernormBackwardKernel::Streamed, production = LayernormBackwardKernel::Auto,
               sums = LayernormBackwardKernel::SumsInRegisters;
    bench_line("layernorm_backward variant 2 (streamed)", time_ms([&] { backward(streamed, nullptr); }, reps),
               4.0 * NC * S + 2 * params + stats);
    bench_line("layernorm_backward variant 3 (sums in registers)", time_ms([&] { backward(sums, nullptr); }, reps),
               4.0 * NC * S + 2 * params + stats);
    bench_line("layernorm_backward (llmc)", time_ms([&] { backward(production, nullptr); }, reps),
               4.0 * NC * S + 2 * params + stats);
    // With the third column sum (a residual projection's bias gradient): the same bytes, more
    // shared-memory work per element; what train_gpt2 gains is the projection's bias pass it replaces.
    bench_line("layernorm_backward variant 2 + dinp column sums", time_ms([&] { backward(streamed, bias.ptr); }, reps),
               4.0 * NC * S + 3 * params + stats);
    bench_line("layernorm_backward variant 3 + dinp column sums", time_ms([&] { backward(sums, bias.ptr); }, reps),
               4.0 * NC * S + 3 * params + stats);
    bench_line("layernorm_backward (llmc) + dinp column sums", time_ms([&] { backward(production, bias.ptr); }, reps),
               4.0 * NC * S + 3 * params + stats);
}

int main(int argc, char** argv) {
    dev_command_line(argc, argv,
        "LayerNorm forward and backward, the residual add, and the two fused: variants 1 and production\n"
        "(llmc/layernorm.cuh), and backward variants 2 (llmc's streaming kernel) and 3 (the column sums in\n"
        "registers), timed in GB/s.\n" DEV_VALIDATES);
    // Validation: GPT-2 124M's C at a few rows, and a C that is neither a multiple of 32 nor of 8.
    validate<float>(64, 768, 1e-5f);
    validate<__nv_bfloat16>(64, 768, 1e-5f);
    validate<__half>(64, 768, 1e-5f);
    validate<float>(7, 100, 1e-12f);
    validate<__nv_bfloat16>(7, 100, 1e-12f);
    validate<__half>(7, 100, 1e-12f);

    // Benchmark: GPT-2 124M at B=64, T=1024 (65536 rows: 100 MB a bf16 tensor, twice an H100's or
    // H200's L2, so the figures are DRAM's) on a GPU; a small slice on the CPU backend.
#if defined(SIMT_CPU)
    printf("benchmark (CPU backend: times are for the simulator, not for any GPU)\n");
    benchmark<__nv_bfloat16>(64, 768, 2);
#else
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("benchmark on %s\n", prop.name);
    benchmark<__nv_bfloat16>(64 * 1024, 768, 20);
    benchmark<float>(64 * 1024, 768, 20);
#endif
    return th::finish();
}
