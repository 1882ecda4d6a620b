// Package tftp is Machina's read-only TFTP server (RFC 1350) for the iPXE
// binaries, on github.com/pin/tftp/v3. It honours the blksize (RFC 2348) and
// tsize (RFC 2349) options: OVMF's PXE asks for the size first and aborts
// the transfer without it. It serves files from one directory through an
// os.Root, so "..", absolute paths, NUL bytes and symlinks leading out of the
// directory are refused; it limits concurrent transfers per client and in
// total; and it serves a generated `autoexec.ipxe` (iPXE asks for it first)
// that retries DHCP and chains to the controller's script URL.
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
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/machina-metal/machina/boot"
	ptftp "github.com/pin/tftp/v3"
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
	// Addr is the UDP listen address. Zero: ":69". Tests use "127.0.0.1:0".
	Addr string
	// ScriptURL is where the generated autoexec.ipxe chains to (the iPXE
	// handler's /boot/ipxe URL). Required.
	ScriptURL string
	// GRUBScriptURL, when set, is where the generated machina-grub.cfg
	// ([boot.GRUBConfigName], fetched by the arm64 GRUB image) sources the
	// machine's script from (the controller's [boot.GRUBScriptPath] URL;
	// http only). Zero: no machina-grub.cfg.
	GRUBScriptURL string
	// Files are served by name from memory besides Root, e.g. the arm64
	// GRUB image ([boot.GRUBImageARM64]) kept outside Debian's
	// /usr/lib/ipxe. Names pass [CleanPath]; a name in Root too is served
	// from here.
	Files map[string][]byte
	// MaxPerClient bounds concurrent transfers per client IP. Zero: 4.
	MaxPerClient int
	// MaxTransfers bounds concurrent transfers in total. Zero: 512.
	MaxTransfers int
	// Timeout is the retransmission timeout per packet. Zero: 1 second.
	Timeout time.Duration
	// Retries is the number of retransmissions before a transfer is
	// abandoned. Zero: 5.
	Retries int
	// MaxBlockSize caps the negotiated blksize (RFC 2348). Zero: 1468, the
	// largest block that fits a 1500-byte Ethernet MTU without IP
	// fragmentation (1500 - 20 IP - 8 UDP - 4 TFTP).
	MaxBlockSize int
	// Logger: Debug per transfer, Warn per refused request. Nil: discard.
	Logger *slog.Logger
}

// Stats are transfer counters since New. Failed includes transfers the
// client abandons on purpose: EDK2's PXE opens each file once only to read
// tsize and then aborts (TFTP error 8).
type Stats struct {
	Served, Refused, Limited, Failed uint64
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

	served, refused, limited, failed atomic.Uint64

	files fileCache
}

// fileCache keeps the contents of small served files (iPXE binaries are
// 70 KB to 1 MB) so a transfer sends blocks from memory: pin/tftp reads
// one block per io.Reader call, which from an *os.File is one pread per
// 1,428-byte block, for every client of a boot storm. An entry is used
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

