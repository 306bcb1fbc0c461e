/* bpfdyno gloo peer wait: how long each process's threads wait for their peers in gloo.
 *
 * gloo (PyTorch's CPU backend) reads and writes its peer connections on its own loop thread,
 * without blocking, after epoll says a socket is ready; the threads that run a collective
 * wait in gloo::transport::tcp::UnboundBuffer::waitRecv until the loop thread has the peer's
 * bytes, and in UnboundBuffer::waitSend until their own bytes are sent, which gloo's TCP
 * transport does only once the peer has posted the matching receive (it has reached that
 * step of the collective). The time between either function's entry and its return is the
 * time the thread waited on a peer: which of the two a rank waits in depends on its place in
 * the collective's algorithm (with one rank late in a ring all-reduce, one of the others was
 * seen waiting almost wholly in waitSend), so both are timed, into one sum. Attached with a
 * uprobe and a uretprobe on each to the library that holds gloo (libtorch_cpu.so), only while
 * the detection watches ranks that map it (bpfdyno.sources.gloo); a thread is in one of them
 * at a time. A uprobe fires in every process that maps that file, so each call first checks
 * `bpfdyno_glpids`, the watched processes, whose value is what is added up.
 *
 * A wait still in progress is in `bpfdyno_glstart` with its process: the reader adds the time
 * since it began (bpf_ktime_get_ns is CLOCK_MONOTONIC), so a thread blocked for longer than
 * the detection's interval shows in every interval, not in a lump when it returns. The
 * return deletes the wait in progress *before* adding it to the total: a reader that reads
 * the totals first and the waits in progress after never counts one wait twice.
 *
 * Settings (-D), required; bpfdyno passes them from the [detection] config section:
 * GLOO_MAX_PROCS (gloo_max_ranks) sizes the process map, GLOO_MAX_THREADS
 * (gloo_max_threads) the map of waits in progress.
 *
 * Every function and map is named "bpfdyno_gl..." (15 characters at most).
 */
#include <uapi/linux/ptrace.h>
#include "common.h"

#if !defined(GLOO_MAX_PROCS) || !defined(GLOO_MAX_THREADS)
#error "GLOO_MAX_PROCS and GLOO_MAX_THREADS must be set with -D: load this program through bpfdyno's gloo source, which passes them from [detection]"
#endif

/* Per watched process: the total of its threads' finished waits, and how many. */
struct gloo_waits {
	u64 wait_ns;
	u64 calls;
};

/* A wait in progress: when it began, and whose thread waits. */
struct gloo_wait_start {
	u64 start_ns;
	u32 tgid;
	u32 pad;
};

BPF_HASH(bpfdyno_glpids, u32, struct gloo_waits, GLOO_MAX_PROCS);
/* Per thread waiting now (by thread id). */
BPF_HASH(bpfdyno_glstart, u32, struct gloo_wait_start, GLOO_MAX_THREADS);

int bpfdyno_gl_enter(struct pt_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;
	if (!bpfdyno_glpids.lookup(&tgid))
		return 0;
	u32 tid = (u32)id;
	struct gloo_wait_start start = {.start_ns = bpf_ktime_get_ns(), .tgid = tgid};
	bpfdyno_glstart.update(&tid, &start);
	return 0;
}

int bpfdyno_gl_leave(struct pt_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tid = (u32)id;
	struct gloo_wait_start *start = bpfdyno_glstart.lookup(&tid);
	if (!start)
		return 0;
	u64 waited = bpf_ktime_get_ns() - start->start_ns;
	bpfdyno_glstart.delete(&tid); /* before the add: see the top of the file */
	u32 tgid = id >> 32;
	struct gloo_waits *w = bpfdyno_glpids.lookup(&tgid);
	if (!w)
		return 0;
	__sync_fetch_and_add(&w->wait_ns, waited);
	__sync_fetch_and_add(&w->calls, 1);
	return 0;
}
