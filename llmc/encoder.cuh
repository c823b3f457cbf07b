// llmc/encoder.cuh — the embeddings: out = wte[token] + wpe[position] (+ wtt[token type] for BERT),
// and its deterministic backward into dwte, dwpe and dwtt.
//
// Why the backward needs a plan. dwte[v] is the sum of dout[b,t] over every position whose token
// is v. Scattering with float atomics would let the schedule decide the order of that sum, and so
// its rounding: two runs would differ in the last bits. The token ids are on the host anyway (the
// dataloader produced them), so the host groups the positions by destination row before the
// backward runs (llm.c does the same), and the GPU sums every group in a fixed order:
//   - a group is the list of positions that add into one row: a token's row of wte, a position's
//     row of wpe (its B positions b*T+t, in order of b), a token type's row of wtt;
//   - a group is cut into segments of at most 32 positions, one per lane, so that a warp loads a
//     segment's position list in one instruction and then sums the segment's dout rows in order;
//   - a group of one segment (most tokens; every wpe row when B <= 32) is added into its row by
//     that warp directly. A larger group (frequent tokens; the token types, which are whole-batch
//     sums) would serialize on one warp, so its segments run in parallel and write fp32 partial
//     rows, and a second kernel adds each group's partials in segment order into its row.
// Every sum therefore has one order whatever the schedule: the result is bit-identical run to
// run, and the work is spread over thousands of warps at B*T = 8192, C = 768.
#pragma once
#include "cuda_common.h"
#include "precision.cuh"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <vector>

// The storage type is called floatX here (as in llm.c), because T is the sequence length.

constexpr int ENCODER_SEGMENT = 32;  // positions per segment: one per lane of a warp

// The three tables a group can add into.
enum EncoderTable : int { ENCODER_WTE = 0, ENCODER_WPE = 1, ENCODER_WTT = 2 };

// Up to ENCODER_SEGMENT positions whose dout rows add into one destination row.
struct EncoderSegment {
    int table;    // EncoderTable
    int row;      // destination row in that table
    int start;    // first entry in the plan's position list
    int count;    // number of positions, 1..ENCODER_SEGMENT
    int partial;  // -1: add into the destination row; else the fp32 partial row this segment writes
};

// A group cut into several segments: its partial rows [first_partial, first_partial + num_partials)
// are added in order into the destination row.
struct EncoderGroup {
    int table;
    int row;
    int first_partial;
    int num_partials;
};

