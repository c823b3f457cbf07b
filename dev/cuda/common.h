// dev/cuda/common.h — what the dev/cuda benchmarks share: their command line, the device's peak
// bandwidth, timing of a kernel launcher, and one printed line per timed variant.
#pragma once
#include "../../llmc/cuda_common.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

// What every validating dev program does, for its --help.
#define DEV_VALIDATES                                                                                        \
    "Validates every variant against a CPU reference, one PASS/FAIL line per checked output, then times\n"   \
    "them, and ends with \"N passed, N failed\"; the exit status is 1 if a check failed.\n"                   \
    "The shapes are fixed in main(): training shapes on a GPU, a small slice of them on the CPU backend,\n"   \
    "where the times measure the simulator, not a GPU. To time another shape, edit main().\n"

// The command line of a dev program: --help prints its usage and `about` (what it does) and exits 0;
// anything else is refused with exit status 2. The programs take no sizes or flags, and one given
// anyway must not be ignored: its figures would be read as those of the shape asked for. A program
// with options of its own (attention.cu's --profile) handles them first and names them in `usage`.
inline void dev_command_line(int argc, char** argv, const char* about, const char* usage = "[--help]") {
    if (argc == 1) return;
    if (argc > 2 || (strcmp(argv[1], "--help") != 0 && strcmp(argv[1], "-h") != 0)) {
        fprintf(stderr, "%s: unexpected argument%s '", argv[0], argc > 2 ? "s" : "");
        for (int i = 1; i < argc; i++) fprintf(stderr, i > 1 ? " %s" : "%s", argv[i]);
        fprintf(stderr, "' (usage: %s %s)\n", argv[0], usage);
        exit(2);
    }
    printf("usage: %s %s\n\n%s", argv[0], usage, about);
    exit(0);
}

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
