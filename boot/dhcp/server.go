// Package dhcp is Machina's DHCPv4 server for the provisioning network, on
// github.com/insomniacslk/dhcp (dhcpv4 for packets, server4 for the
// interface-bound sockets). Two modes:
//
//   - [ModeFull]: addresses from a pool, reservations from [boot.Lookup],
//     leases behind [LeaseStore], router/DNS/domain options, and boot
//     answers for PXE, UEFI HTTP boot and iPXE clients.
//   - [ModeProxy]: proxyDHCP (PXE 2.1 §2.2.5) on ports 67 and 4011 for
//     networks whose DHCP server is not ours: answers only PXE and iPXE
//     clients and gives no addresses.
//
// Unknown MACs are ignored unless auto-enrol is on. Malformed packets are
// dropped and counted ([Stats]). Replies are built by the pure
// [BuildReply] from a [Decision]; the server only decides and sends.
//
// dhcp imports only boot; it never imports state or reconciler.
package dhcp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/macaddr"
	"golang.org/x/sys/unix"
)

// Mode selects full DHCP or proxyDHCP.
type Mode string

// Modes.
const (
	ModeFull  Mode = "full"
	ModeProxy Mode = "proxy"
)

// Config configures a [Server]. Zero values are documented per field.
type Config struct {
	// Mode: zero means ModeFull.
	Mode Mode
	// Interfaces are the names of the interfaces to serve; the sockets are
	// bound to them (SO_BINDTODEVICE). Required: at least one. All of them
	// answer as ServerIP from one pool: name several only when they are
	// ports of one segment; run one Server per provisioning subnet.
	Interfaces []string
	// ServerIP is our address on the segment (option 54, siaddr). Zero: the
	// first IPv4 address of Interfaces[0].
	ServerIP netip.Addr
	// Subnet is the provisioning subnet (option 1 comes from it). Required in
	// full mode.
	Subnet netip.Prefix
	// PoolStart and PoolEnd bound the dynamic pool, inclusive, inside Subnet.
	// Required in full mode. Reservations (Assignment.IP) should lie outside
	// the pool; an address leased to another MAC is never handed out twice.
	PoolStart, PoolEnd netip.Addr
	// Router (option 3), DNS (option 6) and Domain (option 15): zero omits.
	Router netip.Addr
	DNS    []netip.Addr
	Domain string
	// LeaseTime is option 51. Zero: 1 hour.
	LeaseTime time.Duration
	// OfferHold is how long an offered address stays reserved for the client
	// before its REQUEST. Zero: 30 seconds.
	OfferHold time.Duration
	// Boot maps architectures to boot files; Boot.ScriptURL is required.
	Boot BootFiles
	// Lookup gives assignments (and reservations) per MAC. Required.
	Lookup boot.Lookup
	// AutoEnroll (MACHINA_METAL_AUTO_ENROLL=1) answers unknown MACs after
	// recording them through Enroller; false ignores them.
	AutoEnroll bool
	Enroller   boot.Enroller
	// Leases persists leases. Zero: an in-memory [MemLeases].
	Leases LeaseStore
	// Port, ProxyPort and ClientPort override 67, 4011 and 68 (tests only).
	Port, ProxyPort, ClientPort int
	// Logger: Debug per packet (with mac and xid), Info per lease. Nil: discard.
	Logger *slog.Logger
}

// Stats are packet counters since New. Malformed counts packets dropped
// before any decision: undecodable, not BOOTREQUEST, hardware type or
// length other than Ethernet/6, zero or multicast chaddr, no message type.
type Stats struct {
	Received, Malformed, Ignored, Offers, Acks, Naks, Releases, Declines, Informs, Errors uint64
}

// Server is a DHCPv4 server. Create it with [New] and run it with
// [Server.Serve].
type Server struct {
	cfg   Config
	log   *slog.Logger
	net   Network
	now   func() time.Time
	mu    sync.Mutex // guards pool, lease writes and conns
	pool  *pool
	conns []*net.UDPConn

	received, malformed, ignored, offers, acks, naks, releases, declines, informs, errs atomic.Uint64
}

