// llmc/model_state.cuh — a model's trainable state, shared by train_gpt2.cu and train_bert.cu:
// parameters and gradients in the compute precision, fp32 master weights, the optimizer (AdamW,
// AdamW with 8-bit moments, Adafactor, SGD) and its state, the global gradient norm and clipping,
// and the bytes a checkpoint saves of all this.
//
// A model describes its parameters once, as a list of tensors (ParamSpec: the shape of one matrix or
// vector, how many copies are stacked — L for per-layer tensors — and whether weight decay applies);
// everything here works on the one flat buffer those tensors live in, in that order. The model keeps
// its own named pointers into the buffers (TensorViews) and computes forward and backward; the
// update, the optimizer's state and the memory figures are the same code for every model.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "adafactor.cuh"
#include "adamw.cuh"
#include "adamw8bit.cuh"
#include "checkpoint.h"
#include "cuda_common.h"
#include "global_norm.cuh"
#include "precision.cuh"
#include "sgd.cuh"

// ----------------------------------------------------------------------------
// Describing the parameters

// One parameter tensor: `copies` stacked matrices or vectors of `shape` (copies = L for the
// per-layer tensors of llm.c's layout). Adafactor factors each copy's matrix on its own; the other
// optimizers only need the element count and the decay flag.
struct ParamSpec {
    std::vector<size_t> shape;  // of one copy: {rows, cols} or {n}
    size_t copies = 1;
    bool decays = false;        // weight decay applies (matrices: embeddings and linear weights)
    size_t numel() const {
        size_t n = copies;
        for (size_t d : shape) n *= d;
        return n;
    }
};

// Named pointers to the N tensors inside one flat buffer (parameters or gradients).
template <class floatX, int N>
struct TensorViews {
    floatX* t[N];
    void point_into(floatX* base, const size_t sizes[N]) {
        for (int i = 0; i < N; i++) {
            t[i] = base;
            base += sizes[i];
        }
    }
    // Copy l of a stacked tensor with per_layer elements per copy.
    floatX* layer(int i, int l, size_t per_layer) const { return t[i] + (size_t)l * per_layer; }
};

// ----------------------------------------------------------------------------
// Optimizers: AdamW (fp32 moments), AdamW with 8-bit block-quantized moments, Adafactor (factored
// second moments), SGD with momentum. Each keeps its state in one device allocation, saved in
// checkpoints byte for byte.

enum class OptimizerKind { AdamW, AdamW8bit, Adafactor, SGD };
inline const char* optimizer_name(OptimizerKind k) {
    static const char* names[] = {"adamw", "adamw8bit", "adafactor", "sgd"};
    return names[(int)k];
}

struct OptimizerConfig {
    OptimizerKind kind = OptimizerKind::AdamW;
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;  // AdamW, AdamW 8-bit
    float weight_decay = 0.f;                         // all of them; matrices only (SGD: L2, as torch)
    float momentum = 0.9f;                            // SGD (0: no momentum buffer)
    bool nesterov = false;                            // SGD
    AdafactorConfig adafactor;                        // Adafactor (its lr, relative step, beta1, clipping)
};

// Device memory by purpose, in bytes: exactly what a trainer allocates.
struct MemoryAnatomy {
    size_t weights = 0;      // parameters in the compute precision
    size_t master = 0;       // fp32 master weights (low precision only)
    size_t grads = 0;        // gradients in the compute precision
    size_t optimizer = 0;    // optimizer state (AdamW: m and v in fp32; see OptimizerKind)
    size_t activations = 0;  // everything the backward pass reads, and its scratch
    size_t other = 0;        // the optimizer's tables, the norm's scratch, the model's own buffers
    size_t model_state() const { return weights + master + grads + optimizer; }
    size_t total() const { return model_state() + activations + other; }
};

// ----------------------------------------------------------------------------
// The state

