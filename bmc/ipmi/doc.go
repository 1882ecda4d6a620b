// Package ipmi is the bmc.Driver for IPMI v2.0 BMCs over RMCP+ ("lanplus",
// IPMI v2.0 §13), built on github.com/bougou/go-ipmi.
//
// What it does, and where the behaviour comes from:
//
//   - Session: cipher suites are tried in order (default 17, then 3), each
//     with a short handshake timeout; the suite that worked is cached for the
//     next session. A RAKP authentication-code mismatch (wrong password, §13.31)
//     or RMCP+ status 0Dh (unauthorized name, disabled user) is reported as
//     [bmc.ErrAuth] at once, never as a cipher mismatch.
//   - Lost UDP datagrams are retransmitted (Config.Retries). A session the BMC
//     no longer knows (it restarted) is re-established once per call. The
//     exceptions are Chassis Control cycle and hard reset, which are not
//     idempotent: ipmi_sim runs a retransmitted cycle twice. They are sent
//     once; a lost answer is judged from chassis status and never resent.
//   - Power: Chassis Control (NetFn 00h, Cmd 02h) values 00h off, 01h on,
//     02h cycle, 03h hard reset, 05h soft shutdown. Every action is idempotent
//     and verified by polling Get Chassis Status (Cmd 01h) byte 1 bit 0.
//     Cycle falls back to reset and then to off+on when the BMC rejects it
//     with 0xD5, 0xCC, 0xC1 (and 0xC9, 0xD6); cycle and reset of a powered-off
//     chassis power it on (bmc-toolbox/bmclib#211, #223).
//   - Boot override: Set System Boot Options (Cmd 08h) parameter 5 written as
//     five explicit data bytes (see [EncodeBootFlags]) and read back with Get
//     System Boot Options (Cmd 09h).
//   - Read model: Get Device ID, FRU 0 (board and product areas), sensor
//     readings (temperatures, watts), SEL entries; Get System GUID when the
//     BMC answers it. BIOS version and NIC MACs are listed as missing.
//   - Serial console: IPMI SOL through ipmitool, the password passed in the
//     IPMI_PASSWORD environment variable (ipmitool -E), never in argv.
//
// Virtual media does not exist in IPMI: InsertMedia returns bmc.ErrUnsupported.
//
// ipmi imports only the bmc package of this project.
package ipmi
