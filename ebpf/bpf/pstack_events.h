/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Records the pstack eBPF programs write into their ring buffers.
 *
 * This layout is an ABI shared with pstack-ebpf (ebpf/src/record.rs), which
 * parses it by explicit offsets and checks the sizes below in a test. All
 * integers are little-endian host order (the programs run on the host);
 * ports are in host order; addresses are network-order byte images (IPv4
 * in the first 4 bytes). Change both sides together.
 */
#ifndef PSTACK_EVENTS_H
#define PSTACK_EVENTS_H

/* Record kinds (pstack_tcp_event.kind). */
#define PSTACK_TCP_RETRANSMIT 1
#define PSTACK_TCP_RECV_RESET 2
#define PSTACK_TCP_SEND_RESET 3
#define PSTACK_TCP_STATE 4

/* pstack_tcp_event.layout bits: which tracepoint layout this kernel had. */
#define PSTACK_LAYOUT_SEND_RESET_SOCKADDR 0x01 /* 6.10+: trace_event_raw_tcp_send_reset */
#define PSTACK_LAYOUT_SEND_RESET_SK_SKB 0x02   /* older: tcp_event_sk_skb layout */
#define PSTACK_LAYOUT_RETRANSMIT_ERR 0x04      /* tcp_retransmit_skb has `err` */
#define PSTACK_LAYOUT_RECV_RESET_COOKIE 0x08   /* tcp_receive_reset has `sock_cookie` */

/* pstack_tcp_event.flags bits. */
#define PSTACK_TCP_HAS_SOCK 0x01 /* the event carried a socket */
#define PSTACK_TCP_RTO 0x02      /* retransmit with icsk_ca_state == TCP_CA_Loss: the RTO
				  * timer fired (or loss recovery after it), not fast retransmit */
#define PSTACK_TCP_HAS_WND 0x04  /* snd_wnd / rcv_wnd were read from a full socket */
/* Aggregated mode only (per-event records carry none of these): */
#define PSTACK_TCP_RARE 0x08     /* emitted for being decisive: a reset, a flow leaving
				  * ESTABLISHED, the first retransmit of a flow */
#define PSTACK_TCP_SAMPLED 0x10  /* an ordinary event, chosen with probability 1/sample_one_in */
#define PSTACK_TCP_UNAGG 0x20    /* not folded into any FLOWS entry (no socket, a socket
				  * already closed, or the map refused it): user space counts it */

/* icsk_ca_state value of TCP_CA_Loss (include/net/tcp.h). */
#define PSTACK_TCP_CA_LOSS 4

/* Counter slots (COUNTERS per-CPU array), TCP object: 2*kind = seen, 2*kind+1 = lost
 * (event record refused: ring buffer full). Aggregated mode also counts, per kind,
 * the records chosen for being rare and for the sample, and the flow records. */
#define PSTACK_TCP_SLOT_RARE(kind) (10 + (kind))    /* 11..14 */
#define PSTACK_TCP_SLOT_SAMPLED(kind) (14 + (kind)) /* 15..18 */
#define PSTACK_TCP_SLOT_FLOW_EMITTED 19             /* flow records sent at CLOSE */
#define PSTACK_TCP_SLOT_FLOW_LOST 20                /* flow records refused: ring full */
#define PSTACK_TCP_SLOT_FLOW_MAP_FULL 21            /* events FLOWS could not take */
#define PSTACK_TCP_COUNTER_SLOTS 22

/* Transitions kept per flow in the kernel (the rest are counted). */
#define PSTACK_TCP_FLOW_TRANSITIONS 8

