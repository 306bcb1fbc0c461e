/* What bpfdyno's BPF programs share. Include it after the kernel headers, before the
 * program's own header.
 *
 * Values are spelled out rather than taken from the kernel headers: the "minimal" and "btf"
 * header flavours (bpfdyno.ebpf.kheaders) define different subsets of the kernel's macros
 * and enums. Constants mirrored in Python are checked against this file by a test.
 */
#ifndef BPFDYNO_COMMON_H
#define BPFDYNO_COMMON_H

/* errno values map helpers return (negated). */
#define BPFDYNO_EEXIST 17

/* bpf_ringbuf_submit() flag BPF_RB_NO_WAKEUP: user space consumes the ring buffers on its
 * own schedule, so skip the per-event wakeup (an irq_work each). */
#define BPFDYNO_RB_NO_WAKEUP 1

/* Slots of a log2 histogram of u64 values; decoded by bpfdyno.core.histogram. */
#define BPFDYNO_LOG2_SLOTS 64

/* The log2 histogram slot of v: floor(log2(v)), with 0 for v == 0 (so slot 0 holds 0 and 1,
 * slot k >= 1 holds [2^k, 2^(k+1))). */
static __always_inline u32 bpfdyno_log2(u64 v)
{
	u32 r = 0;
	if (v >> 32) { v >>= 32; r += 32; }
	if (v >> 16) { v >>= 16; r += 16; }
	if (v >> 8) { v >>= 8; r += 8; }
	if (v >> 4) { v >>= 4; r += 4; }
	if (v >> 2) { v >>= 2; r += 2; }
	if (v >> 1) { r += 1; }
	return r;
}

/* A field of a kernel struct behind a BTF-typed pointer (a tp_btf or iterator argument), read
 * with a plain load that the verifier checks against the kernel's BTF.
 *
 * The address is computed on integers, from __builtin_offsetof, never as `ptr->a.b` nor as
 * pointer arithmetic on a struct pointer: with the BTF-dumped vmlinux.h, the LLVM types that
 * bcc's clang emits for some structs padded with `long: 64` members have another layout than
 * the C struct, and LLVM turns member accesses and pointer arithmetic on such a pointer into
 * accesses by field of its own type (seen on 6.18: rq.clock read at 2824 instead of 2776,
 * cfs_rq.rq at 328 instead of 312). __builtin_offsetof is the C layout, the kernel's. */
#define BPFDYNO_FIELD(ptr, T, field) ((void *)((u64)(ptr) + __builtin_offsetof(T, field)))
#define BPFDYNO_LOAD(type, ptr, T, field) (*(type *)BPFDYNO_FIELD(ptr, T, field))

#endif /* BPFDYNO_COMMON_H */
