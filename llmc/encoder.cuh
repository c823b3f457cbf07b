// llmc/encoder.cuh — the embeddings: out = wte[token] + wpe[position] (+ wtt[token type] for BERT),
// and its deterministic backward into dwte, dwpe and dwtt.
//
// Why the backward needs a plan. dwte[v] is the sum of dout[b,t] over every position whose token
// is v. Scattering with float atomics would let the schedule decide the order of that sum, and so
// its rounding: two runs would differ in the last bits. The token ids are on the host anyway (the
// dataloader produced them), so the host groups the positions by destination row before the
// backward runs (llm.c does the same; the lists are in llmc/encoder_plan.h), and the GPU sums every
// group in a fixed order:
//   - a group is cut into segments of at most 32 positions, one per lane, so that a warp loads a
//     segment's position list in one instruction and then sums the segment's dout rows in order;
//   - a group of one segment (most tokens; every wpe row when B <= 32) is added into its row by
//     that warp directly. A larger group (frequent tokens; the token types, which are whole-batch
//     sums) would serialize on one warp, so its segments run in parallel and write fp32 partial
//     rows, and a second kernel adds each group's partials in segment order into its row.
// Every sum therefore has one order whatever the schedule: the result is bit-identical run to
// run, and the work is spread over thousands of warps at B*T = 8192, C = 768.
//
// The launches do not depend on the batch: the plan's lengths travel to the device with the lists,
// and both kernels loop over what the device says with a grid fixed by the shape (B, T, C). So the
// backward can be captured once in a CUDA graph and replayed for every batch of that shape, after
// an upload of the batch's plan into the same buffers.
#pragma once
#include "cuda_common.h"
#include "encoder_plan.h"
#include "precision.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <vector>

// The storage type is called floatX here (as in llm.c), because T is the sequence length.

// One step's plan on the device: the lists (built here from the batch's ids, or brought ready-made
// by the data loader's thread) uploaded into buffers sized for the worst case of (B, T, C) once,
// which only grow if B*T or C grows. Upload it where the batch is copied to the device, from pinned
// staging memory: then the host never waits for the stream and can prepare the next micro-batch
// while the GPU runs this one.
struct EncoderBackwardPlan {
    int B = 0, T = 0, C = 0;  // of the last upload
    bool has_types = false;
    EncoderPlanLists lists;   // the lists encoder_backward_plan builds from ids
    int counts[2] = {};       // {segments, groups}: the host side of d_counts' upload
    int sm_count = 0;         // the device's, for the kernels' fixed grids
    // Device copies of the lists' lengths and the three lists, and the fp32 partial rows.
    int* d_counts = nullptr;  // {segments, groups}: the kernels' loop bounds
    int* d_positions = nullptr;
    EncoderSegment* d_segments = nullptr;
    EncoderGroup* d_groups = nullptr;
    float* d_partials = nullptr;  // (partial rows, C)
    size_t capacity_positions = 0, capacity_segments = 0, capacity_groups = 0, capacity_partials = 0;  // elements
    // Device bytes its buffers hold (a model's memory report counts them).
    size_t device_bytes() const {
        return (d_counts ? 2 * sizeof(int) : 0) + capacity_positions * sizeof(int) +
               capacity_segments * sizeof(EncoderSegment) + capacity_groups * sizeof(EncoderGroup) +
               capacity_partials * sizeof(float);
    }
};

// ----------------------------------------------------------------------------
// CUDA kernels

// Loads VEC consecutive values at p as floats: whole 128-bit packs when VEC is a multiple of the
// pack width (the caller guarantees the alignment then), single elements otherwise.
template <int VEC, class S>
__device__ inline void encoder_load(float* out, const S* p) {
    constexpr int P = Packed128<S>::size;
    if constexpr (VEC % P == 0) {
        for (int j = 0; j < VEC; j += P) {
            Packed128<S> pack = load128(p + j);
            for (int k = 0; k < P; k++) out[j + k] = to_float(pack[k]);
        }
    } else {
        for (int k = 0; k < VEC; k++) out[k] = to_float(p[k]);
    }
}

