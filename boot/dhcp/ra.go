package dhcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// RAConfig configures an [Advertiser]. Zero values are documented per field.
type RAConfig struct {
	// Interfaces to advertise on (the DHCP interfaces). Required.
	Interfaces []string
	// Interval between unsolicited advertisements. Zero: 10 seconds.
	// Router Solicitations are answered at once regardless.
	Interval time.Duration
	// Logger: Debug per advertisement. Nil: discard.
	Logger *slog.Logger
}

// Advertiser sends minimal IPv6 Router Advertisements (RFC 4861 §4.2) on the
// provisioning interfaces: router lifetime 0 (we are not a default router),
// managed and other-config flags clear, no prefix, and our link-layer
// address. Their only job is to end iPXE's IPv6 autoconfiguration at once:
// without any RA, iPXE's "Configuring (net0 ...)" waits about 13 s per start
// for IPv6 to time out (LAB-NOTES §2.2). The kernel must have a link-local
// address on each interface (the RA source, §6.1.2).
type Advertiser struct {
	cfg   RAConfig
	log   *slog.Logger
	mu    sync.Mutex
	conns []*raConn
	sent  uint64
}

type raConn struct {
	ifi *net.Interface
	pc  *ipv6.PacketConn
	c   net.PacketConn
}

// NewAdvertiser validates cfg.
func NewAdvertiser(cfg RAConfig) (*Advertiser, error) {
	if len(cfg.Interfaces) == 0 {
		return nil, errors.New("dhcp: new advertiser: no interfaces named")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
	}
	a := &Advertiser{cfg: cfg, log: cfg.Logger}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	return a, nil
}

// Sent returns how many advertisements were sent.
func (a *Advertiser) Sent() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sent
}

// Listen opens one raw ICMPv6 socket per interface, bound to it, joined to
// all-routers (ff02::2) and filtered to Router Solicitations, in the calling
// thread's network namespace. Serve calls it when needed.
func (a *Advertiser) Listen() error {
	var conns []*raConn
	closeAll := func() {
		for _, c := range conns {
			c.c.Close()
		}
	}
	for _, name := range a.cfg.Interfaces {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			closeAll()
			return fmt.Errorf("dhcp: advertiser: %w", err)
		}
		lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) { serr = unix.BindToDevice(int(fd), name) }); err != nil {
				return err
			}
			return serr
		}}
		c, err := lc.ListenPacket(context.Background(), "ip6:ipv6-icmp", "::")
		if err != nil {
			closeAll()
			return fmt.Errorf("dhcp: advertiser: listen on %s: %w", name, err)
		}
		pc := ipv6.NewPacketConn(c)
		rc := &raConn{ifi: ifi, pc: pc, c: c}
		conns = append(conns, rc)
		var f ipv6.ICMPFilter
		f.SetAll(true)
		f.Accept(ipv6.ICMPTypeRouterSolicitation)
		for _, step := range []error{
			pc.SetICMPFilter(&f),
			pc.SetMulticastHopLimit(255),
			pc.SetHopLimit(255),
			pc.SetMulticastInterface(ifi),
			pc.JoinGroup(ifi, &net.IPAddr{IP: net.ParseIP("ff02::2")}),
		} {
			if step != nil {
				closeAll()
				return fmt.Errorf("dhcp: advertiser: configure %s: %w", name, step)
			}
		}
	}
	a.mu.Lock()
	a.conns = conns
	a.mu.Unlock()
	return nil
}

// Serve advertises until ctx is done (then closes its sockets and returns
// nil): once at start, every Interval, and in answer to each Router
// Solicitation.
func (a *Advertiser) Serve(ctx context.Context) error {
	a.mu.Lock()
	conns := a.conns
	a.mu.Unlock()
	if conns == nil {
		if err := a.Listen(); err != nil {
			return err
		}
		a.mu.Lock()
		conns = a.conns
		a.mu.Unlock()
	}
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() { a.readLoop(ctx, c) })
	}
	t := time.NewTicker(a.cfg.Interval)
	defer t.Stop()
	for {
		for _, c := range conns {
			a.send(c, "periodic")
		}
		select {
		case <-ctx.Done():
			for _, c := range conns {
				c.c.Close()
			}
			wg.Wait()
			return nil
		case <-t.C:
		}
	}
}

func (a *Advertiser) readLoop(ctx context.Context, c *raConn) {
	buf := make([]byte, 1500)
	for {
		n, _, src, err := c.pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() == nil {
				a.log.Warn("ra read", "iface", c.ifi.Name, "err", err)
			}
			return
		}
		if n < 8 || ipv6.ICMPType(buf[0]) != ipv6.ICMPTypeRouterSolicitation {
			continue
		}
		a.log.Debug("router solicitation", "iface", c.ifi.Name, "src", src.String())
		a.send(c, "solicited")
	}
}

// routerAdvertisement returns the ICMPv6 RA for an interface with hardware
// address mac: cur hop limit 64, M=O=0, router lifetime 0, reachable time and
// retrans timer unspecified, source link-layer address option (type 1).
func routerAdvertisement(mac net.HardwareAddr) ([]byte, error) {
	body := []byte{64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	if len(mac) == 6 {
		body = append(body, 1, 1)
		body = append(body, mac...)
	}
	m := icmp.Message{Type: ipv6.ICMPTypeRouterAdvertisement, Code: 0, Body: &icmp.RawBody{Data: body}}
	return m.Marshal(nil) // the kernel fills in the ICMPv6 checksum on raw ICMPv6 sockets
}

func (a *Advertiser) send(c *raConn, why string) {
	b, err := routerAdvertisement(c.ifi.HardwareAddr)
	if err != nil {
		a.log.Error("ra marshal", "err", err)
		return
	}
	dst := &net.IPAddr{IP: net.ParseIP("ff02::1"), Zone: c.ifi.Name}
	if _, err := c.pc.WriteTo(b, &ipv6.ControlMessage{HopLimit: 255, IfIndex: c.ifi.Index}, dst); err != nil {
		a.log.Debug("ra send", "iface", c.ifi.Name, "err", err) // e.g. no link-local address yet
		return
	}
	a.mu.Lock()
	a.sent++
	a.mu.Unlock()
	a.log.Debug("router advertisement sent", "iface", c.ifi.Name, "why", why)
}
