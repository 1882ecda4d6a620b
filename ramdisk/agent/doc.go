// Package agent is the code of the Machina ramdisk that touches the hardware:
// it collects hardware facts from sysfs, procfs and DMI under a configurable
// root (so tests run against recorded trees), runs the four commissioning
// tests, picks the target disk, writes a verified image to it and adds a
// cloud-init NoCloud seed partition.
//
// It imports only the standard library and api/v1 (docs/architecture.md, rule "agent"): the
// ramdisk's trust boundary is the wire types. The /init process that wires
// this together (mounts, modules, DHCP) is cmd/machina-agent.
//
// Nothing here runs a shell: filesystems and partition tables are written
// from Go.
package agent
