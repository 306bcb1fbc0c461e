/* bpfdyno trace capture: what the kernel sees of the processes being traced, for the kernel
 * tracks merged into their Kineto trace files.
 *
 * Attached only while some trace runs (bpfdyno.tracing.capture.kernel attaches a track's
 * functions when the first traced process that wants it is added and detaches them when the
 * last one leaves), and every function first checks `bpfdyno_ctgids`, the map of traced
 * processes, and the process's CAP_F_* flags: nothing else is recorded. When nothing is
 * traced none of this runs at all.
 *
 * Recorded, per traced process (tgid):
 * - socket calls (sock:sock_{send,recv}_length, TCP/UDP/MPTCP over IPv4/IPv6): bytes, both
 *   endpoints, the socket. One thread's consecutive calls on one socket in one direction are
 *   coalesced into a burst while each comes at most CAP_COALESCE_GAP_NS after the previous
 *   one and the burst spans at most CAP_COALESCE_MAX_NS (gap 0: one record per call). A
 *   burst is written when the next call does not fit, or by user space at the end;
 * - samples of their TCP connections (round-trip time, congestion window, bytes in flight and
 *   queued, retransmission timeout and counts), read from struct tcp_sock at a socket call,
 *   at most one per connection per CAP_TCP_SAMPLE_NS (0: none), and with every rare event
 *   below; so a reader sees each connection's latency and throughput over time;
 * - TCP state changes, retransmits, resets sent and received, and packet drops (with the
 *   kernel's reason) of the sockets it used, attributed through `bpfdyno_csocks` since most
 *   fire in softirq context;
 * - the off-CPU intervals of its threads: switched out runnable (preempted: waiting for a
 *   CPU) or blocked (sleep, I/O, lock, futex), the wakeup of a blocked thread and the task
 *   that woke it, and the switch back in, with the task that held the CPU just before (who
 *   it waited for). Intervals shorter than CAP_MIN_OFFCPU_NS are only counted and summed;
 * - the same of its child processes (one level: DataLoader workers, forked when it forks
 *   them, or added by user space when they were forked before), as part of its own record:
 *   a main thread waiting for its workers is explained by what the workers waited for.
 *
 * Raw tracepoints reading struct sock / task_struct: needs the "btf" kernel-header flavour.
 *
 * Settings (-D), required; bpfdyno passes them from the [capture] config section:
 * CAP_MAX_PROCS (max_processes), CAP_MAX_THREADS (max_threads), CAP_MAX_SOCKS (max_sockets)
 * size the maps, CAP_RINGBUF_PAGES (ringbuf_pages, a power of two) each ring buffer,
 * CAP_COALESCE_GAP_NS / CAP_COALESCE_MAX_NS (net_coalesce_gap_us / net_coalesce_max_us) the
 * bursts, CAP_TCP_SAMPLE_NS (net_tcp_sample_us) the TCP samples, CAP_MIN_OFFCPU_NS (sched_min_offcpu_us) the shortest off-CPU interval written.
 * Optional, from the tracepoints' formats: CAP_RETX_HAS_ERR, CAP_RST_HAS_REASON,
 * CAP_DROP_HAS_REASON, CAP_DROP_HAS_RXSK follow arguments newer kernels added.
 *
 * Every function and map is named "bpfdyno_c..." (15 characters at most: the kernel keeps no
 * more).
 */
#include <linux/sched.h>
#include <net/sock.h>
#include "common.h"
#include "capture.h"

#if !defined(CAP_MAX_PROCS) || !defined(CAP_MAX_THREADS) || !defined(CAP_MAX_SOCKS) ||        \
	!defined(CAP_RINGBUF_PAGES) || !defined(CAP_COALESCE_GAP_NS) ||                       \
	!defined(CAP_COALESCE_MAX_NS) || !defined(CAP_MIN_OFFCPU_NS) || !defined(CAP_TCP_SAMPLE_NS)
#error "CAP_MAX_PROCS, CAP_MAX_THREADS, CAP_MAX_SOCKS, CAP_RINGBUF_PAGES, CAP_COALESCE_GAP_NS, CAP_COALESCE_MAX_NS, CAP_MIN_OFFCPU_NS and CAP_TCP_SAMPLE_NS must be set with -D: load this program through bpfdyno's trace capture, which passes them from [capture]"
#endif

/* Listening ports of traced processes, for attributing the connections they accept. */
#define CAP_MAX_LISTENERS 1024

#define CAP_AF_INET 2
#define CAP_AF_INET6 10
#define CAP_PROTO_TCP 6
#define CAP_PROTO_UDP 17
#define CAP_PROTO_MPTCP 262
#define CAP_MSG_PEEK 2
#define CAP_TCP_SYN_SENT 2
#define CAP_TCP_SYN_RECV 3
#define CAP_TCP_CLOSE 7
#define CAP_TCP_LISTEN 10
#define CAP_TASK_RUNNING 0
#define CAP_TASK_DEAD 0x80

