// test/test_zero.cu — llmc/zero.h, the ZeRO partition (pure host arithmetic, one process): chunks
// come in the order gradients become final; pieces cover every parameter exactly once for any
// world size, also when sizes do not divide by it; slots, padding and the shard tables agree with
// the pieces; re-sharding a state from W1 ranks to W2 ranks rebuilds exactly the new shards;
// rank-local tensors are owned whole by every rank.
#include "../llmc/adamw.cuh"  // ParamTensor, the table the optimizers take
#include "../llmc/zero.h"
#include "harness.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

// GPT-2's 16 tensors in llm.c's order (train_gpt2.cu's param_sizes / param_decays), for C channels,
// L layers, Vp padded vocabulary and maxT positions.
enum { WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, LNFW, LNFB };
static std::vector<ZeroTensor> gpt2_tensors(size_t C, size_t L, size_t Vp, size_t maxT) {
    const GradReady P = GradReady::PerLayer;
    return {
        {Vp * C, GradReady::AfterLayers, 1},  // wte: tied, the encoder's backward adds to it last
        {maxT * C, GradReady::AfterLayers, 1},
        {L * C, P, 0}, {L * C, P, 0},
        {L * 3 * C * C, P, 1}, {L * 3 * C, P, 0},
        {L * C * C, P, 1}, {L * C, P, 0},
        {L * C, P, 0}, {L * C, P, 0},
        {L * 4 * C * C, P, 1}, {L * 4 * C, P, 0},
        {L * 4 * C * C, P, 1}, {L * C, P, 0},
        {C, GradReady::BeforeLayers, 0}, {C, GradReady::BeforeLayers, 0},
    };
}

static ZeroPlan make_plan(const std::vector<ZeroTensor>& t, int L, int world, size_t align) {
    ZeroPlan p;
    std::string err;
    if (!zero_plan(&p, t, L, world, align, &err)) {
        fprintf(stderr, "unexpected: %s\n", err.c_str());
        exit(EXIT_FAILURE);
    }
    return p;
}

// Flat offset of every (tensor, layer) slice, computed independently of the plan.
static size_t flat_offset(const std::vector<ZeroTensor>& t, int L, int tensor, int layer) {
    size_t off = 0;
    for (int i = 0; i < tensor; i++) off += t[i].size;
    return off + (layer >= 0 ? (size_t)layer * (t[tensor].size / L) : 0);
}

// ----------------------------------------------------------------------------

// The chunk order of GPT-2: final layernorm, layers L-1 .. 0 (tensors in index order), then the
// embeddings; offsets are llm.c's layout; groups are exactly those stages.
static void test_gpt2_order() {
    const int L = 3;
    auto t = gpt2_tensors(8, L, 64, 16);
    ZeroPlan p = make_plan(t, L, 2, 1);
    std::vector<std::pair<int, int>> want = {{LNFW, -1}, {LNFB, -1}};
    for (int l = L - 1; l >= 0; l--)
        for (int i = LN1W; i <= FCPROJB; i++) want.push_back({i, l});
    want.push_back({WTE, -1});
    want.push_back({WPE, -1});
    bool order = p.chunks.size() == want.size(), offsets = true;
    for (size_t k = 0; order && k < want.size(); k++) {
        order &= p.chunks[k].tensor == want[k].first && p.chunks[k].layer == want[k].second;
        offsets &= p.chunks[k].offset == flat_offset(t, L, want[k].first, want[k].second) &&
                   p.chunks[k].weight_decay == t[want[k].first].weight_decay;
    }
    th::report(order, "zero: GPT-2 chunks in backward-final order", "lnf, layers %d..0, wte, wpe: %zu chunks", L - 1,
               p.chunks.size());
    th::report(offsets, "zero: GPT-2 chunk offsets are llm.c's flat layout (tensor i, layer l contiguous)");
    bool groups = p.groups.size() == (size_t)L + 2 && p.group_before == 0 && p.group_after == L + 1;
    for (int l = 0; groups && l < L; l++) {
        const ZeroGroup& g = p.groups[p.group_of_layer[l]];
        groups &= p.group_of_layer[l] == L - l && g.layer == l && g.end - g.begin == 12;
        for (int k = g.begin; k < g.end; k++) groups &= p.chunks[k].layer == l;
    }
    groups &= p.groups[0].begin == 0 && p.groups.back().end == (int)p.chunks.size();
    for (size_t g = 1; g < p.groups.size(); g++) groups &= p.groups[g].begin == p.groups[g - 1].end;
    th::report(groups, "zero: groups = before-layers, one per layer (L-1 first), after-layers; contiguous");
}

