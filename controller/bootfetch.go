package controller

import (
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/state"
)

// bootFetches notes on a server the ramdisk kernel and initrd its machine
// fetched (state.Store.NoteBootFetch), by TFTP in the Secure Boot chain or
// by HTTP from /boot/ramdisk/, from which the plan tells a machine whose
// boot stalled after the kernel (BootStalled: firmware, shim or GRUB
// refused it) from one silent for another reason. A kernel request
// carries no MAC, so the machine is known by the address its ramdisk
// script request came from (ipxe.Config.OnScript): the script names the
// kernel and initrd, and the boot loader fetches them from the same
// address right after.
type bootFetches struct {
	st  *state.Store
	now func() time.Time

	mu    sync.Mutex
	peers map[netip.Addr]bootPeer
}

// bootPeer is the machine a client address last fetched a ramdisk script
// for.
type bootPeer struct {
	server     string
	secureBoot bool
	at         time.Time
}

// bootPeerTTL is how long a script request's address stands for its
// machine: a boot loader fetches the kernel and initrd within seconds
// (minutes under emulation); past it a fetch from that address is not
// attributed.
const bootPeerTTL = 30 * time.Minute

// maxBootPeers bounds the address map; past it entries older than
// bootPeerTTL are dropped, and if that is not enough, all of them.
const maxBootPeers = 8192

func newBootFetches(st *state.Store) *bootFetches {
	return &bootFetches{st: st, now: time.Now, peers: map[netip.Addr]bootPeer{}}
}

// script is the iPXE handler's OnScript: peer now stands for a's machine.
func (b *bootFetches) script(a boot.Assignment, peer netip.Addr) {
	p := bootPeer{server: a.Name, secureBoot: a.SecureBoot, at: b.now()}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.peers) >= maxBootPeers {
		for addr, old := range b.peers {
			if p.at.Sub(old.at) > bootPeerTTL {
				delete(b.peers, addr)
			}
		}
		if len(b.peers) >= maxBootPeers {
			clear(b.peers)
		}
	}
	b.peers[peer.Unmap()] = p
}

// tftpServed is the TFTP server's OnServed: the Secure Boot chain's
// kernel and initrd ([boot.TFTPRamdiskKernel], [boot.TFTPRamdiskInitrd]).
func (b *bootFetches) tftpServed(name string, peer netip.Addr) {
	if name == boot.TFTPRamdiskKernel || name == boot.TFTPRamdiskInitrd {
		b.note(name, "tftp", peer)
	}
}

// httpServed is the iPXE handler's OnServed: a file of /boot/ramdisk/
// (vmlinuz, initrd.cpio.gz, arm64/...).
func (b *bootFetches) httpServed(path string, peer netip.Addr) {
	if base := path[strings.LastIndex(path, "/")+1:]; base == "vmlinuz" || base == "initrd.cpio.gz" {
		b.note("/boot/ramdisk/"+path, "http", peer)
	}
}

// note records file's fetch on the machine peer stands for, if any. It
// only takes a lock and queues a note (the TFTP event loop calls it).
func (b *bootFetches) note(file, via string, peer netip.Addr) {
	b.mu.Lock()
	p, ok := b.peers[peer.Unmap()]
	b.mu.Unlock()
	if !ok || b.now().Sub(p.at) > bootPeerTTL {
		return
	}
	b.st.NoteBootFetch(p.server, state.BootFetch{File: file, Via: via, SecureBoot: p.secureBoot})
}
