// Package tftp is Machina's read-only TFTP server for the iPXE binaries:
// RFC 1350 with option negotiation (RFC 2347) for blksize (RFC 2348), tsize
// (RFC 2349; OVMF's PXE asks for the size first and aborts the transfer
// without it) and windowsize (RFC 7440; EDK2 can ask for it). It serves
// files from one directory through an os.Root, so "..", absolute paths, NUL
// bytes and symlinks leading out of the directory are refused; it limits
// concurrent transfers per client and in total; and it serves a generated
// `autoexec.ipxe` (iPXE asks for it first) that retries DHCP and chains to
// the controller's script URL.
//
// # Why not github.com/pin/tftp/v3
//
// The project's rule is that a well-kept library beats our own code unless
// a measured reason says otherwise. Until the boot-storm work this package used
// pin/tftp/v3 (v3.2.0), which has two such reasons:
//
//   - It cannot do RFC 7440. Its sender drops every option but blksize and
//     tsize from the OACK; its "anticipate" mode is a non-negotiated window
//     that a client asking for windowsize is never told about.
//   - Per block it costs more than the protocol needs. In the boot storm
//     (bench/bootstorm.sh, 1,000 clients each fetching undionly.kpxe, CPU
//     profile of the server, loaded shared machine) 74 % of the server's CPU
//     was its sender: a WriteToUDP to an address on an unconnected dual-stack
//     socket per block (36 %), a ReadFromUDP that allocates the source
//     address (25 %), a SetReadDeadline per block (5 %); its transfers took
//     1.1× dnsmasq's time per transfer at p50 in the same run (2,708 ms
//     against 2,449 ms stepwise), 1.8× on the idle machine (732 against
//     438 ms, bench/bootstorm.sh on a 2-core machine).
//
// This package's sender is dnsmasq's design in Go: each transfer still
// gets its own socket (the new TID RFC 1350 §4 asks for), connected to the
// client, so send(2) and recv(2) carry no address, use the kernel's cached
// route and allocate nothing; and one event loop (epoll over the listen
// socket and every transfer's socket, see loop) reads an ACK and sends the
// next block in the same pass. A goroutine per transfer (tried first, with
// the connected sockets) still paid per block a netpoll wake-up, a
// goroutine switch and a read that returned EAGAIN before the ACK came
// (13 % of the server's CPU in netpoll and the scheduler). At most
// MaxActive transfers send at once; later requests wait in arrival order,
// so in a storm the first clients finish first instead of all of them
// finishing together near the end.
//
// Figures on the loaded shared machine (load average 20-30 on 2 vCPUs;
// bench/bootstorm.sh, 1,000 clients, stepwise, p50/p99 ms, indicative
// only: the idle runs are bench/bootstorm.md's). The event loop without
// the queue, against pin/tftp and dnsmasq in one run: undionly.kpxe
// 1,906/1,970 against 2,262/2,338 and 1,259/2,247; ipxe.efi
// 28,208/28,358 against 43,796/44,030 and 34,888/36,811; server CPU for
// the two ipxe.efi runs 12.0 s against pin/tftp's 16.4 s. With the queue,
// in another run, undionly.kpxe 1,116/2,032 against pin/tftp's
// 2,911/2,961 and dnsmasq's 4,161/4,591. With the queue but no limit on
// the wait, 937 of 1,000 ipxe.efi clients gave up waiting behind 128 long
// transfers; with the wait bounded by Timeout, none, and ipxe.efi took
// 34,501/35,099 against dnsmasq's 51,982/52,989 in the same run.
//
// tftp imports only boot.
package tftp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/machina-metal/machina/boot"
	"github.com/pin/tftp/v3/netascii"
	"golang.org/x/sys/unix"
)

// AutoexecName is the file iPXE requests from the TFTP server it was loaded
// from before running its own DHCP-driven boot.
const AutoexecName = "autoexec.ipxe"

