// test/simt/test_graphs.cu — stream capture and CUDA graphs: a captured sequence is recorded, not run,
// and each cudaGraphLaunch replays it with the arguments it was captured with (a copy from pinned
// memory reading the buffer when the replay reaches it); streams join a capture through events and
// must be joined back; and what CUDA forbids during a capture is refused with CUDA's error and
// invalidates it (cudaStreamEndCapture then returns cudaErrorStreamCaptureInvalidated).
//
// Plain CUDA, so it runs on a GPU as well as on the CPU backend. On the backend it also checks the
// count of operations the host issues (a graph launch is one) and, in child processes, that a replay
// is as unordered as any other stream work under SIMT_STREAMS=adversarial.
#include <cuda_runtime.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "../harness.h"
#include "stream_cases.h"
#include "../../llmc/cuda_common.h"

__global__ void fill_kernel(float* x, float v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}
__global__ void add_kernel(float* x, const float* y, int n) {  // x += y
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

namespace {
const int N = 256;

// Every element of device buffer x (N floats) after the device has finished.
std::vector<float> read(const float* x) {
    std::vector<float> h(N);
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(h.data(), x, N * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}
bool all_equal(const std::vector<float>& h, float v) {
    for (float x : h)
        if (x != v) return false;
    return true;
}

// Ends the capture on `s` and instantiates its graph; returns EndCapture's error (exec null then).
cudaError_t end_and_instantiate(cudaStream_t s, cudaGraphExec_t* exec) {
    cudaGraph_t g = nullptr;
    *exec = nullptr;
    cudaError_t err = cudaStreamEndCapture(s, &g);
    if (err != cudaSuccess) return err;
    cudaCheck(cudaGraphInstantiate(exec, g, 0));
    cudaCheck(cudaGraphDestroy(g));  // the executable graph keeps what it needs
    return cudaSuccess;
}
}  // namespace

// Captured work does not run; each launch replays it with the captured arguments — a kernel's by
// value (changing the host variable afterwards changes nothing), a pinned copy's source read anew.
void test_capture_and_replay() {
    float *acc, *y, *pinned;
    cudaCheck(cudaMalloc(&acc, N * sizeof(float)));
    cudaCheck(cudaMalloc(&y, N * sizeof(float)));
    cudaCheck(cudaMallocHost(&pinned, N * sizeof(float)));
    cudaStream_t s;
    cudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaCheck(cudaMemset(acc, 0, N * sizeof(float)));
    cudaCheck(cudaMemset(y, 0, N * sizeof(float)));
    for (int i = 0; i < N; i++) pinned[i] = 1.f;

    float value = 2.f;
    cudaCheck(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cudaStreamCaptureStatus status;
    cudaCheck(cudaStreamIsCapturing(s, &status));
    bool active = status == cudaStreamCaptureStatusActive;
    cudaCheck(launch_kernel(fill_kernel, dim3(1), dim3(N), 0, s, y, value, N));          // y = 2
    cudaCheck(launch_kernel(add_kernel, dim3(1), dim3(N), 0, s, acc, (const float*)y, N));  // acc += 2
    cudaCheck(cudaMemcpyAsync(y, pinned, N * sizeof(float), cudaMemcpyHostToDevice, s));  // y = pinned
    cudaCheck(launch_kernel(add_kernel, dim3(1), dim3(N), 0, s, acc, (const float*)y, N));  // acc += pinned
    cudaGraphExec_t exec;
    cudaError_t end = end_and_instantiate(s, &exec);
    cudaCheck(cudaStreamIsCapturing(s, &status));
    bool ended = status == cudaStreamCaptureStatusNone;
    std::vector<float> after_capture = read(acc);
    th::report(end == cudaSuccess && active && ended && all_equal(after_capture, 0.f),
               "capture: work is recorded, not run; the stream captures until EndCapture",
               "EndCapture %s, acc[0] %g after the capture", cudaGetErrorName(end), after_capture[0]);

    value = 100.f;  // captured by value: the replay still fills 2
    cudaCheck(cudaGraphLaunch(exec, s));
    std::vector<float> once = read(acc);
    for (int i = 0; i < N; i++) pinned[i] = 10.f;  // read by the next replay's copy
    cudaCheck(cudaGraphLaunch(exec, s));
    cudaCheck(cudaGraphLaunch(exec, s));
    std::vector<float> thrice = read(acc);
    th::report(all_equal(once, 3.f) && all_equal(thrice, 27.f),
               "replay: kernel arguments as captured, a pinned copy reads the buffer at each replay",
               "after 1 launch %g (want 3), after 3 %g (want 3 + 12 + 12 = 27)", once[0], thrice[0]);

    cudaCheck(cudaGraphExecDestroy(exec));
    cudaCheck(cudaStreamDestroy(s));
    cudaCheck(cudaFreeHost(pinned));
    cudaCheck(cudaFree(y));
    cudaCheck(cudaFree(acc));
}

// A stream that waits on an event recorded in the capture joins it; the capture ends once the
// origin has waited for the forked stream's last work. Without that join EndCapture fails.
void test_fork_join() {
    float *a, *b;
    cudaCheck(cudaMalloc(&a, N * sizeof(float)));
    cudaCheck(cudaMalloc(&b, N * sizeof(float)));
    cudaStream_t origin, side;
    cudaCheck(cudaStreamCreateWithFlags(&origin, cudaStreamNonBlocking));
    cudaCheck(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    cudaEvent_t fork, join;
    cudaCheck(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    for (bool joined : {true, false}) {
        cudaCheck(cudaMemset(a, 0, N * sizeof(float)));
        cudaCheck(cudaMemset(b, 0, N * sizeof(float)));
        cudaCheck(cudaDeviceSynchronize());
        cudaCheck(cudaStreamBeginCapture(origin, cudaStreamCaptureModeGlobal));
        cudaCheck(launch_kernel(fill_kernel, dim3(1), dim3(N), 0, origin, a, 4.f, N));
        cudaCheck(cudaEventRecord(fork, origin));
        cudaCheck(cudaStreamWaitEvent(side, fork, 0));  // side joins the capture, after the fill
        cudaStreamCaptureStatus side_status;
        cudaCheck(cudaStreamIsCapturing(side, &side_status));
        cudaCheck(launch_kernel(add_kernel, dim3(1), dim3(N), 0, side, b, (const float*)a, N));  // b += a
        if (joined) {
            cudaCheck(cudaEventRecord(join, side));
            cudaCheck(cudaStreamWaitEvent(origin, join, 0));
            cudaCheck(launch_kernel(add_kernel, dim3(1), dim3(N), 0, origin, a, (const float*)b, N));  // a += b
        }
        cudaGraphExec_t exec;
        cudaError_t end = end_and_instantiate(origin, &exec);
        cudaStreamCaptureStatus after;
        cudaCheck(cudaStreamIsCapturing(side, &after));
        if (joined) {
            cudaCheck(cudaGraphLaunch(exec, origin));
            std::vector<float> ha = read(a), hb = read(b);
            cudaCheck(cudaGraphExecDestroy(exec));
            th::report(end == cudaSuccess && side_status == cudaStreamCaptureStatusActive &&
                           after == cudaStreamCaptureStatusNone && all_equal(hb, 4.f) && all_equal(ha, 8.f),
                       "fork and join through events: the side stream captures, the replay keeps the order",
                       "EndCapture %s, b %g (want 4), a %g (want 8)", cudaGetErrorName(end), hb[0], ha[0]);
        } else {
            cudaGetLastError();
            th::report(end == cudaErrorStreamCaptureUnjoined && exec == nullptr && after == cudaStreamCaptureStatusNone,
                       "refused: a forked stream not joined back (cudaErrorStreamCaptureUnjoined)", "EndCapture %s",
                       cudaGetErrorName(end));
        }
    }
    cudaCheck(cudaEventDestroy(fork));
    cudaCheck(cudaEventDestroy(join));
    cudaCheck(cudaStreamDestroy(origin));
    cudaCheck(cudaStreamDestroy(side));
    cudaCheck(cudaFree(a));
    cudaCheck(cudaFree(b));
}

// Each planted misuse during a capture returns CUDA's error and invalidates the capture: EndCapture
// returns cudaErrorStreamCaptureInvalidated and no graph. Relaxed mode allows an allocation.
void test_refusals() {
    float *x, *pinned;
    cudaCheck(cudaMalloc(&x, N * sizeof(float)));
    cudaCheck(cudaMallocHost(&pinned, N * sizeof(float)));
    std::vector<float> pageable(N, 1.f);
    cudaStream_t s, other;
    cudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaCheck(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    cudaStream_t blocking;
    cudaCheck(cudaStreamCreate(&blocking));
    cudaEvent_t outside;
    cudaCheck(cudaEventCreate(&outside));
    cudaCheck(cudaEventRecord(outside, other));
    struct Misuse {
        const char* what;
        cudaStream_t stream;
        cudaError_t expect;
        std::function<cudaError_t()> call;
    } misuses[] = {
        {"cudaStreamSynchronize on the capturing stream", s, cudaErrorStreamCaptureUnsupported,
         [&] { return cudaStreamSynchronize(s); }},
        {"cudaStreamQuery on the capturing stream", s, cudaErrorStreamCaptureUnsupported,
         [&] { return cudaStreamQuery(s); }},
        {"cudaDeviceSynchronize", s, cudaErrorStreamCaptureUnsupported, [&] { return cudaDeviceSynchronize(); }},
        {"cudaMalloc (global mode)", s, cudaErrorStreamCaptureUnsupported, [&] {
             void* p = nullptr;
             cudaError_t err = cudaMalloc(&p, 64);
             if (err == cudaSuccess) cudaFree(p);
             return err;
         }},
        {"cudaMallocHost (global mode)", s, cudaErrorStreamCaptureUnsupported, [&] {
             void* p = nullptr;
             cudaError_t err = cudaMallocHost(&p, 64);
             if (err == cudaSuccess) cudaFreeHost(p);
             return err;
         }},
#if defined(SIMT_CPU)
        // Refused by the CPU backend only: CUDA 13 on an H100 captured both (2026-11-26). The backend
        // is the stricter of the two, since a replay would read whatever the host left in the buffer.
        {"cudaMemcpyAsync from pageable host memory", s, cudaErrorStreamCaptureUnsupported,
         [&] { return cudaMemcpyAsync(x, pageable.data(), N * sizeof(float), cudaMemcpyHostToDevice, s); }},
        {"cudaMemcpyAsync to pageable host memory", s, cudaErrorStreamCaptureUnsupported,
         [&] { return cudaMemcpyAsync(pageable.data(), x, N * sizeof(float), cudaMemcpyDeviceToHost, s); }},
#endif
        {"legacy-stream kernel while a blocking stream captures", blocking, cudaErrorStreamCaptureImplicit,
         [&] { return launch_kernel(fill_kernel, dim3(1), dim3(N), 0, (cudaStream_t)0, x, 1.f, N); }},
        {"cudaStreamWaitEvent on an event recorded outside the capture", s, cudaErrorStreamCaptureIsolation,
         [&] { return cudaStreamWaitEvent(s, outside, 0); }},
    };
    for (const Misuse& m : misuses) {
        cudaCheck(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeGlobal));
        cudaCheck(launch_kernel(fill_kernel, dim3(1), dim3(N), 0, m.stream, x, 1.f, N));
        cudaError_t got = m.call();
        cudaStreamCaptureStatus status;
        cudaCheck(cudaStreamIsCapturing(m.stream, &status));
        cudaError_t later = cudaMemsetAsync(x, 0, N * sizeof(float), m.stream);  // refused too, once invalidated
        cudaGraph_t g = nullptr;
        cudaError_t end = cudaStreamEndCapture(m.stream, &g);
        cudaGetLastError();
        std::string name = std::string("refused during capture: ") + m.what;
        th::report(got == m.expect && status == cudaStreamCaptureStatusInvalidated &&
                       later == cudaErrorStreamCaptureInvalidated && end == cudaErrorStreamCaptureInvalidated &&
                       g == nullptr,
                   name.c_str(), "call %s (want %s), then EndCapture %s", cudaGetErrorName(got),
                   cudaGetErrorName(m.expect), cudaGetErrorName(end));
    }

    // A capture in relaxed mode lets the host allocate (the graph does not replay the allocation).
    cudaCheck(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    cudaCheck(launch_kernel(fill_kernel, dim3(1), dim3(N), 0, s, x, 1.f, N));
    void* p = nullptr;
    cudaError_t alloc = cudaMalloc(&p, 64);
    cudaGraphExec_t exec;
    cudaError_t end = end_and_instantiate(s, &exec);
    if (exec) cudaCheck(cudaGraphExecDestroy(exec));
    if (alloc == cudaSuccess) cudaCheck(cudaFree(p));
    th::report(alloc == cudaSuccess && end == cudaSuccess, "relaxed mode: cudaMalloc allowed during the capture",
               "cudaMalloc %s, EndCapture %s", cudaGetErrorName(alloc), cudaGetErrorName(end));

    // Misuses of the capture calls themselves.
    cudaError_t legacy = cudaStreamBeginCapture((cudaStream_t)0, cudaStreamCaptureModeGlobal);
    cudaGetLastError();
    cudaGraph_t g = nullptr;
    cudaError_t not_capturing = cudaStreamEndCapture(s, &g);
    cudaGetLastError();
    // Ending a capture on a stream that joined it, and synchronizing an event recorded in it, are
    // refused. Whether the capture survives either differs (the CPU backend keeps it; an H100 with
    // CUDA 13 invalidated it), so each gets its own capture, ended on its origin whatever the result.
    auto end_any = [&] {  // ends the capture on s, discarding the graph or the error
        cudaGraph_t graph = nullptr;
        cudaError_t err = cudaStreamEndCapture(s, &graph);
        cudaGetLastError();
        if (graph) cudaCheck(cudaGraphDestroy(graph));
        return err;
    };
    cudaCheck(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cudaCheck(cudaEventRecord(outside, s));
    cudaCheck(cudaStreamWaitEvent(other, outside, 0));  // other joins
    cudaError_t wrong_stream = cudaStreamEndCapture(other, &g);
    cudaGetLastError();
    if (cudaEventRecord(outside, other) == cudaSuccess) cudaStreamWaitEvent(s, outside, 0);  // joined back
    cudaGetLastError();
    cudaError_t after_wrong = end_any();
    cudaCheck(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cudaCheck(cudaEventRecord(outside, s));
    cudaError_t captured_event = cudaEventSynchronize(outside);
    cudaGetLastError();
    cudaError_t after_event = end_any();
    th::report(legacy != cudaSuccess && not_capturing != cudaSuccess && wrong_stream == cudaErrorStreamCaptureUnmatched &&
                   captured_event == cudaErrorCapturedEvent,
               "refused: capture on the legacy stream, EndCapture without a capture or on a joined stream, "
               "synchronizing a captured event",
               "legacy %s, not capturing %s, joined stream %s (then the origin's EndCapture %s), captured event %s "
               "(then %s)",
               cudaGetErrorName(legacy), cudaGetErrorName(not_capturing), cudaGetErrorName(wrong_stream),
               cudaGetErrorName(after_wrong), cudaGetErrorName(captured_event), cudaGetErrorName(after_event));

    cudaCheck(cudaEventDestroy(outside));
    cudaCheck(cudaStreamDestroy(s));
    cudaCheck(cudaStreamDestroy(other));
    cudaCheck(cudaStreamDestroy(blocking));
    cudaCheck(cudaFreeHost(pinned));
    cudaCheck(cudaFree(x));
}

#if defined(SIMT_CPU)
// The host issues one operation per graph launch, however many the graph holds.
void test_host_operations() {
    float* x;
    cudaCheck(cudaMalloc(&x, N * sizeof(float)));
    cudaStream_t s;
    cudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaCheck(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int k = 0; k < 10; k++) cudaCheck(launch_kernel(fill_kernel, dim3(1), dim3(N), 0, s, x, (float)k, N));
    cudaGraphExec_t exec;
    cudaCheck(end_and_instantiate(s, &exec));
    uint64_t ops0 = simt::host_stream_op_count(), kernels0 = simt::launch_count();
    cudaCheck(cudaGraphLaunch(exec, s));
    cudaCheck(cudaStreamSynchronize(s));
    uint64_t ops = simt::host_stream_op_count() - ops0, kernels = simt::launch_count() - kernels0;
    th::report(ops == 1 && kernels == 10 && all_equal(read(x), 9.f),
               "a graph of 10 kernels: one operation issued by the host, 10 kernels run",
               "%llu host operations, %llu kernels", (unsigned long long)ops, (unsigned long long)kernels);
    cudaCheck(cudaGraphExecDestroy(exec));
    cudaCheck(cudaStreamDestroy(s));
    cudaCheck(cudaFree(x));
}

// Replays are stream work like any other (run in a child under a stream mode, printing "value=V"):
//   unwaited   a graph fills a buffer on one stream; another copies it out without waiting for the
//              launch (the fix records an event after the launch and waits on it);
//   early_refill  the host refills the pinned buffer a queued replay copies from before the replay ran
//              (the fix synchronizes first).
int run_graph_case(const std::string& case_name) {
    StreamCase k(case_name, N);
    const std::string& name = k.name;
    float *buf = k.buf, *out = k.out, *pinned = k.pinned;
    cudaStream_t producer = k.producer, consumer = k.consumer;
    cudaCheck(cudaMemset(buf, 0, N * sizeof(float)));
    cudaCheck(cudaMemset(out, 0, N * sizeof(float)));
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaStreamBeginCapture(producer, cudaStreamCaptureModeGlobal));
    if (name == "unwaited") cudaCheck(launch_kernel(fill_kernel, dim3(1), dim3(N), 0, producer, buf, 1.f, N));
    else cudaCheck(cudaMemcpyAsync(buf, pinned, N * sizeof(float), cudaMemcpyHostToDevice, producer));
    cudaGraphExec_t exec;
    cudaCheck(end_and_instantiate(producer, &exec));
    float value = -1;
    if (name == "unwaited") {
        cudaCheck(cudaGraphLaunch(exec, producer));
        if (k.fixed) k.consumer_waits();
        cudaCheck(cudaMemcpyAsync(out, buf, N * sizeof(float), cudaMemcpyDeviceToDevice, consumer));
        cudaCheck(cudaStreamSynchronize(consumer));
        cudaCheck(cudaMemcpy(&value, out, sizeof(float), cudaMemcpyDeviceToHost));
    } else if (name == "early_refill") {
        for (int i = 0; i < N; i++) pinned[i] = 1.f;
        cudaCheck(cudaGraphLaunch(exec, producer));
        if (k.fixed) cudaCheck(cudaStreamSynchronize(producer));
        for (int i = 0; i < N; i++) pinned[i] = 2.f;
        cudaCheck(cudaStreamSynchronize(producer));
        cudaCheck(cudaMemcpy(&value, buf, sizeof(float), cudaMemcpyDeviceToHost));
    } else {
        fprintf(stderr, "unknown graph case %s\n", name.c_str());
        return 2;
    }
    printf("value=%g\n", value);
    cudaCheck(cudaGraphExecDestroy(exec));
    return 0;
}

// Each bug gives the wrong value under SIMT_STREAMS=adversarial and hides under inorder; the fixed
// programs are right under both.
void test_adversarial_replays(const char* self) {
    for (const char* name : {"unwaited", "early_refill"}) {
        float bug_adv = th::stream_case_value(self, "--graph-case", name, "adversarial");
        float bug_inorder = th::stream_case_value(self, "--graph-case", name, "inorder");
        float fix_adv = th::stream_case_value(self, "--graph-case", std::string(name) + "_fixed", "adversarial");
        float fix_inorder = th::stream_case_value(self, "--graph-case", std::string(name) + "_fixed", "inorder");
        std::string test = std::string("planted bug caught in a replay (SIMT_STREAMS=adversarial): ") + name;
        th::report(bug_adv != 1.f && bug_inorder == 1.f && fix_adv == 1.f && fix_inorder == 1.f, test.c_str(),
                   "got %g (inorder %g), fixed %g / %g, right 1", bug_adv, bug_inorder, fix_adv, fix_inorder);
    }
}
#endif

int main(int argc, char** argv) {
#if defined(SIMT_CPU)
    if (argc == 3 && std::string(argv[1]) == "--graph-case") return run_graph_case(argv[2]);
#endif
    test_capture_and_replay();
    test_fork_join();
    test_refusals();
#if defined(SIMT_CPU)
    test_host_operations();
    test_adversarial_replays(argv[0]);
#else
    (void)argc;
    (void)argv;
#endif
    return th::finish();
}
