/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What kmlc's generated C needs from its environment
 *
 * Kernel builds take the kernel's own types and errno values; the userspace
 * twin gets the same names from the C library.  Nothing else in the
 * generated code depends on which build it is in.
 */
#ifndef KML_TYPES_H
#define KML_TYPES_H

#ifdef __KERNEL__
#include <linux/errno.h>
#include <linux/export.h>
#include <linux/types.h>
#else
#include <errno.h>
#include <stdbool.h>
/* the kernel's types, as the Linux ABIs (ILP32 and LP64) size them */
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed char s8;
typedef short s16;
typedef int s32;
typedef long long s64;
/* The twin is a shared library: every non-static symbol is exported. */
#define EXPORT_SYMBOL_GPL(sym)
#define __rcu	/* the kernel's RCU annotation: nothing to check here */
#endif

/* True when p is aligned to a (a power of two). */
static inline int kml_aligned(const void *p, unsigned long a)
{
	return ((unsigned long)p & (a - 1)) == 0;
}

#endif /* KML_TYPES_H */
