package images

import (
	"os"
	"syscall"
)

// startWriteback asks the kernel to begin writing [off, off+n) of f to disk
// now (sync_file_range(2) with SYNC_FILE_RANGE_WRITE) without waiting for
// it. Streaming a large image this way overlaps disk writes with download
// and hashing, instead of leaving gigabytes of dirty pages for the final
// fsync. Errors are ignored: the fsync before rename still guarantees
// durability.
func startWriteback(f *os.File, off, n int64) {
	const syncFileRangeWrite = 2
	syscall.Syscall6(syscall.SYS_SYNC_FILE_RANGE, f.Fd(), uintptr(off), uintptr(n), syncFileRangeWrite, 0, 0)
}