// Every n in [0, 40], world 1..8, align 1/2/8: the pieces [r*s, min(n,(r+1)*s)) tile [0, n) in rank
// order, s = ceil(n/world) rounded up to align.
static void test_pieces_exhaustive() {
    bool ok = true;
    std::string bad;
    for (size_t align : {1, 2, 8})
        for (int w = 1; w <= 8; w++)
            for (size_t n = 0; n <= 40; n++) {
                ZeroPlan p = make_plan({{n, GradReady::AfterLayers, 0}}, 0, w, align);
                const ZeroChunk& c = p.chunks[0];
                size_t s = (n + w - 1) / w;
                s = (s + align - 1) / align * align;
                size_t at = 0;
                bool this_ok = c.s == s && c.s * w >= n;
                for (int r = 0; r < w; r++) {
                    ZeroRange pr = zero_piece(c, r);
                    this_ok &= pr.begin == at && pr.end >= pr.begin && pr.size() <= s &&
                               pr.begin == std::min(n, r * s) && pr.end == std::min(n, (r + 1) * s);
                    at = pr.end;
                }
                this_ok &= at == n;
                if (!this_ok && bad.empty()) bad = "n=" + std::to_string(n) + " world=" + std::to_string(w);
                ok &= this_ok;
            }
    th::report(ok, "zero: pieces tile every chunk in rank order (n 0..40, world 1..8, align 1/2/8)", "%s",
               ok ? "incl. trailing empty pieces (n < (world-1)*s)" : bad.c_str());
}

// World 1, align 1: the shard is the flat vector itself (a single-GPU state is the W = 1 shard).
static void test_world1_is_flat() {
    const int L = 2;
    auto t = gpt2_tensors(12, L, 40, 9);
    ZeroPlan p = make_plan(t, L, 1, 1);
    bool ok = p.shard_size == p.num_params;
    for (const ZeroChunk& c : p.chunks) ok &= c.shard_offset == c.offset && c.s == c.n;
    auto table = zero_shard_table<ParamTensor>(p, 0);
    // Expanding the merged table must give, element by element, the decay flag of its tensor.
    std::vector<int> decay(p.num_params, -1);
    for (const ParamTensor& e : table)
        for (size_t j = e.offset; j < e.offset + e.size; j++) decay[j] = e.weight_decay;
    for (size_t i = 0, off = 0; i < t.size(); off += t[i].size, i++)
        for (size_t j = off; j < off + t[i].size; j++) ok &= decay[j] == t[i].weight_decay;
    th::report(ok, "zero: world 1, align 1: shard == flat vector, table covers it with each tensor's decay",
               "N=%zu, %zu table entries (merged) for %zu chunks", p.num_params, table.size(), p.chunks.size());
}

// A random model: tensors of random sizes (some 0, some prime, per-layer ones a multiple of L).
struct RandomModel {
    std::vector<ZeroTensor> tensors;
    int L;
};
static RandomModel random_model(std::mt19937_64& rng) {
    RandomModel m;
    m.L = (int)(rng() % 5);
    int nt = 1 + (int)(rng() % 10);
    for (int i = 0; i < nt; i++) {
        GradReady ready = (GradReady)(rng() % 3);
        if (ready == GradReady::PerLayer && m.L == 0) ready = GradReady::AfterLayers;
        size_t base = rng() % 4 == 0 ? 0 : rng() % 3 == 0 ? 1 + rng() % 7 : 1 + rng() % 700;
        if (rng() % 5 == 0) base = 997;  // prime: divides by no world > 1
        size_t size = ready == GradReady::PerLayer ? base * m.L : base;
        m.tensors.push_back({size, ready, (int)(rng() % 2)});
    }
    return m;
}

