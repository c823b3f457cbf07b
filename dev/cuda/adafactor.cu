// dev/cuda/adafactor.cu — Adafactor (factored second moments, update clipping, relative step sizes)
// over all parameters: each variant against a CPU reference (double), then timed on GPT-2's parameter
// table (one entry per layer's matrix, as transformers' Adafactor sees a Hugging Face model).
//
// Variants:
//   1           per tensor: a block per row statistic, a block per column statistic (walking down the
//               column), one block for the tensor's scalars, then the element-wise update: four
//               launches per tensor
//   production  llmc/adafactor.cuh: four launches for the whole table; 32x256 tiles give the row and
//               column sums from one coalesced read of the gradient; the scalars' sums are spread over
//               up to 256 blocks per tensor. Faster: no launches per tensor, no strided column reads,
//               no single block walking a whole tensor while the GPU idles.
//
// Build and run: make build/cpu/dev_adafactor && build/cpu/dev_adafactor    (CPU backend)
//                make build/gpu/dev_adafactor && build/gpu/dev_adafactor    (GPU, nvcc)
// Prints a PASS/FAIL line per checked output and variant (the exit code says whether all passed),
// then times each variant (dev/cuda/README.md).
#include "../../llmc/adafactor.cuh"
#include "../../test/harness.h"
#include "common.h"

#include <cmath>
#include <vector>

// ----------------------------------------------------------------------------
// GPT-2's parameter shapes, llm.c's stacked tensors split into one entry per layer (as a Hugging Face
// model holds them, which is what transformers' Adafactor sees), weight decay on the matrices.

struct Shapes {
    std::vector<std::vector<size_t>> shapes;
    std::vector<int> decay;
    void add(std::vector<size_t> s, int wd) { shapes.push_back(s); decay.push_back(wd); }
};

// Padded vocabulary V, context maxT, L layers, C channels.
static Shapes gpt2_shapes(size_t V, size_t maxT, size_t L, size_t C) {
    Shapes s;
    s.add({V, C}, 1);
    s.add({maxT, C}, 1);
    for (size_t l = 0; l < L; l++) {
        s.add({C}, 0);           // ln1 weight, bias
        s.add({C}, 0);
        s.add({3 * C, C}, 1);    // qkv weight, bias
        s.add({3 * C}, 0);
        s.add({C, C}, 1);        // attention projection weight, bias
        s.add({C}, 0);
        s.add({C}, 0);           // ln2 weight, bias
        s.add({C}, 0);
        s.add({4 * C, C}, 1);    // fc weight, bias
        s.add({4 * C}, 0);
        s.add({C, 4 * C}, 1);    // fc projection weight, bias
        s.add({C}, 0);
    }
    s.add({C}, 0);               // final layernorm weight, bias
    s.add({C}, 0);
    return s;
}

// ----------------------------------------------------------------------------
// CPU reference: transformers.optimization.Adafactor's step in double precision. p (N) weights, m (N)
// first moment, state: the second moment in the layout's order (R then C per matrix, V per vector).

