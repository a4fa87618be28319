// Share: running a custom call's independent items on XLA's own intra-op thread pool, for the XLA FFI handlers of
// the CPU kernels (gemv_ffi.cc, decode_ops_ffi.cc). Not an OpenMP team: a second set of threads beside XLA's, on a
// machine with as many cores as XLA has threads, streamed a decode step's chain of products slower than XLA's own
// dot (docs/benchmarks.md).
#pragma once

#include <immintrin.h>

#include <atomic>
#include <memory>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// f(item) for every item in [0, items), shared between this thread and `helpers` tasks on XLA's pool: each takes
// the next unclaimed item until none is left, so the caller does the work alone when the pool is busy (XLA runs
// independent thunks, q/k/v of one layer, concurrently) instead of waiting for a task that has not started. The
// state lives as long as the last task holding it: a task that starts after the call returned finds no item.
struct Work {
    std::atomic<long> next{0}, done{0};
    long items = 0;
};

template <typename F>
static void Share(ffi::ThreadPool &pool, long helpers, long items, F f) {
    auto work = std::make_shared<Work>();
    work->items = items;
    auto take = [work, f] {
        for (long i; (i = work->next.fetch_add(1, std::memory_order_relaxed)) < work->items;) {
            f(i);
            work->done.fetch_add(1, std::memory_order_release);
        }
    };
    for (long h = 0; h < helpers && h + 1 < items; h++) pool.Schedule(decltype(take)(take));  // a copy each
    take();
    while (work->done.load(std::memory_order_acquire) < items) _mm_pause();
}