// Random models × world 1..8 × align: the partition's invariants.
static void test_random_partitions() {
    std::mt19937_64 rng(20240601);
    bool cover = true, slots = true, tables = true, memory = true, groups = true, pieces_ok = true;
    size_t plans = 0, max_pad_share = 0;
    for (int trial = 0; trial < 150; trial++) {
        RandomModel m = random_model(rng);
        for (int w = 1; w <= 8; w++)
            for (size_t align : {1, 3, 8}) {
                ZeroPlan p = make_plan(m.tensors, m.L, w, align);
                plans++;
                // Every flat element is owned by exactly one rank.
                std::vector<int> owners(p.num_params, 0);
                size_t owned_total = 0;
                for (int r = 0; r < w; r++) {
                    std::vector<ZeroShardPiece> pieces = zero_shard_pieces(p, r);
                    for (const ZeroShardPiece& pc : pieces) {
                        const ZeroChunk& c = p.chunks[pc.chunk];
                        pieces_ok &= pc.range.begin == zero_piece(c, r).begin && pc.range.end == zero_piece(c, r).end &&
                                     pc.flat_offset == c.offset + pc.range.begin && pc.shard_offset == c.shard_offset &&
                                     pc.range.size() <= c.s;
                        for (size_t j = 0; j < pc.range.size(); j++) owners[pc.flat_offset + j]++;
                    }
                    ZeroMemory mem = zero_memory(p, r);
                    owned_total += mem.owned_elems;
                    memory &= mem.shard_elems == p.shard_size && mem.owned_elems + mem.padding_elems == mem.shard_elems;
                    // The shard table, merged or not, marks exactly the owned slots with their decay.
                    std::vector<int> want(p.shard_size, -1), got(p.shard_size, -1), got_m(p.shard_size, -1);
                    std::vector<int> hits(p.shard_size, 0);
                    for (const ZeroShardPiece& pc : pieces)
                        for (size_t j = 0; j < pc.range.size(); j++) want[pc.shard_offset + j] = pc.weight_decay;
                    auto raw = zero_shard_table<ParamTensor>(p, r, false);
                    auto merged = zero_shard_table<ParamTensor>(p, r, true);
                    tables &= raw.size() == pieces.size() && merged.size() <= raw.size();
                    for (const ParamTensor& e : raw)
                        for (size_t j = 0; j < e.size; j++) {
                            got[e.offset + j] = e.weight_decay;
                            hits[e.offset + j]++;
                        }
                    for (int h : hits) tables &= h <= 1;
                    for (size_t k = 0; k < merged.size(); k++) {
                        const ParamTensor& e = merged[k];
                        tables &= e.size > 0 && e.offset + e.size <= p.shard_size;
                        if (k > 0)  // nothing left to merge: a gap or a different flag separates neighbours
                            tables &= merged[k - 1].offset + merged[k - 1].size < e.offset ||
                                      merged[k - 1].weight_decay != e.weight_decay;
                        for (size_t j = 0; j < e.size; j++) got_m[e.offset + j] = e.weight_decay;
                    }
                    tables &= got == want && got_m == want;
                }
                for (int c : owners) cover &= c == 1;
                memory &= owned_total == p.num_params;
                // Slots: in flat order, disjoint, inside the shard; sizes within the stated bounds.
                std::vector<const ZeroChunk*> by_slot;
                size_t pad_total = 0;
                for (const ZeroChunk& c : p.chunks) {
                    by_slot.push_back(&c);
                    slots &= c.s % align == 0 && c.s * w >= c.n && (c.n == 0 || c.s < (c.n + w - 1) / w + align) &&
                             c.shard_offset + c.s <= p.shard_size;
                    pad_total += c.s * w - c.n;
                    slots &= c.s * w - c.n <= w * align - 1;
                }
                // In slot order (ties: empty slots), slots are back to back and flat offsets never decrease.
                std::sort(by_slot.begin(), by_slot.end(), [](const ZeroChunk* a, const ZeroChunk* b) {
                    return a->shard_offset != b->shard_offset ? a->shard_offset < b->shard_offset : a->s < b->s;
                });
                size_t at = 0, flat = 0;
                for (const ZeroChunk* c : by_slot) {
                    slots &= c->shard_offset == at && c->offset >= flat;
                    at += c->s;
                    flat = c->offset;
                }
                slots &= at == p.shard_size && p.shard_size <= zero_shard_size_bound(p);
                memory &= pad_total == p.shard_size * w - p.num_params;
                if (p.num_params > 0) max_pad_share = std::max(max_pad_share, pad_total * 100 / (p.shard_size * w));
                // Groups partition the chunk list in backward order.
                int expect = 0;
                int stage = 0, last_layer = m.L;
                for (const ZeroGroup& g : p.groups) {
                    groups &= g.begin == expect && g.end > g.begin;
                    expect = g.end;
                    int st = g.ready == GradReady::BeforeLayers ? 0 : g.ready == GradReady::PerLayer ? 1 : 2;
                    groups &= st >= stage;
                    if (st == 1) {
                        groups &= g.layer < last_layer;
                        last_layer = g.layer;
                    }
                    stage = st;
                    for (int k = g.begin; k < g.end; k++)
                        groups &= m.tensors[p.chunks[k].tensor].ready == g.ready && p.chunks[k].layer == g.layer;
                }
                groups &= expect == (int)p.chunks.size();
            }
    }
    th::report(cover, "zero: random models x world 1..8 x align 1/3/8: every element owned by exactly one rank",
               "%zu plans", plans);
    th::report(pieces_ok, "zero: zero_shard_pieces agree with zero_piece (flat and shard offsets)");
    th::report(slots, "zero: slots in flat order, disjoint, s % align == 0, s*world - n <= world*align - 1, "
                      "S <= ceil(N/world) + chunks*align");
    th::report(tables, "zero: shard tables (merged and not) mark exactly the owned slots with their decay flag");
    th::report(memory, "zero: owned + padding = S on every rank; owned sums to N; total padding = S*world - N",
               "largest padding share %zu%% (tiny random chunks)", max_pad_share);
    th::report(groups, "zero: groups partition the chunks in backward order (before, layers descending, after)");
}