static void adafactor_cpu(std::vector<double>& p, std::vector<double>& m, std::vector<double>& state,
                          const std::vector<float>& grad, const AdafactorLayout& layout, const AdafactorConfig& cfg,
                          float grad_scale, int step) {
    const double beta2t = 1.0 - std::pow((double)step, cfg.decay_rate);
    double rel_step = cfg.lr;
    if (cfg.relative_step) rel_step = std::min(cfg.warmup_init ? 1e-6 * step : 1e-2, 1.0 / std::sqrt((double)step));
    for (const FactoredTensor& t : layout.tensors) {
        const size_t rows = t.rows, cols = t.cols, n = rows * cols;
        std::vector<double> g(n), sq(n), u(n);
        for (size_t k = 0; k < n; k++) {
            g[k] = (double)grad[t.offset + k] * grad_scale;
            sq[k] = g[k] * g[k] + cfg.eps1;
        }
        double* st = state.data() + t.state_offset;
        if (t.factored) {
            double r_sum = 0;
            for (size_t i = 0; i < rows; i++) {
                double s = 0;
                for (size_t j = 0; j < cols; j++) s += sq[i * cols + j];
                st[i] = beta2t * st[i] + (1 - beta2t) * (s / cols);
                r_sum += st[i];
            }
            for (size_t j = 0; j < cols; j++) {
                double s = 0;
                for (size_t i = 0; i < rows; i++) s += sq[i * cols + j];
                st[rows + j] = beta2t * st[rows + j] + (1 - beta2t) * (s / rows);
            }
            const double r_mean = r_sum / rows;
            for (size_t i = 0; i < rows; i++)
                for (size_t j = 0; j < cols; j++)
                    u[i * cols + j] = g[i * cols + j] / std::sqrt(st[i] / r_mean) / std::sqrt(st[rows + j]);
        } else {
            for (size_t k = 0; k < n; k++) {
                st[k] = beta2t * st[k] + (1 - beta2t) * sq[k];
                u[k] = g[k] / std::sqrt(st[k]);
            }
        }
        double u_sq = 0, p_sq = 0;
        for (size_t k = 0; k < n; k++) {
            u_sq += u[k] * u[k];
            p_sq += p[t.offset + k] * p[t.offset + k];
        }
        const double clip = std::max(std::sqrt(u_sq / n) / cfg.clip_threshold, 1.0);
        const double lr = cfg.scale_parameter ? std::max(cfg.eps2, std::sqrt(p_sq / n)) * rel_step : rel_step;
        for (size_t k = 0; k < n; k++) {
            const size_t i = t.offset + k;
            double upd = u[k] / clip * lr;
            if (cfg.use_first_moment) {
                m[i] = cfg.beta1 * m[i] + (1 - cfg.beta1) * upd;
                upd = m[i];
            }
            if (t.weight_decay && cfg.weight_decay != 0) p[i] += p[i] * (-cfg.weight_decay * lr);
            p[i] -= upd;
        }
    }
}

// ----------------------------------------------------------------------------
// Variant 1: naive, per tensor — one block per row statistic (a block sums the row's grad^2), one
// block per column statistic (a block walks down the column), then ONE block computes the tensor's
// scalars (mean of R, RMS(param), RMS(u)) alone, then an element-wise update: four launches per
// tensor, 4 * 62 for GPT-2 124M. It uses the production's element operations (adafactor_sq, _ema,
// _unclipped), so the numerics differ only in the order of the sums. The production kernels are
// faster because (1) they launch 4 times for the whole table, not 4 times per tensor, and a small
// tensor costs one block, not a launch (and a drain of the GPU) of its own; (2) the column sums here
// read the gradient with a stride of cols elements (one 32-byte sector per 2-4 useful bytes), while
// the production tiles 32 columns x 256 rows so a warp reads 32 consecutive columns of a row, and it
// gets the row and column sums from the SAME read of each tile (here the gradient is read twice for
// them); (3) the single scalar block serialises a pass over the whole tensor on one SM (two, with
// RMS(u)) while the GPU idles, where the production spreads those sums over up to 256 blocks per
// tensor and adds the per-block partials in a later launch.

constexpr int NAIVE_BLOCK = 256;

// Sum of x over the block (NAIVE_BLOCK threads) through a shared-memory tree; every thread gets it.
__device__ inline float naive_block_sum(float x) {
    __shared__ float s[NAIVE_BLOCK];
    __syncthreads();  // the previous call's readers of s[0] are done
    s[threadIdx.x] = x;
    __syncthreads();
    for (int h = NAIVE_BLOCK / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h) s[threadIdx.x] = __fadd_rn(s[threadIdx.x], s[threadIdx.x + h]);
        __syncthreads();
    }
    return s[0];
}

// Row statistic R_row (one block per row): the mean over the row of grad^2 + eps1, into the EMA.
template <class T>
__global__ void naive_rows_kernel(const T* grads, float* second_moment, FactoredTensor t, AdafactorCoefficients c) {
    const size_t row = blockIdx.x;
    float acc = 0.f;
    for (int j = threadIdx.x; j < t.cols; j += blockDim.x)
        acc = __fadd_rn(acc, adafactor_sq(__fmul_rn(to_float(grads[t.offset + row * t.cols + j]), c.grad_scale), c.eps1));
    float sum = naive_block_sum(acc);
    float* r = second_moment + t.state_offset + row;
    if (threadIdx.x == 0) *r = adafactor_ema(*r, __fdiv_rn(sum, (float)t.cols), c);
}

