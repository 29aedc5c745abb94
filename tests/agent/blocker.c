// Kiln's off-CPU test program (crates/kiln/tests/integration/agent.rs): each cycle, the
// main thread sleeps 70 ms in kiln_sleep_a, then blocks 30 ms on a pipe read in
// kiln_pipe_b, which a second thread answers 30 ms after being asked. Runs argv[1]
// seconds.
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int ask[2], answer[2];

static void sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static void *kiln_writer(void *unused)
{
    char byte;
    (void)unused;
    while (read(ask[0], &byte, 1) == 1) {
        sleep_ms(30);
        if (write(answer[1], &byte, 1) != 1)
            break;
    }
    return NULL;
}

__attribute__((noinline)) void kiln_sleep_a(void)
{
    sleep_ms(70);
}

__attribute__((noinline)) void kiln_pipe_b(void)
{
    char byte = 1;
    if (write(ask[1], &byte, 1) == 1)
        (void)!read(answer[0], &byte, 1);
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 5;
    if (pipe(ask) || pipe(answer))
        return 1;
    pthread_t writer;
    pthread_create(&writer, NULL, kiln_writer, NULL);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        kiln_sleep_a();
        kiln_pipe_b();
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    return 0;
}
