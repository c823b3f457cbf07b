// test/simt/test_simt.cu — the CPU backend's own tests: every SIMT feature the project relies on, the
// runtime API subset, and planted bugs that must be caught (run in child processes).
// The feature tests are plain CUDA and also run on a real GPU; planted bugs are CPU-backend only.
#include "../../llmc/cuda_common.h"
#include "../../llmc/mfu.h"
#include "../harness.h"
#include "stream_cases.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

// ----------------------------------------------------------------------------
// Kernels under test

// Every thread writes its coordinates, so the test can check built-ins for 3-D grids and blocks.
__global__ void builtins_kernel(uint4* out) {
    unsigned bid = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned nthreads = blockDim.x * blockDim.y * blockDim.z;
    out[bid * nthreads + tid] = make_uint4(threadIdx.x | threadIdx.y << 10 | threadIdx.z << 20,
                                           blockIdx.x | blockIdx.y << 10 | blockIdx.z << 20,
                                           blockDim.x | blockDim.y << 10 | blockDim.z << 20,
                                           gridDim.x | gridDim.y << 10 | gridDim.z << 20);
}

// Reverses each block's slice through static shared memory: needs the barrier between the write
// and the read. With `racy`, the barrier is left out (the planted missing __syncthreads).
template <bool racy>
__global__ void reverse_kernel(const float* in, float* out, int n) {
    __shared__ float tile[256];
    int base = blockIdx.x * blockDim.x;
    int i = base + threadIdx.x;
    tile[threadIdx.x] = i < n ? in[i] : 0.f;
    if (!racy) __syncthreads();
    int j = base + blockDim.x - 1 - threadIdx.x;
    if (i < n) out[i] = j < n ? tile[blockDim.x - 1 - threadIdx.x] : -1.f;
}

// The counted barrier forms; threads >= active return early and must not block the barrier.
__global__ void barrier_forms_kernel(int* out, int active) {
    if ((int)threadIdx.x >= active) return;
    int pred = threadIdx.x % 3 == 0;
    int c = __syncthreads_count(pred);
    int a = __syncthreads_and(threadIdx.x < 1000);
    int o = __syncthreads_or(threadIdx.x == 5);
    int a2 = __syncthreads_and(pred);
    if (threadIdx.x == 0) {
        out[0] = c;
        out[1] = a;
        out[2] = o;
        out[3] = a2;
    }
}

// All four shuffles at one width, on int values = lane * 10 + block, in a 64-thread block.
__global__ void shuffle_kernel(int* out, int width, int arg) {
    int v = (int)threadIdx.x * 10 + (int)blockIdx.x;
    int t = threadIdx.x;
    int n = blockDim.x;
    out[0 * n + t] = __shfl_sync(0xffffffffu, v, arg, width);
    out[1 * n + t] = __shfl_up_sync(0xffffffffu, v, (unsigned)arg, width);
    out[2 * n + t] = __shfl_down_sync(0xffffffffu, v, (unsigned)arg, width);
    out[3 * n + t] = __shfl_xor_sync(0xffffffffu, v, arg, width);
}

// Votes and matches; the second half of each warp uses its own half mask.
__global__ void vote_kernel(unsigned* out) {
    unsigned lane = threadIdx.x % 32;
    unsigned* o = out + threadIdx.x * 8;
    int pred = (threadIdx.x * 7) % 5 == 0;
    o[0] = __ballot_sync(0xffffffffu, pred);
    o[1] = __any_sync(0xffffffffu, pred);
    o[2] = __all_sync(0xffffffffu, lane < 32);
    o[3] = __match_any_sync(0xffffffffu, lane % 3);
    o[4] = __reduce_add_sync(0xffffffffu, lane);
    o[5] = __reduce_max_sync(0xffffffffu, lane * 3 % 17);
    unsigned half = lane < 16 ? 0x0000ffffu : 0xffff0000u;
    o[6] = __reduce_min_sync(half, lane + 100);
    __syncwarp(half);
    o[7] = __shfl_xor_sync(half, lane, 1);
}

// Sums each row with a grid-stride loop, warp shuffles and a block reduction through shared
// memory (the shape of llm.c's reductions); blockDim.x is a multiple of 32.
__global__ void row_sum_kernel(const float* x, float* out, int cols) {
    __shared__ float partial[32];
    const float* row = x + (size_t)blockIdx.x * cols;
    float s = 0.f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) s += row[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) partial[warp] = s;
    __syncthreads();
    s = lane < (int)blockDim.x / 32 ? partial[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}

// Atomics from many blocks into a few counters.
__global__ void atomics_kernel(int* ints, unsigned* uints, float* floats, unsigned long long* ulls) {
    int id = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(&ints[0], 1);
    atomicMax(&ints[1], id);
    atomicMin(&ints[2], -id);
    atomicAdd(&uints[0], 2u);
    atomicSub(&ints[3], 1);
    atomicAdd(&floats[0], 0.5f);  // exact: every partial sum is representable
    atomicAdd(&ulls[0], 3ull);
    // A CAS-built lock-free max, as kernels do for types without a native atomic.
    int old = ints[4], assumed;
    do {
        assumed = old;
        old = atomicCAS(&ints[4], assumed, assumed > id * 2 ? assumed : id * 2);
    } while (old != assumed);
    if (id == 7) atomicExch(&ints[5], 42);
}

// Dynamic shared memory larger than the 48 KiB default (needs the opt-in attribute).
__global__ void dynamic_smem_kernel(const float* in, float* out, int n) {
    float* buf = dynamic_shared<float>();
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = in[i] * 2.f;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = buf[n - 1 - i];
}