// New validates cfg and returns a server; it opens no socket.
func New(cfg Config) (*Server, error) {
	if cfg.Mode == "" {
		cfg.Mode = ModeFull
	}
	if cfg.Mode != ModeFull && cfg.Mode != ModeProxy {
		return nil, fmt.Errorf("dhcp: new server: unknown mode %q", cfg.Mode)
	}
	if len(cfg.Interfaces) == 0 {
		return nil, errors.New("dhcp: new server: no interfaces named")
	}
	if cfg.Lookup == nil {
		return nil, errors.New("dhcp: new server: Lookup is required")
	}
	if cfg.AutoEnroll && cfg.Enroller == nil {
		return nil, errors.New("dhcp: new server: AutoEnroll needs an Enroller")
	}
	if err := boot.CheckURL(cfg.Boot.ScriptURL); err != nil {
		return nil, fmt.Errorf("dhcp: new server: Boot.ScriptURL: %w", err)
	}
	cfg.Boot.setDefaults()
	if !cfg.ServerIP.IsValid() {
		ip, err := interfaceIPv4(cfg.Interfaces[0])
		if err != nil {
			return nil, fmt.Errorf("dhcp: new server: %w", err)
		}
		cfg.ServerIP = ip
	}
	if !cfg.ServerIP.Is4() {
		return nil, fmt.Errorf("dhcp: new server: server ip %s is not ipv4", cfg.ServerIP)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, now: time.Now}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.net = Network{ServerIP: cfg.ServerIP, Router: cfg.Router, DNS: cfg.DNS, Domain: cfg.Domain}
	if cfg.Mode == ModeFull {
		if !cfg.Subnet.IsValid() || !cfg.Subnet.Addr().Is4() {
			return nil, errors.New("dhcp: new server: full mode needs an IPv4 Subnet")
		}
		if !cfg.Subnet.Contains(cfg.PoolStart) || !cfg.Subnet.Contains(cfg.PoolEnd) || cfg.PoolEnd.Less(cfg.PoolStart) {
			return nil, fmt.Errorf("dhcp: new server: pool %s-%s not inside %s", cfg.PoolStart, cfg.PoolEnd, cfg.Subnet)
		}
		s.net.Mask = net.CIDRMask(cfg.Subnet.Bits(), 32)
		s.pool = newPool(cfg.PoolStart, cfg.PoolEnd)
	}
	if s.cfg.LeaseTime <= 0 {
		s.cfg.LeaseTime = time.Hour
	}
	if s.cfg.OfferHold <= 0 {
		s.cfg.OfferHold = 30 * time.Second
	}
	if s.cfg.Leases == nil {
		s.cfg.Leases = &MemLeases{}
	}
	if s.cfg.Port == 0 {
		s.cfg.Port = dhcpv4.ServerPort
	}
	if s.cfg.ProxyPort == 0 {
		s.cfg.ProxyPort = 4011
	}
	if s.cfg.ClientPort == 0 {
		s.cfg.ClientPort = dhcpv4.ClientPort
	}
	return s, nil
}

func interfaceIPv4(name string) (netip.Addr, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("interface %s: %w", name, err)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("interface %s addresses: %w", name, err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap().Is4() {
				return ip.Unmap(), nil
			}
		}
	}
	return netip.Addr{}, fmt.Errorf("interface %s has no ipv4 address", name)
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	return Stats{
		Received: s.received.Load(), Malformed: s.malformed.Load(), Ignored: s.ignored.Load(),
		Offers: s.offers.Load(), Acks: s.acks.Load(), Naks: s.naks.Load(), Releases: s.releases.Load(),
		Declines: s.declines.Load(), Informs: s.informs.Load(), Errors: s.errs.Load(),
	}
}

// ServerIP returns the address the server answers as.
func (s *Server) ServerIP() netip.Addr { return s.cfg.ServerIP }

// Listen loads the leases and opens one socket per interface (port 67, and
// 4011 in proxy mode), in the calling thread's network namespace. Serve calls
// it when it has not been called; call it first to learn about bind errors
// before starting Serve, or to open the sockets in another namespace.
func (s *Server) Listen(ctx context.Context) error {
	s.mu.Lock()
	opened := s.conns != nil
	s.mu.Unlock()
	if opened {
		return errors.New("dhcp: listen: already listening")
	}
	if s.pool != nil {
		leases, err := s.cfg.Leases.Leases(ctx)
		if err != nil {
			return fmt.Errorf("dhcp: load leases: %w", err)
		}
		now := s.now()
		s.mu.Lock()
		for _, l := range leases {
			if now.Before(l.Expires) && macaddr.Check(l.MAC) == nil {
				s.pool.bind(l.MAC.String(), l.IP, l.Expires, false)
			}
		}
		s.mu.Unlock()
	}
	ports := []int{s.cfg.Port}
	if s.cfg.Mode == ModeProxy {
		ports = append(ports, s.cfg.ProxyPort)
	}
	var conns []*net.UDPConn
	for _, ifname := range s.cfg.Interfaces {
		for _, port := range ports {
			c, err := server4.NewIPv4UDPConn(ifname, &net.UDPAddr{Port: port})
			if err != nil {
				for _, c := range conns {
					c.Close()
				}
				return fmt.Errorf("dhcp: listen on %s:%d: %w", ifname, port, err)
			}
			// A boot storm sends hundreds of DISCOVERs at once; the default
			// receive buffer (~200 KiB) would drop them into 2 s retransmits.
			growReadBuffer(c, 4<<20)
			conns = append(conns, c)
		}
	}
	s.mu.Lock()
	s.conns = conns
	s.mu.Unlock()
	return nil
}

