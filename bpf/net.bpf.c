/* bpfdyno network telemetry: per-process TCP/UDP bytes, per-connection state and bytes,
 * retransmits, RTT/cwnd samples, resets and packet drops by reason.
 *
 * Everything is aggregated in maps that user space reads cumulatively (never read-then-
 * clear); only rare events (connection open/close, retransmits, resets) go through the ring
 * buffer, and a full ring buffer is counted, never waited on.
 *
 * Settings (-D), required; bpfdyno passes them from the [net] config section:
 * NET_MAX_PROCS ([net] max_procs) and NET_MAX_SOCKS ([net] max_socks) size the maps,
 * NET_RINGBUF_PAGES ([net] ringbuf_pages, a power of two) the ring buffer, and
 * NET_PROBE_SAMPLE_EVERY ([net] probe_sample_every) sets the tcp_probe sampling.
 * NET_PROC_SLOTS (net.h: 1024 unless set; 0 for none) sizes the per-process slot table.
 * Optional: NET_USE_SYSCALLS selects the syscall fallback for byte counts (kernels without
 * sock:sock_{send,recv}_length); NET_NO_<PART> leaves out a part whose tracepoint this
 * kernel lacks; NET_RETX_HAS_ERR and NET_RST_HAS_REASON follow optional tracepoint fields;
 * NET_BTF makes the programs on hot paths BTF-typed (tp_btf: the per-call byte programs,
 * tcp_probe and the process cleanup; built against the BTF header tree, kernels with
 * /sys/kernel/btf/vmlinux).
 *
 * Every function and map is named "bpfdyno_..." so `bpftool` shows whose they are (the
 * kernel keeps 15 characters of a name: keep map names that short).
 */
#include "common.h"
#include "net.h"

#if !defined(NET_MAX_PROCS) || !defined(NET_MAX_SOCKS) || !defined(NET_RINGBUF_PAGES) || \
	!defined(NET_PROBE_SAMPLE_EVERY)
#error "NET_MAX_PROCS, NET_MAX_SOCKS, NET_RINGBUF_PAGES and NET_PROBE_SAMPLE_EVERY must be set with -D: load this program through bpfdyno's net collector, which passes them from [net]"
#endif

/* Listening ports remembered for attributing accepted sockets. */
#define NET_MAX_LISTENERS 4096
/* Drop reasons counted one by one; larger reason numbers share the last slot. */
#define NET_MAX_DROP_REASONS 256
/* Threads inside recvfrom/recvmsg at once (syscall fallback only). */
#define NET_MAX_RECEIVING 10240

#define NET_AF_INET 2
#define NET_AF_INET6 10
#define NET_PROTO_TCP 6
#define NET_PROTO_UDP 17
#define NET_PROTO_MPTCP 262
#define NET_MSG_PEEK 2
#define NET_TCP_ESTABLISHED 1
#define NET_TCP_SYN_SENT 2
#define NET_TCP_SYN_RECV 3
#define NET_TCP_CLOSE 7
#define NET_TCP_LISTEN 10

/* bcc generates the tracepoint argument structs from tracefs; fields typed with these kernel
 * enums need a complete type. The minimal header tree has none, so give them one of the
 * kernel's size (4 bytes, unsigned). */
#ifndef NET_BTF /* the BTF header tree (vmlinux.h) has the kernel's own */
enum skb_drop_reason { NET_SKB_DROP_REASON_ANY_ = 0xffffffffu };
enum sk_rst_reason { NET_SK_RST_REASON_ANY_ = 0xffffffffu };
#endif

BPF_PERCPU_ARRAY(bpfdyno_ntotals, u64, NET_C_MAX);
BPF_PERCPU_ARRAY(bpfdyno_ndrops, u64, NET_MAX_DROP_REASONS);
BPF_PERCPU_ARRAY(bpfdyno_ntick, u64, 1);
/* [NET_CTL_BYTES_OFF] is 1 while the overhead budget samples the per-call byte accounting
 * in time and it is in its off phase: the host-wide byte counts stay exact, the per-process
 * and per-socket ones wait for the on phase (user space scales them up). */