/* Where a task's user registers are saved (task_pt_regs): the top of its kernel stack. Only
 * x86-64 is spelled out; elsewhere the system call a thread blocked in stays unknown. */
#if defined(__x86_64__) || defined(bpf_target_x86)
#define CAP_SYSCALL_REGS 1
#ifdef CONFIG_KASAN
#define CAP_THREAD_SIZE (16384 << 1)
#else
#define CAP_THREAD_SIZE 16384
#endif
#endif

BPF_PERCPU_ARRAY(bpfdyno_ctotals, u64, CAP_C_MAX);
BPF_HASH(bpfdyno_ctgids, u32, struct cap_proc, CAP_MAX_PROCS);
BPF_HASH(bpfdyno_cthread, u32, struct cap_thread, CAP_MAX_THREADS);
/* Bumped by user space before bpfdyno_cswitch is attached again after a gap (the overhead
 * budget samples it in time): a thread switched out before the gap has no true interval. */
BPF_ARRAY(bpfdyno_cgen, u32, 1);
BPF_HASH(bpfdyno_cbursts, struct cap_burst_key, struct cap_burst, CAP_MAX_SOCKS);
/* Sockets a traced process used, and its tgid: softirq-context events are attributed by it. */
BPF_HASH(bpfdyno_csocks, u64, u32, CAP_MAX_SOCKS);
BPF_HASH(bpfdyno_clisten, u32, u32, CAP_MAX_LISTENERS);
/* When each TCP connection was last sampled (LRU: a closed socket's entry ages out). */
BPF_TABLE("lru_hash", u64, u64, bpfdyno_ctcp, CAP_MAX_SOCKS);
BPF_RINGBUF_OUTPUT(bpfdyno_cnet, CAP_RINGBUF_PAGES);
BPF_RINGBUF_OUTPUT(bpfdyno_csched, CAP_RINGBUF_PAGES);
/* Per traced thread in direct memory reclaim: when it began. */
BPF_HASH(bpfdyno_creclaim, u32, u64, CAP_MAX_THREADS);

static __always_inline void cap_count(u32 idx)
{
	u64 *c = bpfdyno_ctotals.lookup(&idx);
	if (c)
		*c += 1; /* per-CPU slot: no atomics needed */
}

/* A record reserved in `bpfdyno_cnet` / `bpfdyno_csched`, or NULL. A reservation that fails
 * is tried once more: on kernels whose ring buffer lock can give up (a resilient spin lock,
 * 6.15+) one failed with the ring 5-10 % full, losing 1-8 records in a 10 s trace of four
 * ranks; a full ring fails again. */
static __always_inline struct cap_net_event *cap_reserve_net(void)
{
	struct cap_net_event *e = bpfdyno_cnet.ringbuf_reserve(sizeof(struct cap_net_event));
	if (!e) {
		cap_count(CAP_C_RESERVE_AGAIN);
		e = bpfdyno_cnet.ringbuf_reserve(sizeof(struct cap_net_event));
	}
	return e;
}

static __always_inline struct cap_offcpu *cap_reserve_sched(void)
{
	struct cap_offcpu *e = bpfdyno_csched.ringbuf_reserve(sizeof(struct cap_offcpu));
	if (!e) {
		cap_count(CAP_C_RESERVE_AGAIN);
		e = bpfdyno_csched.ringbuf_reserve(sizeof(struct cap_offcpu));
	}
	return e;
}

static __always_inline u16 cap_ntohs(u16 v)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	return __builtin_bswap16(v);
#else
	return v;
#endif
}

static __always_inline u16 cap_sock_family(struct sock *sk)
{
	u16 family = 0;
	bpf_probe_read_kernel(&family, sizeof(family), &sk->__sk_common.skc_family);
	return family;
}

/* Both endpoints of a socket. Unconnected UDP sockets have no peer: it reads as :: / 0. */
static __always_inline void cap_read_tuple(struct sock *sk, u16 family, struct cap_tuple *t)
{
	u16 protocol = 0, dport = 0, sport = 0;
	bpf_probe_read_kernel(&protocol, sizeof(protocol), &sk->sk_protocol);
	bpf_probe_read_kernel(&dport, sizeof(dport), &sk->__sk_common.skc_dport);
	bpf_probe_read_kernel(&sport, sizeof(sport), &sk->__sk_common.skc_num);
	t->family = family;
	t->protocol = protocol;
	t->sport = sport;
	t->dport = cap_ntohs(dport);
	__builtin_memset(t->saddr, 0, CAP_ADDR_LEN);
	__builtin_memset(t->daddr, 0, CAP_ADDR_LEN);
	if (family == CAP_AF_INET6) {
		bpf_probe_read_kernel(t->saddr, 16, &sk->__sk_common.skc_v6_rcv_saddr);
		bpf_probe_read_kernel(t->daddr, 16, &sk->__sk_common.skc_v6_daddr);
	} else {
		bpf_probe_read_kernel(t->saddr, 4, &sk->__sk_common.skc_rcv_saddr);
		bpf_probe_read_kernel(t->daddr, 4, &sk->__sk_common.skc_daddr);
	}
}