// The host-side preparation of one step's backward (built by encoder_backward_plan from the host
// copy of the step's token ids) and the device buffers it is uploaded to. Reused across steps:
// the device buffers are sized for the worst case of (B, T, C) once and only grow if B*T or C grows.
// Build it when the batch arrives (where the trainer copies the ids to the device), and upload it
// from pinned staging memory: then the host never waits for the stream and can prepare the next
// micro-batch while the GPU runs this one.
struct EncoderBackwardPlan {
    int B = 0, T = 0, C = 0;
    bool has_types = false;
    std::vector<int> positions;  // b*T+t, grouped by destination row, increasing within a group
    std::vector<EncoderSegment> segments;
    std::vector<EncoderGroup> groups;  // only the groups of more than one segment
    int num_partials = 0;
    std::vector<int> bucket_start;  // counting-sort scratch, kept to avoid a reallocation per step
    // Device copies of the three lists, and the fp32 partial rows.
    int* d_positions = nullptr;
    EncoderSegment* d_segments = nullptr;
    EncoderGroup* d_groups = nullptr;
    float* d_partials = nullptr;  // (partial rows, C)
    size_t capacity_positions = 0, capacity_segments = 0, capacity_groups = 0, capacity_partials = 0;  // elements
    // Device bytes its buffers hold (a model's memory report counts them).
    size_t device_bytes() const {
        return capacity_positions * sizeof(int) + capacity_segments * sizeof(EncoderSegment) +
               capacity_groups * sizeof(EncoderGroup) + capacity_partials * sizeof(float);
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

// One warp per (segment, chunk of 32*VEC channels), each lane owning VEC channels: adds the
// segment's dout rows in position order to the destination row's old value (a segment that is a
// whole group) or to zero (written as an fp32 partial row). The lanes hold the segment's
// positions and pass them round with a shuffle, so each step of the loop is a single 16-byte
// load per lane. C % VEC == 0.
template <class floatX, int VEC>
__global__ void encoder_segment_sum_kernel(floatX* dwte, floatX* dwpe, floatX* dwtt, float* partials,
                                           const EncoderSegment* segments, int num_segments,
                                           const int* positions, const floatX* dout, int C) {
    constexpr int CHUNK = 32 * VEC;
    int chunks = CEIL_DIV(C, CHUNK);
    size_t item = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;  // the same for a whole warp
    if (item >= (size_t)num_segments * chunks) return;
    int lane = threadIdx.x % 32;
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
    if (!active) return;
    if (seg.partial >= 0) encoder_store<VEC>(partials + (size_t)seg.partial * C + c, sum);
    else encoder_store<VEC>(dst, sum);
}

// One thread per (group, channel): adds the group's partial rows in segment order into its row.
template <class floatX>
__global__ void encoder_group_sum_kernel(floatX* dwte, floatX* dwpe, floatX* dwtt, const float* partials,
                                         const EncoderGroup* groups, int C) {
    EncoderGroup g = groups[blockIdx.x];
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float sum = 0.f;
    for (int p = 0; p < g.num_partials; p++) sum += partials[(size_t)(g.first_partial + p) * C + c];
    floatX* dst = encoder_table(g.table, dwte, dwpe, dwtt) + (size_t)g.row * C + c;
    *dst = from_float<floatX>(to_float(*dst) + sum);
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

// The plan's device buffers for the worst case over all batches of shape (B, T) and C channels, so
// that training never reallocates: n positions (2 or 3 tables); every segment holds at least one
// position; a group of m > 32 positions has ceil(m/32) <= m/16 segments, each with a partial row.
struct EncoderPlanCapacity {
    size_t positions, segments, groups, partials;  // elements of each buffer
    size_t bytes() const {
        return positions * sizeof(int) + segments * sizeof(EncoderSegment) + groups * sizeof(EncoderGroup) +
               partials * sizeof(float);
    }
};
inline EncoderPlanCapacity encoder_plan_capacity(int B, int T, int C, bool has_types) {
    size_t n = (size_t)B * T * (has_types ? 3 : 2);
    return EncoderPlanCapacity{n, n, n / (ENCODER_SEGMENT + 1) + 1, (n / 16 + 1) * (size_t)C};
}

// Bytes of pinned host memory encoder_backward_plan needs to upload a plan of (B, T) without making
// the host wait: its three lists at their worst-case lengths.
inline size_t encoder_plan_staging_bytes(int B, int T, bool has_types) {
    EncoderPlanCapacity cap = encoder_plan_capacity(B, T, 1, has_types);
    return cap.positions * sizeof(int) + cap.segments * sizeof(EncoderSegment) + cap.groups * sizeof(EncoderGroup);
}

// Grows a device buffer to hold at least `need` elements (contents are not kept).
template <class X>
inline void encoder_plan_reserve(X*& ptr, size_t& capacity, size_t need) {
    if (need <= capacity) return;
    cudaCheck(cudaFree(ptr));  // synchronizes: no kernel of an earlier step still reads it
    cudaCheck(cudaMalloc(&ptr, need * sizeof(X)));
    capacity = need;
}

// Appends one group: positions [start, start+count) of the plan's list add into `row` of `table`.
inline void encoder_plan_add_group(EncoderBackwardPlan& plan, int table, int row, int start, int count) {
    if (count <= ENCODER_SEGMENT) {
        plan.segments.push_back({table, row, start, count, -1});
        return;
    }
    int n = CEIL_DIV(count, ENCODER_SEGMENT);
    plan.groups.push_back({table, row, plan.num_partials, n});
    for (int s = 0; s < n; s++) {
        int first = s * ENCODER_SEGMENT;
        int len = count - first < ENCODER_SEGMENT ? count - first : ENCODER_SEGMENT;
        plan.segments.push_back({table, row, start + first, len, plan.num_partials++});
    }
}

// Appends the groups of a counting sort of positions 0..BT-1 by key (ids in [0, num_keys)): one
// group per key that occurs, positions increasing within it.
inline void encoder_plan_bucket(EncoderBackwardPlan& plan, int table, const int* keys, int BT, int num_keys) {
    std::vector<int>& start = plan.bucket_start;
    start.assign((size_t)num_keys + 1, 0);
    for (int i = 0; i < BT; i++) start[keys[i] + 1]++;
    for (int k = 0; k < num_keys; k++) start[k + 1] += start[k];
    size_t base = plan.positions.size();
    plan.positions.resize(base + BT);
    for (int i = 0; i < BT; i++) plan.positions[base + start[keys[i]]++] = i;  // start[k] ends at k+1's start
    int begin = 0;
    for (int k = 0; k < num_keys; k++) {
        int end = start[k];
        if (end > begin) encoder_plan_add_group(plan, table, k, (int)base + begin, end - begin);
        begin = end;
    }
}

// Fills the plan for one step from the host copy of its token ids (B,T) and token types (B,T) or
// nullptr, and uploads it on `stream` (ordered after the previous step's encoder_backward on the
// same stream). The upload reads from `staging` when given — pinned host memory of
// encoder_plan_staging_bytes(B, T, types) that must stay untouched until the stream has run the
// copies (e.g. one buffer per micro-step, reused after the step) — which never makes the host wait;
// without it, from the plan's own pageable vectors, which CUDA may stage by waiting for the stream. Checks every id against the vocabulary
// size V and n_types and exits with a message naming the first bad one (a bad id would otherwise
// read and write outside the tables). Sizes the device buffers for the worst case of (B, T, C).
inline void encoder_backward_plan(EncoderBackwardPlan* plan_ptr, const int* host_inp, const int* host_token_types,
                                  int B, int T, int C, int V, int n_types, cudaStream_t stream,
                                  void* staging = nullptr) {
    EncoderBackwardPlan& plan = *plan_ptr;
    if (B <= 0 || T <= 0 || C <= 0 || V <= 0 || (host_token_types != nullptr && n_types <= 0)) {
        fprintf(stderr, "encoder_backward_plan: B=%d, T=%d, C=%d, V=%d (and n_types=%d with token types) "
                "must be positive\n", B, T, C, V, n_types);
        exit(EXIT_FAILURE);
    }
    int BT = B * T;
    for (int i = 0; i < BT; i++) {
        if (host_inp[i] < 0 || host_inp[i] >= V) {
            fprintf(stderr, "encoder_backward_plan: token id %d at (b=%d, t=%d) is outside the vocabulary [0, %d)\n",
                    host_inp[i], i / T, i % T, V);
            exit(EXIT_FAILURE);
        }
        if (host_token_types != nullptr && (host_token_types[i] < 0 || host_token_types[i] >= n_types)) {
            fprintf(stderr, "encoder_backward_plan: token type %d at (b=%d, t=%d) is outside [0, %d)\n",
                    host_token_types[i], i / T, i % T, n_types);
            exit(EXIT_FAILURE);
        }
    }
    plan.B = B;
    plan.T = T;
    plan.C = C;
    plan.has_types = host_token_types != nullptr;
    plan.positions.clear();
    plan.segments.clear();
    plan.groups.clear();
    plan.num_partials = 0;
    size_t n = (size_t)BT * (plan.has_types ? 3 : 2);
    plan.positions.reserve(n);

    encoder_plan_bucket(plan, ENCODER_WTE, host_inp, BT, V);
    for (int t = 0; t < T; t++) {  // wpe row t: positions t, T+t, ..., (B-1)*T+t
        int start = (int)plan.positions.size();
        for (int b = 0; b < B; b++) plan.positions.push_back(b * T + t);
        encoder_plan_add_group(plan, ENCODER_WPE, t, start, B);
    }
    if (plan.has_types) encoder_plan_bucket(plan, ENCODER_WTT, host_token_types, BT, n_types);

    EncoderPlanCapacity cap = encoder_plan_capacity(B, T, C, plan.has_types);
    encoder_plan_reserve(plan.d_positions, plan.capacity_positions, cap.positions);
    encoder_plan_reserve(plan.d_segments, plan.capacity_segments, cap.segments);
    encoder_plan_reserve(plan.d_groups, plan.capacity_groups, cap.groups);
    encoder_plan_reserve(plan.d_partials, plan.capacity_partials, cap.partials);

    const void* positions = plan.positions.data();
    const void* segments = plan.segments.data();
    const void* groups = plan.groups.data();
    size_t positions_bytes = plan.positions.size() * sizeof(int);
    size_t segments_bytes = plan.segments.size() * sizeof(EncoderSegment);
    size_t groups_bytes = plan.groups.size() * sizeof(EncoderGroup);
    if (staging) {  // the lists back to back (all of 4-byte fields); an empty list's data() may be null
        char* at = static_cast<char*>(staging);
        auto stage = [&at](const void* list, size_t bytes) {
            const void* staged = bytes ? memcpy(at, list, bytes) : at;
            at += bytes;
            return staged;
        };
        positions = stage(positions, positions_bytes);
        segments = stage(segments, segments_bytes);
        groups = stage(groups, groups_bytes);
    }
    cudaCheck(cudaMemcpyAsync(plan.d_positions, positions, positions_bytes, cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaMemcpyAsync(plan.d_segments, segments, segments_bytes, cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaMemcpyAsync(plan.d_groups, groups, groups_bytes, cudaMemcpyHostToDevice, stream));
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
    const int block_size = 256;
    int num_segments = (int)plan.segments.size();
    const EncoderSegment* segments = plan.d_segments;
    const int* positions = plan.d_positions;
    if (rows_pack128<floatX>(C, {dwte, dwpe, dwtt, dout})) {
        constexpr int VEC = Packed128<floatX>::size;
        size_t warps = (size_t)num_segments * CEIL_DIV(C, 32 * VEC);
        dim3 grid((unsigned)CEIL_DIV(warps * 32, (size_t)block_size));
        cudaCheck(launch_kernel(encoder_segment_sum_kernel<floatX, VEC>, grid, dim3(block_size), 0, stream, dwte, dwpe,
                                dwtt, plan.d_partials, segments, num_segments, positions, dout, C));
    } else {
        size_t warps = (size_t)num_segments * CEIL_DIV(C, 32);
        dim3 grid((unsigned)CEIL_DIV(warps * 32, (size_t)block_size));
        cudaCheck(launch_kernel(encoder_segment_sum_kernel<floatX, 1>, grid, dim3(block_size), 0, stream, dwte, dwpe,
                                dwtt, plan.d_partials, segments, num_segments, positions, dout, C));
    }
    if (!plan.groups.empty()) {
        dim3 grid((unsigned)plan.groups.size(), CEIL_DIV(C, block_size));
        cudaCheck(launch_kernel(encoder_group_sum_kernel<floatX>, grid, dim3(block_size), 0, stream, dwte, dwpe, dwtt,
                                (const float*)plan.d_partials, (const EncoderGroup*)plan.d_groups, C));
    }
}
