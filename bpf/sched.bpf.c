/* Scheduler telemetry: context switches, run-queue latency, per-thread/process on- and
 * off-CPU time, migrations, exec/exit events.
 *
 * Raw tracepoints (no perf-event attach cost) reading task_struct, so this needs the "btf"
 * kernel-header flavour. Everything is aggregated in maps; user space reads cumulative values
 * and computes deltas. Only exec/exit go through the ring buffer.
 *
 * The sched_switch path is kept to one clock read and two hash lookups (prev and next
 * thread): per-process sums are built in user space, not here.
 *
 * Settings (-D, all required; bpfdyno passes them from the [sched] config section):
 * SCHED_MAX_THREADS ([sched] max_threads) and SCHED_MAX_PROCS ([sched] max_procs) size the
 * maps, SCHED_RINGBUF_PAGES ([sched] ringbuf_pages, a power of two) the ring buffer.
 *
 * Every function and map is named "bpfdyno_..." so `bpftool` shows whose they are (the
 * kernel keeps 15 characters of a name: keep map names that short).
 */
#include <linux/sched.h>
#include "common.h"
#include "sched.h"

#if !defined(SCHED_MAX_THREADS) || !defined(SCHED_MAX_PROCS) || !defined(SCHED_RINGBUF_PAGES)
#error "SCHED_MAX_THREADS, SCHED_MAX_PROCS and SCHED_RINGBUF_PAGES must be set with -D: load this program through bpfdyno's sched collector, which passes them from [sched]"
#endif

#define SCHED_PF_EXITING 0x00000004

BPF_PERCPU_ARRAY(bpfdyno_scpu, struct sched_cpu_stats, 1);
/* One entry each, so user space reads all CPUs' slots with one lookup. */
BPF_PERCPU_ARRAY(bpfdyno_shist, struct sched_hist, 1);
BPF_PERCPU_ARRAY(bpfdyno_serrors, struct sched_errors, 1);
/* Task-local storage would be cheaper, but raw tracepoint arguments are untrusted scalars
 * that the verifier refuses for bpf_task_storage_get. */
BPF_HASH(bpfdyno_sthread, u32, struct sched_thread, SCHED_MAX_THREADS);
/* Times of a process's exited threads, until the process exits. */
BPF_HASH(bpfdyno_sprocs, u32, struct sched_times, SCHED_MAX_PROCS);
BPF_RINGBUF_OUTPUT(bpfdyno_sevents, SCHED_RINGBUF_PAGES);

static __always_inline void count_error(u32 slot)
{
	u32 zero = 0;
	struct sched_errors *e = bpfdyno_serrors.lookup(&zero);
	if (e && slot < SCHED_ERR_SLOTS)
		e->count[slot]++;
}

/* Create the entry of thread tid (slow path: once per thread). Exiting threads get none:
 * the exit probe has just evicted theirs. */
static __always_inline struct sched_thread *new_thread(struct task_struct *t, u32 tid, u32 tgid)
{
	u32 flags = 0;
	bpf_probe_read_kernel(&flags, sizeof(flags), &t->flags);
	if (flags & SCHED_PF_EXITING)
		return NULL;
	struct sched_thread init = {};
	init.tgid = tgid;
	if (!tgid)
		bpf_probe_read_kernel(&init.tgid, sizeof(init.tgid), &t->tgid);
	int err = bpfdyno_sthread.insert(&tid, &init);
	if (err && err != -BPFDYNO_EEXIST) {
		count_error(SCHED_ERR_THREAD_FULL);
		return NULL;
	}
	return bpfdyno_sthread.lookup(&tid);
}

static __always_inline void switch_out(u64 now, bool runnable, struct sched_cpu_stats *cs)
{
	/* prev is current: no task_struct read needed for its ids. */
	u64 id = bpf_get_current_pid_tgid();
	u32 tid = (u32)id;
	if (!tid) /* the idle task */
		return;
	struct sched_thread *th = bpfdyno_sthread.lookup(&tid);
	if (!th) {
		th = new_thread((struct task_struct *)bpf_get_current_task(), tid, id >> 32);
		if (!th)
			return;
	}
	if (th->on_ts) {
		u64 oncpu = now - th->on_ts;
		th->t.oncpu_ns += oncpu;
		if (cs)
			cs->oncpu_ns += oncpu;
	}
	th->t.switches++;
	th->on_ts = 0;
	th->off_ts = now;
	th->off_blocked = !runnable;
	th->wake_ts = runnable ? now : 0;
}

