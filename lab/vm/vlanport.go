package vm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// vlanGateway terminates one 802.1Q VLAN of trunk ports in user space, as
// a switch's routed VLAN interface (SVI) does: frames tagged with vid that
// arrive on a trunk (a VM's tap, seen through an AF_PACKET socket) lose
// their tag and go to access, a tap device of the namespace the gateway
// owns, which carries the gateway address; frames from access get the tag and go to
// the trunk where their destination MAC was last seen (every trunk for
// broadcast, multicast and unknown destinations). Untagged frames and
// other VLANs are left to the namespace's bridge.
//
// It exists because a lab host's kernel may have neither 802.1Q VLAN
// devices (CONFIG_VLAN_8021Q) nor bridge VLAN filtering: the machine this
// lab was written on has neither. The VM's guest kernel does the host
// side (bonding, 8021q) as on a server.
type vlanGateway struct {
	vid    uint16
	trunks []int // AF_PACKET sockets
	tIdx   []int // their ifindexes
	// access is the tap's file: one frame per read or write, without
	// packet information or a vnet header, so the kernel hands over whole
	// frames with their checksums done (a tap has no offloads by default).
	access *os.File
	mu     sync.Mutex
	fdb    map[[6]byte]int // MAC → trunk position
	stop   atomic.Bool
	wg     sync.WaitGroup
	// maxUp and maxDown are the largest untagged frames (bytes, Ethernet
	// header included) forwarded from the trunks and to them.
	maxUp, maxDown atomic.Int64
}

// maxFrames returns the largest frames forwarded from the trunks (up) and
// to them (down), untagged, Ethernet header included: 9014 for a full
// 9000-byte MTU.
func (g *vlanGateway) maxFrames() (up, down int64) { return g.maxUp.Load(), g.maxDown.Load() }

func storeMax(a *atomic.Int64, n int64) {
	for {
		old := a.Load()
		if n <= old || a.CompareAndSwap(old, n) {
			return
		}
	}
}

// packetSocket opens an AF_PACKET socket bound to ifname inside namespace
// ns (all protocols, the VLAN tag in PACKET_AUXDATA, a 200 ms receive
// timeout so that close is noticed).
func packetSocket(ns, ifname string) (fd, idx int, err error) {
	err = inNetns(ns, func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		idx = ifi.Index
		proto := int(htons(unix.ETH_P_ALL))
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_AUXDATA, 1); err != nil {
			unix.Close(fd)
			return err
		}
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200000}); err != nil {
			unix.Close(fd)
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: idx}); err != nil {
			unix.Close(fd)
			return err
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("packet socket on %s: %w", ifname, err)
	}
	return fd, idx, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// startVLANGateway starts the gateway for vid between the trunk
// interfaces and the access interface, all in namespace ns.
func startVLANGateway(ns string, vid uint16, trunks []string, access string) (*vlanGateway, error) {
	g := &vlanGateway{vid: vid, fdb: map[[6]byte]int{}}
	for _, t := range trunks {
		fd, idx, err := packetSocket(ns, t)
		if err != nil {
			g.close()
			return nil, err
		}
		g.trunks, g.tIdx = append(g.trunks, fd), append(g.tIdx, idx)
	}
	f, err := openTap(ns, access)
	if err != nil {
		g.close()
		return nil, err
	}
	g.access = f
	for i := range g.trunks {
		g.wg.Add(1)
		go func() { defer g.wg.Done(); g.fromTrunk(i) }()
	}
	g.wg.Add(1)
	go func() { defer g.wg.Done(); g.fromAccess() }()
	return g, nil
}

// recv reads one received (not outgoing) frame from fd with its VLAN ID
// (0 when untagged), the tag removed.
func (g *vlanGateway) recv(fd int, buf, oob []byte) (frame []byte, vid uint16, err error) {
	for !g.stop.Load() {
		n, oobn, _, from, err := unix.Recvmsg(fd, buf, oob, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return nil, 0, err
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		if n < 14 {
			continue
		}
		frame = buf[:n]
		vid = 0
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if m.Header.Level == unix.SOL_PACKET && m.Header.Type == unix.PACKET_AUXDATA && len(m.Data) >= int(unsafe.Sizeof(unix.TpacketAuxdata{})) {
					aux := (*unix.TpacketAuxdata)(unsafe.Pointer(&m.Data[0]))
					if aux.Status&unix.TP_STATUS_VLAN_VALID != 0 {
						vid = aux.Vlan_tci & 0xfff
					}
				}
			}
		}
		if vid == 0 && binary.BigEndian.Uint16(frame[12:14]) == 0x8100 && n >= 18 {
			vid = binary.BigEndian.Uint16(frame[14:16]) & 0xfff
			copy(frame[12:], frame[16:])
			frame = frame[:n-4]
		}
		return frame, vid, nil
	}
	return nil, 0, errors.New("stopped")
}

func (g *vlanGateway) fromTrunk(i int) {
	buf, oob := make([]byte, 65536), make([]byte, 256)
	for {
		frame, vid, err := g.recv(g.trunks[i], buf, oob)
		if err != nil {
			return
		}
		if vid != g.vid {
			continue
		}
		var src [6]byte
		copy(src[:], frame[6:12])
		g.mu.Lock()
		g.fdb[src] = i
		g.mu.Unlock()
		storeMax(&g.maxUp, int64(len(frame)))
		_, _ = g.access.Write(frame)
	}
}

func (g *vlanGateway) fromAccess() {
	buf := make([]byte, 65536)
	out := make([]byte, 65536+4)
	for {
		n, err := g.access.Read(buf)
		if err != nil {
			return
		}
		if n < 14 {
			continue
		}
		frame := buf[:n]
		storeMax(&g.maxDown, int64(len(frame)))
		copy(out, frame[:12])
		binary.BigEndian.PutUint16(out[12:], 0x8100)
		binary.BigEndian.PutUint16(out[14:], g.vid)
		copy(out[16:], frame[12:])
		tagged := out[:len(frame)+4]
		var dst [6]byte
		copy(dst[:], frame[:6])
		g.mu.Lock()
		i, ok := g.fdb[dst]
		g.mu.Unlock()
		if ok && dst[0]&1 == 0 {
			_ = unix.Sendto(g.trunks[i], tagged, 0, &unix.SockaddrLinklayer{Ifindex: g.tIdx[i]})
			continue
		}
		for j, fd := range g.trunks {
			_ = unix.Sendto(fd, tagged, 0, &unix.SockaddrLinklayer{Ifindex: g.tIdx[j]})
		}
	}
}

// close stops the gateway and closes its sockets.
func (g *vlanGateway) close() {
	g.stop.Store(true)
	if g.access != nil {
		_ = g.access.Close()
	}
	g.wg.Wait()
	for _, fd := range g.trunks {
		unix.Close(fd)
	}
}

// openTap creates the tap device name inside namespace ns (IFF_TAP,
// IFF_NO_PI) and returns its file, non-blocking so that Close ends a
// pending Read. The device goes away when the file is closed.
func openTap(ns, name string) (*os.File, error) {
	var f *os.File
	err := inNetns(ns, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return err
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			unix.Close(fd)
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return err
		}
		f = os.NewFile(uintptr(fd), "/dev/net/tun")
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("tap %s: %w", name, err)
	}
	return f, nil
}
