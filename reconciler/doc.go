// Package reconciler acts: the executor ([Controller]) plans each pass
// with the pure plan (package reconciler/plan, [plan.Compute]) and carries
// the steps out with bounded workers, one step at a time per server,
// journalling BMC steps before any BMC call so a restart resumes them,
// one handler per action kind, and a failed step's error, event and retry
// time written in one transaction.
//
// It imports no Git package: the controller hands it each good
// revision's inventory ([Controller.SetDesired], or [Controller.Follow]
// over [Revisions]) and reads its plan back ([Controller.LastPlan]) for
// the status writer in gitops. Subpackages: plan (what decides), fleet
// (the BMC driver cache and the BMC sweep) and deployplan (what the
// machine-facing API hands a machine to install it).
package reconciler