static __always_inline void cap_copy_tuple(struct cap_net_event *e, const struct cap_tuple *t)
{
	e->family = t->family;
	e->protocol = t->protocol;
	e->sport = t->sport;
	e->dport = t->dport;
	__builtin_memcpy(e->saddr, t->saddr, CAP_ADDR_LEN);
	__builtin_memcpy(e->daddr, t->daddr, CAP_ADDR_LEN);
}

static __always_inline u32 cap_sock_state(struct sock *sk)
{
	u8 state = 0;
	bpf_probe_read_kernel(&state, sizeof(state), (void *)&sk->__sk_common.skc_state);
	return state;
}

/* The TCP connection's latency and throughput now (struct tcp_sock; sk must be TCP). */
static __always_inline void cap_read_tcp(struct sock *sk, struct cap_net_event *e)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	struct inet_connection_sock *icsk = (struct inet_connection_sock *)sk;
	u32 srtt = 0, mdev = 0, rto = 0, cwnd = 0, out = 0, una = 0, nxt = 0, wseq = 0, retr = 0;
	u8 fires = 0;
	bpf_probe_read_kernel(&srtt, sizeof(srtt), &tp->srtt_us);
	bpf_probe_read_kernel(&mdev, sizeof(mdev), &tp->mdev_us);
	bpf_probe_read_kernel(&cwnd, sizeof(cwnd), &tp->snd_cwnd);
	bpf_probe_read_kernel(&out, sizeof(out), &tp->packets_out);
	bpf_probe_read_kernel(&una, sizeof(una), &tp->snd_una);
	bpf_probe_read_kernel(&nxt, sizeof(nxt), &tp->snd_nxt);
	bpf_probe_read_kernel(&wseq, sizeof(wseq), &tp->write_seq);
	bpf_probe_read_kernel(&retr, sizeof(retr), &tp->total_retrans);
	bpf_probe_read_kernel(&rto, sizeof(rto), &icsk->icsk_rto);
	bpf_probe_read_kernel(&fires, sizeof(fires), &icsk->icsk_retransmits);
	e->tcp_valid = 1;
	e->srtt_us = srtt >> 3; /* the kernel keeps 8 x srtt and 4 x mdev */
	e->rttvar_us = mdev >> 2;
	e->rto_us = rto * (1000000 / CONFIG_HZ); /* jiffies */
	e->snd_cwnd = cwnd;
	e->packets_out = out;
	e->inflight_bytes = nxt - una;
	e->queued_bytes = wseq - nxt;
	e->total_retrans = retr;
	e->rto_fires = fires;
}

static __always_inline void cap_clear_tcp(struct cap_net_event *e)
{
	e->tcp_valid = 0;
	e->srtt_us = 0;
	e->rttvar_us = 0;
	e->rto_us = 0;
	e->snd_cwnd = 0;
	e->packets_out = 0;
	e->inflight_bytes = 0;
	e->queued_bytes = 0;
	e->total_retrans = 0;
	e->rto_fires = 0;
}

/* ---- socket calls ------------------------------------------------------------------ */

static __always_inline void cap_emit_burst(const struct cap_burst_key *key,
					   const struct cap_burst *b, struct cap_proc *p)
{
	struct cap_net_event *e = cap_reserve_net();
	if (!e) {
		cap_count(CAP_C_NET_LOST);
		__sync_fetch_and_add(&p->net_lost, 1);
		return;
	}
	e->ts_ns = b->last_ns;
	e->start_ns = b->first_ns;
	e->bytes = b->bytes;
	e->sk = key->sk;
	e->kind = key->rx ? CAP_NET_RECV : CAP_NET_SEND;
	e->tgid = b->tgid;
	e->tid = key->tid;
	e->calls = b->calls;
	e->state = 0;
	e->oldstate = 0;
	e->detail = 0;
	e->pad = 0;
	cap_copy_tuple(e, &b->tuple);
	cap_clear_tcp(e);
	bpfdyno_cnet.ringbuf_submit(e, BPFDYNO_RB_NO_WAKEUP);
	__sync_fetch_and_add(&p->net_events, 1);
}

static __always_inline void cap_remember_sock(u64 sk, u32 tgid)
{
	if (bpfdyno_csocks.lookup(&sk))
		return;
	if (bpfdyno_csocks.update(&sk, &tgid))
		cap_count(CAP_C_SOCK_FULL);
}