// Serve answers on the sockets opened by [Server.Listen] (calling it first
// if needed) until ctx is done; then it closes the sockets and returns nil. A
// socket error ends Serve with that error.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	conns := s.conns
	s.mu.Unlock()
	if conns == nil {
		if err := s.Listen(ctx); err != nil {
			return err
		}
		s.mu.Lock()
		conns = s.conns
		s.mu.Unlock()
	}
	s.log.Info("dhcp serving", "mode", s.cfg.Mode, "interfaces", s.cfg.Interfaces, "server_ip", s.cfg.ServerIP.String())
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(conns))
	for _, c := range conns {
		go func() { errc <- s.loop(ctx, c) }()
	}
	var first error
	select {
	case <-ctx.Done():
	case first = <-errc:
		cancel()
	}
	for _, c := range conns {
		c.Close()
	}
	n := len(conns)
	if first != nil {
		n--
	}
	for range n {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// ServeConn answers packets arriving on conn until ctx is done (then it
// closes conn and returns nil). Serve uses it per socket; tests and embedders
// with their own socket may call it directly. The connection's local port
// decides whether it is treated as the proxyDHCP port 4011.
func (s *Server) ServeConn(ctx context.Context, conn *net.UDPConn) error {
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			conn.Close()
		case <-done:
		}
	}()
	return s.loop(ctx, conn)
}

func (s *Server) loop(ctx context.Context, conn *net.UDPConn) error {
	local, _ := conn.LocalAddr().(*net.UDPAddr)
	onProxyPort := s.cfg.Mode == ModeProxy && local != nil && local.Port == s.cfg.ProxyPort
	buf := make([]byte, 1500)
	for {
		n, peer, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("dhcp: read: %w", err)
		}
		s.received.Add(1)
		reply, dst, ok := s.Handle(ctx, buf[:n], peer, onProxyPort)
		if !ok {
			continue
		}
		if _, err := conn.WriteToUDPAddrPort(reply, dst); err != nil {
			s.errs.Add(1)
			s.log.Warn("dhcp send", "dst", dst.String(), "err", err)
		}
	}
}

// Handle decides the answer to one packet received from peer. It returns the
// encoded reply and where to send it, or ok=false when the packet is dropped
// (malformed, not for us, unknown MAC, no reply by protocol). Safe for
// concurrent use.
func (s *Server) Handle(ctx context.Context, pkt []byte, peer netip.AddrPort, onProxyPort bool) (reply []byte, dst netip.AddrPort, ok bool) {
	req, err := dhcpv4.FromBytes(pkt)
	if err != nil || req.OpCode != dhcpv4.OpcodeBootRequest || req.HWType != 1 || len(req.ClientHWAddr) != 6 ||
		macaddr.Check(req.ClientHWAddr) != nil || req.MessageType() == dhcpv4.MessageTypeNone {
		s.malformed.Add(1)
		s.log.Debug("dhcp drop malformed", "peer", peer.String(), "len", len(pkt))
		return nil, netip.AddrPort{}, false
	}
	mac := req.ClientHWAddr
	log := s.log.With("mac", mac.String(), "xid", req.TransactionID.String(), "type", req.MessageType().String())
	var resp *dhcpv4.DHCPv4
	if s.cfg.Mode == ModeProxy {
		resp = s.proxy(ctx, log, req, onProxyPort)
	} else {
		resp = s.full(ctx, log, req)
	}
	if resp == nil {
		return nil, netip.AddrPort{}, false
	}
	return resp.ToBytes(), s.destination(req, resp, peer, onProxyPort), true
}

