// SPDX-License-Identifier: GPL-2.0
/*
 * The sanity baseline: an MLP as anyone would write it by hand.
 *
 * One dot product per output over textbook [out][in] weights, layer sizes
 * read from a table at run time, libm's expf for the sigmoid, plain -O2.
 * The weights come from a generated "naive_model.h" (bench_models.py).
 */
#include <math.h>
#include <stdint.h>

struct naive_layer {
	int in, out;
	const float *w, *b;
	int act;		/* 0 none, 1 relu, 2 sigmoid */
};

#include "naive_model.h"

int naive_infer(const float *in, float *out, void *ws);

int naive_infer(const float *in, float *out, void *ws)
{
	float buf[2][NAIVE_MAXW];
	const float *x = buf[0];
	int l, i, o;

	(void)ws;
	for (i = 0; i < NAIVE_IN; i++)
#if NAIVE_NORMALIZE
		buf[0][i] = (in[i] - naive_shift[i]) / naive_scale[i];
#else
		buf[0][i] = in[i];
#endif
	for (l = 0; l < NAIVE_LAYERS; l++) {
		const struct naive_layer *L = &naive_layers[l];
		float *y = l == NAIVE_LAYERS - 1 ? out : buf[(l + 1) & 1];

		for (o = 0; o < L->out; o++) {
			float acc = L->b[o];

			for (i = 0; i < L->in; i++)
				acc += L->w[o * L->in + i] * x[i];
			if (L->act == 1)
				acc = acc > 0 ? acc : 0;
			else if (L->act == 2)
				acc = 1.0f / (1.0f + expf(-acc));
			y[o] = acc;
		}
		x = y;
	}
	return 0;
}
