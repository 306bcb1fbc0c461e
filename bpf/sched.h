/* Structures shared by sched.bpf.c and its reader, bpfdyno.sources.sched.collector.
 *
 * Fixed-width fields spelled u64/u32/s32/s64 (bcc decodes ring-buffer events by these type
 * names), explicit padding, sizes checked at compile time. User space gets the layouts of
 * maps and events from bcc (it derives them from the compiled program) and unpacks
 * struct sched_task with the format in the collector (its size checked against this file by a
 * test); the collector reads the enum values and SCHED_HIST_SLOTS from this file.
 *
 * Per-thread times are the kernel's own books, read when asked (the task iterator) and when
 * a thread exits, never kept per switch (all ns, since the thread started):
 *   oncpu_ns      se.sum_exec_runtime: time on a CPU
 *   runq_wait_ns  sched_info.run_delay: time runnable, waiting in a run queue (after a
 *                 wakeup or a preemption)
 *   blocked_ns    the rest of its life: elapsed - oncpu_ns - runq_wait_ns (sleeping, I/O,
 *                 locks)
 * so oncpu_ns + runq_wait_ns + blocked_ns is the time since the thread started.
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
	SCHED_ERR_EXIT_FULL = 0, /* exited-thread map full: a thread's times were lost */
	SCHED_ERR_RINGBUF = 1,   /* ring buffer full: an exec/exit event was dropped */
	SCHED_ERR_MARK = 2,      /* no task storage for a thread's state (kernel memory short) */
	SCHED_ERR_SLOTS = 4,
};

/* Per-CPU counters, one map value per CPU. Times are rq clock (sched_clock) ns. */
struct sched_cpu {
	u64 switches;        /* context switches on this CPU */
	u64 migrations;      /* sched_migrate_task events on this CPU */
	u64 runq_count;      /* run-queue waits that ended on this CPU */
	u64 runq_sum_ns;     /* their total length */
	u64 busy_ns;         /* time non-idle tasks ran, up to this CPU's last switch */
	u64 last_switch_ns;  /* rq clock at this CPU's last switch */
	s64 ktime_offset_ns; /* CLOCK_MONOTONIC - rq clock, sampled every 1024 switches */
	u64 gen;             /* the bpfdyno_sgen value this CPU's last_switch_ns belongs to */
	u64 hist[SCHED_HIST_SLOTS]; /* run-queue waits by bpfdyno_log2(ns) */
};

/* One thread's books: a record of the task iterator, or the last ones of an exited thread. */
struct sched_task {
	u32 tid;
	u32 tgid;
	u64 oncpu_ns;
	u64 runq_wait_ns;
	u64 blocked_ns;
	u64 switches;      /* nvcsw + nivcsw: times it left a CPU */
	u64 migrations;    /* se.nr_migrations */
	u64 start_ns;      /* start_time: with tid, which thread this is (tids are reused) */
	char comm[16];     /* the process's (group leader's) comm */
};

/* Task-local state of a thread the iterator has seen (task storage, freed with the task). */
struct sched_mark {
	u64 blocked_ns;  /* the most blocked time reported for it: never report less */
};

struct sched_errors {
	u64 count[SCHED_ERR_SLOTS]; /* indexed by enum sched_error */
};

struct sched_event {
	u64 ts_ns;          /* CLOCK_MONOTONIC (bpf_ktime_get_ns) */
	u32 kind;           /* enum sched_event_kind */
	u32 pid;            /* tgid */
	u32 tid;
	u32 ppid;           /* real parent's tgid */
	s32 exit_code;      /* exit: wait(2)-style status (code << 8 | signal) */
	u32 old_tid;        /* exec: the thread id before exec */
	char comm[16];
	char filename[128]; /* exec: the executed file */
};

_Static_assert(SCHED_HIST_SLOTS == BPFDYNO_LOG2_SLOTS, "one slot per log2 value");
_Static_assert(sizeof(struct sched_cpu) == 64 + 8 * SCHED_HIST_SLOTS, "sched_cpu layout");
_Static_assert(sizeof(struct sched_task) == 72, "sched_task layout");
_Static_assert(sizeof(struct sched_errors) == 8 * SCHED_ERR_SLOTS, "sched_errors layout");
_Static_assert(sizeof(struct sched_event) == 176, "sched_event layout");

#endif
