/* Types shared by nccl.bpf.c and its reader (bpfdyno.tracing.capture.nccl).
 *
 * nccl.bpf.c is attached with uprobes and uretprobes to the libnccl of a traced process for
 * the trace window; it records each call of the NCCL API functions below with the arguments
 * the caller passed and what the call returned. The Python side reads `enum nccl_fn` from
 * this file and lets bcc derive the record layout from the compiled program.
 */
#ifndef BPFDYNO_NCCL_H
#define BPFDYNO_NCCL_H

/* The probed functions (their NCCL names are in bpfdyno.tracing.capture.nccl). */
enum nccl_fn {
	NCCL_FN_ALL_REDUCE = 1,
	NCCL_FN_BROADCAST = 2,
	NCCL_FN_BCAST = 3,
	NCCL_FN_REDUCE = 4,
	NCCL_FN_ALL_GATHER = 5,
	NCCL_FN_REDUCE_SCATTER = 6,
	NCCL_FN_SEND = 7,
	NCCL_FN_RECV = 8,
	NCCL_FN_ALL_TO_ALL = 9,
	NCCL_FN_GATHER = 10,
	NCCL_FN_SCATTER = 11,
	NCCL_FN_GROUP_START = 12,
	NCCL_FN_GROUP_END = 13,
};

/* Index of each counter in the per-CPU `bpfdyno_nctotal` array. */
enum nccl_counter {
	NCCL_C_LOST = 0,          /* calls lost: the ring buffer was full */
	NCCL_C_INFLIGHT_FULL = 1, /* bpfdyno_nccalls full: a call's arguments were not kept */
	NCCL_C_MAX = 2,
};

/* Per traced process: the value of `bpfdyno_nctgids` (its key is the tgid). */
struct nccl_proc {
	u64 calls; /* calls written */
	u64 lost;  /* calls lost (ring buffer full) */
};
_Static_assert(sizeof(struct nccl_proc) == 16, "nccl_proc layout");

/* Key of `bpfdyno_nccalls`: a call in progress in one thread. */
struct nccl_key {
	u32 tid;
	u32 fn;
};
_Static_assert(sizeof(struct nccl_key) == 8, "nccl_key layout");

/* One call: kept in `bpfdyno_nccalls` from entry to return, then written to the ring buffer. */
struct nccl_call {
	u64 start_ns;  /* CLOCK_MONOTONIC at entry */
	u64 end_ns;    /* ... at return */
	u64 count;     /* elements (sendcount for AllGather, recvcount for ReduceScatter) */
	u64 comm;      /* ncclComm_t, the communicator's address */
	u64 stream;    /* cudaStream_t */
	u64 sendbuff;
	u64 recvbuff;
	u32 tgid;
	u32 tid;
	u32 fn;        /* enum nccl_fn */
	s32 datatype;  /* ncclDataType_t; -1: none */
	s32 op;        /* ncclRedOp_t; -1: none */
	s32 peer;      /* root (Broadcast, Bcast, Reduce, Gather, Scatter) or peer (Send, Recv); -1: none */
	s32 ret;       /* ncclResult_t it returned */
	u32 pad;
};
_Static_assert(sizeof(struct nccl_call) == 88, "nccl_call layout");

#endif /* BPFDYNO_NCCL_H */
