// llmc/zero.h — ZeRO partitioning of the flat parameter vector: which elements each rank owns,
// in which order the pieces can be communicated during the backward pass, the shard-local tensor
// table the optimizers take, and how a state saved with one world size is re-sharded for another.
// Host arithmetic only (no CUDA), so it is tested on its own (test/test_zero.cu).
//
// The model. The trainers keep their parameters (and gradients, and optimizer state) as one flat
// vector of NUM tensors in index order; a tensor stacked over L layers holds layer l as the
// contiguous slice [l * size/L, (l+1) * size/L) (llm.c's layout, ParameterTensors::layer). A
// gradient is final at a known point of the backward pass: a per-layer slice after that layer's
// backward, the final layernorm before the layers, the (tied) embeddings after all of them. So the
// unit of communication is a *chunk*: one (tensor, layer) slice, or one unstacked tensor.
//
// The partition. Each chunk of n elements is cut into `world` pieces of s = ceil(n / world)
// elements (s rounded up to a multiple of `align`): rank r owns [r*s, min(n, (r+1)*s)) — the last
// non-empty piece is short, and with n < (world-1)*s trailing ranks own nothing. Partitioning per
// chunk (instead of the flat vector once) keeps every collective inside one chunk, so a layer's
// reduce-scatter can start as soon as that layer's gradients are final.
//
// Rank-local tensors (expert parallelism: each rank holds other experts under the same names). Such
// a tensor's chunks are owned whole by every rank (s = n rounded up to align, piece [0, n) on every
// rank): the optimizer updates each rank's own copy, and the collectives skip them (a rank-local
// gradient is final as computed; llmc/distributed.h copies rank-local chunks instead of
// communicating them). The size bound below then holds for the other chunks only.
//
// The shard. Every rank's shard buffer gives each chunk a slot of s elements at the same offset
// (shard_offset) on every rank; a rank's piece fills the start of its slot and the rest is padding
// (never read or written by the optimizers or the collectives: zero the shard buffers once and
// whole-buffer reductions such as the gradient norm need no table). Slots follow the flat order, so
// with world 1 and align 1 the shard *is* the flat vector: a single-GPU state is the W = 1 case of
// re-sharding. Shard size S = sum of s over chunks <= ceil(N / world) + num_chunks * align, and the
// padding summed over all ranks is at most num_chunks * (world * align - 1).
//
// Usage (trainer side; the communication itself is in llmc/distributed.h):
//     std::vector<ZeroTensor> t = {{size_wte, GradReady::AfterLayers, 1}, ...};   // one per tensor
//     ZeroPlan plan;
//     if (!zero_plan(&plan, t, L, world, /*align=*/8, &err)) fatal(err);
//     auto table = zero_shard_table<ParamTensor>(plan, rank);   // the optimizer's tensor table
//     // after layer l's backward: reduce-scatter plan.groups[plan.group_of_layer[l]]'s chunks
//     std::vector<ZeroCopy> copies;                              // on resume from W1 ranks:
//     zero_reshard(old_plan, plan, rank, &copies, &err);         // old shard ranges -> new shard
#pragma once
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

// When a tensor's gradient is final during the backward pass.
enum class GradReady {
    BeforeLayers,  // before the layers' backward (the final layernorm, a classifier head)
    PerLayer,      // stacked over the L layers: slice l after layer l's backward
    AfterLayers,   // after all layers (embeddings; GPT-2's tied wte, which the encoder adds to last)
};

// One parameter tensor as the plan sees it.
struct ZeroTensor {
    size_t size;        // elements of the whole tensor (all L layers for a PerLayer tensor)
    GradReady ready;
    int weight_decay;   // 1: the optimizer applies weight decay (ParamTensor::weight_decay)
    bool rank_local = false;  // every rank holds its own values (see the top): owned whole, not communicated
};

// One chunk: the unit of communication and of partitioning.
struct ZeroChunk {
    int tensor;           // index in the tensor list
    int layer;            // the layer of a PerLayer tensor's slice, -1 otherwise
    size_t offset;        // first element in the flat parameter vector
    size_t n;             // elements
    size_t s;             // piece length: rank r owns [r*s, min(n, (r+1)*s)) of the chunk
    size_t shard_offset;  // the chunk's slot (s elements) in every rank's shard buffer
    int weight_decay;
    bool rank_local;      // owned whole by every rank: s >= n, piece [0, n) everywhere
};

// Chunks that become final at the same point of the backward pass: plan.chunks[begin, end).
struct ZeroGroup {
    GradReady ready;
    int layer;  // PerLayer groups: the layer, else -1
    int begin, end;
};

// The partition of one model's parameters over `world` ranks.
struct ZeroPlan {
    int world = 0;
    size_t align = 1;
    int num_layers = 0;
    size_t num_params = 0;          // N, the flat vector's length
    size_t shard_size = 0;          // S, every rank's shard buffer length (pieces + padding)
    std::vector<ZeroChunk> chunks;  // in the order their gradients become final
    std::vector<ZeroGroup> groups;  // in backward order: before-layers, layer L-1 .. 0, after-layers
    std::vector<int> group_of_layer;  // (L) index in groups of layer l's group (-1 if it has no chunks)
    int group_before = -1, group_after = -1;  // -1 when there is no such tensor
};