BPF_ARRAY(bpfdyno_nctl, u32, NET_CTL_SLOTS);
BPF_HASH(bpfdyno_nprocs, u32, struct net_proc, NET_MAX_PROCS);
#if NET_PROC_SLOTS
BPF_ARRAY(bpfdyno_nslots, struct net_slots, 1);
#endif
BPF_TABLE("lru_hash", u64, struct net_sock, bpfdyno_nsocks, NET_MAX_SOCKS);
BPF_HASH(bpfdyno_nlisten, u32, struct net_listener, NET_MAX_LISTENERS);
BPF_RINGBUF_OUTPUT(bpfdyno_nevents, NET_RINGBUF_PAGES);

static __always_inline void net_count(u32 idx, u64 value)
{
	u64 *c = bpfdyno_ntotals.lookup(&idx);
	if (c)
		*c += value; /* per-CPU slot: no atomics needed */
}

static __always_inline int net_per_call_off(void)
{
	u32 slot = NET_CTL_BYTES_OFF;
	u32 *off = bpfdyno_nctl.lookup(&slot);
	return off && *off;
}

static __always_inline struct net_proc *net_proc_of(u32 tgid)
{
	struct net_proc zero = {};
	struct net_proc *p = bpfdyno_nprocs.lookup_or_try_init(&tgid, &zero);
	if (!p)
		net_count(NET_C_PROC_MAP_FULL, 1);
	return p;
}

#if NET_PROC_SLOTS
/* The slot of `tgid`'s tgid in the slot table, whoever holds it (NULL only if the map
 * failed). The array lookup is inlined by the verifier: no helper call, unlike a hash. */
static __always_inline struct net_slot *net_slot_at(u32 tgid)
{
	u32 zero = 0;
	struct net_slots *t = bpfdyno_nslots.lookup(&zero);
	if (!t)
		return 0;
	return &t->slot[tgid & (NET_PROC_SLOTS - 1)];
}

/* `tgid`'s slot if it holds it or takes it now (it was free), else NULL: the process
 * counts in the hash. Taking is a compare-and-swap, so two CPUs never both take a slot
 * (when two threads of one process race for it, the loser finds its own tgid there). */
static __always_inline struct net_slot *net_slot_of(u32 tgid)
{
	struct net_slot *s = net_slot_at(tgid);
	if (!s)
		return 0;
	u64 holder = s->holder;
	if (holder == NET_SLOT_FREE)
		holder = __sync_val_compare_and_swap(&s->holder, NET_SLOT_FREE, (u64)tgid);
	if (holder == NET_SLOT_FREE || holder == tgid)
		return s;
	return 0;
}

/* Empty `tgid`'s slot for the next process (its leader is freed). Marked busy first, so
 * nobody takes it half-emptied; a call of the same tgid meanwhile (a new process with the
 * reused pid) counts in the hash, whose entry this exit also deletes (as it always did). */
static __always_inline void net_slot_release(u32 tgid)
{
	struct net_slot *s = net_slot_at(tgid);
	if (!s || s->holder != tgid)
		return;
	if (__sync_val_compare_and_swap(&s->holder, (u64)tgid, NET_SLOT_BUSY) != tgid)
		return;
	s->tcp_tx_bytes = 0;
	s->tcp_rx_bytes = 0;
	s->udp_tx_bytes = 0;
	s->udp_rx_bytes = 0;
	s->other_tx_bytes = 0;
	s->other_rx_bytes = 0;
	/* Free only once the counters are zero (an atomic exchange orders the stores). */
	__sync_lock_test_and_set(&s->holder, NET_SLOT_FREE);
}
#endif

/* Add `bytes` to one of `tgid`'s byte counters: in its slot if it has one, else in the
 * hash. `offset` is the counter's offset in struct net_proc, which struct net_slot's
 * counters follow (from its second word). */
