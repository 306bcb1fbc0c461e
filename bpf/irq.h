/* Structures shared by irq.bpf.c and its reader, bpfdyno.sources.irq.collector.
 *
 * One value per CPU (a per-CPU array of one entry), every field a u64 so user space reads it
 * as raw words (bpfdyno.ebpf.maps.percpu_words); the word offsets are mirrored in the
 * collector and checked against this file by a test. Times are CLOCK_MONOTONIC ns
 * (bpf_ktime_get_ns), counts since the program was loaded.
 */
#ifndef BPFDYNO_IRQ_H
#define BPFDYNO_IRQ_H

#include "common.h"

/* The kernel's softirq vectors (NR_SOFTIRQS): HI, TIMER, NET_TX, NET_RX, BLOCK, IRQ_POLL,
 * TASKLET, SCHED, HRTIMER, RCU, in that order (the rows of /proc/softirqs). */
#define IRQ_NR_SOFTIRQS 10

struct irq_cpu {
	u64 softirq_ns[IRQ_NR_SOFTIRQS];    /* time in each softirq's handlers, minus the
					     * device interrupts that interrupted them */
	u64 softirq_count[IRQ_NR_SOFTIRQS]; /* runs of each (counted at entry, as the kernel
					     * counts /proc/softirqs) */
	u64 hardirq_ns;       /* time in device interrupt handlers (irq_handler_entry/exit) */
	u64 hardirq_count;    /* device interrupt handler runs */
	u64 softirq_start_ns; /* entry of the softirq running now; 0: none */
	u64 hardirq_start_ns; /* entry of the handler running now; 0: none */
	u64 nested_ns;        /* handler time inside the softirq running now */
	u64 _reserved;
};

_Static_assert(sizeof(struct irq_cpu) == 8 * (2 * IRQ_NR_SOFTIRQS + 6), "irq_cpu layout");

#endif
