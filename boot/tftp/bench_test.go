package tftp

import (
	"sync"
	"testing"
)

// BenchmarkConcurrentDownloads fetches the fixture's 300 KiB file with 200
// concurrent library clients per iteration over loopback (blksize 1428).
func BenchmarkConcurrentDownloads(b *testing.B) {
	f := newFixtureB(b)
	for b.Loop() {
		var wg sync.WaitGroup
		errs := make(chan error, 200)
		for range 200 {
			wg.Go(func() {
				c := clientB(b, f.addr)
				wt, err := c.Receive("undionly.kpxe", "octet")
				if err == nil {
					_, err = wt.WriteTo(discard{})
				}
				if err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
	}
}
