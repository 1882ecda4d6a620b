package connlimit

import (
	"fmt"
	"syscall"
)

// Budget splits the process's file descriptors (RLIMIT_NOFILE) between a
// reserve that no inbound connection can take and the connection caps
// (Config.MaxTotal) of the controller's TCP listeners. Each listener's
// share is its own: a flood on the machine port fills Machine and leaves
// Admin and Join, and the reserve, untouched.
//
// The split of a limit L (capped at MaxBudgetLimit):
//
//	Reserve = max(256, L/4)   outbound and other work: BMC sessions (Redfish, IPMI),
//	                          Git fetches and pushes, etcd, the state file, DHCP/TFTP
//	                          sockets, image files, child processes' pipes
//	Admin   = max(16, (L-Reserve)/8)   the admin API (TLS 8444, or the loopback listener)
//	Join    = max(16, (L-Reserve)/8)   the join listener (8443)
//	Machine = the rest                 the machine-facing HTTP listener (8080)
//
// With L = 1024: Reserve 256, Admin 96, Join 96, Machine 576. With
// L = 1,048,576 (systemd's and Debian's usual hard limit): Reserve 262,144,
// Admin and Join 98,304 each, Machine 589,824.
type Budget struct {
	// Limit is the descriptor limit split (RLIMIT_NOFILE's soft limit,
	// capped at MaxBudgetLimit).
	Limit uint64
	// Reserve is what the listeners leave for everything else.
	Reserve int
	// Machine, Admin and Join are the listeners' MaxTotal.
	Machine, Admin, Join int
}

// MaxBudgetLimit caps the limit Split splits (an RLIMIT_NOFILE of
// RLIM_INFINITY would otherwise overflow an int on 32-bit hosts and mean
// nothing as a connection count).
const MaxBudgetLimit = 1 << 22

// minLimit is the smallest limit Split accepts: below it the reserve and
// the minimum listener shares do not fit.
const minLimit = 512

// Split divides limit as the Budget doc says. Errors: a limit below 512,
// where the reserve and listeners' minimums do not fit.
func Split(limit uint64) (Budget, error) {
	if limit < minLimit {
		return Budget{}, fmt.Errorf("connlimit: split %d descriptors: RLIMIT_NOFILE below %d leaves no room for a reserve and the listeners; raise LimitNOFILE", limit, minLimit)
	}
	limit = min(limit, MaxBudgetLimit)
	l := int(limit)
	b := Budget{Limit: limit, Reserve: max(256, l/4)}
	in := l - b.Reserve
	b.Admin, b.Join = max(16, in/8), max(16, in/8)
	b.Machine = in - b.Admin - b.Join
	return b, nil
}

// NoFile returns the process's RLIMIT_NOFILE soft limit after raising it to
// the hard limit if it is lower. Go 1.19 and later already raise it when
// the process starts (and restore the original for child processes); this
// raises it only where that did not happen, since a Setrlimit here also
// hands the raised limit to children. Errors: getrlimit(2) or
// setrlimit(2) failing.
func NoFile() (uint64, error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, fmt.Errorf("connlimit: getrlimit RLIMIT_NOFILE: %w", err)
	}
	if r.Cur < r.Max {
		r.Cur = r.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
			return 0, fmt.Errorf("connlimit: raise RLIMIT_NOFILE to %d: %w", r.Max, err)
		}
	}
	return r.Cur, nil
}
