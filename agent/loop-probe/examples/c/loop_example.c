/*
 * A C control loop linking loop-probe: records CYCLES cycles of a 1 kHz loop with a 0.8 ms
 * relative deadline into PATH with every 10th cycle over budget (yet on time), every 50th
 * starting so late that it completes past its deadline (yet within budget), every 100th
 * activation skipped, and a few events, then prints what it injected as one JSON line. Timestamps are synthetic (no sleeping) so it runs in
 * milliseconds; the agent-side reader checks the counts.
 *
 *   cc -std=c11 -Wall -Wextra -Werror -I include examples/c/loop_example.c \
 *      -L target/debug -lloop_probe -Wl,-rpath,$PWD/target/debug -o loop_example
 *   ./loop_example /dev/shm/example.probe 1000
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loop_probe.h"

#define PERIOD_NS 1000000ull
#define DEADLINE_NS 800000ull
#define BUDGET_NS 400000ull

static int check(int got, int want, const char *what) {
    if (got != want) {
        fprintf(stderr, "%s: got %d (%s), want %d\n", what, got, lp_strerror(got), want);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s PATH CYCLES\n", argv[0]);
        return 64;
    }
    const char *path = argv[1];
    unsigned long long cycles = strtoull(argv[2], NULL, 10);
    int failures = 0;

    LpWriter *w = NULL;
    failures += check(lp_writer_open(NULL, 1, "x", PERIOD_NS, BUDGET_NS, 0, 0, &w), LP_ERR_INVALID,
                      "open with a null path");
    failures += check(lp_writer_open(path, 1, "x", 0, BUDGET_NS, 0, 0, &w), LP_ERR_INVALID,
                      "open with a zero period");
    failures += check(lp_writer_open_deadline(path, 1, "x", PERIOD_NS, 1001 * PERIOD_NS, BUDGET_NS,
                                              0, 0, &w),
                      LP_ERR_INVALID, "open with a deadline over 1000 periods");
    int rc = lp_writer_open_deadline(path, 42, "c-example", PERIOD_NS, DEADLINE_NS, BUDGET_NS, 1024,
                                     0, &w);
    if (rc != LP_OK) {
        fprintf(stderr, "lp_writer_open: %s\n", lp_strerror(rc));
        return 1;
    }
    char too_long[80];
    memset(too_long, 'v', sizeof too_long - 1);
    too_long[sizeof too_long - 1] = '\0';
    failures += check(lp_set_model_version(w, 1, too_long), LP_ERR_TOO_LONG, "overlong model version");
    failures += check(lp_set_autonomy(w, 99, lp_now_ns()), LP_ERR_INVALID, "unknown autonomy mode");
    failures += check(lp_set_model_version(w, 0xc0ffeeull, "c-model-1.0"), LP_OK, "model version");

    unsigned long long t0 = lp_now_ns();
    failures += check(lp_set_autonomy(w, LP_MODE_AUTONOMOUS, t0), LP_OK, "autonomous");
    unsigned long long recorded = 0, overruns = 0, skipped = 0, flagged_overrun = 0;
    unsigned long long late = 0, flagged_late = 0;
    for (unsigned long long i = 0; i < cycles; i++) {
        if (i % 100 == 99) {
            skipped++;
            continue;
        }
        unsigned long long release = t0 + i * PERIOD_NS;
        unsigned long long duration = (i % 10 == 5) ? BUDGET_NS + 1000 : BUDGET_NS / 2;
        /* Woken 0.7 ms after its release: 0.2 ms of work completes 0.9 ms after it. */
        unsigned long long start = (i % 50 == 20) ? release + 700000 : release + 15000;
        uint32_t flags = 0;
        if (i == 500) {
            lp_count_fallback(w);
            flags |= LP_FLAG_FALLBACK;
        }
        if (i == 300) lp_count_intervention(w);
        if (i == 700) lp_count_safe_stop(w);
        if (i == 600) lp_set_autonomy(w, LP_MODE_MANUAL, release);
        uint32_t stored = lp_record(w, i, release, start, duration, flags);
        if (stored & LP_FLAG_OVERRUN) flagged_overrun++;
        if (stored & LP_FLAG_DEADLINE_MISS) flagged_late++;
        if (duration > BUDGET_NS) overruns++;
        if (start + duration > release + DEADLINE_NS) late++;
        recorded++;
    }
    lp_writer_close(w);
    printf("{\"recorded\":%llu,\"overruns\":%llu,\"flagged_overruns\":%llu,\"skipped\":%llu,"
           "\"late\":%llu,\"flagged_late\":%llu,\"failures\":%d}\n",
           recorded, overruns, flagged_overrun, skipped, late, flagged_late, failures);
    return failures == 0 ? 0 : 1;
}
