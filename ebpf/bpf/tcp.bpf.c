// SPDX-License-Identifier: GPL-2.0-only
/*
 * pstack TCP programs: retransmits, resets (both directions) and state
 * changes, one compact record each (struct pstack_tcp_event) into EVENTS.
 *
 * CO-RE: tracepoint layouts differ across kernels. tcp_send_reset has its
 * own sockaddr-image layout on 6.10+ and the tcp_event_sk_skb layout before;
 * tcp_retransmit_skb gained `err`; tcp_receive_reset gained `sock_cookie`.
 * Each is guarded with bpf_core_type_exists / bpf_core_field_exists and the
 * layout found is recorded in the event (`layout`).
 *
 * Port filter: a range [filter_port_lo, filter_port_hi] (inclusive; a single
 * port is lo == hi; lo == 0 means any port), matched against either end, so
 * only watched ports cost a record.
 *
 * Per record with a full socket: snd_wnd / rcv_wnd (PSTACK_TCP_HAS_WND). Per
 * retransmit: icsk_ca_state (CO-RE bitfield); TCP_CA_Loss marks it
 * PSTACK_TCP_RTO (the RTO timer's retransmit, not fast retransmit).
 *
 * Bounded: EVENTS has a fixed size set by the loader; a failed reserve is
 * counted in COUNTERS (lost), never silent. The on-CPU pid/comm is NOT the
 * socket owner in softirq/timer context (retransmit timers run as swapper/N).
 *
 * Three modes (read-only flags set at load):
 * - count_only: a per-CPU counter per kind and nothing else (pstackd);
 * - per_event (debug): one pstack_tcp_event per event, as above;
 * - aggregated (neither flag): each event is folded into its socket's entry
 *   of FLOWS (an LRU hash keyed by the socket's address: counts, bytes,
 *   first/last time, the first transitions). Records are sent only for
 *   decisive rare events (every reset, a flow leaving ESTABLISHED, the first
 *   retransmit of a flow: PSTACK_TCP_RARE), for a uniform sample of the rest
 *   (each chosen with probability 1/sample_one_in: PSTACK_TCP_SAMPLED), and
 *   one pstack_tcp_flow record when a flow reaches CLOSE (its entry is then
 *   deleted, so the map holds live flows only). An event no entry took
 *   (no socket, a socket already closed, the map refused) is sent with
 *   PSTACK_TCP_UNAGG and counted by user space. Every choice and every
 *   refusal is counted in COUNTERS.
 *
 * Why an LRU hash and not socket-local storage (issue 31, measured on 6.18):
 * BTF tracepoints may call bpf_sk_storage_get (classic ones may not), but
 * creating a socket's storage alone costs more than this whole path, and a
 * flood of short connections creates one per ~4 events. It is cheaper only
 * on long-lived sockets (a retransmit storm). See BENCHMARKS.md, "eBPF
 * recording redesign", and bench/ebpf/sk-storage-experiment.patch.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "pstack_events.h"

char LICENSE[] SEC("license") = "GPL";

/* Set by the loader before load (aya override_global). */
const volatile __u16 filter_port_lo = 0; /* 0 = any; else sport or dport in [lo, hi] */
const volatile __u16 filter_port_hi = 0;
const volatile __u64 wakeup_bytes = 0;  /* wake the reader only past this backlog */
/* 1: count events per kind and emit no record (pstackd's always-attached
 * mode, whose only output is the counters): no ring-buffer reservation, no
 * probe reads, just the per-CPU counter. */
const volatile __u8 count_only = 0;
/* 1: a record per event (the debug mode the aggregated mode is checked against). */
const volatile __u8 per_event = 0;
/* Aggregated mode: each ordinary event is sampled with probability 1/sample_one_in (0: none). */
const volatile __u32 sample_one_in = 64;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} EVENTS SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PSTACK_TCP_COUNTER_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} COUNTERS SEC(".maps");