static __always_inline void net_proc_bytes(u32 tgid, u32 offset, u64 bytes)
{
#if NET_PROC_SLOTS
	struct net_slot *s = net_slot_of(tgid);
	if (s) {
		__sync_fetch_and_add((u64 *)((u8 *)&s->tcp_tx_bytes + offset), bytes);
		return;
	}
#endif
	struct net_proc *p = net_proc_of(tgid);
	if (p)
		__sync_fetch_and_add((u64 *)((u8 *)p + offset), bytes);
}

static __always_inline u32 net_listener_key(u16 family, u16 port)
{
	return ((u32)family << 16) | port;
}

/* Reserve, fill from a socket entry (owner, bytes) and the given tuple, submit. */
static __always_inline void net_emit(u32 kind, const struct net_sock *s, u32 state, u32 oldstate,
				     s32 detail)
{
	struct net_event *e = bpfdyno_nevents.ringbuf_reserve(sizeof(struct net_event));
	if (!e) {
		net_count(NET_C_RINGBUF_DROPS, 1);
		return;
	}
	u64 now = bpf_ktime_get_ns();
	e->ts_ns = now;
	e->tx_bytes = s->tx_bytes;
	e->rx_bytes = s->rx_bytes;
	e->duration_ns = s->open_ns ? now - s->open_ns : 0;
	e->kind = kind;
	e->tgid = s->tgid;
	e->tid = 0; /* these events mostly fire in softirq context: the thread is unknown */
	e->state = state;
	e->oldstate = oldstate;
	e->detail = detail;
	e->family = s->family;
	e->sport = s->sport;
	e->dport = s->dport;
	e->pad = 0;
	__builtin_memcpy(e->saddr, s->saddr, NET_ADDR_LEN);
	__builtin_memcpy(e->daddr, s->daddr, NET_ADDR_LEN);
	__builtin_memcpy(e->comm, s->comm, NET_COMM_LEN);
	bpfdyno_nevents.ringbuf_submit(e, BPFDYNO_RB_NO_WAKEUP);
}

/* Copy a tracepoint's split IPv4/IPv6 address fields into a socket entry. */
#define NET_FILL_TUPLE(s, a)                                                                  \
	do {                                                                                  \
		(s)->family = (a)->family;                                                    \
		(s)->sport = (a)->sport;                                                      \
		(s)->dport = (a)->dport;                                                      \
		if ((a)->family == NET_AF_INET6) {                                            \
			__builtin_memcpy((s)->saddr, (a)->saddr_v6, 16);                      \
			__builtin_memcpy((s)->daddr, (a)->daddr_v6, 16);                      \
		} else {                                                                      \
			__builtin_memset((s)->saddr, 0, 16);                                  \
			__builtin_memset((s)->daddr, 0, 16);                                  \
			__builtin_memcpy((s)->saddr, (a)->saddr, 4);                          \
			__builtin_memcpy((s)->daddr, (a)->daddr, 4);                          \
		}                                                                             \
		(s)->flags |= NET_SOCK_TUPLE;                                                 \
	} while (0)

/* Decode a `struct sockaddr_in` / `sockaddr_in6` image (28 bytes, as the tcp tracepoints
 * store it) into family, host-order port and a 16-byte address. */
static __always_inline void net_sockaddr(const u8 *raw, u16 *family, u16 *port, u8 *addr)
{
	u16 fam = raw[0] | (raw[1] << 8);
	*family = fam;
	*port = (raw[2] << 8) | raw[3]; /* sin_port is big-endian */
	__builtin_memset(addr, 0, 16);
	if (fam == NET_AF_INET6)
		__builtin_memcpy(addr, raw + 8, 16);
	else
		__builtin_memcpy(addr, raw + 4, 4);
}

