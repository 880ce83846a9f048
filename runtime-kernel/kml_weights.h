/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Weight sets as bytes: validation of a .kmlw blob (docs/weights.md)
 *
 * kml_set_check() takes a blob for one compiled model, described by the
 * struct kml_set_desc its generated code defines, and either copies the
 * weight set it carries into the caller's buffer or refuses it with a
 * one-line reason.  It does not trust the blob: after the length, the
 * CRC32C and the header, it re-proves from the new values themselves every
 * bound the model's integer kernels rely on (passes/bound_ranges.py), in
 * integer arithmetic:
 *   - int16 weights lie in +-32767 (the SIMD paths' pmaddwd pair sums);
 *   - per output channel, |b| + max|x| * sum |w| fits the layer's
 *     accumulator (int32, or int64 below 2^62), and also below 2^62 over
 *     every int32 input for a first layer with an exact wide path;
 *   - per channel, that bound times the requantization multiplier is below
 *     2^63 and the shift at most 62 (kml_requant's precondition);
 *   - the largest channel bound is the one the blob's record states.
 * In fixed point every other member (input encodings, thresholds: the
 * formats) must equal the compiled set's; in float every float member must
 * be finite.  The struct's tail padding must be zero.
 *
 * The module and the userspace twin both run this code, so they refuse
 * exactly the same blobs.  It allocates nothing, writes only the caller's
 * buffer, takes O(blob) time and may sleep nowhere: any context will do,
 * though callers run it in process context.
 */
#ifndef KML_WEIGHTS_H
#define KML_WEIGHTS_H

#include "kml_types.h"
#ifdef __KERNEL__
#include <linux/build_bug.h>	/* static_assert */
#include <linux/kernel.h>	/* ARRAY_SIZE */
#include <linux/rcupdate.h>
#include <linux/stddef.h>	/* offsetof */
#else
#include <assert.h>	/* static_assert */
#include <stddef.h>
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#endif

/* The blob is little-endian; the set is copied as it is into the struct. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kmlc weight sets are little-endian: this target is not"
#endif

#define KML_SET_FORMAT 1
#define KML_SET_HEADER 48	/* magic, format, numerics, records, hash, version, bytes */
#define KML_SET_RECORD 16	/* kernel index, accumulator bits, 3 zero bytes, bound */
#define KML_SET_NONE 0xffffffffu	/* a member a layer does not have */

/* One dense layer of a fixed-point model: where its constants are, its shape. */
struct kml_dense_desc {
	const char *name;	/* its ONNX node, for the refusal's message */
	u32 kernel;		/* its kernel's index, as the blob's record names it */
	/* member offsets in the set (KML_SET_NONE: absent), as passes/lower.py lays them out */
	u32 w, w_last, w_tail, w_tail_last, bias, rq, rq_neg;
	u32 n, k;		/* outputs, inputs */
	u32 count, width;	/* full tiles of width outputs; the rest are the tail */
	u8 wbytes;		/* 1: int8 weights, 2: int16 */
	u8 woff;		/* 0, or 128: full tiles stored as u8 w + 128 (offset pairs) */
	u8 in_pairs;		/* weights stored in input pairs */
	u8 acc_bits;		/* 32 or 64: the accumulator the C uses */
	u64 x_max;		/* max |x| the proven paths take */
	u64 x_max_wide;		/* 0, or max |x| the exact wide path takes */
};

/* A byte range of the set. */
struct kml_span {
	u32 off, len;
};

/* What a compiled model says of its weight sets. */
struct kml_set_desc {
	const u8 *structure;	/* the 32-byte structure hash */
	const void *builtin;	/* the compiled set */
	u32 bytes;		/* sizeof the set */
	u32 end;		/* where its members end: tail padding follows */
	u8 fixed;
	u32 n_dense;
	const struct kml_dense_desc *dense;
	u32 n_pinned;		/* fixed point: members a set may not change */
	const struct kml_span *pinned;
	u32 n_f32;		/* float: members that must be finite */
	const struct kml_span *f32;
};

/* The blob's size for a model: header, records, the set, the CRC. */
static inline unsigned long kml_set_blob_bytes(const struct kml_set_desc *d)
{
	return KML_SET_HEADER + KML_SET_RECORD * (unsigned long)d->n_dense + d->bytes + 4;
}

static inline u32 kml_le32(const u8 *p)
{
	return p[0] | (u32)p[1] << 8 | (u32)p[2] << 16 | (u32)p[3] << 24;
}

static inline u64 kml_le64(const u8 *p)
{
	return kml_le32(p) | (u64)kml_le32(p + 4) << 32;
}

/* CRC32C (Castagnoli, reflected; initial value and final xor ~0), four bits at a time. */
static inline u32 kml_crc32c(const u8 *p, unsigned long n)
{
	static const u32 t[16] = {
		0x00000000, 0x105ec76f, 0x20bd8ede, 0x30e349b1,
		0x417b1dbc, 0x5125dad3, 0x61c69362, 0x7198540d,
		0x82f63b78, 0x92a8fc17, 0xa24bb5a6, 0xb21572c9,
		0xc38d26c4, 0xd3d3e1ab, 0xe330a81a, 0xf36e6f75,
	};
	u32 crc = ~0u;

	while (n--) {
		crc ^= *p++;
		crc = (crc >> 4) ^ t[crc & 15];
		crc = (crc >> 4) ^ t[crc & 15];
	}
	return ~crc;
}

/* a * b + c, or ~0 where that does not fit in u64. */
static inline u64 kml_muladd_sat(u64 a, u64 b, u64 c)
{
	if (b && a > (~0ULL - c) / b)
		return ~0ULL;
	return a * b + c;
}

static inline u64 kml_mag(s64 v)
{
	return v < 0 ? (u64)-(v + 1) + 1 : (u64)v;
}

/* Element i of the weights at offset off: int8, int16, or u8 w + woff (woff > 0). */
static inline s32 kml_set_w(const u8 *set, u32 off, unsigned long i, u8 wbytes, u8 woff)
{
	if (woff)
		return (s32)set[off + i] - woff;
	if (wbytes == 1)
		return ((const s8 *)(set + off))[i];
	return ((const s16 *)(set + off))[i];
}

/*
 * sum |w| over output n's weights, wherever passes/lower.py's tiles put
 * them: full tiles [t][rows][width] (or [t][k2][width][2] in input pairs,
 * with an odd K's last input in [t][width]), then the tail [rows][R] (or
 * [k2][R][2], the last input in [R]).  Sets *bad when an int16 weight is
 * -32768.
 */
static inline u64 kml_dense_wsum(const struct kml_dense_desc *L, const u8 *set, u32 n, int *bad)
{
	u32 rows = L->in_pairs ? L->k / 2 : L->k;
	u32 per = L->in_pairs ? 2 : 1;
	u32 off, last, stride, base, r, j;
	u8 woff = 0;
	u64 s = 0;
	s32 v;

	if (n < L->count * L->width) {
		off = L->w;
		woff = L->woff;
		last = L->w_last;
		stride = L->width;
		base = (n / L->width) * rows * L->width + n % L->width;
		j = n;
	} else {
		off = L->w_tail;
		last = L->w_tail_last;
		stride = L->n - L->count * L->width;
		base = n - L->count * L->width;
		j = base;
	}
	for (r = 0; r < rows * per; r++) {
		v = kml_set_w(set, off, ((unsigned long)base + (r / per) * stride) * per + r % per,
			      L->wbytes, woff);
		*bad |= v < -32767;
		s += kml_mag(v);
	}
	if (L->in_pairs && L->k % 2) {
		v = kml_set_w(set, last, j, L->wbytes, 0);
		*bad |= v < -32767;
		s += kml_mag(v);
	}
	return s;
}

/* The requantization word of channel n checked against its bound; 0 if it holds. */
static inline int kml_rq_ok(const u8 *set, u32 off, u32 n, u64 bound)
{
	u32 word;

	if (off == KML_SET_NONE)
		return 1;
	word = ((const u32 *)(set + off))[n];
	return (word & 63) <= 62 && kml_muladd_sat(bound, word >> 6, 0) < (1ULL << 63);
}

/*
 * Re-proves dense layer L's bounds on the set at set; returns NULL, or why
 * not, with the largest channel bound in *bound.
 */
static inline const char *kml_dense_check(const struct kml_dense_desc *L, const u8 *set,
					  u64 *bound)
{
	u64 limit = L->acc_bits == 32 ? 0x7fffffffULL : (1ULL << 62) - 1;
	u64 wsum, b, fast, wide;
	int bad = 0;
	u32 n;

	*bound = 0;
	for (n = 0; n < L->n; n++) {
		wsum = kml_dense_wsum(L, set, n, &bad);
		if (L->acc_bits == 32)
			b = kml_mag(((const s32 *)(set + L->bias))[n]);
		else
			b = kml_mag(((const s64 *)(set + L->bias))[n]);
		if (bad)
			return "an int16 weight is -32768 (the SIMD paths need +-32767)";
		fast = kml_muladd_sat(wsum, L->x_max, b);
		if (fast > limit)
			return L->acc_bits == 32 ? "its sums may overflow the 32-bit accumulator" :
				"its sums may reach 2^62 in the 64-bit accumulator";
		if (L->x_max_wide) {
			wide = kml_muladd_sat(wsum, L->x_max_wide, b);
			if (wide >= 1ULL << 62)
				return "its sums over every int32 input may reach 2^62";
		}
		if (!kml_rq_ok(set, L->rq, n, fast) || !kml_rq_ok(set, L->rq_neg, n, fast))
			return "a requantization multiplier times the sums' bound reaches 2^63";
		if (fast > *bound)
			*bound = fast;
	}
	return NULL;
}

/*
 * Validates the blob of len bytes for the model d describes.  On success
 * copies its weight set to set (d->bytes, aligned as the struct), stores
 * its version and returns 0; otherwise returns -EINVAL with the reason in
 * *why and, for a layer's bound, its ONNX node in *layer (else NULL); set
 * may then hold part of the rejected set, and must not be used.
 */
static inline int kml_set_check(const struct kml_set_desc *d, const u8 *blob,
				unsigned long len, void *set, u32 *version,
				const char **why, const char **layer)
{
	const u8 *rec = blob + KML_SET_HEADER, *img = rec + KML_SET_RECORD * d->n_dense;
	const u8 *s = set;
	u64 bound;
	u32 i, j;

	*layer = NULL;
	*why = "the blob's length is not this model's (truncated, or for another model)";
	if (len != kml_set_blob_bytes(d))
		return -EINVAL;
	*why = "checksum mismatch (corrupted)";
	if (kml_crc32c(blob, len - 4) != kml_le32(blob + len - 4))
		return -EINVAL;
	*why = "not a kmlc weight set (magic)";
	if (blob[0] != 'K' || blob[1] != 'M' || blob[2] != 'L' || blob[3] != 'W')
		return -EINVAL;
	*why = "another format version";
	if ((blob[4] | blob[5] << 8) != KML_SET_FORMAT)
		return -EINVAL;
	*why = d->fixed ? "float weights for a fixed-point model" :
		"fixed-point weights for a float model";
	if (blob[6] != d->fixed)
		return -EINVAL;
	*why = "built for another model structure (graph, shapes or formats differ)";
	for (i = 0; i < 32; i++)
		if (blob[8 + i] != d->structure[i])
			return -EINVAL;
	*why = "header sizes do not match the model";
	if (blob[7] != d->n_dense || kml_le32(blob + 44) != d->bytes)
		return -EINVAL;
	for (i = 0; i < d->n_dense; i++, rec += KML_SET_RECORD) {
		*layer = d->dense[i].name;
		*why = "its record names another kernel or accumulator";
		if (kml_le32(rec) != d->dense[i].kernel || rec[4] != d->dense[i].acc_bits ||
		    rec[5] | rec[6] | rec[7])
			return -EINVAL;
	}
	*layer = NULL;
	*why = "the set's tail padding is not zero";
	for (i = d->end; i < d->bytes; i++)
		if (img[i])
			return -EINVAL;
	__builtin_memcpy(set, img, d->bytes);
	*why = "it changes what the model pins: a fixed-point format or a tree's structure";
	for (i = 0; i < d->n_pinned; i++)
		for (j = d->pinned[i].off; j < d->pinned[i].off + d->pinned[i].len; j++)
			if (s[j] != ((const u8 *)d->builtin)[j])
				return -EINVAL;
	*why = "a float weight is not finite";
	for (i = 0; i < d->n_f32; i++)
		for (j = d->f32[i].off; j < d->f32[i].off + d->f32[i].len; j += 4)
			if ((*(const u32 *)(s + j) & 0x7f800000u) == 0x7f800000u)
				return -EINVAL;
	rec = blob + KML_SET_HEADER;
	for (i = 0; i < d->n_dense; i++, rec += KML_SET_RECORD) {
		*layer = d->dense[i].name;
		*why = kml_dense_check(&d->dense[i], s, &bound);
		if (*why)
			return -EINVAL;
		*why = "its record's bound is not the one its weights give";
		if (kml_le64(rec + 8) != bound)
			return -EINVAL;
	}
	*layer = NULL;
	*why = NULL;
	*version = kml_le32(blob + 40);
	return 0;
}

/*
 * What a module (kml_swap.c) or the twin (Twin.load_weights) publishes:
 * the set inferences run, NULL for the compiled one, and the generation of
 * that publish.  Each publish (a new set, a rollback, in the twin also a
 * return to the compiled set) has a generation above every earlier one,
 * even where the set is one that ran before; the compiled set at load is
 * generation 0.  A decision carries the generation of the set it ran on,
 * and a hook's benefit guard judges one generation at a time (kml_guard.h).
 */
struct kml_set_ref {
	const void *set;
	u64 gen;
};

/*
 * The set an inference runs: the one published in *cur, or builtin while
 * none is (NULL); *gen (unless gen is NULL) gets its generation, read from
 * the same published ref, so that set and generation always belong
 * together.  In the kernel the reader holds RCU-sched from here to
 * kml_set_read_end(), for the whole inference, so that it uses exactly one
 * set: rcu_read_lock_sched_notrace() only disables preemption, which any
 * context may do, NMI included (Documentation/RCU/NMI-RCU.rst), and the
 * writer (kml_swap.c) reuses a ref or frees a replaced set only after
 * synchronize_rcu(), which waits for RCU-sched readers too (the flavours
 * are one since v5.0).  In the twin, *cur is what Twin.load_weights()
 * published (one twin, one thread).
 */
static inline const void *kml_set_read_begin(const struct kml_set_ref __rcu *const *cur,
					     const void *builtin, u64 *gen)
{
	const struct kml_set_ref *r;

#ifdef __KERNEL__
	rcu_read_lock_sched_notrace();
	r = rcu_dereference_sched(*cur);
#else
	r = *cur;
#endif
	if (gen)
		*gen = r ? r->gen : 0;
	return r && r->set ? r->set : builtin;
}

static inline void kml_set_read_end(void)
{
#ifdef __KERNEL__
	rcu_read_unlock_sched_notrace();
#endif
}

#endif /* KML_WEIGHTS_H */
