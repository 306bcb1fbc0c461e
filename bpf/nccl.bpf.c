/* bpfdyno NCCL capture: the NCCL API calls of the traced processes, with their arguments.
 *
 * Attached with uprobes (entry) and uretprobes (return) to the libnccl file a traced process
 * maps, only while a trace of such a process runs (bpfdyno.tracing.capture.nccl). A uprobe
 * fires in every process that maps that file, so each function first checks
 * `bpfdyno_nctgids`, the map of traced processes. Arguments are read from the registers (and,
 * past the sixth on x86-64, from the stack) at entry and kept per thread and function until
 * the return, which writes one record with both times and the result.
 *
 * The functions are the ones of nccl.h (NCCL 2.19 to 2.28): collectives, point-to-point and
 * group calls. Calls made while a group is open only enqueue work: their time is the host's
 * enqueue cost, the GPU work runs later on the stream.
 *
 * Settings (-D), required; bpfdyno passes them from the [capture] config section:
 * NCCL_MAX_PROCS (max_processes), NCCL_MAX_INFLIGHT (max_threads) size the maps,
 * NCCL_RINGBUF_PAGES (ringbuf_pages, a power of two) the ring buffer.
 *
 * Every function and map is named "bpfdyno_nc..." (15 characters at most).
 */
#include <uapi/linux/ptrace.h>
#include "common.h"
#include "nccl.h"

#if !defined(NCCL_MAX_PROCS) || !defined(NCCL_MAX_INFLIGHT) || !defined(NCCL_RINGBUF_PAGES)
#error "NCCL_MAX_PROCS, NCCL_MAX_INFLIGHT and NCCL_RINGBUF_PAGES must be set with -D: load this program through bpfdyno's trace capture, which passes them from [capture]"
#endif

BPF_PERCPU_ARRAY(bpfdyno_nctotal, u64, NCCL_C_MAX);
BPF_HASH(bpfdyno_nctgids, u32, struct nccl_proc, NCCL_MAX_PROCS);
BPF_HASH(bpfdyno_nccalls, struct nccl_key, struct nccl_call, NCCL_MAX_INFLIGHT);
BPF_RINGBUF_OUTPUT(bpfdyno_ncevent, NCCL_RINGBUF_PAGES);

static __always_inline void nccl_count(u32 idx)
{
	u64 *c = bpfdyno_nctotal.lookup(&idx);
	if (c)
		*c += 1;
}

/* The n-th argument passed on the stack (n = 1: the 7th parameter on x86-64, the 9th on
 * arm64). At a function's first instruction the stack pointer is at the return address. */
static __always_inline u64 nccl_stack_arg(struct pt_regs *ctx, int n)
{
	u64 v = 0;
	bpf_probe_read_user(&v, sizeof(v), (void *)(PT_REGS_SP(ctx) + 8 * n));
	return v;
}

/* Parameters 7 and 8: on the stack on x86-64, in x6/x7 on arm64. */
#if defined(bpf_target_arm64)
#define NCCL_PARM7(ctx) ((ctx)->regs[6])
#define NCCL_PARM8(ctx) ((ctx)->regs[7])
#else
#define NCCL_PARM7(ctx) nccl_stack_arg(ctx, 1)
#define NCCL_PARM8(ctx) nccl_stack_arg(ctx, 2)
#endif

static __always_inline int nccl_enter(u32 fn, u64 sendbuff, u64 recvbuff, u64 count, s32 datatype,
				      s32 op, s32 peer, u64 comm, u64 stream)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;
	if (!bpfdyno_nctgids.lookup(&tgid))
		return 0;
	struct nccl_key key = {};
	key.tid = (u32)id;
	key.fn = fn;
	struct nccl_call c = {};
	c.start_ns = bpf_ktime_get_ns();
	c.count = count;
	c.comm = comm;
	c.stream = stream;
	c.sendbuff = sendbuff;
	c.recvbuff = recvbuff;
	c.tgid = tgid;
	c.tid = (u32)id;
	c.fn = fn;
	c.datatype = datatype;
	c.op = op;
	c.peer = peer;
	c.ret = -1;
	if (bpfdyno_nccalls.update(&key, &c))
		nccl_count(NCCL_C_INFLIGHT_FULL);
	return 0;
}