// reader returns a reader over f's contents (st is f's Stat): from the
// cache when the entry for name matches st, else read whole into the
// cache when small enough, else f itself. A miss is filled under the lock,
// so the first transfers of a storm read the file once, not once each
// (a thousand UEFI clients would otherwise allocate a gigabyte).
func (c *fileCache) reader(name string, f *os.File, st os.FileInfo) (io.ReadSeeker, error) {
	if st.Size() > maxCachedFile {
		return f, nil
	}
	id := idOf(st)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[name]; ok && e.id == id {
		return bytes.NewReader(e.data), nil
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
	return bytes.NewReader(data), nil
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
		cfg.MaxTransfers = 512
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	if cfg.Retries <= 0 {
		cfg.Retries = 5
	}
	if cfg.MaxBlockSize <= 512 || cfg.MaxBlockSize > 65464 {
		cfg.MaxBlockSize = 1468
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
	for name, b := range cfg.Files {
		if _, err := CleanPath(name); err != nil || name == AutoexecName || name == boot.GRUBConfigName {
			root.Close()
			return nil, fmt.Errorf("tftp: new server: file name %q: refused (a plain relative name, not a generated one)", name)
		}
		gen[name] = b
	}
	s := &Server{cfg: cfg, log: cfg.Logger, root: root, generated: gen, active: map[string]int{}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s, nil
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	return Stats{Served: s.served.Load(), Refused: s.refused.Load(), Limited: s.limited.Load(), Failed: s.failed.Load()}
}

// Listen opens the UDP socket (in the calling thread's network namespace).
// Serve calls it when needed.
func (s *Server) Listen() error {
	a, err := net.ResolveUDPAddr("udp4", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("tftp: listen %s: %w", s.cfg.Addr, err)
	}
	c, err := net.ListenUDP("udp4", a)
	if err != nil {
		return fmt.Errorf("tftp: listen %s: %w", s.cfg.Addr, err)
	}
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
// waits for running transfers (bounded by Timeout × Retries) and returns nil.
// Each transfer gets its own UDP socket (a new TID, RFC 1350 §4), opened by
// the goroutine that called Serve, so it lands in that thread's network
// namespace.
func (s *Server) Serve(ctx context.Context) error {
	if s.Addr() == nil {
		if err := s.Listen(); err != nil {
			return err
		}
	}
	srv := ptftp.NewServer(s.read, nil)
	srv.SetTimeout(s.cfg.Timeout)
	srv.SetRetries(s.cfg.Retries)
	// The retransmit timeout has already passed when the library backs off;
	// its default adds a random sleep of up to 1 s on top.
	srv.SetBackoff(func(int) time.Duration { return 0 })
	// Block size: honour the client's blksize up to MaxBlockSize. The
	// library's MTU clamp needs the receiving interface per request, see
	// plainConn.
	srv.SetBlockSizeNegotiation(false)
	srv.SetBlockSize(s.cfg.MaxBlockSize)
	srv.SetHook(hook{s})
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-ctx.Done():
			srv.Shutdown()
		case <-done:
		}
	}()
	s.log.Info("tftp serving", "addr", s.conn.LocalAddr().String())
	err := srv.Serve(plainConn{s.conn}) // returns nil after Shutdown
	close(done)
	<-stopped
	s.root.Close()
	if ctx.Err() != nil {
		return nil
	}
	if err == nil {
		err = errors.New("stopped unexpectedly")
	}
	return fmt.Errorf("tftp: serve: %w", err)
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

// read is the pin/tftp read handler. Returned errors become TFTP ERROR
// packets, so they carry no host detail.
func (s *Server) read(name string, rf io.ReaderFrom) error {
	var peer net.UDPAddr
	if ot, ok := rf.(ptftp.OutgoingTransfer); ok {
		peer = ot.RemoteAddr()
	}
	ip := peer.IP.String()
	log := s.log.With("peer", peer.String(), "file", strings.ToValidUTF8(name, "?"))
	if !s.acquire(ip) {
		s.limited.Add(1)
		log.Warn("tftp refused: transfer limit")
		return ErrBusy
	}
	defer s.release(ip)
	clean, err := CleanPath(name)
	if err != nil {
		s.refused.Add(1)
		log.Warn("tftp refused path", "err", err)
		return ErrBadPath
	}
	var r io.ReadSeeker
	var size int64
	if b, ok := s.generated[clean]; ok {
		r, size = bytes.NewReader(b), int64(len(b))
	} else {
		f, err := s.root.Open(clean) // refuses symlinks and ".." leading out of the root
		if err != nil {
			s.refused.Add(1)
			if errors.Is(err, os.ErrNotExist) {
				log.Debug("tftp not found")
				return ErrNotFound
			}
			log.Warn("tftp refused open", "err", err)
			return ErrBadPath
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil || !st.Mode().IsRegular() {
			s.refused.Add(1)
			log.Warn("tftp refused: not a regular file")
			return ErrNotFound
		}
		if r, err = s.files.reader(clean, f, st); err != nil {
			s.failed.Add(1)
			log.Warn("tftp read failed", "err", err)
			return ErrNotFound
		}
		size = st.Size()
	}
	if ot, ok := rf.(ptftp.OutgoingTransfer); ok {
		ot.SetSize(size) // tsize (RFC 2349)
	}
	n, err := rf.ReadFrom(r)
	if err != nil {
		log.Debug("tftp transfer ended", "err", err, "bytes", n)
		return nil // the library already aborted the transfer; the hook counts it
	}
	log.Debug("tftp sent", "bytes", n)
	return nil
}

// plainConn hides the *net.UDPConn from pin/tftp. Given a *net.UDPConn, the
// library reads IP control messages and calls net.InterfaceByIndex (a
// netlink dump of every interface) for each request in its single read
// loop, which serialised a 1,000-client boot storm to ~3 ms per request
// (bench/bootstorm.sh: TFTP p50 2.7 s). Without it, each transfer's socket is
// bound to the wildcard address and the kernel picks the reply source by
// route, the provisioning interface's own address on a single-homed segment.
type plainConn struct{ net.PacketConn }

type hook struct{ s *Server }

// OnSuccess counts a completed transfer.
func (h hook) OnSuccess(ptftp.TransferStats) { h.s.served.Add(1) }

// OnFailure counts a failed transfer, except refusals the handler counted.
func (h hook) OnFailure(st ptftp.TransferStats, err error) {
	if st.Filename != "" && !errors.Is(err, ErrBadPath) && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrBusy) {
		h.s.failed.Add(1)
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
