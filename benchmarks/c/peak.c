// SPDX-License-Identifier: GPL-2.0
/*
 * The machine's clocks and multiply-accumulate peaks, measured.
 *
 *   peak
 *
 * prints "key value" lines:
 *   tsc_hz          TSC ticks per second (against CLOCK_MONOTONIC_RAW)
 *   core_per_tsc    core cycles per TSC tick: a chain of dependent 64-bit
 *                   adds runs at one add per core cycle on every x86-64
 *                   core, so chain length / TSC ticks is the core clock
 *                   over the TSC clock, whatever turbo or the VM does
 *   int_mac         scalar integer MACs per core cycle: imul r64 + add r64
 *                   on independent accumulators, i.e. the multiplier's rate
 *                   (fixed point; paired outputs do two MACs per multiply)
 *   f32_mac         scalar float MACs per core cycle: mulss + addss
 *   sse2_mac        SSE2 float MACs per core cycle: mulps + addps, 4 lanes
 *                   (the kernel's float TU; no FMA: -ffp-contract=off)
 *   native_mac      the widest vector unit here, mul + add (AVX-512 or AVX2)
 *   native_isa      which one
 *
 * Each peak is the fastest of several runs of a loop of independent
 * multiply-add pairs with operands in registers: the compute roof, no
 * loads.  Every block below keeps enough independent chains to cover the
 * latencies of current x86 cores (add 1, imul 3, mulss/addss <= 4 cycles).
 */
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <x86intrin.h>

#define ITERS 200000L
#define RUNS 9

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC_RAW, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static double tsc_hz(void)
{
	double t0 = now_s(), t1;
	uint64_t c0 = __rdtsc(), c1;

	do
		t1 = now_s();
	while (t1 - t0 < 0.2);
	c1 = __rdtsc();
	return (c1 - c0) / (t1 - t0);
}

/*
 * 64 dependent adds per iteration: ITERS * 64 core cycles (register
 * operands: Golden Cove and later fold add-immediate chains at rename).
 */
static uint64_t add_chain(void)
{
	uint64_t t0 = __rdtsc(), x = 0, one = 1;
	long i;

	__asm__ volatile("" : "+r"(one));
	for (i = 0; i < ITERS; i++)
		__asm__ volatile(".rept 64\n\tadd %1, %0\n\t.endr" : "+r"(x) : "r"(one));
	return __rdtsc() - t0;
}

/* 8 int MACs per block, 8 blocks per iteration: 64 MACs. */
static uint64_t int_macs(void)
{
	uint64_t t0 = __rdtsc(), a = 3, b = 5;
	long i;

	for (i = 0; i < ITERS; i++)
		__asm__ volatile(".rept 8\n\t"
				 "mov %0, %%r8\n\timul %1, %%r8\n\tadd %%r8, %%r9\n\t"
				 "mov %0, %%r10\n\timul %1, %%r10\n\tadd %%r10, %%r11\n\t"
				 "mov %0, %%r12\n\timul %1, %%r12\n\tadd %%r12, %%r13\n\t"
				 "mov %0, %%r14\n\timul %1, %%r14\n\tadd %%r14, %%r15\n\t"
				 "mov %0, %%r8\n\timul %1, %%r8\n\tadd %%r8, %%r9\n\t"
				 "mov %0, %%r10\n\timul %1, %%r10\n\tadd %%r10, %%r11\n\t"
				 "mov %0, %%r12\n\timul %1, %%r12\n\tadd %%r12, %%r13\n\t"
				 "mov %0, %%r14\n\timul %1, %%r14\n\tadd %%r14, %%r15\n\t"
				 ".endr"
				 : : "r"(a), "r"(b)
				 : "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15");
	return __rdtsc() - t0;
}

/* 8 accumulators, 8 blocks per iteration: 64 mul + add pairs. */
#define SSE_MAC(t, acc) \
	"movaps %%xmm14, %%xmm" t "\n\t" MUL " %%xmm15, %%xmm" t "\n\t" \
	ADD " %%xmm" t ", %%xmm" acc "\n\t"
