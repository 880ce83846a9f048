// SPDX-License-Identifier: GPL-2.0
/*
 * dmsetup for kmlc's qemu tests, built static into the initramfs (on PATH
 * as dmsetup and kml_dmsetup).  The subset of dmsetup's commands the hook
 * scenarios and users' scripts need, with its syntax:
 *
 *   dmsetup create NAME --table "START LENGTH TARGET ARGS..."
 *   dmsetup reload NAME --table "START LENGTH TARGET ARGS..."
 *   dmsetup suspend|resume|remove|table|status NAME
 *   dmsetup message NAME SECTOR MESSAGE...
 *
 * It speaks the device-mapper ioctl protocol (linux/dm-ioctl.h) directly.
 * create also makes /dev/mapper/NAME, a link to the device's /dev/dm-N.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/dm-ioctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static union {
	struct dm_ioctl io;
	char buf[65536];
} u;

static int ctl = -1;

static void init(const char *name)
{
	memset(&u, 0, sizeof(u));
	u.io.version[0] = DM_VERSION_MAJOR;
	u.io.data_size = sizeof(u);
	u.io.data_start = sizeof(u.io);
	snprintf(u.io.name, sizeof(u.io.name), "%s", name);
}

static int call(unsigned long req, const char *what)
{
	if (ioctl(ctl, req, &u.io) < 0) {
		fprintf(stderr, "dmsetup %s %s: %s\n", what, u.io.name, strerror(errno));
		return 1;
	}
	return 0;
}

/* DM_TABLE_LOAD of one target line "START LENGTH TARGET ARGS..." */
static int load(const char *name, const char *line)
{
	struct dm_target_spec *spec;
	unsigned long long start, len;
	char type[DM_MAX_TYPE_NAME];
	int used = 0;

	if (sscanf(line, "%llu %llu %15s %n", &start, &len, type, &used) < 3) {
		fprintf(stderr, "dmsetup: bad table line: %s\n", line);
		return 2;
	}
	init(name);
	u.io.target_count = 1;
	spec = (struct dm_target_spec *)(u.buf + sizeof(u.io));
	spec->sector_start = start;
	spec->length = len;
	snprintf(spec->target_type, sizeof(spec->target_type), "%s", type);
	snprintf((char *)(spec + 1), sizeof(u.buf) - sizeof(u.io) - sizeof(*spec), "%s",
		 used ? line + used : "");
	return call(DM_TABLE_LOAD, "reload");
}

/* Prints "START LENGTH TARGET PARAMS" for each target of a TABLE/STATUS reply. */
static int print_targets(void)
{
	struct dm_target_spec *spec;
	unsigned int i, next = u.io.data_start;

	for (i = 0; i < u.io.target_count; i++) {
		spec = (struct dm_target_spec *)(u.buf + next);
		printf("%llu %llu %s %s\n", (unsigned long long)spec->sector_start,
		       (unsigned long long)spec->length, spec->target_type, (char *)(spec + 1));
		next += spec->next;
	}
	return 0;
}

static int mapper_link(const char *name)
{
	char dev[64], link[sizeof(u.io.name) + 16];

	init(name);
	if (call(DM_DEV_STATUS, "status"))
		return 1;
	snprintf(dev, sizeof(dev), "/dev/dm-%u", minor(u.io.dev));
	snprintf(link, sizeof(link), "/dev/mapper/%s", name);
	mkdir("/dev/mapper", 0755);
	unlink(link);
	return symlink(dev, link) ? perror(link), 1 : 0;
}

static const char *table_arg(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[3], "--table"))
		return argv[4];
	if (argc == 4)
		return argv[3];
	fprintf(stderr, "usage: dmsetup %s NAME --table \"START LENGTH TARGET ARGS...\"\n",
		argv[1]);
	return NULL;
}

int main(int argc, char **argv)
{
	const char *cmd = argc > 1 ? argv[1] : "", *name = argc > 2 ? argv[2] : "", *line;
	char link[sizeof(u.io.name) + 16];
	int ret, i, len;

	if (argc < 3) {
		fprintf(stderr, "usage: dmsetup create|reload|suspend|resume|remove|table|status|"
			"message NAME ...\n");
		return 2;
	}
	ctl = open("/dev/mapper/control", O_RDWR);
	if (ctl < 0) {
		perror("/dev/mapper/control");
		return 1;
	}
	if (!strcmp(cmd, "create")) {
		line = table_arg(argc, argv);
		if (!line)
			return 2;
		init(name);
		if (call(DM_DEV_CREATE, "create"))
			return 1;
		ret = load(name, line);
		if (!ret) {
			init(name);
			ret = call(DM_DEV_SUSPEND, "resume");	/* no SUSPEND flag: resume */
		}
		if (ret) {
			init(name);
			call(DM_DEV_REMOVE, "remove");
			return ret;
		}
		return mapper_link(name);
	}
	if (!strcmp(cmd, "reload")) {
		line = table_arg(argc, argv);
		return line ? load(name, line) : 2;
	}
	init(name);
	if (!strcmp(cmd, "suspend")) {
		u.io.flags = DM_SUSPEND_FLAG;
		return call(DM_DEV_SUSPEND, "suspend");
	}
	if (!strcmp(cmd, "resume"))
		return call(DM_DEV_SUSPEND, "resume");
	if (!strcmp(cmd, "remove")) {
		ret = call(DM_DEV_REMOVE, "remove");
		snprintf(link, sizeof(link), "/dev/mapper/%s", name);
		unlink(link);
		return ret;
	}
	if (!strcmp(cmd, "table") || !strcmp(cmd, "status")) {
		if (!strcmp(cmd, "table"))
			u.io.flags = DM_STATUS_TABLE_FLAG;
		return call(DM_TABLE_STATUS, cmd) || print_targets();
	}
	if (!strcmp(cmd, "message") && argc >= 5) {
		struct dm_target_msg *msg = (struct dm_target_msg *)(u.buf + sizeof(u.io));
		char *text = msg->message;

		msg->sector = strtoull(argv[3], NULL, 0);
		for (i = 4, len = 0; i < argc; i++)
			len += snprintf(text + len, sizeof(u.buf) - sizeof(u.io) - sizeof(*msg) - len,
					"%s%s", i > 4 ? " " : "", argv[i]);
		return call(DM_TARGET_MSG, "message");
	}
	fprintf(stderr, "dmsetup: unknown command %s\n", cmd);
	return 2;
}
