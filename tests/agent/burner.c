/* Burns argv[1] seconds of its own CPU time (default 10), however busy the machine is:
 * 70% of it in kiln_hot_a, 30% in kiln_hot_b.
 * The agent tests profile it and check the split, and that its stacks reach main. Both
 * functions run the same short loop (about a millisecond), one of them picked at random
 * 7 times in 10: no period for the sampling, or the scheduler's slices on a loaded
 * machine, to fall in step with (an alternation of one 10-ms turn of each, as before,
 * drew 64 and 74 % under the whole suite).
 * The volatile local gives each function a stack frame: GCC 12 sets up no frame pointer in
 * a leaf that needs no stack, even with -fno-omit-frame-pointer, and a frame-pointer walk
 * from such a leaf skips its caller. */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static unsigned long step(unsigned long x) {
    return x * 6364136223846793005UL + 1442695040888963407UL;
}

__attribute__((noinline)) void kiln_hot_a(void) {
    volatile unsigned long x = 1;
    for (unsigned long i = 0; i < 700000; i++) x = step(x);
}

__attribute__((noinline)) void kiln_hot_b(void) {
    volatile unsigned long x = 1;
    for (unsigned long i = 0; i < 700000; i++) x = step(x);
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10.0;
    unsigned int seed = (unsigned int)getpid();
    struct timespec start, now;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &start);
    do {
        if (rand_r(&seed) % 10 < 7)
            kiln_hot_a();
        else
            kiln_hot_b();
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    return 0;
}