/* Owner bookkeeping for a TCP socket seen in process context (send/recv). */
static __always_inline void net_sock_io(u64 key, u32 tgid, u64 bytes, int rx)
{
	struct net_sock *s = bpfdyno_nsocks.lookup(&key);
	if (!s) {
		/* A socket that predates us or was never seen changing state. */
		struct net_sock fresh = {};
		fresh.tgid = tgid;
		bpf_get_current_comm(&fresh.comm, sizeof(fresh.comm));
		bpfdyno_nsocks.insert(&key, &fresh); /* may lose a race with another CPU: fine */
		s = bpfdyno_nsocks.lookup(&key);
		if (!s)
			return;
	}
	if (s->tgid != tgid) {
		s->tgid = tgid;
		bpf_get_current_comm(&s->comm, sizeof(s->comm));
	}
	if (rx)
		__sync_fetch_and_add(&s->rx_bytes, bytes);
	else
		__sync_fetch_and_add(&s->tx_bytes, bytes);
}

#ifndef NET_USE_SYSCALLS

/* sock:sock_{send,recv}_length: process context, exact bytes of every socket send/receive
 * (read/write, sendfile and splice included). */
static __always_inline int net_sock_length(void *sk, u16 family, u16 protocol, int ret, int flags,
					   int rx)
{
	if (ret <= 0 || (rx && (flags & NET_MSG_PEEK)))
		return 0;
	if (family != NET_AF_INET && family != NET_AF_INET6)
		return 0;
	int tcp = protocol == NET_PROTO_TCP || protocol == NET_PROTO_MPTCP;
	if (!tcp && protocol != NET_PROTO_UDP)
		return 0;
	u64 bytes = ret;
	if (tcp)
		net_count(rx ? NET_C_TCP_RX_BYTES : NET_C_TCP_TX_BYTES, bytes);
	else
		net_count(rx ? NET_C_UDP_RX_BYTES : NET_C_UDP_TX_BYTES, bytes);
	if (net_per_call_off())
		return 0;
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	u32 offset = tcp ? (rx ? __builtin_offsetof(struct net_proc, tcp_rx_bytes)
			       : __builtin_offsetof(struct net_proc, tcp_tx_bytes))
			 : (rx ? __builtin_offsetof(struct net_proc, udp_rx_bytes)
			       : __builtin_offsetof(struct net_proc, udp_tx_bytes));
	net_proc_bytes(tgid, offset, bytes);
	if (protocol == NET_PROTO_TCP)
		net_sock_io((u64)sk, tgid, bytes, rx);
	return 0;
}

#ifdef NET_BTF
/* BTF-typed (tp_btf) on the raw tracepoint: TP_PROTO(struct sock *sk, int ret, int flags).
 * The kernel calls the program directly with the arguments: no trace record is allocated
 * and filled per call, as for a classic tracepoint (most of what a small send cost besides
 * the program itself). Family and protocol are read from the socket, as the tracepoint's
 * own record would. */
static __always_inline int net_sock_length_btf(u64 *ctx, int rx)
{
	struct sock *sk = (struct sock *)ctx[0];
	u16 family = BPFDYNO_LOAD(u16, sk, struct sock, __sk_common.skc_family);
	u16 protocol = BPFDYNO_LOAD(u16, sk, struct sock, sk_protocol);
	return net_sock_length(sk, family, protocol, (int)ctx[1], (int)ctx[2], rx);
}

int bpfdyno_nsend(u64 *ctx)
{
	return net_sock_length_btf(ctx, 0);
}

int bpfdyno_nrecv(u64 *ctx)
{
	return net_sock_length_btf(ctx, 1);
}
#else
int bpfdyno_nsend(struct tracepoint__sock__sock_send_length *args)
{
	return net_sock_length(args->sk, args->family, args->protocol, args->ret, args->flags, 0);
}

int bpfdyno_nrecv(struct tracepoint__sock__sock_recv_length *args)
{
	return net_sock_length(args->sk, args->family, args->protocol, args->ret, args->flags, 1);
}
#endif

