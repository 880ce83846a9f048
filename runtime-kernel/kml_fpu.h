/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The FPU section around a float model
 *
 * Include only from integer-only code: the model's entry-point file, which
 * is compiled without FPU flags and calls into the float translation unit
 * between kml_fpu_begin() and kml_fpu_end().
 *
 * In the kernel this is kernel_fpu_begin()/kernel_fpu_end(), which also load
 * the default MXCSR (round to nearest even, no flush-to-zero, exceptions
 * masked).  Where the FPU may not be used (in NMI, or irq_fpu_usable() is
 * false, e.g. in an interrupt that arrived inside another FPU section),
 * kml_fpu_begin() fails with -EBUSY instead of corrupting state.  The userspace twin loads
 * the same MXCSR for the duration of the call (runtime-user/kml_user_fpu.h),
 * so that a caller's flush-to-zero or rounding mode cannot change its bits.
 */
#ifndef KML_FPU_H
#define KML_FPU_H

#include "kml_types.h"

#ifdef __KERNEL__
#include <asm/fpu/api.h>
#include <linux/preempt.h>

static inline int kml_fpu_begin(unsigned int *saved)
{
	(void)saved;
	/* irq_fpu_usable() warns in NMI (and a kprobe's int3 handler is one) */
	if (in_nmi() || !irq_fpu_usable())
		return -EBUSY;
	kernel_fpu_begin();
	return 0;
}

static inline void kml_fpu_end(unsigned int *saved)
{
	(void)saved;
	kernel_fpu_end();
}
#else
#include "kml_user_fpu.h"
#endif

#endif /* KML_FPU_H */