// Stores VEC floats at p, each rounded once to S; the same packing as encoder_load.
template <int VEC, class S>
__device__ inline void encoder_store(S* p, const float* in) {
    constexpr int P = Packed128<S>::size;
    if constexpr (VEC % P == 0) {
        for (int j = 0; j < VEC; j += P) {
            Packed128<S> pack;
            for (int k = 0; k < P; k++) pack[k] = from_float<S>(in[j + k]);
            store128(p + j, pack);
        }
    } else {
        for (int k = 0; k < VEC; k++) p[k] = from_float<S>(in[k]);
    }
}

// One thread per VEC channels of one position: sums the three embedding rows in fp32 and rounds
// once. C % VEC == 0.
template <class floatX, int VEC>
__global__ void encoder_forward_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                                       const int* token_types, const floatX* wtt, int BT, int T, int C) {
    int packs_per_row = C / VEC;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * packs_per_row) return;
    int bt = (int)(idx / packs_per_row);
    int c = (int)(idx % packs_per_row) * VEC;
    int t = bt % T;
    float sum[VEC], x[VEC];
    encoder_load<VEC>(sum, wte + (size_t)inp[bt] * C + c);
    encoder_load<VEC>(x, wpe + (size_t)t * C + c);
    for (int k = 0; k < VEC; k++) sum[k] += x[k];
    if (wtt != nullptr) {
        encoder_load<VEC>(x, wtt + (size_t)token_types[bt] * C + c);
        for (int k = 0; k < VEC; k++) sum[k] += x[k];
    }
    encoder_store<VEC>(out + (size_t)bt * C + c, sum);
}

// The destination table of a segment or group.
template <class floatX>
__device__ inline floatX* encoder_table(int table, floatX* dwte, floatX* dwpe, floatX* dwtt) {
    return table == ENCODER_WTE ? dwte : (table == ENCODER_WPE ? dwpe : dwtt);
}

// A warp per (segment, chunk of 32*VEC channels), each lane owning VEC channels, the warps of the
// grid looping over the counts[0] segments' items: adds the segment's dout rows in position order
// to the destination row's old value (a segment that is a whole group) or to zero (written as an
// fp32 partial row). The lanes hold the segment's positions and pass them round with a shuffle, so
// each step of the inner loop is a single 16-byte load per lane. C % VEC == 0.
template <class floatX, int VEC>
__global__ void encoder_segment_sum_kernel(floatX* dwte, floatX* dwpe, floatX* dwtt, float* partials,
                                           const EncoderSegment* segments, const int* counts,
                                           const int* positions, const floatX* dout, int C) {
    constexpr int CHUNK = 32 * VEC;
    int chunks = CEIL_DIV(C, CHUNK);
    size_t items = (size_t)counts[0] * chunks;
    size_t warps = (size_t)gridDim.x * blockDim.x / 32;
    int lane = threadIdx.x % 32;
    // item is the same for a whole warp, so its lanes run the shuffles together
    for (size_t item = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; item < items; item += warps) {
        EncoderSegment seg = segments[item / chunks];
        int c = (int)(item % chunks) * CHUNK + lane * VEC;
        bool active = c < C;  // the last chunk of a row can reach past C

        int my_position = lane < seg.count ? positions[seg.start + lane] : 0;
        floatX* dst = encoder_table(seg.table, dwte, dwpe, dwtt) + (size_t)seg.row * C + c;
        float sum[VEC] = {};
        if (active && seg.partial < 0) encoder_load<VEC>(sum, dst);  // early: its latency hides behind the loop
        for (int i = 0; i < seg.count; i++) {
            int bt = __shfl_sync(0xffffffffu, my_position, i);  // every lane takes part, active or not
            if (active) {
                float x[VEC];
                encoder_load<VEC>(x, dout + (size_t)bt * C + c);
                for (int k = 0; k < VEC; k++) sum[k] += x[k];
            }
        }
        if (!active) continue;
        if (seg.partial >= 0) encoder_store<VEC>(partials + (size_t)seg.partial * C + c, sum);
        else encoder_store<VEC>(dst, sum);
    }
}

