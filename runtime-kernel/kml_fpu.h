/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The FPU section around a float model
 *
 * Include only from integer-only code: the model's entry-point file, which
 * is compiled without FPU flags and calls into the float translation unit
 * between kml_fpu_begin() and kml_fpu_end().
 *
 * On x86-64 this is kernel_fpu_begin()/kernel_fpu_end(), which also load
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

#if defined(__KERNEL__) && defined(CONFIG_X86_64)
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
#elif defined(__KERNEL__) && defined(CONFIG_ARM64)
/*
 * arm64: kernel-mode FP/SIMD.  may_use_simd() (asm/simd.h) is false in hard
 * IRQ, with interrupts disabled (a kprobe handler), in NMI and inside
 * another kernel-mode NEON section; kernel_neon_begin() BUG()s there, so
 * that is -EBUSY here.  kernel_neon_begin() (arch/arm64/kernel/fpsimd.c)
 * disables preemption and softirqs, saves the task's FP/SIMD registers and
 * invalidates them, but leaves FPCR as the task last loaded it, and a task
 * may run with flush-to-zero or another rounding mode.  So FPCR is loaded
 * with 0 for the section (round to nearest even, no flush-to-zero, no
 * default NaN, exceptions untrapped: what x86's MXCSR_DEFAULT is) and the
 * old value put back before kernel_neon_end().  The task's own FPCR is in
 * its saved state and comes back with it.
 */
#include <asm/neon.h>
#include <asm/simd.h>
#include <asm/sysreg.h>

static inline int kml_fpu_begin(unsigned int *saved)
{
	if (!may_use_simd())
		return -EBUSY;
	kernel_neon_begin();
	*saved = (unsigned int)read_sysreg(fpcr);
	write_sysreg(0UL, fpcr);
	return 0;
}

static inline void kml_fpu_end(unsigned int *saved)
{
	write_sysreg((unsigned long)*saved, fpcr);
	kernel_neon_end();
}
#elif defined(__KERNEL__)
#error "kmlc's float models need an FPU section: x86-64 or arm64"
#else
#include "kml_user_fpu.h"
#endif

#endif /* KML_FPU_H */
