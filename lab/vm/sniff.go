package vm

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"golang.org/x/sys/unix"
)

// sniffer is the Secure Boot lab's eavesdropper on the provisioning
// network: an AF_PACKET socket on the lab bridge that keeps what the
// controller sends to machines in the clear (the HTTP answers of its
// machine API, TFTP data), as any host on a flat provisioning segment
// (a mirrored switch port, a hub, an ARP spoofer) can read them. The lab
// replays what it captures from the spoofer's position. Each flow keeps
// its first sniffCap bytes (the image download is not kept).
type sniffer struct {
	fd   int
	mu   sync.Mutex
	fl   map[flowKey]*flow
	stop chan struct{}
	done chan struct{}
}

// sniffCap bounds the bytes kept per flow.
const sniffCap = 256 << 10

type flowKey struct {
	src, dst netip.AddrPort
	udp      bool
}

type flow struct {
	seen time.Time
	segs map[uint32][]byte // TCP: by sequence number; UDP: by arrival
	n    int
	next uint32
}

// sniff starts capturing on the bridge br of namespace ns: traffic from
// from (the controller's address).
func sniff(ns, br string, from netip.Addr) (*sniffer, error) {
	s := &sniffer{fl: map[flowKey]*flow{}, stop: make(chan struct{}), done: make(chan struct{})}
	err := inNetns(ns, func() error {
		ifi, err := net.InterfaceByName(br)
		if err != nil {
			return err
		}
		proto := int(htons(unix.ETH_P_ALL))
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("bind packet socket to %s: %w", br, err)
		}
		tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			unix.Close(fd)
			return err
		}
		s.fd = fd
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("vm lab: sniff %s: %w", br, err)
	}
	go s.loop(from)
	return s, nil
}

func (s *sniffer) loop(from netip.Addr) {
	defer close(s.done)
	buf := make([]byte, 1<<18)
	for {
		select {
		case <-s.stop:
			return
		default:
		}
		n, _, err := unix.Recvfrom(s.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		p := gopacket.NewPacket(buf[:n], layers.LayerTypeEthernet, gopacket.Default)
		ip4, _ := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if ip4 == nil {
			continue
		}
		src, _ := netip.AddrFromSlice(ip4.SrcIP)
		dst, _ := netip.AddrFromSlice(ip4.DstIP)
		if src.Unmap() != from {
			continue
		}
		switch l4 := p.TransportLayer().(type) {
		case *layers.TCP:
			if len(l4.Payload) > 0 {
				s.add(flowKey{netip.AddrPortFrom(src.Unmap(), uint16(l4.SrcPort)), netip.AddrPortFrom(dst.Unmap(), uint16(l4.DstPort)), false}, l4.Seq, l4.Payload)
			}
		case *layers.UDP:
			if len(l4.Payload) > 0 {
				s.add(flowKey{netip.AddrPortFrom(src.Unmap(), uint16(l4.SrcPort)), netip.AddrPortFrom(dst.Unmap(), uint16(l4.DstPort)), true}, 0, l4.Payload)
			}
		}
	}
}

func (s *sniffer) add(k flowKey, seq uint32, payload []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.fl[k]
	if f == nil {
		f = &flow{seen: time.Now(), segs: map[uint32][]byte{}}
		s.fl[k] = f
	}
	if f.n >= sniffCap {
		return
	}
	if k.udp {
		// TFTP DATA (RFC 1350 §5: opcode 3, block number): keyed by its
		// block, without the header, so a retransmitted block counts once
		// and a value across two blocks reads whole.
		if len(payload) >= 4 && payload[0] == 0 && payload[1] == 3 {
			seq, payload = uint32(payload[2])<<8|uint32(payload[3]), payload[4:]
		} else {
			seq = 1<<20 + f.next
			f.next++
		}
	}
	if _, dup := f.segs[seq]; dup {
		return
	}
	f.segs[seq] = slices.Clone(payload)
	f.n += len(payload)
}

// sniffed is one match of find: the submatch, where it was sent and when
// its flow began.
type sniffed struct {
	Value string
	To    netip.AddrPort
	At    time.Time
}

// find returns the first submatch of re in every flow captured so far
// (TCP flows reassembled by sequence number), oldest flow first.
func (s *sniffer) find(re *regexp.Regexp) []sniffed {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []sniffed
	for k, f := range s.fl {
		seqs := slices.Sorted(func(yield func(uint32) bool) {
			for q := range f.segs {
				if !yield(q) {
					return
				}
			}
		})
		var b []byte
		for _, q := range seqs {
			b = append(b, f.segs[q]...)
		}
		for _, m := range re.FindAllSubmatch(b, -1) {
			out = append(out, sniffed{Value: string(m[1]), To: k.dst, At: f.seen})
		}
	}
	slices.SortStableFunc(out, func(a, b sniffed) int { return a.At.Compare(b.At) })
	return out
}

// close stops the capture.
func (s *sniffer) close() {
	if s == nil {
		return
	}
	select {
	case <-s.stop:
		return
	default:
	}
	close(s.stop)
	<-s.done
	unix.Close(s.fd)
}