// The shard of rank r as values: element i of the flat vector is i + 1, padding holds `pad`.
static std::vector<uint32_t> shard_values(const ZeroPlan& p, int r, uint32_t pad) {
    std::vector<uint32_t> s(p.shard_size, pad);
    for (const ZeroShardPiece& pc : zero_shard_pieces(p, r))
        for (size_t j = 0; j < pc.range.size(); j++) s[pc.shard_offset + j] = (uint32_t)(pc.flat_offset + j + 1);
    return s;
}

// Applies the re-sharding map of new rank r to the old shards; true when it rebuilds exactly the new
// shard: every owned element written once from an owned (not padding) old element, padding untouched.
static bool reshard_rebuilds(const ZeroPlan& old_p, const ZeroPlan& new_p, int r,
                             const std::vector<std::vector<uint32_t>>& old_shards, size_t* ncopies) {
    std::vector<ZeroCopy> copies;
    std::string err;
    if (!zero_reshard(old_p, new_p, r, &copies, &err)) return false;
    *ncopies += copies.size();
    const uint32_t kNewPad = 0;
    std::vector<uint32_t> got(new_p.shard_size, kNewPad);
    std::vector<int> writes(new_p.shard_size, 0);
    for (const ZeroCopy& c : copies) {
        if (c.src_rank < 0 || c.src_rank >= old_p.world || c.count == 0 || c.src_offset + c.count > old_p.shard_size ||
            c.dst_offset + c.count > new_p.shard_size)
            return false;
        for (size_t j = 0; j < c.count; j++) {
            got[c.dst_offset + j] = old_shards[c.src_rank][c.src_offset + j];
            writes[c.dst_offset + j]++;
        }
    }
    for (int w : writes)
        if (w > 1) return false;
    for (size_t k = 1; k < copies.size(); k++) {  // adjacent copies are merged when they can be
        const ZeroCopy &a = copies[k - 1], &b = copies[k];
        if (a.src_rank == b.src_rank && a.src_offset + a.count == b.src_offset && a.dst_offset + a.count == b.dst_offset)
            return false;
    }
    return got == shard_values(new_p, r, kNewPad);
}