#else /* NET_USE_SYSCALLS */

/* Fallback for kernels without sock_*_length: the socket-only syscalls. The protocol is not
 * known here, so bytes go to the "other" counters; read()/write() on sockets and
 * sendmmsg/recvmmsg are not seen. */
BPF_HASH(bpfdyno_nrflags, u32, u32, NET_MAX_RECEIVING);

static __always_inline void net_other_bytes(long ret, int rx)
{
	if (ret <= 0)
		return;
	net_count(rx ? NET_C_OTHER_RX_BYTES : NET_C_OTHER_TX_BYTES, ret);
	if (net_per_call_off())
		return;
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	net_proc_bytes(tgid,
		       rx ? __builtin_offsetof(struct net_proc, other_rx_bytes)
			  : __builtin_offsetof(struct net_proc, other_tx_bytes),
		       (u64)ret);
}

/* Attached to sys_exit_sendto and sys_exit_sendmsg (same layout). */
int bpfdyno_nsc_tx(struct tracepoint__syscalls__sys_exit_sendto *args)
{
	net_other_bytes(args->ret, 0);
	return 0;
}

int bpfdyno_nsc_rxf(struct tracepoint__syscalls__sys_enter_recvfrom *args)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	u32 flags = (u32)args->flags;
	bpfdyno_nrflags.update(&tid, &flags);
	return 0;
}

int bpfdyno_nsc_rxm(struct tracepoint__syscalls__sys_enter_recvmsg *args)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	u32 flags = (u32)args->flags;
	bpfdyno_nrflags.update(&tid, &flags);
	return 0;
}

/* Attached to sys_exit_recvfrom and sys_exit_recvmsg (same layout). */
int bpfdyno_nsc_rx(struct tracepoint__syscalls__sys_exit_recvfrom *args)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	u32 *flags = bpfdyno_nrflags.lookup(&tid);
	int peek = flags && (*flags & NET_MSG_PEEK);
	bpfdyno_nrflags.delete(&tid);
	if (!peek)
		net_other_bytes(args->ret, 1);
	return 0;
}

#endif /* NET_USE_SYSCALLS */

#ifndef NET_NO_STATE
/* sock:inet_sock_set_state: connection lifecycle. Runs in process context for connect(),
 * listen() and close(), in softirq context when a packet moves the state. */
