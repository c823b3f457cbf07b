// llmc/mfu.h — peak dense throughput of current GPUs per precision, to report model FLOPs
// utilization (MFU). An unknown device gets no number rather than a guess.
#pragma once
#include <cstring>

#include "precision.cuh"

struct GPUPeak {
    const char* name_contains;  // matched against cudaDeviceProp::name (first match wins)
    float fp32;                 // TFLOP/s without tensor cores
    float tf32;                 // tensor cores, dense
    float bf16;                 // tensor cores, dense, fp32 accumulate
    float fp8;                  // 0: no fp8 tensor cores
};

// Datasheet figures (dense, no sparsity). Order matters: more specific names first.
inline const GPUPeak* gpu_peaks(int* count) {
    static const GPUPeak peaks[] = {
        {"H200", 67.f, 495.f, 989.f, 1979.f},
        {"H100 PCIe", 51.f, 378.f, 756.f, 1513.f},
        {"H100 NVL", 60.f, 418.f, 835.f, 1671.f},
        {"H100", 67.f, 495.f, 989.f, 1979.f},  // SXM
        {"H800", 67.f, 495.f, 989.f, 1979.f},
        {"GH200", 67.f, 495.f, 989.f, 1979.f},
        {"B200", 80.f, 1100.f, 2250.f, 4500.f},
        {"A100", 19.5f, 156.f, 312.f, 0.f},
        {"A800", 19.5f, 156.f, 312.f, 0.f},
        {"L40S", 91.6f, 183.f, 362.f, 733.f},
        {"L40", 90.5f, 90.5f, 181.f, 362.f},
        {"L4", 30.3f, 60.f, 121.f, 242.f},
        {"A10G", 31.2f, 35.f, 70.f, 0.f},
        {"A10", 31.2f, 62.5f, 125.f, 0.f},
        {"RTX 6000 Ada", 91.1f, 182.f, 364.f, 728.f},
        {"RTX A6000", 38.7f, 77.4f, 155.f, 0.f},
        {"RTX 4090", 82.6f, 82.6f, 165.f, 330.f},
        {"RTX 4080", 48.7f, 48.7f, 97.5f, 195.f},
        {"RTX 3090", 35.6f, 35.6f, 71.f, 0.f},
        {"RTX 3080 Ti", 34.1f, 34.1f, 68.f, 0.f},
    };
    *count = (int)(sizeof(peaks) / sizeof(peaks[0]));
    return peaks;
}

// Peak TFLOP/s of the named device for the given precision, or 0 if the device is unknown.
inline float peak_tflops(const char* device_name, Precision p, bool tf32_matmuls) {
    int n;
    const GPUPeak* peaks = gpu_peaks(&n);
    for (int i = 0; i < n; i++) {
        if (!strstr(device_name, peaks[i].name_contains)) continue;
        if (p == Precision::BF16 || p == Precision::FP16) return peaks[i].bf16;  // same tensor-core peak
        return tf32_matmuls ? peaks[i].tf32 : peaks[i].fp32;
    }
    return 0.f;
}
