// SPDX-License-Identifier: GPL-2.0
/*
 * Exhaustive error of kml_math.h's expf, sigmoidf and tanhf: every finite
 * float32 input, against libm in double precision.  Reports the largest
 * error in units in the last place of the float32 result, over inputs whose
 * exact result is a normal float32, and the largest absolute error over all.
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
	const char *names[] = { "kml_expf", "kml_sigmoidf", "kml_tanhf" };
	int fn;

	for (fn = 0; fn < 3; fn++) {
		double max_ulp = 0, max_abs = 0, worst = 0;
		unsigned long long u;

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
			} else {
				y = kml_tanhf(x);
				r = tanh((double)x);
			}
			if (!isfinite(r) || r > 3.4028234663852886e38)
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
	return 0;
}
