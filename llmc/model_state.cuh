// llmc/model_state.cuh — a model's trainable state, shared by train_gpt2.cu and train_bert.cu:
// parameters and gradients in the compute precision, fp32 master weights, the optimizer (AdamW,
// AdamW with 8-bit moments, Adafactor, SGD) and its state, the global gradient norm and clipping,
// and the bytes a checkpoint saves of all this.
//
// A model describes its parameters once, as a list of tensors (ParamSpec: the shape of one matrix or
// vector, how many copies are stacked — L for per-layer tensors —, whether weight decay applies and
// when its gradient is final in the backward pass); everything here works on the one flat buffer
// those tensors live in, in that order. The model keeps its own named pointers into the buffers
// (TensorViews) and computes forward and backward; the update, the optimizer's state, data-parallel
// communication and the memory figures are the same code for every model.
//
// Data parallelism (several processes, llmc/distributed.h; partition in llmc/zero.h). Every rank
// holds all parameters. The gradients of a group of tensors (the layers' slices of layer l, the
// tensors before or after the layers) are communicated on the communication stream as soon as the
// backward pass has finished them (the model calls grads_final_*), so communication overlaps the
// rest of the backward pass:
//   ZeRO-0  all-reduce (mean) of the gradients; every rank updates everything (replicated state).
//   ZeRO-1  reduce-scatter: each rank receives the mean of its shard of every chunk, updates only its
//           shard (fp32 master weights and optimizer state exist for the shard only) and the updated
//           parameters are all-gathered. Gradients are still communicated on the last micro-step.
//   ZeRO-2  also the gradients are sharded: every micro-step reduce-scatters each group as it is
//           final and adds it into the shard's gradient accumulator, and the full-size gradient
//           buffer is replaced by one that holds the non-layer tensors and two layers' slices (the
//           one being computed, the one being communicated).
// A single process (or world 1) takes none of these paths: its arithmetic is the one-GPU code.
//
// Rank-local tensors (ParamSpec::rank_local; expert parallelism, where each rank holds other
// experts under the same names) must come last in the flat vector. They are never communicated:
// their gradients are final as the backward pass leaves them, each rank updates its own whole
// copy, the gradient norm adds every rank's share of them exactly once, and every rank saves its
// own optimizer state (the plan's world is then the ranks, at ZeRO-0 too). ZeRO-2 refuses them.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <type_traits>
#include <vector>

#include "adafactor.cuh"
#include "adamw.cuh"
#include "adamw8bit.cuh"
#include "checkpoint.h"
#include "cuda_common.h"
#include "global_norm.cuh"
#include "precision.cuh"
#include "distributed.h"
#include "sgd.cuh"
#include "zero.h"

// ----------------------------------------------------------------------------
// Describing the parameters

// One parameter tensor: `copies` stacked matrices or vectors of `shape` (copies = L for the
// per-layer tensors of llm.c's layout). Adafactor factors each copy's matrix on its own; the other
// optimizers only need the element count and the decay flag; data parallelism needs to know when
// the gradient is final (ready: PerLayer for the stacked tensors, copy l after layer l's backward).
struct ParamSpec {
    std::vector<size_t> shape;  // of one copy: {rows, cols} or {n}
    size_t copies = 1;
    bool decays = false;        // weight decay applies (matrices: embeddings and linear weights)
    GradReady ready = GradReady::AfterLayers;
    bool rank_local = false;    // each rank holds its own values (see the top): never communicated
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
    int layer_slots = 0;  // 0: a stacked tensor holds every layer; k: layer l lives in slice l % k (ZeRO-2 gradients)
    void point_into(floatX* base, const size_t sizes[N], int slots = 0) {
        layer_slots = slots;
        for (int i = 0; i < N; i++) {
            t[i] = base;
            base += sizes[i];
        }
    }
    // Copy l of a stacked tensor with per_layer elements per copy.
    floatX* layer(int i, int l, size_t per_layer) const {
        return t[i] + (size_t)(layer_slots ? l % layer_slots : l) * per_layer;
    }
};