// Config configures a [Server]. Zero values are documented per field.
type Config struct {
	// Root is the directory served read-only, e.g. Debian's /usr/lib/ipxe
	// (package ipxe: undionly.kpxe, ipxe.efi, snponly.efi). Required.
	Root string
	// Addr is the UDP listen address. Zero: ":69", every interface; the
	// controller passes the provisioning address (the DHCP server's
	// ServerIP) so TFTP answers only there. A specific address is bound
	// with IP_FREEBIND: it need not be on the host yet (the HA virtual IP
	// is added only while this controller leads; until then nothing
	// arrives). Tests use "127.0.0.1:0".
	Addr string
	// ScriptURL is where the generated autoexec.ipxe chains to (the iPXE
	// handler's /boot/ipxe URL). Required.
	ScriptURL string
	// GRUBScriptURL, when set, is where the generated machina-grub.cfg
	// ([boot.GRUBConfigName], fetched by the arm64 GRUB image) and
	// grub/grub.cfg ([boot.GRUBPrefixConfig], fetched by Debian's signed
	// x64 GRUB network image in the Secure Boot chain) source the
	// machine's script from (the controller's [boot.GRUBScriptPath] URL;
	// http only). Zero: no machina-grub.cfg.
	GRUBScriptURL string
	// Script, when set, answers the per-machine GRUB scripts of the Secure
	// Boot chain: a read of [boot.GRUBTFTPScriptDir]+MAC (with or without
	// a leading "/") returns Script(ctx, MAC, client address). Debian's
	// signed x64 GRUB has no http module and, locked down, loads none, so
	// it fetches its script by TFTP; the generated [boot.GRUBPrefixConfig]
	// then sources it ([boot.SecureBootGRUBConfig]). An error is answered
	// "file not found". Script runs on the server's event loop, bounded by
	// 5 seconds: it must be quick (a lookup and a token). Zero: no
	// per-machine scripts and no grub/grub.cfg.
	Script func(ctx context.Context, mac string, peer netip.Addr) ([]byte, error)
	// Files are served by name from memory besides Root, e.g. the arm64
	// GRUB image ([boot.GRUBImageARM64]) kept outside Debian's
	// /usr/lib/ipxe. Names pass [CleanPath]; a name in Root too is served
	// from here.
	Files map[string][]byte
	// MaxPerClient bounds concurrent transfers per client IP. Zero: 4.
	MaxPerClient int
	// MaxTransfers bounds concurrent transfers in total, running and
	// waiting; requests beyond it are refused (TFTP error 0, ErrBusy: a
	// BIOS PXE ROM then gives up on the network boot). Each holds one
	// socket. Zero: 2048, so that a 1,000-machine boot storm waits rather
	// than being refused (it was 512 before the MaxActive queue).
	MaxTransfers int
	// MaxActive bounds the transfers sending at once; requests beyond it
	// wait, first come first served, for a running one to end, but never
	// longer than Timeout (their clients retransmit the request meanwhile,
	// which is ignored; they give up after a few). In a boot storm of small
	// files the first clients then finish first instead of all of them
	// finishing near the end. Zero: 128.
	MaxActive int
	// Timeout is the retransmission timeout: a packet (OACK or a window of
	// DATA) unanswered for Timeout is sent again. Zero: 1 second.
	Timeout time.Duration
	// Retries is the number of retransmissions before a transfer is
	// abandoned. Zero: 5.
	Retries int
	// MaxBlockSize caps the negotiated blksize (RFC 2348). Zero: 1468, the
	// largest block that fits a 1500-byte Ethernet MTU without IP
	// fragmentation (1500 - 20 IP - 8 UDP - 4 TFTP).
	MaxBlockSize int
	// MaxWindowSize caps the negotiated windowsize (RFC 7440), in blocks.
	// Zero: 64 (RFC 7440 §6 measured 16 to 64 as the useful range on a LAN).
	MaxWindowSize int
	// OnServed, when set, is called with the requested file name (without
	// a leading "/") and the client's address each time a transfer ends
	// with its last block acknowledged: the client has the whole file.
	// Size probes (EDK2 reads tsize, then aborts) and failed transfers are
	// not reported. The controller notes a machine's kernel and initrd
	// fetches with it (boot files have no MAC; it knows the address from
	// the machine's script request). It runs on the server's event loop:
	// it must not block. Nil: nothing is reported.
	OnServed func(name string, peer netip.Addr)
	// Logger: Debug per transfer, Warn per refused request. Nil: discard.
	Logger *slog.Logger
}