/* A sample of a traced process's TCP connection, at most one per CAP_TCP_SAMPLE_NS. */
static __always_inline void cap_sample_tcp(struct sock *sk, u32 tgid, u32 tid, u64 now,
					   const struct cap_tuple *t, struct cap_proc *p)
{
#if CAP_TCP_SAMPLE_NS > 0
	u64 key = (u64)sk;
	u64 *last = bpfdyno_ctcp.lookup(&key);
	if (last && now - *last < CAP_TCP_SAMPLE_NS)
		return;
	bpfdyno_ctcp.update(&key, &now);
	struct cap_net_event *e = cap_reserve_net();
	if (!e) {
		cap_count(CAP_C_NET_LOST);
		__sync_fetch_and_add(&p->net_lost, 1);
		return;
	}
	u32 state = cap_sock_state(sk);
	e->ts_ns = now;
	e->start_ns = now;
	e->bytes = 0;
	e->sk = key;
	e->kind = CAP_NET_TCP;
	e->tgid = tgid;
	e->tid = tid;
	e->calls = 0;
	e->state = state;
	e->oldstate = 0;
	e->detail = 0;
	e->pad = 0;
	cap_copy_tuple(e, t);
	cap_read_tcp(sk, e);
	bpfdyno_cnet.ringbuf_submit(e, BPFDYNO_RB_NO_WAKEUP);
	__sync_fetch_and_add(&p->net_events, 1);
#endif
}

static __always_inline int cap_sock_call(struct sock *sk, int ret, int flags, u32 rx)
{
	if (ret <= 0 || (rx && (flags & CAP_MSG_PEEK)))
		return 0;
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;
	struct cap_proc *p = bpfdyno_ctgids.lookup(&tgid);
	if (!p || !(p->flags & CAP_F_NET))
		return 0;
	struct cap_burst_key key = {};
	key.sk = (u64)sk;
	key.tid = (u32)id;
	key.rx = rx;
	u64 now = bpf_ktime_get_ns();
	struct cap_burst *b = bpfdyno_cbursts.lookup(&key);
	if (b) {
		/* The burst belongs to this thread alone: no other CPU touches it meanwhile. */
		__sync_fetch_and_add(&p->calls, 1);
		if (now - b->last_ns <= CAP_COALESCE_GAP_NS &&
		    now - b->first_ns <= CAP_COALESCE_MAX_NS) {
			b->last_ns = now;
			b->bytes += ret;
			b->calls += 1;
		} else {
			cap_emit_burst(&key, b, p);
			b->first_ns = now;
			b->last_ns = now;
			b->bytes = ret;
			b->calls = 1;
			/* a UDP socket may have connected */
			cap_read_tuple(sk, b->tuple.family, &b->tuple);
		}
		if (b->tuple.protocol == CAP_PROTO_TCP)
			cap_sample_tcp(sk, tgid, key.tid, now, &b->tuple, p);
		return 0;
	}
	u16 family = cap_sock_family(sk);
	if (family != CAP_AF_INET && family != CAP_AF_INET6)
		return 0; /* Unix sockets and the like: not network traffic */
	struct cap_burst fresh = {};
	cap_read_tuple(sk, family, &fresh.tuple);
	u16 proto = fresh.tuple.protocol;
	if (proto != CAP_PROTO_TCP && proto != CAP_PROTO_UDP && proto != CAP_PROTO_MPTCP)
		return 0;
	__sync_fetch_and_add(&p->calls, 1);
	fresh.first_ns = now;
	fresh.last_ns = now;
	fresh.bytes = ret;
	fresh.calls = 1;
	fresh.tgid = tgid;
	if (bpfdyno_cbursts.update(&key, &fresh)) {
		cap_count(CAP_C_BURST_FULL);
		cap_emit_burst(&key, &fresh, p); /* no room to coalesce: write the call alone */
	}
	if (proto != CAP_PROTO_UDP)
		cap_remember_sock(key.sk, tgid);
	if (proto == CAP_PROTO_TCP)
		cap_sample_tcp(sk, tgid, key.tid, now, &fresh.tuple, p);
	return 0;
}

/* TP_PROTO(struct sock *sk, int ret, int flags) */
int bpfdyno_csend(struct bpf_raw_tracepoint_args *ctx)
{
	return cap_sock_call((struct sock *)ctx->args[0], (int)ctx->args[1], (int)ctx->args[2], 0);
}

int bpfdyno_crecv(struct bpf_raw_tracepoint_args *ctx)
{
	return cap_sock_call((struct sock *)ctx->args[0], (int)ctx->args[1], (int)ctx->args[2], 1);
}

/* ---- rare network events ----------------------------------------------------------- */

