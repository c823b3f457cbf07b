// llmc/staging.h — pinned host slots for what a training step uploads (token ids, targets, the
// embedding backward's plan): an async copy from pinned memory never makes the host wait, so the
// host prepares micro-batch k+1 while the GPU still runs micro-batch k.
//
// A slot must stay untouched until the stream has run the copies that read it. With one slot per
// micro-step of an optimizer step (reserve(accum, ...)), a step reuses only slots of earlier steps,
// whose copies the step's end has waited for: no wait inside a step. With fewer slots (evaluation,
// tests), acquire() waits for the slot's last copies before handing it out again.
#pragma once
#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "cuda_common.h"

class StagingSlots {
  public:
    StagingSlots() = default;
    ~StagingSlots() { free_all(); }
    // Owns pinned memory: movable (a model reset by assignment), not copyable.
    StagingSlots(const StagingSlots&) = delete;
    StagingSlots& operator=(const StagingSlots&) = delete;
    StagingSlots(StagingSlots&& o) noexcept { *this = std::move(o); }
    StagingSlots& operator=(StagingSlots&& o) noexcept {
        if (this != &o) {
            free_all();
            slots_ = std::move(o.slots_);
            bytes_ = o.bytes_;
            next_ = o.next_;
            o.slots_.clear();
            o.bytes_ = o.next_ = 0;
        }
        return *this;
    }

    // At least n slots of at least `bytes` each (existing slots are kept when big enough).
    void reserve(int n, size_t bytes) {
        if (bytes > bytes_) free_all();
        bytes_ = std::max(bytes_, bytes);
        while ((int)slots_.size() < n) {
            Slot s;
            cudaCheck(cudaMallocHost(&s.memory, bytes_));
            cudaCheck(cudaEventCreate(&s.copied));
            slots_.push_back(s);
        }
    }
    size_t slot_bytes() const { return bytes_; }

    // The next slot to fill (round robin), once the copies that last read it have run.
    void* acquire() {
        Slot& s = slots_[next_];
        if (s.in_flight) cudaCheck(cudaEventSynchronize(s.copied));
        s.in_flight = false;
        return s.memory;
    }
    // After the copies that read the slot acquire() returned were issued on `stream`.
    void release(cudaStream_t stream) {
        Slot& s = slots_[next_];
        cudaCheck(cudaEventRecord(s.copied, stream));
        s.in_flight = true;
        next_ = (next_ + 1) % slots_.size();
    }

    void free_all() {
        for (Slot& s : slots_) {
            cudaCheck(cudaFreeHost(s.memory));
            cudaCheck(cudaEventDestroy(s.copied));
        }
        slots_.clear();
        bytes_ = 0;
        next_ = 0;
    }

  private:
    struct Slot {
        void* memory = nullptr;
        cudaEvent_t copied = nullptr;
        bool in_flight = false;
    };
    std::vector<Slot> slots_;
    size_t bytes_ = 0, next_ = 0;
};
