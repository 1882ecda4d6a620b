package agent

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	v1 "github.com/machina-metal/machina/api/v1"
	"golang.org/x/sys/unix"
)

// DefaultLLDPWait is how long ListenLLDP listens when not told: just over
// LLDP's default msgTxInterval of 30 s (IEEE 802.1AB-2016 §9.2.5.7), so a
// switch that sent its last frame just before the NIC came up sends another.
const DefaultLLDPWait = 32 * time.Second

// lldpNearestBridge is the destination of LLDPDUs from a switch port
// (IEEE 802.1AB-2016 §7.1, Table 7-1, nearest bridge).
var lldpNearestBridge = net.HardwareAddr{0x01, 0x80, 0xc2, 0x00, 0x00, 0x0e}

// ethPLLDP is the LLDP ethertype (IEEE 802.1AB-2016 §7.2).
const ethPLLDP = 0x88cc

// ListenLLDP listens on every NIC in nics at once, for at most wait (zero
// means DefaultLLDPWait), and returns the first LLDPDU each one heard from
// the nearest bridge (its switch port), keyed by NIC name; a NIC that heard
// none is absent. A NIC that is down is brought up for the listen and down
// again after. Each NIC gets an AF_PACKET socket bound to it and to the
// LLDP ethertype (no libpcap: the agent is static) and one poll(2) waits
// on all of them, so n NICs take one listen time, not n. Frames decode
// with gopacket's layers.LinkLayerDiscovery (DecodeLLDP); one that does not
// is logged and skipped. It ends early once every NIC has heard a frame,
// or when ctx ends. A NIC whose socket cannot be opened is logged and
// absent: LLDP is a finding, never a failure. It opens its sockets and
// sets links in the calling thread's network namespace and starts no
// goroutine.
func ListenLLDP(ctx context.Context, nics []string, wait time.Duration, log *slog.Logger) map[string]*v1.LLDP {
	if wait <= 0 {
		wait = DefaultLLDPWait
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	end := time.Now().Add(wait)
	var (
		pfds  []unix.PollFd
		names []string
	)
	for _, name := range nics {
		fd, raised, err := openLLDP(name)
		if err != nil {
			log.Warn("lldp: listen", "nic", name, "err", err)
			continue
		}
		defer func() {
			unix.Close(fd)
			if raised {
				if err := setUp(name, false); err != nil {
					log.Warn("lldp: down again", "nic", name, "err", err)
				}
			}
		}()
		pfds = append(pfds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		names = append(names, name)
	}
	out := map[string]*v1.LLDP{}
	buf := make([]byte, 9216) // a jumbo frame; an LLDPDU fits in 1500 bytes
	for len(out) < len(names) && ctx.Err() == nil {
		ms := min(time.Until(end), 250*time.Millisecond).Milliseconds()
		if ms <= 0 {
			break
		}
		n, err := unix.Poll(pfds, int(ms))
		if err == unix.EINTR || n == 0 {
			continue
		}
		if err != nil {
			log.Warn("lldp: poll", "err", err)
			break
		}
		for i := range pfds {
			if pfds[i].Revents == 0 {
				continue
			}
			name := names[i]
			l, err := readLLDP(int(pfds[i].Fd), buf)
			if err != nil {
				log.Debug("lldp: frame skipped", "nic", name, "err", err)
			}
			if l == nil || out[name] != nil {
				continue
			}
			log.Info("lldp: neighbour", "nic", name, "switch", l.Switch(), "port", l.Port(), "portVLAN", l.PortVLAN)
			out[name] = l
			pfds[i].Fd = -1 // heard: poll(2) ignores a negative fd
		}
	}
	return out
}

// openLLDP opens the AF_PACKET socket of NIC name for LLDP frames to the
// nearest bridge, raising the link first when it is down (raised says so).
func openLLDP(name string) (fd int, raised bool, err error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return -1, false, fmt.Errorf("lldp: %w", err)
	}
	if ifi.Flags&net.FlagUp == 0 {
		if err := setUp(name, true); err != nil {
			return -1, false, fmt.Errorf("lldp: up %s: %w", name, err)
		}
		raised = true
	}
	fail := func(op string, err error) (int, bool, error) {
		if fd >= 0 {
			unix.Close(fd)
		}
		if raised {
			_ = setUp(name, false)
		}
		return -1, false, fmt.Errorf("lldp: %s %s: %w", op, name, err)
	}
	proto := htons(ethPLLDP)
	fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, int(proto))
	if err != nil {
		return fail("socket", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index}); err != nil {
		return fail("bind", err)
	}
	// A NIC filters multicast it was not told about; 01:80:c2:00:00:0e is
	// in no kernel list by default (packet(7) PACKET_ADD_MEMBERSHIP).
	mr := unix.PacketMreq{Ifindex: int32(ifi.Index), Type: unix.PACKET_MR_MULTICAST, Alen: 6}
	copy(mr.Address[:], lldpNearestBridge)
	if err := unix.SetsockoptPacketMreq(fd, unix.SOL_PACKET, unix.PACKET_ADD_MEMBERSHIP, &mr); err != nil {
		return fail("multicast membership", err)
	}
	return fd, raised, nil
}