// Stats are transfer counters since New. Probed counts transfers the
// client ends on purpose right after the OACK with TFTP error 8 (RFC 2347
// §5): EDK2's PXE opens each file once only to read tsize and then aborts
// (seen from Debian 12's OVMF: probe with tsize=0 blksize=1468
// windowsize=4, ERROR 8, then the transfer from a new port); those are not
// Failed, so that every UEFI boot does not count as a failure. Windowed
// counts the Served transfers that ran with an RFC 7440 window over one
// block (the client asked for windowsize).
type Stats struct {
	Served, Refused, Limited, Failed, Probed, Windowed uint64
}

// Errors returned to clients (as TFTP ERROR packets) and counted. They never
// carry host paths.
var (
	ErrBadPath  = errors.New("access violation")
	ErrNotFound = errors.New("file not found")
	ErrBusy     = errors.New("too many transfers")
)

// Server is a read-only TFTP server.
type Server struct {
	cfg  Config
	log  *slog.Logger
	root *os.Root
	// generated holds autoexec.ipxe, machina-grub.cfg and Config.Files.
	generated map[string][]byte

	mu     sync.Mutex
	active map[string]int
	total  int
	conn   *net.UDPConn
	// peers holds the client address and port of each running transfer:
	// a retransmitted RRQ from a client still waiting for its first answer
	// is ignored rather than started twice (the client would get two TIDs).
	peers map[netip.AddrPort]struct{} // owned by the event loop

	served, refused, limited, failed, probed, windowed atomic.Uint64

	files fileCache
}

// fileCache keeps the contents of small served files (iPXE binaries are
// 70 KB to 1 MB) so a transfer sends blocks from memory instead of one
// pread per 1,428-byte block, for every client of a boot storm. An entry is used
// only while the file opened for the transfer still has the size, mtime,
// device and inode it was read with; every transfer still opens the file
// through the root, so a path is checked exactly as without the cache.
type fileCache struct {
	mu    sync.Mutex
	m     map[string]cachedFile
	bytes int64
}

type cachedFile struct {
	id   fileID
	data []byte
}

// fileID identifies a file version: size, mtime (ns), device and inode.
type fileID struct {
	size, mtime int64
	dev, ino    uint64
}

// Cache bounds: files above maxCachedFile are read from disk per block;
// past maxCacheBytes in total the cache is emptied and refilled.
const (
	maxCachedFile = 4 << 20
	maxCacheBytes = 64 << 20
)

func idOf(st os.FileInfo) fileID {
	id := fileID{size: st.Size(), mtime: st.ModTime().UnixNano()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		id.dev, id.ino = uint64(sys.Dev), sys.Ino
	}
	return id
}

// get returns f's contents (st is f's Stat): from the cache when the entry
// for name matches st, else read whole into the cache when small enough;
// nil (and no error) for a file over maxCachedFile, to be read from f. A miss is filled under the lock,
// so the first transfers of a storm read the file once, not once each
// (a thousand UEFI clients would otherwise allocate a gigabyte).
func (c *fileCache) get(name string, f *os.File, st os.FileInfo) ([]byte, error) {
	if st.Size() > maxCachedFile {
		return nil, nil
	}
	id := idOf(st)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[name]; ok && e.id == id {
		return e.data, nil
	}
	data := make([]byte, st.Size())
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, err
	}
	if c.m == nil || c.bytes+int64(len(data)) > maxCacheBytes {
		c.m, c.bytes = map[string]cachedFile{}, 0
	}
	c.bytes += int64(len(data)) - int64(len(c.m[name].data))
	c.m[name] = cachedFile{id: id, data: data}
	return data, nil
}

