/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The userspace twin's stand-in for kernel_fpu_begin/end
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
#else
#error "kmlc's float twin pins the x86 MXCSR; port kml_user_fpu.h to this architecture"
#endif

#endif /* KML_USER_FPU_H */