// Column statistic C_col (one block per column): the mean down the column, strided reads.
template <class T>
__global__ void naive_cols_kernel(const T* grads, float* second_moment, FactoredTensor t, AdafactorCoefficients c) {
    const size_t col = blockIdx.x;
    float acc = 0.f;
    for (int i = threadIdx.x; i < t.rows; i += blockDim.x)
        acc = __fadd_rn(acc, adafactor_sq(__fmul_rn(to_float(grads[t.offset + (size_t)i * t.cols + col]), c.grad_scale),
                                          c.eps1));
    float sum = naive_block_sum(acc);
    float* cs = second_moment + t.state_offset + t.rows + col;
    if (threadIdx.x == 0) *cs = adafactor_ema(*cs, __fdiv_rn(sum, (float)t.rows), c);
}

// Full second moment V of a 1-D tensor, one element per thread.
template <class T>
__global__ void naive_vector_kernel(const T* grads, float* second_moment, FactoredTensor t, AdafactorCoefficients c) {
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (size_t)t.cols) return;
    float* v = second_moment + t.state_offset + k;
    *v = adafactor_ema(*v, adafactor_sq(__fmul_rn(to_float(grads[t.offset + k]), c.grad_scale), c.eps1), c);
}

// One block: the tensor's scalars (the same formulas as adafactor_tensor_scalars) into out.
template <class T>
__global__ void naive_scalars_kernel(const T* params, const float* master, const T* grads, const float* second_moment,
                                     FactoredTensor t, AdafactorCoefficients c, AdafactorTensorScalars* out) {
    const size_t size = (size_t)t.rows * t.cols;
    float r_acc = 0.f, p_acc = 0.f;
    if (t.factored)
        for (int i = threadIdx.x; i < t.rows; i += blockDim.x) r_acc = __fadd_rn(r_acc, second_moment[t.state_offset + i]);
    for (size_t k = threadIdx.x; k < size; k += blockDim.x) {
        float p = master ? master[t.offset + k] : to_float(params[t.offset + k]);
        p_acc = fmaf(p, p, p_acc);
    }
    const float row_mean = __fdiv_rn(naive_block_sum(r_acc), (float)t.rows);
    const float param_sq = naive_block_sum(p_acc);
    float u_acc = 0.f;
    for (size_t k = threadIdx.x; k < size; k += blockDim.x) {
        float g = __fmul_rn(to_float(grads[t.offset + k]), c.grad_scale);
        float u = adafactor_unclipped(second_moment, t, k / t.cols, k % t.cols, t.state_offset + k, g, row_mean);
        u_acc = fmaf(u, u, u_acc);
    }
    const float update_sq = naive_block_sum(u_acc);
    if (threadIdx.x == 0) {
        AdafactorTensorScalars s;
        s.row_mean = row_mean;
        float param_rms = __fdiv_rn(__fsqrt_rn(param_sq), t.sqrt_size);
        if (c.scale_parameter && param_rms > c.eps2) {
            s.lr = __fmul_rn(param_rms, c.rel_step);
            s.neg_wd_lr = __fmul_rn(c.neg_wd, s.lr);
        } else {
            s.lr = c.lr_fixed;
            s.neg_wd_lr = c.neg_wd_lr_fixed;
        }
        float ratio = __fdiv_rn(__fdiv_rn(__fsqrt_rn(update_sq), t.sqrt_size), c.clip_threshold);
        s.clip_divisor = ratio > 1.0f ? ratio : 1.0f;
        *out = s;
    }
}

// The element-wise update of one tensor, one element per thread (a division per element for (row, col)).
template <class T>
__global__ void naive_apply_kernel(T* params, float* master, const T* grads, float* exp_avg, const float* second_moment,
                                   FactoredTensor t, AdafactorCoefficients c, const AdafactorTensorScalars* scalars) {
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (size_t)t.rows * t.cols) return;
    adafactor_apply_element(params, master, grads, exp_avg, second_moment, t, c, *scalars, c.grad_scale, k, k / t.cols,
                            k % t.cols);
}