// New validates cfg and opens the root directory.
func New(cfg Config) (*Server, error) {
	if cfg.Root == "" {
		return nil, errors.New("tftp: new server: Root is required")
	}
	script, err := boot.ChainScript(cfg.ScriptURL)
	if err != nil {
		return nil, fmt.Errorf("tftp: new server: %w", err)
	}
	root, err := os.OpenRoot(cfg.Root)
	if err != nil {
		return nil, fmt.Errorf("tftp: new server: open root: %w", err)
	}
	if cfg.Addr == "" {
		cfg.Addr = ":69"
	}
	if cfg.MaxPerClient <= 0 {
		cfg.MaxPerClient = 4
	}
	if cfg.MaxTransfers <= 0 {
		cfg.MaxTransfers = 2048
	}
	if cfg.MaxActive <= 0 {
		cfg.MaxActive = 128
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	if cfg.Retries <= 0 {
		cfg.Retries = 5
	}
	if cfg.MaxBlockSize <= 512 || cfg.MaxBlockSize > maxBlockSize {
		cfg.MaxBlockSize = 1468
	}
	if cfg.MaxWindowSize <= 0 || cfg.MaxWindowSize > maxWindowSize {
		cfg.MaxWindowSize = 64
	}
	gen := map[string][]byte{AutoexecName: script}
	if cfg.GRUBScriptURL != "" {
		g, err := boot.GRUBChainConfig(cfg.GRUBScriptURL)
		if err != nil {
			root.Close()
			return nil, fmt.Errorf("tftp: new server: %w", err)
		}
		gen[boot.GRUBConfigName] = g
	}
	if cfg.Script != nil {
		// Debian's signed grubnetx64 (the Secure Boot chain) reads
		// $prefix/grub.cfg with prefix (tftp,SERVER)/grub.
		gen[boot.GRUBPrefixConfig] = boot.SecureBootGRUBConfig()
	}
	for name, b := range cfg.Files {
		if _, err := CleanPath(name); err != nil || name == AutoexecName || name == boot.GRUBConfigName || name == boot.GRUBPrefixConfig || strings.HasPrefix(name, boot.GRUBTFTPScriptDir) {
			root.Close()
			return nil, fmt.Errorf("tftp: new server: file name %q: refused (a plain relative name, not a generated one)", name)
		}
		gen[name] = b
	}
	s := &Server{cfg: cfg, log: cfg.Logger, root: root, generated: gen, active: map[string]int{}, peers: map[netip.AddrPort]struct{}{}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s, nil
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	return Stats{Served: s.served.Load(), Refused: s.refused.Load(), Limited: s.limited.Load(), Failed: s.failed.Load(), Probed: s.probed.Load(), Windowed: s.windowed.Load()}
}

// Listen opens the UDP socket (in the calling thread's network namespace).
// Serve calls it when needed.
func (s *Server) Listen() error {
	a, err := net.ResolveUDPAddr("udp4", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("tftp: listen %s: %w", s.cfg.Addr, err)
	}
	lc := net.ListenConfig{}
	if a.IP != nil && !a.IP.IsUnspecified() {
		lc.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_FREEBIND, 1)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	pc, err := lc.ListenPacket(context.Background(), "udp4", a.String())
	if err != nil {
		return fmt.Errorf("tftp: listen %s: %w", s.cfg.Addr, err)
	}
	c := pc.(*net.UDPConn)
	growReadBuffer(c, 4<<20) // a boot storm's read requests arrive at once
	s.mu.Lock()
	s.conn = c
	s.mu.Unlock()
	return nil
}

// Addr returns the bound address after Listen, or nil.
func (s *Server) Addr() *net.UDPAddr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return nil
	}
	return s.conn.LocalAddr().(*net.UDPAddr)
}

