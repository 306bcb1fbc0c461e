/* Structures shared by sched.bpf.c and its reader, bpfdyno.sources.sched.collector.
 *
 * Fixed-width fields spelled u64/u32/s32 (bcc decodes ring-buffer events by these type
 * names), explicit padding, sizes checked at compile time. User space gets the layouts from
 * bcc (it derives them from the compiled program); the enum values below are mirrored in
 * the collector and checked against this file by a test.
 *
 * Time accounting, all in ns, cumulative since the program was loaded:
 *   oncpu_ns            time on a CPU
 *   offcpu_runnable_ns  off-CPU periods that began with a preemption (still runnable)
 *   offcpu_blocked_ns   off-CPU periods that began with blocking (sleep, I/O, lock), up to
 *                       the moment the thread ran again
 *   runq_wait_ns        time runnable but waiting in a run queue: after a wakeup and after
 *                       a preemption (so runq_wait_ns >= offcpu_runnable_ns)
 * offcpu_runnable_ns + offcpu_blocked_ns is the total off-CPU time after the first switch
 * seen. The hot path only touches per-thread entries; a process's numbers are the sum of its
 * live threads plus the totals its exited threads left in the per-process map.
 */
#ifndef BPFDYNO_SCHED_H
#define BPFDYNO_SCHED_H

#include "common.h"

/* Run-queue latency histogram: slot bpfdyno_log2(ns) (see common.h). */
#define SCHED_HIST_SLOTS 64

enum sched_event_kind {
	SCHED_EV_EXEC = 1,
	SCHED_EV_EXIT = 2,
};

enum sched_error {
	SCHED_ERR_THREAD_FULL = 0, /* per-thread map full: a thread went unaccounted */
	SCHED_ERR_PROC_FULL = 1,   /* per-process map full: exited threads' time was lost */
	SCHED_ERR_RINGBUF = 2,     /* ring buffer full: an exec/exit event was dropped */
	SCHED_ERR_SLOTS = 4,
};

struct sched_hist {
	u64 slots[SCHED_HIST_SLOTS];
};

struct sched_errors {
	u64 count[SCHED_ERR_SLOTS]; /* indexed by enum sched_error */
};

struct sched_cpu_stats {
	u64 switches;       /* context switches on this CPU */
	u64 migrations;     /* task migrations performed on this CPU */
	u64 runq_count;     /* run-queue waits that ended on this CPU */
	u64 runq_sum_ns;    /* their total length */
	u64 oncpu_ns;       /* non-idle time: periods of threads that left this CPU */
	u64 offcpu_runnable_ns; /* off-CPU periods (see above) that ended on this CPU */
	u64 offcpu_blocked_ns;
	u64 _reserved;
};

/* Cumulative scheduler time of one thread, or of a process's exited threads. */
struct sched_times {
	u64 oncpu_ns;
	u64 offcpu_runnable_ns;
	u64 offcpu_blocked_ns;
	u64 runq_wait_ns;
	u64 switches;       /* times it left a CPU */
	u64 migrations;
};

/* Per-thread entry (hash by tid, evicted by the exit probe). */
struct sched_thread {
	struct sched_times t;
	u64 on_ts;          /* went on CPU at (0: not on CPU, or unknown) */
	u64 off_ts;         /* went off CPU at (0: on CPU, or unknown) */
	u64 wake_ts;        /* became runnable at (0: not waiting in a run queue) */
	u32 tgid;
	u32 off_blocked;    /* the current off-CPU period began with blocking */
};

struct sched_event {
	u64 ts_ns;          /* CLOCK_MONOTONIC (bpf_ktime_get_ns) */
	u32 kind;           /* enum sched_event_kind */
	u32 pid;            /* tgid */
	u32 tid;
	u32 ppid;           /* real parent's tgid */
	s32 exit_code;      /* exit: wait(2)-style status (code << 8 | signal) */
	u32 old_tid;        /* exec: the thread id before exec */
	u64 oncpu_ns;       /* exit: the process's total on-CPU time */
	u64 offcpu_ns;      /* exit: the process's total off-CPU time */
	char comm[16];
	char filename[128]; /* exec: the executed file */
};

_Static_assert(SCHED_HIST_SLOTS == BPFDYNO_LOG2_SLOTS, "one slot per log2 value");
_Static_assert(sizeof(struct sched_hist) == 8 * SCHED_HIST_SLOTS, "sched_hist layout");
_Static_assert(sizeof(struct sched_errors) == 8 * SCHED_ERR_SLOTS, "sched_errors layout");
_Static_assert(sizeof(struct sched_cpu_stats) == 64, "sched_cpu_stats layout");
_Static_assert(sizeof(struct sched_times) == 48, "sched_times layout");
_Static_assert(sizeof(struct sched_thread) == 80, "sched_thread layout");
_Static_assert(sizeof(struct sched_event) == 192, "sched_event layout");

#endif