// A thread per channel of a group, the blocks along x looping over the counts[1] groups: adds the
// group's partial rows in segment order into its row.
template <class floatX>
__global__ void encoder_group_sum_kernel(floatX* dwte, floatX* dwpe, floatX* dwtt, const float* partials,
                                         const EncoderGroup* groups, const int* counts, int C) {
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int gi = blockIdx.x; gi < counts[1]; gi += gridDim.x) {
        EncoderGroup g = groups[gi];
        float sum = 0.f;
        for (int p = 0; p < g.num_partials; p++) sum += partials[(size_t)(g.first_partial + p) * C + c];
        floatX* dst = encoder_table(g.table, dwte, dwpe, dwtt) + (size_t)g.row * C + c;
        *dst = from_float<floatX>(to_float(*dst) + sum);
    }
}

// ----------------------------------------------------------------------------
// kernel launchers

// out (B,T,C) = wte[inp[b,t]] + wpe[t] (+ wtt[token_types[b,t]]), summed in fp32, rounded once.
// inp (B,T) are token ids in [0, V) and token_types (B,T) ids in [0, n_types): not checked here
// (a GPU cannot report nicely from every thread); the dataloader validates the tokens it reads,
// and encoder_backward_plan checks every id of a training step on the host.
// wte (V or Vp, C), wpe (maxT >= T, C), wtt (n_types, C); token_types and wtt both set or both null.
template <class floatX>
void encoder_forward(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, const int* token_types,
                     const floatX* wtt, int B, int T, int C, cudaStream_t stream) {
    if (B <= 0 || T <= 0 || C <= 0) {
        fprintf(stderr, "encoder_forward: B=%d, T=%d, C=%d must all be positive\n", B, T, C);
        exit(EXIT_FAILURE);
    }
    if ((token_types == nullptr) != (wtt == nullptr)) {
        fprintf(stderr, "encoder_forward: token_types and wtt must be given together (BERT) or both be null (GPT-2)\n");
        exit(EXIT_FAILURE);
    }
    const int block_size = 256;
    size_t BT = (size_t)B * T;
    if (rows_pack128<floatX>(C, {out, wte, wpe, wtt})) {
        constexpr int VEC = Packed128<floatX>::size;
        int grid = (int)CEIL_DIV(BT * (C / VEC), (size_t)block_size);
        cudaCheck(launch_kernel(encoder_forward_kernel<floatX, VEC>, dim3(grid), dim3(block_size), 0, stream, out,
                                inp, wte, wpe, token_types, wtt, (int)BT, T, C));
    } else {
        int grid = (int)CEIL_DIV(BT * C, (size_t)block_size);
        cudaCheck(launch_kernel(encoder_forward_kernel<floatX, 1>, dim3(grid), dim3(block_size), 0, stream, out, inp,
                                wte, wpe, token_types, wtt, (int)BT, T, C));
    }
}

// Bytes of the plan's device buffers for batches of shape (B, T) and C channels.
inline size_t encoder_plan_device_bytes(int B, int T, int C, bool has_types) {
    EncoderPlanCapacity cap = encoder_plan_capacity(B, T, C, has_types);
    return 2 * sizeof(int) + cap.positions * sizeof(int) + cap.segments * sizeof(EncoderSegment) +
           cap.groups * sizeof(EncoderGroup) + cap.partials * sizeof(float);
}

// Bytes of pinned host memory encoder_backward_plan needs to upload a plan of (B, T) without making
// the host wait: the two counts and the three lists at their worst-case lengths.
inline size_t encoder_plan_staging_bytes(int B, int T, bool has_types) {
    EncoderPlanCapacity cap = encoder_plan_capacity(B, T, 1, has_types);
    return 2 * sizeof(int) + cap.positions * sizeof(int) + cap.segments * sizeof(EncoderSegment) +
           cap.groups * sizeof(EncoderGroup);
}

// Grows a device buffer to hold at least `need` elements (contents are not kept).
template <class X>
inline void encoder_plan_reserve(X*& ptr, size_t& capacity, size_t need) {
    if (need <= capacity) return;
    cudaCheck(cudaFree(ptr));  // synchronizes: no kernel of an earlier step still reads it
    cudaMallocCheck(&ptr, need * sizeof(X));
    capacity = need;
}

