// dev/cuda/adamw.cu — AdamW over all parameters: each variant against a CPU reference (torch's
// operations in its order, so bit for bit), then timed on GPT-2 124M's parameter table.
//
// Variants:
//   1           one launch per tensor, one element per thread (llm.c's first version)
//   production  llmc/adamw.cuh: the same arithmetic (adamw_element) in one launch for the whole
//               table. Faster: no launch latency and drain of the GPU between tensors, and the small
//               tensors' few blocks share the GPU with the large ones'.
//
// Build and run: make build/cpu/dev_adamw && build/cpu/dev_adamw    (CPU backend)
//                make build/gpu/dev_adamw && build/gpu/dev_adamw    (GPU, nvcc)
// Prints a PASS/FAIL line per checked output and variant (the exit code says whether all passed),
// then times each variant (dev/cuda/README.md).
#include "../../llmc/adamw.cuh"
#include "../../test/harness.h"
#include "common.h"
#include "gpt2_table.h"

#include <cmath>
#include <cstring>
#include <vector>

// ----------------------------------------------------------------------------
// CPU reference: torch.optim.AdamW's single-tensor CPU path, operation by operation in fp32.

static void adamw_cpu(float* p, float* m, float* v, const float* grad, const Table& table, float lr, float beta1,
                      float beta2, float eps, float wd, float grad_scale, int step) {
    double bc1 = 1.0 - std::pow((double)beta1, (double)step);
    double bc2 = 1.0 - std::pow((double)beta2, (double)step);
    float decay = (float)(1.0 - (double)lr * wd);
    float w1 = (float)(1.0 - (double)beta1), w2 = (float)(1.0 - (double)beta2);
    float bc2_sqrt = (float)std::sqrt(bc2), neg_step = (float)(-((double)lr / bc1));
    for (const ParamTensor& t : table.tensors) {
        for (size_t i = t.offset; i < t.offset + t.size; i++) {
            float g = grad[i] * grad_scale;
            if (t.weight_decay) p[i] = p[i] * decay;     // param.mul_(1 - lr * wd)
            m[i] = std::fma(w1, g - m[i], m[i]);         // exp_avg.lerp_(grad, 1 - beta1)
            v[i] = v[i] * beta2 + (w2 * g) * g;          // exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2)
            float denom = std::sqrt(v[i]) / bc2_sqrt + eps;  // (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)
            p[i] = p[i] + (neg_step * m[i]) / denom;     // param.addcdiv_(exp_avg, denom, value=-step_size)
        }
    }
}

// ----------------------------------------------------------------------------
// Variant 1: one launch per tensor, one element per thread — the obvious way (and llm.c's first
// version, which launched once per tensor group). The production kernel does the same arithmetic
// (the shared adamw_element) in ONE launch: a GPT-2 table has 16 tensors (148 if every layer's
// tensors were separate), and each extra launch costs a few microseconds of launch latency plus a
// drain-and-refill of the GPU between tensors; the small ones (biases, layernorm gains of C
// elements) occupy a handful of blocks for a whole launch. In one launch the blocks of all tensors
// share the GPU and there is no gap between tensors.

template <class T>
__global__ void adamw_per_tensor_kernel(T* params, float* master, const T* grads, float* m, float* v, size_t size,
                                        float decay, AdamWCoefficients c) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= size) return;
    float p = master ? master[i] : to_float(params[i]);
    float g = __fmul_rn(to_float(grads[i]), c.grad_scale);
    adamw_element(p, m[i], v[i], g, decay, c);
    if (master) master[i] = p;
    params[i] = from_float<T>(p);
}

// Launches variant 1 once per tensor of the host-side table.
template <class T>
static void adamw_per_tensor(T* params, float* master, const T* grads, float* m, float* v, const Table& table,
                             float lr, float beta1, float beta2, float eps, float wd, float grad_scale, int step,
                             cudaStream_t stream) {
    AdamWCoefficients c = adamw_coefficients(lr, beta1, beta2, eps, wd, grad_scale, step);
    for (const ParamTensor& t : table.tensors) {
        if (t.size == 0) continue;
        const size_t o = t.offset;
        cudaCheck(launch_kernel(adamw_per_tensor_kernel<T>, dim3((unsigned)CEIL_DIV(t.size, (size_t)512)), dim3(512),
                                0, stream, params + o, master ? master + o : nullptr, grads + o, m + o, v + o, t.size,
                                t.weight_decay ? c.decay : 1.0f, c));
    }
}

