/* Types shared by net.bpf.c and its user-space reader (bpfdyno.sources.net).
 *
 * Fixed-width fields, explicit padding and size assertions: the Python side lets bcc derive
 * the ctypes layouts from the compiled program, and reads the enums below from this file, so
 * every definition lives here exactly once.
 */
#ifndef BPFDYNO_NET_H
#define BPFDYNO_NET_H

#define NET_COMM_LEN 16
#define NET_ADDR_LEN 16 /* IPv4 in the first 4 bytes, or IPv6 */

/* Index of each host-wide counter in the per-CPU `bpfdyno_ntotals` array. */
enum net_counter {
	NET_C_TCP_TX_BYTES = 0,
	NET_C_TCP_RX_BYTES = 1,
	NET_C_UDP_TX_BYTES = 2,
	NET_C_UDP_RX_BYTES = 3,
	NET_C_OTHER_TX_BYTES = 4, /* syscall fallback: socket bytes, protocol unknown */
	NET_C_OTHER_RX_BYTES = 5,
	NET_C_TCP_RETRANSMITS = 6,
	NET_C_TCP_RESETS_SENT = 7,
	NET_C_TCP_RESETS_RECEIVED = 8,
	NET_C_TCP_OPENS_ACTIVE = 9,
	NET_C_TCP_OPENS_PASSIVE = 10,
	NET_C_TCP_CLOSES = 11,
	NET_C_RINGBUF_DROPS = 12, /* events lost: the ring buffer was full */
	NET_C_PROC_MAP_FULL = 13, /* a process could not be added to bpfdyno_nprocs */
	NET_C_PROBE_SAMPLES = 14, /* tcp_probe events sampled into bpfdyno_nsocks */
	NET_C_DROPS = 15,         /* packets dropped, every reason (bpfdyno_ndrops by reason) */
	NET_C_MAX = 16,
};

/* Slots of the control array `bpfdyno_nctl`, written by user space. */
enum net_ctl {
	NET_CTL_BYTES_OFF = 0, /* 1: per-call accounting in its off phase (the budget samples) */
	NET_CTL_SLOTS = 1,
};

/* Kinds of the events streamed through the `bpfdyno_nevents` ring buffer. */
enum net_event_kind {
	NET_EV_CONNECT = 1,        /* active open established (SYN_SENT -> ESTABLISHED) */
	NET_EV_ACCEPT = 2,         /* passive open established (SYN_RECV -> ESTABLISHED) */
	NET_EV_CLOSE = 3,          /* a connection reached TCP_CLOSE */
	NET_EV_RETRANSMIT = 4,     /* tcp:tcp_retransmit_skb */
	NET_EV_RESET_SENT = 5,     /* tcp:tcp_send_reset */
	NET_EV_RESET_RECEIVED = 6, /* tcp:tcp_receive_reset */
};

/* net_sock.flags */
#define NET_SOCK_TUPLE 1   /* family/ports/addresses are filled in */
#define NET_SOCK_PASSIVE 2 /* created by accepting on a listener */

/* Cumulative per-process traffic, keyed by tgid in `bpfdyno_nprocs`. */
struct net_proc {
	u64 tcp_tx_bytes;
	u64 tcp_rx_bytes;
	u64 udp_tx_bytes;
	u64 udp_rx_bytes;
	u64 other_tx_bytes;
	u64 other_rx_bytes;
	u64 tcp_retransmits;
};
_Static_assert(sizeof(struct net_proc) == 56, "net_proc layout");

/* The slot table `bpfdyno_nslots`: per-process byte counters at a fixed place, found by the
 * process's tgid alone (slot = tgid % NET_PROC_SLOTS), so a socket call adds its bytes
 * without a hash lookup. A process takes the slot of its tgid at its first socket call if
 * the slot is free, and keeps it until its leader is freed; a process whose slot another
 * one holds counts in `bpfdyno_nprocs` as before. Bytes never move between the two: a
 * process's counts are its slot's plus its `bpfdyno_nprocs` entry's, whenever they are
 * read. NET_PROC_SLOTS is a power of two (0: no slot table, every process in the hash). */
#ifndef NET_PROC_SLOTS
#define NET_PROC_SLOTS 1024
#endif
#define NET_SLOT_FREE 0
#define NET_SLOT_BUSY 0xffffffffffffffffULL /* being emptied: nobody's, none may take it */

struct net_slot {
	u64 holder; /* NET_SLOT_FREE, NET_SLOT_BUSY or the holder's tgid (64 bits: the atomics
		     * this compiler targets are 64-bit only) */
	u64 tcp_tx_bytes; /* the same byte counters as struct net_proc, in its order */
	u64 tcp_rx_bytes;
	u64 udp_tx_bytes;
	u64 udp_rx_bytes;
	u64 other_tx_bytes;
	u64 other_rx_bytes;
	u64 pad2; /* one cache line a slot: processes on other CPUs never share one */
};
_Static_assert(sizeof(struct net_slot) == 64, "net_slot layout");

#if NET_PROC_SLOTS
/* The whole table is the one value of a one-entry array: user space reads it in one
 * syscall. */
struct net_slots {
	struct net_slot slot[NET_PROC_SLOTS];
};
#endif

/* One TCP socket, keyed by its kernel address in the LRU map `bpfdyno_nsocks`. The owner is the
 * process that last used it from process context; softirq-context events (retransmits,
 * resets, state changes on packet arrival) are attributed through it. */
struct net_sock {
	u64 tx_bytes;
	u64 rx_bytes;
	u64 open_ns; /* CLOCK_MONOTONIC when established; 0 if not seen */
	u32 tgid;
	u32 retransmits;
	u32 srtt_us; /* smoothed RTT from the last sampled tcp_probe; 0 if none */
	u32 snd_cwnd;
	u16 family;
	u16 sport; /* host byte order */
	u16 dport;
	u8 state; /* TCP_* */
	u8 flags; /* NET_SOCK_* */
	u8 saddr[NET_ADDR_LEN];
	u8 daddr[NET_ADDR_LEN];
	char comm[NET_COMM_LEN];
};
_Static_assert(sizeof(struct net_sock) == 96, "net_sock layout");

/* The owner of a listening port, so accepted sockets (created in softirq context) can be
 * attributed before the accepting process first touches them. */
struct net_listener {
	u32 tgid;
	u32 pad;
	char comm[NET_COMM_LEN];
};
_Static_assert(sizeof(struct net_listener) == 24, "net_listener layout");

/* One rare event, as written to the ring buffer. */
struct net_event {
	u64 ts_ns; /* CLOCK_MONOTONIC (bpf_ktime_get_ns) */
	u64 tx_bytes;
	u64 rx_bytes;
	u64 duration_ns; /* NET_EV_CLOSE: time since established; 0 if unknown */
	u32 kind;        /* enum net_event_kind */
	u32 tgid;        /* 0 if unknown */
	u32 tid;         /* 0 in softirq context */
	u32 state;       /* TCP state after the event (new state for CONNECT/ACCEPT/CLOSE) */
	u32 oldstate;
	s32 detail; /* RETRANSMIT: err; RESET_SENT: reason; CLOSE: retransmits */
	u16 family;
	u16 sport; /* host byte order */
	u16 dport;
	u16 pad;
	u8 saddr[NET_ADDR_LEN];
	u8 daddr[NET_ADDR_LEN];
	char comm[NET_COMM_LEN];
};
_Static_assert(sizeof(struct net_event) == 112, "net_event layout");

#endif /* BPFDYNO_NET_H */