template <class floatX>
struct ModelState {
    std::vector<ParamSpec> specs;
    size_t num_parameters = 0;
    floatX* params_memory = nullptr;  // (num_parameters) in the compute precision
    floatX* grads_memory = nullptr;   // (num_parameters)
    float* master = nullptr;          // fp32 master weights, when floatX is not float
    OptimizerConfig opt;              // set before build_state()
    void* opt_state = nullptr;        // the optimizer's state (opt_state_bytes), see allocate_optimizer()
    size_t opt_state_bytes = 0;
    float* opt_scratch = nullptr;     // Adafactor's per-step scratch (not state)
    AdamW8bitState adamw8bit;         // views into opt_state
    AdafactorLayout adafactor;        // Adafactor's per-matrix table (host), also on the device:
    FactoredTensor* adafactor_table = nullptr;
    ParamTensor* tensor_table = nullptr;  // device: offset/size/decay of each tensor for the optimizers
    void* norm_scratch = nullptr;
    float* norm_out = nullptr;        // device scalar: squared global gradient norm
    float* clip_scale = nullptr;      // device scalar: torch's clip factor, read by the optimizers
    float* norm_host = nullptr;       // pinned copy of *norm_out, read after the step's one sync
    MemoryAnatomy mem;                // the model adds its activations and other buffers
    cudaStream_t stream = 0;

    // Allocates parameters, gradients (zero) and the optimizer's state (opt) for the tensors in
    // specs_, and fills params_memory from the fp32 host values (num_parameters of them).
    void build_state(const std::vector<ParamSpec>& specs_, const std::vector<float>& host_params) {
        specs = specs_;
        num_parameters = 0;
        for (const ParamSpec& s : specs) num_parameters += s.numel();
        if (host_params.size() != num_parameters) {  // a model's specs disagree with its own layout
            fprintf(stderr, "model state: %zu parameter values given, the tensors hold %zu\n", host_params.size(),
                    num_parameters);
            exit(EXIT_FAILURE);
        }
        size_t N = num_parameters;
        cudaCheck(cudaMalloc(&params_memory, N * sizeof(floatX)));
        cudaCheck(cudaMalloc(&grads_memory, N * sizeof(floatX)));
        cudaCheck(cudaMemset(grads_memory, 0, N * sizeof(floatX)));
        float* staging;
        cudaCheck(cudaMalloc(&staging, N * sizeof(float)));
        cudaCheck(cudaMemcpy(staging, host_params.data(), N * sizeof(float), cudaMemcpyHostToDevice));
        if (std::is_same<floatX, float>::value) {
            cudaCheck(cudaMemcpy(params_memory, staging, N * sizeof(float), cudaMemcpyDeviceToDevice));
            cudaCheck(cudaFree(staging));
        } else {
            master = staging;  // the fp32 values become the master weights
            cast(params_memory, (const float*)master, N, stream);
        }
        std::vector<ParamTensor> table(specs.size());
        size_t offset = 0;
        for (size_t i = 0; i < specs.size(); i++) {
            table[i] = ParamTensor{offset, specs[i].numel(), specs[i].decays ? 1 : 0};
            offset += specs[i].numel();
        }
        cudaCheck(cudaMalloc(&tensor_table, sizeof(ParamTensor) * table.size()));
        cudaCheck(cudaMemcpy(tensor_table, table.data(), sizeof(ParamTensor) * table.size(), cudaMemcpyHostToDevice));
        size_t other = allocate_optimizer(table);
        cudaCheck(cudaMalloc(&norm_scratch, global_norm_scratch_bytes(N)));
        cudaCheck(cudaMalloc(&norm_out, sizeof(float)));
        cudaCheck(cudaMalloc(&clip_scale, sizeof(float)));
        cudaCheck(cudaMallocHost(&norm_host, sizeof(float)));
        mem.weights = mem.grads = N * sizeof(floatX);
        mem.master = master ? N * sizeof(float) : 0;
        mem.optimizer = opt_state_bytes;
        mem.other = sizeof(ParamTensor) * table.size() + global_norm_scratch_bytes(N) + 2 * sizeof(float) + other;
    }

