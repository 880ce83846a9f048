// SPDX-License-Identifier: GPL-2.0
/*
 * What an FPU section costs a kernel caller, measured from user space.
 *
 * kernel_fpu_begin_mask() (arch/x86/kernel/fpu/core.c, Linux 6.1) does,
 * every time: preempt_disable(), a per-CPU flag write, a flag test, and
 * LDMXCSR; and, when the task's user registers are still live
 * (TIF_NEED_FPU_LOAD clear: the first section since the last return to
 * user space, in a task that is not a kernel thread), it saves them
 * (os_xsave: XSAVES where the CPU has it, else XSAVEOPT or XSAVE) and
 * sets TIF_NEED_FPU_LOAD, so that the return to user space restores them
 * (XRSTORS/XRSTOR in switch_fpu_return()).  kernel_fpu_end() clears the
 * flag and re-enables preemption.  So a call pays either
 *
 *   first:    save + restore + LDMXCSR + a few instructions
 *   repeated: LDMXCSR + a few instructions
 *
 * XSAVES is privileged; its user-space equivalents here are XSAVE (which
 * writes every enabled component: the upper bound) and XSAVEOPT (which
 * skips components unchanged since the last restore), with XRSTOR, over
 * every component XCR0 enables, with the AVX registers dirtied before
 * each save as a user process that computes would leave them.
 *
 * Output, one "name value" per line: the state size in bytes, then the
 * median cost of each operation in nanoseconds.
 */
#include <cpuid.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N 20000

static uint8_t area[16384] __attribute__((aligned(64)));

static inline uint64_t xcr0(void)
{
	uint32_t lo, hi;

	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	return (uint64_t)hi << 32 | lo;
}

static inline uint64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC_RAW, &t);
	return (uint64_t)t.tv_sec * 1000000000u + t.tv_nsec;
}

static void dirty(void)
{
	__asm__ volatile("vpcmpeqd %%ymm0, %%ymm0, %%ymm0\n\t"
			 "vpaddd %%ymm0, %%ymm0, %%ymm1\n\t"
			 "vpaddd %%ymm1, %%ymm0, %%ymm2\n\t"
			 "vpaddd %%ymm2, %%ymm0, %%ymm3\n\t"
			 "vpaddd %%ymm3, %%ymm0, %%ymm4\n\t"
			 "vpaddd %%ymm4, %%ymm0, %%ymm5\n\t"
			 "vpaddd %%ymm5, %%ymm0, %%ymm6\n\t"
			 "vpaddd %%ymm6, %%ymm0, %%ymm7\n\t"
			 ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7");
}

enum op { DIRTY, XSAVE, XSAVEOPT, XRSTOR, LDMXCSR };

/* Median over 21 batches of N/21 operations of the time of one, in ns. */
static double timed(enum op op, uint64_t mask)
{
	uint32_t lo = (uint32_t)mask, hi = (uint32_t)(mask >> 32), csr = 0x1f80;
	double med[21];
	int b, i, j;

	for (b = 0; b < 21; b++) {
		uint64_t t0 = now_ns();

		for (i = 0; i < N / 21; i++) {
			dirty();
			switch (op) {
			case DIRTY:
				break;
			case XSAVE:
				__asm__ volatile("xsave64 %0" : "+m"(area) : "a"(lo), "d"(hi) : "memory");
				break;
			case XSAVEOPT:
				__asm__ volatile("xsaveopt64 %0" : "+m"(area) : "a"(lo), "d"(hi) : "memory");
				break;
			case XRSTOR:
				__asm__ volatile("xrstor64 %0" :: "m"(area), "a"(lo), "d"(hi) : "memory");
				break;
			case LDMXCSR:
				__asm__ volatile("ldmxcsr %0" :: "m"(csr));
				break;
			}
		}
		med[b] = (double)(now_ns() - t0) / (N / 21);
	}
	for (i = 1; i < 21; i++)
		for (j = i; j > 0 && med[j] < med[j - 1]; j--) {
			double t = med[j];

			med[j] = med[j - 1];
			med[j - 1] = t;
		}
	return med[10];
}

int main(void)
{
	unsigned int a, b, c, d;
	uint64_t mask;
	double base;
	int opt;

	if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX)) {
		fprintf(stderr, "fpu_cost: needs XSAVE and AVX\n");
		return 2;
	}
	mask = xcr0();
	__cpuid_count(0xd, 0, a, b, c, d);
	if (b > sizeof(area)) {
		fprintf(stderr, "fpu_cost: XSAVE area of %u bytes\n", b);
		return 2;
	}
	printf("xsave_bytes %u\nxcr0 0x%llx\n", b, (unsigned long long)mask);
	__cpuid_count(0xd, 1, a, b, c, d);
	opt = a & 1;
	memset(area, 0, sizeof(area));
	__asm__ volatile("xsave64 %0" : "+m"(area) : "a"((uint32_t)mask), "d"((uint32_t)(mask >> 32)) : "memory");
	base = timed(DIRTY, mask);
	printf("xsave_ns %.1f\n", timed(XSAVE, mask) - base);
	if (opt)
		printf("xsaveopt_ns %.1f\n", timed(XSAVEOPT, mask) - base);
	printf("xrstor_ns %.1f\n", timed(XRSTOR, mask) - base);
	printf("ldmxcsr_ns %.1f\n", timed(LDMXCSR, mask) - base);
	return 0;
}