// readLLDP reads the frames waiting on fd and returns the first that
// decodes as an LLDPDU received (not sent) on the NIC; nil when none.
func readLLDP(fd int, buf []byte) (*v1.LLDP, error) {
	var last error
	for range 64 { // bounded: a flood of other frames cannot hold the loop
		m, from, err := unix.Recvfrom(fd, buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			if err == unix.EAGAIN {
				return nil, last
			}
			return nil, err
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		l, err := DecodeLLDP(buf[:m])
		if err == nil {
			return l, nil
		}
		last = err
	}
	return nil, last
}

// DecodeLLDP decodes one Ethernet frame holding an LLDPDU sent to the
// nearest-bridge address into its findings, with gopacket's
// layers.LinkLayerDiscovery and LinkLayerDiscoveryInfo (the 802.1 and
// 802.3 organisationally specific TLVs through Decode8021 and Decode8023).
// A frame to another address, of another ethertype, or that does not
// decode is an error. Safe on hostile input: a decoder panic on a
// malformed TLV is returned as an error.
func DecodeLLDP(frame []byte) (l *v1.LLDP, err error) {
	defer func() {
		if r := recover(); r != nil {
			l, err = nil, fmt.Errorf("lldp: malformed frame: %v", r)
		}
	}()
	p := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.DecodeOptions{NoCopy: true})
	eth, _ := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	if eth == nil || eth.EthernetType != layers.EthernetTypeLinkLayerDiscovery {
		return nil, fmt.Errorf("lldp: not an LLDP frame")
	}
	if eth.DstMAC.String() != lldpNearestBridge.String() {
		return nil, fmt.Errorf("lldp: frame to %s, not the nearest bridge", eth.DstMAC)
	}
	if e := p.ErrorLayer(); e != nil {
		return nil, fmt.Errorf("lldp: decode: %w", e.Error())
	}
	d, _ := p.Layer(layers.LayerTypeLinkLayerDiscovery).(*layers.LinkLayerDiscovery)
	info, _ := p.Layer(layers.LayerTypeLinkLayerDiscoveryInfo).(*layers.LinkLayerDiscoveryInfo)
	if d == nil || info == nil {
		return nil, fmt.Errorf("lldp: no LLDPDU in the frame")
	}
	l = &v1.LLDP{
		ChassisIDSubtype: chassisSubtypes[d.ChassisID.Subtype],
		PortIDSubtype:    portSubtypes[d.PortID.Subtype],
		SystemName:       clip(info.SysName),
		PortDescription:  clip(info.PortDescription),
	}
	l.ChassisID = idText(d.ChassisID.ID, l.ChassisIDSubtype)
	l.PortID = idText(d.PortID.ID, l.PortIDSubtype)
	if d1, err := info.Decode8021(); err == nil {
		if d1.PVID <= 4094 {
			l.PortVLAN = int(d1.PVID) // 4095 and up are reserved (802.1Q Table 9-2)
		}
		for _, v := range d1.VLANNames {
			if v.ID >= 1 && v.ID <= 4094 {
				l.VLANs = append(l.VLANs, v1.LLDPVLAN{ID: int(v.ID), Name: clipN(v.Name, 32)})
			}
		}
	}
	if d3, err := info.Decode8023(); err == nil {
		l.MaxFrameSize = int(d3.MTU)
	}
	return l, nil
}