// Serve answers read requests until ctx is done, then stops accepting,
// lets running transfers finish for at most Timeout × Retries, closes the
// sockets of those still running and returns nil. Each transfer gets its
// own UDP socket (a new TID, RFC 1350 §4), opened by the goroutine that
// called Serve, which also runs the event loop (see the package doc), so
// every socket lands in that thread's network namespace. Write requests
// are refused (TFTP error 4). Errors: the listen socket or epoll failing.
func (s *Server) Serve(ctx context.Context) error {
	if s.Addr() == nil {
		if err := s.Listen(); err != nil {
			return err
		}
	}
	s.log.Info("tftp serving", "addr", s.conn.LocalAddr().String())
	l, err := newLoop(s)
	if err != nil {
		s.conn.Close()
		s.root.Close()
		return fmt.Errorf("tftp: serve: %w", err)
	}
	stop := context.AfterFunc(ctx, l.shutdown)
	err = l.run()
	stop()
	l.close()
	s.conn.Close()
	s.root.Close()
	if err != nil {
		return fmt.Errorf("tftp: serve: %w", err)
	}
	return nil
}

// handle answers one datagram on the listen socket and returns the new
// transfer to run, or nil. Malformed packets that are not requests and
// anything but RRQ/WRQ are dropped (RFC 1350 §5: an ERROR is never
// answered, and a stray ACK or DATA has no transfer here); refusals are
// answered with an ERROR from a new TID. Called by the event loop only.
func (s *Server) handle(p []byte, from netip.AddrPort) *transfer {
	from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
	req, perr := parseRequest(p)
	if perr != nil && req.op != opRRQ && req.op != opWRQ {
		s.log.Debug("tftp dropped packet", "peer", from.String(), "err", perr)
		return nil
	}
	if _, dup := s.peers[from]; dup {
		s.log.Debug("tftp ignored repeated request", "peer", from.String())
		return nil
	}
	ip := from.Addr().String()
	log := s.log.With("peer", from.String(), "file", strings.ToValidUTF8(req.filename, "?"))
	fd, err := s.dial(from)
	if err != nil {
		s.failed.Add(1)
		log.Warn("tftp transfer socket", "err", err)
		return nil
	}
	refuse := func(code uint16, e error) *transfer {
		_, _ = unix.Write(fd, errorPacket(code, e.Error()))
		_ = unix.Close(fd)
		return nil
	}
	if perr != nil {
		s.refused.Add(1)
		log.Warn("tftp refused request", "err", perr)
		return refuse(codeIllegalOp, errMalformed)
	}
	if req.op == opWRQ {
		s.refused.Add(1)
		log.Warn("tftp refused write request")
		return refuse(codeIllegalOp, errors.New("read-only server"))
	}
	if req.mode != "octet" && req.mode != "netascii" {
		s.refused.Add(1)
		log.Warn("tftp refused mode", "mode", strings.ToValidUTF8(req.mode, "?"))
		return refuse(codeIllegalOp, errors.New("unsupported mode"))
	}
	if !s.acquire(ip) {
		s.limited.Add(1)
		log.Warn("tftp refused: transfer limit")
		return refuse(codeUndefined, ErrBusy)
	}
	t, code, err := s.openAny(req, ip, log)
	if err != nil {
		s.release(ip)
		return refuse(code, err)
	}
	t.fd, t.peer, t.ip, t.log = fd, from, ip, log
	t.name = strings.TrimPrefix(req.filename, "/")
	s.peers[from] = struct{}{}
	return t
}

// end releases a finished transfer's limits and counts it; err nil means
// the last block was acknowledged.
func (s *Server) end(t *transfer, err error) {
	var pe *peerError
	fromPeer := errors.As(err, &pe)
	if err != nil {
		if !fromPeer {
			msg := "transfer failed"
			if errors.Is(err, errTimeout) {
				msg = "timeout"
			}
			_, _ = unix.Write(t.fd, errorPacket(codeUndefined, msg))
		}
	}
	_ = unix.Close(t.fd)
	t.close()
	s.release(t.ip)
	delete(s.peers, t.peer)
	if fromPeer && pe.code == codeBadOptions && t.negotiating {
		s.probed.Add(1)
		t.log.Debug("tftp size probe ended by the client", "tsize", t.size)
		return
	}
	if err != nil {
		s.failed.Add(1)
		t.log.Debug("tftp transfer ended", "err", err, "packets", t.sent)
		return
	}
	s.served.Add(1)
	if t.window > 1 {
		s.windowed.Add(1)
	}
	t.log.Debug("tftp sent", "bytes", t.size, "blksize", t.blksize, "windowsize", t.window, "packets", t.sent)
	if s.cfg.OnServed != nil {
		s.cfg.OnServed(t.name, t.peer.Addr())
	}
}