static __always_inline int nccl_leave(struct pt_regs *ctx, u32 fn)
{
	u64 id = bpf_get_current_pid_tgid();
	struct nccl_key key = {};
	key.tid = (u32)id;
	key.fn = fn;
	struct nccl_call *c = bpfdyno_nccalls.lookup(&key);
	if (!c)
		return 0;
	u32 tgid = id >> 32;
	struct nccl_proc *p = bpfdyno_nctgids.lookup(&tgid);
	if (p) {
		struct nccl_call *e = bpfdyno_ncevent.ringbuf_reserve(sizeof(struct nccl_call));
		if (e) {
			__builtin_memcpy(e, c, sizeof(struct nccl_call));
			e->end_ns = bpf_ktime_get_ns();
			e->ret = (s32)PT_REGS_RC(ctx);
			bpfdyno_ncevent.ringbuf_submit(e, BPFDYNO_RB_NO_WAKEUP);
			__sync_fetch_and_add(&p->calls, 1);
		} else {
			nccl_count(NCCL_C_LOST);
			__sync_fetch_and_add(&p->lost, 1);
		}
	}
	bpfdyno_nccalls.delete(&key);
	return 0;
}

#define NCCL_RETURN(name, FN)                                                                 \
	int name(struct pt_regs *ctx)                                                         \
	{                                                                                     \
		return nccl_leave(ctx, FN);                                                   \
	}

/* ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream) */
int bpfdyno_nc_ar(struct pt_regs *ctx)
{
	return nccl_enter(NCCL_FN_ALL_REDUCE, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx),
			  PT_REGS_PARM3(ctx), (s32)PT_REGS_PARM4(ctx), (s32)PT_REGS_PARM5(ctx), -1,
			  PT_REGS_PARM6(ctx), NCCL_PARM7(ctx));
}
NCCL_RETURN(bpfdyno_nc_ar_r, NCCL_FN_ALL_REDUCE)

/* ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream) */
int bpfdyno_nc_bc(struct pt_regs *ctx)
{
	return nccl_enter(NCCL_FN_BROADCAST, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx),
			  PT_REGS_PARM3(ctx), (s32)PT_REGS_PARM4(ctx), -1, (s32)PT_REGS_PARM5(ctx),
			  PT_REGS_PARM6(ctx), NCCL_PARM7(ctx));
}
NCCL_RETURN(bpfdyno_nc_bc_r, NCCL_FN_BROADCAST)

/* ncclBcast(buff, count, datatype, root, comm, stream) */
int bpfdyno_nc_bx(struct pt_regs *ctx)
{
	return nccl_enter(NCCL_FN_BCAST, PT_REGS_PARM1(ctx), PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx),
			  (s32)PT_REGS_PARM3(ctx), -1, (s32)PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx),
			  PT_REGS_PARM6(ctx));
}
NCCL_RETURN(bpfdyno_nc_bx_r, NCCL_FN_BCAST)

/* ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream) */
int bpfdyno_nc_rd(struct pt_regs *ctx)
{
	return nccl_enter(NCCL_FN_REDUCE, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx),
			  PT_REGS_PARM3(ctx), (s32)PT_REGS_PARM4(ctx), (s32)PT_REGS_PARM5(ctx),
			  (s32)PT_REGS_PARM6(ctx), NCCL_PARM7(ctx), NCCL_PARM8(ctx));
}
NCCL_RETURN(bpfdyno_nc_rd_r, NCCL_FN_REDUCE)

/* ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream) */
int bpfdyno_nc_ag(struct pt_regs *ctx)
{
	return nccl_enter(NCCL_FN_ALL_GATHER, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx),
			  PT_REGS_PARM3(ctx), (s32)PT_REGS_PARM4(ctx), -1, -1, PT_REGS_PARM5(ctx),
			  PT_REGS_PARM6(ctx));
}
NCCL_RETURN(bpfdyno_nc_ag_r, NCCL_FN_ALL_GATHER)

/* ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream) */
int bpfdyno_nc_rs(struct pt_regs *ctx)
{
	return nccl_enter(NCCL_FN_REDUCE_SCATTER, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx),
			  PT_REGS_PARM3(ctx), (s32)PT_REGS_PARM4(ctx), (s32)PT_REGS_PARM5(ctx), -1,
			  PT_REGS_PARM6(ctx), NCCL_PARM7(ctx));
}
NCCL_RETURN(bpfdyno_nc_rs_r, NCCL_FN_REDUCE_SCATTER)

/* ncclSend(sendbuff, count, datatype, peer, comm, stream) */
int bpfdyno_nc_sd(struct pt_regs *ctx)
{
	return nccl_enter(NCCL_FN_SEND, PT_REGS_PARM1(ctx), 0, PT_REGS_PARM2(ctx),
			  (s32)PT_REGS_PARM3(ctx), -1, (s32)PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx),
			  PT_REGS_PARM6(ctx));
}
NCCL_RETURN(bpfdyno_nc_sd_r, NCCL_FN_SEND)

/* ncclRecv(recvbuff, count, datatype, peer, comm, stream) */
int bpfdyno_nc_rv(struct pt_regs *ctx)
{
	return nccl_enter(NCCL_FN_RECV, 0, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx),
			  (s32)PT_REGS_PARM3(ctx), -1, (s32)PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx),
			  PT_REGS_PARM6(ctx));
}
NCCL_RETURN(bpfdyno_nc_rv_r, NCCL_FN_RECV)

/* ncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream) */
int bpfdyno_nc_aa(struct pt_regs *ctx)
{
	return nccl_enter(NCCL_FN_ALL_TO_ALL, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx),
			  PT_REGS_PARM3(ctx), (s32)PT_REGS_PARM4(ctx), -1, -1, PT_REGS_PARM5(ctx),
			  PT_REGS_PARM6(ctx));
}
NCCL_RETURN(bpfdyno_nc_aa_r, NCCL_FN_ALL_TO_ALL)

/* ncclGather(sendbuff, recvbuff, count, datatype, root, comm, stream) */
int bpfdyno_nc_ga(struct pt_regs *ctx)
{
	return nccl_enter(NCCL_FN_GATHER, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx),
			  PT_REGS_PARM3(ctx), (s32)PT_REGS_PARM4(ctx), -1, (s32)PT_REGS_PARM5(ctx),
			  PT_REGS_PARM6(ctx), NCCL_PARM7(ctx));
}
NCCL_RETURN(bpfdyno_nc_ga_r, NCCL_FN_GATHER)

/* ncclScatter(sendbuff, recvbuff, count, datatype, root, comm, stream) */
int bpfdyno_nc_sc(struct pt_regs *ctx)
{
	return nccl_enter(NCCL_FN_SCATTER, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx),
			  PT_REGS_PARM3(ctx), (s32)PT_REGS_PARM4(ctx), -1, (s32)PT_REGS_PARM5(ctx),
			  PT_REGS_PARM6(ctx), NCCL_PARM7(ctx));
}
NCCL_RETURN(bpfdyno_nc_sc_r, NCCL_FN_SCATTER)

/* ncclGroupStart(void), ncclGroupEnd(void) */
int bpfdyno_nc_gs(struct pt_regs *ctx)
{
	return nccl_enter(NCCL_FN_GROUP_START, 0, 0, 0, -1, -1, -1, 0, 0);
}
NCCL_RETURN(bpfdyno_nc_gs_r, NCCL_FN_GROUP_START)

int bpfdyno_nc_ge(struct pt_regs *ctx)
{
	return nccl_enter(NCCL_FN_GROUP_END, 0, 0, 0, -1, -1, -1, 0, 0);
}
NCCL_RETURN(bpfdyno_nc_ge_r, NCCL_FN_GROUP_END)
