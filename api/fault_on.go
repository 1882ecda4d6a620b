//go:build machinafault

package api

import (
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// Fault points, as in fault.go.
const (
	faultAfterUse         = "after-use"
	faultPlanBeforeCommit = "plan-before-commit"
	faultDoneBeforeCommit = "done-before-commit"
)

// MACHINA_FAULT_KILL=POINT:N kills this process with SIGKILL the Nth time
// it reaches POINT. Only binaries built with -tags machinafault (the crash
// tests) read it.
var faultPoint, faultAt = func() (string, int64) {
	p, n, ok := strings.Cut(os.Getenv("MACHINA_FAULT_KILL"), ":")
	if !ok {
		return "", 0
	}
	at, err := strconv.ParseInt(n, 10, 64)
	if err != nil || at < 1 {
		return "", 0
	}
	return p, at
}()

var faultHits atomic.Int64

func fault(point string) {
	if faultPoint == "" || point != faultPoint {
		return
	}
	if faultHits.Add(1) == faultAt {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // never returns: the kill is on its way
	}
}
