// SPDX-License-Identifier: GPL-2.0
/*
 * A hook's decision in the userspace twin: the same kml_model_decide() and
 * feature encoding (the generated kml_binding.h) as the hook module, for
 * simulators that feed features one window or one read at a time.
 */
#include "kml_binding.h"

const unsigned long kml_twin_buf_size = sizeof(struct kml_model_buf);

int kml_twin_decide(const s32 *f, unsigned long n, s32 *decisions, void *buf);
const u8 *kml_twin_frac(void);

/*
 * The hook's decision for each of n rows of encoded features, with the
 * caller's buffer (kml_twin_buf_size bytes, 8-byte aligned).  Returns 0,
 * or the first negative errno.
 */
int kml_twin_decide(const s32 *f, unsigned long n, s32 *decisions, void *buf)
{
	unsigned long i;
	int d;

	for (i = 0; i < n; i++, f += KML_MODEL_INPUTS) {
		d = kml_model_decide(f, buf);
		if (d < 0)
			return d;
		decisions[i] = d;
	}
	return 0;
}

/* The fraction bits the hook encodes each feature with. */
const u8 *kml_twin_frac(void)
{
	return kml_model_frac();
}