// W1 -> W2 for every pair in 1..8 on a GPT-2-like model with sizes that divide by few worlds, and
// on random models with random aligns; the old padding holds a marker that must never arrive.
static void test_reshard() {
    const int L = 3;
    auto t = gpt2_tensors(10, L, 37, 11);  // C = 10, Vp = 37: many chunks do not divide by 3, 4, 6, 7, 8
    bool ok = true;
    size_t pairs = 0, ncopies = 0;
    std::string bad;
    auto check = [&](const std::vector<ZeroTensor>& tensors, int layers, int w1, size_t a1, int w2, size_t a2) {
        ZeroPlan o = make_plan(tensors, layers, w1, a1), n = make_plan(tensors, layers, w2, a2);
        std::vector<std::vector<uint32_t>> old_shards;
        for (int q = 0; q < w1; q++) old_shards.push_back(shard_values(o, q, 0xFFFFFFFFu));
        for (int r = 0; r < w2; r++)
            if (!reshard_rebuilds(o, n, r, old_shards, &ncopies)) {
                ok = false;
                if (bad.empty())
                    bad = std::to_string(w1) + "(align " + std::to_string(a1) + ") -> " + std::to_string(w2) +
                          "(align " + std::to_string(a2) + ") rank " + std::to_string(r);
            }
        pairs++;
    };
    for (int w1 = 1; w1 <= 8; w1++)
        for (int w2 = 1; w2 <= 8; w2++) check(t, L, w1, 1, w2, w1 == w2 ? 4 : 1);
    std::mt19937_64 rng(7);
    const size_t aligns[] = {1, 2, 8};
    for (int trial = 0; trial < 200; trial++) {
        RandomModel m = random_model(rng);
        check(m.tensors, m.L, 1 + (int)(rng() % 8), aligns[rng() % 3], 1 + (int)(rng() % 8), aligns[rng() % 3]);
    }
    th::report(ok, "zero: re-sharding W1 -> W2 rebuilds every new shard exactly (owned elements once, padding untouched)",
               "%s%zu world pairs (all of 1..8 x 1..8 on GPT-2-like, 200 random), %zu copies", bad.c_str(), pairs, ncopies);

    // From a single-GPU state (W = 1, align 1: the flat vector) to 3 ranks, by hand for one piece.
    ZeroPlan one = make_plan(t, L, 1, 1), three = make_plan(t, L, 3, 1);
    std::vector<ZeroCopy> copies;
    std::string err;
    bool from_flat = zero_reshard(one, three, 2, &copies, &err);
    for (const ZeroCopy& c : copies) from_flat &= c.src_rank == 0;
    const ZeroChunk& wte = three.chunks[three.groups[three.group_after].begin];  // wte: 370 elements, s = 124
    bool found = false;
    for (const ZeroCopy& c : copies)
        found |= c.src_offset == wte.offset + 2 * wte.s && c.dst_offset == wte.shard_offset && c.count == wte.n - 2 * wte.s;
    th::report(from_flat && found, "zero: re-sharding a single-GPU (flat) state to 3 ranks reads flat ranges",
               "rank 2's wte piece = flat [%zu, %zu)", wte.offset + 2 * wte.s, wte.offset + wte.n);
}

// GPT-2 124M's numbers with 8 ranks: per-rank shard ~1/8 of the parameters plus a little padding.
static void test_gpt2_124m_memory() {
    const int L = 12;
    auto t = gpt2_tensors(768, L, 50304, 1024);
    for (int w : {2, 7, 8}) {
        ZeroPlan p = make_plan(t, L, w, 8);
        ZeroMemory m0 = zero_memory(p, 0), mlast = zero_memory(p, w - 1);
        size_t ideal = (p.num_params + w - 1) / w;
        bool ok = p.num_params == 124475904 && p.shard_size <= zero_shard_size_bound(p) &&
                  p.shard_size * w - p.num_params <= p.chunks.size() * (w * 8 - 1);
        char name[128];
        snprintf(name, sizeof(name), "zero: GPT-2 124M over %d ranks: shard = N/%d + padding", w, w);
        th::report(ok, name,
                   "N=%zu, S=%zu (N/%d=%zu, +%zu), fp32 AdamW state %.1f MB/rank vs %.1f MB on one GPU; padding "
                   "rank 0 %zu, rank %d %zu",
                   p.num_params, p.shard_size, w, ideal, p.shard_size - ideal, p.shard_size * 8 / 1e6,
                   p.num_params * 8 / 1e6, m0.padding_elems, w - 1, mlast.padding_elems);
    }
}