// One allocation carved into regions (a model's activations, its decoding state): each region
// starts 256-byte aligned, as cudaMalloc's own allocations do, so that cuBLASLt and 128-bit loads
// see aligned rows in every one.
struct Region {
    void** ptr;    // where the region's address goes
    size_t bytes;
};
inline size_t region_span(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Bytes one allocation needs for all the regions.
inline size_t regions_bytes(const std::vector<Region>& regions) {
    size_t bytes = 0;
    for (const Region& r : regions) bytes += region_span(r.bytes);
    return bytes;
}

// Points every region into base (regions_bytes(regions) bytes), in order.
inline void carve_regions(void* base, const std::vector<Region>& regions) {
    char* p = static_cast<char*>(base);
    for (const Region& r : regions) {
        *r.ptr = p;
        p += region_span(r.bytes);
    }
}

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

// Recomputation trades compute for memory: instead of keeping an activation for every layer, keep
// one layer's worth and recompute it in the backward pass from what is kept (each trainer's
// activations say which tensors each level drops). Levels, each including the ones before it:
//   gelu   the MLP's GELU output -> recomputed from its input (kept)
//   ln     also the layernorm outputs that can be recomputed from kept inputs
//   layer  everything but each layer's input: the block's forward pass runs again in the backward
//          pass (gradient checkpointing, one checkpoint per layer)
// Recomputing runs the same kernels on the same inputs, so gradients are bit-identical to storing.
enum class Recompute { None, Gelu, LN, Layer };
inline const char* recompute_name(Recompute r) {
    static const char* names[] = {"none", "gelu", "ln", "layer"};
    return names[(int)r];
}

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
// CUDA kernels

// dst[i] += src[i] for n elements (ZeRO-2: one micro-step's reduced gradient piece into the shard's
// accumulator; fp32 add, one rounding to floatX, as the backward kernels accumulate).
template <class floatX>
__global__ void accumulate_kernel(floatX* dst, const floatX* src, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = from_float<floatX>(to_float(dst[i]) + to_float(src[i]));
}

// *a += *b (one thread): the replicated and the rank-local parts of a squared gradient norm.
__global__ void add_scalar_kernel(float* a, const float* b) { *a += *b; }

// ----------------------------------------------------------------------------
// Kernel launchers

template <class floatX>
void accumulate(floatX* dst, const floatX* src, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    const int block_size = 512;
    cudaCheck(launch_kernel(accumulate_kernel<floatX>, dim3((unsigned)CEIL_DIV(n, (size_t)block_size)),
                            dim3(block_size), 0, stream, dst, src, n));
}

// ----------------------------------------------------------------------------
// The state

template <class floatX>
struct ModelState {
    std::vector<ParamSpec> specs;
    size_t num_parameters = 0;        // N
    floatX* params_memory = nullptr;  // (N) in the compute precision, on every rank
    floatX* grads_memory = nullptr;   // (N) gradients; ZeRO-2: the compact buffer (grad_sizes)
    float* master = nullptr;          // fp32 master weights of what this rank updates (N, or S), low precision only
    OptimizerConfig opt;              // set before build_state()
    bool training = true;             // set before build_state(); false (a run of 0 steps: evaluate, sample,
                                      // export): no gradients, master weights or optimizer state at all
    void* opt_state = nullptr;        // the optimizer's state (opt_state_bytes), see allocate_optimizer()
    size_t opt_state_bytes = 0;
    float* opt_scratch = nullptr;     // Adafactor's per-step scratch (not state)
    AdamW8bitState adamw8bit{};       // views into opt_state
    AdafactorLayout adafactor;        // Adafactor's per-matrix table (host), also on the device:
    FactoredTensor* adafactor_table = nullptr;
    ParamTensor* tensor_table = nullptr;  // device: offset/size/decay of what the optimizer updates
    int num_table_entries = 0;
    void* norm_scratch = nullptr;
    float* norm_out = nullptr;        // device: squared global gradient norm, then the rank-local part's
    float* clip_scale = nullptr;      // device scalar: torch's clip factor, read by the optimizers
    float* norm_host = nullptr;       // pinned copy of *norm_out, read after the step's one sync
    MemoryAnatomy mem;                // the model adds its activations and other buffers
    cudaStream_t stream = 0;

    // ---- Data parallelism (see the top of this file). Set dist and zero before build_state().
    const Distributed* dist = nullptr;  // nullptr: one process
    int zero = 0;                       // ZeRO stage 0, 1 or 2
    ZeroPlan plan;                      // chunks and groups; its world is the ranks for ZeRO-1/2, else 1
    bool sync_grads = true;             // ZeRO-0/1: communicate in this backward pass (a step's last micro-step)
    floatX* shard_params = nullptr;     // (S) ZeRO-1/2: this rank's pieces of the parameters
    floatX* shard_grads = nullptr;      // (S) ZeRO-1/2: their reduced gradients (ZeRO-2: summed over micro-steps)
    std::vector<size_t> grad_sizes;     // elements of each tensor in grads_memory (ZeRO-2: 2 layers' slices)
    int grad_layer_slots = 0;           // ZeRO-2: the layer slices the gradient buffer holds (else 0: all)
    std::vector<cudaEvent_t> group_done;  // per group: its gradients are final (recorded on stream)
    cudaEvent_t slot_free[2] = {};      // ZeRO-2: the slot's last communication is over and it is zero again
    cudaEvent_t comm_done = nullptr;    // everything issued on the communication stream so far

    int world() const { return dist ? dist->world : 1; }
    int rank() const { return dist ? dist->rank : 0; }
    bool data_parallel() const { return world() > 1; }
    bool sharded() const { return zero >= 1 && world() > 1; }
    size_t local_begin = 0;             // flat offset of the first rank-local tensor (num_parameters: none)
    bool rank_local() const { return local_begin < num_parameters; }
    // Every rank keeps its own optimizer state: sharded, or holding rank-local tensors.
    bool per_rank_state() const { return data_parallel() && (sharded() || rank_local()); }
    size_t update_size() const { return sharded() ? plan.shard_size : num_parameters; }  // what the optimizer updates

    // Allocates parameters, gradients (zero) and the optimizer's state (opt) for the tensors in
    // specs_, and fills params_memory from the fp32 host values (num_parameters of them).
    void build_state(const std::vector<ParamSpec>& specs_, const std::vector<float>& host_params) {
        specs = specs_;
        num_parameters = 0;
        local_begin = SIZE_MAX;
        for (const ParamSpec& s : specs) {
            if (s.rank_local && local_begin == SIZE_MAX) local_begin = num_parameters;
            if (!s.rank_local && local_begin != SIZE_MAX)
                distributed_fatal("model state: the rank-local tensors must come last in the parameters");
            num_parameters += s.numel();
        }
        if (local_begin == SIZE_MAX) local_begin = num_parameters;
        if (host_params.size() != num_parameters) {  // a model's specs disagree with its own layout
            fprintf(stderr, "model state: %zu parameter values given, the tensors hold %zu\n", host_params.size(),
                    num_parameters);
            exit(EXIT_FAILURE);
        }
        if (zero < 0 || zero > 2) distributed_fatal("--zero must be 0, 1 or 2, got %d", zero);
        if (sharded() && opt.kind == OptimizerKind::Adafactor)
            distributed_fatal("--zero %d with adafactor: its factored statistics need whole matrices on one rank, "
                              "which an element-wise shard does not give (use --zero 0)", zero);
        if (zero == 2 && data_parallel() && rank_local())
            distributed_fatal("--zero 2 with expert parallelism: ZeRO-2 reduces every layer's gradient slices each "
                              "micro-step and has no place for rank-local experts (use --zero 0 or 1)");
        make_plan(per_rank_state() ? world() : 1, &plan);
        size_t N = num_parameters, S = update_size();
        cudaMallocCheck(&params_memory, N * sizeof(floatX));
        if (training) allocate_grads();
        float* staging;
        cudaMallocCheck(&staging, N * sizeof(float));
        cudaCheck(cudaMemcpy(staging, host_params.data(), N * sizeof(float), cudaMemcpyHostToDevice));
        cast(params_memory, (const float*)staging, N, stream);
        if (sharded()) {
            cudaMallocCheck(&shard_params, S * sizeof(floatX));
            cudaCheck(cudaMemset(shard_params, 0, S * sizeof(floatX)));  // padding stays zero
            extract_shard(plan, rank(), (const floatX*)params_memory, shard_params, stream);
        }
        if (training && !std::is_same<floatX, float>::value) {  // the fp32 values (of this rank's shard) become the master weights
            if (sharded()) {
                cudaMallocCheck(&master, S * sizeof(float));
                cudaCheck(cudaMemset(master, 0, S * sizeof(float)));
                extract_shard(plan, rank(), (const float*)staging, master, stream);
            } else {
                master = staging;
                staging = nullptr;
            }
        }
        cudaCheck(cudaStreamSynchronize(stream));
        if (staging) cudaCheck(cudaFree(staging));
        std::vector<ParamTensor> table;
        if (sharded()) {
            table = zero_shard_table<ParamTensor>(plan, rank());
        } else {
            size_t offset = 0;
            for (const ParamSpec& sp : specs) {
                table.push_back(ParamTensor{offset, sp.numel(), sp.decays ? 1 : 0});
                offset += sp.numel();
            }
        }
        num_table_entries = (int)table.size();
        cudaMallocCheck(&tensor_table, sizeof(ParamTensor) * std::max<size_t>(table.size(), 1));
        if (!table.empty())
            cudaCheck(cudaMemcpy(tensor_table, table.data(), sizeof(ParamTensor) * table.size(), cudaMemcpyHostToDevice));
        size_t other = 0;
        if (training) {
            other = allocate_optimizer(table) + global_norm_scratch_bytes(S) + 3 * sizeof(float);  // + norm_out, clip_scale
            cudaMallocCheck(&norm_scratch, global_norm_scratch_bytes(S));
            cudaMallocCheck(&norm_out, 2 * sizeof(float));
            cudaMallocCheck(&clip_scale, sizeof(float));
            cudaCheck(cudaMallocHost(&norm_host, sizeof(float)));
        }
        if (data_parallel()) {
            group_done.resize(plan.groups.size());
            for (cudaEvent_t& e : group_done) cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
            for (cudaEvent_t& e : slot_free) cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
            cudaCheck(cudaEventCreateWithFlags(&comm_done, cudaEventDisableTiming));
        }
        mem.weights = (N + (sharded() ? S : 0)) * sizeof(floatX);
        mem.master = master ? S * sizeof(float) : 0;
        mem.grads = training ? (grad_elements() + (sharded() ? S : 0)) * sizeof(floatX) : 0;
        mem.optimizer = opt_state_bytes;
        mem.other = sizeof(ParamTensor) * table.size() + other;
    }

    // The partition of the parameters over world ranks (align 8: 16-byte vectors of bf16 stay aligned).
    void make_plan(int plan_world, ZeroPlan* out) const {
        std::vector<ZeroTensor> tensors;
        int L = 0;
        for (const ParamSpec& s : specs) {
            tensors.push_back(ZeroTensor{s.numel(), s.ready, s.decays ? 1 : 0, s.rank_local});
            if (s.ready == GradReady::PerLayer) L = std::max(L, (int)s.copies);
        }
        std::string err;
        if (!zero_plan(out, tensors, L, plan_world, 8, &err)) distributed_fatal("%s", err.c_str());
    }

    // Elements of the gradient buffer: N, or with ZeRO-2 the non-layer tensors whole and two slices
    // of each per-layer tensor (layer l uses slice l % 2).
    size_t grad_elements() const {
        size_t n = 0;
        for (size_t g : grad_sizes) n += g;
        return n;
    }
    void allocate_grads() {
        grad_layer_slots = zero == 2 && data_parallel() ? 2 : 0;
        grad_sizes.clear();
        for (const ParamSpec& s : specs) {
            size_t n = s.numel();
            if (grad_layer_slots && s.ready == GradReady::PerLayer)
                n = n / s.copies * std::min<size_t>(s.copies, grad_layer_slots);
            grad_sizes.push_back(n);
        }
        cudaMallocCheck(&grads_memory, grad_elements() * sizeof(floatX));
        cudaCheck(cudaMemset(grads_memory, 0, grad_elements() * sizeof(floatX)));
        if (sharded()) {
            cudaMallocCheck(&shard_grads, update_size() * sizeof(floatX));
            cudaCheck(cudaMemset(shard_grads, 0, update_size() * sizeof(floatX)));  // padding stays zero
        }
    }

    // Zeroes the gradients at the start of a step (micro-steps then add up).
    void zero_grads() {
        if (data_parallel()) stream_wait(stream, dist->comm_stream, comm_done);  // the last step's reads are over
        cudaCheck(cudaMemsetAsync(grads_memory, 0, grad_elements() * sizeof(floatX), stream));
        if (shard_grads) cudaCheck(cudaMemsetAsync(shard_grads, 0, update_size() * sizeof(floatX), stream));
    }

    // ---- CUDA graphs of a training micro-step (the trainers' --cuda-graphs).
    // A micro-step launches the same work with the same arguments every time its batch has the same
    // shape (what `key` encodes: whether gradients are communicated, the batch's width, ...) and its
    // loss has the same weight dloss; its batch is read from the fixed device buffers the upload
    // filled. So it is captured once per key into a graph and afterwards replayed with one launch,
    // instead of hundreds of kernel launches the host would issue one by one. dloss is what the work
    // bakes into its launches: a new value (GPT-2: an fp16 loss scale that changed) drops every
    // graph; a trainer that reads the weight from device memory passes a constant.
    // Nothing the work does may allocate or synchronize (CUDA refuses both while capturing): the
    // trainer runs its first step eagerly, which allocates, plans the GEMMs and primes fp8; a shape
    // seen later is captured on first use (a GEMM plan for it is host work only), or with
    // eager_first_use on its second (the first runs eagerly: --gemm-autotune times a new GEMM shape,
    // which a capture does not allow). The stream must not be the legacy stream, which cannot capture.
    bool eager_first_use = false;  // run a new key eagerly once, capture it at its second use
    template <class Work>
    void graphed_micro_step(uint64_t key, float dloss, Work&& work) {
        if (dloss != micro_graphs_dloss) destroy_micro_graphs();
        micro_graphs_dloss = dloss;
        if (!micro_graphs.count(key) && eager_first_use && eager_keys.insert(key).second) {
            work();
            return;
        }
        cudaGraphExec_t& exec = micro_graphs[key];
        if (!exec) {
            cudaCheck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
            work();
            // Data parallel: the communication stream forked into the capture through the gradient
            // events (communicate()); a capture ends only once it has joined back.
            cudaStreamCaptureStatus comm = cudaStreamCaptureStatusNone;
            if (data_parallel()) cudaCheck(cudaStreamIsCapturing(dist->comm_stream, &comm));
            if (comm == cudaStreamCaptureStatusActive) stream_wait(stream, dist->comm_stream, comm_done);
            cudaGraph_t graph;
            cudaCheck(cudaStreamEndCapture(stream, &graph));
            cudaCheck(cudaGraphInstantiate(&exec, graph, 0));
            cudaCheck(cudaGraphDestroy(graph));
        }
        cudaCheck(cudaGraphLaunch(exec, stream));
    }
    void destroy_micro_graphs() {
        for (auto& [key, exec] : micro_graphs) cudaCheck(cudaGraphExecDestroy(exec));
        micro_graphs.clear();
    }
    size_t num_micro_graphs() const { return micro_graphs.size(); }
    // Why a micro-step cannot be captured with this state, or nullptr: ZeRO-2, whose micro-step
    // waits on events of the previous micro-step's communication, outside the capture (CUDA refuses
    // such a dependency). Every other technique captures.
    const char* graphs_unsupported() const {
        if (grad_layer_slots) return "--zero 2: each micro-step waits for the previous one's communication";
        return nullptr;
    }

    // ---- Hooks the model's backward pass calls (no-ops for one process).
    // Where chunk c lives in grads_memory (ZeRO-2 maps layer l to slice l % 2).
    floatX* grad_chunk(const ZeroChunk& c) const {
        floatX* t = grads_memory;
        for (int i = 0; i < c.tensor; i++) t += grad_sizes[i];
        int slice = c.layer < 0 ? 0 : grad_layer_slots ? c.layer % grad_layer_slots : c.layer;
        return t + (size_t)slice * c.n;
    }
    // Before anything writes layer l's gradients (ZeRO-2): its gradient slice must be free and zero
    // again. The backward pass calls it before the first write, which may come from the layer above.
    void grads_begin_layer(int l) {
        if (grad_layer_slots && l + grad_layer_slots < plan.num_layers)
            cudaCheck(cudaStreamWaitEvent(stream, slot_free[l % grad_layer_slots], 0));
    }
    // Before a backward pass (ZeRO-2): the previous micro-step's communication has read the buffer.
    void grads_begin_backward() {
        if (grad_layer_slots) stream_wait(stream, dist->comm_stream, comm_done);
    }
    void grads_final_layer(int l) { communicate(plan.group_of_layer[l]); }
    void grads_final_before() { communicate(plan.group_before); }
    void grads_final_after() { communicate(plan.group_after); }

    // Group g's gradients are final on the compute stream: the communication stream waits for them
    // and reduces them (ZeRO-0: all-reduce in place; ZeRO-1: reduce-scatter into the shard; ZeRO-2:
    // reduce-scatter in place, add this rank's piece to the shard, zero the slice for its next use).
    void communicate(int g) {
        if (g < 0 || !data_parallel() || (zero < 2 && !sync_grads)) return;
        const Distributed& d = *dist;
        cudaStream_t cs = d.comm_stream;
        stream_wait(cs, stream, group_done[g]);
        const ZeroGroup& grp = plan.groups[g];
        if (zero == 0) {
            std::vector<DeviceSpan<floatX>> spans;
            for (int i = grp.begin; i < grp.end; i++)
                if (!plan.chunks[i].rank_local) spans.push_back({grad_chunk(plan.chunks[i]), plan.chunks[i].n});
            all_reduce_chunks(d, spans, ReduceOp::Avg, cs);
        } else {
            std::vector<ShardedChunk<floatX>> chunks;
            for (int i = grp.begin; i < grp.end; i++) {
                const ZeroChunk& c = plan.chunks[i];
                floatX* full = grad_chunk(c);
                ZeroRange mine = zero_piece(c, rank());
                // ZeRO-1: into the shard; ZeRO-2: in place (the piece's own place in the chunk), then added
                chunks.push_back(
                    {full, c.n, zero == 1 ? shard_grads + c.shard_offset : full + mine.begin, c.s, c.rank_local});
            }
            reduce_scatter_chunks(d, chunks, ReduceOp::Avg, cs);
            if (zero == 2) {
                for (int i = grp.begin; i < grp.end; i++) {
                    const ZeroChunk& c = plan.chunks[i];
                    ZeroRange mine = zero_piece(c, rank());
                    accumulate(shard_grads + c.shard_offset, (const floatX*)grad_chunk(c) + mine.begin, mine.size(), cs);
                    cudaCheck(cudaMemsetAsync(grad_chunk(c), 0, c.n * sizeof(floatX), cs));
                }
                if (grp.layer >= 0) cudaCheck(cudaEventRecord(slot_free[grp.layer % grad_layer_slots], cs));
            }
        }
        cudaCheck(cudaEventRecord(comm_done, cs));
    }

    // Allocates the optimizer's state for the entries of table (zero: the state before the first
    // step) in opt_state; returns the bytes of the other buffers it needs (tables, scratch).
    size_t allocate_optimizer(const std::vector<ParamTensor>& table) {
        size_t n = update_size(), other = 0;
        switch (opt.kind) {
            case OptimizerKind::AdamW: opt_state_bytes = 2 * n * sizeof(float); break;  // m, v
            case OptimizerKind::SGD: opt_state_bytes = opt.momentum > 0 ? n * sizeof(float) : 0; break;
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
                                                   (opt.adafactor.use_first_moment ? n : 0));
                size_t table_bytes = sizeof(FactoredTensor) * adafactor.tensors.size();
                cudaMallocCheck(&adafactor_table, table_bytes);
                cudaCheck(cudaMemcpy(adafactor_table, adafactor.tensors.data(), table_bytes, cudaMemcpyHostToDevice));
                cudaMallocCheck(&opt_scratch, adafactor.scratch_size * sizeof(float));
                other = table_bytes + adafactor.scratch_size * sizeof(float);
                break;
            }
        }
        if (opt_state_bytes) {
            cudaMallocCheck(&opt_state, opt_state_bytes);
            cudaCheck(cudaMemset(opt_state, 0, opt_state_bytes));
        }
        if (opt.kind == OptimizerKind::AdamW8bit) adamw8bit = adamw8bit_init(opt_state, adamw8bit_plan(table));
        return other;
    }

    // The gradients the optimizer reads (after every group's communication): the shard's, or all.
    const floatX* update_grads() const { return sharded() ? shard_grads : grads_memory; }

    // The squared global gradient norm into norm_out (and, async, norm_host): over this rank's shard
    // then summed over the ranks (padding is zero), or over all gradients (identical on every rank
    // after ZeRO-0's all-reduce) — with rank-local tensors at ZeRO-0, the replicated part's plus the
    // rank-local parts summed over the ranks, so every rank's own experts count once.
    void grad_norm_squared() {
        if (data_parallel()) stream_wait(stream, dist->comm_stream, comm_done);  // every group has arrived
        if (data_parallel() && !sharded() && rank_local()) {
            global_norm_squared(norm_out, norm_scratch, update_grads(), local_begin, stream);
            global_norm_squared(norm_out + 1, norm_scratch, update_grads() + local_begin, num_parameters - local_begin,
                                stream);
            all_reduce_chunks<float>(*dist, {{norm_out + 1, 1}}, ReduceOp::Sum, stream);
            cudaCheck(launch_kernel(add_scalar_kernel, dim3(1), dim3(1), 0, stream, norm_out, (const float*)norm_out + 1));
        } else {
            global_norm_squared(norm_out, norm_scratch, update_grads(), update_size(), stream);
        }
        if (sharded()) all_reduce_chunks<float>(*dist, {{norm_out, 1}}, ReduceOp::Sum, stream);
        cudaCheck(cudaMemcpyAsync(norm_host, norm_out, sizeof(float), cudaMemcpyDeviceToHost, stream));
    }

    // One optimizer step: the global gradient norm, torch's clip factor (max_norm 0: no clipping)
    // and the optimizer (opt) over all parameters, without a host sync — the norm reaches the host
    // through norm_host, valid after the stream's next synchronization (see last_grad_norm()).
    // step is the 1-based count of updates (bias correction, Adafactor's schedule, SGD's first step).
    void update(float lr, float max_norm, int step) {
        grad_norm_squared();
        if (max_norm > 0) grad_clip_scale(clip_scale, norm_out, max_norm, stream);
        apply_optimizer(lr, step, 1.f, max_norm > 0 ? (const float*)clip_scale : nullptr);
    }

    // The update with dynamic loss scaling (fp16), as torch.cuda.amp.GradScaler does it: the
    // gradients hold loss_scale times their value; if any is inf or NaN (the squared norm then is)
    // the step is skipped — nothing is touched — and false returned. Otherwise the optimizer gets
    // the gradients unscaled and clipped by the unscaled norm, as torch's unscale_ then
    // clip_grad_norm_: grad * (clip / loss_scale) in one rounding equals torch's two, since the
    // scale is a power of two. This waits for the norm on the host, as GradScaler.step does (every
    // rank sees the same norm, so every rank takes the same decision).
    bool update_scaled(float lr, float max_norm, int step, float loss_scale) {
        grad_norm_squared();
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
    // gradient first. Sharded: updates this rank's shard, then every rank gathers the parameters.
    void apply_optimizer(float lr, int step, float grad_scale, const float* grad_scale_device) {
        const float* clip = grad_scale_device;
        const floatX* g = update_grads();
        floatX* p = sharded() ? shard_params : params_memory;
        size_t n = update_size();
        int entries = num_table_entries;
        float* state = (float*)opt_state;
        switch (opt.kind) {
            case OptimizerKind::AdamW:
                adamw_update(p, master, g, state, state + n, tensor_table, entries, n, lr, opt.beta1, opt.beta2,
                             opt.eps, opt.weight_decay, grad_scale, step, stream, clip);
                break;
            case OptimizerKind::AdamW8bit:
                adamw8bit_update(p, master, g, adamw8bit, tensor_table, entries, n, lr, opt.beta1, opt.beta2, opt.eps,
                                 opt.weight_decay, grad_scale, step, stream, clip);
                break;
            case OptimizerKind::SGD:
                sgd_update(p, master, g, state, tensor_table, entries, n, lr, opt.momentum, 0.f, opt.weight_decay,
                           opt.nesterov, grad_scale, step, stream, clip);
                break;
            case OptimizerKind::Adafactor: {  // never sharded (refused in build_state)
                AdafactorConfig cfg = opt.adafactor;
                if (!cfg.relative_step) cfg.lr = lr;  // relative steps make their own step sizes
                cfg.weight_decay = opt.weight_decay;
                adafactor_update(p, master, g, cfg.use_first_moment ? state + adafactor.second_moment_size : nullptr,
                                 state, opt_scratch, adafactor_table, (int)adafactor.tensors.size(), n, cfg, grad_scale,
                                 step, stream, clip);
                break;
            }
        }
        if (sharded())
            for (int gi = 0; gi < (int)plan.groups.size(); gi++)
                all_gather_chunks(*dist, sharded_chunks(plan, gi, params_memory, shard_params), stream);
    }

    // The fp32 master weights of every parameter this rank holds (device, num_parameters floats; low
    // precision only): `master` itself, or when it is sharded (ZeRO-1/2) the shards of every rank
    // gathered into `full` (num_parameters floats) — a collective, which every rank must call.
    const float* master_of_all(float* full) const {
        if (!sharded()) return master;
        for (int gi = 0; gi < (int)plan.groups.size(); gi++)
            all_gather_chunks(*dist, sharded_chunks(plan, gi, full, master), stream);
        return full;
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
    // precision, the fp32 master weights — of this rank's shard when sharded (s->world and s->rank
    // then say which: the plan's world, 1 when every rank holds everything).
    void optimizer_state_host(TrainState* s, const void* extra = nullptr, size_t extra_bytes = 0) const {
        size_t n = update_size();
        s->optimizer = (int)opt.kind;
        s->world = plan.world;
        s->rank = plan.world > 1 ? rank() : 0;
        s->shard_align = (int)plan.align;
        s->ranks = world();
        s->num_params = n;
        s->optimizer_state.resize(opt_state_bytes + extra_bytes);
        if (opt_state_bytes)
            cudaCheck(cudaMemcpy(s->optimizer_state.data(), opt_state, opt_state_bytes, cudaMemcpyDeviceToHost));
        if (extra_bytes)
            cudaCheck(cudaMemcpy(s->optimizer_state.data() + opt_state_bytes, extra, extra_bytes,
                                 cudaMemcpyDeviceToHost));
        s->has_master = master != nullptr;
        s->master.resize(master ? n : 0);
        if (master) cudaCheck(cudaMemcpy(s->master.data(), master, n * sizeof(float), cudaMemcpyDeviceToHost));
    }
    // Restores what optimizer_state_host() saved by this rank under the same partition (sizes
    // checked by the caller).
    void set_optimizer_state(const TrainState& s, void* extra = nullptr, size_t extra_bytes = 0) {
        if (opt_state_bytes)
            cudaCheck(cudaMemcpy(opt_state, s.optimizer_state.data(), opt_state_bytes, cudaMemcpyHostToDevice));
        if (extra_bytes)
            cudaCheck(cudaMemcpy(extra, s.optimizer_state.data() + opt_state_bytes, extra_bytes,
                                 cudaMemcpyHostToDevice));
        if (master) cudaCheck(cudaMemcpy(master, s.master.data(), update_size() * sizeof(float), cudaMemcpyHostToDevice));
    }

    // Whether states saved under another partition (another world size or ZeRO stage) can be
    // re-sharded into this one: the element-wise states can (AdamW's m and v, SGD's momentum, the
    // master weights); 8-bit AdamW's blocks and Adafactor's factored statistics follow the layout.
    bool can_reshard() const { return opt.kind == OptimizerKind::AdamW || opt.kind == OptimizerKind::SGD; }

    // Restores the state from the shards `old` saved under another partition (old[r] from rank r
    // of old[0].world; one state when it was not sharded): every element this rank now updates is
    // copied from the old rank that held it (llmc/zero.h's re-sharding map). `extra` bytes (the
    // model's own, replicated) come from old[0]. Call only when can_reshard().
    void set_optimizer_state_resharded(const std::vector<TrainState>& old, void* extra = nullptr,
                                       size_t extra_bytes = 0) {
        ZeroPlan old_plan;
        make_plan(old[0].world, &old_plan);
        if (old[0].shard_align > 0 && (size_t)old[0].shard_align != old_plan.align)
            distributed_fatal("the saved shards use alignment %d, this build %zu", old[0].shard_align, old_plan.align);
        for (const TrainState& o : old)
            if (old_plan.world > 1 && o.num_params != old_plan.shard_size)
                distributed_fatal("the saved optimizer state holds %llu values per rank where this model over %d ranks "
                                  "has %zu (saved with other options, such as --expert-parallel? resume with the "
                                  "run's own ranks and options)", (unsigned long long)o.num_params, old_plan.world,
                                  old_plan.shard_size);
        std::vector<ZeroCopy> copies;
        std::string err;
        if (!zero_reshard(old_plan, plan, plan.world > 1 ? rank() : 0, &copies, &err)) distributed_fatal("%s", err.c_str());
        size_t n = update_size(), n_old = old_plan.shard_size;
        int arrays = (int)(opt_state_bytes / (n * sizeof(float)));  // AdamW: m, v; SGD: momentum (or none)
        std::vector<float> state(arrays * n, 0.f), mst(master ? n : 0, 0.f);
        for (const ZeroCopy& c : copies) {
            const TrainState& src = old[c.src_rank];
            const float* src_state = (const float*)src.optimizer_state.data();
            for (int a = 0; a < arrays; a++)
                std::copy_n(src_state + a * n_old + c.src_offset, c.count, state.data() + a * n + c.dst_offset);
            if (master) std::copy_n(src.master.data() + c.src_offset, c.count, mst.data() + c.dst_offset);
        }
        if (opt_state_bytes)
            cudaCheck(cudaMemcpy(opt_state, state.data(), opt_state_bytes, cudaMemcpyHostToDevice));
        if (extra_bytes)
            cudaCheck(cudaMemcpy(extra, old[0].optimizer_state.data() + arrays * n_old * sizeof(float), extra_bytes,
                                 cudaMemcpyHostToDevice));
        if (master) cudaCheck(cudaMemcpy(master, mst.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    }

    // Mean of n fp32 values on the device (a model's per-token or per-row losses), summed in double on
    // the host in order (syncs with the device).
    float device_mean(const float* values, size_t n) {
        std::vector<float> host(n);
        cudaCheck(cudaMemcpyAsync(host.data(), values, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
        cudaCheck(cudaStreamSynchronize(stream));
        double s = 0;
        for (float x : host) s += x;
        return (float)(s / n);
    }

    void free_state() {
        for (void* p : {(void*)params_memory, (void*)grads_memory, (void*)master, opt_state, (void*)opt_scratch,
                        (void*)adafactor_table, (void*)tensor_table, norm_scratch, (void*)norm_out, (void*)clip_scale,
                        (void*)shard_params, (void*)shard_grads})
            if (p) cudaCheck(cudaFree(p));
        if (norm_host) cudaCheck(cudaFreeHost(norm_host));
        for (cudaEvent_t e : group_done) cudaCheck(cudaEventDestroy(e));
        for (cudaEvent_t e : slot_free)
            if (e) cudaCheck(cudaEventDestroy(e));
        if (comm_done) cudaCheck(cudaEventDestroy(comm_done));
        destroy_micro_graphs();
    }

  private:
    std::map<uint64_t, cudaGraphExec_t> micro_graphs;  // graphed_micro_step's, by key
    float micro_graphs_dloss = 0.f;
    std::set<uint64_t> eager_keys;  // the keys graphed_micro_step has run eagerly (eager_first_use)
};
