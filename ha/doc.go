// Package ha makes several `machina serve` processes on one etcd cluster act
// as one controller: leader election on an etcd session lease
// (go.etcd.io/etcd/client/v3/concurrency), and the provisioning virtual IP
// that moves with the leader (netlink address plus gratuitous ARP).
//
// Only the leader acts (reconciles, drives BMCs, writes status, serves
// DHCP/TFTP and the machine-facing endpoints); see docs/ha.md. The package
// holds no controller logic and imports no other Machina package: the
// controller passes its start and stop functions in.
package ha
