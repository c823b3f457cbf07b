// llmc/encoder_plan.h — the host half of the embeddings' deterministic backward (llmc/encoder.cuh):
// lists that group a batch's positions by the embedding row their gradient adds into. Plain C++
// (no CUDA), so that the data loader's thread can build them for the next batch while the GPU runs
// this one (DataLoader::plan_embedding_backward).
//
//   - a group is the list of positions that add into one row: a token's row of wte, a position's
//     row of wpe (its B positions b*T+t, in order of b), a token type's row of wtt;
//   - a group is cut into segments of at most ENCODER_SEGMENT positions (one per lane of a warp);
//   - a group of more than one segment also gets an EncoderGroup: its segments write fp32 partial
//     rows, which a second kernel adds in segment order into the destination row.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <vector>

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

// One batch's lists, built from the host copy of its token ids (and token types). Reusable: building
// again keeps the vectors' storage.
struct EncoderPlanLists {
    int B = 0, T = 0;
    bool has_types = false;
    std::vector<int> positions;  // b*T+t, grouped by destination row, increasing within a group
    std::vector<EncoderSegment> segments;
    std::vector<EncoderGroup> groups;  // only the groups of more than one segment
    int num_partials = 0;
    std::vector<int> bucket_start;  // counting-sort scratch, kept to avoid a reallocation per batch
};

// The worst case over all batches of shape (B, T) with C channels, so that the device buffers are
// sized once: n positions (2 or 3 tables); every segment holds at least one position; a group of
// m > 32 positions has ceil(m/32) <= m/16 segments, each with a partial row.
struct EncoderPlanCapacity {
    size_t positions, segments, groups, partials;  // elements of each list (partials: floats)
};
inline EncoderPlanCapacity encoder_plan_capacity(int B, int T, int C, bool has_types) {
    size_t n = (size_t)B * T * (has_types ? 3 : 2);
    return EncoderPlanCapacity{n, n, n / (ENCODER_SEGMENT + 1) + 1, (n / 16 + 1) * (size_t)C};
}

// Appends one group: positions [start, start+count) of the list add into `row` of `table`.
inline void encoder_plan_add_group(EncoderPlanLists& plan, int table, int row, int start, int count) {
    if (count <= ENCODER_SEGMENT) {
        plan.segments.push_back({table, row, start, count, -1});
        return;
    }
    int n = (count + ENCODER_SEGMENT - 1) / ENCODER_SEGMENT;
    plan.groups.push_back({table, row, plan.num_partials, n});
    for (int s = 0; s < n; s++) {
        int first = s * ENCODER_SEGMENT;
        int len = count - first < ENCODER_SEGMENT ? count - first : ENCODER_SEGMENT;
        plan.segments.push_back({table, row, start + first, len, plan.num_partials++});
    }
}

// Appends the groups of a counting sort of positions 0..BT-1 by key (ids in [0, num_keys)): one
// group per key that occurs, positions increasing within it.
inline void encoder_plan_bucket(EncoderPlanLists& plan, int table, const int* keys, int BT, int num_keys) {
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

// Fills `plan` from the host token ids (B,T) and token types (B,T) or nullptr. Checks every id
// against the vocabulary size V and n_types and exits with a message naming the first bad one (a bad
// id would make the backward read and write outside the tables).
inline void encoder_plan_build(EncoderPlanLists& plan, const int* host_inp, const int* host_token_types, int B, int T,
                               int V, int n_types) {
    if (B <= 0 || T <= 0 || V <= 0 || (host_token_types != nullptr && n_types <= 0)) {
        fprintf(stderr, "encoder_backward_plan: B=%d, T=%d, V=%d (and n_types=%d with token types) must be positive\n",
                B, T, V, n_types);
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
    plan.has_types = host_token_types != nullptr;
    plan.positions.clear();
    plan.segments.clear();
    plan.groups.clear();
    plan.num_partials = 0;
    plan.positions.reserve((size_t)BT * (plan.has_types ? 3 : 2));

    encoder_plan_bucket(plan, ENCODER_WTE, host_inp, BT, V);
    for (int t = 0; t < T; t++) {  // wpe row t: positions t, T+t, ..., (B-1)*T+t
        int start = (int)plan.positions.size();
        for (int b = 0; b < B; b++) plan.positions.push_back(b * T + t);
        encoder_plan_add_group(plan, ENCODER_WPE, t, start, B);
    }
    if (plan.has_types) encoder_plan_bucket(plan, ENCODER_WTT, host_token_types, BT, n_types);
}
