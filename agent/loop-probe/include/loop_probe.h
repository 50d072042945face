/*
 * loop_probe.h: C ABI of the edgewatch loop-probe library (probe file ABI version 2).
 *
 * A control loop records every cycle into a shared-memory file (default under /dev/shm) that
 * the edgewatch agent maps read-only. lp_record() makes no syscalls, takes no locks, never
 * allocates and never waits. All timestamps are CLOCK_MONOTONIC nanoseconds (lp_now_ns()).
 *
 * Deadline semantics. Activation k of a loop with period T is released at release_ns (r_k),
 * starts at start_ns and runs for duration_ns; it completes at f_k = start_ns + duration_ns.
 * The loop declares its relative deadline D (lp_writer_open_deadline; 0, and lp_writer_open,
 * mean D = T). Activation k MISSES ITS DEADLINE when f_k > r_k + D. An activation that never
 * ran (the loop jumped to a later cycle number: a skipped activation) is a deadline miss too.
 * The agent's SLI is (activations - deadline misses) / activations, where activations =
 * recorded cycles + skipped activations. Two diagnostics are kept apart from it: an OVERRUN
 * (duration_ns > budget_ns: the step took longer than its execution budget, which a step can do
 * and still meet D) and start lateness (start_ns - release_ns: a step within its budget can
 * still miss D by starting late). Pass each cycle's planned release, not the time it woke.
 *
 * Threads: lp_record() must be called from one thread at a time per handle; every other
 * function may be called from any thread. Setters that find another thread writing the same
 * header cell return LP_ERR_BUSY rather than wait.
 *
 * Build: cargo build -p loop-probe --release, then link against
 * target/release/libloop_probe.so (or the static libloop_probe.a plus -lpthread -ldl -lm).
 *
 * This header is checked against the Rust declarations by the crate's tests.
 */
#ifndef LOOP_PROBE_H
#define LOOP_PROBE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes. */
#define LP_OK 0
#define LP_ERR_INVALID 1
#define LP_ERR_ALREADY_RUNNING 2
#define LP_ERR_IO 3
#define LP_ERR_MLOCK 4
#define LP_ERR_BUSY 5
#define LP_ERR_TOO_LONG 6
#define LP_ERR_PANIC 7

/* Record flags. OVERRUN, SKIPPED and DEADLINE_MISS are set by the probe; a loop may pass
 * DEGRADED and FALLBACK. */
#define LP_FLAG_OVERRUN 0x1u
#define LP_FLAG_SKIPPED 0x2u
#define LP_FLAG_DEGRADED 0x4u
#define LP_FLAG_FALLBACK 0x8u
#define LP_FLAG_DEADLINE_MISS 0x10u

/* Autonomy modes. */
#define LP_MODE_UNKNOWN 0u
#define LP_MODE_IDLE 1u
#define LP_MODE_MANUAL 2u
#define LP_MODE_TELEOPERATED 3u
#define LP_MODE_AUTONOMOUS 4u

/* Opaque producer handle. */
typedef struct LpWriter LpWriter;

/* Creates the probe file at path (replacing a dead producer's file; LP_ERR_ALREADY_RUNNING if a
 * live one holds it) for a loop whose relative deadline is its period. loop_name: at most 31
 * bytes. budget_ns: the execution budget (overruns). capacity: ring slots, a power of two, or 0
 * for lp_recommended_capacity(period_ns). require_mlock != 0 fails with LP_ERR_MLOCK if the
 * ring cannot be locked into RAM. On LP_OK stores the handle in *out. */
int lp_writer_open(const char *path, uint32_t loop_id, const char *loop_name, uint64_t period_ns,
                   uint64_t budget_ns, uint32_t capacity, int require_mlock, LpWriter **out);

/* As lp_writer_open, with the loop's relative deadline: an activation whose completion comes
 * after its release + deadline_ns misses its deadline. 0 means the period; at most 1000
 * periods (else LP_ERR_INVALID). */
int lp_writer_open_deadline(const char *path, uint32_t loop_id, const char *loop_name,
                            uint64_t period_ns, uint64_t deadline_ns, uint64_t budget_ns,
                            uint32_t capacity, int require_mlock, LpWriter **out);

/* Unmaps and releases the producer lock; the file stays for the agent to read. */
void lp_writer_close(LpWriter *w);

/* Records one cycle; returns the flags stored (the probe adds OVERRUN when duration_ns exceeds
 * the budget, DEADLINE_MISS when start_ns + duration_ns comes after release_ns + the deadline,
 * and SKIPPED after a gap in cycle numbers: the activations in the gap are deadline misses). */
uint32_t lp_record(LpWriter *w, uint64_t cycle, uint64_t release_ns, uint64_t start_ns,
                   uint64_t duration_ns, uint32_t flags);

/* Reports a change of autonomy mode (LP_MODE_*) at now_ns. */
int lp_set_autonomy(const LpWriter *w, uint32_t mode, uint64_t now_ns);

/* Publishes the model version: an id hash and a UTF-8 string of at most 64 bytes. */
int lp_set_model_version(const LpWriter *w, uint64_t id_hash, const char *version);

/* Event counters. */
void lp_count_intervention(const LpWriter *w);
void lp_count_safe_stop(const LpWriter *w);
void lp_count_fallback(const LpWriter *w);

/* 1 if the ring is locked into RAM. */
int lp_memory_locked(const LpWriter *w);

/* CLOCK_MONOTONIC now, in nanoseconds. */
uint64_t lp_now_ns(void);

/* Recommended ring capacity for a loop period: 16 s of records, 1024..65536 slots. */
uint32_t lp_recommended_capacity(uint64_t period_ns);

/* Static description of a return code. */
const char *lp_strerror(int code);

#ifdef __cplusplus
}
#endif

#endif /* LOOP_PROBE_H */