int bpfdyno_nstate(struct tracepoint__sock__inet_sock_set_state *args)
{
	if (args->protocol != NET_PROTO_TCP)
		return 0;
	if (args->family != NET_AF_INET && args->family != NET_AF_INET6)
		return 0;
	int ns = args->newstate;
	int os = args->oldstate;
	u64 key = (u64)args->skaddr;

	if (ns == NET_TCP_LISTEN) { /* listen(): process context, the owner is current */
		struct net_listener l = {};
		l.tgid = bpf_get_current_pid_tgid() >> 32;
		bpf_get_current_comm(&l.comm, sizeof(l.comm));
		u32 lkey = net_listener_key(args->family, args->sport);
		bpfdyno_nlisten.update(&lkey, &l);
		return 0;
	}
	if (os == NET_TCP_LISTEN && ns == NET_TCP_CLOSE) {
		u32 lkey = net_listener_key(args->family, args->sport);
		bpfdyno_nlisten.delete(&lkey);
		bpfdyno_nsocks.delete(&key);
		return 0;
	}

	struct net_sock *s = bpfdyno_nsocks.lookup(&key);
	if (!s) {
		struct net_sock fresh = {};
		if (ns == NET_TCP_SYN_SENT) { /* connect(): process context */
			fresh.tgid = bpf_get_current_pid_tgid() >> 32;
			bpf_get_current_comm(&fresh.comm, sizeof(fresh.comm));
		} else if (ns == NET_TCP_SYN_RECV) { /* a child of a listener, in softirq */
			u32 lkey = net_listener_key(args->family, args->sport);
			struct net_listener *l = bpfdyno_nlisten.lookup(&lkey);
			if (!l) { /* IPv4 peer on a dual-stack (AF_INET6) listener */
				lkey = net_listener_key(NET_AF_INET6, args->sport);
				l = bpfdyno_nlisten.lookup(&lkey);
			}
			if (l) {
				fresh.tgid = l->tgid;
				__builtin_memcpy(fresh.comm, l->comm, NET_COMM_LEN);
			}
			fresh.flags = NET_SOCK_PASSIVE;
		}
		bpfdyno_nsocks.update(&key, &fresh);
		s = bpfdyno_nsocks.lookup(&key);
		if (!s)
			return 0;
	} else if (ns == NET_TCP_SYN_SENT) {
		s->tgid = bpf_get_current_pid_tgid() >> 32;
		bpf_get_current_comm(&s->comm, sizeof(s->comm));
	}
	NET_FILL_TUPLE(s, args);
	s->state = ns;

	if (ns == NET_TCP_ESTABLISHED && (os == NET_TCP_SYN_SENT || os == NET_TCP_SYN_RECV)) {
		s->open_ns = bpf_ktime_get_ns();
		int active = os == NET_TCP_SYN_SENT;
		net_count(active ? NET_C_TCP_OPENS_ACTIVE : NET_C_TCP_OPENS_PASSIVE, 1);
		net_emit(active ? NET_EV_CONNECT : NET_EV_ACCEPT, s, ns, os, 0);
	} else if (ns == NET_TCP_CLOSE) {
		net_count(NET_C_TCP_CLOSES, 1);
		net_emit(NET_EV_CLOSE, s, ns, os, s->retransmits);
		bpfdyno_nsocks.delete(&key);
	}
	return 0;
}
#endif

#ifndef NET_NO_RETX
/* tcp:tcp_retransmit_skb: softirq/timer context; attributed through the socket's owner. */
int bpfdyno_nretx(struct tracepoint__tcp__tcp_retransmit_skb *args)
{
	s32 err = 0;
#ifdef NET_RETX_HAS_ERR
	err = args->err;
	if (err)
		return 0; /* not sent (e.g. the previous copy is still queued): not on the wire */
#endif
	net_count(NET_C_TCP_RETRANSMITS, 1);
	u64 key = (u64)args->skaddr;
	struct net_sock *s = bpfdyno_nsocks.lookup(&key);
	struct net_sock tmp = {};
	if (s) {
		__sync_fetch_and_add(&s->retransmits, 1);
		if (s->tgid) {
			struct net_proc *p = net_proc_of(s->tgid);
			if (p)
				__sync_fetch_and_add(&p->tcp_retransmits, 1);
		}
		tmp.tgid = s->tgid;
		tmp.tx_bytes = s->tx_bytes;
		tmp.rx_bytes = s->rx_bytes;
		tmp.open_ns = s->open_ns;
		__builtin_memcpy(tmp.comm, s->comm, NET_COMM_LEN);
	}
	NET_FILL_TUPLE(&tmp, args);
	if (s && !(s->flags & NET_SOCK_TUPLE))
		NET_FILL_TUPLE(s, args);
	net_emit(NET_EV_RETRANSMIT, &tmp, args->state, 0, err);
	return 0;
}
#endif

#ifndef NET_NO_PROBE
#ifdef NET_BTF
/* tcp:tcp_probe, BTF-typed: TP_PROTO(struct sock *sk, const struct sk_buff *skb). Every
 * received segment of an established connection; sampled 1 in NET_PROBE_SAMPLE_EVERY per
 * CPU. A classic tracepoint would fill its whole record (addresses, ports, sequence
 * numbers, RTT, windows) for every segment before the program skipped it; here the skipped
 * ones cost the tick. The sampled ones read what the record holds from the socket: the
 * smoothed RTT as the tracepoint gives it (srtt_us >> 3), the congestion window, and the
 * addresses as the tracepoint stores them (an AF_INET6 socket's IPv6 addresses). */
