// test/counted_malloc.h — counts the cudaMalloc calls of the source included after it, up to the
// test's `#undef cudaMalloc`: the memory-anatomy checks need to know how many allocations a GPU may
// have rounded up to its pages (th::device_bytes_match).
#pragma once
#include "../llmc/cuda_common.h"

static size_t g_device_allocations = 0;
template <class T>
cudaError_t counted_cudaMalloc(T** ptr, size_t bytes) {
    g_device_allocations++;
    return cudaMalloc(ptr, bytes);
}
#define cudaMalloc counted_cudaMalloc
