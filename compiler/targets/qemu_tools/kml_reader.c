// SPDX-License-Identifier: GPL-2.0
/*
 * A reader for kmlc's qemu tests, built static into the initramfs:
 *
 *   kml_reader seq|rand FILE PAGES COUNT [SEED]
 *
 * reads COUNT 4 KiB pages of FILE through the page cache, one file
 * descriptor: pages 0, 1, 2, ... (seq) or pseudo-random pages below PAGES
 * (rand).  Prints the sum of the bytes read, so runs can be compared.
 */
#define _FILE_OFFSET_BITS 64
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	unsigned long long pages, count, seed = 1, i, page, sum = 0;
	unsigned char buf[4096];
	int fd, j, rnd;

	if (argc < 5)
		return 2;
	rnd = !strcmp(argv[1], "rand");
	pages = strtoull(argv[3], NULL, 0);
	count = strtoull(argv[4], NULL, 0);
	if (argc > 5)
		seed = strtoull(argv[5], NULL, 0);
	fd = open(argv[2], O_RDONLY);
	if (fd < 0 || !pages) {
		perror(argv[2]);
		return 1;
	}
	for (i = 0; i < count; i++) {
		seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
		page = rnd ? (seed >> 33) % pages : i % pages;
		if (pread(fd, buf, sizeof(buf), (off_t)(page * sizeof(buf))) != sizeof(buf)) {
			perror("pread");
			return 1;
		}
		for (j = 0; j < (int)sizeof(buf); j++)
			sum += buf[j];
	}
	printf("%llu\n", sum);
	return 0;
}
