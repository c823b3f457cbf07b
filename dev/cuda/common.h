// dev/cuda/common.h — what the dev/cuda benchmarks share: the device's peak bandwidth, timing of a
// kernel launcher, and one printed line per timed variant.
#pragma once
#include "../../llmc/cuda_common.h"

#include <cstdio>
#include <functional>

// Width of the variant-name column, so that every benchmark's figures line up.
constexpr int kBenchNameWidth = 54;

// The device's peak DRAM bandwidth in GB/s; 0 on the CPU backend, which has no such figure.
inline double peak_gbps() {
#if defined(SIMT_CPU)
    return 0;
#else
    int device = 0, clock_khz = 0, bus_bits = 0;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device));
    cudaCheck(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device));
    return 2.0 * clock_khz * 1e3 * (bus_bits / 8) / 1e9;  // double data rate
#endif
}

// Average time of one call of `run` over `reps` calls after a warm-up call, in ms. Events on the
// default stream time the device work, not just the (asynchronous) launches.
inline float time_ms(const std::function<void()>& run, int reps) {
    run();
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    cudaCheck(cudaEventRecord(start));
    for (int i = 0; i < reps; i++) run();
    cudaCheck(cudaEventRecord(stop));
    cudaCheck(cudaEventSynchronize(stop));
    float ms = 0;
    cudaCheck(cudaEventElapsedTime(&ms, start, stop));
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    return ms / reps;
}

// Prints one benchmark line of a memory-bound kernel: time, and the bandwidth its necessary bytes
// imply, with the share of the device's peak on a GPU.
inline void bench_line(const char* name, float ms, double bytes) {
    double gbps = bytes / (ms * 1e-3) / 1e9, peak = peak_gbps();
    if (peak > 0)
        printf("  %-*s %9.4f ms  %7.1f GB/s  %5.1f%% of peak %.0f GB/s\n", kBenchNameWidth, name, ms, gbps,
               100 * gbps / peak, peak);
    else
        printf("  %-*s %9.4f ms  %7.3f GB/s  (CPU-backend figures)\n", kBenchNameWidth, name, ms, gbps);
}

// Prints one benchmark line of a compute-bound kernel: time, and the TFLOP/s its FLOPs imply, with
// the share of `peak_tflops` (0 where unknown, e.g. on the CPU backend).
inline void flops_line(const char* name, float ms, double flops, double peak_tflops) {
    double tflops = flops / (ms * 1e-3) / 1e12;
    if (peak_tflops > 0)
        printf("  %-*s %9.4f ms  %7.1f TFLOP/s  %5.1f%% of peak %.0f TFLOP/s\n", kBenchNameWidth, name, ms, tflops,
               100 * tflops / peak_tflops, peak_tflops);
    else
        printf("  %-*s %9.4f ms  %9.5f TFLOP/s  (CPU-backend figures, no GPU peak)\n", kBenchNameWidth, name, ms,
               tflops);
}