#define VEX_MAC(t, acc) \
	MUL " %%" R "15, %%" R "14, %%" R t "\n\t" \
	ADD " %%" R t ", %%" R acc ", %%" R acc "\n\t"
#define BLOCK(M) M("0", "8") M("1", "9") M("2", "10") M("3", "11") \
	M("4", "12") M("5", "13") M("6", "8") M("7", "9")
#define FP_CLOBBER "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", \
	"xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15"

static uint64_t f32_macs(void)
{
	uint64_t t0 = __rdtsc();
	long i;

	for (i = 0; i < ITERS; i++)
#define MUL "mulss"
#define ADD "addss"
		__asm__ volatile(".rept 8\n\t" BLOCK(SSE_MAC) ".endr"
				 : : : FP_CLOBBER);
	return __rdtsc() - t0;
}

static uint64_t sse2_macs(void)
{
	uint64_t t0 = __rdtsc();
	long i;

	for (i = 0; i < ITERS; i++)
#undef MUL
#undef ADD
#define MUL "mulps"
#define ADD "addps"
		__asm__ volatile(".rept 8\n\t" BLOCK(SSE_MAC) ".endr"
				 : : : FP_CLOBBER);
	return __rdtsc() - t0;
}

__attribute__((target("avx2"))) static uint64_t avx2_macs(void)
{
	uint64_t t0 = __rdtsc();
	long i;

	for (i = 0; i < ITERS; i++)
#undef MUL
#undef ADD
#define MUL "vmulps"
#define ADD "vaddps"
#define R "ymm"
		__asm__ volatile(".rept 8\n\t" BLOCK(VEX_MAC) ".endr"
				 : : : FP_CLOBBER);
	return __rdtsc() - t0;
}

__attribute__((target("avx512f"))) static uint64_t avx512_macs(void)
{
	uint64_t t0 = __rdtsc();
	long i;

	for (i = 0; i < ITERS; i++)
#undef R
#define R "zmm"
		__asm__ volatile(".rept 8\n\t" BLOCK(VEX_MAC) ".endr"
				 : : : FP_CLOBBER);
	return __rdtsc() - t0;
}

/*
 * fn in MACs per core cycle.  Runs of fn alternate with add chains, and
 * each takes its fastest run: a run can only be slowed down by a neighbour
 * (contention), and alternating makes both minima come from the same
 * stretch of time, whatever the core clock does meanwhile.
 */
static double rate(uint64_t (*fn)(void), double macs)
{
	uint64_t c = UINT64_MAX, t = UINT64_MAX, v;
	int i;

	for (i = 0; i < RUNS; i++) {
		v = add_chain();
		c = v < c ? v : c;
		v = fn();
		t = v < t ? v : t;
	}
	return macs / (t * (64.0 * ITERS / c));
}

int main(void)
{
	double macs = 64.0 * ITERS;
	uint64_t c = UINT64_MAX, v;
	int i;

	__builtin_cpu_init();
	printf("tsc_hz %.0f\n", tsc_hz());
	for (i = 0; i < RUNS; i++) {
		v = add_chain();
		c = v < c ? v : c;
	}
	printf("core_per_tsc %.4f\n", 64.0 * ITERS / c);
	printf("int_mac %.3f\n", rate(int_macs, macs));
	printf("f32_mac %.3f\n", rate(f32_macs, macs));
	printf("sse2_mac %.3f\n", rate(sse2_macs, 4 * macs));
	if (__builtin_cpu_supports("avx512f"))
		printf("native_isa avx512f\nnative_mac %.3f\n", rate(avx512_macs, 16 * macs));
	else if (__builtin_cpu_supports("avx2"))
		printf("native_isa avx2\nnative_mac %.3f\n", rate(avx2_macs, 8 * macs));
	return 0;
}
