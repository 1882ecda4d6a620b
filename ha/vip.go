package ha

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// VIPConfig describes the provisioning address that moves with the leader.
type VIPConfig struct {
	// Prefix is the address and its prefix length on the provisioning
	// subnet, e.g. 10.10.0.2/24. Required; IPv4 only (gratuitous ARP is an
	// IPv4 mechanism, RFC 5227 section 3; IPv6 would need unsolicited
	// neighbour advertisements, RFC 4861 section 7.2.6, not built).
	Prefix netip.Prefix
	// Interface is the provisioning interface the address is added to.
	// Required; a Linux interface name (at most 15 bytes, no '/' or space).
	Interface string
	// Announcements is how many gratuitous ARP rounds Acquire sends (each
	// round one ARP request and one ARP reply, both with sender and target
	// protocol address the VIP). Zero means 3.
	Announcements int
	// Interval is the time between rounds. Zero means 500 ms.
	Interval time.Duration
	// Logger: Info when the address is added or removed. Nil: discard.
	Logger *slog.Logger
}

// VIP adds and removes the provisioning virtual IP on one interface of the
// network namespace of the thread that calls [VIP.Acquire] and
// [VIP.Release]: the process's own namespace in production. Safe for
// concurrent use; Acquire and Release are idempotent.
//
// It talks netlink (RTM_NEWADDR / RTM_DELADDR) through
// github.com/vishvananda/netlink, the library join/node already uses for
// host networks: no command line to build or validate, and errors come back
// as errno values rather than parsed text. Announcements go out on a raw
// AF_PACKET socket (golang.org/x/sys/unix) with hand-built 42-byte Ethernet
// + ARP frames, as keepalived does.
type VIP struct {
	cfg VIPConfig
	log *slog.Logger

	mu     sync.Mutex
	held   bool
	cancel context.CancelFunc // stops the announcement goroutine
	done   chan struct{}
}

// NewVIP validates cfg and returns a VIP that is not yet held.
func NewVIP(cfg VIPConfig) (*VIP, error) {
	if !cfg.Prefix.IsValid() {
		return nil, errors.New("ha: vip: address/prefix is required (e.g. 10.10.0.2/24)")
	}
	if !cfg.Prefix.Addr().Is4() || cfg.Prefix.Addr().Is4In6() {
		return nil, fmt.Errorf("ha: vip %s: only IPv4 is supported (gratuitous ARP)", cfg.Prefix)
	}
	if a := cfg.Prefix.Addr(); a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return nil, fmt.Errorf("ha: vip %s: not a unicast address", cfg.Prefix)
	}
	if err := validIfName(cfg.Interface); err != nil {
		return nil, fmt.Errorf("ha: vip interface: %w", err)
	}
	if cfg.Announcements < 0 || cfg.Interval < 0 {
		return nil, errors.New("ha: vip: announcements and interval must not be negative")
	}
	if cfg.Announcements == 0 {
		cfg.Announcements = 3
	}
	if cfg.Interval == 0 {
		cfg.Interval = 500 * time.Millisecond
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &VIP{cfg: cfg, log: log.With("vip", cfg.Prefix.String(), "interface", cfg.Interface)}, nil
}

// validIfName applies the kernel's rules for a link name (dev_valid_name).
func validIfName(s string) error {
	if s == "" || len(s) >= unix.IFNAMSIZ || s == "." || s == ".." {
		return fmt.Errorf("%q is not a valid interface name", s)
	}
	for _, c := range []byte(s) {
		if c == '/' || c == ':' || c <= ' ' || c == 0x7f {
			return fmt.Errorf("%q is not a valid interface name", s)
		}
	}
	return nil
}

func (v *VIP) addr() *netlink.Addr {
	a := v.cfg.Prefix.Addr().As4()
	return &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a[:]), Mask: net.CIDRMask(v.cfg.Prefix.Bits(), 32)}, Label: ""}
}

// Acquire adds the address to the interface (an address already there is
// kept) and announces it: the first gratuitous ARP round before Acquire
// returns, the other rounds from a goroutine every Interval until done or
// Release. Errors: the interface is missing or down-level netlink failed
// (nothing was added), or the first announcement could not be sent (the
// address is removed again).
func (v *VIP) Acquire(ctx context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("ha: vip: netlink: %w", privilegeHint(err, "CAP_NET_ADMIN", "AF_NETLINK"))
	}
	defer h.Close()
	link, err := h.LinkByName(v.cfg.Interface)
	if err != nil {
		return fmt.Errorf("ha: vip: interface %s: %w", v.cfg.Interface, err)
	}
	mac := link.Attrs().HardwareAddr
	if len(mac) != 6 {
		return fmt.Errorf("ha: vip: interface %s has no Ethernet address", v.cfg.Interface)
	}
	added := false
	if err := h.AddrAdd(link, v.addr()); err != nil {
		if !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("ha: vip: add %s to %s: %w", v.cfg.Prefix, v.cfg.Interface, privilegeHint(err, "CAP_NET_ADMIN", "AF_NETLINK"))
		}
	} else {
		added = true
	}
	conn, err := openARP(link.Attrs().Index)
	if err == nil {
		err = conn.announce(mac, v.cfg.Prefix.Addr())
	}
	if err != nil {
		if conn != nil {
			conn.close()
		}
		if added {
			_ = h.AddrDel(link, v.addr())
		}
		return fmt.Errorf("ha: vip: announce %s on %s: %w", v.cfg.Prefix.Addr(), v.cfg.Interface, privilegeHint(err, "CAP_NET_RAW", "AF_PACKET"))
	}
	if !v.held {
		v.log.Info("virtual IP added", "mac", mac.String())
	}
	v.held = true
	v.stopAnnouncing()
	actx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	v.cancel, v.done = cancel, done
	go func() {
		defer close(done)
		defer conn.close()
		t := time.NewTicker(v.cfg.Interval)
		defer t.Stop()
		for range v.cfg.Announcements - 1 {
			select {
			case <-actx.Done():
				return
			case <-t.C:
			}
			if err := conn.announce(mac, v.cfg.Prefix.Addr()); err != nil {
				v.log.Warn("gratuitous ARP", "err", err)
			}
		}
	}()
	return nil
}

