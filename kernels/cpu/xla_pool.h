// Share and SharePhases: running a custom call's independent items on XLA's own intra-op thread pool, for the XLA
// FFI handlers of the CPU kernels (gemv_ffi.cc, decode_ops_ffi.cc, decode_layer_ffi.cc). Not an OpenMP team: a
// second set of threads beside XLA's, on a machine with as many cores as XLA has threads, streamed a decode step's
// chain of products slower than XLA's own dot (docs/benchmarks.md).
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

// Share for items that can fail (f returns 0 on success, else nonzero): whether every item succeeded. The flag may
// live on the caller's stack: Share returns only after every item ran, and a helper that starts later claims none.
template <typename F>
static bool ShareChecked(ffi::ThreadPool &pool, long helpers, long items, F f) {
    std::atomic<bool> failed{false};
    std::atomic<bool> *flag = &failed;
    Share(pool, helpers, items, [=](long i) {
        if (f(i) != 0) flag->store(true, std::memory_order_relaxed);
    });
    return !failed.load();
}

// f(phase, item) for every item of every phase in order, item in [0, items[phase]): Share's claiming, phase after
// phase, by this thread and `helpers` tasks on XLA's pool that each stay for the whole sequence, so the pool is
// woken once per call instead of once per phase. Every item of a phase ends before any of the next begins: a thread
// that runs out of items waits for those others have claimed to finish. Nobody waits for a helper that has not
// started, so the caller finishes alone where the pool is busy, and a helper that starts late finds nothing left
// in the phases already done.
struct Phases {
    std::unique_ptr<std::atomic<long>[]> next, done;
    std::unique_ptr<long[]> items;
    long phases = 0;
};

template <typename F>
static void SharePhases(ffi::ThreadPool &pool, long helpers, const long *items, long phases, F f) {
    auto work = std::make_shared<Phases>();
    work->next.reset(new std::atomic<long>[phases]());
    work->done.reset(new std::atomic<long>[phases]());
    work->items.reset(new long[phases]);
    work->phases = phases;
    for (long p = 0; p < phases; p++) work->items[p] = items[p];
    auto take = [work, f] {
        for (long p = 0; p < work->phases; p++) {
            const long n = work->items[p];
            for (long i; (i = work->next[p].fetch_add(1, std::memory_order_relaxed)) < n;) {
                f(p, i);
                work->done[p].fetch_add(1, std::memory_order_release);
            }
            while (work->done[p].load(std::memory_order_acquire) < n) _mm_pause();
        }
    };
    for (long h = 0; h < helpers; h++) pool.Schedule(decltype(take)(take));  // a copy each
    take();
}
