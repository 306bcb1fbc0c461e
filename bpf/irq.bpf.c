/* Interrupt telemetry: time and runs of each softirq, and of device interrupt handlers, per
 * CPU, measured in the kernel.
 *
 * Four small programs on raw tracepoints keep per-CPU counters only (one per-CPU array
 * lookup and one clock read each, no map lookup by key, nothing streamed):
 *   irq:softirq_entry / softirq_exit (TP_PROTO(unsigned int vec_nr)): the time between
 *       them, less the time device interrupt handlers ran in between, is the softirq's;
 *   irq:irq_handler_entry / irq_handler_exit (TP_PROTO(int irq, struct irqaction *action
 *       [, int ret])): the handler's time (the local timer and IPIs do not go through them:
 *       /proc/interrupts counts those).
 * Softirqs do not nest on a CPU, and handlers run with interrupts off, so one start time of
 * each per CPU is enough. A softirq that was running when the programs were attached is
 * counted at its next entry (its exit finds no start and is skipped).
 *
 * Every function and map is named "bpfdyno_..." so `bpftool` shows whose they are (the
 * kernel keeps 15 characters of a name: keep names that short).
 */
#include "common.h"
#include "irq.h"

BPF_PERCPU_ARRAY(bpfdyno_icpu, struct irq_cpu, 1);

int bpfdyno_softin(struct bpf_raw_tracepoint_args *ctx)
{
	u32 vec = (u32)ctx->args[0];
	u32 zero = 0;
	struct irq_cpu *c = bpfdyno_icpu.lookup(&zero);
	if (!c || vec >= IRQ_NR_SOFTIRQS)
		return 0;
	c->softirq_count[vec]++;
	c->nested_ns = 0;
	c->softirq_start_ns = bpf_ktime_get_ns();
	return 0;
}

int bpfdyno_softout(struct bpf_raw_tracepoint_args *ctx)
{
	u32 vec = (u32)ctx->args[0];
	u32 zero = 0;
	struct irq_cpu *c = bpfdyno_icpu.lookup(&zero);
	if (!c || vec >= IRQ_NR_SOFTIRQS || !c->softirq_start_ns)
		return 0;
	u64 spent = bpf_ktime_get_ns() - c->softirq_start_ns;
	if (spent > c->nested_ns)
		c->softirq_ns[vec] += spent - c->nested_ns;
	c->softirq_start_ns = 0;
	return 0;
}

int bpfdyno_hardin(struct bpf_raw_tracepoint_args *ctx)
{
	u32 zero = 0;
	struct irq_cpu *c = bpfdyno_icpu.lookup(&zero);
	if (!c)
		return 0;
	c->hardirq_count++;
	c->hardirq_start_ns = bpf_ktime_get_ns();
	return 0;
}

int bpfdyno_hardout(struct bpf_raw_tracepoint_args *ctx)
{
	u32 zero = 0;
	struct irq_cpu *c = bpfdyno_icpu.lookup(&zero);
	if (!c || !c->hardirq_start_ns)
		return 0;
	u64 spent = bpf_ktime_get_ns() - c->hardirq_start_ns;
	c->hardirq_ns += spent;
	if (c->softirq_start_ns)
		c->nested_ns += spent;
	c->hardirq_start_ns = 0;
	return 0;
}
