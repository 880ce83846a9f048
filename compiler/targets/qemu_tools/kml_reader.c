// SPDX-License-Identifier: GPL-2.0
/*
 * A reader for kmlc's qemu tests, built static into the initramfs:
 *
 *   kml_reader seq|rand|mseq|mrand FILE PAGES COUNT [SEED]
 *	reads COUNT 4 KiB pages of FILE through the page cache, one file
 *	descriptor: pages 0, 1, 2, ... (seq, mseq) or pseudo-random pages
 *	below PAGES (rand, mrand), with pread() or, for mseq and mrand,
 *	through a shared mapping of the first PAGES pages (page faults, mmap
 *	read-around).  KML_FADVISE=random|sequential|normal in the
 *	environment: posix_fadvise() the file first.  KML_UNTIL=PATH: stop
 *	early, as if COUNT were reached, once PATH exists (looked for every
 *	256 pages): a load that lasts as long as the scenario needs it.
 *   kml_reader multi FILE NFILES PAGES COUNT HOLD
 *	opens FILE NFILES times; descriptor i reads pages i * PAGES .. (i + 1)
 *	* PAGES - 1, sequentially for even i and at random for odd i, COUNT
 *	pages each, the descriptors in turn; then keeps them open until the
 *	file HOLD exists.
 *   kml_reader phases FILE PAGES NPHASES DIR
 *	one descriptor: for each phase i, waits for DIR/go.i, reads PAGES
 *	pages sequentially from page 2 * i * PAGES on (a new stream: its
 *	first read misses), then creates DIR/done.i.
 *
 *   kml_reader race FILE ROUNDS
 *	with O_DIRECT on the first 4 KiB block of FILE: a writer process
 *	writes ROUNDS blocks, round r filled with r, each after the last
 *	completed; meanwhile the reader reads the block again and again and
 *	checks that a round, once read, is never followed by an older one
 *	(as on one disk).  Prints "reads N rounds_seen M backwards B".
 *
 * Prints the sum of the bytes read, so that runs can be compared.
 */
#define _FILE_OFFSET_BITS 64
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096

static unsigned long long next(unsigned long long *seed)
{
	*seed = *seed * 6364136223846793005ULL + 1442695040888963407ULL;
	return *seed >> 33;
}

static unsigned long long read_page(int fd, unsigned long long page)
{
	unsigned char buf[PAGE];
	unsigned long long sum = 0;
	int j;

	if (pread(fd, buf, sizeof(buf), (off_t)(page * PAGE)) != sizeof(buf)) {
		perror("pread");
		exit(1);
	}
	for (j = 0; j < PAGE; j++)
		sum += buf[j];
	return sum;
}

static int open_advised(const char *path)
{
	const char *adv = getenv("KML_FADVISE");
	int fd = open(path, O_RDONLY), a = -1;

	if (fd < 0) {
		perror(path);
		exit(1);
	}
	if (adv && !strcmp(adv, "random"))
		a = POSIX_FADV_RANDOM;
	else if (adv && !strcmp(adv, "sequential"))
		a = POSIX_FADV_SEQUENTIAL;
	else if (adv && !strcmp(adv, "normal"))
		a = POSIX_FADV_NORMAL;
	if (a >= 0 && posix_fadvise(fd, 0, 0, a)) {
		perror("posix_fadvise");
		exit(1);
	}
	return fd;
}

static void wait_for(const char *path)
{
	struct timespec ms = { 0, 10000000 };
	struct stat st;

	while (stat(path, &st))
		nanosleep(&ms, NULL);
}

static int multi(char **argv)
{
	unsigned long long nfiles = strtoull(argv[3], NULL, 0), pages = strtoull(argv[4], NULL, 0);
	unsigned long long count = strtoull(argv[5], NULL, 0), seed = 1, sum = 0, i, k;
	int *fd = calloc(nfiles, sizeof(*fd));

	if (!fd || !pages)
		return 2;
	for (i = 0; i < nfiles; i++)
		fd[i] = open_advised(argv[2]);
	for (k = 0; k < count; k++)
		for (i = 0; i < nfiles; i++)
			sum += read_page(fd[i], i * pages + (i & 1 ? next(&seed) % pages : k % pages));
	printf("%llu\n", sum);
	fflush(stdout);
	wait_for(argv[6]);
	return 0;
}

