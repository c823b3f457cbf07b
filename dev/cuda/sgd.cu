// dev/cuda/sgd.cu — SGD (momentum, dampening, Nesterov, L2 weight decay) over all parameters: each
// variant against a CPU reference (torch's operations in its order, so bit for bit), then timed on
// GPT-2 124M's parameter table.
//
// Variants:
//   1           one launch per tensor, one element per thread
//   production  llmc/sgd.cuh: one launch for the whole table (blockIdx.y picks the tensor), its grid
//               capped at one wave with a grid-stride loop. Faster: no launch latency and drain between
//               tensors (a larger share of SGD's step than of AdamW's: few bytes per element), and no
//               millions of short-lived blocks for the large tensors.
//
// Build and run: make build/cpu/dev_sgd && build/cpu/dev_sgd    (CPU backend)
//                make build/gpu/dev_sgd && build/gpu/dev_sgd    (GPU, nvcc)
// Prints a PASS/FAIL line per checked output and variant (the exit code says whether all passed),
// then times each variant (dev/cuda/README.md).
#include "../../llmc/sgd.cuh"
#include "../../test/harness.h"
#include "common.h"
#include "gpt2_table.h"

#include <cmath>
#include <vector>

// One configuration of torch.optim.SGD's hyper-parameters.
struct SGDConfig {
    const char* name;
    float lr, momentum, dampening, weight_decay;
    bool nesterov;
};

// ----------------------------------------------------------------------------
// CPU reference: torch.optim.SGD's single-tensor CPU path (AVX2 build: add with alpha is one fma),
// operation by operation in fp32.

static void sgd_cpu(float* p, float* buf, const float* grad, const Table& table, const SGDConfig& cfg,
                    float grad_scale, int step) {
    const float one_minus_damp = (float)(1.0 - (double)cfg.dampening), neg_lr = -cfg.lr;
    for (const ParamTensor& t : table.tensors) {
        for (size_t i = t.offset; i < t.offset + t.size; i++) {
            float g = grad[i] * grad_scale;
            if (t.weight_decay && cfg.weight_decay != 0.f) g = std::fma(p[i], cfg.weight_decay, g);  // d_p.add(p, alpha=wd)
            if (cfg.momentum != 0.f) {
                if (step == 1) buf[i] = g;                                                 // torch.clone(d_p)
                else buf[i] = std::fma(g, one_minus_damp, buf[i] * cfg.momentum);          // mul_(m).add_(d_p, 1-damp)
                g = cfg.nesterov ? std::fma(buf[i], cfg.momentum, g) : buf[i];             // d_p.add(buf, alpha=m)
            }
            p[i] = std::fma(g, neg_lr, p[i]);                                              // p.add_(d_p, alpha=-lr)
        }
    }
}

// ----------------------------------------------------------------------------
// Variant 1: one launch per tensor, one element per thread — the obvious way. The production kernel
// does the same arithmetic in ONE launch (blockIdx.y picks the tensor, a grid-stride loop covers it):
// a GPT-2 table has 16 tensors (148 if every layer's tensors were separate), and each extra launch
// costs a few microseconds of launch latency plus a drain-and-refill of the GPU between tensors,
// while the small ones (biases, layernorm gains of C elements) occupy a handful of blocks for a whole
// launch. SGD moves few bytes per element (no second moment), so this overhead is a larger share of
// its step than of AdamW's. The production kernel also caps its grid at one wave and loops, so
// large tensors do not pay for launching millions of short-lived blocks.

template <class T>
__global__ void sgd_per_tensor_kernel(T* params, float* master, const T* grads, float* buf, size_t size,
                                      float weight_decay, SGDCoefficients c) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= size) return;
    float p = master ? master[i] : to_float(params[i]);
    float g = __fmul_rn(to_float(grads[i]), c.grad_scale);
    if (weight_decay != 0.0f) g = fmaf(p, weight_decay, g);
    if (c.momentum != 0.0f) {
        float b = c.first_step ? g : fmaf(g, c.one_minus_damp, __fmul_rn(buf[i], c.momentum));
        buf[i] = b;
        g = c.nesterov ? fmaf(b, c.momentum, g) : b;
    }
    p = fmaf(g, c.neg_lr, p);
    if (master) master[i] = p;
    params[i] = from_float<T>(p);
}