// stopAnnouncing ends the announcement goroutine and waits for it. v.mu held.
func (v *VIP) stopAnnouncing() {
	if v.cancel != nil {
		v.cancel()
		<-v.done
		v.cancel, v.done = nil, nil
	}
}

// Release stops announcing and removes the address from the interface; an
// address or interface already gone is not an error.
func (v *VIP) Release() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.stopAnnouncing()
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("ha: vip: netlink: %w", err)
	}
	defer h.Close()
	link, err := h.LinkByName(v.cfg.Interface)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			v.held = false
			return nil
		}
		return fmt.Errorf("ha: vip: interface %s: %w", v.cfg.Interface, err)
	}
	if err := h.AddrDel(link, v.addr()); err != nil && !errors.Is(err, syscall.EADDRNOTAVAIL) && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("ha: vip: remove %s from %s: %w", v.cfg.Prefix, v.cfg.Interface, err)
	}
	if v.held {
		v.log.Info("virtual IP removed")
	}
	v.held = false
	return nil
}

// Held reports whether Acquire succeeded and Release has not run since.
func (v *VIP) Held() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.held
}

// privilegeHint adds to a permission error what the process lacks, for the
// operator reading a unit's journal: EPERM or EACCES means the capability
// capName is missing (adding an address needs CAP_NET_ADMIN, a packet
// socket CAP_NET_RAW), EAFNOSUPPORT that the service's
// RestrictAddressFamilies= does not list family. Other errors pass
// unchanged; errors.Is still finds the errno.
func privilegeHint(err error, capName, family string) error {
	switch {
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		return fmt.Errorf("%w: the virtual IP needs %s (machina.service: AmbientCapabilities= and CapabilityBoundingSet=, docs/ha.md)", err, capName)
	case errors.Is(err, syscall.EAFNOSUPPORT):
		return fmt.Errorf("%w: the virtual IP needs address family %s (machina.service: RestrictAddressFamilies=, docs/ha.md)", err, family)
	}
	return err
}

// arpConn is a raw AF_PACKET socket bound to one interface for ARP frames.
type arpConn struct {
	fd    int
	index int
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func openARP(index int) (*arpConn, error) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ARP)))
	if err != nil {
		return nil, fmt.Errorf("packet socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: index}); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("bind packet socket: %w", err)
	}
	return &arpConn{fd: fd, index: index}, nil
}

func (c *arpConn) close() { _ = unix.Close(c.fd) }

var broadcast = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// announce sends one round: a gratuitous ARP request (RFC 5227 section 3
// "ARP Announcement": sender and target protocol address both ip, target
// hardware address zero) and a gratuitous ARP reply (RFC 5944 section
// 4.6's form, which some switches and older stacks honour instead), both
// broadcast. Linux neighbours update an existing entry on either
// (net/ipv4/arp.c, is_garp overrides locktime).
func (c *arpConn) announce(mac net.HardwareAddr, ip netip.Addr) error {
	for _, op := range []uint16{1, 2} {
		target := net.HardwareAddr{0, 0, 0, 0, 0, 0}
		if op == 2 {
			target = broadcast
		}
		frame := garpFrame(mac, ip, op, target)
		sa := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: c.index, Halen: 6}
		copy(sa.Addr[:], broadcast)
		if err := unix.Sendto(c.fd, frame, 0, sa); err != nil {
			return fmt.Errorf("send gratuitous ARP: %w", err)
		}
	}
	return nil
}

// garpFrame builds an Ethernet II frame (broadcast destination, EtherType
// 0x0806) carrying an ARP packet (RFC 826: htype 1 Ethernet, ptype 0x0800
// IPv4, hlen 6, plen 4) with operation op (1 request, 2 reply), sender
// mac/ip and target tha/ip. 42 bytes; the NIC pads to 60.
func garpFrame(mac net.HardwareAddr, ip netip.Addr, op uint16, tha net.HardwareAddr) []byte {
	b := make([]byte, 42)
	copy(b[0:6], broadcast)
	copy(b[6:12], mac)
	binary.BigEndian.PutUint16(b[12:14], unix.ETH_P_ARP)
	a := b[14:]
	binary.BigEndian.PutUint16(a[0:2], 1)
	binary.BigEndian.PutUint16(a[2:4], unix.ETH_P_IP)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:8], op)
	ip4 := ip.As4()
	copy(a[8:14], mac)
	copy(a[14:18], ip4[:])
	copy(a[18:24], tha)
	copy(a[24:28], ip4[:])
	return b
}