// A half-open range of elements.
struct ZeroRange {
    size_t begin, end;
    size_t size() const { return end - begin; }
};

// The piece of chunk c that rank owns, in chunk coordinates: [r*s, min(n, (r+1)*s)), empty (n, n)
// for ranks past the end; all of it, [0, n), for a rank-local chunk.
inline ZeroRange zero_piece(const ZeroChunk& c, int rank) {
    if (c.rank_local) return {0, c.n};
    size_t b = std::min(c.n, (size_t)rank * c.s);
    return {b, std::min(c.n, b + c.s)};
}

// Builds the plan for tensors (in flat order) over num_layers layers and world ranks; piece lengths
// are multiples of align (8 keeps 16-byte bf16 vectors aligned, 256 keeps AdamW-8bit's quantization
// blocks whole). Returns false with a message in err for an impossible request.
inline bool zero_plan(ZeroPlan* plan, const std::vector<ZeroTensor>& tensors, int num_layers, int world,
                      size_t align, std::string* err) {
    auto fail = [&](const std::string& msg) {
        if (err) *err = "zero_plan: " + msg;
        return false;
    };
    if (world < 1) return fail("world must be >= 1, got " + std::to_string(world));
    if (align < 1) return fail("align must be >= 1");
    if (num_layers < 0) return fail("num_layers must be >= 0, got " + std::to_string(num_layers));
    ZeroPlan p;
    p.world = world;
    p.align = align;
    p.num_layers = num_layers;
    // Chunks in flat order first: that order assigns the shard slots.
    std::vector<ZeroChunk> flat;
    size_t offset = 0;
    for (size_t i = 0; i < tensors.size(); i++) {
        const ZeroTensor& t = tensors[i];
        bool stacked = t.ready == GradReady::PerLayer;
        if (stacked && num_layers == 0 && t.size > 0)
            return fail("tensor " + std::to_string(i) + " is per-layer but num_layers is 0");
        if (stacked && num_layers > 0 && t.size % (size_t)num_layers != 0)
            return fail("tensor " + std::to_string(i) + " is per-layer but its " + std::to_string(t.size) +
                        " elements do not divide into " + std::to_string(num_layers) + " layers");
        int slices = stacked ? num_layers : 1;
        size_t n = stacked ? (num_layers > 0 ? t.size / num_layers : 0) : t.size;
        for (int l = 0; l < slices; l++) {
            size_t s = t.rank_local ? n : (n + world - 1) / world;
            s = (s + align - 1) / align * align;
            flat.push_back(
                ZeroChunk{(int)i, stacked ? l : -1, offset, n, s, p.shard_size, t.weight_decay, t.rank_local});
            offset += n;
            p.shard_size += s;
        }
    }
    p.num_params = offset;
    // Then the backward order, one group per point where gradients become final.
    auto add_group = [&](GradReady ready, int layer) {
        ZeroGroup g{ready, layer, (int)p.chunks.size(), 0};
        for (const ZeroChunk& c : flat)
            if (tensors[c.tensor].ready == ready && c.layer == layer) p.chunks.push_back(c);
        g.end = (int)p.chunks.size();
        if (g.end == g.begin) return -1;
        p.groups.push_back(g);
        return (int)p.groups.size() - 1;
    };
    p.group_before = add_group(GradReady::BeforeLayers, -1);
    p.group_of_layer.assign(num_layers, -1);
    for (int l = num_layers - 1; l >= 0; l--) p.group_of_layer[l] = add_group(GradReady::PerLayer, l);
    p.group_after = add_group(GradReady::AfterLayers, -1);
    *plan = std::move(p);
    return true;
}

// One piece a rank owns, with where it lives in the flat vector and in the rank's shard.
struct ZeroShardPiece {
    int chunk;            // index in plan.chunks
    ZeroRange range;      // chunk coordinates
    size_t flat_offset;   // first element in the flat vector: chunk.offset + range.begin
    size_t shard_offset;  // first element in the shard buffer: chunk.shard_offset
    int weight_decay;
};

// The non-empty pieces rank owns, in shard order (ascending shard_offset, which is flat order).
inline std::vector<ZeroShardPiece> zero_shard_pieces(const ZeroPlan& plan, int rank) {
    std::vector<ZeroShardPiece> pieces;
    for (size_t i = 0; i < plan.chunks.size(); i++) {
        const ZeroChunk& c = plan.chunks[i];
        ZeroRange r = zero_piece(c, rank);
        if (r.size() > 0) pieces.push_back({(int)i, r, c.offset + r.begin, c.shard_offset, c.weight_decay});
    }
    std::sort(pieces.begin(), pieces.end(),
              [](const ZeroShardPiece& a, const ZeroShardPiece& b) { return a.shard_offset < b.shard_offset; });
    return pieces;
}