/* The traced process a socket belongs to, or NULL. */
static __always_inline struct cap_proc *cap_sock_owner(u64 sk, u32 *tgid)
{
	u32 *owner = bpfdyno_csocks.lookup(&sk);
	if (!owner)
		return NULL;
	*tgid = *owner;
	return bpfdyno_ctgids.lookup(tgid);
}

static __always_inline void cap_emit_net(u32 kind, struct sock *sk, u32 tgid, u32 tid, u32 state,
					 u32 oldstate, s32 detail, struct cap_proc *p)
{
	struct cap_net_event *e = cap_reserve_net();
	if (!e) {
		cap_count(CAP_C_NET_LOST);
		__sync_fetch_and_add(&p->net_lost, 1);
		return;
	}
	u64 now = bpf_ktime_get_ns();
	e->ts_ns = now;
	e->start_ns = now;
	e->bytes = 0;
	e->sk = (u64)sk;
	e->kind = kind;
	e->tgid = tgid;
	e->tid = tid;
	e->calls = 0;
	e->state = state;
	e->oldstate = oldstate;
	e->detail = detail;
	e->pad = 0;
	struct cap_tuple t = {};
	cap_read_tuple(sk, cap_sock_family(sk), &t);
	cap_copy_tuple(e, &t);
	if (t.protocol == CAP_PROTO_TCP)
		cap_read_tcp(sk, e);
	else
		cap_clear_tcp(e);
	bpfdyno_cnet.ringbuf_submit(e, BPFDYNO_RB_NO_WAKEUP);
	__sync_fetch_and_add(&p->net_events, 1);
}

/* TP_PROTO(const struct sock *sk, const int oldstate, const int newstate). Runs in process
 * context for connect(), listen() and close(), in softirq context when a packet moves it. */
int bpfdyno_cstate(struct bpf_raw_tracepoint_args *ctx)
{
	struct sock *sk = (struct sock *)ctx->args[0];
	int oldstate = (int)ctx->args[1];
	int newstate = (int)ctx->args[2];
	u64 key = (u64)sk;
	u16 protocol = 0;
	bpf_probe_read_kernel(&protocol, sizeof(protocol), &sk->sk_protocol);
	if (protocol != CAP_PROTO_TCP)
		return 0;
	u16 family = cap_sock_family(sk);
	u16 port = 0;
	bpf_probe_read_kernel(&port, sizeof(port), &sk->__sk_common.skc_num);
	u32 lkey = ((u32)family << 16) | port;
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = 0, tid = 0;
	struct cap_proc *p = cap_sock_owner(key, &tgid);
	if (!p && (newstate == CAP_TCP_SYN_SENT || newstate == CAP_TCP_LISTEN)) {
		/* connect() and listen(): process context, the owner is current. */
		tgid = id >> 32;
		tid = (u32)id;
		p = bpfdyno_ctgids.lookup(&tgid);
		if (p && !(p->flags & CAP_F_NET))
			p = NULL;
	} else if (!p && newstate == CAP_TCP_SYN_RECV) {
		/* A connection to a traced listener (softirq: current is unrelated). */
		u32 *owner = bpfdyno_clisten.lookup(&lkey);
		if (!owner) { /* IPv4 peer of a dual-stack listener */
			u32 v6key = ((u32)CAP_AF_INET6 << 16) | port;
			owner = bpfdyno_clisten.lookup(&v6key);
		}
		if (owner) {
			tgid = *owner;
			p = bpfdyno_ctgids.lookup(&tgid);
		}
	}
	if (!p)
		return 0;
	if (newstate == CAP_TCP_LISTEN) {
		bpfdyno_clisten.update(&lkey, &tgid);
	} else if (newstate == CAP_TCP_CLOSE) {
		if (oldstate == CAP_TCP_LISTEN)
			bpfdyno_clisten.delete(&lkey);
	} else {
		cap_remember_sock(key, tgid);
	}
	cap_emit_net(CAP_NET_STATE, sk, tgid, tid, newstate, oldstate, 0, p);
	if (newstate == CAP_TCP_CLOSE) {
		bpfdyno_csocks.delete(&key);
		bpfdyno_ctcp.delete(&key);
	}
	return 0;
}

/* TP_PROTO(const struct sock *sk, const struct sk_buff *skb[, int err]): softirq/timer. */
int bpfdyno_cretx(struct bpf_raw_tracepoint_args *ctx)
{
	struct sock *sk = (struct sock *)ctx->args[0];
	s32 err = 0;
#ifdef CAP_RETX_HAS_ERR
	err = (s32)ctx->args[2];
	if (err)
		return 0; /* not sent (e.g. the previous copy is still queued): not on the wire */
#endif
	u32 tgid = 0;
	struct cap_proc *p = cap_sock_owner((u64)sk, &tgid);
	if (p)
		cap_emit_net(CAP_NET_RETRANSMIT, sk, tgid, 0, cap_sock_state(sk), 0, err, p);
	return 0;
}