// Cache-hinted loads/stores, 128-bit packed access, math and bit intrinsics, 16/8-bit floats.
__global__ void intrinsics_kernel(const float4* in, float4* out, float* f, unsigned* u) {
    float4 v = __ldcs(in + threadIdx.x);
    __stcs(out + threadIdx.x, make_float4(v.w, v.z, v.y, v.x));
    if (threadIdx.x != 0) return;
    float x = __ldg(&f[0]);
    f[1] = __expf(x);
    f[2] = rsqrtf(x);
    f[3] = __fdividef(1.f, x);
    f[4] = __bfloat162float(__float2bfloat16(x));
    f[5] = __half2float(__float2half(x));
    f[6] = float(__nv_fp8_e4m3(x));
    f[7] = float(__nv_fp8_e5m2(x));
    f[8] = fmaxf(x, 2.f) + fminf(x, 2.f);
    f[9] = __int_as_float(__float_as_int(x));
    u[0] = __popc(0xf0f0u);
    u[1] = __clz(1);
    u[2] = __ffs(8);
    u[3] = __brev(1u);
    u[4] = max(3u, 7u) + min(3, 7);
}

// ----------------------------------------------------------------------------
// Feature tests

void test_builtins() {
    dim3 grid(3, 2, 2), block(5, 4, 3);
    int nblocks = 12, nthreads = 60;
    th::DeviceBuffer<uint4> out(nblocks * nthreads);
    cudaCheck(launch_kernel(builtins_kernel, grid, block, 0, 0, out.ptr));
    auto h = out.host();
    size_t bad = 0;
    for (unsigned bz = 0; bz < 2; bz++) for (unsigned by = 0; by < 2; by++) for (unsigned bx = 0; bx < 3; bx++)
        for (unsigned tz = 0; tz < 3; tz++) for (unsigned ty = 0; ty < 4; ty++) for (unsigned tx = 0; tx < 5; tx++) {
            unsigned b = bx + 3 * (by + 2 * bz), t = tx + 5 * (ty + 4 * tz);
            uint4 e = h[b * nthreads + t];
            bad += e.x != (tx | ty << 10 | tz << 20) || e.y != (bx | by << 10 | bz << 20) ||
                   e.z != (5u | 4u << 10 | 3u << 20) || e.w != (3u | 2u << 10 | 2u << 20);
        }
    th::report(bad == 0, "builtins: threadIdx/blockIdx/blockDim/gridDim in a 3-D grid of 3-D blocks",
               "%zu wrong of %d", bad, nblocks * nthreads);
}

void test_syncthreads() {
    int n = 1000;  // not a multiple of the block size: the last block is partly out of range
    std::vector<float> in(n);
    th::fill_uniform(in.data(), n, 1);
    auto run = [&] {
        th::DeviceBuffer<float> din(n), dout(n);
        din.upload(in);
        cudaCheck(launch_kernel(reverse_kernel<false>, dim3(CEIL_DIV(n, 256)), dim3(256), 0, 0,
                                (const float*)din.ptr, dout.ptr, n));
        return dout.host();
    };
    auto out = th::run_orders("__syncthreads: block reversal through shared memory", run);
    size_t bad = 0;
    for (int i = 0; i < n; i++) {
        int base = i / 256 * 256, j = base + 255 - (i - base);
        bad += out[i] != (j < n ? in[j] : -1.f);
    }
    th::report(bad == 0, "__syncthreads: reversal values", "%zu wrong of %d", bad, n);
}

void test_barrier_forms() {
    th::DeviceBuffer<int> out(4);
    int active = 100;  // threads 100..127 return before the first barrier
    cudaCheck(launch_kernel(barrier_forms_kernel, dim3(1), dim3(128), 0, 0, out.ptr, active));
    auto h = out.host();
    int expect_count = (active + 2) / 3;
    bool ok = h[0] == expect_count && h[1] == 1 && h[2] == 1 && h[3] == 0;
    th::report(ok, "__syncthreads_count/_and/_or with exited threads not blocking",
               "count=%d (want %d) and=%d or=%d and2=%d", h[0], expect_count, h[1], h[2], h[3]);
}

void test_shuffles() {
    int n = 64;
    int bad = 0, cases = 0;
    for (int width : {32, 16, 8, 4, 2}) {
        for (int arg : {0, 1, 3, width - 1, width + 1}) {
            th::DeviceBuffer<int> out(4 * n);
            cudaCheck(launch_kernel(shuffle_kernel, dim3(2), dim3(n), 0, 0, out.ptr, width, arg));
            auto h = out.host();
            for (int t = 0; t < n; t++) {
                int lane = t % 32, warp_base = t - lane, seg = lane / width * width;
                auto val = [&](int l) { return (warp_base + l) * 10 + 1; };  // block 1 overwrote
                int idx = val(seg + arg % width);
                int up = (lane - seg) >= arg ? val(lane - arg) : val(lane);
                int down = (lane - seg) + arg < width ? val(lane + arg) : val(lane);
                int x = lane ^ arg;
                int xr = x < seg + width ? val(x) : val(lane);
                bad += h[t] != idx || h[n + t] != up || h[2 * n + t] != down || h[3 * n + t] != xr;
                cases++;
            }
        }
    }
    th::report(bad == 0, "warp shuffles idx/up/down/xor at widths 32..2", "%d wrong of %d lanes", bad, cases);
}