// The optimizer's tensor table for rank's shard: one Entry{offset, size, weight_decay} per piece,
// offsets into the shard buffer, so AdamW / SGD update exactly the owned elements and never the
// padding. Entry is the optimizers' ParamTensor (llmc/adamw.cuh; a template keeps this header free
// of CUDA). merge joins pieces that touch in the shard and share the decay flag: fewer grid rows,
// and the same result for the element-wise optimizers (AdamW, SGD).
template <class Entry>
std::vector<Entry> zero_shard_table(const ZeroPlan& plan, int rank, bool merge = true) {
    std::vector<Entry> table;
    for (const ZeroShardPiece& p : zero_shard_pieces(plan, rank)) {
        if (merge && !table.empty() && table.back().offset + table.back().size == p.shard_offset &&
            table.back().weight_decay == p.weight_decay) {
            table.back().size += p.range.size();
            continue;
        }
        table.push_back(Entry{p.shard_offset, p.range.size(), p.weight_decay});
    }
    return table;
}

// A rank's shard in numbers, for the memory anatomy: every state kept per shard element (fp32
// master, optimizer moments; with ZeRO-2 gradients) costs shard_elems * bytes-per-element on this
// rank, against num_params * bytes on a single GPU.
struct ZeroMemory {
    size_t shard_elems;    // S: the buffer every rank allocates
    size_t owned_elems;    // elements this rank owns (updates)
    size_t padding_elems;  // S - owned
};

// The shard numbers of rank.
inline ZeroMemory zero_memory(const ZeroPlan& plan, int rank) {
    size_t owned = 0;
    for (const ZeroChunk& c : plan.chunks) owned += zero_piece(c, rank).size();
    return {plan.shard_size, owned, plan.shard_size - owned};
}

// The bound the plan guarantees without rank-local tensors: S <= ceil(N / world) + num_chunks * align.
inline size_t zero_shard_size_bound(const ZeroPlan& plan) {
    size_t w = (size_t)plan.world;
    return (plan.num_params + w - 1) / w + plan.chunks.size() * plan.align;
}

// One copy of the re-sharding map: count elements from old rank src_rank's shard (at src_offset)
// to the new rank's shard (at dst_offset). Offsets are in elements: scale by each state's element
// size (fp32 master, fp32 moments, ...).
struct ZeroCopy {
    int src_rank;
    size_t src_offset, dst_offset, count;
};

// The re-sharding map for new rank `rank` of new_plan from shards written under old_plan (same
// model, any world size and align): copies in new-shard order, adjacent ones merged; together they
// fill every owned element of the new shard exactly once (padding is not covered: zero it). Returns
// false with a message in err when the plans are not of the same model.
inline bool zero_reshard(const ZeroPlan& old_plan, const ZeroPlan& new_plan, int rank, std::vector<ZeroCopy>* out,
                         std::string* err) {
    out->clear();
    bool same = old_plan.chunks.size() == new_plan.chunks.size() && old_plan.num_params == new_plan.num_params;
    for (size_t i = 0; same && i < old_plan.chunks.size(); i++) {
        const ZeroChunk &a = old_plan.chunks[i], &b = new_plan.chunks[i];
        same = a.tensor == b.tensor && a.layer == b.layer && a.offset == b.offset && a.n == b.n;
        if (same && a.rank_local && old_plan.world != new_plan.world) {
            if (err)
                *err = "zero_reshard: tensor " + std::to_string(a.tensor) + " is rank-local (each rank's own values) "
                       "and cannot move from " + std::to_string(old_plan.world) + " ranks to " +
                       std::to_string(new_plan.world);
            return false;
        }
    }
    if (!same) {
        if (err)
            *err = "zero_reshard: the saved shards (" + std::to_string(old_plan.num_params) + " parameters in " +
                   std::to_string(old_plan.chunks.size()) + " chunks) are not of this model (" +
                   std::to_string(new_plan.num_params) + " parameters in " + std::to_string(new_plan.chunks.size()) +
                   " chunks)";
        return false;
    }
    if (rank < 0 || rank >= new_plan.world) {
        if (err) *err = "zero_reshard: rank " + std::to_string(rank) + " is not in [0, " +
                        std::to_string(new_plan.world) + ")";
        return false;
    }
    for (const ZeroShardPiece& p : zero_shard_pieces(new_plan, rank)) {
        const ZeroChunk& old_c = old_plan.chunks[p.chunk];
        const ZeroRange want = p.range;
        for (int q = (int)(want.begin / old_c.s); q < old_plan.world; q++) {
            ZeroRange have = zero_piece(old_c, q);
            size_t lo = std::max(want.begin, have.begin), hi = std::min(want.end, have.end);
            if (have.begin >= want.end) break;
            if (lo >= hi) continue;
            ZeroCopy c{q, old_c.shard_offset + (lo - have.begin), p.shard_offset + (lo - want.begin), hi - lo};
            if (!out->empty()) {
                ZeroCopy& prev = out->back();
                if (prev.src_rank == c.src_rank && prev.src_offset + prev.count == c.src_offset &&
                    prev.dst_offset + prev.count == c.dst_offset) {
                    prev.count += c.count;
                    continue;
                }
            }
            out->push_back(c);
        }
    }
    return true;
}
