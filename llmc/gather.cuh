// llmc/gather.cuh — row gather and its backward: copies the rows of a (N,C) tensor named by an index
// list into a compact (M,C) tensor (BERT: the masked positions before the MLM head, so that no
// (B,T,V) logits exist for tokens without a label; the [CLS] rows before the pooler), and writes the
// compact gradient back to those rows with zeros everywhere else.
//
// Determinism. The rows of one gather are distinct (gather_slot_map checks it), so the backward is a
// scatter in which no two sources meet: no sums, no atomics. It is written as one pass over the N
// destination rows, each looking up in a slot map (N ints: the compact row it was gathered into, or
// -1) what to write, so every element is written exactly once — no memset of the (N,C) gradient
// first, and the result is the same bits under any schedule.
#pragma once
#include "cuda_common.h"
#include "precision.cuh"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <vector>

// ----------------------------------------------------------------------------
// CUDA kernels

// Copies VEC elements from src to dst: one 128-bit access when VEC is the pack width (the launcher
// checked C and the alignment), element by element otherwise. A copy, no conversion: exact.
template <int VEC, class T>
__device__ inline void gather_copy(T* dst, const T* src) {
    if constexpr (VEC == Packed128<T>::size) {
        store128(dst, load128(src));
    } else {
        for (int k = 0; k < VEC; k++) dst[k] = src[k];
    }
}

// One thread per VEC channels of one gathered row: out[i] = inp[rows[i]]. C % VEC == 0.
template <class T, int VEC>
__global__ void gather_rows_kernel(T* out, const T* inp, const int* rows, int M, int C) {
    int packs = C / VEC;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)M * packs) return;
    int i = (int)(idx / packs), c = (int)(idx % packs) * VEC;
    gather_copy<VEC>(out + (size_t)i * C + c, inp + (size_t)rows[i] * C + c);
}

// One thread per VEC channels of one destination row n: dinp[n] = dout[slot[n]], or zeros when the
// row was not gathered (slot[n] < 0). C % VEC == 0.
template <class T, int VEC>
__global__ void scatter_rows_kernel(T* dinp, const T* dout, const int* slot, int N, int C) {
    int packs = C / VEC;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * packs) return;
    int n = (int)(idx / packs), c = (int)(idx % packs) * VEC;
    int s = slot[n];
    T* dst = dinp + (size_t)n * C + c;
    if (s >= 0) {
        gather_copy<VEC>(dst, dout + (size_t)s * C + c);
    } else if constexpr (VEC == Packed128<T>::size) {
        store128(dst, Packed128<T>::zeros());
    } else {
        for (int k = 0; k < VEC; k++) dst[k] = from_float<T>(0.f);
    }
}

// ----------------------------------------------------------------------------
// kernel launchers

// Host side: checks that rows (M host ints) are distinct rows of [0, N) and fills slot (N host ints)
// with the inverse map scatter_rows needs: slot[rows[i]] = i, -1 for rows not gathered. Exits with a
// message naming the first bad entry (a bad row would read or write outside the tensors).
inline void gather_slot_map(const int* rows, int M, int N, std::vector<int>* slot) {
    if (M < 0 || N < 0) {
        fprintf(stderr, "gather_slot_map: need M >= 0 and N >= 0, got M=%d N=%d\n", M, N);
        exit(EXIT_FAILURE);
    }
    slot->assign((size_t)N, -1);
    for (int i = 0; i < M; i++) {
        if (rows[i] < 0 || rows[i] >= N) {
            fprintf(stderr, "gather_slot_map: row %d (entry %d) is outside [0, %d)\n", rows[i], i, N);
            exit(EXIT_FAILURE);
        }
        if ((*slot)[rows[i]] >= 0) {
            fprintf(stderr, "gather_slot_map: row %d is listed twice (entries %d and %d): the rows of a gather must "
                    "be distinct\n", rows[i], (*slot)[rows[i]], i);
            exit(EXIT_FAILURE);
        }
        (*slot)[rows[i]] = i;
    }
}

// out (M,C) = inp (N,C) at rows (M device ints, each in [0, N); the device cannot check them, the
// host list goes through gather_slot_map first).
template <class T>
void gather_rows(T* out, const T* inp, const int* rows, int M, int C, cudaStream_t stream) {
    if (M < 0 || C <= 0) {
        fprintf(stderr, "gather_rows: need M >= 0 rows and C > 0 channels, got M=%d C=%d\n", M, C);
        exit(EXIT_FAILURE);
    }
    if (M == 0) return;
    const int block_size = 256;
    if (rows_pack128<T>(C, {out, inp})) {
        constexpr int P = Packed128<T>::size;
        size_t threads = (size_t)M * (C / P);
        cudaCheck(launch_kernel(gather_rows_kernel<T, P>, dim3((unsigned)CEIL_DIV(threads, (size_t)block_size)),
                                dim3(block_size), 0, stream, out, inp, rows, M, C));
    } else {
        size_t threads = (size_t)M * C;
        cudaCheck(launch_kernel(gather_rows_kernel<T, 1>, dim3((unsigned)CEIL_DIV(threads, (size_t)block_size)),
                                dim3(block_size), 0, stream, out, inp, rows, M, C));
    }
}

// The backward of gather_rows: dinp (N,C, overwritten) = dout[slot[n]] for the gathered rows and 0
// for the others; slot (N device ints) is gather_slot_map's map for the same rows.
template <class T>
void scatter_rows(T* dinp, const T* dout, const int* slot, int N, int C, cudaStream_t stream) {
    if (N < 0 || C <= 0) {
        fprintf(stderr, "scatter_rows: need N >= 0 rows and C > 0 channels, got N=%d C=%d\n", N, C);
        exit(EXIT_FAILURE);
    }
    if (N == 0) return;
    const int block_size = 256;
    if (rows_pack128<T>(C, {dinp, dout})) {
        constexpr int P = Packed128<T>::size;
        size_t threads = (size_t)N * (C / P);
        cudaCheck(launch_kernel(scatter_rows_kernel<T, P>, dim3((unsigned)CEIL_DIV(threads, (size_t)block_size)),
                                dim3(block_size), 0, stream, dinp, dout, slot, N, C));
    } else {
        size_t threads = (size_t)N * C;
        cudaCheck(launch_kernel(scatter_rows_kernel<T, 1>, dim3((unsigned)CEIL_DIV(threads, (size_t)block_size)),
                                dim3(block_size), 0, stream, dinp, dout, slot, N, C));
    }
}
