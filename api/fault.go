//go:build !machinafault

package api

// Fault points: where the crash tests (built with -tags machinafault)
// SIGKILL the controller. In the product build fault is a no-op and no
// environment variable or request can reach it.
const (
	faultAfterUse         = "after-use"          // a token use committed, its answer not yet written
	faultPlanBeforeCommit = "plan-before-commit" // a plan made, its transaction not committed
	faultDoneBeforeCommit = "done-before-commit" // a done checked, deploying→deployed not committed
)

func fault(string) {}