// Launches variant 1 once per tensor of the host-side table.
template <class T>
static void sgd_per_tensor(T* params, float* master, const T* grads, float* buf, const Table& table,
                           const SGDConfig& cfg, float grad_scale, int step, cudaStream_t stream) {
    SGDCoefficients c;
    c.neg_lr = -cfg.lr;
    c.momentum = cfg.momentum;
    c.one_minus_damp = (float)(1.0 - (double)cfg.dampening);
    c.weight_decay = cfg.weight_decay;
    c.grad_scale = grad_scale;
    c.nesterov = cfg.nesterov ? 1 : 0;
    c.first_step = step == 1 ? 1 : 0;
    for (const ParamTensor& t : table.tensors) {
        if (t.size == 0) continue;
        const size_t o = t.offset;
        cudaCheck(launch_kernel(sgd_per_tensor_kernel<T>, dim3((unsigned)CEIL_DIV(t.size, (size_t)512)), dim3(512), 0,
                                stream, params + o, master ? master + o : nullptr, grads + o,
                                buf ? buf + o : nullptr, t.size, t.weight_decay ? cfg.weight_decay : 0.0f, c));
    }
}

// ----------------------------------------------------------------------------
// Device state of one run and the two variants behind one signature

template <class T>
struct State {
    T *params, *grads;
    float *master = nullptr, *buf;
    ParamTensor* tensors;
    size_t N;
    State(const Table& table, bool with_master) : N(table.N) {
        cudaMallocCheck(&params, N * sizeof(T));
        cudaMallocCheck(&grads, N * sizeof(T));
        cudaMallocCheck(&buf, N * sizeof(float));
        if (with_master) cudaMallocCheck(&master, N * sizeof(float));
        cudaMallocCheck(&tensors, table.tensors.size() * sizeof(ParamTensor));
        cudaCheck(cudaMemcpy(tensors, table.tensors.data(), table.tensors.size() * sizeof(ParamTensor),
                             cudaMemcpyHostToDevice));
    }
    ~State() {
        for (void* ptr : {(void*)params, (void*)grads, (void*)buf, (void*)master, (void*)tensors})
            if (ptr) cudaCheck(cudaFree(ptr));
    }
};

enum class Variant { PerTensor, Production };
static const char* variant_name(Variant k) {
    return k == Variant::PerTensor ? "v1 per-tensor launches" : "production (1 launch)";
}

template <class T>
static void run_variant(Variant k, State<T>& s, const Table& table, const SGDConfig& cfg, float grad_scale,
                        int step) {
    if (k == Variant::PerTensor)
        sgd_per_tensor(s.params, s.master, s.grads, s.buf, table, cfg, grad_scale, step, 0);
    else
        sgd_update(s.params, s.master, s.grads, s.buf, s.tensors, (int)table.tensors.size(), s.N, cfg.lr,
                   cfg.momentum, cfg.dampening, cfg.weight_decay, cfg.nesterov, grad_scale, step, 0);
}

// ----------------------------------------------------------------------------
// Validation: 3 steps of each variant vs the CPU reference; the same operations in the same order
// with explicitly rounded intrinsics, so the results must be identical (budget 0).

