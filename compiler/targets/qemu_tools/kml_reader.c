// SPDX-License-Identifier: GPL-2.0
/*
 * A reader for kmlc's qemu tests, built static into the initramfs:
 *
 *   kml_reader seq|rand|mseq|mrand FILE PAGES COUNT [SEED]
 *
 * reads COUNT 4 KiB pages of FILE through the page cache, one file
 * descriptor: pages 0, 1, 2, ... (seq, mseq) or pseudo-random pages below
 * PAGES (rand, mrand), with pread() or, for mseq and mrand, through a
 * shared mapping of the first PAGES pages (page faults, mmap read-around).
 * Prints the sum of the bytes read, so runs can be compared.
 */
#define _FILE_OFFSET_BITS 64
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	unsigned long long pages, count, seed = 1, i, page, sum = 0;
	unsigned char buf[4096];
	const unsigned char *map = NULL, *p;
	int fd, j, rnd, mapped;

	if (argc < 5)
		return 2;
	mapped = argv[1][0] == 'm';
	rnd = !strcmp(argv[1] + mapped, "rand");
	pages = strtoull(argv[3], NULL, 0);
	count = strtoull(argv[4], NULL, 0);
	if (argc > 5)
		seed = strtoull(argv[5], NULL, 0);
	fd = open(argv[2], O_RDONLY);
	if (fd < 0 || !pages) {
		perror(argv[2]);
		return 1;
	}
	if (mapped) {
		map = mmap(NULL, pages * sizeof(buf), PROT_READ, MAP_SHARED, fd, 0);
		if (map == MAP_FAILED) {
			perror("mmap");
			return 1;
		}
	}
	for (i = 0; i < count; i++) {
		seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
		page = rnd ? (seed >> 33) % pages : i % pages;
		p = map ? map + page * sizeof(buf) : buf;
		if (!map && pread(fd, buf, sizeof(buf), (off_t)(page * sizeof(buf))) != sizeof(buf)) {
			perror("pread");
			return 1;
		}
		for (j = 0; j < (int)sizeof(buf); j++)
			sum += p[j];
	}
	printf("%llu\n", sum);
	return 0;
}
