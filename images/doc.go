// Package images owns Machina's OS images: the catalog of upstream cloud
// images (catalog.yaml, embedded), import by catalog name or URL (resumable
// HTTP download with retries, checksum-file parsing and verification), format
// detection by magic bytes, conversion of qcow2 to raw with qemu-img, a
// content-addressed on-disk store, and an HTTP handler that serves stored raw
// images with Range requests, gated by a deploy token.
//
// The package imports no other Machina package. The controller's state store
// plugs in through two small interfaces declared here: [TokenChecker] (the
// single-use or short-lived deploy token the ramdisk presents) and
// [StatusRecorder] (pending, downloading with percent, verified, failed with
// the reason).
//
// # Caveats
//
// PGP clear-signed checksum files are unwrapped but their signatures are not
// verified: Machina carries no distribution keyrings. The checksum itself is
// always verified.
//
// qemu-img cannot write raw output to a pipe, so conversion writes to a small
// NBD export served by this package on a private unix socket (nbd.go): the
// export writes the raw file and hashes the bytes as qemu-img sends them, in
// order, so the raw checksum is computed during conversion. Should qemu-img
// ever write out of order, the raw file is hashed after conversion instead.
package images