// destination applies RFC 2131 §4.1: relayed → giaddr:67; proxy port →
// the sender; ciaddr set (renew, INFORM) → ciaddr:68; otherwise broadcast
// (we do not inject ARP entries to unicast to yiaddr).
func (s *Server) destination(req, resp *dhcpv4.DHCPv4, peer netip.AddrPort, onProxyPort bool) netip.AddrPort {
	if gi, ok := netip.AddrFromSlice(req.GatewayIPAddr.To4()); ok && !gi.IsUnspecified() {
		return netip.AddrPortFrom(gi, uint16(s.cfg.Port))
	}
	if onProxyPort && peer.Addr().Unmap().Is4() && !peer.Addr().Unmap().IsUnspecified() {
		return peer
	}
	if ci, ok := netip.AddrFromSlice(req.ClientIPAddr.To4()); ok && !ci.IsUnspecified() && resp.MessageType() != dhcpv4.MessageTypeNak {
		return netip.AddrPortFrom(ci, uint16(s.cfg.ClientPort))
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{255, 255, 255, 255}), uint16(s.cfg.ClientPort))
}

// assignment resolves mac through Lookup, auto-enrolling unknown MACs when
// configured. ok=false means "ignore this client".
func (s *Server) assignment(ctx context.Context, log *slog.Logger, req *dhcpv4.DHCPv4) (boot.Assignment, bool) {
	a, err := s.cfg.Lookup.Lookup(ctx, req.ClientHWAddr)
	if err == nil {
		return a, true
	}
	if !errors.Is(err, boot.ErrNotFound) {
		s.errs.Add(1)
		log.Error("dhcp lookup", "err", err)
		return boot.Assignment{}, false
	}
	if !s.cfg.AutoEnroll {
		s.ignored.Add(1)
		log.Debug("dhcp ignore unknown mac")
		return boot.Assignment{}, false
	}
	a, err = s.cfg.Enroller.Discovered(ctx, boot.Discovery{MAC: req.ClientHWAddr, Source: "dhcp", Arch: Arch(req)})
	if err != nil {
		s.errs.Add(1)
		log.Error("dhcp auto-enrol", "err", err)
		return boot.Assignment{}, false
	}
	log.Info("dhcp auto-enrolled unknown mac", "arch", archName(Arch(req)))
	return a, true
}

// bootFor returns the boot answer for req, logging unsupported archs.
// A Secure Boot server gets only the signed shim ([SelectSecureBoot]).
func (s *Server) bootFor(log *slog.Logger, req *dhcpv4.DHCPv4, a boot.Assignment) (Boot, bool) {
	sel := SelectBoot
	if a.SecureBoot {
		sel = SelectSecureBoot
	}
	b, err := sel(req, s.cfg.Boot)
	if err != nil {
		log.Debug("dhcp no boot answer", "err", err)
		return Boot{}, false
	}
	return b, true
}

func (s *Server) proxy(ctx context.Context, log *slog.Logger, req *dhcpv4.DHCPv4, onProxyPort bool) *dhcpv4.DHCPv4 {
	kind := Classify(req)
	if kind != ClientPXE && kind != ClientIPXE {
		s.ignored.Add(1)
		return nil
	}
	var typ dhcpv4.MessageType
	switch mt := req.MessageType(); {
	case mt == dhcpv4.MessageTypeDiscover && !onProxyPort:
		typ = dhcpv4.MessageTypeOffer
	case mt == dhcpv4.MessageTypeRequest && onProxyPort:
		typ = dhcpv4.MessageTypeAck
	case mt == dhcpv4.MessageTypeRequest && !onProxyPort:
		// REQUEST to port 67 is for the network's own DHCP server; only answer
		// when the client asks for us by server identifier.
		if sid := req.ServerIdentifier(); sid == nil || !sid.Equal(s.cfg.ServerIP.AsSlice()) {
			s.ignored.Add(1)
			return nil
		}
		typ = dhcpv4.MessageTypeAck
	default:
		s.ignored.Add(1)
		return nil
	}
	a, ok := s.assignment(ctx, log, req)
	if !ok {
		return nil
	}
	b, ok := s.bootFor(log, req, a)
	if !ok || b.File == "" {
		s.ignored.Add(1)
		return nil
	}
	resp, err := BuildReply(req, s.net, Decision{Type: typ, Boot: b, Proxy: true})
	if err != nil {
		s.errs.Add(1)
		log.Error("dhcp build proxy reply", "err", err)
		return nil
	}
	if typ == dhcpv4.MessageTypeOffer {
		s.offers.Add(1)
	} else {
		s.acks.Add(1)
	}
	log.Debug("dhcp proxy answer", "file", b.File, "proxy_port", onProxyPort)
	return resp
}

