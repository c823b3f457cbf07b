// llmc/simt/internal.h — what the CPU backend's runtime and scheduler share, not seen by kernels.
#pragma once
#include <cuda_runtime.h>

namespace simt {

// The virtual device the backend presents (documented in README, "The CPU backend").
constexpr int kSmCount = 8;
constexpr int kMaxThreadsPerBlock = 1024;
constexpr int kMaxThreadsPerSm = 2048;
constexpr int kMaxBlocksPerSm = 32;
constexpr size_t kDefaultSmemPerBlock = 48 * 1024;   // usable without opting in, as on GPUs
constexpr size_t kMaxSmemPerBlockOptin = 227 * 1024; // H100's opt-in limit
constexpr size_t kSmemPerSm = 228 * 1024;

// The dynamic shared memory limit a kernel opted in to with cudaFuncSetAttribute (default 48 KiB).
size_t max_dynamic_smem(const void* kernel);

// Records err as the calling thread's last error (cudaGetLastError returns and clears it).
cudaError_t set_last_error(cudaError_t err);

// Demangled name of a kernel from its address, for messages ("kernel at 0x..." if unknown).
const char* kernel_name(const void* kernel, char* buf, size_t len);

}  // namespace simt
