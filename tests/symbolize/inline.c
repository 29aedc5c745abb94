/* Kiln's symbolization test program: two hot functions, each spending its time in a
 * function the compiler inlines into it, called 7:3 from main for argv[1] seconds of
 * CPU. Built with -O2 -g, then split into a stripped binary and its debug file
 * (crates/kiln-symbolize/tests, crates/kiln/tests/integration/symbolization.rs). */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static volatile uint64_t sink;

static inline __attribute__((always_inline)) uint64_t kiln_mix_a(uint64_t x) {
    for (int i = 0; i < 64; i++)
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x;
}

static inline __attribute__((always_inline)) uint64_t kiln_mix_b(uint64_t x) {
    for (int i = 0; i < 64; i++)
        x = (x ^ (x >> 29)) * 0xbf58476d1ce4e5b9ULL;
    return x;
}

__attribute__((noinline)) void kiln_hot_a(uint64_t n) {
    uint64_t x = n;
    for (uint64_t i = 0; i < n; i++)
        x = kiln_mix_a(x ^ i);
    sink = x;
}

__attribute__((noinline)) void kiln_hot_b(uint64_t n) {
    uint64_t x = n;
    for (uint64_t i = 0; i < n; i++)
        x = kiln_mix_b(x + i);
    sink = x;
}

/* The process's own CPU time: two builds run side by side on a busy machine then make
 * the same calls (the sequence below is fixed), whatever share of the CPU each got. */
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) void kiln_main_loop(double seconds) {
    double end = now() + seconds;
    uint64_t state = 88172645463325252ULL;
    while (now() < end) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        /* Equal work per call, so the 7:3 of calls is 7:3 of time. */
        if (state % 10 < 7)
            kiln_hot_a(20000);
        else
            kiln_hot_b(20000);
    }
}

int main(int argc, char **argv) {
    kiln_main_loop(argc > 1 ? atof(argv[1]) : 30.0);
    return 0;
}