/* TP_PROTO(const struct sock *sk, const struct sk_buff *skb[, enum sk_rst_reason reason]);
 * sk is NULL for a reset answering a packet that matched no socket. */
int bpfdyno_crstsnd(struct bpf_raw_tracepoint_args *ctx)
{
	struct sock *sk = (struct sock *)ctx->args[0];
	if (!sk)
		return 0;
	s32 reason = 0;
#ifdef CAP_RST_HAS_REASON
	reason = (s32)ctx->args[2];
#endif
	u32 tgid = 0;
	struct cap_proc *p = cap_sock_owner((u64)sk, &tgid);
	if (p)
		cap_emit_net(CAP_NET_RESET_SENT, sk, tgid, 0, cap_sock_state(sk), 0, reason, p);
	return 0;
}

/* TP_PROTO(struct sock *sk) */
int bpfdyno_crstrcv(struct bpf_raw_tracepoint_args *ctx)
{
	struct sock *sk = (struct sock *)ctx->args[0];
	u32 tgid = 0;
	struct cap_proc *p = cap_sock_owner((u64)sk, &tgid);
	if (p)
		cap_emit_net(CAP_NET_RESET_RECEIVED, sk, tgid, 0, cap_sock_state(sk), 0, 0, p);
	return 0;
}

/* TP_PROTO(struct sk_buff *skb, void *location[, enum skb_drop_reason reason
 *          [, struct sock *rx_sk]]): a packet freed as dropped. */
int bpfdyno_cdrop(struct bpf_raw_tracepoint_args *ctx)
{
	struct sk_buff *skb = (struct sk_buff *)ctx->args[0];
	struct sock *sk = NULL;
	bpf_probe_read_kernel(&sk, sizeof(sk), &skb->sk);
#ifdef CAP_DROP_HAS_RXSK
	if (!sk)
		sk = (struct sock *)ctx->args[3]; /* a received packet not yet owned by it */
#endif
	if (!sk)
		return 0;
	s32 reason = 0;
#ifdef CAP_DROP_HAS_REASON
	reason = (s32)ctx->args[2];
#endif
	u32 tgid = 0;
	struct cap_proc *p = cap_sock_owner((u64)sk, &tgid);
	if (p)
		cap_emit_net(CAP_NET_DROP, sk, tgid, 0, cap_sock_state(sk), 0, reason, p);
	return 0;
}

/* ---- scheduler ---------------------------------------------------------------------- */

/* The system call current is in (its number), or -1 (none, e.g. a page fault; or unknown). */
static __always_inline s32 cap_current_syscall(void)
{
#ifdef CAP_SYSCALL_REGS
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	void *stack = NULL;
	bpf_probe_read_kernel(&stack, sizeof(stack), &task->stack);
	if (!stack)
		return -1;
	struct pt_regs *regs = (struct pt_regs *)((char *)stack + CAP_THREAD_SIZE) - 1;
	long nr = -1;
	bpf_probe_read_kernel(&nr, sizeof(nr), &regs->orig_ax);
	return (s32)nr;
#else
	return -1;
#endif
}

/* The traced process a record of process tgid (entry p) belongs to: itself, or its parent for
 * a child (CAP_F_CHILD); and that process's entry, where the counters go (NULL: gone). */
static __always_inline struct cap_proc *cap_owner(struct cap_proc *p, u32 tgid, u32 *owner)
{
	if (!(p->flags & CAP_F_CHILD)) {
		*owner = tgid;
		return p;
	}
	*owner = p->parent;
	return bpfdyno_ctgids.lookup(owner);
}

/* TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next,
 *          unsigned int prev_state) since 5.18 */