/* Per-CPU LRU lists (BPF_F_NO_COMMON_LRU): creating an entry takes no global lock. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct pstack_tcp_flow);
} FLOWS SEC(".maps");

/* Pre-6.10 layout shared by tcp_send_reset and tcp_retransmit_skb. */
struct trace_event_raw_tcp_event_sk_skb___old {
	const void *skbaddr;
	const void *skaddr;
	int state;
	__u16 sport;
	__u16 dport;
	__u16 family;
	__u8 saddr[4];
	__u8 daddr[4];
	__u8 saddr_v6[16];
	__u8 daddr_v6[16];
} __attribute__((preserve_access_index));

static __always_inline void count(__u32 slot)
{
	__u64 *v = bpf_map_lookup_elem(&COUNTERS, &slot);
	if (v)
		*v += 1;
}

static __always_inline int port_filtered(__u16 sport, __u16 dport)
{
	if (filter_port_lo == 0)
		return 0;
	if (sport >= filter_port_lo && sport <= filter_port_hi)
		return 0;
	if (dport >= filter_port_lo && dport <= filter_port_hi)
		return 0;
	return 1;
}

/* Count-only without a port filter needs nothing from the event: count it
 * first thing, before any field or probe read. Both flags are read-only
 * data, so the verifier drops whichever path is dead. */
static __always_inline int counted_only(__u8 kind)
{
	if (count_only && filter_port_lo == 0) {
		count(2 * kind);
		return 1;
	}
	return 0;
}

/* Wake the reader once, when the backlog crosses wakeup_bytes; below it (and
 * while a woken reader catches up) stay quiet: the reader also polls on a
 * tick. A wakeup per event under a flood costs more than the event itself. */
static __always_inline __u64 wake_flag(void)
{
	if (wakeup_bytes == 0)
		return 0;
	__u64 avail = bpf_ringbuf_query(&EVENTS, BPF_RB_AVAIL_DATA);
	if (avail >= wakeup_bytes && avail < wakeup_bytes + sizeof(struct pstack_tcp_event))
		return BPF_RB_FORCE_WAKEUP;
	return BPF_RB_NO_WAKEUP;
}

/* Count one event that passed the port filter; 1 when nothing more is to be done. */
static __always_inline int seen(__u8 kind)
{
	count(2 * kind);
	return count_only;
}