static __always_inline void switch_in(u64 now, struct task_struct *next,
				      struct sched_cpu_stats *cs)
{
	u32 tid = 0;
	bpf_probe_read_kernel(&tid, sizeof(tid), &next->pid);
	if (!tid)
		return;
	struct sched_thread *th = bpfdyno_sthread.lookup(&tid);
	if (!th) {
		th = new_thread(next, tid, 0);
		if (!th)
			return;
	}
	if (th->off_ts) {
		u64 off = now - th->off_ts;
		if (th->off_blocked) {
			th->t.offcpu_blocked_ns += off;
			if (cs)
				cs->offcpu_blocked_ns += off;
		} else {
			th->t.offcpu_runnable_ns += off;
			if (cs)
				cs->offcpu_runnable_ns += off;
		}
	}
	if (th->wake_ts) {
		u64 wait = now - th->wake_ts;
		th->t.runq_wait_ns += wait;
		u32 zero = 0, slot = bpfdyno_log2(wait);
		struct sched_hist *hist = bpfdyno_shist.lookup(&zero);
		if (hist && slot < SCHED_HIST_SLOTS)
			hist->slots[slot]++;
		if (cs) {
			cs->runq_count++;
			cs->runq_sum_ns += wait;
		}
	}
	th->on_ts = now;
	th->off_ts = 0;
	th->wake_ts = 0;
}

int bpfdyno_switch(struct bpf_raw_tracepoint_args *ctx)
{
	/* TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next,
	 *          unsigned int prev_state) since 5.18 */
	bool preempt = (bool)ctx->args[0];
#if LINUX_VERSION_CODE >= KERNEL_VERSION(5, 18, 0)
	u32 prev_state = (u32)ctx->args[3];
#else
	u32 prev_state = 0;
	bpf_probe_read_kernel(&prev_state, sizeof(prev_state),
			      &((struct task_struct *)ctx->args[1])->__state);
#endif
	u64 now = bpf_ktime_get_ns();
	u32 zero = 0;
	struct sched_cpu_stats *cs = bpfdyno_scpu.lookup(&zero);
	if (cs)
		cs->switches++;
	/* Preempted, or yielded while runnable: it waits in the run queue. */
	switch_out(now, preempt || prev_state == TASK_RUNNING, cs);
	switch_in(now, (struct task_struct *)ctx->args[2], cs);
	return 0;
}

static __always_inline int on_wakeup(struct task_struct *p)
{
	u32 tid = 0;
	bpf_probe_read_kernel(&tid, sizeof(tid), &p->pid);
	struct sched_thread *th = bpfdyno_sthread.lookup(&tid);
	if (!th) {
		th = new_thread(p, tid, 0);
		if (!th)
			return 0;
	}
	/* Keep the earliest time: waking an already runnable thread changes nothing. */
	if (!th->wake_ts)
		th->wake_ts = bpf_ktime_get_ns();
	return 0;
}

int bpfdyno_wakeup(struct bpf_raw_tracepoint_args *ctx)
{
	return on_wakeup((struct task_struct *)ctx->args[0]);
}

int bpfdyno_wakenew(struct bpf_raw_tracepoint_args *ctx)
{
	return on_wakeup((struct task_struct *)ctx->args[0]);
}

int bpfdyno_migrate(struct bpf_raw_tracepoint_args *ctx)
{
	struct task_struct *p = (struct task_struct *)ctx->args[0];
	u32 zero = 0, tid = 0;
	struct sched_cpu_stats *cs = bpfdyno_scpu.lookup(&zero);
	if (cs)
		cs->migrations++;
	bpf_probe_read_kernel(&tid, sizeof(tid), &p->pid);
	struct sched_thread *th = bpfdyno_sthread.lookup(&tid);
	if (th)
		__sync_fetch_and_add(&th->t.migrations, 1);
	return 0;
}