template <class T>
static void validate(Variant k, const Table& table, const SGDConfig& cfg) {
    const bool lowp = !std::is_same<T, float>::value;
    const size_t N = table.N;
    std::vector<float> p(N), buf(N, 0.f), g(N);
    th::fill_uniform(p.data(), N, 1);
    std::vector<T> pT(N), gT(N);
    for (size_t i = 0; i < N; i++) {
        pT[i] = from_float<T>(p[i]);
        if (!lowp) p[i] = to_float(pT[i]);
    }
    State<T> s(table, lowp);
    cudaCheck(cudaMemcpy(s.params, pT.data(), N * sizeof(T), cudaMemcpyHostToDevice));
    if (lowp) cudaCheck(cudaMemcpy(s.master, p.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    // Garbage in the buffer: step 1 must ignore it (torch clones the gradient).
    std::vector<float> junk(N);
    th::fill_uniform(junk.data(), N, 7, -100.f, 100.f);
    cudaCheck(cudaMemcpy(s.buf, junk.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    const float scales[3] = {1.f, 0.37f, 1.f};
    for (int step = 1; step <= 3; step++) {
        th::fill_uniform(g.data(), N, 10 + step);
        for (size_t i = 0; i < N; i++) {
            gT[i] = from_float<T>(g[i]);
            g[i] = to_float(gT[i]);
        }
        cudaCheck(cudaMemcpy(s.grads, gT.data(), N * sizeof(T), cudaMemcpyHostToDevice));
        run_variant(k, s, table, cfg, scales[step - 1], step);
        sgd_cpu(p.data(), buf.data(), g.data(), table, cfg, scales[step - 1], step);
    }
    std::vector<float> out_w(N), out_buf(N);
    std::vector<T> out_p(N), ref_p(N);
    cudaCheck(cudaMemcpy(out_p.data(), s.params, N * sizeof(T), cudaMemcpyDeviceToHost));
    if (lowp) cudaCheck(cudaMemcpy(out_w.data(), s.master, N * sizeof(float), cudaMemcpyDeviceToHost));
    else for (size_t i = 0; i < N; i++) out_w[i] = to_float(out_p[i]);
    cudaCheck(cudaMemcpy(out_buf.data(), s.buf, N * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < N; i++) ref_p[i] = from_float<T>(p[i]);
    char name[160], tn[32];
    snprintf(tn, sizeof(tn), lowp ? "%s+master" : "%s", th::dtype_name<T>());
    snprintf(name, sizeof(name), "%s %s %s: weights", variant_name(k), cfg.name, tn);
    th::check_close(name, p.data(), out_w.data(), N, th::Tol{0, 0});
    snprintf(name, sizeof(name), "%s %s %s: params", variant_name(k), cfg.name, tn);
    th::check_close(name, ref_p.data(), out_p.data(), N, th::Tol{0, 0});
    if (cfg.momentum != 0.f) {
        snprintf(name, sizeof(name), "%s %s %s: momentum buffer", variant_name(k), cfg.name, tn);
        th::check_close(name, buf.data(), out_buf.data(), N, th::Tol{0, 0});
    }
}

// ----------------------------------------------------------------------------
// Benchmark

template <class T>
static void benchmark(Variant k, const Table& table, const SGDConfig& cfg, int reps) {
    const bool lowp = !std::is_same<T, float>::value;
    State<T> s(table, lowp);
    cudaCheck(cudaMemset(s.params, 0, s.N * sizeof(T)));
    cudaCheck(cudaMemset(s.grads, 0, s.N * sizeof(T)));
    cudaCheck(cudaMemset(s.buf, 0, s.N * sizeof(float)));
    if (lowp) cudaCheck(cudaMemset(s.master, 0, s.N * sizeof(float)));
    int step = 1;  // every call is the next SGD step, the warm-up call included
    float ms = time_ms([&] { run_variant(k, s, table, cfg, 1.f, step++); }, reps);
    // Per element: read weights (fp32 master or T params), grad (T), buf; write weights, buf, and the
    // T copy when there is a master.
    double bytes_per = (4 + sizeof(T) + 4) + (lowp ? 4 + sizeof(T) + 4 : 4 + 4);
    char name[96];
    snprintf(name, sizeof(name), "%-24s %-12s N=%zu", variant_name(k), lowp ? "bf16+master" : "fp32", s.N);
    bench_line(name, ms, bytes_per * s.N);
}

int main(int argc, char** argv) {
    dev_command_line(argc, argv,
        "SGD (momentum, dampening, Nesterov, L2 weight decay) over all parameters: variant 1 (one launch\n"
        "per tensor) and production (llmc/sgd.cuh, one launch), bit for bit against torch's operations,\n"
        "timed on GPT-2 124M's parameter table.\n" DEV_VALIDATES);
    // Validation at a small GPT-2-like shape with odd sizes (V, maxT, C not multiples of 8), with
    // plain SGD, heavy-ball momentum with dampening, and Nesterov, all with weight decay.
    Table small = gpt2_table(1003, 67, 2, 36);
    const SGDConfig configs[3] = {{"plain", 0.05f, 0.f, 0.f, 0.1f, false},
                                  {"momentum+damp", 0.05f, 0.9f, 0.1f, 0.1f, false},
                                  {"nesterov", 0.05f, 0.9f, 0.f, 0.01f, true}};
    for (Variant k : {Variant::PerTensor, Variant::Production})
        for (const SGDConfig& cfg : configs) {
            validate<float>(k, small, cfg);
            validate<__nv_bfloat16>(k, small, cfg);
        }

    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    const bool cpu_backend = peak_gbps() == 0;
    // GPT-2 124M on a GPU; a 1.35M-parameter model on the CPU backend, whose timings measure the
    // backend, not a GPU.
    Table table = cpu_backend ? gpt2_table(4096, 256, 4, 128) : gpt2_table(50304, 1024, 12, 768);
    const int reps = cpu_backend ? 2 : 20;
    printf("benchmark on %s%s (momentum 0.9):\n", prop.name, cpu_backend ? " (CPU-backend figures, not GPU performance)" : "");
    for (Variant k : {Variant::PerTensor, Variant::Production}) {
        benchmark<float>(k, table, configs[1], reps);
        benchmark<__nv_bfloat16>(k, table, configs[1], reps);
    }
    return th::finish();
}