    // Allocates the optimizer's state (zero: the state before the first step) in opt_state; returns
    // the bytes of the other buffers it needs (tables, scratch).
    size_t allocate_optimizer(const std::vector<ParamTensor>& table) {
        size_t N = num_parameters, other = 0;
        switch (opt.kind) {
            case OptimizerKind::AdamW: opt_state_bytes = 2 * N * sizeof(float); break;  // m, v
            case OptimizerKind::SGD: opt_state_bytes = opt.momentum > 0 ? N * sizeof(float) : 0; break;
            case OptimizerKind::AdamW8bit: opt_state_bytes = adamw8bit_plan(table).total_bytes; break;
            case OptimizerKind::Adafactor: {
                // One entry per matrix and vector as transformers sees them: the stacked tensors split
                // into their copies (Adafactor's statistics and RMS are per matrix).
                std::vector<std::vector<size_t>> shapes;
                std::vector<int> decay;
                for (const ParamSpec& s : specs)
                    for (size_t k = 0; k < s.copies; k++) {
                        shapes.push_back(s.shape);
                        decay.push_back(s.decays ? 1 : 0);
                    }
                adafactor = adafactor_layout(shapes, decay);
                opt_state_bytes = sizeof(float) * (adafactor.second_moment_size +
                                                   (opt.adafactor.use_first_moment ? N : 0));
                size_t table_bytes = sizeof(FactoredTensor) * adafactor.tensors.size();
                cudaCheck(cudaMalloc(&adafactor_table, table_bytes));
                cudaCheck(cudaMemcpy(adafactor_table, adafactor.tensors.data(), table_bytes, cudaMemcpyHostToDevice));
                cudaCheck(cudaMalloc(&opt_scratch, adafactor.scratch_size * sizeof(float)));
                other = table_bytes + adafactor.scratch_size * sizeof(float);
                break;
            }
        }
        if (opt_state_bytes) {
            cudaCheck(cudaMalloc(&opt_state, opt_state_bytes));
            cudaCheck(cudaMemset(opt_state, 0, opt_state_bytes));
        }
        if (opt.kind == OptimizerKind::AdamW8bit) adamw8bit = adamw8bit_init(opt_state, adamw8bit_plan(table));
        return other;
    }

    // One optimizer step: the global gradient norm, torch's clip factor (max_norm 0: no clipping)
    // and the optimizer (opt) over all parameters, without a host sync — the norm reaches the host
    // through norm_host, valid after the stream's next synchronization (see last_grad_norm()).
    // step is the 1-based count of updates (bias correction, Adafactor's schedule, SGD's first step).
    void update(float lr, float max_norm, int step) {
        global_norm_squared(norm_out, norm_scratch, (const floatX*)grads_memory, num_parameters, stream);
        cudaCheck(cudaMemcpyAsync(norm_host, norm_out, sizeof(float), cudaMemcpyDeviceToHost, stream));
        if (max_norm > 0) grad_clip_scale(clip_scale, norm_out, max_norm, stream);
        apply_optimizer(lr, step, 1.f, max_norm > 0 ? (const float*)clip_scale : nullptr);
    }

    // The update with dynamic loss scaling (fp16), as torch.cuda.amp.GradScaler does it: the
    // gradients hold loss_scale times their value; if any is inf or NaN (the squared norm then is)
    // the step is skipped — nothing is touched — and false returned. Otherwise the optimizer gets
    // the gradients unscaled and clipped by the unscaled norm, as torch's unscale_ then
    // clip_grad_norm_: grad * (clip / loss_scale) in one rounding equals torch's two, since the
    // scale is a power of two. This waits for the norm on the host, as GradScaler.step does.
    bool update_scaled(float lr, float max_norm, int step, float loss_scale) {
        global_norm_squared(norm_out, norm_scratch, (const floatX*)grads_memory, num_parameters, stream);
        cudaCheck(cudaMemcpyAsync(norm_host, norm_out, sizeof(float), cudaMemcpyDeviceToHost, stream));
        cudaCheck(cudaStreamSynchronize(stream));
        if (!std::isfinite(*norm_host)) return false;
        float inv_scale = 1.f / loss_scale;
        *norm_host *= inv_scale * inv_scale;  // the unscaled squared norm (exact: powers of two)
        float clip = 1.f;
        if (max_norm > 0) clip = std::min(1.f, (1.f / (std::sqrt(*norm_host) + 1e-6f)) * max_norm);  // as grad_clip_scale
        apply_optimizer(lr, step, clip * inv_scale, nullptr);
        return true;
    }

