package plan

import (
	"fmt"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// ServerArch returns a server's architecture (GOARCH names) and where it
// comes from: "reported" (its commissioning report, state.Hardware.Arch),
// "stated" (servers.yaml arch) or "assumed" (a report from an agent that
// predates the arch fact: every such agent was an amd64 build, the only
// ramdisk there was). It returns "" and "" for a server that was never
// commissioned and states nothing. obs may be nil.
func ServerArch(ws *inventory.Server, obs *state.Server) (arch, source string) {
	switch {
	case obs != nil && obs.Hardware != nil && obs.Hardware.Arch != "":
		return obs.Hardware.Arch, "reported by commissioning"
	case ws != nil && ws.Arch != "":
		return ws.Arch, "stated in servers.yaml"
	case obs != nil && obs.Hardware != nil:
		return inventory.ArchAMD64, "assumed: its commissioning report predates the arch fact"
	}
	return "", ""
}

// imageArch is the architecture of profile's image in want (images.yaml
// arch, amd64 by default), or "" when the profile or its image is unknown.
func imageArch(want *inventory.Inventory, profile string) (image, arch string) {
	p := want.Profile(profile)
	if p == nil {
		return "", ""
	}
	im := want.Image(p.Image)
	if im == nil {
		return p.Image, ""
	}
	return im.Name, im.Arch
}

// archFits reports whether a server may take profile's image: its
// architecture is the image's, or one of them is not known yet.
func archFits(want *inventory.Inventory, profile string, ws *inventory.Server, obs *state.Server) bool {
	_, ia := imageArch(want, profile)
	sa, _ := ServerArch(ws, obs)
	return ia == "" || sa == "" || ia == sa
}

// archConditions guards allocation and deploy: a server whose stated and
// reported architectures differ gets ArchMismatch/StatedArchDiffers and no
// allocate or deploy step (which of the two is wrong needs a human); a
// server planned to allocate or deploy a profile whose image is of another
// architecture gets ArchMismatch/ImageArchitecture and those steps are
// dropped. It returns the conditions and the steps kept. It runs for
// every desired server on every pass and allocates nothing for one it
// has nothing to say about (the subject string is built only for a
// condition: BenchmarkPlan10k).
func archConditions(want *inventory.Inventory, ws *inventory.Server, obs *state.Server, steps []Step) ([]Condition, []Step) {
	var conds []Condition
	stated, reported := ws.Arch, ""
	if obs != nil && obs.Hardware != nil {
		reported = obs.Hardware.Arch
	}
	mismatch := stated != "" && reported != "" && stated != reported
	if mismatch {
		conds = append(conds, Condition{Subject: "server/" + ws.Name, Type: "ArchMismatch", Reason: "StatedArchDiffers",
			Message: fmt.Sprintf("servers.yaml states arch %s, commissioning reported %s: not allocated or deployed until servers.yaml says what the machine is", stated, reported)})
	}
	kept := steps[:0:0]
	refused := map[string]bool{}
	for _, s := range steps {
		if s.Action != ActAllocate && s.Action != ActDeploy {
			kept = append(kept, s)
			continue
		}
		if mismatch {
			continue
		}
		if archFits(want, s.Profile, ws, obs) {
			kept = append(kept, s)
			continue
		}
		if !refused[s.Profile] {
			refused[s.Profile] = true
			image, ia := imageArch(want, s.Profile)
			sa, src := ServerArch(ws, obs)
			conds = append(conds, Condition{Subject: "server/" + ws.Name, Type: "ArchMismatch", Reason: "ImageArchitecture",
				Message: fmt.Sprintf("profile %s's image %s is %s; this server is %s (%s): the image is not written to it", s.Profile, image, ia, sa, src)})
		}
	}
	return conds, kept
}
