// Package bmcsim is a stateful Redfish emulator (DSP0266) that serves real
// vendor resource trees (the fixtures' `redfish/v1/.../index.json` mockups)
// as an [http.Handler].
//
// It models what the Machina drivers act on: ComputerSystem.Reset honouring
// the tree's ResetType AllowableValues (inline or through
// @Redfish.ActionInfo) and rejecting others with a Redfish error body; PATCH
// of the boot override (also through a System's @Redfish.Settings object);
// VirtualMedia InsertMedia/EjectMedia and PATCH-style media; sessions
// (X-Auth-Token) and Basic auth with account lockout; ETag checks (If-Match,
// 412/428) where the tree has @odata.etag; LastResetTime and BootProgress
// stamped on resets; BIOS settings pending in the Bios settings object until
// a reset, with registry refusals and Dell configuration jobs, firmware
// updates as tasks followed by a BMC restart, RAID volumes and Secure Boot
// applied at the next reset ([Firmware] names the BMC each models and what
// no tree shows). Vendor behaviours are [Quirks], and the real-BMC
// behaviours no fixture tree shows are named [Modes] (Basic only, no
// authentication, Once coerced to Continuous or ignored, no PowerCycle, no
// LastResetTime); [WriteSharedChassisTree] builds two systems in one
// chassis;
// failures are injected with [Server.Inject]; every request is recorded for
// tests ([Server.Requests]); power is delegated to a [PowerBackend].
//
// A parsed [Tree] is immutable and shared; each [Server] keeps only the
// resources it has changed (copy-on-write), so a simulated lab can run many
// BMCs in one process. bmcsim imports no Machina package.
package bmcsim
