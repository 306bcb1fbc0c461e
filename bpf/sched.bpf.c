/* Scheduler telemetry: context switches, run-queue latency, per-thread on-CPU, run-queue
 * wait and blocked time, migrations, exec/exit events.
 *
 * The kernel already keeps the books of every thread (se.sum_exec_runtime,
 * sched_info.run_delay, nvcsw/nivcsw, se.nr_migrations), so nothing here timestamps
 * switches per thread: the task iterator (bpfdyno_tasks) reads those books for every live
 * thread when user space asks (once per collection), and the exit program keeps the last
 * books of each thread that exits until user space has read them.
 *
 * The exit program runs once per thread exit, so under thread churn it is paid thousands
 * of times a second: it allocates nothing. It does not mark the exiting thread (creating
 * task storage for a thread the iterator never saw cost ~950 ns an exit); a thread between
 * its exit record and its removal from the task list (exit_notify(), when exit_state is
 * set) is still walked, and user space drops the walk's books of any thread whose last
 * books it already has, by (tid, start_ns): see bpfdyno.sources.sched.collector.
 *
 * The one hot path, bpfdyno_switch, does no map lookup by key, no clock read and no helper
 * call: when sched_switch fires, the kernel has just updated the run queue's clock and has
 * not yet consumed next's sched_info.last_queued (sched_info_arrive() runs later, in
 * prepare_task_switch()), so rq->clock - next->sched_info.last_queued is exactly the wait
 * the kernel is about to add to next's run_delay (verified on 6.18: the sums agree to the
 * nanosecond; see docs/performance.md). It also counts switches, and the time non-idle
 * tasks ran, per CPU.
 *
 * All programs are BTF-typed (tp_btf, iter/task), loaded by bpfdyno.ebpf.btfprog: their
 * arguments are trusted kernel pointers read with plain loads (BPFDYNO_LOAD), and the
 * iterator keeps a little state per thread it has seen in task-local storage.
 * Needs Linux >= 5.11, BTF, and CONFIG_FAIR_GROUP_SCHED (the run queue is found through the
 * task's cfs_rq).
 *
 * Settings (-D, all required; bpfdyno passes them from the [sched] config section):
 * SCHED_EXIT_PAGES (from [sched] max_exits, a power of two) sizes the ring buffer of exited
 * threads' last books, SCHED_RINGBUF_PAGES ([sched] ringbuf_pages, a power of two) the
 * event ring buffer.
 *
 * Every function and map is named "bpfdyno_..." so `bpftool` shows whose they are (the
 * kernel keeps 15 characters of a name: keep map names that short).
 */
#include <linux/sched.h>
#include "common.h"
#include "sched.h"

#if !defined(SCHED_EXIT_PAGES) || !defined(SCHED_RINGBUF_PAGES)
#error "SCHED_EXIT_PAGES and SCHED_RINGBUF_PAGES must be set with -D: load this program through bpfdyno's sched collector, which passes them from [sched]"
#endif
#ifndef CONFIG_FAIR_GROUP_SCHED
#error "the scheduler programs need a kernel built with CONFIG_FAIR_GROUP_SCHED (they find a task's run queue through its cfs_rq)"
#endif

/* Refresh a CPU's CLOCK_MONOTONIC - rq clock offset every this many switches. */
#define SCHED_OFFSET_EVERY 1024

BPF_PERCPU_ARRAY(bpfdyno_scpu, struct sched_cpu, 1);
/* Bumped by user space before bpfdyno_switch is attached again after a gap (the overhead
 * budget samples it in time): a CPU then starts its busy time afresh instead of counting the
 * whole gap as the time its previous task ran. */
BPF_ARRAY(bpfdyno_sgen, u64, 1);
BPF_PERCPU_ARRAY(bpfdyno_serrors, struct sched_errors, 1);
/* Last books of exited threads, in exit order, drained by user space every collection.
 * Sized for the slow cadence of an agent nobody reads (seconds of thread churn between two
 * rounds); a full one is counted (SCHED_ERR_EXIT_FULL). A ring buffer: an exit reserves
 * and commits a record, where a hash map's update cost ~900 ns (not preallocated: an
 * allocation per exit) or ~400 ns (preallocated: its bucket lock and free list), and a
 * hash keyed by tid lost a thread whose tid was reused before the drain (pid_max 32768
 * comes round in seconds of churn). User space maps only the records waiting, per drain. */
BPF_RINGBUF_OUTPUT(bpfdyno_sexit, SCHED_EXIT_PAGES);
BPF_TASK_STORAGE(bpfdyno_smark, struct sched_mark);
BPF_RINGBUF_OUTPUT(bpfdyno_sevents, SCHED_RINGBUF_PAGES);

static __always_inline void count_error(u32 slot)
{
	u32 zero = 0;
	struct sched_errors *e = bpfdyno_serrors.lookup(&zero);
	if (e && slot < SCHED_ERR_SLOTS)
		e->count[slot]++;
}

