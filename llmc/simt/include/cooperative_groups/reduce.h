// llmc/simt/include/cooperative_groups/reduce.h — the CPU backend's stand-in for <cooperative_groups/reduce.h>: cg::reduce over a tile and the operator functors.
//
// cg::reduce combines the values of a thread_block_tile with the same butterfly CUDA's header
// uses for tiles (out = op(out, shfl_xor(out, m)) for m = Size/2 ... 1), so floating-point sums
// come out in the GPU's order, bit for bit, and every thread of the tile gets the result. (For
// 32-bit integers with plus/less/greater/bit ops, sm_80+ GPUs use the redux instruction instead;
// those results are order-independent, hence identical.) Only used by the CPU backend.
#pragma once

#include "../cooperative_groups.h"

#include <type_traits>

namespace cooperative_groups {

// ----------------------------------------------------------------------------
// Operators (the same definitions as CUDA's, including which argument wins a tie)

template <typename Ty>
struct plus {
    Ty operator()(Ty a, Ty b) const { return a + b; }
};
template <typename Ty>
struct less {
    Ty operator()(Ty a, Ty b) const { return (b < a) ? b : a; }
};
template <typename Ty>
struct greater {
    Ty operator()(Ty a, Ty b) const { return (a < b) ? b : a; }
};
template <typename Ty>
struct bit_and {
    Ty operator()(Ty a, Ty b) const { return a & b; }
};
template <typename Ty>
struct bit_or {
    Ty operator()(Ty a, Ty b) const { return a | b; }
};
template <typename Ty>
struct bit_xor {
    Ty operator()(Ty a, Ty b) const { return a ^ b; }
};

// ----------------------------------------------------------------------------
// reduce

// Reduces val over the threads of a tile with op (any callable, e.g. cg::plus<float>() or a
// lambda); every thread of the tile receives the result.
template <unsigned Size, typename ParentT, typename TyVal, typename TyFn>
inline auto reduce(const thread_block_tile<Size, ParentT>& group, TyVal&& val, TyFn&& op,
                   const char* file = __builtin_FILE(), int line = __builtin_LINE()) -> decltype(op(val, val)) {
    using T = std::remove_cv_t<std::remove_reference_t<TyVal>>;
    static_assert(std::is_same<T, std::remove_cv_t<std::remove_reference_t<decltype(op(val, val))>>>::value,
                  "cg::reduce: Operator input and output types differ");
    T out = val;
    for (unsigned mask = Size >> 1; mask > 0; mask >>= 1) out = op(out, group.shfl_xor(out, mask, file, line));
    return out;
}

// Any other group: CUDA only reduces over tiles, so neither do we (a compile-time error).
template <typename TyGroup, typename TyVal, typename TyFn>
inline auto reduce(const TyGroup&, TyVal&& val, TyFn&& op) -> decltype(op(val, val)) {
    static_assert(details::is_static_tile<TyGroup>::value,
                  "cg::reduce: This group does not exclusively represent a tile (use tiled_partition<N>)");
    return val;
}

}  // namespace cooperative_groups