// Variant 1's step: four launches per tensor of the host-side layout; scalars is one device
// AdafactorTensorScalars per tensor.
template <class T>
static void adafactor_naive(T* params, float* master, const T* grads, float* exp_avg, float* second_moment,
                            AdafactorTensorScalars* scalars, const AdafactorLayout& layout, const AdafactorConfig& cfg,
                            float grad_scale, int step, cudaStream_t stream) {
    const AdafactorCoefficients c = adafactor_coefficients(cfg, grad_scale, step);
    for (size_t k = 0; k < layout.tensors.size(); k++) {
        const FactoredTensor& t = layout.tensors[k];
        const size_t n = (size_t)t.rows * t.cols;
        if (t.factored) {
            cudaCheck(launch_kernel(naive_rows_kernel<T>, dim3(t.rows), dim3(NAIVE_BLOCK), 0, stream, grads,
                                    second_moment, t, c));
            cudaCheck(launch_kernel(naive_cols_kernel<T>, dim3(t.cols), dim3(NAIVE_BLOCK), 0, stream, grads,
                                    second_moment, t, c));
        } else {
            cudaCheck(launch_kernel(naive_vector_kernel<T>, dim3((unsigned)CEIL_DIV(n, (size_t)NAIVE_BLOCK)),
                                    dim3(NAIVE_BLOCK), 0, stream, grads, second_moment, t, c));
        }
        cudaCheck(launch_kernel(naive_scalars_kernel<T>, dim3(1), dim3(NAIVE_BLOCK), 0, stream, (const T*)params,
                                (const float*)master, grads, (const float*)second_moment, t, c, scalars + k));
        cudaCheck(launch_kernel(naive_apply_kernel<T>, dim3((unsigned)CEIL_DIV(n, (size_t)NAIVE_BLOCK)),
                                dim3(NAIVE_BLOCK), 0, stream, params, master, grads, exp_avg,
                                (const float*)second_moment, t, c, (const AdafactorTensorScalars*)(scalars + k)));
    }
}

// ----------------------------------------------------------------------------
// Device state of one run and the two variants behind one signature

template <class T>
struct State {
    AdafactorLayout layout;
    T *params, *grads;
    float *master = nullptr, *exp_avg, *second_moment, *scratch;
    FactoredTensor* tensors;
    AdafactorTensorScalars* scalars;
    size_t N;
    State(const Shapes& s, bool with_master) : layout(adafactor_layout(s.shapes, s.decay)), N(layout.num_params) {
        cudaMallocCheck(&params, N * sizeof(T));
        cudaMallocCheck(&grads, N * sizeof(T));
        cudaMallocCheck(&exp_avg, N * sizeof(float));
        cudaMallocCheck(&second_moment, layout.second_moment_size * sizeof(float));
        cudaMallocCheck(&scratch, layout.scratch_size * sizeof(float));
        cudaCheck(cudaMemset(exp_avg, 0, N * sizeof(float)));
        cudaCheck(cudaMemset(second_moment, 0, layout.second_moment_size * sizeof(float)));
        if (with_master) cudaMallocCheck(&master, N * sizeof(float));
        const size_t nt = layout.tensors.size();
        cudaMallocCheck(&tensors, nt * sizeof(FactoredTensor));
        cudaCheck(cudaMemcpy(tensors, layout.tensors.data(), nt * sizeof(FactoredTensor), cudaMemcpyHostToDevice));
        cudaMallocCheck(&scalars, nt * sizeof(AdafactorTensorScalars));
    }
    ~State() {
        for (void* ptr : {(void*)params, (void*)grads, (void*)master, (void*)exp_avg, (void*)second_moment,
                          (void*)scratch, (void*)tensors, (void*)scalars})
            if (ptr) cudaCheck(cudaFree(ptr));
    }
};

enum class Variant { Naive, Production };
static const char* variant_name(Variant k) {
    return k == Variant::Naive ? "v1 naive per-tensor" : "production (4 launches)";
}

template <class T>
static void run_variant(Variant k, State<T>& s, const AdafactorConfig& cfg, float grad_scale, int step) {
    if (k == Variant::Naive)
        adafactor_naive(s.params, s.master, s.grads, s.exp_avg, s.second_moment, s.scalars, s.layout, cfg, grad_scale,
                        step, 0);
    else
        adafactor_update(s.params, s.master, s.grads, s.exp_avg, s.second_moment, s.scratch, s.tensors,
                         (int)s.layout.tensors.size(), s.N, cfg, grad_scale, step, 0);
}

