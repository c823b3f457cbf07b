// test/simt/stream_cases.h — what the CPU backend's planted stream-ordering bugs share (test_simt's
// stream cases, test_graphs' replay cases): each case is a small program that the test binary runs
// as a child under a stream mode and that prints "value=V"; the parent compares what the bug gives
// under SIMT_STREAMS=adversarial and inorder with what the fixed program ("<case>_fixed") gives.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>

#include "../../llmc/cuda_common.h"
#include "../harness.h"

// One case program's resources: n floats on the device (buf, out) and n pinned (pinned), two
// non-blocking streams; the case's name without "_fixed", and whether it had the suffix.
struct StreamCase {
    std::string name;
    bool fixed = false;
    int n;
    float *buf = nullptr, *out = nullptr, *pinned = nullptr;
    cudaStream_t producer = nullptr, consumer = nullptr;

    StreamCase(std::string full_name, int count) : name(std::move(full_name)), n(count) {
        fixed = name.size() > 6 && name.compare(name.size() - 6, 6, "_fixed") == 0;
        if (fixed) name.resize(name.size() - 6);
        cudaCheck(cudaMalloc(&buf, n * sizeof(float)));
        cudaCheck(cudaMalloc(&out, n * sizeof(float)));
        cudaCheck(cudaMallocHost(&pinned, n * sizeof(float)));
        cudaCheck(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
        cudaCheck(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
    }
    StreamCase(const StreamCase&) = delete;
    StreamCase& operator=(const StreamCase&) = delete;
    ~StreamCase() {
        cudaCheck(cudaStreamDestroy(producer));
        cudaCheck(cudaStreamDestroy(consumer));
        cudaCheck(cudaFreeHost(pinned));
        cudaCheck(cudaFree(out));
        cudaCheck(cudaFree(buf));
    }

    // The consumer stream waits for what the producer stream has been given so far (an event).
    void consumer_waits() {
        cudaEvent_t done;
        cudaCheck(cudaEventCreate(&done));
        cudaCheck(cudaEventRecord(done, producer));
        cudaCheck(cudaStreamWaitEvent(consumer, done, 0));
        cudaCheck(cudaEventDestroy(done));
    }
};

namespace th {
// The value case `name` printed when this test binary ran it as a child (`self flag name`) under
// SIMT_STREAMS=mode; NaN if it printed none or failed.
inline float stream_case_value(const char* self, const char* flag, const std::string& name, const char* mode) {
    ChildOutput child = run_command(std::string("SIMT_STREAMS=") + mode + " timeout 60 " + self + " " + flag + " " +
                                    name + " 2>&1");
    size_t at = child.text.find("value=");
    return child.status == 0 && at != std::string::npos ? strtof(child.text.c_str() + at + 6, nullptr) : NAN;
}
}  // namespace th
