// Package reconciler decides and acts: [Plan] turns the desired inventory
// and the observed state into steps per server (pure: same inputs, same
// plan), and the executor ([Controller]) carries them out with bounded
// workers, one step at a time per server, journalling BMC steps before
// any BMC call so a restart resumes them.
//
// It imports no Git package: the controller hands it each good
// revision's inventory ([Controller.SetDesired]) and reads its plan back
// ([Controller.LastPlan]) for the status writer in gitops. Subpackages:
// fleet (the BMC driver cache and the BMC sweep) and deployplan (what the
// machine-facing API hands a machine to install it).
package reconciler
