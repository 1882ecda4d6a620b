package redfish_test

import (
	"testing"

	"github.com/machina-metal/machina/bmc/bmctest"
)

// TestConformance runs the shared bmc.Driver suite over every vendor tree.
func TestConformance(t *testing.T) {
	for _, tree := range allTrees {
		t.Run(tree, func(t *testing.T) {
			bmctest.Run(t, func(t *testing.T) bmctest.Target {
				l := newLab(t, tree, labOpts{})
				return bmctest.Target{
					Driver:           l.drv,
					SetPower:         l.power.Set,
					PowerOn:          l.power.On,
					NoVirtualMedia:   tree == treeOpenBMC,
					NoPersistentBoot: tree == treeLenovo,
					// iLO 5 and XCC trees have neither LastResetTime nor
					// BootProgress, and ForceRestart never shows Off.
					NoResetEvidence: tree == treeHPE || tree == treeLenovo,
				}
			})
		})
	}
}
