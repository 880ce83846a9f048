// SPDX-License-Identifier: GPL-2.0
/*
 * A minimal dmsetup for kmlc's qemu tests, built static into the initramfs:
 *
 *   kml_dmsetup create NAME "START LENGTH TARGET ARGS..."
 *   kml_dmsetup remove NAME
 *
 * It speaks the device-mapper ioctl protocol (linux/dm-ioctl.h) directly.
 */
#include <fcntl.h>
#include <linux/dm-ioctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

static void init(struct dm_ioctl *io, size_t size, const char *name)
{
	memset(io, 0, size);
	io->version[0] = DM_VERSION_MAJOR;
	io->version[1] = 0;
	io->version[2] = 0;
	io->data_size = size;
	io->data_start = sizeof(*io);
	snprintf(io->name, sizeof(io->name), "%s", name);
}

static int call(int fd, unsigned long req, struct dm_ioctl *io, const char *what)
{
	if (ioctl(fd, req, io) < 0) {
		perror(what);
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	union {
		struct dm_ioctl io;
		char buf[16384];
	} u;
	struct dm_target_spec *spec;
	unsigned long long start, len;
	char type[DM_MAX_TYPE_NAME];
	int fd, used;

	if (argc < 3)
		return 2;
	fd = open("/dev/mapper/control", O_RDWR);
	if (fd < 0) {
		perror("/dev/mapper/control");
		return 1;
	}
	if (!strcmp(argv[1], "remove")) {
		init(&u.io, sizeof(u.io), argv[2]);
		return call(fd, DM_DEV_REMOVE, &u.io, "remove");
	}
	if (strcmp(argv[1], "create") || argc != 4)
		return 2;
	if (sscanf(argv[3], "%llu %llu %127s %n", &start, &len, type, &used) < 3)
		return 2;
	init(&u.io, sizeof(u.io), argv[2]);
	if (call(fd, DM_DEV_CREATE, &u.io, "create"))
		return 1;
	init(&u.io, sizeof(u.buf), argv[2]);
	u.io.target_count = 1;
	spec = (struct dm_target_spec *)(u.buf + sizeof(u.io));
	spec->sector_start = start;
	spec->length = len;
	snprintf(spec->target_type, sizeof(spec->target_type), "%s", type);
	snprintf((char *)(spec + 1), sizeof(u.buf) - sizeof(u.io) - sizeof(*spec), "%s",
		 argv[3] + used);
	if (call(fd, DM_TABLE_LOAD, &u.io, "load"))
		return 1;
	init(&u.io, sizeof(u.io), argv[2]);
	return call(fd, DM_DEV_SUSPEND, &u.io, "resume");
}
