package peertest

import (
	"os"
	"testing"
)

func testBinary(t *testing.T) string {
	t.Helper()
	p, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestHelperNeedsMissingPeer is the child of TestMissingFailsOutsideQuickMode;
// it does nothing unless MACHINA_PEERTEST_CHILD=1.
func TestHelperNeedsMissingPeer(t *testing.T) {
	if os.Getenv("MACHINA_PEERTEST_CHILD") != "1" {
		return
	}
	Command(t, "qemu-img")
}
