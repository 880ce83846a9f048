// SPDX-License-Identifier: GPL-2.0
/*
 * mount(2) for kmlc's qemu tests, built static into the initramfs:
 *
 *   kml_mount SOURCE TARGET FSTYPE OPTIONS
 *
 * passes OPTIONS to the kernel as they are.  Busybox's mount cannot do
 * that for NFS: it runs its own NFSv2/v3 mount protocol for "nfs*" types,
 * while an NFSv4 mount needs only the kernel's text options, e.g.
 * kml_mount 127.0.0.1:/ /mnt nfs4 vers=4.2,addr=127.0.0.1,clientaddr=127.0.0.1
 */
#include <stdio.h>
#include <sys/mount.h>

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: kml_mount SOURCE TARGET FSTYPE OPTIONS\n");
		return 2;
	}
	if (mount(argv[1], argv[2], argv[3], 0, argv[4])) {
		perror("mount");
		return 1;
	}
	return 0;
}
