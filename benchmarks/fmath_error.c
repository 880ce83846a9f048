// SPDX-License-Identifier: GPL-2.0
/*
 * Exhaustive error of kml_math.h's expf, sigmoidf, tanhf, logf, erff and
 * sqrtf: every finite float32 input, against libm in double precision.
 * Reports the largest error in units in the last place of the float32
 * result, over inputs whose exact result is a normal float32, and the
 * largest absolute error over all; for sqrtf, how many results differ from
 * the correctly rounded one (libm's sqrtf, an IEEE operation).
 * Run: python benchmarks/fmath_error.py
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "kml_math.h"

static double ulp_of(double r)
{
	float f = (float)fabs(r);

	return (double)nextafterf(f, INFINITY) - (double)f;
}

int main(void)
{
	const char *names[] = { "kml_expf", "kml_sigmoidf", "kml_tanhf", "kml_logf", "kml_erff" };
	unsigned long long u, differ = 0;
	int fn;

	for (fn = 0; fn < 5; fn++) {
		double max_ulp = 0, max_abs = 0, worst = 0;

		for (u = 0; u <= 0xffffffffull; u++) {
			unsigned int b = (unsigned int)u;
			float x, y;
			double r, e;

			memcpy(&x, &b, 4);
			if (!isfinite(x))
				continue;
			if (fn == 0) {
				y = kml_expf(x);
				r = exp((double)x);
			} else if (fn == 1) {
				y = kml_sigmoidf(x);
				r = 1.0 / (1.0 + exp(-(double)x));
			} else if (fn == 2) {
				y = kml_tanhf(x);
				r = tanh((double)x);
			} else if (fn == 3) {
				if (x <= 0)
					continue;
				y = kml_logf(x);
				r = log((double)x);
			} else {
				y = kml_erff(x);
				r = erf((double)x);
			}
			if (!isfinite(r) || fabs(r) > 3.4028234663852886e38)
				continue;
			e = fabs((double)y - r);
			if (e > max_abs)
				max_abs = e;
			if (fabs(r) >= 1.1754943508222875e-38 && e / ulp_of(r) > max_ulp) {
				max_ulp = e / ulp_of(r);
				worst = x;
			}
		}
		printf("%-13s max %.3f ulp (at x = %.9g), max abs error %.3g\n", names[fn],
		       max_ulp, worst, max_abs);
	}
	for (u = 0; u <= 0xffffffffull; u++) {
		unsigned int b = (unsigned int)u, yb, rb;
		float x, y, r;

		memcpy(&x, &b, 4);
		y = kml_sqrtf(x);
		r = sqrtf(x);
		memcpy(&yb, &y, 4);
		memcpy(&rb, &r, 4);
		if (yb != rb && !(isnan(y) && isnan(r)))
			differ++;
	}
	printf("%-13s %llu of 2^32 inputs differ from IEEE sqrtf\n", "kml_sqrtf", differ);
	return 0;
}
