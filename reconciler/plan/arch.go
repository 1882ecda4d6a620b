package plan

import (
	"fmt"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// ServerArch returns a server's architecture (GOARCH names) and where it
// comes from: "reported" (its commissioning report: the kernel's arch,
// state.Hardware.Arch, or the firmware's SMBIOS arch when the kernel is
// the 32-bit member of its family, state.Hardware.MachineArch), "stated"
// (servers.yaml arch) or "assumed" (a report from an agent that predates
// the arch fact: every such agent was an amd64 build, the only ramdisk
// there was). It returns "" and "" for a server that was never
// commissioned and states nothing. obs may be nil. It does not allocate.
func ServerArch(ws *inventory.Server, obs *state.Server) (arch, source string) {
	var reported string
	if obs != nil {
		reported = obs.Hardware.MachineArch()
	}
	switch {
	case reported != "" && obs.Hardware.Arch == "":
		return reported, "stated by SMBIOS; the report names no kernel arch"
	case reported != "" && reported != obs.Hardware.Arch:
		return reported, "stated by SMBIOS, under a 32-bit commissioning kernel"
	case reported != "":
		return reported, "reported by commissioning"
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

// archBlocked reports whether a server's architecture is in doubt, so it
// is neither allocated nor deployed: its commissioning kernel and its
// SMBIOS tables name different machines (state.Hardware.ArchConflict: not
// a 32-bit kernel on its 64-bit family, which is no conflict), or
// servers.yaml states another arch than the report's
// (state.Hardware.MachineArch). obs may be nil. It does not allocate.
func archBlocked(ws *inventory.Server, obs *state.Server) bool {
	if obs == nil {
		return false
	}
	if obs.Hardware.ArchConflict() {
		return true
	}
	reported := obs.Hardware.MachineArch()
	return ws.Arch != "" && reported != "" && ws.Arch != reported
}

// archConditions guards allocation and deploy (archBlocked): a server
// whose kernel-reported and SMBIOS architectures conflict gets
// ArchMismatch/FirmwareArchDiffers, one whose stated and reported
// architectures differ ArchMismatch/StatedArchDiffers (the firmware
// condition wins when both hold: one ArchMismatch per server), and either
// gets no allocate or deploy step (which value is wrong needs a human); a
// server planned to allocate or deploy a profile whose image is of another
// architecture gets ArchMismatch/ImageArchitecture and those steps are
// dropped. It returns the conditions and the steps kept. It runs for
// every desired server on every pass and allocates nothing for one it
// has nothing to say about (the subject string is built only for a
// condition: BenchmarkPlan10k).
func archConditions(want *inventory.Inventory, ws *inventory.Server, obs *state.Server, steps []Step) ([]Condition, []Step) {
	var conds []Condition
	var hw *state.Hardware
	if obs != nil {
		hw = obs.Hardware
	}
	mismatch := archBlocked(ws, obs)
	switch {
	case hw.ArchConflict():
		conds = append(conds, Condition{Subject: "server/" + ws.Name, Type: "ArchMismatch", Reason: "FirmwareArchDiffers",
			Message: fmt.Sprintf("commissioning kernel reported arch %s, SMBIOS firmware states %s: not allocated or deployed until a recommission reports one architecture", hw.Arch, hw.SMBIOSArch)})
	case mismatch:
		conds = append(conds, Condition{Subject: "server/" + ws.Name, Type: "ArchMismatch", Reason: "StatedArchDiffers",
			Message: fmt.Sprintf("servers.yaml states arch %s, commissioning reported %s: not allocated or deployed until servers.yaml says what the machine is", ws.Arch, hw.MachineArch())})
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