struct pstack_tcp_event {
	__u64 ts_ns;        /*  0: CLOCK_MONOTONIC ns (bpf_ktime_get_ns) */
	__u64 sock_cookie;  /*  8: socket cookie, 0 = not known */
	__u64 netns_cookie; /* 16: net_cookie of the socket's netns, 0 = not known */
	__u32 netns_ino;    /* 24: inode of the socket's netns, 0 = not known */
	__u32 pid;          /* 28: tgid on CPU (0: softirq/idle; not the owner!) */
	__u8 kind;          /* 32 */
	__u8 family;        /* 33: AF_INET 2 / AF_INET6 10 / 0 unknown */
	__u8 state;         /* 34: TCP state (old state for PSTACK_TCP_STATE) */
	__u8 newstate;      /* 35: new state for PSTACK_TCP_STATE, else 0 */
	__u16 sport;        /* 36: local port (sender port for resets) */
	__u16 dport;        /* 38: remote port */
	__u8 saddr[16];     /* 40 */
	__u8 daddr[16];     /* 56 */
	__s32 detail;       /* 72: retransmit err / send-reset reason / 0 */
	__u8 layout;        /* 76: PSTACK_LAYOUT_* */
	__u8 flags;         /* 77: PSTACK_TCP_* */
	__u8 ca_state;      /* 78: icsk_ca_state of a retransmit's socket, else 0 */
	__u8 _pad;          /* 79 */
	char comm[16];      /* 80: on-CPU comm (swapper/N in softirq) */
	__u64 sk_key;       /* 96: socket address, an opaque in-host key to join a
			     * socket's events (0 = none). Never leaves the host. */
	__u32 snd_wnd;      /* 104: tcp_sock.snd_wnd (peer's advertised window, bytes);
			     * valid only with PSTACK_TCP_HAS_WND */
	__u32 rcv_wnd;      /* 108: tcp_sock.rcv_wnd (window this end advertises, bytes) */
};                          /* 112 */

/* One flow's aggregate (aggregated mode): the value of FLOWS (key: the
 * socket's address) and, when the flow reaches CLOSE, a ring record of its
 * own (told apart from pstack_tcp_event by its size). Counters are updated
 * with atomic adds: a socket's events can run on two CPUs at once (softirq
 * retransmit timers beside the owner's syscalls). */
struct pstack_tcp_flow {
	__u64 first_ns;        /*   0: first event folded, CLOCK_MONOTONIC ns */
	__u64 last_ns;         /*   8: last event folded */
	__u64 sock_cookie;     /*  16: 0 = not generated yet */
	__u64 netns_cookie;    /*  24 */
	__u64 sk_key;          /*  32: the socket's address (joins events; never leaves the host) */
	__u64 bytes_acked;     /*  40: tcp_sock.bytes_acked at CLOSE (valid with PSTACK_FLOW_BYTES) */
	__u64 bytes_received;  /*  48: tcp_sock.bytes_received at CLOSE */
	__u32 netns_ino;       /*  56 */
	__u32 retransmits;     /*  60: all retransmits */
	__u32 rtos;            /*  64: ... in TCP_CA_Loss (the RTO timer fired) */
	__u32 recovery;        /*  68: ... in TCP_CA_Recovery (fast retransmit) */
	__u32 other_retrans;   /*  72: ... in Open/Disorder/CWR (tail loss probes among them) */
	__u32 resets_sent;     /*  76 */
	__u32 resets_received; /*  80 */
	__s32 last_reset_reason; /* 84: valid with PSTACK_FLOW_REASON */
	__u32 state_changes;   /*  88: all of them; the first 8 are kept below */
	__u16 sport;           /*  92: local port */
	__u16 dport;           /*  94 */
	__u8 family;           /*  96 */
	__u8 flags;            /*  97: PSTACK_FLOW_* */
	__u8 state;            /*  98: last state seen */
	__u8 _pad0;            /*  99 */
	__u32 _pad1;           /* 100 */
	__u8 saddr[16];        /* 104 */
	__u8 daddr[16];        /* 120 */
	__u64 trans_ns[PSTACK_TCP_FLOW_TRANSITIONS];  /* 136 */
	__u8 trans_from[PSTACK_TCP_FLOW_TRANSITIONS]; /* 200 */
	__u8 trans_to[PSTACK_TCP_FLOW_TRANSITIONS];   /* 208 */
};                             /* 216 */

#define PSTACK_FLOW_REASON 0x01 /* last_reset_reason is set */
#define PSTACK_FLOW_BYTES 0x02  /* bytes_* were read from a full socket */
#define PSTACK_FLOW_TUPLE 0x04  /* both ports and the addresses are known */
#define PSTACK_FLOW_PARTIAL 0x08 /* the tuple fields hold an endpoint pair with a port 0 */
#define PSTACK_FLOW_DEAD 0x10    /* map entry only: its flow was sent at CLOSE; not live */
#define PSTACK_FLOW_LEFT_EST 0x20 /* flow record only: its last transition, ESTABLISHED -> CLOSE,
				   * is a rare event this record stands for (counted as rare) */

