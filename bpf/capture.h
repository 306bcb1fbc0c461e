/* Types shared by capture.bpf.c and its reader (bpfdyno.tracing.capture.kernel).
 *
 * capture.bpf.c records what the kernel sees of the processes being traced, and of no
 * others: their socket calls (coalesced into bursts), samples of their TCP connections'
 * round-trip time, windows and bytes in flight, TCP state changes, retransmits, resets and
 * drops on their sockets, and the off-CPU intervals of their threads. The Python
 * side lets bcc derive the ctypes layouts from the compiled program and reads the enums below
 * from this file, so every definition lives here once.
 */
#ifndef BPFDYNO_CAPTURE_H
#define BPFDYNO_CAPTURE_H

#define CAP_COMM_LEN 16
#define CAP_ADDR_LEN 16 /* IPv4 in the first 4 bytes, or IPv6 */

/* Index of each counter in the per-CPU `bpfdyno_ctotals` array. */
enum cap_counter {
	CAP_C_NET_LOST = 0,     /* net events lost: their ring buffer was full */
	CAP_C_SCHED_LOST = 1,   /* off-CPU intervals lost: their ring buffer was full */
	CAP_C_THREAD_FULL = 2,  /* a traced thread could not be added to bpfdyno_cthread */
	CAP_C_BURST_FULL = 3,   /* bpfdyno_cbursts full: the call was emitted on its own */
	CAP_C_SOCK_FULL = 4,    /* bpfdyno_csocks full: softirq events of that socket are missed */
	CAP_C_CHILD_FULL = 5,   /* a traced process's child could not be added to bpfdyno_ctgids */
	CAP_C_RESERVE_AGAIN = 6, /* a ring buffer reservation that failed and was tried again */
	CAP_C_MAX = 7,
};

/* Kinds of the records in the `bpfdyno_cnet` ring buffer. */
enum cap_net_kind {
	CAP_NET_SEND = 1,           /* a burst of send calls on one socket by one thread */
	CAP_NET_RECV = 2,           /* a burst of receive calls */
	CAP_NET_STATE = 3,          /* sock:inet_sock_set_state */
	CAP_NET_RETRANSMIT = 4,     /* tcp:tcp_retransmit_skb */
	CAP_NET_RESET_SENT = 5,     /* tcp:tcp_send_reset */
	CAP_NET_RESET_RECEIVED = 6, /* tcp:tcp_receive_reset */
	CAP_NET_DROP = 7,           /* skb:kfree_skb of a packet of a traced socket */
	CAP_NET_TCP = 8,            /* a TCP connection's state, sampled at a socket call */
};

/* cap_proc.flags: what is recorded for the process. */
#define CAP_F_NET 1
#define CAP_F_SCHED 2
/* A child process of a traced process (a DataLoader worker...), added by the programs when
 * the traced process forks it, or by user space for those forked before the trace began:
 * only its off-CPU intervals are recorded, as part of its parent's capture. */
#define CAP_F_CHILD 4

/* Per traced process: the value of `bpfdyno_ctgids` (its key is the tgid). User space sets
 * flags when it adds the process; the programs only add to the counters. */
struct cap_proc {
	u32 flags;        /* CAP_F_* */
	u32 parent;       /* CAP_F_CHILD: the traced process it belongs to; 0 otherwise */
	u64 net_events;   /* net records written */
	u64 net_lost;     /* net records lost (ring buffer full) */
	u64 calls;        /* send/receive calls seen, coalesced or not */
	u64 offcpu;       /* off-CPU intervals written */
	u64 offcpu_lost;  /* off-CPU intervals lost (ring buffer full) */
	u64 short_count;  /* off-CPU intervals shorter than CAP_MIN_OFFCPU_NS: counted only */
	u64 short_ns;     /* and their total length */
};
_Static_assert(sizeof(struct cap_proc) == 64, "cap_proc layout");

/* Where a socket's endpoints are; read from struct sock_common. */
struct cap_tuple {
	u16 family;   /* AF_INET / AF_INET6 */
	u16 protocol; /* IPPROTO_TCP / IPPROTO_UDP / IPPROTO_MPTCP */
	u16 sport;    /* host byte order */
	u16 dport;
	u8 saddr[CAP_ADDR_LEN];
	u8 daddr[CAP_ADDR_LEN];
};
_Static_assert(sizeof(struct cap_tuple) == 40, "cap_tuple layout");

/* Key of `bpfdyno_cbursts`: one thread's calls on one socket in one direction. */
struct cap_burst_key {
	u64 sk;
	u32 tid;
	u32 rx;
};
_Static_assert(sizeof(struct cap_burst_key) == 16, "cap_burst_key layout");

/* A burst of calls: consecutive calls at most CAP_COALESCE_GAP_NS apart, spanning at most
 * CAP_COALESCE_MAX_NS. */
struct cap_burst {
	u64 first_ns; /* CLOCK_MONOTONIC when the first call returned */
	u64 last_ns;  /* ... the last one */
	u64 bytes;
	u32 calls;
	u32 tgid;
	struct cap_tuple tuple;
};
_Static_assert(sizeof(struct cap_burst) == 72, "cap_burst layout");

