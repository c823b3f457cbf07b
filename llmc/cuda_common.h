// llmc/cuda_common.h — what every kernel file, test and trainer shares: the error-check macro, the
// launch helper, dynamic shared memory and CEIL_DIV. Compiles with nvcc and with the CPU backend.
#pragma once
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <utility>

#include "fatal.h"

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))


// Evaluates a CUDA runtime call once; on failure prints the error, the statement, file and line,
// and exits (a failed allocation or launch leaves nothing worth continuing with).
#define cudaCheck(call)                                                                       \
    do {                                                                                      \
        cudaError_t err_ = (call);                                                            \
        if (err_ != cudaSuccess) {                                                            \
            fprintf(stderr, "%s[CUDA ERROR] %s (%s)\n  in: %s\n  at %s:%d\n", fatal_error_prefix, \
                    cudaGetErrorString(err_), cudaGetErrorName(err_), #call, __FILE__, __LINE__); \
            fatal_exit();                                                                     \
        }                                                                                     \
    } while (0)

// Launches kernel<<<grid, block, smem, stream>>>(args...) through cudaLaunchKernelEx, the form both
// nvcc and the CPU backend's g++ build accept, and returns the launch's error code.
template <class... KArgs, class... Args>
inline cudaError_t launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                 cudaStream_t stream, Args&&... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
    cudaError_t last = cudaGetLastError();  // read (and clear) it either way, so it cannot linger
    return err != cudaSuccess ? err : last;
}

// The block's dynamic shared memory as T* (sized by the launch). On the CPU backend it is an
// exactly-sized allocation, so AddressSanitizer catches accesses past the requested size.
template <class T>
__device__ inline T* dynamic_shared() {
#if defined(SIMT_CPU)
    return static_cast<T*>(simt::dynamic_shared_memory());
#else
    extern __shared__ __align__(128) unsigned char dynamic_smem_[];
    return reinterpret_cast<T*>(dynamic_smem_);
#endif
}

// Kernel launches since start-up, counted by the CPU backend (a GPU build has no counter: -1).
// The trainers report launches per step with it.
inline long long kernel_launch_count() {
#if defined(SIMT_CPU)
    return (long long)simt::launch_count();
#else
    return -1;
#endif
}

// True when this build runs on the CPU backend rather than a GPU (programs pick smaller defaults).
constexpr bool on_cpu_backend() {
#if defined(SIMT_CPU)
    return true;
#else
    return false;
#endif
}

// On the CPU backend, runs blocks on every core (shared among the `processes` of this node, e.g. the
// ranks of a data-parallel run) unless SIMT_THREADS chose otherwise (the kernels are deterministic,
// so the worker count does not change results); nothing to do on a GPU.
inline void use_all_cpu_cores(int processes = 1) {
#if defined(SIMT_CPU)
    int cores = (int)std::thread::hardware_concurrency();
    if (!getenv("SIMT_THREADS")) simt::set_workers(std::max(1, cores / std::max(1, processes)));
#else
    (void)processes;
#endif
}