// ----------------------------------------------------------------------------
// Validation: 3 steps of each variant vs the double reference, from the same (T-rounded) gradients.
// The kernels' element operations are a handful of fp32 roundings; their sums (row/column means,
// mean(R), RMS(param), RMS(u)) add at most a few hundred positive terms serially per thread or
// strip, then trees, so a relative error of a few dozen fp32 eps at most: k = 64 (rtol 64 eps_fp32)
// for the second moment, the first moment and the update. The weights: 1 rounding of p per step on
// top of the update's error, so |dp| <= 3 steps * 64 eps_fp32 * max |update| (lr <= 1e-2 * RMS(p)
// <= 1e-2 here, times the clipped u, RMS <= clip_threshold, |u| well below 20) + 4 eps_fp32 * |p|.
// T params (bf16) are the weights rounded once: one ulp of T, dtype_eps<T>() relative. The first
// moment: k = 64 too, plus an atol of 64 eps_fp32 * lr (1e-3) * 1e-2 for the elements near 0, where
// the steps' updates of opposite sign cancel.

template <class T>
static void validate(Variant k, const Shapes& shapes, const AdafactorConfig& cfg, const char* cname) {
    const bool lowp = !std::is_same<T, float>::value;
    State<T> s(shapes, lowp);
    const size_t N = s.N, S = s.layout.second_moment_size;
    std::vector<float> p(N), g(N);
    th::fill_uniform(p.data(), N, 1);
    std::vector<T> pT(N), gT(N);
    for (size_t i = 0; i < N; i++) {
        pT[i] = from_float<T>(p[i]);
        if (!lowp) p[i] = to_float(pT[i]);
    }
    std::vector<double> pd(p.begin(), p.end()), m(N, 0.0), state(S, 0.0);
    cudaCheck(cudaMemcpy(s.params, pT.data(), N * sizeof(T), cudaMemcpyHostToDevice));
    if (lowp) cudaCheck(cudaMemcpy(s.master, p.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    const float scales[3] = {1.f, 0.37f, 1.f};
    for (int step = 1; step <= 3; step++) {
        th::fill_uniform(g.data(), N, 10 + step);
        for (size_t i = 0; i < N; i++) {
            gT[i] = from_float<T>(g[i]);
            g[i] = to_float(gT[i]);
        }
        cudaCheck(cudaMemcpy(s.grads, gT.data(), N * sizeof(T), cudaMemcpyHostToDevice));
        run_variant(k, s, cfg, scales[step - 1], step);
        adafactor_cpu(pd, m, state, g, s.layout, cfg, scales[step - 1], step);
    }
    std::vector<float> out_w(N), out_m(N), out_state(S);
    std::vector<T> out_p(N);
    cudaCheck(cudaMemcpy(out_p.data(), s.params, N * sizeof(T), cudaMemcpyDeviceToHost));
    if (lowp) cudaCheck(cudaMemcpy(out_w.data(), s.master, N * sizeof(float), cudaMemcpyDeviceToHost));
    else for (size_t i = 0; i < N; i++) out_w[i] = to_float(out_p[i]);
    cudaCheck(cudaMemcpy(out_m.data(), s.exp_avg, N * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(out_state.data(), s.second_moment, S * sizeof(float), cudaMemcpyDeviceToHost));
    const double e = th::EPS_FP32;
    const th::Tol w_tol{3 * 64 * e * 1e-2 * 20, 4 * e}, state_tol{0, 64 * e}, m_tol{64 * e * 1e-2 * 1e-3, 64 * e};
    char name[192], tn[32];
    snprintf(tn, sizeof(tn), lowp ? "%s+master" : "%s", th::dtype_name<T>());
    snprintf(name, sizeof(name), "%s %s %s: weights", variant_name(k), cname, tn);
    th::check_close(name, pd.data(), out_w.data(), N, w_tol);
    if (lowp) {
        snprintf(name, sizeof(name), "%s %s %s: params", variant_name(k), cname, tn);
        th::check_close(name, pd.data(), out_p.data(), N, th::Tol{w_tol.atol, dtype_eps<T>()});
    }
    snprintf(name, sizeof(name), "%s %s %s: second moment (R, C, V)", variant_name(k), cname, tn);
    th::check_close(name, state.data(), out_state.data(), S, state_tol);
    if (cfg.use_first_moment) {
        snprintf(name, sizeof(name), "%s %s %s: first moment", variant_name(k), cname, tn);
        th::check_close(name, m.data(), out_m.data(), N, m_tol);
    }
}

// ----------------------------------------------------------------------------
// Benchmark

template <class T>
static void benchmark(Variant k, const Shapes& shapes, const AdafactorConfig& cfg, int reps) {
    const bool lowp = !std::is_same<T, float>::value;
    State<T> s(shapes, lowp);
    cudaCheck(cudaMemset(s.grads, 0, s.N * sizeof(T)));
    std::vector<T> ones(s.N, from_float<T>(1.f));
    cudaCheck(cudaMemcpy(s.params, ones.data(), s.N * sizeof(T), cudaMemcpyHostToDevice));
    if (lowp) {
        std::vector<float> onesf(s.N, 1.f);
        cudaCheck(cudaMemcpy(s.master, onesf.data(), s.N * sizeof(float), cudaMemcpyHostToDevice));
    }
    int step = 1;  // every call is the next step, the warm-up call included
    float ms = time_ms([&] { run_variant(k, s, cfg, 1.f, step++); }, reps);
    // The production design's traffic per element (the figure for both variants, so that the times
    // compare): the gradient read 3 times (statistics, RMS(u), update), the weights read twice
    // (RMS(param), update) and written once, plus the T copy when there is a master.
    double bytes_per = 3.0 * sizeof(T) + (lowp ? 3 * 4 + sizeof(T) : 3 * 4);
    char name[96];
    snprintf(name, sizeof(name), "%-24s %-12s N=%zu", variant_name(k), lowp ? "bf16+master" : "fp32", s.N);
    bench_line(name, ms, bytes_per * s.N);
}

int main(int argc, char** argv) {
    dev_command_line(argc, argv,
        "Adafactor (factored second moments, update clipping, relative step sizes) over all parameters:\n"
        "variant 1 (four launches per tensor) and production (llmc/adafactor.cuh, four for the whole\n"
        "table), timed on GPT-2's parameter table.\n" DEV_VALIDATES);
    // Validation at a small GPT-2-like shape with odd sizes (V, maxT, C not multiples of 8; wte is
    // 1003 x 36: several tile rows and blocks), with transformers' defaults (relative step, scaled by
    // RMS(param), no beta1) and with a fixed lr, beta1, weight decay and a clip threshold that clips.
    Shapes small = gpt2_shapes(1003, 67, 2, 36);
    AdafactorConfig defaults;
    AdafactorConfig fixed;
    fixed.lr = 1e-3;
    fixed.relative_step = false;
    fixed.scale_parameter = false;
    fixed.use_first_moment = true;
    fixed.beta1 = 0.9;
    fixed.weight_decay = 0.1;
    fixed.clip_threshold = 0.5;
    for (Variant k : {Variant::Naive, Variant::Production}) {
        validate<float>(k, small, defaults, "defaults");
        validate<__nv_bfloat16>(k, small, defaults, "defaults");
        validate<float>(k, small, fixed, "lr+beta1+wd+clip");
        validate<__nv_bfloat16>(k, small, fixed, "lr+beta1+wd+clip");
    }

    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    const bool cpu_backend = peak_gbps() == 0;
    // GPT-2 124M on a GPU; a 0.7M-parameter model on the CPU backend (kept small: the naive variant
    // is slow there), whose timings measure the backend, not a GPU.
    Shapes shapes = cpu_backend ? gpt2_shapes(2048, 256, 2, 128) : gpt2_shapes(50304, 1024, 12, 768);
    const int reps = cpu_backend ? 2 : 20;
    printf("benchmark on %s%s (transformers defaults):\n", prop.name,
           cpu_backend ? " (CPU-backend figures, not GPU performance)" : "");
    for (Variant k : {Variant::Naive, Variant::Production}) {
        benchmark<float>(k, shapes, defaults, reps);
        benchmark<__nv_bfloat16>(k, shapes, defaults, reps);
    }
    return th::finish();
}
