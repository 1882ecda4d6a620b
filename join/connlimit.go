package join

// MaxConnsPerIP is the open-connection cap per source address of the join
// listener: far above what one machine, operator or browser opens, far
// below the descriptors a host has, so one address cannot hold them all
// (slow bodies on an unauthenticated route held 20,000 of 20,000). A
// caller that wraps the listener itself (connlimit.Config.MaxPerIP) uses
// it too.
const MaxConnsPerIP = 64
