// SPDX-License-Identifier: GPL-2.0
/*
 * The userspace twin as a program: for a twin built for another
 * architecture (arm64) and run under qemu-user, where Python cannot load
 * it.  Built with the model's own sources (the twin's), the twin's flags,
 * and -DKML_INFER_BATCH=kml_<name>_infer_batch.
 *
 *   kml_run [WEIGHTS] < IN > OUT
 *
 * IN is rows of the model's in[] elements, raw, in this machine's byte
 * order; OUT gets as many rows of out[] elements, then one uint32 per row:
 * the values it saturated.  WEIGHTS, if given, is a weight set's image
 * (the struct a checked .kmlw blob holds), else the built-in set runs.
 * Exit status: 0, or 1 with one line on stderr.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KML_INFER_BATCH
#error "build with -DKML_INFER_BATCH=kml_<name>_infer_batch"
#endif

/* The twin's entry points (<name>_twin.c); the pointers are the model's types */
extern const unsigned long kml_twin_sizes[7];
int KML_INFER_BATCH(const void *w, const void *in, void *out, unsigned long n,
		    void *workspace, unsigned int *saturated);

static void *slurp(FILE *f, size_t *len)
{
	size_t cap = 1 << 16, n = 0, got;
	char *buf = malloc(cap);

	while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
		n += got;
		if (n == cap) {
			char *more = realloc(buf, cap * 2);

			if (!more) {
				free(buf);
				return NULL;
			}
			buf = more;
			cap *= 2;
		}
	}
	*len = n;
	return buf;
}

static int fail(const char *why)
{
	fprintf(stderr, "kml_run: %s\n", why);
	return 1;
}

int main(int argc, char **argv)
{
	size_t in_row = kml_twin_sizes[0] * kml_twin_sizes[4];
	size_t out_row = kml_twin_sizes[1] * kml_twin_sizes[5];
	void *weights = NULL, *in, *out, *workspace;
	unsigned int *sat;
	size_t len, n;
	int ret;

	if (argc > 2)
		return fail("usage: kml_run [WEIGHTS] < IN > OUT");
	if (argc == 2) {
		FILE *f = fopen(argv[1], "rb");
		size_t wlen;

		if (!f)
			return fail("cannot open the weight set");
		weights = slurp(f, &wlen);
		fclose(f);
		if (!weights || wlen < kml_twin_sizes[6])
			return fail("the weight set is shorter than the model's");
	}
	in = slurp(stdin, &len);
	if (!in || !in_row || len % in_row)
		return fail("the input is not whole rows");
	n = len / in_row;
	out = calloc(n ? n : 1, out_row);
	sat = calloc(n ? n : 1, sizeof(*sat));
	workspace = calloc(1, kml_twin_sizes[2] + 8);
	if (!out || !sat || !workspace)
		return fail("out of memory");
	ret = KML_INFER_BATCH(weights, in, out, n, workspace, sat);
	if (ret) {
		fprintf(stderr, "kml_run: the model returned %d\n", ret);
		return 1;
	}
	if (fwrite(out, out_row, n, stdout) != n || fwrite(sat, sizeof(*sat), n, stdout) != n)
		return fail("cannot write the output");
	return 0;
}