static __always_inline struct sched_event *new_event(struct task_struct *p, u32 kind)
{
	struct sched_event *e = bpfdyno_sevents.ringbuf_reserve(sizeof(struct sched_event));
	if (!e) {
		count_error(SCHED_ERR_RINGBUF);
		return NULL;
	}
	struct task_struct *parent = NULL;
	e->ts_ns = bpf_ktime_get_ns();
	e->kind = kind;
	e->pid = 0;
	e->tid = 0;
	e->ppid = 0;
	e->exit_code = 0;
	e->old_tid = 0;
	e->oncpu_ns = 0;
	e->offcpu_ns = 0;
	e->filename[0] = 0;
	bpf_probe_read_kernel(&e->pid, sizeof(e->pid), &p->tgid);
	bpf_probe_read_kernel(&e->tid, sizeof(e->tid), &p->pid);
	bpf_probe_read_kernel(&parent, sizeof(parent), &p->real_parent);
	bpf_probe_read_kernel(&e->ppid, sizeof(e->ppid), &parent->tgid);
	bpf_probe_read_kernel(&e->comm, sizeof(e->comm), &p->comm);
	return e;
}

int bpfdyno_exec(struct bpf_raw_tracepoint_args *ctx)
{
	/* TP_PROTO(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm) */
	struct task_struct *p = (struct task_struct *)ctx->args[0];
	struct linux_binprm *bprm = (struct linux_binprm *)ctx->args[2];
	struct sched_event *e = new_event(p, SCHED_EV_EXEC);
	if (!e)
		return 0;
	const char *filename = NULL;
	e->old_tid = (u32)ctx->args[1];
	bpf_probe_read_kernel(&filename, sizeof(filename), &bprm->filename);
	bpf_probe_read_kernel_str(&e->filename, sizeof(e->filename), filename);
	bpfdyno_sevents.ringbuf_submit(e, BPFDYNO_RB_NO_WAKEUP);
	return 0;
}

static __always_inline void add_times(struct sched_times *dst, struct sched_times *src)
{
	__sync_fetch_and_add(&dst->oncpu_ns, src->oncpu_ns);
	__sync_fetch_and_add(&dst->offcpu_runnable_ns, src->offcpu_runnable_ns);
	__sync_fetch_and_add(&dst->offcpu_blocked_ns, src->offcpu_blocked_ns);
	__sync_fetch_and_add(&dst->runq_wait_ns, src->runq_wait_ns);
	__sync_fetch_and_add(&dst->switches, src->switches);
	__sync_fetch_and_add(&dst->migrations, src->migrations);
}

int bpfdyno_exit(struct bpf_raw_tracepoint_args *ctx)
{
	/* Fires for every exiting thread: fold its times into its process's entry and evict
	 * it. The process is gone when its last thread exits (signal->live reached 0, the
	 * kernel's "group_dead"): report its totals and evict the process entry too, so the
	 * maps stay bounded under churn. */
	struct task_struct *p = (struct task_struct *)ctx->args[0];
	u32 tid = 0, tgid = 0;
	bpf_probe_read_kernel(&tid, sizeof(tid), &p->pid);
	bpf_probe_read_kernel(&tgid, sizeof(tgid), &p->tgid);
	struct sched_times zero = {};
	struct sched_times *pt = bpfdyno_sprocs.lookup(&tgid);
	if (!pt) {
		int err = bpfdyno_sprocs.insert(&tgid, &zero);
		if (err && err != -BPFDYNO_EEXIST)
			count_error(SCHED_ERR_PROC_FULL);
		pt = bpfdyno_sprocs.lookup(&tgid);
	}
	struct sched_thread *th = bpfdyno_sthread.lookup(&tid);
	if (th && pt) {
		/* The exiting thread is running: count its current period too. */
		if (th->on_ts)
			th->t.oncpu_ns += bpf_ktime_get_ns() - th->on_ts;
		add_times(pt, &th->t);
	}
	bpfdyno_sthread.delete(&tid);

	struct signal_struct *sig = NULL;
	int live = 1;
	bpf_probe_read_kernel(&sig, sizeof(sig), &p->signal);
	bpf_probe_read_kernel(&live, sizeof(live), &sig->live.counter);
	if (live != 0)
		return 0;
	struct sched_event *e = new_event(p, SCHED_EV_EXIT);
	if (e) {
		if (pt) {
			e->oncpu_ns = pt->oncpu_ns;
			e->offcpu_ns = pt->offcpu_runnable_ns + pt->offcpu_blocked_ns;
		}
		bpf_probe_read_kernel(&e->exit_code, sizeof(e->exit_code), &p->exit_code);
		bpfdyno_sevents.ringbuf_submit(e, BPFDYNO_RB_NO_WAKEUP);
	}
	bpfdyno_sprocs.delete(&tgid);
	return 0;
}