    // The optimizer step itself; grad_scale (times *grad_scale_device when given) multiplies every
    // gradient first.
    void apply_optimizer(float lr, int step, float grad_scale, const float* grad_scale_device) {
        const float* clip = grad_scale_device;
        const floatX* g = grads_memory;
        size_t N = num_parameters;
        int n_tensors = (int)specs.size();
        float* state = (float*)opt_state;
        switch (opt.kind) {
            case OptimizerKind::AdamW:
                adamw_update(params_memory, master, g, state, state + N, tensor_table, n_tensors, N, lr, opt.beta1,
                             opt.beta2, opt.eps, opt.weight_decay, grad_scale, step, stream, clip);
                break;
            case OptimizerKind::AdamW8bit:
                adamw8bit_update(params_memory, master, g, adamw8bit, tensor_table, n_tensors, N, lr, opt.beta1,
                                 opt.beta2, opt.eps, opt.weight_decay, grad_scale, step, stream, clip);
                break;
            case OptimizerKind::SGD:
                sgd_update(params_memory, master, g, state, tensor_table, n_tensors, N, lr, opt.momentum, 0.f,
                           opt.weight_decay, opt.nesterov, grad_scale, step, stream, clip);
                break;
            case OptimizerKind::Adafactor: {
                AdafactorConfig cfg = opt.adafactor;
                if (!cfg.relative_step) cfg.lr = lr;  // relative steps make their own step sizes
                cfg.weight_decay = opt.weight_decay;
                adafactor_update(params_memory, master, g, cfg.use_first_moment ? state + adafactor.second_moment_size
                                                                                : nullptr,
                                 state, opt_scratch, adafactor_table, (int)adafactor.tensors.size(), N, cfg, grad_scale,
                                 step, stream, clip);
                break;
            }
        }
    }

    // The gradient norm of the last update() (after the stream has been synchronized).
    float last_grad_norm() const { return std::sqrt(*norm_host); }

    // Host copy of the parameters in the compute precision, exactly as stored (a resumed run
    // continues from the same bits).
    std::vector<floatX> params_host() const {
        std::vector<floatX> p(num_parameters);
        cudaCheck(cudaMemcpy(p.data(), params_memory, num_parameters * sizeof(floatX), cudaMemcpyDeviceToHost));
        return p;
    }
    // The parameters as fp32 host values (the compute-precision values widened).
    std::vector<float> params_host_fp32() const {
        std::vector<floatX> p = params_host();
        std::vector<float> f(num_parameters);
        for (size_t i = 0; i < num_parameters; i++) f[i] = to_float(p[i]);
        return f;
    }

    // What a checkpoint saves of the optimizer: its kind, its state bytes (then `extra` bytes of the
    // model's own step state, copied from device memory: e.g. GPT-2's fp8 scaling states) and, in low
    // precision, the fp32 master weights.
    void optimizer_state_host(TrainState* s, const void* extra = nullptr, size_t extra_bytes = 0) const {
        s->optimizer = (int)opt.kind;
        s->num_params = num_parameters;
        s->optimizer_state.resize(opt_state_bytes + extra_bytes);
        if (opt_state_bytes)
            cudaCheck(cudaMemcpy(s->optimizer_state.data(), opt_state, opt_state_bytes, cudaMemcpyDeviceToHost));
        if (extra_bytes)
            cudaCheck(cudaMemcpy(s->optimizer_state.data() + opt_state_bytes, extra, extra_bytes,
                                 cudaMemcpyDeviceToHost));
        s->has_master = master != nullptr;
        s->master.resize(master ? num_parameters : 0);
        if (master)
            cudaCheck(cudaMemcpy(s->master.data(), master, num_parameters * sizeof(float), cudaMemcpyDeviceToHost));
    }
    // Restores what optimizer_state_host() saved (sizes checked by the caller).
    void set_optimizer_state(const TrainState& s, void* extra = nullptr, size_t extra_bytes = 0) {
        if (opt_state_bytes)
            cudaCheck(cudaMemcpy(opt_state, s.optimizer_state.data(), opt_state_bytes, cudaMemcpyHostToDevice));
        if (extra_bytes)
            cudaCheck(cudaMemcpy(extra, s.optimizer_state.data() + opt_state_bytes, extra_bytes,
                                 cudaMemcpyHostToDevice));
        if (master)
            cudaCheck(cudaMemcpy(master, s.master.data(), num_parameters * sizeof(float), cudaMemcpyHostToDevice));
    }

    void free_state() {
        for (void* p : {(void*)params_memory, (void*)grads_memory, (void*)master, opt_state, (void*)opt_scratch,
                        (void*)adafactor_table, (void*)tensor_table, norm_scratch, (void*)norm_out, (void*)clip_scale})
            if (p) cudaCheck(cudaFree(p));
        if (norm_host) cudaCheck(cudaFreeHost(norm_host));
    }
};