static __always_inline struct rq *task_rq_of(struct task_struct *p)
{
	struct cfs_rq *cfs = BPFDYNO_LOAD(struct cfs_rq *, p, struct task_struct, se.cfs_rq);
	return BPFDYNO_LOAD(struct rq *, cfs, struct cfs_rq, rq);
}

int bpfdyno_switch(u64 *ctx)
{
	/* TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next,
	 *          unsigned int prev_state) */
	struct task_struct *prev = (struct task_struct *)ctx[1];
	struct task_struct *next = (struct task_struct *)ctx[2];
	u32 zero = 0;
	struct sched_cpu *cs = bpfdyno_scpu.lookup(&zero);
	if (!cs)
		return 0;
	u64 now = BPFDYNO_LOAD(u64, task_rq_of(next), struct rq, clock);
	if (!now)
		return 0;
	u64 *gen = bpfdyno_sgen.lookup(&zero);
	if (gen && cs->gen != *gen) { /* attached again after a gap: the last switch is stale */
		cs->gen = *gen;
		cs->last_switch_ns = 0;
	}
	/* prev has run since this CPU's previous switch. */
	if (BPFDYNO_LOAD(int, prev, struct task_struct, pid) && cs->last_switch_ns)
		cs->busy_ns += now - cs->last_switch_ns;
	cs->last_switch_ns = now;
	if (cs->switches++ % SCHED_OFFSET_EVERY == 0)
		cs->ktime_offset_ns = (s64)(bpf_ktime_get_ns() - now);
	u64 queued = BPFDYNO_LOAD(u64, next, struct task_struct, sched_info.last_queued);
	if (queued && now > queued) {
		u64 wait = now - queued;
		cs->runq_count++;
		cs->runq_sum_ns += wait;
		cs->hist[bpfdyno_log2(wait) & (SCHED_HIST_SLOTS - 1)]++;
	}
	return 0;
}

int bpfdyno_migrate(u64 *ctx)
{
	u32 zero = 0;
	struct sched_cpu *cs = bpfdyno_scpu.lookup(&zero);
	if (cs)
		cs->migrations++;
	return 0;
}

/* The books of thread p as of now (CLOCK_MONOTONIC ns).
 *
 * The kernel completes a running thread's on-CPU time and a queued thread's wait only when
 * its run queue's clock is updated (at switches and ticks). So a thread running elsewhere, or
 * queued, is reported as of its run queue's clock: its pending parts up to that clock, and
 * its elapsed time up to that same instant (the clock converted with this CPU's offset to
 * CLOCK_MONOTONIC); the three parts add up to its age however stale that clock is. The
 * thread running here (the exiting one, or the reader) is brought up to now: its clock has
 * moved since the last update by as much as CLOCK_MONOTONIC has.
 *
 * The offset is sampled with a few microseconds of jitter, so the blocked time reported is
 * kept from going back by the thread's state in task storage (mark; NULL for a thread the
 * iterator never saw, or when the kernel had no memory for it: nothing was reported for
 * it, or nothing can be kept). */
static __always_inline void thread_books(struct task_struct *p, u64 now, struct sched_mark *mark,
					 struct sched_task *out)
{
	u64 oncpu = BPFDYNO_LOAD(u64, p, struct task_struct, se.sum_exec_runtime);
	u64 wait = BPFDYNO_LOAD(u64, p, struct task_struct, sched_info.run_delay);
	u64 queued = BPFDYNO_LOAD(u64, p, struct task_struct, sched_info.last_queued);
	int on_cpu = BPFDYNO_LOAD(int, p, struct task_struct, on_cpu);
	u64 at = now;
	if (on_cpu || queued) {
		u32 zero = 0;
		struct sched_cpu *cs = bpfdyno_scpu.lookup(&zero);
		s64 offset = cs ? cs->ktime_offset_ns : 0;
		struct rq *rq = task_rq_of(p);
		u64 clock = BPFDYNO_LOAD(u64, rq, struct rq, clock);
		u64 clock_task = BPFDYNO_LOAD(u64, rq, struct rq, clock_task);
		if ((u64)p == bpf_get_current_task() && offset && clock && now - offset > clock) {
			u64 ahead = now - offset - clock;
			clock += ahead;
			clock_task += ahead;
		}
		if (on_cpu) {
			u64 exec_start = BPFDYNO_LOAD(u64, p, struct task_struct, se.exec_start);
			if (clock_task > exec_start)
				oncpu += clock_task - exec_start;
		}
		if (queued && clock > queued)
			wait += clock - queued;
		if (offset && clock)
			at = clock + offset;
	}
	u64 start = BPFDYNO_LOAD(u64, p, struct task_struct, start_time);
	u64 elapsed = at > start ? at - start : 0;
	out->tid = BPFDYNO_LOAD(u32, p, struct task_struct, pid);
	out->tgid = BPFDYNO_LOAD(u32, p, struct task_struct, tgid);
	out->oncpu_ns = oncpu;
	out->runq_wait_ns = wait;
	u64 blocked = elapsed > oncpu + wait ? elapsed - oncpu - wait : 0;
	if (mark) {
		if (blocked < mark->blocked_ns)
			blocked = mark->blocked_ns;
		else
			mark->blocked_ns = blocked;
	}
	out->blocked_ns = blocked;
	out->switches = BPFDYNO_LOAD(unsigned long, p, struct task_struct, nvcsw) +
			BPFDYNO_LOAD(unsigned long, p, struct task_struct, nivcsw);
	out->migrations = BPFDYNO_LOAD(u64, p, struct task_struct, se.nr_migrations);
	out->start_ns = start;
	struct task_struct *leader =
		BPFDYNO_LOAD(struct task_struct *, p, struct task_struct, group_leader);
	bpf_probe_read_kernel(&out->comm, sizeof(out->comm),
			      BPFDYNO_FIELD(leader, struct task_struct, comm));
}

