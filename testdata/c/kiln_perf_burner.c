/* A program for Kiln's perf script test: it spends its CPU in kiln_perf_hot, called from
 * kiln_perf_outer, for the number of seconds given (2 by default). */
#include <stdlib.h>
#include <time.h>

volatile long sink;

__attribute__((noinline)) long kiln_perf_hot(long n) {
    long x = 0;
    for (long i = 0; i < n; i++) {
        x += i * i % 7;
    }
    return x;
}

__attribute__((noinline)) void kiln_perf_outer(void) {
    sink += kiln_perf_hot(20000000);
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        kiln_perf_outer();
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    return 0;
}