func (s *Server) full(ctx context.Context, log *slog.Logger, req *dhcpv4.DHCPv4) *dhcpv4.DHCPv4 {
	mt := req.MessageType()
	if mt == dhcpv4.MessageTypeRelease || mt == dhcpv4.MessageTypeDecline {
		s.releaseOrDecline(ctx, log, req)
		return nil
	}
	if s.otherServerChosen(req) {
		s.ignored.Add(1)
		return nil
	}
	switch mt {
	case dhcpv4.MessageTypeDiscover, dhcpv4.MessageTypeRequest, dhcpv4.MessageTypeInform:
	default:
		s.ignored.Add(1)
		return nil
	}
	a, ok := s.assignment(ctx, log, req)
	if !ok {
		return nil
	}
	b, bootOK := s.bootFor(log, req, a)
	if !bootOK {
		b = Boot{}
	}
	// option 12: the inventory name is an RFC 1123 label
	d := Decision{Hostname: cmp.Or(a.Hostname, a.Name), Boot: b, NoPXEDHCP: b.File != "" && Classify(req) != ClientHTTP}
	switch mt {
	case dhcpv4.MessageTypeInform: // RFC 2131 §4.3.5: options only, no lease
		d.Type = dhcpv4.MessageTypeAck
		s.informs.Add(1)
	case dhcpv4.MessageTypeDiscover:
		ip, err := s.offer(req.ClientHWAddr, a)
		if err != nil {
			s.errs.Add(1)
			log.Warn("dhcp no address to offer", "err", err)
			return nil
		}
		d.Type, d.YourIP, d.LeaseTime = dhcpv4.MessageTypeOffer, ip, s.cfg.LeaseTime
	case dhcpv4.MessageTypeRequest:
		ip, nak, err := s.ack(ctx, req, a)
		switch {
		case err != nil:
			s.errs.Add(1)
			log.Error("dhcp store lease", "err", err)
			return nil
		case nak != "":
			d = Decision{Type: dhcpv4.MessageTypeNak, Message: nak}
		case !ip.IsValid():
			s.ignored.Add(1) // INIT-REBOOT for a client we have no record of: stay silent (§4.3.2)
			return nil
		default:
			d.Type, d.YourIP, d.LeaseTime = dhcpv4.MessageTypeAck, ip, s.cfg.LeaseTime
			log.Info("dhcp lease", "ip", ip.String(), "file", b.File, "arch", archName(Arch(req)))
		}
	}
	resp, err := BuildReply(req, s.net, d)
	if err != nil {
		s.errs.Add(1)
		log.Error("dhcp build reply", "err", err)
		return nil
	}
	s.countReply(mt, d.Type)
	return resp
}

// otherServerChosen reports whether req names another DHCP server (RFC
// 2131 §4.3.2 SELECTING): the client chose it, and a REQUEST drops the
// address we offered it.
func (s *Server) otherServerChosen(req *dhcpv4.DHCPv4) bool {
	sid := req.ServerIdentifier()
	if sid == nil || sid.Equal(s.cfg.ServerIP.AsSlice()) {
		return false
	}
	if req.MessageType() == dhcpv4.MessageTypeRequest {
		s.mu.Lock()
		if b, ok := s.pool.byMAC[req.ClientHWAddr.String()]; ok && b.offered {
			s.pool.release(req.ClientHWAddr.String())
		}
		s.mu.Unlock()
	}
	return true
}

// countReply counts a full-mode reply of type t to a request of type mt
// (an ACK to an INFORM is counted as an inform, already).
func (s *Server) countReply(mt, t dhcpv4.MessageType) {
	switch t {
	case dhcpv4.MessageTypeOffer:
		s.offers.Add(1)
	case dhcpv4.MessageTypeNak:
		s.naks.Add(1)
	case dhcpv4.MessageTypeAck:
		if mt != dhcpv4.MessageTypeInform {
			s.acks.Add(1)
		}
	}
}

// offer picks the address for a DISCOVER: the reservation, the client's
// current binding, or a free pool address, and holds it for OfferHold.
func (s *Server) offer(mac net.HardwareAddr, a boot.Assignment) (netip.Addr, error) {
	now := s.now()
	key := mac.String()
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.IP.IsValid() {
		if holder, held := s.pool.holder(a.IP, now); held && holder != key {
			return netip.Addr{}, fmt.Errorf("reserved %s is held by %q", a.IP, holder)
		}
		s.hold(key, a.IP, now)
		return a.IP, nil
	}
	if b, ok := s.pool.byMAC[key]; ok && s.pool.contains(b.ip) {
		if holder, _ := s.pool.holder(b.ip, now); holder == key || holder == "" {
			s.hold(key, b.ip, now)
			return b.ip, nil
		}
	}
	ip, ok := s.pool.free(now)
	if !ok {
		return netip.Addr{}, errors.New("pool exhausted")
	}
	s.hold(key, ip, now)
	return ip, nil
}

