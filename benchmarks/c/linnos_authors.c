// SPDX-License-Identifier: GPL-2.0
/*
 * A peer for the benchmarks: LinnOS's integer inference as the kernel
 * module in the Heimdall repository runs it, written here from its
 * algorithm (not copied).  The 31-256-2 network takes the decimal digits
 * of queue lengths and latencies as chars, its weights and biases are
 * int64 (trained values scaled by 10^3, the output biases by 10^6), and
 * every product is skipped when either factor is zero, as theirs is:
 *
 *   h[j] = relu(b0[j] + sum_i x[i] * w0[j][i])
 *   s[c] = b1[c] + sum_j h[j] * w1[c][j]        c = 0, 1
 *   reject = s[0] < s[1]
 *
 * ``linnos_authors_decide`` returns 1 (reject) or 0.
 */
#include <stdint.h>

#define LA_IN 31
#define LA_H 256

struct linnos_net {
	const int64_t *w0, *b0;		/* [256][31], [256] */
	const int64_t *w1, *b1;		/* [2][256], [2] */
};

int linnos_authors_decide(const struct linnos_net *net, const char *x);

/* a * b, or 0 without multiplying when either is 0 */
static inline int64_t skip0(int64_t a, int64_t b)
{
	return a == 0 || b == 0 ? 0 : a * b;
}

int linnos_authors_decide(const struct linnos_net *net, const char *x)
{
	int64_t in[LA_IN], h[LA_H], s[2];
	int i, j, c;

	for (i = 0; i < LA_IN; i++)
		in[i] = x[i];
	for (j = 0; j < LA_H; j++) {
		int64_t a = 0;

		for (i = 0; i < LA_IN; i++)
			a += skip0(in[i], net->w0[j * LA_IN + i]);
		a += net->b0[j];
		h[j] = a < 0 ? 0 : a;
	}
	for (c = 0; c < 2; c++) {
		int64_t a = 0;

		for (j = 0; j < LA_H; j++)
			a += skip0(h[j], net->w1[c * LA_H + j]);
		s[c] = a + net->b1[c];
	}
	return s[0] < s[1];
}
