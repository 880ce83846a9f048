/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What the kernel-flag objects call that a process lacks: the return thunk
 * of -mfunction-return=thunk-extern, as a plain return (the kernel patches
 * it at boot according to the CPU's mitigations).
 */
	.text
	.globl	__x86_return_thunk
	.type	__x86_return_thunk, @function
__x86_return_thunk:
	ret
	int3
	.size	__x86_return_thunk, . - __x86_return_thunk
	.section .note.GNU-stack, "", @progbits
