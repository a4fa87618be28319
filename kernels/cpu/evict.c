/* Taking memory out of the processor's caches, for the path choices' timing passes (spec/path_choice.py's `Pass`):
 * a decode step streams more weights than the last-level cache holds, so it finds each weight in memory, while a
 * timing pass over a few tens of MB finds them in that cache on a processor whose cache is larger than the pass
 * (480 MiB reported on the Intel VMs here), where the paths rank otherwise than from memory (docs/benchmarks.md).
 * Evicting the pass's operands before it (untimed) makes it read them from memory, as the step does.
 *
 * CLFLUSHOPT where the processor has it (weakly ordered: the lines go out in parallel, then one fence), else CLFLUSH,
 * which every x86-64 processor has. Both write a modified line back before dropping it: the data is unchanged. */
#include <cpuid.h>
#include <immintrin.h>

enum { LINE = 64 };

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

/* the lines of [p, p + bytes) out of every cache level (a line straddling either end included) */
void evict(const void *p, long bytes) {
    static int opt = -1; /* a benign race: every thread computes the same value */
    if (opt < 0) opt = has_clflushopt();
    if (bytes <= 0) return;
    const char *start = (const char *)((unsigned long)p & ~(unsigned long)(LINE - 1));
    const long span = (const char *)p + bytes - start;
    if (opt) flush_opt(start, span);
    else flush(start, span);
}
