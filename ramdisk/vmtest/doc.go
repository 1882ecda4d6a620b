// Package vmtest holds the end-to-end test of the ramdisk: it builds the
// kernel and initrd with scripts/build-ramdisk.sh, boots them in qemu (TCG;
// KVM on the lab machines is nested and unusable) with user-mode networking
// whose only path out is a guestfwd to a reference controller on the host's
// loopback, and checks that the agent commissions and, in deploy mode,
// writes a verified image plus a NoCloud seed to the VM's disk.
// The package has no non-test code.
package vmtest
