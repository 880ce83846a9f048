/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The userspace twin's stand-in for kernel_fpu_begin/end (kernel_neon_begin/end)
 *
 * kernel_fpu_begin() loads MXCSR_DEFAULT (0x1f80: round to nearest even,
 * no flush-to-zero, no denormals-are-zero, all exceptions masked).  A
 * userspace process may run with other settings (a library built with
 * -ffast-math sets FTZ/DAZ when it is loaded), so the twin loads the same
 * value for the duration of a call and restores the caller's afterwards.
 */
#ifndef KML_USER_FPU_H
#define KML_USER_FPU_H

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>

#define KML_MXCSR_DEFAULT 0x1f80

static inline int kml_fpu_begin(unsigned int *saved)
{
	*saved = _mm_getcsr();
	_mm_setcsr(KML_MXCSR_DEFAULT);
	return 0;
}

static inline void kml_fpu_end(unsigned int *saved)
{
	_mm_setcsr(*saved);
}
#elif defined(__aarch64__)
/*
 * arm64: the module loads FPCR with 0 for its FPU section (kml_fpu.h): round
 * to nearest even, no flush-to-zero, no default NaN.  So does the twin.
 */
static inline int kml_fpu_begin(unsigned int *saved)
{
	unsigned long fpcr;

	__asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
	*saved = (unsigned int)fpcr;
	__asm__ volatile("msr fpcr, %0" : : "r"(0UL));
	return 0;
}

static inline void kml_fpu_end(unsigned int *saved)
{
	__asm__ volatile("msr fpcr, %0" : : "r"((unsigned long)*saved));
}
#else
#error "kmlc's float twin pins the FPU's control register (x86 MXCSR, arm64 FPCR): port this"
#endif

#endif /* KML_USER_FPU_H */