// Rank-local tensors (expert parallelism): every rank owns each of their chunks whole, in a slot of
// n rounded up to align, and its shard table covers them with their decay flag; the other tensors
// are partitioned as without them; their state cannot move to another world size.
static void test_rank_local() {
    std::vector<ZeroTensor> t = gpt2_tensors(8, 2, 64, 16);
    t.push_back({3 * 40, GradReady::AfterLayers, 1, true});  // an expert tensor of 40 elements per rank, x3
    size_t n_local = 3 * 40;
    bool whole = true, others = true, tables = true;
    for (int world : {2, 3}) {
        ZeroPlan p = make_plan(t, 2, world, 8), q = make_plan(gpt2_tensors(8, 2, 64, 16), 2, world, 8);
        for (const ZeroChunk& c : p.chunks)
            if (c.rank_local)
                for (int r = 0; r < world; r++)
                    whole &= zero_piece(c, r).begin == 0 && zero_piece(c, r).end == c.n && c.s == (c.n + 7) / 8 * 8;
        // the other chunks: as in the plan without the rank-local tensor
        for (size_t i = 0, j = 0; i < p.chunks.size(); i++) {
            if (p.chunks[i].rank_local) continue;
            others &= j < q.chunks.size() && p.chunks[i].s == q.chunks[j].s && p.chunks[i].n == q.chunks[j].n;
            j++;
        }
        for (int r = 0; r < world; r++) {
            size_t owned = 0, decayed = 0;
            for (const ParamTensor& e : zero_shard_table<ParamTensor>(p, r, false)) {
                owned += e.size;
                if (e.offset >= p.chunks.back().shard_offset) decayed += e.weight_decay ? e.size : 0;
            }
            tables &= owned == zero_memory(q, r).owned_elems + n_local && decayed == n_local;
        }
    }
    th::report(whole, "zero: rank-local chunks are owned whole by every rank (s = n rounded to align)");
    th::report(others, "zero: the other chunks are partitioned as without the rank-local tensor");
    th::report(tables, "zero: every rank's shard table covers its pieces plus the whole rank-local tensor (decay kept)");
    ZeroPlan two = make_plan(t, 2, 2, 8), three = make_plan(t, 2, 3, 8);
    std::vector<ZeroCopy> copies;
    std::string err;
    bool refused = !zero_reshard(two, three, 0, &copies, &err) && err.find("rank-local") != std::string::npos;
    th::report(refused, "zero: error: re-sharding a rank-local tensor's state onto another world", "%s", err.c_str());
}

// Impossible requests come back as false with a message naming the problem.
static void test_errors() {
    ZeroPlan p;
    std::string err;
    bool a = !zero_plan(&p, {{10, GradReady::PerLayer, 0}}, 3, 2, 1, &err) && err.find("do not divide") != std::string::npos;
    th::report(a, "zero: error: a per-layer tensor that does not divide into L layers", "%s", err.c_str());
    err.clear();
    bool b = !zero_plan(&p, {{10, GradReady::AfterLayers, 0}}, 0, 0, 1, &err) && err.find("world") != std::string::npos;
    th::report(b, "zero: error: world 0", "%s", err.c_str());
    ZeroPlan x = make_plan({{10, GradReady::AfterLayers, 0}}, 0, 2, 1), y = make_plan({{11, GradReady::AfterLayers, 0}}, 0, 2, 1);
    std::vector<ZeroCopy> copies;
    err.clear();
    bool c = !zero_reshard(x, y, 0, &copies, &err) && err.find("not of this model") != std::string::npos;
    th::report(c, "zero: error: re-sharding shards of another model", "%s", err.c_str());
    err.clear();
    bool d = !zero_reshard(x, x, 2, &copies, &err) && err.find("rank 2") != std::string::npos;
    th::report(d, "zero: error: re-sharding for a rank outside the new world", "%s", err.c_str());
}

int main() {
    test_gpt2_order();
    test_pieces_exhaustive();
    test_world1_is_flat();
    test_random_partitions();
    test_reshard();
    test_gpt2_124m_memory();
    test_rank_local();
    test_errors();
    return th::finish();
}