// chassisSubtypes and portSubtypes name the ID subtypes (IEEE 802.1AB-2016
// Tables 8-2 and 8-3) as v1.LLDP spells them.
var (
	chassisSubtypes = map[layers.LLDPChassisIDSubType]string{
		layers.LLDPChassisIDSubTypeChassisComp: "chassis", layers.LLDPChassisIDSubtypeIfaceAlias: "ifalias",
		layers.LLDPChassisIDSubTypePortComp: "port", layers.LLDPChassisIDSubTypeMACAddr: "mac",
		layers.LLDPChassisIDSubTypeNetworkAddr: "network", layers.LLDPChassisIDSubtypeIfaceName: "ifname",
		layers.LLDPChassisIDSubTypeLocal: "local",
	}
	portSubtypes = map[layers.LLDPPortIDSubType]string{
		layers.LLDPPortIDSubtypeIfaceAlias: "ifalias", layers.LLDPPortIDSubtypePortComp: "port",
		layers.LLDPPortIDSubtypeMACAddr: "mac", layers.LLDPPortIDSubtypeNetworkAddr: "network",
		layers.LLDPPortIDSubtypeIfaceName: "ifname", layers.LLDPPortIDSubtypeAgentCircuitID: "circuit",
		layers.LLDPPortIDSubtypeLocal: "local",
	}
)

// idText renders a chassis or port ID: a MAC in colon form, a network
// address (first byte an IANA address family: 1 IPv4, 2 IPv6) as text,
// anything else as its bytes, clipped to 255.
func idText(id []byte, subtype string) string {
	switch {
	case subtype == "mac" && len(id) == 6:
		return net.HardwareAddr(id).String()
	case subtype == "network" && len(id) == 5 && id[0] == 1, subtype == "network" && len(id) == 17 && id[0] == 2:
		a, _ := netip.AddrFromSlice(id[1:])
		return a.String()
	}
	return clip(string(id))
}

func clip(s string) string { return clipN(s, 255) }

// clipN makes s valid UTF-8 (each invalid byte becomes '?': the JSON
// report would otherwise carry U+FFFD, three bytes each) and cuts it to at
// most n bytes on a rune boundary, the bounds v1.LLDP.Validate holds.
func clipN(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for !utf8.ValidString(s) { // a rune cut in two at the end: at most 3 bytes go
		s = s[:len(s)-1]
	}
	return s
}

func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// setUp sets or clears IFF_UP on NIC name (netdevice(7) SIOCSIFFLAGS).
func setUp(name string, up bool) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	f := ifr.Uint16()
	if up {
		f |= unix.IFF_UP
	} else {
		f &^= unix.IFF_UP
	}
	ifr.SetUint16(f)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// startLLDP starts ListenLLDP on nics for r.LLDPWait and returns where its
// findings arrive (once). Off (nothing heard, at once) when LLDPWait is
// negative or Root is a recorded tree rather than this machine.
func (r *Runner) startLLDP(ctx context.Context, nics []v1.NIC) <-chan map[string]*v1.LLDP {
	ch := make(chan map[string]*v1.LLDP, 1)
	if r.LLDPWait < 0 || r.root() != "/" || len(nics) == 0 {
		ch <- nil
		return ch
	}
	names := make([]string, len(nics))
	for i, n := range nics {
		names[i] = n.Name
	}
	r.log().Info("lldp: listening", "nics", names, "bound", cmp.Or(r.LLDPWait, DefaultLLDPWait).String())
	go func() { ch <- ListenLLDP(ctx, names, r.LLDPWait, r.log()) }()
	return ch
}