/* One record of the `bpfdyno_cnet` ring buffer. */
struct cap_net_event {
	u64 ts_ns;    /* CLOCK_MONOTONIC: the event; a burst's last call */
	u64 start_ns; /* a burst's first call; ts_ns otherwise */
	u64 bytes;    /* a burst's payload bytes */
	u64 sk;       /* the socket's kernel address (identifies it within the trace) */
	u32 kind;     /* enum cap_net_kind */
	u32 tgid;
	u32 tid;      /* 0 in softirq context */
	u32 calls;    /* a burst's calls */
	u32 state;    /* TCP state: new state (STATE), the socket's state otherwise */
	u32 oldstate; /* STATE only */
	s32 detail;   /* DROP: reason; RESET_SENT: reason; RETRANSMIT: err */
	u32 pad;
	/* The socket's endpoints, as struct cap_tuple (spelled out: bcc decodes ring-buffer
	 * records of scalar and array fields only). */
	u16 family;
	u16 protocol;
	u16 sport;
	u16 dport;
	u8 saddr[CAP_ADDR_LEN];
	u8 daddr[CAP_ADDR_LEN];
	/* The TCP connection as the kernel had it when the record was written (TCP, STATE,
	 * RETRANSMIT, RESET_*, DROP of a TCP socket; tcp_valid 0 otherwise): what its latency
	 * and throughput were. */
	u32 tcp_valid;      /* 1: the fields below were read */
	u32 srtt_us;        /* smoothed round-trip time */
	u32 rttvar_us;      /* its mean deviation */
	u32 rto_us;         /* the retransmission timeout */
	u32 snd_cwnd;       /* congestion window, segments */
	u32 packets_out;    /* segments sent and not yet acknowledged */
	u32 inflight_bytes; /* snd_nxt - snd_una: sent, not acknowledged */
	u32 queued_bytes;   /* write_seq - snd_nxt: written by the process, not sent yet */
	u32 total_retrans;  /* segments retransmitted over the connection's life */
	u32 rto_fires;      /* consecutive retransmission timeouts now (icsk_retransmits) */
};
_Static_assert(sizeof(struct cap_net_event) == 144, "cap_net_event layout");

/* Per traced thread: the value of `bpfdyno_cthread` while it is off-CPU. */
struct cap_thread {
	u64 off_ns;   /* switched out at */
	u64 wake_ns;  /* woken at (0: not woken yet, or it never blocked) */
	u32 tgid;
	u32 state;    /* prev_state at the switch-out; 0 = still runnable (preempted) */
	s32 syscall;  /* the system call it blocked or was preempted in; < 0: none, or unknown */
	u32 gen;      /* the bpfdyno_cgen value at the switch-out */
	u32 waker_tgid; /* the task that woke it (current at sched_waking; 0: not seen) */
	u32 waker_tid;
	/* Its user and system CPU time (task_struct utime, stime) at the switch-out. */
	u64 utime_ns;
	u64 stime_ns;
};
_Static_assert(sizeof(struct cap_thread) == 56, "cap_thread layout");

/* `cap_offcpu.state` of a record that is not an off-CPU interval but a thread's time in
 * direct memory reclaim (vmscan's memcg and direct reclaim tracepoints): off_ns its start,
 * on_ns its end, on a CPU but for the off-CPU intervals inside it. No task state has it. */
#define CAP_STATE_RECLAIM 1073741824 /* 0x40000000 */

/* One record of the `bpfdyno_csched` ring buffer: a completed off-CPU interval (or a
 * reclaim, CAP_STATE_RECLAIM). */
struct cap_offcpu {
	u64 off_ns;   /* switched out */
	u64 wake_ns;  /* woken (blocked intervals only; 0 if the wakeup was not seen) */
	u64 on_ns;    /* switched back in */
	u32 tgid;     /* the traced process the record belongs to */
	u32 tid;
	u32 state;    /* prev_state at the switch-out: 0 = runnable (CPU contention) */
	u32 cpu;      /* the CPU it came back on */
	s32 syscall;  /* the system call it blocked or was preempted in; < 0: none, or unknown */
	u32 pid;      /* the thread's own process: tgid, or a child of it (CAP_F_CHILD) */
	char comm[CAP_COMM_LEN];
	/* The task that held the CPU just before it got it back (0: the CPU was idle): who it
	 * waited for while it was runnable. */
	u32 held_tgid;
	u32 held_tid;
	char held_comm[CAP_COMM_LEN];
	/* The task that woke it (blocked intervals; 0: not seen): current at sched_waking, which
	 * is the waker for a wakeup from process context (a pipe write, a futex wake) and
	 * whatever was interrupted for one from an interrupt (a timer, a disk). */
	u32 waker_tgid;
	u32 waker_tid;
	/* Its user and system CPU time at the switch-out (task_struct utime and stime, in ns:
	 * with tick-based accounting, whole ticks charged to the mode each tick found it in).
	 * The difference from its previous record's is what it ran, in each mode, between. */
	u64 utime_ns;
	u64 stime_ns;
};
_Static_assert(sizeof(struct cap_offcpu) == 112, "cap_offcpu layout");

#endif /* BPFDYNO_CAPTURE_H */