// ----------------------------------------------------------------------------
// Device state of one run and the two variants behind one signature

template <class T>
struct State {
    T *params, *grads;
    float *master, *m, *v;
    ParamTensor* tensors;
    size_t N;
    State(const Table& table, bool with_master) : N(table.N) {
        cudaMallocCheck(&params, N * sizeof(T));
        cudaMallocCheck(&grads, N * sizeof(T));
        cudaMallocCheck(&m, N * sizeof(float));
        cudaMallocCheck(&v, N * sizeof(float));
        master = nullptr;
        if (with_master) cudaMallocCheck(&master, N * sizeof(float));
        cudaMallocCheck(&tensors, table.tensors.size() * sizeof(ParamTensor));
        cudaCheck(cudaMemcpy(tensors, table.tensors.data(), table.tensors.size() * sizeof(ParamTensor),
                             cudaMemcpyHostToDevice));
    }
    ~State() {
        for (void* ptr : {(void*)params, (void*)grads, (void*)m, (void*)v, (void*)master, (void*)tensors})
            if (ptr) cudaCheck(cudaFree(ptr));
    }
};

enum class Variant { PerTensor, Production };
static const char* variant_name(Variant k) { return k == Variant::PerTensor ? "v1 per-tensor launches" : "production (1 launch)"; }

template <class T>
static void run_variant(Variant k, State<T>& s, const Table& table, float lr, float grad_scale, int step) {
    const float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    if (k == Variant::PerTensor)
        adamw_per_tensor(s.params, s.master, s.grads, s.m, s.v, table, lr, beta1, beta2, eps, wd, grad_scale, step, 0);
    else
        adamw_update(s.params, s.master, s.grads, s.m, s.v, s.tensors, (int)table.tensors.size(), s.N, lr, beta1,
                     beta2, eps, wd, grad_scale, step, 0);
}

// ----------------------------------------------------------------------------
// Validation: 3 steps of each variant vs the CPU reference; same operations in the same order, so
// the results must be identical (budget 0).

