// llmc/simt/include/cooperative_groups.h — the CPU backend's stand-in for <cooperative_groups.h>: thread blocks and statically sized warp tiles over the backend's barriers and warp collectives.
//
// The subset llm.c-style kernels use: this_thread_block() (sync, ranks, indices, dims),
// tiled_partition<N>(block or tile) for N in {1, 2, 4, 8, 16, 32} with shuffles, votes and
// matches, the generic thread_group, and the free functions sync/thread_rank/group_size.
// cg::reduce and the operator functors live in <cooperative_groups/reduce.h>, as in CUDA, so code
// that compiles here also compiles with nvcc. Names and signatures follow the toolkit's header
// (CUDA 13). A tile's collectives pass only the tile's own lanes as the mask, as CUDA does, so a
// tile of 8 never waits for the lanes of its neighbour tiles.
//
// Every collective takes the caller's file and line as defaulted trailing arguments: the
// scheduler names them when it reports a deadlock or a divergent barrier, instead of naming this
// header. Not provided: grid_group / this_grid (needs cooperative launch), cluster_group,
// coalesced_group / coalesced_threads, tiles of more than 32 threads, scan, memcpy_async.
// Only used by the CPU backend: nvcc builds get the toolkit's header.
#pragma once

#include "cuda_runtime.h"

#include <cstring>
#include <type_traits>

namespace cooperative_groups {

namespace details {

// Linear rank of the calling thread in its block (x fastest), which is also how warps are formed.
inline unsigned cta_rank() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
inline unsigned cta_size() { return blockDim.x * blockDim.y * blockDim.z; }

// Mask of the lanes of the calling thread's tile of `size` threads (size a power of two <= 32).
inline unsigned tile_mask(unsigned size) {
    if (size >= 32) return 0xffffffffu;
    return ((1u << size) - 1u) << (simt::lane_id() & ~(size - 1u));
}

// A warp shuffle of any trivially copyable value: values wider than the 8 bytes the scheduler
// moves at once travel in 8-byte pieces, as CUDA's own header splits them into 4-byte ones.
template <class T>
inline T shuffle(simt::WarpOp op, unsigned mask, const T& v, int arg, int width, const char* file, int line) {
    static_assert(std::is_trivially_copyable<T>::value, "cooperative_groups shuffles need a trivially copyable type");
    unsigned char in[sizeof(T)], out[sizeof(T)];
    std::memcpy(in, &v, sizeof(T));
    for (size_t off = 0; off < sizeof(T); off += 8) {
        size_t n = sizeof(T) - off < 8 ? sizeof(T) - off : 8;
        uint64_t bits = 0;
        std::memcpy(&bits, in + off, n);
        bits = simt::warp_collective(op, mask, bits, arg, width, file, line);
        std::memcpy(out + off, &bits, n);
    }
    T r;
    std::memcpy(&r, out, sizeof(T));
    return r;
}

constexpr unsigned thread_block_id = 1;
constexpr unsigned tile_id = 2;

}  // namespace details

// ----------------------------------------------------------------------------
// thread_group: the type every group converts to (dispatches on what it holds)

// A group of threads of unknown kind: a whole block or a tile of a warp.
class thread_group {
  protected:
    unsigned type_;               // details::thread_block_id or details::tile_id
    unsigned tile_size_ = 0;      // tiles: the nominal size (power of two <= 32)
    unsigned mask_ = 0;           // tiles: the lanes of this tile in the warp
    unsigned meta_rank_ = 0;      // tiles: index of this tile among its parent's tiles
    unsigned meta_size_ = 1;      // tiles: number of tiles of the parent
    explicit thread_group(unsigned type) : type_(type) {}

  public:
    // Number of threads in the group (a partial last tile counts only its existing threads).
    unsigned long long size() const {
        return type_ == details::thread_block_id ? details::cta_size() : (unsigned)__builtin_popcount(mask_);
    }
    // (No num_threads(): CUDA 13 declares thread_group::num_threads() but never defines it, nvcc
    // reports "referenced but not defined", so code using it must not build here either.)
    // Rank of the calling thread in the group, in [0, size()).
    unsigned long long thread_rank() const {
        return type_ == details::thread_block_id ? details::cta_rank() : (details::cta_rank() & (tile_size_ - 1));
    }
    // Waits until every thread of the group arrives (__syncthreads for a block, __syncwarp for a tile).
    void sync(const char* file = __builtin_FILE(), int line = __builtin_LINE()) const {
        if (type_ == details::thread_block_id) __syncthreads(file, line);
        else __syncwarp(mask_, file, line);
    }
    // Which kind of group this is (details::thread_block_id or details::tile_id).
    unsigned get_type() const { return type_; }
    friend thread_group tiled_partition(const thread_group& parent, unsigned tilesz, const char*, int);
};

// ----------------------------------------------------------------------------
// thread_block

// The calling thread's block: this_thread_block() is the only way to get one, as in CUDA.
class thread_block : public thread_group {
    friend thread_block this_thread_block();
    thread_block() : thread_group(details::thread_block_id) {}

