// Package agent is the code of the Machina ramdisk that touches the hardware:
// it collects hardware facts from sysfs, procfs and DMI under a configurable
// root (so tests run against recorded trees), runs the four commissioning
// tests, picks the target disk, writes a verified image to it and adds a
// cloud-init NoCloud seed partition.
//
// Of the project it imports only api/v1 (docs/architecture.md, rule
// "agent"): the ramdisk's trust boundary is the wire types. The /init
// process that wires this together (mounts, modules, DHCP) is
// cmd/machina-agent.
//
// Nothing here runs a shell: filesystems and partition tables are written
// from Go.
//
// # Disk formats: what comes from go-diskfs and what is ours
//
// Partition tables are read and edited with github.com/diskfs/go-diskfs
// (partition/gpt, partition/mbr): [AddSeedPartition] appends the seed entry
// in the first free slot, relocates the backup GPT to the disk's end
// (Table.Resize, Table.Write: backup first, then primary, each synced) and
// keeps the MBR's boot code; [WipeSignatures] reads the old table with it.
// Two pieces stay ours, each for a measured reason:
//   - gptHeader bounds the header's entry count and size (at most 1024 × 1024
//     bytes, inside the disk) before go-diskfs reads it: go-diskfs v1.9.4
//     allocates count × size as the header says, and an old disk's header is
//     written by whoever used the machine before (FuzzReadPartTable).
//   - On a disk past 2 TiB the protective MBR's size is set to 0xFFFFFFFF
//     (UEFI 2.10 §5.2.3); go-diskfs v1.9.4 writes the last LBA truncated to
//     32 bits (TestAddSeedPartitionBeyond2TiB failed without the fix:
//     "ee ... ff ff ff 7f").
//
// The seed's FAT16 filesystem ([MakeFAT16], about 150 lines) stays ours.
// go-diskfs v1.9.4's filesystem/fat16, tried in place of it on the same
// tests, made images that `fsck.fat -n` reports inconsistent on every
// build ("Reclaimed 1 unused cluster": Create marks cluster 2 allocated as
// if it held a FAT32 root directory) and gave a zero-length file a cluster
// ("File size is 0 bytes, cluster chain length is > 0 bytes"). It also
// takes file times from time.Now unless SOURCE_DATE_EPOCH is set in the
// process environment, a process-wide switch, where the seed must be
// byte-for-byte reproducible. An ISO9660 "cidata" volume (cloud-init's
// NoCloud reads one too) was not simpler: go-diskfs's iso9660 writer stamps
// the volume descriptors with time.Now (no option) and builds from a
// workspace folder on disk. MakeFAT16 is checked by fsck.fat, mtools and
// blkid (TestMakeFAT16ReadByMtools, which also builds it twice and compares
// bytes) and by TestDeployReproducible (two deploys, identical disks).
//
// # Zeros the device makes
//
// Ranges that must read as zeros (old signatures, the seed partition's
// free space) are not written with zeros where the target can zero them:
// a block device takes the BLKZEROOUT ioctl (linux/fs.h; WRITE ZEROES on
// the bus, or zero pages the kernel writes), a file takes fallocate(2)
// FALLOC_FL_PUNCH_HOLE (see [File], [Zeroer]). Deploy writes the seed as
// [NewFAT16]'s non-zero extents (about 4 KiB of its 8 MiB) over its
// zeroed range; TestMakeFAT16Golden pins MakeFAT16's bytes to those of the
// full-image builder before it, and TestDeploySeedEqualsFullImageWrite
// compares whole disks against the full-image write.
//
// Static agent binary (CGO_ENABLED=0, -trimpath -ldflags "-s -w"), measured
// when go-diskfs came in: 7,446,690 bytes before, 7,520,418 after (+72 KiB);
// gzip -9: 3,074,667 → 3,103,637.
package agent
