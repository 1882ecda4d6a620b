package reconciler

import "github.com/machina-metal/machina/reconciler/plan/plantest"

// The plan's fixtures (plantest), shared with the plan's and gitops's
// status tests.
var (
	planT0           = plantest.T0
	exampleInventory = plantest.Example
	openEnrolStore   = plantest.Store
	testLogger       = plantest.Logger
)