  public:
    static constexpr unsigned _group_id = details::thread_block_id;
    // __syncthreads() for the whole block.
    static void sync(const char* file = __builtin_FILE(), int line = __builtin_LINE()) { __syncthreads(file, line); }
    // Threads in the block, and the caller's linear rank (x fastest, then y, then z).
    static unsigned size() { return details::cta_size(); }
    static unsigned num_threads() { return details::cta_size(); }
    static unsigned thread_rank() { return details::cta_rank(); }
    // blockIdx, threadIdx and blockDim as dim3 values.
    static dim3 group_index() { return dim3(blockIdx.x, blockIdx.y, blockIdx.z); }
    static dim3 thread_index() { return dim3(threadIdx.x, threadIdx.y, threadIdx.z); }
    static dim3 group_dim() { return blockDim; }
    static dim3 dim_threads() { return blockDim; }
};

// Returns the calling thread's block.
inline thread_block this_thread_block() { return thread_block(); }

// ----------------------------------------------------------------------------
// thread_block_tile<Size, ParentT>: Size consecutive threads of one warp

// A statically sized tile of a block or of a larger tile; ParentT = void is the type-erased form
// every tile converts to (`thread_block_tile<32> warp = tiled_partition<32>(block);`).
template <unsigned Size, typename ParentT = void>
class thread_block_tile : public thread_group {
    static_assert(Size == 1 || Size == 2 || Size == 4 || Size == 8 || Size == 16 || Size == 32,
                  "thread_block_tile: Size must be one of 1/2/4/8/16/32 (larger tiles are not supported by the "
                  "CPU backend)");
    template <unsigned, typename>
    friend class thread_block_tile;
    template <unsigned S, typename P>
    friend thread_block_tile<S, P> tiled_partition(const P& parent);
    friend thread_block_tile<1, void> this_thread();

    // Only tiled_partition and this_thread make tiles, as in CUDA.
    thread_block_tile(unsigned meta_rank, unsigned meta_size) : thread_group(details::tile_id) {
        tile_size_ = Size;
        mask_ = details::tile_mask(Size);
        meta_rank_ = meta_rank;
        meta_size_ = meta_size;
    }

  public:
    static constexpr unsigned _group_id = details::tile_id;

    // The same tile seen through the parent-erased type.
    template <typename OtherParent>
    thread_block_tile(const thread_block_tile<Size, OtherParent>& g) : thread_group(details::tile_id) {
        tile_size_ = Size;
        mask_ = g.mask_;
        meta_rank_ = g.meta_rank_;
        meta_size_ = g.meta_size_;
    }

    // Rank of the caller in the tile, and the tile's size.
    static unsigned thread_rank() { return details::cta_rank() & (Size - 1); }
    static constexpr unsigned num_threads() { return Size; }
    static constexpr unsigned size() { return Size; }
    // Index of this tile among the parent's tiles, and how many tiles the parent was cut into.
    unsigned meta_group_rank() const { return meta_rank_; }
    unsigned meta_group_size() const { return meta_size_; }
    // The lanes of this tile within the warp (what its collectives pass as mask).
    static unsigned build_mask() { return details::tile_mask(Size); }

    // __syncwarp over the tile's lanes.
    static void sync(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
        __syncwarp(build_mask(), file, line);
    }

    // Value of elem held by the tile's thread of rank src_rank (taken modulo Size).
    template <typename T>
    std::remove_cv_t<std::remove_reference_t<T>> shfl(T&& elem, int src_rank, const char* file = __builtin_FILE(),
                                                     int line = __builtin_LINE()) const {
        return details::shuffle(simt::WarpOp::ShflIdx, build_mask(), elem, src_rank, (int)Size, file, line);
    }
    // Value held by rank + delta (own value when that is past the tile's end).
    template <typename T>
    std::remove_cv_t<std::remove_reference_t<T>> shfl_down(T&& elem, unsigned delta, const char* file = __builtin_FILE(),
                                                          int line = __builtin_LINE()) const {
        return details::shuffle(simt::WarpOp::ShflDown, build_mask(), elem, (int)delta, (int)Size, file, line);
    }
    // Value held by rank - delta (own value when that is before the tile's start).
    template <typename T>
    std::remove_cv_t<std::remove_reference_t<T>> shfl_up(T&& elem, unsigned delta, const char* file = __builtin_FILE(),
                                                        int line = __builtin_LINE()) const {
        return details::shuffle(simt::WarpOp::ShflUp, build_mask(), elem, (int)delta, (int)Size, file, line);
    }
    // Value held by rank ^ lane_mask (the butterfly step of reductions).
    template <typename T>
    std::remove_cv_t<std::remove_reference_t<T>> shfl_xor(T&& elem, unsigned lane_mask, const char* file = __builtin_FILE(),
                                                         int line = __builtin_LINE()) const {
        return details::shuffle(simt::WarpOp::ShflXor, build_mask(), elem, (int)lane_mask, (int)Size, file, line);
    }