/* Off-CPU state classes (index into pstack_offcpu_totals arrays). */
#define PSTACK_OFF_RUNNABLE 0 /* preempted: waiting on a runqueue */
#define PSTACK_OFF_S 1        /* interruptible sleep */
#define PSTACK_OFF_D 2        /* uninterruptible sleep (incl. frozen) */
#define PSTACK_OFF_STOPPED 3  /* T / t */
#define PSTACK_OFF_IDLE 4     /* TASK_IDLE kernel threads */
#define PSTACK_OFF_OTHER 5
#define PSTACK_OFF_CLASSES 6

#define PSTACK_OFFCPU_STACK_DEPTH 16

/* One D-state episode (switch-out in D, switch-in later). */
struct pstack_dstate_event {
	__u64 start_ns;     /*  0: switch-out, CLOCK_MONOTONIC ns */
	__u64 duration_ns;  /*  8 */
	__u32 tid;          /* 16 */
	__u32 tgid;         /* 20 */
	__u32 waker_tid;    /* 24: task that woke it (0 = unknown) */
	__u32 raw_state;    /* 28: task __state at switch-out (0x8000 = frozen) */
	__u32 stack_len;    /* 32: valid frames in stack[] */
	__u32 flags;        /* 36: PSTACK_OFF_SEEDED: start is the window start, a lower bound */
	char comm[16];      /* 40 */
	__u64 stack[PSTACK_OFFCPU_STACK_DEPTH]; /* 56: kernel stack at switch-out */
};                          /* 184 */

/* Per-task totals (TOTALS hash, key = tid). */
struct pstack_offcpu_totals {
	__u64 ns[PSTACK_OFF_CLASSES];
	__u64 count[PSTACK_OFF_CLASSES];
	__u64 max_ns[PSTACK_OFF_CLASSES];
	__u32 tgid;
	__u32 _pad;
	char comm[16];
};                          /* 168 */

/* Counter slots, off-CPU object. */
#define PSTACK_OFF_SWITCHES 0     /* switches of watched tasks seen */
#define PSTACK_OFF_EPISODES 1     /* D episodes emitted */
#define PSTACK_OFF_LOST_RB 2      /* D episodes lost: ring buffer full */
#define PSTACK_OFF_LOST_START 3   /* switch-outs not tracked: START map full */
#define PSTACK_OFF_LOST_TOTALS 4  /* intervals not totalled: TOTALS map full */
#define PSTACK_OFF_COUNTER_SLOTS 5

/* pstack_offcpu_start.flags / pstack_dstate_event.flags: the entry was seeded
 * by user space for a task already off CPU when watching began (its true
 * switch-out time is unknown; ts_ns is when watching began). */
#define PSTACK_OFF_SEEDED 0x1

/* A switch-out in progress (START hash, key = tid); read by user space for
 * episodes still open when a window ends. */
struct pstack_offcpu_start {
	__u64 ts_ns;        /*  0 */
	__u32 tgid;         /*  8 */
	__u32 class;        /* 12: PSTACK_OFF_* */
	__u32 raw_state;    /* 16 */
	__u32 waker_tid;    /* 20 */
	__u32 stack_len;    /* 24 */
	__u32 flags;        /* 28: PSTACK_OFF_SEEDED */
	__u64 stack[PSTACK_OFFCPU_STACK_DEPTH]; /* 32 */
};                          /* 160 */

/* The Rust decoder (ebpf/src/record.rs) pins these sizes too. */
_Static_assert(sizeof(struct pstack_tcp_event) == 112, "pstack_tcp_event ABI");
_Static_assert(sizeof(struct pstack_tcp_flow) == 216, "pstack_tcp_flow ABI");
_Static_assert(sizeof(struct pstack_dstate_event) == 184, "pstack_dstate_event ABI");
_Static_assert(sizeof(struct pstack_offcpu_totals) == 168, "pstack_offcpu_totals ABI");
_Static_assert(sizeof(struct pstack_offcpu_start) == 160, "pstack_offcpu_start ABI");

#endif