// dial opens the transfer's socket (non-blocking), connected to the
// client, from the listen address's IP (any: the kernel picks the source
// by route, the provisioning interface's own address on a single-homed
// segment).
func (s *Server) dial(to netip.AddrPort) (int, error) {
	if !to.Addr().Is4() {
		return -1, fmt.Errorf("peer %s is not IPv4", to)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	if la := s.conn.LocalAddr().(*net.UDPAddr); !la.IP.IsUnspecified() {
		if a, ok := netip.AddrFromSlice(la.IP.To4()); ok {
			if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: a.As4()}); err != nil {
				unix.Close(fd)
				return -1, fmt.Errorf("bind: %w", err)
			}
		}
	}
	if err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(to.Port()), Addr: to.Addr().As4()}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("connect: %w", err)
	}
	return fd, nil
}

// open resolves req to a transfer without a socket: the file (through the
// root, or a generated file: autoexec.ipxe, machina-grub.cfg, Config.Files), its size and the negotiated
// options; t.close releases the file. On error it returns the TFTP error
// code and a message without host detail, and counts the refusal.
func (s *Server) open(req request, log *slog.Logger) (t *transfer, code uint16, err error) {
	closeSrc := func() {}
	var data []byte
	var src io.ReaderAt
	var size int64
	name := req.filename
	// GRUB names every file from the root of its device, with a leading
	// "/" ((tftp)/machina-grub.cfg is requested as "/machina-grub.cfg",
	// seen with Debian's grubnetaa64 2.06): a generated file is found with
	// or without it. Files of Root still need a relative name.
	if strings.HasPrefix(name, "/") {
		if _, ok := s.generated[name[1:]]; ok {
			name = name[1:]
		}
	}
	clean, err := CleanPath(name)
	gen, generated := s.generated[clean]
	switch {
	case err != nil:
		s.refused.Add(1)
		log.Warn("tftp refused path", "err", err)
		return nil, codeAccess, ErrBadPath
	case generated:
		if data = gen; data == nil {
			data = []byte{} // nil means "read from src" below
		}
	default:
		f, err := s.root.Open(clean) // refuses symlinks and ".." leading out of the root
		if err != nil {
			s.refused.Add(1)
			if errors.Is(err, os.ErrNotExist) {
				log.Debug("tftp not found")
				return nil, codeNotFound, ErrNotFound
			}
			log.Warn("tftp refused open", "err", err)
			return nil, codeAccess, ErrBadPath
		}
		st, err := f.Stat()
		if err != nil || !st.Mode().IsRegular() {
			f.Close()
			s.refused.Add(1)
			log.Warn("tftp refused: not a regular file")
			return nil, codeNotFound, ErrNotFound
		}
		if data, err = s.files.get(clean, f, st); err != nil {
			f.Close()
			s.failed.Add(1)
			log.Warn("tftp read failed", "err", err)
			return nil, codeNotFound, ErrNotFound
		}
		if data != nil {
			f.Close()
		} else {
			src, size, closeSrc = f, st.Size(), func() { f.Close() }
		}
	}
	if req.mode == "netascii" {
		// Converted whole (LF to CR LF, CR to CR NUL: RFC 764), so tsize is
		// the size the client receives and a window can be resent.
		var r io.Reader
		if data != nil {
			r = bytes.NewReader(data)
		} else {
			r = io.NewSectionReader(src, 0, size)
		}
		conv, err := io.ReadAll(io.LimitReader(netascii.ToReader(r), 2*maxCachedFile+1))
		closeSrc()
		closeSrc = func() {}
		if err != nil || len(conv) > 2*maxCachedFile {
			s.refused.Add(1)
			log.Warn("tftp refused netascii transfer", "err", err, "bytes", len(conv))
			return nil, codeIllegalOp, errors.New("file too large for netascii")
		}
		data = conv
	}
	if data != nil {
		src, size = bytes.NewReader(data), int64(len(data))
	}
	return s.newTransfer(req, src, size, closeSrc), 0, nil
}