static int phases(char **argv)
{
	unsigned long long pages = strtoull(argv[3], NULL, 0), n = strtoull(argv[4], NULL, 0);
	unsigned long long sum = 0, i, k;
	char path[4096];
	int fd = open_advised(argv[2]);

	for (i = 0; i < n; i++) {
		snprintf(path, sizeof(path), "%s/go.%llu", argv[5], i);
		wait_for(path);
		for (k = 0; k < pages; k++)
			sum += read_page(fd, 2 * i * pages + k);
		snprintf(path, sizeof(path), "%s/done.%llu", argv[5], i);
		close(open(path, O_CREAT | O_WRONLY, 0644));
	}
	printf("%llu\n", sum);
	return 0;
}

static int race(char **argv)
{
	unsigned long long rounds = strtoull(argv[3], NULL, 0), r, seen = 0, reads = 0, back = 0;
	struct timespec pause = { 0, 5000000 };
	unsigned long long *blk;
	int fd, status;
	pid_t writer;

	if (posix_memalign((void **)&blk, PAGE, PAGE))
		return 1;
	fd = open(argv[2], O_RDWR | O_DIRECT);
	if (fd < 0) {
		perror(argv[2]);
		return 1;
	}
	memset(blk, 0, PAGE);
	if (pwrite(fd, blk, PAGE, 0) != PAGE) {
		perror("pwrite");
		return 1;
	}
	writer = fork();
	if (!writer) {
		for (r = 1; r <= rounds; r++) {
			for (int j = 0; j < PAGE / 8; j++)
				blk[j] = r;
			if (pwrite(fd, blk, PAGE, 0) != PAGE)
				_exit(1);
			nanosleep(&pause, NULL);
		}
		_exit(0);
	}
	while (waitpid(writer, &status, WNOHANG) == 0) {
		if (pread(fd, blk, PAGE, 0) != PAGE) {
			perror("pread");
			return 1;
		}
		reads++;
		if (blk[0] < seen)
			back++;
		else
			seen = blk[0];
	}
	printf("reads %llu rounds_seen %llu backwards %llu\n", reads, seen, back);
	return !WIFEXITED(status) || WEXITSTATUS(status);
}

int main(int argc, char **argv)
{
	unsigned long long pages, count, seed = 1, i, page, sum = 0;
	const unsigned char *map = NULL;
	const char *until;
	struct stat st;
	int fd, j, rnd, mapped;

	if (argc == 7 && !strcmp(argv[1], "multi"))
		return multi(argv);
	if (argc == 6 && !strcmp(argv[1], "phases"))
		return phases(argv);
	if (argc == 4 && !strcmp(argv[1], "race"))
		return race(argv);
	if (argc < 5)
		return 2;
	until = getenv("KML_UNTIL");
	mapped = argv[1][0] == 'm';
	rnd = !strcmp(argv[1] + mapped, "rand");
	pages = strtoull(argv[3], NULL, 0);
	count = strtoull(argv[4], NULL, 0);
	if (argc > 5)
		seed = strtoull(argv[5], NULL, 0);
	fd = open_advised(argv[2]);
	if (!pages)
		return 2;
	if (mapped) {
		map = mmap(NULL, pages * PAGE, PROT_READ, MAP_SHARED, fd, 0);
		if (map == MAP_FAILED) {
			perror("mmap");
			return 1;
		}
	}
	for (i = 0; i < count; i++) {
		if (until && !(i % 256) && !stat(until, &st))
			break;
		page = rnd ? next(&seed) % pages : i % pages;
		if (!map) {
			sum += read_page(fd, page);
			continue;
		}
		for (j = 0; j < PAGE; j++)
			sum += map[page * PAGE + j];
	}
	printf("%llu\n", sum);
	return 0;
}