int bpfdyno_cswitch(struct bpf_raw_tracepoint_args *ctx)
{
	bool preempt = (bool)ctx->args[0];
	struct task_struct *next = (struct task_struct *)ctx->args[2];
#if LINUX_VERSION_CODE >= KERNEL_VERSION(5, 18, 0)
	u32 prev_state = (u32)ctx->args[3];
#else
	u32 prev_state = 0;
	bpf_probe_read_kernel(&prev_state, sizeof(prev_state),
			      &((struct task_struct *)ctx->args[1])->__state);
#endif
	u64 now = 0;
	u32 zero = 0;
	u32 *genp = bpfdyno_cgen.lookup(&zero);
	u32 gen = genp ? *genp : 0;
	/* prev is current: its ids come without reading task_struct. */
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32, tid = (u32)id;
	struct cap_proc *pp = tid ? bpfdyno_ctgids.lookup(&tgid) : NULL;
	if (pp && (pp->flags & CAP_F_SCHED) && !(prev_state & CAP_TASK_DEAD)) {
		now = bpf_ktime_get_ns();
		u32 state = (preempt || prev_state == CAP_TASK_RUNNING) ? 0 : prev_state;
		/* Preempted too: inside a system call (a long read filling the page cache) or
		 * not (negative: an interrupt's frame, in user mode). */
		s32 syscall = cap_current_syscall();
		struct task_struct *prev = (struct task_struct *)ctx->args[1];
		u64 utime = 0, stime = 0;
		bpf_probe_read_kernel(&utime, sizeof(utime), &prev->utime);
		bpf_probe_read_kernel(&stime, sizeof(stime), &prev->stime);
		struct cap_thread *th = bpfdyno_cthread.lookup(&tid);
		if (th) {
			th->off_ns = now;
			th->wake_ns = 0;
			th->state = state;
			th->syscall = syscall;
			th->gen = gen;
			th->waker_tgid = 0;
			th->waker_tid = 0;
			th->utime_ns = utime;
			th->stime_ns = stime;
		} else {
			struct cap_thread fresh = {};
			fresh.off_ns = now;
			fresh.utime_ns = utime;
			fresh.stime_ns = stime;
			fresh.tgid = tgid;
			fresh.state = state;
			fresh.syscall = syscall;
			fresh.gen = gen;
			if (bpfdyno_cthread.update(&tid, &fresh))
				cap_count(CAP_C_THREAD_FULL);
		}
	}

	u32 ntgid = 0;
	bpf_probe_read_kernel(&ntgid, sizeof(ntgid), &next->tgid);
	struct cap_proc *np = bpfdyno_ctgids.lookup(&ntgid);
	if (!np || !(np->flags & CAP_F_SCHED))
		return 0;
	u32 ntid = 0;
	bpf_probe_read_kernel(&ntid, sizeof(ntid), &next->pid);
	struct cap_thread *th = bpfdyno_cthread.lookup(&ntid);
	if (!th || !th->off_ns)
		return 0; /* first seen now: when it went off-CPU is unknown */
	if (th->gen != gen) { /* switched out before a gap: when it came back is unknown */
		th->off_ns = 0;
		th->wake_ns = 0;
		return 0;
	}
	u32 owner = 0;
	struct cap_proc *p = cap_owner(np, ntgid, &owner);
	if (!p) { /* a child whose parent is no longer traced: user space removes it */
		th->off_ns = 0;
		th->wake_ns = 0;
		return 0;
	}
	if (!now)
		now = bpf_ktime_get_ns();
	u64 off = now - th->off_ns;
	if (off < CAP_MIN_OFFCPU_NS) {
		__sync_fetch_and_add(&p->short_count, 1);
		__sync_fetch_and_add(&p->short_ns, off);
	} else {
		struct cap_offcpu *e = cap_reserve_sched();
		if (e) {
			e->off_ns = th->off_ns;
			e->wake_ns = th->wake_ns;
			e->on_ns = now;
			e->tgid = owner;
			e->tid = ntid;
			e->state = th->state;
			e->cpu = bpf_get_smp_processor_id();
			e->syscall = th->syscall;
			e->pid = ntgid;
			bpf_probe_read_kernel(&e->comm, sizeof(e->comm), &next->comm);
			/* prev (current) held this CPU until now: unless it is the idle task, the
			 * thread waited for it (helpers only: no task_struct read). */
			e->held_tgid = tgid;
			e->held_tid = tid;
			if (tid)
				bpf_get_current_comm(&e->held_comm, sizeof(e->held_comm));
			else
				__builtin_memset(&e->held_comm, 0, sizeof(e->held_comm));
			e->waker_tgid = th->wake_ns ? th->waker_tgid : 0;
			e->waker_tid = th->wake_ns ? th->waker_tid : 0;
			e->utime_ns = th->utime_ns;
			e->stime_ns = th->stime_ns;
			bpfdyno_csched.ringbuf_submit(e, BPFDYNO_RB_NO_WAKEUP);
			__sync_fetch_and_add(&p->offcpu, 1);
		} else {
			cap_count(CAP_C_SCHED_LOST);
			__sync_fetch_and_add(&p->offcpu_lost, 1);
		}
	}
	th->off_ns = 0;
	th->wake_ns = 0;
	return 0;
}

/* TP_PROTO(struct task_struct *p): a blocked thread is being woken, in the waker's context
 * (sched_waking; sched_wakeup may run later on the woken thread's CPU, where current is
 * someone else): when, and by whom. */
