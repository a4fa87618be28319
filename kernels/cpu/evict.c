/* Taking memory out of the processor's caches, for the path choices' timing passes (spec/path_choice.py's `Pass`):
 * a decode step streams more weights than the last-level cache holds, so it finds each weight in memory, while a
 * timing pass over a few tens of MB finds them in that cache on a processor whose cache is larger than the pass
 * (480 MiB reported on the Intel VMs here), where the paths rank otherwise than from memory (docs/benchmarks.md).
 * Evicting the pass's operands before it (untimed) makes it read them from memory, as the step does.
 *
 * CLFLUSHOPT where the processor has it (weakly ordered: the lines go out in parallel, then one fence), else CLFLUSH,
 * which every x86-64 processor has. Both write a modified line back before dropping it: the data is unchanged. A span
 * of several MB is cut over plain threads, one per CPU the process may run on (two halve the time of one): not an
 * OpenMP team, whose threads spin after their work and would share the cores with the pass timed next. */
#define _GNU_SOURCE
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

enum { LINE = 64, MAX_THREADS = 8, MIN_SHARE = 4 << 20 /* bytes a thread is worth starting for */ };

static int has_clflushopt(void) {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 23));
}

__attribute__((target("clflushopt"))) static void flush_opt(const char *p, long bytes) {
    for (long i = 0; i < bytes; i += LINE) _mm_clflushopt((void *)(p + i));
    _mm_sfence();
}

static void flush(const char *p, long bytes) {
    for (long i = 0; i < bytes; i += LINE) _mm_clflush(p + i);
    _mm_mfence();
}

typedef struct {
    const char *start;
    long bytes;
    int opt;
} Span;

static void *flush_span(void *arg) {
    const Span *s = arg;
    if (s->opt) flush_opt(s->start, s->bytes);
    else flush(s->start, s->bytes);
    return NULL;
}

static int cpus(void) {
    cpu_set_t set;
    return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
}

/* the lines of [p, p + bytes) out of every cache level (a line straddling either end included) */
void evict(const void *p, long bytes) {
    static int opt = -1; /* a benign race: every thread computes the same value */
    if (opt < 0) opt = has_clflushopt();
    if (bytes <= 0) return;
    const char *start = (const char *)((unsigned long)p & ~(unsigned long)(LINE - 1));
    const long lines = ((const char *)p + bytes - start + LINE - 1) / LINE;
    long n = lines * LINE / MIN_SHARE, c = cpus();
    n = n < 1 ? 1 : n > c ? c : n > MAX_THREADS ? MAX_THREADS : n;
    Span spans[MAX_THREADS];
    pthread_t threads[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (long t = 0; t < n; t++) {
        const long lo = lines * t / n, hi = lines * (t + 1) / n;
        spans[t] = (Span){start + lo * LINE, (hi - lo) * LINE, opt};
        if (t > 0) started[t] = pthread_create(&threads[t], NULL, flush_span, &spans[t]) == 0;
    }
    flush_span(&spans[0]);
    for (long t = 1; t < n; t++) {
        if (started[t]) pthread_join(threads[t], NULL);
        else flush_span(&spans[t]); /* no thread to be had: this one does its span */
    }
}