// hold binds ip to key for OfferHold unless key already has a longer lease.
func (s *Server) hold(key string, ip netip.Addr, now time.Time) {
	if b, ok := s.pool.byMAC[key]; ok && b.ip == ip && b.expires.After(now.Add(s.cfg.OfferHold)) {
		return
	}
	s.pool.bind(key, ip, now.Add(s.cfg.OfferHold), true)
}

// ack handles REQUEST (SELECTING, INIT-REBOOT, RENEWING, REBINDING; RFC 2131
// §4.3.2). It returns the address to ACK, or a NAK message, or neither
// (silence), and persists the lease before answering.
func (s *Server) ack(ctx context.Context, req *dhcpv4.DHCPv4, a boot.Assignment) (netip.Addr, string, error) {
	want, _ := netip.AddrFromSlice(req.RequestedIPAddress().To4())
	if ci, ok := netip.AddrFromSlice(req.ClientIPAddr.To4()); ok && !ci.IsUnspecified() {
		want = ci // RENEWING/REBINDING: ciaddr carries the address
	}
	if !want.IsValid() || want.IsUnspecified() {
		return netip.Addr{}, "no requested address", nil
	}
	key := req.ClientHWAddr.String()
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.cfg.Subnet.Contains(want) {
		return netip.Addr{}, "wrong network", nil
	}
	if holder, held := s.pool.holder(want, now); held && holder != key {
		return netip.Addr{}, "address in use", nil
	}
	b, known := s.pool.byMAC[key]
	switch {
	case a.IP.IsValid():
		if want != a.IP {
			return netip.Addr{}, "address not reserved for client", nil
		}
	case known && b.ip == want:
	case s.pool.contains(want) && req.ServerIdentifier() == nil && !known:
		return netip.Addr{}, "", nil // INIT-REBOOT/REBINDING without a record: silent
	default:
		return netip.Addr{}, "address not offered to client", nil
	}
	exp := now.Add(s.cfg.LeaseTime)
	if err := s.cfg.Leases.PutLease(ctx, Lease{MAC: req.ClientHWAddr, IP: want, Expires: exp, Hostname: cmp.Or(a.Hostname, a.Name)}); err != nil {
		return netip.Addr{}, "", fmt.Errorf("put lease: %w", err)
	}
	s.pool.bind(key, want, exp, false)
	return want, "", nil
}

func (s *Server) releaseOrDecline(ctx context.Context, log *slog.Logger, req *dhcpv4.DHCPv4) {
	if sid := req.ServerIdentifier(); sid == nil || !sid.Equal(s.cfg.ServerIP.AsSlice()) {
		s.ignored.Add(1)
		return
	}
	key := req.ClientHWAddr.String()
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.pool.byMAC[key]
	if !ok {
		s.ignored.Add(1)
		return
	}
	if req.MessageType() == dhcpv4.MessageTypeDecline {
		s.declines.Add(1)
		s.pool.release(key)
		s.pool.decline(b.ip)
		log.Warn("dhcp decline: address in use on the segment", "ip", b.ip.String())
	} else {
		ci, _ := netip.AddrFromSlice(req.ClientIPAddr.To4())
		if ci != b.ip {
			s.ignored.Add(1)
			return
		}
		s.releases.Add(1)
		s.pool.release(key)
		log.Info("dhcp release", "ip", b.ip.String())
	}
	if err := s.cfg.Leases.DeleteLease(ctx, req.ClientHWAddr); err != nil {
		s.errs.Add(1)
		log.Error("dhcp delete lease", "err", err)
	}
}

// growReadBuffer sets the socket receive buffer to n bytes, beyond
// net.core.rmem_max when we have CAP_NET_ADMIN (SO_RCVBUFFORCE), else as far
// as rmem_max allows.
func growReadBuffer(c *net.UDPConn, n int) {
	if rc, err := c.SyscallConn(); err == nil {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, n)
		}); err == nil && serr == nil {
			return
		}
	}
	_ = c.SetReadBuffer(n)
}
