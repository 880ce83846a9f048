// SPDX-License-Identifier: GPL-2.0
/*
 * A peer for the benchmarks: Heimdall's own integer inference, written
 * here from its published algorithm (not copied): the authors' kernel runs
 * their trained 12-128-16-1 network in signed 64-bit integers:
 *
 *   n[i]  = (x[i] - min[i]) * scale0[i]        scale0 = round(2^30 / range)
 *   h1[j] = relu(bias1[j] + sum_i floor(n[i] * w1[j][i] / 2^30))
 *   h2[j] = relu(bias2[j] + sum_i h1[i] * w2[j][i])
 *   y     = bias3 + sum_i h2[i] * w3[i]
 *   decline = y >= 0
 *
 * with the weights of tests/data/heimdall/devN.json in their published
 * layout ([out][in], scaled by 10^3; biases by 10^3, 10^6, 10^9).  Each
 * first-layer product is rounded down before the sum, as theirs is.
 * ``heimdall_authors_decide`` returns 1 (decline) or 0; the network's
 * arrays are passed in, so one build serves both devices.
 * tests/unit/test_heimdall_authors.py holds it to the numpy rewrite in
 * tests/data/heimdall/heimdall_model.py on every kind of row.
 */
#include <stdint.h>

#define HA_IN 12
#define HA_H1 128
#define HA_H2 16

struct heimdall_net {
	const int64_t *min, *scale0;	/* [12] */
	const int64_t *w1, *b1;		/* [128][12], [128] */
	const int64_t *w2, *b2;		/* [16][128], [16] */
	const int64_t *w3, *b3;		/* [16], [1] */
};

int heimdall_authors_decide(const struct heimdall_net *net, const int64_t *x);

/* floor(v / 2^30) without shifting a negative value */
static int64_t floor_2_30(int64_t v)
{
	if (v >= 0)
		return (int64_t)((uint64_t)v >> 30);
	return -(int64_t)(((uint64_t)-v + ((1ULL << 30) - 1)) >> 30);
}

int heimdall_authors_decide(const struct heimdall_net *net, const int64_t *x)
{
	int64_t n[HA_IN], h1[HA_H1], h2[HA_H2], y;
	int i, j;

	for (i = 0; i < HA_IN; i++)
		n[i] = (x[i] - net->min[i]) * net->scale0[i];
	for (j = 0; j < HA_H1; j++) {
		int64_t a = net->b1[j];

		for (i = 0; i < HA_IN; i++)
			a += floor_2_30(n[i] * net->w1[j * HA_IN + i]);
		h1[j] = a > 0 ? a : 0;
	}
	for (j = 0; j < HA_H2; j++) {
		int64_t a = net->b2[j];

		for (i = 0; i < HA_H1; i++)
			a += h1[i] * net->w2[j * HA_H1 + i];
		h2[j] = a > 0 ? a : 0;
	}
	y = net->b3[0];
	for (i = 0; i < HA_H2; i++)
		y += h2[i] * net->w3[i];
	return y >= 0;
}