int bpfdyno_nprobe(u64 *ctx)
{
	u32 zero = 0;
	u64 *tick = bpfdyno_ntick.lookup(&zero);
	if (!tick)
		return 0;
	*tick += 1;
	if (*tick % NET_PROBE_SAMPLE_EVERY)
		return 0;
	struct sock *sk = (struct sock *)ctx[0];
	u64 key = (u64)sk;
	struct net_sock *s = bpfdyno_nsocks.lookup(&key);
	if (!s)
		return 0;
	/* tcp_sock fields lie past struct sock, the argument's type: read, not loaded. */
	u32 srtt_us = 0, cwnd = 0;
	bpf_probe_read_kernel(&srtt_us, sizeof(srtt_us), BPFDYNO_FIELD(sk, struct tcp_sock, srtt_us));
	bpf_probe_read_kernel(&cwnd, sizeof(cwnd), BPFDYNO_FIELD(sk, struct tcp_sock, snd_cwnd));
	s->srtt_us = srtt_us >> 3;
	s->snd_cwnd = cwnd;
	if (!(s->flags & NET_SOCK_TUPLE)) {
		u16 family = BPFDYNO_LOAD(u16, sk, struct sock, __sk_common.skc_family);
		s->family = family;
		s->sport = BPFDYNO_LOAD(u16, sk, struct sock, __sk_common.skc_num);
		s->dport = bpf_ntohs(BPFDYNO_LOAD(u16, sk, struct sock, __sk_common.skc_dport));
		__builtin_memset(s->saddr, 0, NET_ADDR_LEN);
		__builtin_memset(s->daddr, 0, NET_ADDR_LEN);
		if (family == NET_AF_INET6) {
			bpf_probe_read_kernel(s->saddr, 16, BPFDYNO_FIELD(sk, struct sock, __sk_common.skc_v6_rcv_saddr));
			bpf_probe_read_kernel(s->daddr, 16, BPFDYNO_FIELD(sk, struct sock, __sk_common.skc_v6_daddr));
		} else {
			bpf_probe_read_kernel(s->saddr, 4, BPFDYNO_FIELD(sk, struct sock, __sk_common.skc_rcv_saddr));
			bpf_probe_read_kernel(s->daddr, 4, BPFDYNO_FIELD(sk, struct sock, __sk_common.skc_daddr));
		}
		s->flags |= NET_SOCK_TUPLE;
	}
	net_count(NET_C_PROBE_SAMPLES, 1);
	return 0;
}
#else
/* tcp:tcp_probe: every received segment of an established connection; sampled 1 in
 * NET_PROBE_SAMPLE_EVERY per CPU to keep the hot receive path cheap. */
int bpfdyno_nprobe(struct tracepoint__tcp__tcp_probe *args)
{
	u32 zero = 0;
	u64 *tick = bpfdyno_ntick.lookup(&zero);
	if (!tick)
		return 0;
	*tick += 1;
	if (*tick % NET_PROBE_SAMPLE_EVERY)
		return 0;
	u64 key = (u64)args->skaddr;
	struct net_sock *s = bpfdyno_nsocks.lookup(&key);
	if (!s)
		return 0;
	s->srtt_us = args->srtt;
	s->snd_cwnd = args->snd_cwnd;
	if (!(s->flags & NET_SOCK_TUPLE)) {
		net_sockaddr(args->saddr, &s->family, &s->sport, s->saddr);
		net_sockaddr(args->daddr, &s->family, &s->dport, s->daddr);
		s->flags |= NET_SOCK_TUPLE;
	}
	net_count(NET_C_PROBE_SAMPLES, 1);
	return 0;
}
#endif /* NET_BTF */
#endif /* NET_NO_PROBE */