int bpfdyno_tasks(struct bpf_iter__task *ctx)
{
	struct seq_file *seq = ctx->meta->seq;
	struct task_struct *task = ctx->task;
	if (!task)
		return 0;
	/* Past exit_notify(): its last books are (or were) in bpfdyno_sexit, or its exit was
	 * not recorded (it died before the programs were loaded, or while the exit program was
	 * detached). A thread between its exit record and exit_notify() is still walked:
	 * user space knows it by its record. */
	if (BPFDYNO_LOAD(int, task, struct task_struct, exit_state))
		return 0;
	struct sched_mark *m =
		bpfdyno_smark.task_storage_get(task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!m)
		count_error(SCHED_ERR_MARK);
	struct sched_task rec = {};
	thread_books(task, bpf_ktime_get_ns(), m, &rec);
	bpf_seq_write(seq, &rec, sizeof(rec));
	return 0;
}

static __always_inline struct sched_event *new_event(struct task_struct *p, u32 kind)
{
	struct sched_event *e = bpfdyno_sevents.ringbuf_reserve(sizeof(struct sched_event));
	if (!e) {
		count_error(SCHED_ERR_RINGBUF);
		return NULL;
	}
	struct task_struct *parent =
		BPFDYNO_LOAD(struct task_struct *, p, struct task_struct, real_parent);
	e->ts_ns = bpf_ktime_get_ns();
	e->kind = kind;
	e->pid = BPFDYNO_LOAD(u32, p, struct task_struct, tgid);
	e->tid = BPFDYNO_LOAD(u32, p, struct task_struct, pid);
	e->ppid = BPFDYNO_LOAD(u32, parent, struct task_struct, tgid);
	e->exit_code = 0;
	e->old_tid = 0;
	e->filename[0] = 0;
	bpf_probe_read_kernel(&e->comm, sizeof(e->comm), BPFDYNO_FIELD(p, struct task_struct, comm));
	return e;
}

int bpfdyno_exec(u64 *ctx)
{
	/* TP_PROTO(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm) */
	struct task_struct *p = (struct task_struct *)ctx[0];
	struct linux_binprm *bprm = (struct linux_binprm *)ctx[2];
	struct sched_event *e = new_event(p, SCHED_EV_EXEC);
	if (!e)
		return 0;
	e->old_tid = (u32)ctx[1];
	const char *filename = BPFDYNO_LOAD(const char *, bprm, struct linux_binprm, filename);
	bpf_probe_read_kernel_str(&e->filename, sizeof(e->filename), filename);
	bpfdyno_sevents.ringbuf_submit(e, BPFDYNO_RB_NO_WAKEUP);
	return 0;
}

int bpfdyno_exit(u64 *ctx)
{
	/* TP_PROTO(struct task_struct *p[, bool group_dead]), for every exiting thread: keep
	 * its last books for user space. Its mark only if the iterator made one (never
	 * created here: see the top of this file). */
	struct task_struct *p = (struct task_struct *)ctx[0];
	struct sched_task *rec = bpfdyno_sexit.ringbuf_reserve(sizeof(struct sched_task));
	if (rec) {
		struct sched_mark *m = bpfdyno_smark.task_storage_get(p, 0, 0);
		thread_books(p, bpf_ktime_get_ns(), m, rec);
		bpfdyno_sexit.ringbuf_submit(rec, BPFDYNO_RB_NO_WAKEUP);
	} else {
		count_error(SCHED_ERR_EXIT_FULL);
	}
	/* The process is gone when its last thread exits (signal->live reached 0, the
	 * kernel's "group_dead"). */
	struct signal_struct *sig =
		BPFDYNO_LOAD(struct signal_struct *, p, struct task_struct, signal);
	int live = 1;
	bpf_probe_read_kernel(&live, sizeof(live), BPFDYNO_FIELD(sig, struct signal_struct, live));
	if (live != 0)
		return 0;
	struct sched_event *e = new_event(p, SCHED_EV_EXIT);
	if (e) {
		e->exit_code = BPFDYNO_LOAD(s32, p, struct task_struct, exit_code);
		bpfdyno_sevents.ringbuf_submit(e, BPFDYNO_RB_NO_WAKEUP);
	}
	return 0;
}
