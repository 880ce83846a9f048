// SPDX-License-Identifier: GPL-2.0
/*
 * Per-call timing of one single-sample inference function.
 *
 * Built by benchmarks/bench_c.py with a generated "bench_target.h" that
 * defines
 *   BENCH_T          the element type of in[] (float, int, long long)
 *   BENCH_OUT_T      that of out[] (default: BENCH_T)
 *   BENCH_IN_ELEMS, BENCH_OUT_ELEMS, BENCH_WS_BYTES
 *   bench_infer(in, out, ws)   the function under test (returns >= 0:
 *                              fixed point's count of saturated values)
 *
 *   timing ROWS.bin NROWS SAMPLES WARMUP OUT.bin
 *   timing ROWS.bin NROWS 0 0 -        (prints each row's outputs, as
 *                                       doubles, one row per line)
 *
 * reads NROWS input rows, runs WARMUP untimed calls, then times SAMPLES
 * calls one by one, cycling over the rows: each sample is the TSC ticks
 * between a fenced rdtsc before the call and an rdtscp after it.  The
 * samples go to OUT.bin as u32.  It prints the median ticks of the same
 * timed region around an empty call (the timer's own cost, which the
 * caller subtracts), the core clock over the TSC clock measured just before
 * the samples (a chain of dependent adds runs at one per core cycle; the
 * core clock moves with the host's load, so every run measures its own)
 * and a checksum of the outputs (so nothing is optimized away).  This file
 * is the harness, built with plain -O2; the model's own objects carry the
 * flags under test.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>

#include <asm/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "bench_target.h"
#ifndef BENCH_OUT_T
#define BENCH_OUT_T BENCH_T
#endif

/* Only the kernel-flag builds need these (see bench_c.py). */
unsigned long __stack_chk_guard = 0x2f8a3b1c5d7e9f01UL;

/*
 * The x86-64 kernel's stack canary is at %gs:0x28 (its per-CPU area), and
 * gcc keeps that guard in functions with a target attribute (the SIMD
 * paths) even under -mstack-protector-guard=global: give this process a
 * GS base whose word at 0x28 is the canary.
 */
static unsigned long kernel_gs[8] = { [5] = 0x2f8a3b1c5d7e9f01UL };

static void set_kernel_gs(void)
{
	syscall(SYS_arch_prctl, ARCH_SET_GS, kernel_gs);
}

static inline uint64_t t_begin(void)
{
	uint64_t t;

	_mm_lfence();
	t = __rdtsc();
	_mm_lfence();
	return t;
}

static inline uint64_t t_end(void)
{
	unsigned int aux;
	uint64_t t = __rdtscp(&aux);

	_mm_lfence();
	return t;
}

__attribute__((noinline)) static int empty_call(const BENCH_T *in, BENCH_OUT_T *out, void *ws)
{
	__asm__ volatile("" : : "r"(in), "r"(out), "r"(ws) : "memory");
	return 0;
}

/*
 * Core cycles per TSC tick: the best of 5 chains of 64 x 4096 adds.  The
 * adds take a register operand: Intel cores since Golden Cove fold chains
 * of add-immediate at rename, several per cycle, which read as a core
 * clock several times too high.
 */
static double core_per_tsc(void)
{
	uint64_t best = UINT64_MAX, x = 0, one = 1, t;
	int r, i;

	__asm__ volatile("" : "+r"(one));
	for (r = 0; r < 5; r++) {
		t = __rdtsc();
		for (i = 0; i < 4096; i++)
			__asm__ volatile(".rept 64\n\tadd %1, %0\n\t.endr" : "+r"(x) : "r"(one));
		t = __rdtsc() - t;
		best = t < best ? t : best;
	}
	return 64.0 * 4096 / best;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	static unsigned long long ws[BENCH_WS_BYTES / 8 + 2];
	BENCH_OUT_T out[BENCH_OUT_ELEMS];
	long nrows, samples, warmup, i;
	uint32_t *t, ovh[4001];
	double check = 0, clock;
	BENCH_T *rows;
	FILE *f;

	if (argc != 6) {
		fprintf(stderr, "usage: %s ROWS.bin NROWS SAMPLES WARMUP OUT.bin\n", argv[0]);
		return 2;
	}
	nrows = atol(argv[2]);
	samples = atol(argv[3]);
	warmup = atol(argv[4]);
	rows = malloc(sizeof(BENCH_T) * BENCH_IN_ELEMS * nrows);
	t = malloc(sizeof(uint32_t) * (samples + 1));
	f = fopen(argv[1], "rb");
	if (!rows || !t || !f || nrows < 1 ||
	    fread(rows, sizeof(BENCH_T) * BENCH_IN_ELEMS, nrows, f) != (size_t)nrows) {
		fprintf(stderr, "cannot read %ld rows from %s\n", nrows, argv[1]);
		return 2;
	}
	fclose(f);
	set_kernel_gs();
#ifdef BENCH_SETUP
	BENCH_SETUP();	/* e.g. force a fixed-point model's SIMD path */
#endif

	if (samples == 0) {
		for (i = 0; i < nrows; i++) {
			int j;

			if (bench_infer(rows + i * BENCH_IN_ELEMS, out, ws) < 0)
				return 1;
			for (j = 0; j < BENCH_OUT_ELEMS; j++)
				printf("%.17g%c", (double)out[j], j + 1 < BENCH_OUT_ELEMS ? ' ' : '\n');
		}
		return 0;
	}
	for (i = 0; i < warmup; i++) {
		if (bench_infer(rows + (i % nrows) * BENCH_IN_ELEMS, out, ws) < 0) {
			fprintf(stderr, "inference failed\n");
			return 1;
		}
	}
	for (i = 0; i < 4001; i++) {
		uint64_t t0 = t_begin();

		empty_call(rows + (i % nrows) * BENCH_IN_ELEMS, out, ws);
		ovh[i] = (uint32_t)(t_end() - t0);
	}
	clock = core_per_tsc();
	for (i = 0; i < samples; i++) {
		const BENCH_T *x = rows + (i % nrows) * BENCH_IN_ELEMS;
		uint64_t t0 = t_begin();

		bench_infer(x, out, ws);
		t[i] = (uint32_t)(t_end() - t0);
		check += (double)out[i % BENCH_OUT_ELEMS];
	}
	f = fopen(argv[5], "wb");
	if (!f || fwrite(t, sizeof(uint32_t), samples, f) != (size_t)samples) {
		fprintf(stderr, "cannot write %s\n", argv[5]);
		return 2;
	}
	fclose(f);
	qsort(ovh, 4001, sizeof(uint32_t), cmp_u32);
	printf("%u %.4f %g\n", ovh[2000], clock, check);
	return 0;
}