#ifndef NET_NO_RST_SENT
int bpfdyno_nrstsnd(struct tracepoint__tcp__tcp_send_reset *args)
{
	net_count(NET_C_TCP_RESETS_SENT, 1);
	u64 key = (u64)args->skaddr;
	struct net_sock tmp = {};
	struct net_sock *s = key ? bpfdyno_nsocks.lookup(&key) : 0;
	if (s) {
		tmp.tgid = s->tgid;
		tmp.tx_bytes = s->tx_bytes;
		tmp.rx_bytes = s->rx_bytes;
		tmp.open_ns = s->open_ns;
		__builtin_memcpy(tmp.comm, s->comm, NET_COMM_LEN);
	}
	net_sockaddr(args->saddr, &tmp.family, &tmp.sport, tmp.saddr);
	net_sockaddr(args->daddr, &tmp.family, &tmp.dport, tmp.daddr);
	s32 reason = 0;
#ifdef NET_RST_HAS_REASON
	reason = args->reason;
#endif
	net_emit(NET_EV_RESET_SENT, &tmp, args->state, 0, reason);
	return 0;
}
#endif

#ifndef NET_NO_RST_RECV
int bpfdyno_nrstrcv(struct tracepoint__tcp__tcp_receive_reset *args)
{
	net_count(NET_C_TCP_RESETS_RECEIVED, 1);
	u64 key = (u64)args->skaddr;
	struct net_sock tmp = {};
	struct net_sock *s = bpfdyno_nsocks.lookup(&key);
	u32 state = 0;
	if (s) {
		tmp.tgid = s->tgid;
		tmp.tx_bytes = s->tx_bytes;
		tmp.rx_bytes = s->rx_bytes;
		tmp.open_ns = s->open_ns;
		__builtin_memcpy(tmp.comm, s->comm, NET_COMM_LEN);
		state = s->state;
	}
	NET_FILL_TUPLE(&tmp, args);
	net_emit(NET_EV_RESET_RECEIVED, &tmp, state, 0, 0);
	return 0;
}
#endif

#ifndef NET_NO_DROPS
/* skb:kfree_skb: every packet freed as dropped, counted by reason (enum skb_drop_reason). */
int bpfdyno_ndrop(struct tracepoint__skb__kfree_skb *args)
{
	u32 reason = args->reason;
	if (reason >= NET_MAX_DROP_REASONS)
		reason = NET_MAX_DROP_REASONS - 1; /* reported as "other" */
	u64 *c = bpfdyno_ndrops.lookup(&reason);
	if (c)
		*c += 1;
	net_count(NET_C_DROPS, 1); /* user space reads the reasons only when this moved */
	return 0;
}
#endif

/* sched:sched_process_free: a task is gone for good; drop its process entry. Only a thread
 * group leader's pid is ever a key, and the leader is freed after all its threads. */
#ifdef NET_BTF
/* BTF-typed: TP_PROTO(struct task_struct *p). Threads that are not a group leader (most
 * exits under thread churn) are no key: skipped without touching the map (a delete takes
 * the bucket's lock even for a key that is not there). */
int bpfdyno_nexit(u64 *ctx)
{
	struct task_struct *p = (struct task_struct *)ctx[0];
	u32 pid = BPFDYNO_LOAD(u32, p, struct task_struct, pid);
	if (pid != BPFDYNO_LOAD(u32, p, struct task_struct, tgid))
		return 0;
#if NET_PROC_SLOTS
	net_slot_release(pid);
#endif
	if (bpfdyno_nprocs.lookup(&pid))
		bpfdyno_nprocs.delete(&pid);
	return 0;
}
#else
int bpfdyno_nexit(struct tracepoint__sched__sched_process_free *args)
{
	u32 pid = args->pid;
#if NET_PROC_SLOTS
	net_slot_release(pid); /* a no-op for a thread that is not a leader: only tgids hold slots */
#endif
	if (bpfdyno_nprocs.lookup(&pid)) /* a delete takes the bucket's lock even for no key */
		bpfdyno_nprocs.delete(&pid);
	return 0;
}
#endif