// Uploads one step's lists (built by encoder_plan_build, here or on a data loader's thread) for
// C channels on `stream`, ordered after the previous step's encoder_backward on the same stream.
// The upload reads from `staging` when given — pinned host memory of encoder_plan_staging_bytes(B,
// T, types) that must stay untouched until the stream has run the copies (e.g. one buffer per
// micro-step, reused after the step) — which never makes the host wait; without it, from the
// lists' own pageable vectors, which CUDA may stage by waiting for the stream. Sizes the device
// buffers for the worst case of (B, T, C).
inline void encoder_backward_plan_upload(EncoderBackwardPlan* plan_ptr, const EncoderPlanLists& lists, int C,
                                         cudaStream_t stream, void* staging = nullptr) {
    EncoderBackwardPlan& plan = *plan_ptr;
    if (C <= 0 || lists.B <= 0) {
        fprintf(stderr, "encoder_backward_plan: C=%d must be positive and the lists built (B=%d)\n", C, lists.B);
        exit(EXIT_FAILURE);
    }
    plan.B = lists.B;
    plan.T = lists.T;
    plan.C = C;
    plan.has_types = lists.has_types;
    plan.counts[0] = (int)lists.segments.size();
    plan.counts[1] = (int)lists.groups.size();
    if (plan.sm_count == 0) {
        int device;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaDeviceGetAttribute(&plan.sm_count, cudaDevAttrMultiProcessorCount, device));
    }

    EncoderPlanCapacity cap = encoder_plan_capacity(plan.B, plan.T, C, plan.has_types);
    if (!plan.d_counts) cudaMallocCheck(&plan.d_counts, 2 * sizeof(int));
    encoder_plan_reserve(plan.d_positions, plan.capacity_positions, cap.positions);
    encoder_plan_reserve(plan.d_segments, plan.capacity_segments, cap.segments);
    encoder_plan_reserve(plan.d_groups, plan.capacity_groups, cap.groups);
    encoder_plan_reserve(plan.d_partials, plan.capacity_partials, cap.partials);

    const void* counts = plan.counts;
    const void* positions = lists.positions.data();
    const void* segments = lists.segments.data();
    const void* groups = lists.groups.data();
    size_t positions_bytes = lists.positions.size() * sizeof(int);
    size_t segments_bytes = lists.segments.size() * sizeof(EncoderSegment);
    size_t groups_bytes = lists.groups.size() * sizeof(EncoderGroup);
    if (staging) {  // back to back (all of 4-byte fields); an empty list's data() may be null
        char* at = static_cast<char*>(staging);
        auto stage = [&at](const void* list, size_t bytes) {
            const void* staged = bytes ? memcpy(at, list, bytes) : at;
            at += bytes;
            return staged;
        };
        counts = stage(counts, 2 * sizeof(int));
        positions = stage(positions, positions_bytes);
        segments = stage(segments, segments_bytes);
        groups = stage(groups, groups_bytes);
    }
    cudaCheck(cudaMemcpyAsync(plan.d_counts, counts, 2 * sizeof(int), cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaMemcpyAsync(plan.d_positions, positions, positions_bytes, cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaMemcpyAsync(plan.d_segments, segments, segments_bytes, cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaMemcpyAsync(plan.d_groups, groups, groups_bytes, cudaMemcpyHostToDevice, stream));
}

// Builds the plan for one step from the host copy of its token ids (B,T) and token types (B,T) or
// nullptr (ids checked against V and n_types: encoder_plan_build) and uploads it for C channels
// (encoder_backward_plan_upload, which says what `staging` is for).
inline void encoder_backward_plan(EncoderBackwardPlan* plan, const int* host_inp, const int* host_token_types,
                                  int B, int T, int C, int V, int n_types, cudaStream_t stream,
                                  void* staging = nullptr) {
    encoder_plan_build(plan->lists, host_inp, host_token_types, B, T, V, n_types);
    encoder_backward_plan_upload(plan, plan->lists, C, stream, staging);
}

// Reserves the plan's device buffers before the first step (so that a model's memory report is
// complete then) by planning an all-zero batch of shape (B, T), token types too when n_types > 0:
// every plan of that shape needs the same worst-case buffers. Returns the device bytes this added.
inline size_t encoder_backward_plan_reserve(EncoderBackwardPlan* plan, int B, int T, int C, int V, int n_types,
                                            cudaStream_t stream) {
    size_t before = plan->device_bytes();
    std::vector<int> zeros((size_t)B * T, 0);
    encoder_backward_plan(plan, zeros.data(), n_types > 0 ? zeros.data() : (const int*)nullptr, B, T, C, V, n_types,
                          stream);
    cudaCheck(cudaStreamSynchronize(stream));  // its upload reads the plan's host vectors
    return plan->device_bytes() - before;
}

// Frees the plan's device buffers.
inline void encoder_backward_plan_free(EncoderBackwardPlan* plan) {
    cudaCheck(cudaFree(plan->d_counts));
    cudaCheck(cudaFree(plan->d_positions));
    cudaCheck(cudaFree(plan->d_segments));
    cudaCheck(cudaFree(plan->d_groups));
    cudaCheck(cudaFree(plan->d_partials));
    *plan = EncoderBackwardPlan();
}

// dwte (Vp,C) +=, dwpe (maxT,C) +=, dwtt (n_types,C) += the gradient of encoder_forward, given
// dout (B,T,C) and the plan built from this step's token ids. Deterministic: every row's sum has a
// fixed order (see the top of the file). inp and token_types are the device ids of the forward;
// the kernels read the plan instead, and token_types/dwtt must be null exactly when the plan was
// built without token types.
template <class floatX>
void encoder_backward(floatX* dwte, floatX* dwpe, floatX* dwtt, const EncoderBackwardPlan& plan, const floatX* dout,
                      const int* inp, const int* token_types, int B, int T, int C, cudaStream_t stream) {
    if (plan.B != B || plan.T != T || plan.C != C) {
        fprintf(stderr, "encoder_backward: the plan was built for (B=%d, T=%d, C=%d), called with (B=%d, T=%d, C=%d): "
                "call encoder_backward_plan with this step's token ids first\n", plan.B, plan.T, plan.C, B, T, C);
        exit(EXIT_FAILURE);
    }
    if (inp == nullptr || plan.has_types != (token_types != nullptr) || plan.has_types != (dwtt != nullptr)) {
        fprintf(stderr, "encoder_backward: inp must be set, and token_types and dwtt set exactly when the plan has "
                "token types (plan: %s)\n", plan.has_types ? "with types" : "without types");
        exit(EXIT_FAILURE);
    }
    // Grids fixed by the shape (the kernels loop over the device's counts): as many warps as the
    // largest plan could use, but no more than fill the GPU (8 blocks of 256 threads per SM).
    const int block_size = 256;
    EncoderPlanCapacity cap = encoder_plan_capacity(B, T, C, plan.has_types);
    size_t resident = (size_t)std::max(plan.sm_count, 1) * 8;
    auto grid_for = [&](size_t warps) {
        return dim3((unsigned)std::min(CEIL_DIV(warps * 32, (size_t)block_size), resident));
    };
    if (rows_pack128<floatX>(C, {dwte, dwpe, dwtt, dout})) {
        constexpr int VEC = Packed128<floatX>::size;
        dim3 grid = grid_for(cap.segments * CEIL_DIV(C, 32 * VEC));
        cudaCheck(launch_kernel(encoder_segment_sum_kernel<floatX, VEC>, grid, dim3(block_size), 0, stream, dwte, dwpe,
                                dwtt, plan.d_partials, (const EncoderSegment*)plan.d_segments,
                                (const int*)plan.d_counts, (const int*)plan.d_positions, dout, C));
    } else {
        dim3 grid = grid_for(cap.segments * CEIL_DIV(C, 32));
        cudaCheck(launch_kernel(encoder_segment_sum_kernel<floatX, 1>, grid, dim3(block_size), 0, stream, dwte, dwpe,
                                dwtt, plan.d_partials, (const EncoderSegment*)plan.d_segments,
                                (const int*)plan.d_counts, (const int*)plan.d_positions, dout, C));
    }
    dim3 grid((unsigned)std::min(cap.groups, resident), CEIL_DIV(C, block_size));
    cudaCheck(launch_kernel(encoder_group_sum_kernel<floatX>, grid, dim3(block_size), 0, stream, dwte, dwpe, dwtt,
                            (const float*)plan.d_partials, (const EncoderGroup*)plan.d_groups,
                            (const int*)plan.d_counts, C));
}