    // Whether any / every thread of the tile has a non-zero predicate.
    int any(int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) const {
        return __ballot_sync(build_mask(), predicate, file, line) != 0;
    }
    int all(int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) const {
        unsigned m = build_mask();
        return __ballot_sync(m, predicate, file, line) == m;
    }
    // Bit r set when the tile's thread of rank r has a non-zero predicate.
    unsigned ballot(int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) const {
        return __ballot_sync(build_mask(), predicate, file, line) >> (simt::lane_id() & ~(Size - 1));
    }
    // Ranks of the tile's threads holding the same value as the caller (bit r for rank r).
    template <typename T>
    unsigned match_any(T val, const char* file = __builtin_FILE(), int line = __builtin_LINE()) const {
        return __match_any_sync(build_mask(), val, file, line) >> (simt::lane_id() & ~(Size - 1));
    }
    // All ranks when every thread holds the same value (pred = 1), else 0 (pred = 0).
    template <typename T>
    unsigned match_all(T val, int& pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) const {
        unsigned m = build_mask();
        bool same = __match_any_sync(m, val, file, line) == m;
        pred = same;
        return same ? m >> (simt::lane_id() & ~(Size - 1)) : 0u;
    }
};

namespace details {
// Whether G is a thread_block_tile, and its size (0 for anything else).
template <class G>
struct is_static_tile : std::false_type {
    static constexpr unsigned size = 0;
};
template <unsigned S, class P>
struct is_static_tile<thread_block_tile<S, P>> : std::true_type {
    static constexpr unsigned size = S;
};
}  // namespace details

// Cuts a block, or a larger tile, into tiles of Size threads and returns the caller's.
template <unsigned Size, typename ParentT>
thread_block_tile<Size, ParentT> tiled_partition(const ParentT& parent) {
    static_assert(std::is_same<ParentT, thread_block>::value || details::is_static_tile<ParentT>::value,
                  "tiled_partition<Size>: the parent must be a thread_block or a thread_block_tile");
    static_assert(!details::is_static_tile<ParentT>::value || Size < details::is_static_tile<ParentT>::size,
                  "tiled_partition<Size>: the tile must be smaller than its parent tile");
    unsigned rank = (unsigned)parent.thread_rank(), n = (unsigned)parent.size();
    return thread_block_tile<Size, ParentT>(rank / Size, (n + Size - 1) / Size);
}

// Cuts a block or a tile into tiles of tilesz threads (a power of two <= 32) at run time. The last
// tile of a block whose size is not a multiple of tilesz holds only the threads that exist.
inline thread_group tiled_partition(const thread_group& parent, unsigned tilesz, const char* file = __builtin_FILE(),
                                    int line = __builtin_LINE()) {
    if (tilesz == 0 || tilesz > 32 || (tilesz & (tilesz - 1)))
        simt::fault("tiled_partition: tile size must be a power of two in [1, 32]", file, line);
    thread_group g(details::tile_id);
    unsigned rank = (unsigned)parent.thread_rank(), n = (unsigned)parent.size();
    unsigned base = rank & ~(tilesz - 1);
    unsigned len = n - base < tilesz ? n - base : tilesz;
    g.tile_size_ = tilesz;
    g.mask_ = (len >= 32 ? 0xffffffffu : (1u << len) - 1u) << (simt::lane_id() & ~(tilesz - 1));
    g.meta_rank_ = details::cta_rank() / tilesz;
    g.meta_size_ = (details::cta_size() + tilesz - 1) / tilesz;
    return g;
}

// The calling thread alone, as a tile of one (meta group rank 0 of 1, as in CUDA).
inline thread_block_tile<1, void> this_thread() { return thread_block_tile<1, void>(0, 1); }

// ----------------------------------------------------------------------------
// Free functions over any group

// cg::sync(g), cg::thread_rank(g), cg::group_size(g): the member functions called as functions.
template <class GroupT>
inline void sync(const GroupT& g, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    g.sync(file, line);
}
template <class GroupT>
inline auto thread_rank(const GroupT& g) -> decltype(g.thread_rank()) {
    return g.thread_rank();
}
template <class GroupT>
inline auto group_size(const GroupT& g) -> decltype(g.num_threads()) {
    return g.num_threads();
}

}  // namespace cooperative_groups