int bpfdyno_cwaking(struct bpf_raw_tracepoint_args *ctx)
{
	struct task_struct *task = (struct task_struct *)ctx->args[0];
	u32 tgid = 0;
	bpf_probe_read_kernel(&tgid, sizeof(tgid), &task->tgid);
	struct cap_proc *p = bpfdyno_ctgids.lookup(&tgid);
	if (!p || !(p->flags & CAP_F_SCHED))
		return 0;
	u32 tid = 0;
	bpf_probe_read_kernel(&tid, sizeof(tid), &task->pid);
	struct cap_thread *th = bpfdyno_cthread.lookup(&tid);
	if (th && th->off_ns && !th->wake_ns) {
		u64 id = bpf_get_current_pid_tgid();
		th->wake_ns = bpf_ktime_get_ns();
		th->waker_tgid = id >> 32;
		th->waker_tid = (u32)id;
	}
	return 0;
}

/* TP_PROTO(struct task_struct *parent, struct task_struct *child), in the parent's context:
 * a traced process (not itself a child) forked a process: record that child's threads too,
 * as part of the parent's capture. Threads (child->tgid == parent's) are not new processes. */
int bpfdyno_cfork(struct bpf_raw_tracepoint_args *ctx)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct cap_proc *p = bpfdyno_ctgids.lookup(&tgid);
	if (!p || !(p->flags & CAP_F_SCHED) || (p->flags & CAP_F_CHILD))
		return 0;
	struct task_struct *child = (struct task_struct *)ctx->args[1];
	u32 cpid = 0, ctgid = 0;
	bpf_probe_read_kernel(&cpid, sizeof(cpid), &child->pid);
	bpf_probe_read_kernel(&ctgid, sizeof(ctgid), &child->tgid);
	if (cpid != ctgid || ctgid == tgid)
		return 0;
	struct cap_proc fresh = {};
	fresh.flags = CAP_F_SCHED | CAP_F_CHILD;
	fresh.parent = tgid;
	/* Not over an entry of its own (a child traced in its own right keeps it). */
	if (bpfdyno_ctgids.insert(&ctgid, &fresh) && !bpfdyno_ctgids.lookup(&ctgid))
		cap_count(CAP_C_CHILD_FULL);
	return 0;
}

/* TP_PROTO(struct task_struct *p[, bool group_dead]), in the exiting task's context: a child
 * process whose main thread exits leaves the map (workers come and go each epoch). */
int bpfdyno_cexit(struct bpf_raw_tracepoint_args *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;
	if (tgid != (u32)id)
		return 0;
	struct cap_proc *p = bpfdyno_ctgids.lookup(&tgid);
	if (p && (p->flags & CAP_F_CHILD))
		bpfdyno_ctgids.delete(&tgid);
	return 0;
}

/* mm_vmscan_memcg_reclaim_begin / mm_vmscan_direct_reclaim_begin, in the reclaiming task's
 * context: a traced thread charged a page over its cgroup's limit (or found the node short)
 * and reclaims on its own CPU. Its time there is the limit's, not its work's. */
int bpfdyno_creclaimin(struct bpf_raw_tracepoint_args *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32, tid = (u32)id;
	struct cap_proc *p = bpfdyno_ctgids.lookup(&tgid);
	if (!p || !(p->flags & CAP_F_SCHED))
		return 0;
	u64 now = bpf_ktime_get_ns();
	if (bpfdyno_creclaim.update(&tid, &now))
		cap_count(CAP_C_THREAD_FULL);
	return 0;
}

/* mm_vmscan_memcg_reclaim_end / mm_vmscan_direct_reclaim_end: the reclaim of a traced thread
 * is over; one record of it (CAP_STATE_RECLAIM). */
int bpfdyno_creclaimout(struct bpf_raw_tracepoint_args *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32, tid = (u32)id;
	u64 *start = bpfdyno_creclaim.lookup(&tid);
	if (!start)
		return 0;
	u64 began = *start;
	bpfdyno_creclaim.delete(&tid);
	struct cap_proc *pp = bpfdyno_ctgids.lookup(&tgid);
	if (!pp)
		return 0;
	u32 owner = 0;
	struct cap_proc *p = cap_owner(pp, tgid, &owner);
	if (!p)
		return 0;
	struct cap_offcpu *e = cap_reserve_sched();
	if (!e) {
		cap_count(CAP_C_SCHED_LOST);
		__sync_fetch_and_add(&p->offcpu_lost, 1);
		return 0;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->off_ns = began;
	e->on_ns = bpf_ktime_get_ns();
	e->tgid = owner;
	e->tid = tid;
	e->state = CAP_STATE_RECLAIM;
	e->cpu = bpf_get_smp_processor_id();
	e->syscall = cap_current_syscall();
	e->pid = tgid;
	bpf_get_current_comm(&e->comm, sizeof(e->comm));
	bpfdyno_csched.ringbuf_submit(e, BPFDYNO_RB_NO_WAKEUP);
	__sync_fetch_and_add(&p->offcpu, 1);
	return 0;
}