void test_votes() {
    int n = 64;
    th::DeviceBuffer<unsigned> out(n * 8);
    cudaCheck(launch_kernel(vote_kernel, dim3(1), dim3(n), 0, 0, out.ptr));
    auto h = out.host();
    int bad = 0;
    for (int t = 0; t < n; t++) {
        unsigned lane = t % 32, base = t - lane;
        unsigned ballot = 0, add = 0, mx = 0, match = 0;
        for (unsigned j = 0; j < 32; j++) {
            if (((base + j) * 7) % 5 == 0) ballot |= 1u << j;
            add += j;
            mx = std::max(mx, j * 3 % 17);
            if (j % 3 == lane % 3) match |= 1u << j;
        }
        unsigned half_min = lane < 16 ? 100 : 116;
        const unsigned* o = &h[t * 8];
        bad += o[0] != ballot || o[1] != (ballot != 0) || o[2] != 1 || o[3] != match || o[4] != add ||
               o[5] != mx || o[6] != half_min || o[7] != (lane ^ 1);
    }
    th::report(bad == 0, "warp votes: ballot/any/all/match_any/reduce_*/syncwarp with half masks",
               "%d wrong of %d lanes", bad, n);
}

void test_row_sum() {
    int rows = 37, cols = 1000;
    std::vector<float> x(rows * cols);
    th::fill_uniform(x.data(), x.size(), 2);
    auto run = [&] {
        th::DeviceBuffer<float> dx(x.size()), dout(rows);
        dx.upload(x);
        cudaCheck(launch_kernel(row_sum_kernel, dim3(rows), dim3(128), 0, 0, (const float*)dx.ptr, dout.ptr, cols));
        return dout.host();
    };
    auto out = th::run_orders("block reduction (shuffles + shared memory)", run);
    std::vector<double> ref(rows, 0.0);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) ref[r] += x[r * cols + c];
    // fp32 sum of 1000 terms of magnitude <= 1: error bound ~ cols * eps * sum|x| -> atol 1e-3.
    th::check_close("block reduction values vs double", ref.data(), out.data(), rows,
                    th::tol(th::EPS_FP32, 64, 1e-3));
}

#if defined(SIMT_CPU)
void test_parallel_workers() {
    int rows = 64, cols = 4096;
    std::vector<float> x(rows * cols);
    th::fill_uniform(x.data(), x.size(), 3);
    auto run = [&] {
        th::DeviceBuffer<float> dx(x.size()), dout(rows);
        dx.upload(x);
        cudaCheck(launch_kernel(row_sum_kernel, dim3(rows), dim3(256), 0, 0, (const float*)dx.ptr, dout.ptr, cols));
        return dout.host();
    };
    int saved = simt::get_workers();
    simt::set_workers(1);
    auto one = run();
    simt::set_workers(3);
    auto three = run();
    simt::set_workers(saved);
    th::check_bitwise("worker pool: 3 workers give the 1-worker result", one.data(), three.data(), rows * 4);
}
#endif

void test_atomics() {
    int blocks = 9, threads = 96, n = blocks * threads;
    th::DeviceBuffer<int> ints(6);
    th::DeviceBuffer<unsigned> uints(1, th::Fill::Zero);
    th::DeviceBuffer<float> floats(1, th::Fill::Zero);
    th::DeviceBuffer<unsigned long long> ulls(1, th::Fill::Zero);
    ints.upload({0, -1, 0, 0, 0, 0});
    cudaCheck(launch_kernel(atomics_kernel, dim3(blocks), dim3(threads), 0, 0, ints.ptr, uints.ptr, floats.ptr, ulls.ptr));
    auto i = ints.host();
    auto u = uints.host();
    auto f = floats.host();
    auto l = ulls.host();
    bool ok = i[0] == n && i[1] == n - 1 && i[2] == -(n - 1) && i[3] == -n && i[4] == 2 * (n - 1) &&
              i[5] == 42 && u[0] == 2u * n && f[0] == 0.5f * n && l[0] == 3ull * n;
    th::report(ok, "atomics: add/sub/min/max/CAS/exch on int, unsigned, float, u64",
               "add=%d max=%d min=%d sub=%d cas=%d exch=%d uadd=%u fadd=%g ull=%llu", i[0], i[1], i[2],
               i[3], i[4], i[5], u[0], f[0], l[0]);
}

