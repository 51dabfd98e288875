// SPDX-License-Identifier: GPL-2.0-only
/*
 * pstack off-CPU programs: per-task off-CPU time split by the state the task
 * left the CPU in, and D-state episodes (start, duration, waker, kernel
 * stack) for tasks in a watched set.
 *
 * sched_switch: the leaving task (current) of a watched process opens a
 * START entry {time, class}; when the task is switched back in the interval
 * is added to its TOTALS and, if it was D and at least d_min_ns long, one
 * pstack_dstate_event goes to EPISODES. sched_wakeup records the waker.
 *
 * Bounded: WATCHED, START and TOTALS are fixed-size hashes (sizes set by the
 * loader); a full map or ring buffer is counted in COUNTERS, never silent.
 * User space reads and deletes TOTALS per window, reads START for episodes
 * still open when the window ends, and seeds START (flag PSTACK_OFF_SEEDED,
 * BPF_NOEXIST) for watched threads already asleep when watching begins —
 * they have no switch-out to see.
 *
 * The state class comes from the tracepoint's prev_state (portable: a task
 * frozen by the cgroup-v1 freezer reports D there); the raw task __state is
 * kept so a frozen task (TASK_FROZEN 0x8000) can be told apart.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "pstack_events.h"

char LICENSE[] SEC("license") = "GPL";

const volatile __u8 watch_all = 0;           /* 1: every task (bounded by START/TOTALS) */
const volatile __u64 d_min_ns = 1000000;     /* shorter D episodes are totalled, not emitted */
const volatile __u64 wakeup_bytes = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);  /* tgid */
	__type(value, __u8);
} WATCHED SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);  /* tid */
	__type(value, struct pstack_offcpu_start);
} START SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);  /* tid */
	__type(value, struct pstack_offcpu_totals);
} TOTALS SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} EPISODES SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PSTACK_OFF_COUNTER_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} COUNTERS SEC(".maps");

/* task_struct before 5.14 named the state `state`. */
struct task_struct___pre514 {
	long state;
} __attribute__((preserve_access_index));

static __always_inline void count(__u32 slot)
{
	__u64 *v = bpf_map_lookup_elem(&COUNTERS, &slot);
	if (v)
		*v += 1;
}

static __always_inline __u32 classify(long prev_state)
{
	/* Report bits: S 0x1, D 0x2, T 0x4, t 0x8, X 0x10, Z 0x20, P 0x40, I 0x80;
	 * 0 (or the preempt bit above them) is runnable. */
	__u64 s = (__u64)prev_state;
	if ((s & 0xff) == 0)
		return PSTACK_OFF_RUNNABLE;
	if (s & 0x2)
		return PSTACK_OFF_D;
	if (s & 0x1)
		return PSTACK_OFF_S;
	if (s & 0xc)
		return PSTACK_OFF_STOPPED;
	if (s & 0x80)
		return PSTACK_OFF_IDLE;
	return PSTACK_OFF_OTHER;
}

static __always_inline __u32 raw_task_state(void)
{
	struct task_struct *t = (void *)bpf_get_current_task();
	if (bpf_core_field_exists(t->__state))
		return BPF_CORE_READ(t, __state);
	struct task_struct___pre514 *old = (void *)t;
	return BPF_CORE_READ(old, state);
}

static __always_inline void switch_out(struct trace_event_raw_sched_switch *tp, __u64 now)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id, tgid = id >> 32;
	if (tid == 0)
		return;
	if (!watch_all && !bpf_map_lookup_elem(&WATCHED, &tgid))
		return;
	long prev_state = tp->prev_state;
	if (prev_state & 0x30) /* exiting (X/Z): it will not come back */
		return;
	count(PSTACK_OFF_SWITCHES);
	struct pstack_offcpu_start st = {};
	st.ts_ns = now;
	st.tgid = tgid;
	st.class = classify(prev_state);
	if (st.class == PSTACK_OFF_D) {
		st.raw_state = raw_task_state();
		long n = bpf_get_stack(tp, st.stack, sizeof(st.stack), 0);
		if (n > 0)
			st.stack_len = n / sizeof(__u64);
	}
	if (bpf_map_update_elem(&START, &tid, &st, BPF_ANY))
		count(PSTACK_OFF_LOST_START);
}

static __always_inline void switch_in(struct trace_event_raw_sched_switch *tp, __u64 now)
{
	__u32 tid = tp->next_pid;
	if (tid == 0)
		return;
	struct pstack_offcpu_start *st = bpf_map_lookup_elem(&START, &tid);
	if (!st)
		return;
	__u64 d = now - st->ts_ns;
	__u32 class = st->class;
	if (class >= PSTACK_OFF_CLASSES)
		class = PSTACK_OFF_OTHER;

	struct pstack_offcpu_totals *tot = bpf_map_lookup_elem(&TOTALS, &tid);
	if (!tot) {
		struct pstack_offcpu_totals zero = {};
		zero.tgid = st->tgid;
		bpf_core_read(zero.comm, sizeof(zero.comm), &tp->next_comm);
		if (bpf_map_update_elem(&TOTALS, &tid, &zero, BPF_NOEXIST) == 0)
			tot = bpf_map_lookup_elem(&TOTALS, &tid);
	}
	if (tot) {
		__sync_fetch_and_add(&tot->ns[class], d);
		__sync_fetch_and_add(&tot->count[class], 1);
		if (d > tot->max_ns[class])
			tot->max_ns[class] = d;
	} else {
		count(PSTACK_OFF_LOST_TOTALS);
	}

	if (class == PSTACK_OFF_D && d >= d_min_ns) {
		struct pstack_dstate_event *e = bpf_ringbuf_reserve(&EPISODES, sizeof(*e), 0);
		if (!e) {
			count(PSTACK_OFF_LOST_RB);
		} else {
			e->start_ns = st->ts_ns;
			e->duration_ns = d;
			e->tid = tid;
			e->tgid = st->tgid;
			e->waker_tid = st->waker_tid;
			e->raw_state = st->raw_state;
			e->stack_len = st->stack_len;
			e->flags = st->flags;
			bpf_core_read(e->comm, sizeof(e->comm), &tp->next_comm);
			__builtin_memcpy(e->stack, st->stack, sizeof(e->stack));
			__u64 flag = 0;
			if (wakeup_bytes) {
				/* Wake once, when the backlog crosses wakeup_bytes (the reader also polls). */
				__u64 avail = bpf_ringbuf_query(&EPISODES, BPF_RB_AVAIL_DATA);
				flag = avail >= wakeup_bytes && avail < wakeup_bytes + sizeof(*e)
					       ? BPF_RB_FORCE_WAKEUP
					       : BPF_RB_NO_WAKEUP;
			}
			bpf_ringbuf_submit(e, flag);
			count(PSTACK_OFF_EPISODES);
		}
	}
	bpf_map_delete_elem(&START, &tid);
}

SEC("tracepoint/sched/sched_switch")
int pstack_sched_switch(struct trace_event_raw_sched_switch *tp)
{
	__u64 now = bpf_ktime_get_ns();
	switch_out(tp, now);
	switch_in(tp, now);
	return 0;
}

SEC("tracepoint/sched/sched_wakeup")
int pstack_sched_wakeup(struct trace_event_raw_sched_wakeup_template *tp)
{
	__u32 tid = tp->pid;
	struct pstack_offcpu_start *st = bpf_map_lookup_elem(&START, &tid);
	if (st && st->waker_tid == 0)
		st->waker_tid = (__u32)bpf_get_current_pid_tgid();
	return 0;
}