static __always_inline struct pstack_tcp_event *reserve(__u8 kind, __u8 flags)
{
	struct pstack_tcp_event *e = bpf_ringbuf_reserve(&EVENTS, sizeof(*e), 0);
	if (!e) {
		count(2 * kind + 1);
		return 0;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->sock_cookie = 0;
	e->netns_cookie = 0;
	e->netns_ino = 0;
	e->pid = bpf_get_current_pid_tgid() >> 32;
	e->kind = kind;
	e->family = 0;
	e->state = 0;
	e->newstate = 0;
	e->sport = 0;
	e->dport = 0;
	__builtin_memset(e->saddr, 0, sizeof(e->saddr));
	__builtin_memset(e->daddr, 0, sizeof(e->daddr));
	e->detail = 0;
	e->layout = 0;
	e->flags = flags;
	e->ca_state = 0;
	e->_pad = 0;
	e->sk_key = 0;
	e->snd_wnd = 0;
	e->rcv_wnd = 0;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	return e;
}


/* ---- aggregated mode ---- */

#define EMIT_NONE 0
#define EMIT_RARE PSTACK_TCP_RARE
#define EMIT_SAMPLED PSTACK_TCP_SAMPLED
#define EMIT_UNAGG PSTACK_TCP_UNAGG

/* An ordinary event: sampled with probability 1/sample_one_in, else nothing. */
static __always_inline __u8 sample_or_none(__u8 kind)
{
	if (sample_one_in == 0 || bpf_get_prandom_u32() % sample_one_in != 0)
		return EMIT_NONE;
	count(PSTACK_TCP_SLOT_SAMPLED(kind));
	return EMIT_SAMPLED;
}

static __always_inline __u8 rare(__u8 kind, __u8 more)
{
	count(PSTACK_TCP_SLOT_RARE(kind));
	return EMIT_RARE | more;
}

/* The socket's live entry, created when absent and `create`. NULL: no entry
 * (and, when one was wanted, the refusal is counted). A DEAD entry (its flow
 * was sent at CLOSE) is no entry; a new socket at that address takes it over
 * in place, which spares a map update and a delete per flow (freed socket
 * memory is reused at once under short-connection floods). */
static __always_inline struct pstack_tcp_flow *flow_of(const void *sk, __u64 now, int create)
{
	__u64 key = (__u64)sk;
	struct pstack_tcp_flow *f = bpf_map_lookup_elem(&FLOWS, &key);
	if (f) {
		if (!(f->flags & PSTACK_FLOW_DEAD))
			return f;
		if (!create)
			return 0;
		__builtin_memset(f, 0, sizeof(*f));
		f->first_ns = now;
		f->sk_key = key;
		return f;
	}
	if (!create)
		return 0;
	struct pstack_tcp_flow init = {};
	init.first_ns = now;
	init.sk_key = key;
	bpf_map_update_elem(&FLOWS, &key, &init, BPF_NOEXIST);
	f = bpf_map_lookup_elem(&FLOWS, &key);
	if (!f)
		count(PSTACK_TCP_SLOT_FLOW_MAP_FULL);
	return f;
}

/* Namespace of a new entry: read once. */
static __always_inline void flow_ids(struct pstack_tcp_flow *f, const struct sock *sk)
{
	if (!f->netns_ino) {
		struct net *net = BPF_CORE_READ(sk, __sk_common.skc_net.net);
		if (net) {
			f->netns_ino = BPF_CORE_READ(net, ns.inum);
			if (bpf_core_field_exists(net->net_cookie))
				bpf_core_read(&f->netns_cookie, sizeof(f->netns_cookie), &net->net_cookie);
		}
	}
}

/* The socket cookie, until the kernel has generated one (sock_diag, SO_COOKIE):
 * read at resets, retransmits and CLOSE, not on every state change. */
static __always_inline void flow_cookie(struct pstack_tcp_flow *f, const struct sock *sk)
{
	if (!f->sock_cookie)
		bpf_core_read(&f->sock_cookie, sizeof(f->sock_cookie), &sk->__sk_common.skc_cookie);
}

/* The flow's endpoints from this event until both ports are known (a client's
 * first transition has no local port yet; a listener never has a remote one). */
#define flow_tuple(f, tp, sport_, dport_)                                        \
	do {                                                                    \
		if (!((f)->flags & PSTACK_FLOW_TUPLE)) {                        \
			(f)->sport = (sport_);                                  \
			(f)->dport = (dport_);                                  \
			(f)->family = (tp)->family;                             \
			if ((f)->family == 10) {                                \
				__u8 both_[32];                                 \
				bpf_core_read(both_, 32, &(tp)->saddr_v6);      \
				__builtin_memcpy((f)->saddr, both_, 16);        \
				__builtin_memcpy((f)->daddr, both_ + 16, 16);   \
			} else {                                                \
				__u8 both_[8];                                  \
				bpf_core_read(both_, 8, &(tp)->saddr);          \
				__builtin_memcpy((f)->saddr, both_, 4);         \
				__builtin_memcpy((f)->daddr, both_ + 4, 4);     \
			}                                                       \
			(f)->flags |= ((sport_) && (dport_)) ? PSTACK_FLOW_TUPLE \
							     : PSTACK_FLOW_PARTIAL; \
		}                                                               \
	} while (0)

static __always_inline void flow_bytes(struct pstack_tcp_flow *f, const void *skaddr)
{
	const struct tcp_sock *tp = skaddr;
	f->bytes_acked = BPF_CORE_READ(tp, bytes_acked);
	f->bytes_received = BPF_CORE_READ(tp, bytes_received);
	f->flags |= PSTACK_FLOW_BYTES;
}

/* A flow reached CLOSE: send its aggregate and mark the entry DEAD (user
 * space skips it when reading the map; the next socket at the address reuses it). */
static __always_inline void flow_end(struct pstack_tcp_flow *f, const void *sk)
{
	flow_cookie(f, sk);
	if (bpf_ringbuf_output(&EVENTS, f, sizeof(*f), wake_flag()) == 0)
		count(PSTACK_TCP_SLOT_FLOW_EMITTED);
	else
		count(PSTACK_TCP_SLOT_FLOW_LOST);
	f->flags |= PSTACK_FLOW_DEAD;
}

/* Fold a state change; what to send. */
static __always_inline __u8 agg_state(struct trace_event_raw_inet_sock_set_state *tp, const void *sk,
				      __u16 sport, __u16 dport, struct pstack_tcp_flow **out)
{
	__u8 oldstate = tp->oldstate, newstate = tp->newstate;
	if (!sk)
		return rare(PSTACK_TCP_STATE, EMIT_UNAGG);
	__u64 now = bpf_ktime_get_ns();
	struct pstack_tcp_flow *f = flow_of(sk, now, 1);
	if (!f)
		return rare(PSTACK_TCP_STATE, EMIT_UNAGG);
	*out = f;
	f->last_ns = now;
	flow_tuple(f, tp, sport, dport);
	flow_ids(f, sk);
	/* State changes run under the socket lock: a plain add, and the slot is this event's. */
	__u32 i = f->state_changes;
	f->state_changes = i + 1;
	if (i < PSTACK_TCP_FLOW_TRANSITIONS) {
		f->trans_ns[i] = now;
		f->trans_from[i] = oldstate;
		f->trans_to[i] = newstate;
	}
	f->state = newstate;
	/* The socket still has its old state: a full tcp_sock unless TIME_WAIT / NEW_SYN_RECV. */
	int full = oldstate != 6 && oldstate != 12 && oldstate != 0;
	__u8 emit = EMIT_NONE;
	if (oldstate == 1 /* ESTABLISHED */)
		emit = rare(PSTACK_TCP_STATE, 0);
	if (newstate == 7 /* CLOSE */) {
		/* Bytes once per flow, at its end (the counters are final by then). */
		if (full)
			flow_bytes(f, sk);
		/* Straight from ESTABLISHED to CLOSE (an abort, a RST either way):
		 * the flow record is also that rare event's record (its last kept
		 * transition), so no second record is sent. */
		if (emit == EMIT_RARE)
			f->flags |= PSTACK_FLOW_LEFT_EST;
		flow_end(f, sk);
		if (emit == EMIT_RARE)
			return EMIT_NONE;
	}
	if (emit == EMIT_NONE)
		emit = sample_or_none(PSTACK_TCP_STATE);
	return emit;
}

/* Fold a retransmit (ca_state already read); what to send. */
static __always_inline __u8 agg_retransmit(struct pstack_tcp_flow *f, __u8 ca_state, __u64 now)
{
	f->last_ns = now;
	/* Read, then add (see agg_state): two CPUs racing on a flow's first
	 * retransmit can both see 0 and both send it — one record too many, never one too few. */
	__u32 n = f->retransmits;
	__sync_fetch_and_add(&f->retransmits, 1);
	if (ca_state == PSTACK_TCP_CA_LOSS)
		__sync_fetch_and_add(&f->rtos, 1);
	else if (ca_state == 3 /* TCP_CA_Recovery */)
		__sync_fetch_and_add(&f->recovery, 1);
	else
		__sync_fetch_and_add(&f->other_retrans, 1);
	if (n == 0)
		return rare(PSTACK_TCP_RETRANSMIT, 0);
	return sample_or_none(PSTACK_TCP_RETRANSMIT);
}

/* Fold a reset on a socket in `state` (always sent). A socket already in
 * CLOSE has no entry (its aggregate was sent at CLOSE): the record carries
 * the count (UNAGG). */
static __always_inline __u8 agg_reset(__u8 kind, const void *sk, __u8 state, int reason_set,
				      __s32 reason, struct pstack_tcp_flow **out)
{
	if (!sk)
		return rare(kind, EMIT_UNAGG);
	__u64 now = bpf_ktime_get_ns();
	struct pstack_tcp_flow *f = flow_of(sk, now, state != 7);
	if (!f)
		return rare(kind, EMIT_UNAGG);
	*out = f;
	f->last_ns = now;
	flow_ids(f, sk);
	flow_cookie(f, sk);
	if (kind == PSTACK_TCP_SEND_RESET) {
		__sync_fetch_and_add(&f->resets_sent, 1);
		if (reason_set) {
			f->last_reset_reason = reason;
			f->flags |= PSTACK_FLOW_REASON;
		}
	} else {
		__sync_fetch_and_add(&f->resets_received, 1);
	}
	return rare(kind, 0);
}

/* Aggregated mode: a record's socket ids from its flow (already read once),
 * instead of three or four probe reads; such records carry no windows. */
static __always_inline void ids_from_flow(struct pstack_tcp_event *e, const struct pstack_tcp_flow *f)
{
	e->flags |= PSTACK_TCP_HAS_SOCK;
	e->sk_key = f->sk_key;
	e->netns_ino = f->netns_ino;
	e->netns_cookie = f->netns_cookie;
	e->sock_cookie = f->sock_cookie;
}

/* Namespace and cookie of a socket (kernel pointer from the tracepoint).
 * `netns_cookie_too`: also the netns cookie (one more probe read) — done for
 * retransmits and resets, skipped for the far more frequent state changes,
 * which carry the netns inode only. */
static __always_inline void sock_ids(struct pstack_tcp_event *e, const void *skaddr, int cookie_too,
				     int netns_cookie_too)
{
	const struct sock *sk = skaddr;
	if (!sk)
		return;
	e->flags |= PSTACK_TCP_HAS_SOCK;
	e->sk_key = (__u64)sk;
	struct net *net = BPF_CORE_READ(sk, __sk_common.skc_net.net);
	if (net) {
		e->netns_ino = BPF_CORE_READ(net, ns.inum);
		if (netns_cookie_too && bpf_core_field_exists(net->net_cookie))
			bpf_core_read(&e->netns_cookie, sizeof(e->netns_cookie), &net->net_cookie);
	}
	if (cookie_too)
		bpf_core_read(&e->sock_cookie, sizeof(e->sock_cookie), &sk->__sk_common.skc_cookie);
}

/* Send and receive windows of a full TCP socket in `state` (the socket's
 * state at the event). Time-wait and request sockets (and an unknown state)
 * are not a struct tcp_sock: nothing is read. Two probe reads. */
static __always_inline void sock_windows(struct pstack_tcp_event *e, const void *skaddr, __u8 state)
{
	const struct tcp_sock *tp = skaddr;
	if (!tp || state == 0 || state == 6 /* TIME_WAIT */ || state == 12 /* NEW_SYN_RECV */)
		return;
	e->snd_wnd = BPF_CORE_READ(tp, snd_wnd);
	e->rcv_wnd = BPF_CORE_READ(tp, rcv_wnd);
	e->flags |= PSTACK_TCP_HAS_WND;
}

/* A retransmit's congestion-avoidance state: TCP_CA_Loss means the RTO timer
 * fired (tcp_enter_loss), as opposed to fast retransmit (TCP_CA_Recovery). */
static __always_inline void retransmit_ca(struct pstack_tcp_event *e, const void *skaddr)
{
	const struct inet_connection_sock *icsk = skaddr;
	if (!icsk)
		return;
	e->ca_state = BPF_CORE_READ_BITFIELD_PROBED(icsk, icsk_ca_state);
	if (e->ca_state == PSTACK_TCP_CA_LOSS)
		e->flags |= PSTACK_TCP_RTO;
}

/* Namespace of a RST sent without a socket: the device the answered packet
 * arrived on (skb->dev->nd_net). Rare path; three probe reads. */
static __always_inline void skb_netns(struct pstack_tcp_event *e, const void *skbaddr)
{
	const struct sk_buff *skb = skbaddr;
	if (!skb)
		return;
	struct net_device *dev = BPF_CORE_READ(skb, dev);
	if (!dev)
		return;
	struct net *net = BPF_CORE_READ(dev, nd_net.net);
	if (!net)
		return;
	e->netns_ino = BPF_CORE_READ(net, ns.inum);
	if (bpf_core_field_exists(net->net_cookie))
		bpf_core_read(&e->netns_cookie, sizeof(e->netns_cookie), &net->net_cookie);
}

/* Address arrays are read with one CO-RE probe read per event: direct
 * element loads would be pointer arithmetic on ctx, which the verifier
 * refuses. saddr/daddr (and saddr_v6/daddr_v6) are adjacent in every layout
 * these programs accept, so one read covers both. */
#define copy_addrs(e, tp)                                                       \
	do {                                                                    \
		(e)->family = (tp)->family;                                     \
		if ((e)->family == 10 /* AF_INET6 */) {                         \
			__u8 both_[32];                                         \
			bpf_core_read(both_, 32, &(tp)->saddr_v6);              \
			__builtin_memcpy((e)->saddr, both_, 16);                \
			__builtin_memcpy((e)->daddr, both_ + 16, 16);           \
		} else {                                                        \
			__u8 both_[8];                                          \
			bpf_core_read(both_, 8, &(tp)->saddr);                  \
			__builtin_memcpy((e)->saddr, both_, 4);                 \
			__builtin_memcpy((e)->daddr, both_ + 4, 4);             \
		}                                                               \
	} while (0)

/* icsk_ca_state of a socket (CO-RE bitfield). */
static __always_inline __u8 ca_of(const void *skaddr)
{
	const struct inet_connection_sock *icsk = skaddr;
	return BPF_CORE_READ_BITFIELD_PROBED(icsk, icsk_ca_state);
}

/* Aggregated mode: fold a retransmit into `flags_` (0: send nothing). */
#define agg_retransmit_tp(tp, sk, sport, dport, flags_)                         \
	do {                                                                    \
		if (!(sk)) {                                                    \
			flags_ = rare(PSTACK_TCP_RETRANSMIT, EMIT_UNAGG);       \
		} else {                                                        \
			__u64 now_ = bpf_ktime_get_ns();                        \
			struct pstack_tcp_flow *f_ = flow_of((sk), now_, 1);    \
			if (!f_) {                                              \
				flags_ = rare(PSTACK_TCP_RETRANSMIT, EMIT_UNAGG); \
			} else {                                                \
				flow_tuple(f_, tp, sport, dport);               \
				flow_ids(f_, (sk));                             \
				flow_cookie(f_, (sk));                          \
				flags_ = agg_retransmit(f_, ca_of(sk), now_);   \
			}                                                       \
		}                                                               \
	} while (0)

SEC("tracepoint/tcp/tcp_retransmit_skb")
int pstack_tcp_retransmit(void *ctx)
{
	struct pstack_tcp_event *e;
	__u8 flags = 0;

	if (counted_only(PSTACK_TCP_RETRANSMIT))
		return 0;

	if (bpf_core_type_exists(struct trace_event_raw_tcp_retransmit_skb)) {
		struct trace_event_raw_tcp_retransmit_skb *tp = ctx;
		__u16 sport = tp->sport, dport = tp->dport;
		if (port_filtered(sport, dport))
			return 0;
		if (seen(PSTACK_TCP_RETRANSMIT))
			return 0;
		/* One ctx load: reusing tp->skaddr makes clang re-derive ctx+off, which the verifier refuses. */
		const void *sk = tp->skaddr;
		if (!per_event) {
			agg_retransmit_tp(tp, sk, sport, dport, flags);
			if (!flags)
				return 0;
		}
		e = reserve(PSTACK_TCP_RETRANSMIT, flags);
		if (!e)
			return 0;
		e->sport = sport;
		e->dport = dport;
		e->state = tp->state;
		copy_addrs(e, tp);
		if (bpf_core_field_exists(tp->err)) {
			e->detail = BPF_CORE_READ(tp, err);
			e->layout |= PSTACK_LAYOUT_RETRANSMIT_ERR;
		}
		sock_ids(e, sk, 1, 1);
		sock_windows(e, sk, e->state);
		retransmit_ca(e, sk);
	} else {
		struct trace_event_raw_tcp_event_sk_skb___old *tp = ctx;
		__u16 sport = tp->sport, dport = tp->dport;
		if (port_filtered(sport, dport))
			return 0;
		if (seen(PSTACK_TCP_RETRANSMIT))
			return 0;
		const void *sk = tp->skaddr;
		if (!per_event) {
			agg_retransmit_tp(tp, sk, sport, dport, flags);
			if (!flags)
				return 0;
		}
		e = reserve(PSTACK_TCP_RETRANSMIT, flags);
		if (!e)
			return 0;
		e->sport = sport;
		e->dport = dport;
		e->state = tp->state;
		copy_addrs(e, tp);
		sock_ids(e, sk, 1, 1);
		sock_windows(e, sk, e->state);
		retransmit_ca(e, sk);
	}
	bpf_ringbuf_submit(e, wake_flag());
	return 0;
}

SEC("tracepoint/tcp/tcp_receive_reset")
int pstack_tcp_receive_reset(struct trace_event_raw_tcp_event_sk *tp)
{
	if (counted_only(PSTACK_TCP_RECV_RESET))
		return 0;
	__u16 sport = tp->sport, dport = tp->dport;
	if (port_filtered(sport, dport))
		return 0;
	if (seen(PSTACK_TCP_RECV_RESET))
		return 0;
	const struct sock *sk = tp->skaddr;
	__u8 flags = 0;
	struct pstack_tcp_flow *f = 0;
	__u8 state = 0;
	if (!per_event) {
		state = sk ? BPF_CORE_READ(sk, __sk_common.skc_state) : 0;
		flags = agg_reset(PSTACK_TCP_RECV_RESET, sk, state, 0, 0, &f);
	}
	struct pstack_tcp_event *e = reserve(PSTACK_TCP_RECV_RESET, flags);
	if (!e)
		return 0;
	/* saddr/sport: this (receiving) socket; daddr/dport: the peer that sent the RST. */
	e->sport = sport;
	e->dport = dport;
	copy_addrs(e, tp);
	if (f) {
		ids_from_flow(e, f);
		e->state = state;
		bpf_ringbuf_submit(e, wake_flag());
		return 0;
	}
	if (bpf_core_field_exists(tp->sock_cookie)) {
		e->sock_cookie = BPF_CORE_READ(tp, sock_cookie);
		e->layout |= PSTACK_LAYOUT_RECV_RESET_COOKIE;
		sock_ids(e, sk, 0, 1);
	} else {
		sock_ids(e, sk, 1, 1);
	}
	if (sk) {
		e->state = BPF_CORE_READ(sk, __sk_common.skc_state);
		sock_windows(e, sk, e->state);
	}
	bpf_ringbuf_submit(e, wake_flag());
	return 0;
}

/* A sockaddr image (sockaddr_in / sockaddr_in6) in a 28-byte tracepoint array. */
struct sockaddr_image {
	__u16 family;
	__u16 port_be;
	__u8 rest[24];
};

static __always_inline void from_image(const struct sockaddr_image *img, __u8 *addr, __u16 *port,
				       __u8 *family)
{
	*family = img->family;
	*port = __builtin_bswap16(img->port_be);
	if (img->family == 10) /* sockaddr_in6: flowinfo(4) then addr(16) */
		__builtin_memcpy(addr, &img->rest[4], 16);
	else /* sockaddr_in: addr(4) */
		__builtin_memcpy(addr, &img->rest[0], 4);
}

SEC("tracepoint/tcp/tcp_send_reset")
int pstack_tcp_send_reset(void *ctx)
{
	struct pstack_tcp_event *e;
	struct pstack_tcp_flow *f = 0;

	if (counted_only(PSTACK_TCP_SEND_RESET))
		return 0;

	if (bpf_core_type_exists(struct trace_event_raw_tcp_send_reset)) {
		struct trace_event_raw_tcp_send_reset *tp = ctx;
		struct sockaddr_image src = {}, dst = {};
		/* saddr is the RST's sender (this host), daddr its receiver, with or without sk. */
		BPF_CORE_READ_INTO(&src, tp, saddr);
		BPF_CORE_READ_INTO(&dst, tp, daddr);
		__u16 sport = __builtin_bswap16(src.port_be), dport = __builtin_bswap16(dst.port_be);
		if (port_filtered(sport, dport))
			return 0;
		if (seen(PSTACK_TCP_SEND_RESET))
			return 0;
		const void *sk = tp->skaddr;
		__u8 state = tp->state;
		__s32 reason = tp->reason;
		__u8 flags = 0;
		if (!per_event)
			flags = agg_reset(PSTACK_TCP_SEND_RESET, sk, state, 1, reason, &f);
		e = reserve(PSTACK_TCP_SEND_RESET, flags);
		if (!e)
			return 0;
		__u8 fam = 0;
		from_image(&src, e->saddr, &e->sport, &fam);
		from_image(&dst, e->daddr, &e->dport, &e->family);
		e->state = state;
		e->detail = reason;
		e->layout |= PSTACK_LAYOUT_SEND_RESET_SOCKADDR;
		if (f)
			ids_from_flow(e, f);
		else if (sk) {
			sock_ids(e, sk, 1, 1);
			sock_windows(e, sk, e->state);
		} else
			skb_netns(e, tp->skbaddr);
	} else {
		struct trace_event_raw_tcp_event_sk_skb___old *tp = ctx;
		__u16 sport = tp->sport, dport = tp->dport;
		if (port_filtered(sport, dport))
			return 0;
		if (seen(PSTACK_TCP_SEND_RESET))
			return 0;
		const void *sk = tp->skaddr;
		__u8 state = tp->state;
		__u8 flags = 0;
		if (!per_event)
			flags = agg_reset(PSTACK_TCP_SEND_RESET, sk, state, 0, 0, &f);
		e = reserve(PSTACK_TCP_SEND_RESET, flags);
		if (!e)
			return 0;
		e->sport = sport;
		e->dport = dport;
		e->state = state;
		copy_addrs(e, tp);
		e->layout |= PSTACK_LAYOUT_SEND_RESET_SK_SKB;
		if (f)
			ids_from_flow(e, f);
		else if (sk) {
			sock_ids(e, sk, 1, 1);
			sock_windows(e, sk, e->state);
		} else
			skb_netns(e, tp->skbaddr);
	}
	bpf_ringbuf_submit(e, wake_flag());
	return 0;
}

SEC("tracepoint/sock/inet_sock_set_state")
int pstack_inet_sock_set_state(struct trace_event_raw_inet_sock_set_state *tp)
{
	if (tp->protocol != 6 /* IPPROTO_TCP */)
		return 0;
	if (counted_only(PSTACK_TCP_STATE))
		return 0;
	__u16 sport = tp->sport, dport = tp->dport;
	if (port_filtered(sport, dport))
		return 0;
	if (seen(PSTACK_TCP_STATE))
		return 0;
	const void *sk = tp->skaddr;
	__u8 flags = 0;
	struct pstack_tcp_flow *f = 0;
	if (!per_event) {
		flags = agg_state(tp, sk, sport, dport, &f);
		if (!flags)
			return 0;
	}
	struct pstack_tcp_event *e = reserve(PSTACK_TCP_STATE, flags);
	if (!e)
		return 0;
	e->sport = sport;
	e->dport = dport;
	e->state = tp->oldstate;
	e->newstate = tp->newstate;
	if (f && (f->flags & PSTACK_FLOW_TUPLE)) {
		/* Aggregated mode: the flow already holds what the probe reads
		 * below would fetch again (no windows in this record). */
		e->family = f->family;
		__builtin_memcpy(e->saddr, f->saddr, 16);
		__builtin_memcpy(e->daddr, f->daddr, 16);
		e->netns_ino = f->netns_ino;
		e->sock_cookie = f->sock_cookie;
		e->sk_key = f->sk_key;
		e->flags |= PSTACK_TCP_HAS_SOCK;
		bpf_ringbuf_submit(e, wake_flag());
		return 0;
	}
	copy_addrs(e, tp);
	sock_ids(e, sk, 1, 0);
	/* The socket still has its old state here (set after the tracepoint). */
	sock_windows(e, sk, e->state);
	bpf_ringbuf_submit(e, wake_flag());
	return 0;
}