template <class T>
static void validate(Variant k, const Table& table) {
    const bool lowp = !std::is_same<T, float>::value;
    const size_t N = table.N;
    std::vector<float> p(N), m(N, 0.f), v(N, 0.f), g(N);
    th::fill_uniform(p.data(), N, 1);
    std::vector<T> pT(N), gT(N);
    for (size_t i = 0; i < N; i++) pT[i] = from_float<T>(p[i]);
    State<T> s(table, lowp);
    cudaCheck(cudaMemcpy(s.params, pT.data(), N * sizeof(T), cudaMemcpyHostToDevice));
    if (lowp) cudaCheck(cudaMemcpy(s.master, p.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemset(s.m, 0, N * sizeof(float)));
    cudaCheck(cudaMemset(s.v, 0, N * sizeof(float)));
    const float scales[3] = {1.f, 0.37f, 1.f};
    for (int step = 1; step <= 3; step++) {
        th::fill_uniform(g.data(), N, 10 + step);
        for (size_t i = 0; i < N; i++) {
            gT[i] = from_float<T>(g[i]);
            g[i] = to_float(gT[i]);
        }
        cudaCheck(cudaMemcpy(s.grads, gT.data(), N * sizeof(T), cudaMemcpyHostToDevice));
        run_variant(k, s, table, 1e-2f, scales[step - 1], step);
        adamw_cpu(p.data(), m.data(), v.data(), g.data(), table, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, scales[step - 1], step);
    }
    std::vector<float> out_w(N), out_m(N), out_v(N);
    std::vector<T> out_p(N);
    cudaCheck(cudaMemcpy(out_p.data(), s.params, N * sizeof(T), cudaMemcpyDeviceToHost));
    if (lowp) cudaCheck(cudaMemcpy(out_w.data(), s.master, N * sizeof(float), cudaMemcpyDeviceToHost));
    else for (size_t i = 0; i < N; i++) out_w[i] = to_float(out_p[i]);
    cudaCheck(cudaMemcpy(out_m.data(), s.m, N * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(out_v.data(), s.v, N * sizeof(float), cudaMemcpyDeviceToHost));
    std::vector<T> ref_p(N);
    for (size_t i = 0; i < N; i++) ref_p[i] = from_float<T>(p[i]);
    char name[128];
    char tn[32];
    snprintf(tn, sizeof(tn), lowp ? "%s+master" : "%s", th::dtype_name<T>());
    snprintf(name, sizeof(name), "%s %s: weights", variant_name(k), tn);
    th::check_close(name, p.data(), out_w.data(), N, th::Tol{0, 0});
    snprintf(name, sizeof(name), "%s %s: params", variant_name(k), tn);
    th::check_close(name, ref_p.data(), out_p.data(), N, th::Tol{0, 0});
    snprintf(name, sizeof(name), "%s %s: m", variant_name(k), tn);
    th::check_close(name, m.data(), out_m.data(), N, th::Tol{0, 0});
    snprintf(name, sizeof(name), "%s %s: v", variant_name(k), tn);
    th::check_close(name, v.data(), out_v.data(), N, th::Tol{0, 0});
}

// ----------------------------------------------------------------------------
// Benchmark

template <class T>
static void benchmark(Variant k, const Table& table, int reps) {
    const bool lowp = !std::is_same<T, float>::value;
    State<T> s(table, lowp);
    cudaCheck(cudaMemset(s.params, 0, s.N * sizeof(T)));
    cudaCheck(cudaMemset(s.grads, 0, s.N * sizeof(T)));
    cudaCheck(cudaMemset(s.m, 0, s.N * sizeof(float)));
    cudaCheck(cudaMemset(s.v, 0, s.N * sizeof(float)));
    if (lowp) cudaCheck(cudaMemset(s.master, 0, s.N * sizeof(float)));
    int step = 1;  // every call is the next AdamW step, the warm-up call included
    float ms = time_ms([&] { run_variant(k, s, table, 1e-3f, 1.f, step++); }, reps);
    // Per element: read weights (fp32 master or T params), grad (T), m, v; write the same plus the T copy.
    double bytes_per = lowp ? (4 + sizeof(T) + 8) + (4 + sizeof(T) + 8) : (4 + sizeof(T) + 8) + (4 + 8);
    char name[96];
    snprintf(name, sizeof(name), "%-24s %-12s N=%zu", variant_name(k), lowp ? "bf16+master" : "fp32", s.N);
    bench_line(name, ms, bytes_per * s.N);
}

int main(int argc, char** argv) {
    dev_command_line(argc, argv,
        "AdamW over all parameters: variant 1 (one launch per tensor) and production (llmc/adamw.cuh, one\n"
        "launch), bit for bit against torch's operations, timed on GPT-2 124M's parameter table.\n" DEV_VALIDATES);
    // Validation at a small GPT-2-like shape with odd sizes (V, maxT, C not multiples of 8).
    Table small = gpt2_table(1003, 67, 2, 36);
    for (Variant k : {Variant::PerTensor, Variant::Production}) {
        validate<float>(k, small);
        validate<__nv_bfloat16>(k, small);
        validate<__half>(k, small);
    }

    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    const bool cpu_backend = peak_gbps() == 0;
    // GPT-2 124M on a GPU; a 1.35M-parameter model on the CPU backend, whose timings measure the
    // backend, not a GPU.
    Table table = cpu_backend ? gpt2_table(4096, 256, 4, 128) : gpt2_table(50304, 1024, 12, 768);
    const int reps = cpu_backend ? 2 : 20;
    printf("benchmark on %s%s:\n", prop.name, cpu_backend ? " (CPU-backend figures, not GPU performance)" : "");
    for (Variant k : {Variant::PerTensor, Variant::Production}) {
        benchmark<float>(k, table, reps);
        benchmark<__nv_bfloat16>(k, table, reps);
    }
    return th::finish();
}