void test_dynamic_smem() {
    int n = 15000;  // 60 000 bytes: above the 48 KiB default
    std::vector<float> in(n);
    th::fill_uniform(in.data(), n, 4);
    th::DeviceBuffer<float> din(n), dout(n);
    din.upload(in);
    size_t smem = n * sizeof(float);
    cudaError_t refused = launch_kernel(dynamic_smem_kernel, dim3(1), dim3(256), smem, 0, (const float*)din.ptr, dout.ptr, n);
    th::report(refused != cudaSuccess, "dynamic shared memory over 48 KiB refused without the opt-in",
               "launch returned %s", cudaGetErrorName(refused));
    cudaCheck(cudaFuncSetAttribute(dynamic_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    cudaCheck(launch_kernel(dynamic_smem_kernel, dim3(1), dim3(256), smem, 0, (const float*)din.ptr, dout.ptr, n));
    refused = launch_kernel(dynamic_smem_kernel, dim3(1), dim3(256), smem + 16, 0, (const float*)din.ptr, dout.ptr, n);
    th::report(refused == cudaErrorInvalidValue, "dynamic shared memory above the opted-in size refused",
               "launch with 16 bytes more returned %s", cudaGetErrorName(refused));
    auto out = dout.host();
    size_t bad = 0;
    for (int i = 0; i < n; i++) bad += out[i] != in[n - 1 - i] * 2.f;
    th::report(bad == 0, "dynamic shared memory of 60 000 bytes after cudaFuncSetAttribute", "%zu wrong", bad);
}

void test_intrinsics() {
    int n = 32;
    std::vector<float> in(4 * n);
    th::fill_uniform(in.data(), in.size(), 5);
    th::DeviceBuffer<float> din(4 * n), dout(4 * n), f(10);
    th::DeviceBuffer<unsigned> u(5);
    din.upload(in);
    f.upload({0.7f, 0, 0, 0, 0, 0, 0, 0, 0, 0});
    cudaCheck(launch_kernel(intrinsics_kernel, dim3(1), dim3(n), 0, 0, (const float4*)din.ptr, (float4*)dout.ptr, f.ptr, u.ptr));
    auto out = dout.host();
    size_t bad = 0;
    for (int t = 0; t < n; t++)
        for (int k = 0; k < 4; k++) bad += out[4 * t + k] != in[4 * t + 3 - k];
    th::report(bad == 0, "128-bit cache-hinted loads/stores (__ldcs/__stcs on float4)", "%zu wrong", bad);
    auto hf = f.host();
    auto hu = u.host();
    float x = 0.7f;
    // Reference values: the toolkit's host conversions and libm; __expf/rsqrtf are within 2 ulp
    // on a GPU (CUDA programming guide, intrinsic function accuracy), exact here.
    float ref[10] = {x, std::exp(x), 1.f / std::sqrt(x), 1.f / x, 0.69921875f, 0.7001953125f, 0.6875f, 0.75f, 2.7f, x};
    th::check_close("math intrinsics and bf16/fp16/fp8 conversions", ref, hf.data(), 10,
                    th::tol(th::EPS_FP32, 4, 0));
    bool ok = hu[0] == 8 && hu[1] == 31 && hu[2] == 4 && hu[3] == 0x80000000u && hu[4] == 10;
    th::report(ok, "bit intrinsics (__popc, __clz, __ffs, __brev, min/max)", "%u %u %u %08x %u", hu[0], hu[1], hu[2], hu[3], hu[4]);
}

void test_runtime() {
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    th::report(prop.warpSize == 32 && prop.multiProcessorCount > 0 && prop.maxThreadsPerBlock == 1024,
               "cudaGetDeviceProperties", "%s, cc %d.%d, %d SMs", prop.name, prop.major, prop.minor,
               prop.multiProcessorCount);
    size_t free0, total, free1, free2;
    cudaCheck(cudaMemGetInfo(&free0, &total));
    void* p;
    cudaCheck(cudaMalloc(&p, 64 << 20));
    cudaCheck(cudaMemGetInfo(&free1, &total));
    cudaCheck(cudaFree(p));
    cudaCheck(cudaMemGetInfo(&free2, &total));
    // On a GPU other processes also allocate, so only require the direction of the change there.
    th::report(free1 < free0 && free2 > free1 && total >= free0, "cudaMemGetInfo tracks allocations",
               "free %zu -> %zu -> %zu MiB of %zu", free0 >> 20, free1 >> 20, free2 >> 20, total >> 20);

    // Async copies, memset and pinned memory on two streams with events between them.
    size_t n = 1 << 16;
    float* pinned;
    cudaCheck(cudaMallocHost(&pinned, n * sizeof(float)));
    for (size_t i = 0; i < n; i++) pinned[i] = (float)i;
    float *a, *b;
    cudaCheck(cudaMalloc(&a, n * sizeof(float)));
    cudaCheck(cudaMalloc(&b, n * sizeof(float)));
    cudaStream_t s1, s2;
    cudaEvent_t e0, e1;
    cudaCheck(cudaStreamCreate(&s1));
    cudaCheck(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaCheck(cudaEventCreate(&e0));
    cudaCheck(cudaEventCreate(&e1));
    cudaCheck(cudaEventRecord(e0, s1));
    cudaCheck(cudaMemcpyAsync(a, pinned, n * sizeof(float), cudaMemcpyHostToDevice, s1));
    cudaCheck(cudaEventRecord(e1, s1));
    cudaCheck(cudaStreamWaitEvent(s2, e1, 0));
    cudaCheck(cudaMemsetAsync(b, 0, n * sizeof(float), s2));
    cudaCheck(cudaMemcpyAsync(b, a, n / 2 * sizeof(float), cudaMemcpyDeviceToDevice, s2));
    cudaCheck(cudaStreamSynchronize(s2));
    cudaCheck(cudaMemcpy(pinned, b, n * sizeof(float), cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += pinned[i] != (i < n / 2 ? (float)i : 0.f);
    float ms = -1;
    cudaCheck(cudaEventElapsedTime(&ms, e0, e1));
    th::report(bad == 0 && ms >= 0, "streams, events, async memcpy/memset, pinned memory",
               "%zu wrong, event interval %.3f ms", bad, ms);
    cudaCheck(cudaEventDestroy(e0));
    cudaCheck(cudaEventDestroy(e1));
    cudaCheck(cudaStreamDestroy(s1));
    cudaCheck(cudaStreamDestroy(s2));
    cudaCheck(cudaFree(a));
    cudaCheck(cudaFree(b));
    cudaCheck(cudaFreeHost(pinned));

    // Errors: a bad launch configuration is refused, reported once, then cleared.
    th::DeviceBuffer<int> out(4);
    cudaError_t e = launch_kernel(barrier_forms_kernel, dim3(1), dim3(2048), 0, 0, out.ptr, 1);
    cudaError_t after = cudaGetLastError();
    th::report(e == cudaErrorInvalidConfiguration && after == cudaSuccess &&
                   std::string(cudaGetErrorString(e)).size() > 0,
               "launch errors: 2048-thread block refused, cudaGetLastError cleared",
               "got %s (%s), then %s", cudaGetErrorName(e), cudaGetErrorString(e), cudaGetErrorName(after));

    int blocks = 0;
    cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, row_sum_kernel, 256, 0));
    th::report(blocks >= 1 && blocks * 256 <= prop.maxThreadsPerMultiProcessor, "occupancy query",
               "%d blocks of 256 threads per SM", blocks);
}

// ----------------------------------------------------------------------------
// Planted bugs (CPU backend only): each runs in a child process, which must stop with a message
// naming the problem, the kernel, block and thread — and not hang (the child has a time limit).

#if defined(SIMT_CPU)

__global__ void divergent_barrier_kernel(float* x) {
    if (threadIdx.x < 16) {
        __syncthreads();
        x[threadIdx.x] = 1.f;
    } else {
        x[threadIdx.x] = 2.f;
        __syncthreads();
    }
}
__global__ void exited_lane_kernel(float* x) {
    if (threadIdx.x == 7) return;
    float v = __shfl_xor_sync(0xffffffffu, x[threadIdx.x], 1);
    x[threadIdx.x] = v;
}
__global__ void deadlock_kernel(float* x) {
    if (threadIdx.x == 0) {
        __syncthreads();
    } else {
        x[threadIdx.x] = __shfl_down_sync(0xffffffffu, x[threadIdx.x], 1);
    }
}
__device__ int recurse(int depth, volatile char* sink) {
    volatile char pad[4096];
    pad[0] = (char)depth;
    sink[0] = pad[0];
    return depth > 1000000 ? 0 : recurse(depth + 1, sink) + pad[0];
}
__global__ void stack_overflow_kernel(char* sink) { sink[1] = (char)recurse(0, sink); }
__global__ void oob_global_kernel(float* x, int n) { x[threadIdx.x] = (float)n; }  // launched with n+1 threads
__global__ void oob_smem_kernel(int n) {
    float* buf = dynamic_shared<float>();
    buf[threadIdx.x] = (float)n;  // launched with n+1 threads and room for n floats
}
__global__ void trap_kernel() {
    if (threadIdx.x == 3) __trap();
}

// ----------------------------------------------------------------------------
// Stream-order bugs and reads of uninitialized memory: programs whose answer is wrong on a GPU but
// right when every operation runs as it is issued. Each prints the value it got; the parent runs it
// with SIMT_STREAMS=adversarial (the bug must show) and inorder (where it hides), and runs the
// corrected program (right in both modes).

__global__ void fill_kernel(float* x, float v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}
__global__ void accumulate_kernel(float* sum, const float* x, int n) {  // one thread: sum[0] += x[i]
    for (int i = 0; i < n; i++) sum[0] += x[i];
}

// Runs stream case `name` (with "_fixed": the corrected program) and prints "value=V".
int run_stream_case(const std::string& case_name) {
    StreamCase k(case_name, 256);
    const std::string& name = k.name;
    const bool fixed = k.fixed;
    const int n = k.n;
    float *buf = k.buf, *out = k.out, *pinned = k.pinned;
    cudaStream_t producer = k.producer, consumer = k.consumer;
    float value = -1;
    if (name == "missing_wait") {
        // producer writes 1s; consumer copies them out: it must wait for the producer's event.
        cudaCheck(cudaMemset(buf, 0, n * sizeof(float)));
        cudaCheck(cudaDeviceSynchronize());
        cudaCheck(launch_kernel(fill_kernel, dim3(1), dim3(n), 0, producer, buf, 1.f, n));
        if (fixed) k.consumer_waits();
        cudaCheck(cudaMemcpyAsync(out, buf, n * sizeof(float), cudaMemcpyDeviceToDevice, consumer));
        cudaCheck(cudaStreamSynchronize(consumer));
        cudaCheck(cudaMemcpyAsync(&value, out + n - 1, sizeof(float), cudaMemcpyDeviceToHost, consumer));
    } else if (name == "pinned_reuse") {
        // An async copy reads its pinned source when the stream runs it: the host may refill the
        // buffer only after the copy is done (the fix synchronizes first).
        for (int i = 0; i < n; i++) pinned[i] = 1.f;
        cudaCheck(cudaMemcpyAsync(buf, pinned, n * sizeof(float), cudaMemcpyHostToDevice, producer));
        if (fixed) cudaCheck(cudaStreamSynchronize(producer));
        for (int i = 0; i < n; i++) pinned[i] = 2.f;
        cudaCheck(cudaMemcpy(&value, buf, sizeof(float), cudaMemcpyDeviceToHost));
        cudaCheck(cudaStreamSynchronize(producer));
        cudaCheck(cudaMemcpy(&value, buf, sizeof(float), cudaMemcpyDeviceToHost));
    } else if (name == "unsynced_read") {
        // A copy into pinned memory has not happened until the stream is synchronized.
        for (int i = 0; i < n; i++) pinned[i] = 0.f;
        cudaCheck(launch_kernel(fill_kernel, dim3(1), dim3(n), 0, producer, buf, 3.f, n));
        cudaCheck(cudaMemcpyAsync(pinned, buf, n * sizeof(float), cudaMemcpyDeviceToHost, producer));
        if (fixed) cudaCheck(cudaStreamSynchronize(producer));
        value = pinned[0];
        cudaCheck(cudaStreamSynchronize(producer));
    } else if (name == "uninitialized") {
        // Sums 256 ones into a fresh allocation: 256 only if it was zeroed first (the fix).
        th::DeviceBuffer<float> ones(n);
        ones.upload(std::vector<float>(n, 1.f));
        if (fixed) cudaCheck(cudaMemset(out, 0, sizeof(float)));
        cudaCheck(launch_kernel(accumulate_kernel, dim3(1), dim3(1), 0, 0, out, (const float*)ones.ptr, n));
        cudaCheck(cudaMemcpy(&value, out, sizeof(float), cudaMemcpyDeviceToHost));
    } else {
        fprintf(stderr, "unknown stream case %s\n", name.c_str());
        return 2;
    }
    printf("value=%g\n", value);
    return 0;
}

// Each bug gives the wrong value under SIMT_STREAMS=adversarial (and, for the uninitialized read, in
// any mode: fresh memory is poisoned); the inorder mode shows what the bug looks like without it;
// every fixed program is right under both.
void test_stream_bugs(const char* self) {
    struct Case {
        const char* name;
        float right;
        const char* bug;
    } cases[] = {
        {"missing_wait", 1.f, "consumer stream read the buffer before the producer wrote it"},
        {"pinned_reuse", 1.f, "the async copy read the pinned buffer after the host refilled it"},
        {"unsynced_read", 3.f, "the host read pinned memory before the copy into it ran"},
        {"uninitialized", 256.f, "the kernel accumulated into memory nobody zeroed"},
    };
    for (const Case& c : cases) {
        float bug_adv = th::stream_case_value(self, "--stream-case", c.name, "adversarial");
        float bug_inorder = th::stream_case_value(self, "--stream-case", c.name, "inorder");
        float fix_adv = th::stream_case_value(self, "--stream-case", std::string(c.name) + "_fixed", "adversarial");
        float fix_inorder = th::stream_case_value(self, "--stream-case", std::string(c.name) + "_fixed", "inorder");
        bool poison = std::string(c.name) == "uninitialized";
        std::string test = std::string("planted bug caught (SIMT_STREAMS=adversarial): ") + c.name;
        th::report(!(bug_adv == c.right) && (poison || bug_inorder == c.right) && fix_adv == c.right &&
                       fix_inorder == c.right,
                   test.c_str(), "%s: got %g (inorder %g), fixed %g / %g, right %g", c.bug, bug_adv, bug_inorder,
                   fix_adv, fix_inorder, c.right);
    }
    th::ChildOutput bad = th::run_command(std::string("SIMT_STREAMS=async ") + self + " --stream-case missing_wait 2>&1");
    th::report(bad.status != 0 && bad.text.find("accepted: inorder, adversarial") != std::string::npos,
               "unknown SIMT_STREAMS stops with the accepted values", "%s",
               bad.text.substr(0, bad.text.find('\n')).c_str());
}

// Runs one planted bug in this (child) process; returns only if it was not caught.
int run_plant(const std::string& name) {
    float* x;
    cudaCheck(cudaMalloc(&x, 64 * sizeof(float)));
    cudaCheck(cudaMemset(x, 0, 64 * sizeof(float)));
    if (name == "divergent_barrier") cudaCheck(launch_kernel(divergent_barrier_kernel, dim3(2), dim3(32), 0, 0, x));
    if (name == "exited_lane") cudaCheck(launch_kernel(exited_lane_kernel, dim3(1), dim3(32), 0, 0, x));
    if (name == "deadlock") cudaCheck(launch_kernel(deadlock_kernel, dim3(1), dim3(32), 0, 0, x));
    if (name == "stack_overflow") cudaCheck(launch_kernel(stack_overflow_kernel, dim3(1), dim3(4), 0, 0, (char*)x));
    if (name == "oob_global") cudaCheck(launch_kernel(oob_global_kernel, dim3(1), dim3(65), 0, 0, x, 64));
    if (name == "oob_smem") cudaCheck(launch_kernel(oob_smem_kernel, dim3(1), dim3(65), 64 * sizeof(float), 0, 64));
    if (name == "trap") cudaCheck(launch_kernel(trap_kernel, dim3(1), dim3(8), 0, 0));
    if (name == "smem_beyond_profile") {  // 100 KiB per block: within an H100's opt-in limit, beyond an L4's
        cudaCheck(cudaFuncSetAttribute(dynamic_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024));
        cudaCheck(launch_kernel(dynamic_smem_kernel, dim3(1), dim3(32), 100 * 1024, 0, (const float*)x, x, 64));
    }
    if (name == "missing_syncthreads") {
        // Caught by comparing thread orders, not by a fault: print whether they differ.
        int n = 512;
        std::vector<float> in(n);
        th::fill_uniform(in.data(), n, 6);
        auto run = [&] {
            th::DeviceBuffer<float> din(n), dout(n);
            din.upload(in);
            cudaCheck(launch_kernel(reverse_kernel<true>, dim3(2), dim3(256), 0, 0, (const float*)din.ptr, dout.ptr, n));
            return dout.host();
        };
        th::run_orders("planted missing __syncthreads", run);
        return th::n_failed() ? 3 : 0;
    }
    cudaCheck(cudaFree(x));
    return 0;
}

// Runs `binary --plant name` with a time limit (and `env`, assignments for its environment) and checks its
// exit status and stderr.
void expect_caught(const char* binary, const char* name, std::vector<std::string> must_contain,
                   const std::string& env = "") {
    th::ChildOutput child = th::run_command(env + " timeout 60 " + binary + " --plant " + name + " 2>&1");
    const std::string& out = child.text;
    int code = WIFEXITED(child.status) ? WEXITSTATUS(child.status) : -1;
    bool ok = code != 0 && code != 124;  // 124: timeout killed it (a hang)
    std::string missing;
    for (auto& s : must_contain)
        if (out.find(s) == std::string::npos) { ok = false; missing += " '" + s + "'"; }
    std::string first_line = out.substr(0, out.find('\n', out.find("ERROR") != std::string::npos ? out.find("ERROR") : 0));
    std::string test = std::string("planted bug caught: ") + name;
    th::report(ok, test.c_str(), "exit %d%s%s | %s", code, missing.empty() ? "" : ", missing", missing.c_str(),
               first_line.substr(0, 300).c_str());
}

void test_planted(const char* self, const char* asan_twin) {
    expect_caught(self, "divergent_barrier", {"divergent barrier", "divergent_barrier_kernel", "block (0,0,0)", "thread ("});
    expect_caught(self, "exited_lane", {"has exited", "lane 7", "exited_lane_kernel", "thread ("});
    expect_caught(self, "deadlock", {"deadlock", "__syncthreads", "__shfl_down_sync", "deadlock_kernel"});
    expect_caught(self, "stack_overflow", {"stack overflow", "stack_overflow_kernel", "thread ("});
    expect_caught(self, "trap", {"__trap", "trap_kernel", "thread (3,0,0)"});
    expect_caught(self, "missing_syncthreads", {"results differ between thread orders"});
    // The device profile's limits are enforced: an opt-in to 100 KiB fails on the L4 profile (99 KiB, sm_89)
    // as on an L4, and succeeds on the H100 profile.
    expect_caught(self, "smem_beyond_profile", {"cudaErrorInvalidValue", "cudaFuncSetAttribute"}, "SIMT_DEVICE=l4");
    th::ChildOutput h100 = th::run_command(std::string("SIMT_DEVICE=h100 timeout 60 ") + self +
                                           " --plant smem_beyond_profile 2>&1");
    th::report(h100.status == 0, "planted bug's control: the 100 KiB kernel runs on the h100 profile", "%s",
               h100.text.substr(0, h100.text.find('\n')).c_str());
    expect_caught(asan_twin, "oob_global", {"AddressSanitizer", "heap-buffer-overflow", "oob_global_kernel"});
    expect_caught(asan_twin, "oob_smem", {"AddressSanitizer", "heap-buffer-overflow", "oob_smem_kernel"});
}

// Prints, in this (child) process, what the virtual device reports, as key=value words.
int print_device() {
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    int optin = 0, cc_major = 0;
    cudaCheck(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    cudaCheck(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, 0));
    printf("cc=%d.%d sms=%d threads_per_sm=%d blocks_per_sm=%d smem_block=%zu optin=%d/%zu smem_sm=%zu "
           "memory_gib=%zu peak=%g name=%s\n",
           cc_major, prop.minor, prop.multiProcessorCount, prop.maxThreadsPerMultiProcessor,
           prop.maxBlocksPerMultiProcessor, prop.sharedMemPerBlock, optin, prop.sharedMemPerBlockOptin,
           prop.sharedMemPerMultiprocessor, prop.totalGlobalMem >> 30, peak_tflops(prop.name, Precision::BF16, false),
           prop.name);
    return 0;
}

// One launch (fibers, so SIMT_STACK_KB is read) and the worker count: what the environment tests run.
int launch_once() {
    float *in = nullptr, *out = nullptr;
    cudaCheck(cudaMalloc(&in, 256 * sizeof(float)));
    cudaCheck(cudaMalloc(&out, 256 * sizeof(float)));
    cudaCheck(cudaMemset(in, 0, 256 * sizeof(float)));
    cudaCheck(launch_kernel(reverse_kernel<false>, dim3(1), dim3(256), 0, nullptr, (const float*)in, out, 256));
    cudaCheck(cudaDeviceSynchronize());
    printf("workers=%d\n", simt::get_workers());
    return 0;
}

// The backend's integer settings: a value that is not an integer in range stops the program with one
// line naming it (not a silent fallback to a setting nobody asked for); a good one is used.
void test_env_settings(const char* self) {
    const char* bad[][2] = {{"SIMT_THREADS=abc", "simt: SIMT_THREADS='abc' is not an integer in [1, 256]"},
                            {"SIMT_THREADS=0", "simt: SIMT_THREADS='0' is not an integer in [1, 256]"},
                            {"SIMT_THREADS=100000", "simt: SIMT_THREADS='100000' is not an integer in [1, 256]"},
                            {"SIMT_STACK_KB=1", "simt: SIMT_STACK_KB='1' is not an integer in [64, 1048576]"},
                            {"SIMT_STACK_KB=256k", "simt: SIMT_STACK_KB='256k' is not an integer in [64, 1048576]"}};
    for (const auto& b : bad) {
        th::ChildOutput c = th::run_command(std::string(b[0]) + " " + self + " --launch-once 2>&1");
        bool ok = c.status != 0 && c.text == std::string(b[1]) + "\n";
        th::report(ok, (std::string(b[0]) + " stops with one line naming it").c_str(), "%s", c.text.c_str());
    }
    th::ChildOutput c = th::run_command(std::string("SIMT_THREADS=3 SIMT_STACK_KB=128 ") + self + " --launch-once 2>&1");
    th::report(c.status == 0 && c.text == "workers=3\n", "SIMT_THREADS=3 SIMT_STACK_KB=128: used", "%s", c.text.c_str());
}

// SIMT_DEVICE chooses the GPU whose limits the virtual device reports; the name (which names any profile
// but the default) matches no GPU of the MFU table; the memory is the GPU's, at most the host memory
// available (MemAvailable of a planted meminfo: 1 TiB, so physical memory caps it, then 16 GiB); an
// unknown value stops with the accepted ones.
void test_device_profiles(const char* self) {
    size_t host_gib = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE) >> 30;
    char meminfo[] = "/tmp/test_simt_meminfo_XXXXXX";
    int fd = mkstemp(meminfo);
    auto plant = [&](unsigned long long kib) {
        std::string text = "MemTotal: 999 kB\nMemFree: 999 kB\nMemAvailable: " + std::to_string(kib) + " kB\n";
        if (fd < 0 || pwrite(fd, text.data(), text.size(), 0) != (ssize_t)text.size() || ftruncate(fd, text.size()) != 0)
            th::report(false, "planted meminfo written", "%s", meminfo);
    };
    struct Expect {
        const char* key;     // SIMT_DEVICE ("": unset)
        const char* limits;  // as print_device writes them
        size_t memory_gib;   // the GPU's
    };
    const char* h100 = "cc=9.0 sms=8 threads_per_sm=2048 blocks_per_sm=32 smem_block=49152 optin=232448/232448 "
                       "smem_sm=233472";
    const Expect profiles[] = {
        {"", h100, 80},
        {"h100", h100, 80},
        {"a100", "cc=8.0 sms=8 threads_per_sm=2048 blocks_per_sm=32 smem_block=49152 optin=166912/166912 "
                 "smem_sm=167936", 80},
        {"rtx3090", "cc=8.6 sms=8 threads_per_sm=1536 blocks_per_sm=16 smem_block=49152 optin=101376/101376 "
                    "smem_sm=102400", 24},
        {"l4", "cc=8.9 sms=8 threads_per_sm=1536 blocks_per_sm=24 smem_block=49152 optin=101376/101376 "
               "smem_sm=102400", 24},
    };
    for (size_t available_gib : {(size_t)1024, (size_t)16}) {
        plant(available_gib << 20);
        for (const Expect& e : profiles) {
            const std::string key = *e.key ? e.key : "h100";
            th::ChildOutput child = th::run_command(std::string("SIMT_MEMINFO=") + meminfo +
                                                    " SIMT_DEVICE_MEMORY= SIMT_DEVICE=" + e.key + " " + self +
                                                    " --print-device 2>&1");
            std::string suffix = key == "h100" ? "" : ", SIMT_DEVICE=" + key;
            size_t gib = std::min({e.memory_gib, host_gib, available_gib});
            std::string want = std::string(e.limits) + " memory_gib=" + std::to_string(gib) +
                               " peak=0 name=SIMT CPU backend (virtual device" + suffix + ")";
            std::string got = child.text.substr(0, child.text.find('\n'));
            std::string name = std::string("device profile SIMT_DEVICE=") + (*e.key ? e.key : "(unset)") +
                               ", host memory available: " + std::to_string(available_gib) + " GiB";
            th::report(child.status == 0 && got == want, name.c_str(), "%s%s%s", got.c_str(),
                       got == want ? "" : " | want ", got == want ? "" : want.c_str());
        }
    }
    if (fd >= 0) close(fd);
    unlink(meminfo);
    th::ChildOutput bad = th::run_command(std::string("SIMT_DEVICE=v100 ") + self + " --print-device 2>&1");
    std::string line = bad.text.substr(0, bad.text.find('\n'));
    th::report(bad.status != 0 && line.find("accepted: h100, a100, rtx3090, l4") != std::string::npos &&
                   bad.text.find('\n') + 1 == bad.text.size(),
               "unknown SIMT_DEVICE stops with one line naming the accepted values", "%s", line.c_str());
}
#endif  // SIMT_CPU

int main(int argc, char** argv) {
#if defined(SIMT_CPU)
    if (argc == 3 && std::string(argv[1]) == "--plant") return run_plant(argv[2]);
    if (argc == 2 && std::string(argv[1]) == "--print-device") return print_device();
    if (argc == 2 && std::string(argv[1]) == "--launch-once") return launch_once();
    if (argc == 3 && std::string(argv[1]) == "--stream-case") return run_stream_case(argv[2]);
    // The ASan planted bugs run in the sanitizer build of this test (path in argv[1], given by the
    // Makefile); the sanitizer build passes its own path.
    const char* asan_twin = argc > 1 ? argv[1] : nullptr;
#endif
    test_builtins();
    test_syncthreads();
    test_barrier_forms();
    test_shuffles();
    test_votes();
    test_row_sum();
    test_atomics();
    test_dynamic_smem();
    test_intrinsics();
    test_runtime();
#if defined(SIMT_CPU)
    test_parallel_workers();
    test_device_profiles(argv[0]);
    test_env_settings(argv[0]);
    test_stream_bugs(argv[0]);
    if (asan_twin) test_planted(argv[0], asan_twin);
    else th::report(false, "planted bugs", "usage: test_simt <asan-build-of-test_simt>");
#endif
    return th::finish();
}