// openAny resolves req: a machine's GRUB script (Config.Script) or a file
// (open).
func (s *Server) openAny(req request, ip string, log *slog.Logger) (*transfer, uint16, error) {
	if mac, ok := strings.CutPrefix(strings.TrimPrefix(req.filename, "/"), boot.GRUBTFTPScriptDir); ok && s.cfg.Script != nil {
		return s.openScript(req, mac, ip, log)
	}
	return s.open(req, log)
}

// openScript is the transfer of mac's GRUB script (Config.Script),
// bounded by 5 seconds; a refusal is "file not found".
func (s *Server) openScript(req request, mac, ip string, log *slog.Logger) (*transfer, uint16, error) {
	peer, _ := netip.ParseAddr(ip)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	b, err := s.cfg.Script(ctx, mac, peer)
	cancel()
	if err != nil {
		s.refused.Add(1)
		log.Warn("tftp script refused", "err", err)
		return nil, codeNotFound, ErrNotFound
	}
	return s.newTransfer(req, bytes.NewReader(b), int64(len(b)), func() {}), 0, nil
}

// newTransfer is the transfer of src (size bytes) with the options the
// client asked for, bounded by the server's (blksize, windowsize; tsize
// is answered), and their OACK when it asked for any (RFC 2347-2349, 7440).
func (s *Server) newTransfer(req request, src io.ReaderAt, size int64, closeSrc func()) *transfer {
	t := &transfer{src: src, close: closeSrc, size: size, blksize: 512, window: 1}
	var oack []byte
	if req.blksize > 0 {
		t.blksize = min(req.blksize, s.cfg.MaxBlockSize)
		oack = appendOption(oack, "blksize", int64(t.blksize))
	}
	if req.tsize {
		oack = appendOption(oack, "tsize", size)
	}
	if req.windowsize > 0 {
		t.window = min(req.windowsize, s.cfg.MaxWindowSize)
		oack = appendOption(oack, "windowsize", int64(t.window))
	}
	if oack != nil {
		t.oack = append([]byte{0, opOACK}, oack...)
	}
	t.buf = make([]byte, 4+t.blksize)
	return t
}

// CleanPath checks a requested file name and returns it relative to the
// root. It refuses empty names, NUL bytes, backslashes, absolute paths and
// any ".." element, wrapping ErrBadPath.
func CleanPath(name string) (string, error) {
	switch {
	case name == "", len(name) > 255:
		return "", fmt.Errorf("%w: bad length", ErrBadPath)
	case strings.ContainsRune(name, 0):
		return "", fmt.Errorf("%w: nul byte", ErrBadPath)
	case strings.ContainsRune(name, '\\'):
		return "", fmt.Errorf("%w: backslash", ErrBadPath)
	case strings.HasPrefix(name, "/"):
		return "", fmt.Errorf("%w: absolute path", ErrBadPath)
	}
	for _, el := range strings.Split(name, "/") {
		if el == ".." || el == "." || el == "" {
			return "", fmt.Errorf("%w: %q element", ErrBadPath, el)
		}
	}
	return name, nil
}

func (s *Server) acquire(ip string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.total >= s.cfg.MaxTransfers || s.active[ip] >= s.cfg.MaxPerClient {
		return false
	}
	s.total++
	s.active[ip]++
	return true
}

func (s *Server) release(ip string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total--
	if s.active[ip]--; s.active[ip] <= 0 {
		delete(s.active, ip)
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
