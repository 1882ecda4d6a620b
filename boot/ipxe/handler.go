package ipxe

import (
	"context"
	"errors"
	"fmt"
	"github.com/machina-metal/machina/internal/httpstatus"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/macaddr"
)

// Config configures a [Handler]. Zero values are documented per field.
type Config struct {
	// Lookup gives each MAC's lifecycle and boot mode. Required.
	Lookup boot.Lookup
	// Tokens mints the ramdisk tokens and checks them in [Handler.RequireToken]. Required.
	Tokens boot.Tokens
	// Enroller records unknown MACs when AutoEnroll is set. Nil with
	// AutoEnroll set is a configuration error.
	Enroller boot.Enroller
	// AutoEnroll (MACHINA_METAL_AUTO_ENROLL=1) answers unknown MACs with the
	// assignment the Enroller returns; false answers them with `exit`.
	AutoEnroll bool
	// ControllerURL is the controller's base URL as machines reach it, e.g.
	// "http://10.99.0.1:8080". Required; checked with boot.CheckURL.
	ControllerURL string
	// KernelURL and InitrdURL locate the ramdisk. Zero: ControllerURL +
	// "/boot/ramdisk/vmlinuz" and "/boot/ramdisk/initrd.cpio.gz".
	KernelURL, InitrdURL string
	// KernelArgs are prepended to Machina's own kernel arguments. Zero:
	// "console=tty0 console=ttyS0". Allowed characters: A-Z a-z 0-9 space
	// and ._,:=/@+-.
	KernelArgs string
	// ARM64KernelURL and ARM64InitrdURL locate the arm64 ramdisk (`make
	// ramdisk ARCH=arm64`), used when the boot loader reports arch arm64
	// (iPXE's ${buildarch}, GRUB's ${grub_cpu}). Zero: ControllerURL +
	// "/boot/ramdisk/arm64/vmlinuz" and ".../arm64/initrd.cpio.gz".
	ARM64KernelURL, ARM64InitrdURL string
	// ARM64KernelArgs replace KernelArgs for arm64 machines. Zero:
	// "console=tty0 console=ttyAMA0" (the SBSA/PL011 UART of qemu's virt
	// board and of most arm64 servers).
	ARM64KernelArgs string
	// LLDPWait, when not zero, bounds the commissioning ramdisk's LLDP
	// listen: machina.lldp_wait= follows the kernel arguments of a
	// commissioning script (negative turns the listen off:
	// machina.lldp_wait=0s). Zero leaves the agent's default (32 s); whole
	// seconds, at most 10 minutes.
	LLDPWait time.Duration
	// TokenTTL bounds a ramdisk token's life. Zero: 30 minutes (a TCG boot
	// reaches the agent in well under a minute; real servers POST for minutes).
	TokenTTL time.Duration
	// InstallTokenTTL bounds the reusable install token of an installer
	// boot, which the installer uses for its whole run (anaconda reads its
	// packages from the served tree). Zero: 2 hours.
	InstallTokenTTL time.Duration
	// PerIP and PerMAC limit script requests. Zero: PerIP 20 burst refilling
	// one per 100ms; PerMAC 6 burst refilling one per 2s.
	PerIP, PerMAC Limit
	// ISODir, when set, is served read-only at /boot/iso/NAME (Range
	// supported, as qemu's curl block driver and BMC virtual media need).
	ISODir string
	// BinDir, when set, is served read-only at /boot/bin/NAME: the iPXE
	// binaries for UEFI HTTP boot clients (DHCP option 93 arch 16/19 get a URL
	// such as ControllerURL + "/boot/bin/snponly.efi"). Symlinks leading out
	// of the directory are refused: Debian's /usr/lib/ipxe/ipxe.efi is a
	// symlink to /boot, snponly.efi is a regular file.
	BinDir string
	// RamdiskDir, when set, is served read-only at /boot/ramdisk/PATH: the
	// ramdisk's vmlinuz and initrd.cpio.gz (make ramdisk), which the
	// scripts' default KernelURL and InitrdURL name. Symlinks leading out of
	// the folder are refused, and so are listings. Like ISODir
	// and BinDir, a folder that cannot be opened is an error of New.
	RamdiskDir string
	// OnScript, when set, is told of each script that boots the ramdisk
	// (commission, deploy, wipe) served to a known server, by HTTP (iPXE,
	// GRUB) or by TFTP ([Handler.TFTPScript]), with the client's address:
	// the boot loader fetches the kernel and initrd from that address next.
	// Called synchronously: it must not block. Nil: nothing is told.
	OnScript func(a boot.Assignment, peer netip.Addr)
	// OnServed, when set, is told of each GET of /boot/ramdisk/PATH
	// answered in full (HTTP 200: the whole file written), with PATH
	// (e.g. "vmlinuz") and the client's address; ranges, HEAD and
	// refusals are not told. Called synchronously: it must not block.
	// Nil: nothing is told.
	OnServed func(path string, peer netip.Addr)
	// OnEvent receives security-relevant events (token rejected, rate
	// limited, MAC discovered). Called synchronously: it must not block.
	// Nil: events are only logged.
	OnEvent func(Event)
	// Logger receives Debug per request and Warn for rejected tokens. Nil: discard.
	Logger *slog.Logger
}

// Limit is a token bucket: Burst requests at once, refilled one per Every.
type Limit = boot.Limit

// EventKind names an [Event].
type EventKind string

// Event kinds.
const (
	EventTokenRejected EventKind = "token-rejected" // expired, reused or unknown token (HTTP 403)
	EventRateLimited   EventKind = "rate-limited"   // HTTP 429
	EventDiscovered    EventKind = "discovered"     // unknown MAC auto-enrolled
)

// Event is reported through [Config.OnEvent]. It never contains a token.
type Event struct {
	Kind   EventKind
	MAC    string     // canonical, may be empty
	IP     netip.Addr // the HTTP peer
	Reason string     // e.g. "token already used", "per-mac"
}

// Handler serves `GET /boot/ipxe` (scripts) and, when their folders are
// set, `GET /boot/iso/NAME`, `/boot/bin/NAME` and `/boot/ramdisk/PATH`
// (through [boot.ServeFile]). Safe for concurrent use.
type Handler struct {
	cfg     Config
	log     *slog.Logger
	ipLim   *boot.Limiter
	macLim  *boot.Limiter
	mux     *http.ServeMux
	isos    *boot.Files
	bins    *boot.Files
	ramdisk *boot.Files
}

// ScriptPath is the path the handler serves scripts on.
const ScriptPath = "/boot/ipxe"

// bootDefaults fills the boot URLs and kernel arguments a Config leaves
// empty (the controller's /boot/ramdisk/ files, serial consoles) and
// checks them, and the LLDP bound, before any script is rendered.
func (c *Config) bootDefaults() error {
	c.ControllerURL = strings.TrimSuffix(c.ControllerURL, "/")
	if c.KernelURL == "" {
		c.KernelURL = c.ControllerURL + "/boot/ramdisk/vmlinuz"
	}
	if c.InitrdURL == "" {
		c.InitrdURL = c.ControllerURL + "/boot/ramdisk/initrd.cpio.gz"
	}
	if c.ARM64KernelURL == "" {
		c.ARM64KernelURL = c.ControllerURL + "/boot/ramdisk/arm64/vmlinuz"
	}
	if c.ARM64InitrdURL == "" {
		c.ARM64InitrdURL = c.ControllerURL + "/boot/ramdisk/arm64/initrd.cpio.gz"
	}
	if c.ARM64KernelArgs == "" {
		c.ARM64KernelArgs = "console=tty0 console=ttyAMA0"
	}
	if !safeArg(c.ARM64KernelArgs) {
		return errors.New("ipxe: new handler: ARM64KernelArgs has characters outside A-Za-z0-9 ._,:=/@+-")
	}
	for _, u := range []string{c.ControllerURL, c.KernelURL, c.InitrdURL, c.ARM64KernelURL, c.ARM64InitrdURL} {
		if err := boot.CheckURL(u); err != nil {
			return fmt.Errorf("ipxe: new handler: %w", err)
		}
	}
	if c.KernelArgs == "" {
		c.KernelArgs = "console=tty0 console=ttyS0"
	}
	if !safeArg(c.KernelArgs) {
		return errors.New("ipxe: new handler: KernelArgs has characters outside A-Za-z0-9 ._,:=/@+-")
	}
	if c.LLDPWait > 10*time.Minute || (c.LLDPWait > 0 && c.LLDPWait%time.Second != 0) {
		return fmt.Errorf("ipxe: new handler: LLDPWait %v: whole seconds up to 10m", c.LLDPWait)
	}
	return nil
}

// New validates cfg and returns a Handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Lookup == nil || cfg.Tokens == nil {
		return nil, errors.New("ipxe: new handler: Lookup and Tokens are required")
	}
	if cfg.AutoEnroll && cfg.Enroller == nil {
		return nil, errors.New("ipxe: new handler: AutoEnroll needs an Enroller")
	}
	if err := cfg.bootDefaults(); err != nil {
		return nil, err
	}
	if cfg.TokenTTL <= 0 {
		cfg.TokenTTL = 30 * time.Minute
	}
	if cfg.InstallTokenTTL <= 0 {
		cfg.InstallTokenTTL = 2 * time.Hour
	}
	if cfg.PerIP.Burst <= 0 || cfg.PerIP.Every <= 0 {
		cfg.PerIP = Limit{Burst: 20, Every: 100 * time.Millisecond}
	}
	if cfg.PerMAC.Burst <= 0 || cfg.PerMAC.Every <= 0 {
		cfg.PerMAC = Limit{Burst: 6, Every: 2 * time.Second}
	}
	h := &Handler{cfg: cfg, log: cfg.Logger, ipLim: boot.NewLimiter(cfg.PerIP), macLim: boot.NewLimiter(cfg.PerMAC), mux: http.NewServeMux()}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	h.mux.HandleFunc("GET "+ScriptPath, func(w http.ResponseWriter, r *http.Request) { h.serveScript(w, r, DialectIPXE) })
	h.mux.HandleFunc("GET "+boot.GRUBScriptPath, func(w http.ResponseWriter, r *http.Request) { h.serveScript(w, r, DialectGRUB) })
	for _, d := range []struct {
		dir, prefix string
		files       **boot.Files
		opt         boot.FileOptions
	}{
		{cfg.ISODir, "/boot/iso/", &h.isos, boot.FileOptions{Ext: ".iso", ContentType: "application/x-iso9660-image", Flat: true}},
		{cfg.BinDir, "/boot/bin/", &h.bins, boot.FileOptions{Flat: true}},
		{cfg.RamdiskDir, "/boot/ramdisk/", &h.ramdisk, boot.FileOptions{}},
	} {
		if d.dir == "" {
			continue
		}
		f, err := boot.OpenFiles(d.dir, d.opt)
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("ipxe: new handler: %s: %w", d.prefix, err)
		}
		*d.files = f
		var fh http.Handler = f
		if d.prefix == "/boot/ramdisk/" && cfg.OnServed != nil {
			fh = servedHandler{next: f, on: cfg.OnServed}
		}
		h.mux.Handle("GET "+d.prefix, http.StripPrefix(d.prefix, fh))
	}
	return h, nil
}

// ServeHTTP implements http.Handler. A GET or HEAD of exactly ScriptPath,
// every machine's request in a boot storm, goes to the script without the
// mux's second match (the api server's mux has matched it already): the
// route is "GET /boot/ipxe", without host or wildcard, which a clean path
// equal to it matches and nothing else registered here does, so the answer
// is the mux's (the script endpoint's cost per request).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == ScriptPath && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		h.serveScript(w, r, DialectIPXE)
		return
	}
	h.mux.ServeHTTP(w, r)
}

// safeArch reports whether arch, iPXE's ${buildarch} as the script query
// carries it, is at most 16 of a-z, 0-9 and "_" (empty allowed): the
// values it takes are i386, x86_64, arm32 and arm64.
func safeArch(arch string) bool {
	if len(arch) > 16 {
		return false
	}
	for i := 0; i < len(arch); i++ {
		c := arch[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// serveScript answers GET /boot/ipxe (DialectIPXE) and GET /boot/grub
// (DialectGRUB): the same lookup, limits and tokens, rendered for the boot
// loader that asked.
func (h *Handler) serveScript(w http.ResponseWriter, r *http.Request, d Dialect) {
	ip := peerIP(r)
	if ok, wait := h.ipLim.Allow(ip.String()); !ok {
		h.limited(w, "", ip, "per-ip", wait)
		return
	}
	q := scriptQuery(r.URL.RawQuery)
	macParam := q.mac
	if macParam == "" {
		h.serveChain(w, d)
		return
	}
	parsed, err := macaddr.ParseUnicast(macParam)
	if err != nil {
		http.Error(w, "bad mac", http.StatusBadRequest)
		return
	}
	mac := parsed.HardwareAddr()
	// Built only when something is logged: With copies its attributes,
	// and this runs for every machine of a boot storm.
	log := func() *slog.Logger { return h.log.With("mac", mac.String(), "ip", ip.String()) }
	if ok, wait := h.macLim.Allow(mac.String()); !ok {
		h.limited(w, mac.String(), ip, "per-mac", wait)
		return
	}
	arch := q.arch
	if !safeArch(arch) {
		http.Error(w, "bad arch", http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	a, err := h.cfg.Lookup.Lookup(ctx, mac)
	switch {
	case errors.Is(err, boot.ErrNotFound) && h.cfg.AutoEnroll:
		a, err = h.cfg.Enroller.Discovered(ctx, boot.Discovery{MAC: mac, Source: "ipxe", Arch: -1, IP: ip})
		if err != nil {
			log().Error("auto-enrol", "err", err)
			http.Error(w, "enrol failed", http.StatusServiceUnavailable)
			return
		}
		h.event(Event{Kind: EventDiscovered, MAC: mac.String(), IP: ip, Reason: "ipxe"})
	case err == nil && a.SecureBoot && d == DialectIPXE:
		h.refuseSecureBootIPXE(w, log(), mac)
		return
	case errors.Is(err, boot.ErrNotFound):
		if h.log.Enabled(ctx, slog.LevelDebug) {
			log().Debug("unknown mac: exit")
		}
		writeScript(w, unknownScript(d, mac))
		return
	case err != nil:
		log().Error("lookup", "err", err)
		http.Error(w, "lookup failed", http.StatusServiceUnavailable)
		return
	}
	p := h.scriptParams(mac, a, q.platform, arch, d)
	if mode := modeFor(a.Lifecycle, a.Wipe, a.Installer); mode != "" {
		p.Token, err = h.token(ctx, mac, mode, h.ttlFor(mode))
		if err != nil {
			log().Error("issue token", "err", err)
			http.Error(w, "token unavailable", http.StatusServiceUnavailable)
			return
		}
	}
	b, err := renderDialect(d, p)
	if err != nil {
		log().Error("render", "err", err)
		http.Error(w, "script unavailable", http.StatusInternalServerError)
		return
	}
	if h.log.Enabled(ctx, slog.LevelDebug) {
		log().Debug("script served", "lifecycle", a.Lifecycle, "platform", p.Platform)
	}
	writeScript(w, b)
	h.scriptServed(a, ip)
}

// renderDialect renders p for the boot loader of dialect d.
func renderDialect(d Dialect, p ScriptParams) ([]byte, error) {
	if d == DialectGRUB {
		return RenderGRUB(p)
	}
	return render(p, true) // New checked the configured URLs and arguments
}

// scriptServed tells Config.OnScript of a ramdisk script served to a
// known server.
func (h *Handler) scriptServed(a boot.Assignment, peer netip.Addr) {
	if h.cfg.OnScript == nil || a.Name == "" || a.Installer != "" || modeFor(a.Lifecycle, a.Wipe, a.Installer) == "" {
		return
	}
	h.cfg.OnScript(a, peer)
}

// servedHandler tells on of each GET its next answered 200.
type servedHandler struct {
	next http.Handler
	on   func(path string, peer netip.Addr)
}

func (s servedHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sw := &httpstatus.Recorder{ResponseWriter: w}
	s.next.ServeHTTP(sw, r)
	if r.Method == http.MethodGet && sw.Code == http.StatusOK {
		s.on(r.URL.Path, peerIP(r))
	}
}

// token returns the script's token for mac and mode: the one Prepare
// minted when the controller netbooted the machine, if it is still live
// with at least half of ttl left (a read), else a new one (Issue: a
// write, revoking the server's previous token of that purpose).
func (h *Handler) token(ctx context.Context, mac net.HardwareAddr, mode string, ttl time.Duration) (string, error) {
	if pt, ok := h.cfg.Tokens.(boot.PreparedTokens); ok {
		tok, ok, err := pt.Take(ctx, mac, mode, ttl/2)
		if err != nil {
			return "", err
		}
		if ok {
			return tok, nil
		}
	}
	return h.cfg.Tokens.Issue(ctx, mac, mode, ttl)
}

// Prepare mints the token the boot script of mac's machine will carry,
// ahead of the script request, when Config.Tokens implements
// [boot.PreparedTokens]: the controller calls it right before it netboots
// the machine into the ramdisk (reconciler.Config.BeforeNetboot), so the
// script request of a boot storm reads instead of writing. It never
// revokes a token a machine may hold (see boot.PreparedTokens.Prepare).
// prepared is false when nothing was minted: the lifecycle boots the
// local disk, the server already has a live token, or Tokens cannot
// prepare. Errors: the lookup's and the store's.
func (h *Handler) Prepare(ctx context.Context, mac net.HardwareAddr) (prepared bool, err error) {
	pt, ok := h.cfg.Tokens.(boot.PreparedTokens)
	if !ok {
		return false, nil
	}
	a, err := h.cfg.Lookup.Lookup(ctx, mac)
	if err != nil {
		return false, err
	}
	mode := modeFor(a.Lifecycle, a.Wipe, a.Installer)
	if mode == "" {
		return false, nil
	}
	return pt.Prepare(ctx, mac, mode, h.ttlFor(mode))
}

// ttlFor is the lifetime of a token for mode: InstallTokenTTL for the
// installer's reusable token, TokenTTL otherwise.
func (h *Handler) ttlFor(mode string) time.Duration {
	if mode == PurposeInstall {
		return h.cfg.InstallTokenTTL
	}
	return h.cfg.TokenTTL
}

// serveChain answers the first hop (the DHCP filename, or autoexec.ipxe
// without the MAC): the chain script that comes back with ?mac=.
func (h *Handler) serveChain(w http.ResponseWriter, d Dialect) {
	var b []byte
	var err error
	if d == DialectGRUB {
		b, err = boot.GRUBChainConfig(h.cfg.ControllerURL + boot.GRUBScriptPath)
	} else {
		b, err = boot.ChainScript(h.cfg.ControllerURL + ScriptPath)
	}
	if err != nil {
		http.Error(w, "script unavailable", http.StatusInternalServerError)
		return
	}
	writeScript(w, b)
}

// unknownScript tells a machine no server has that it is not enrolled,
// and exits to the firmware's next boot option.
func unknownScript(d Dialect, mac net.HardwareAddr) []byte {
	if d == DialectGRUB {
		return fmt.Appendf(nil, "echo \"Machina: unknown machine %s, not enrolled\"\nexit\n", mac)
	}
	return fmt.Appendf(nil, "#!ipxe\necho Machina: unknown machine %s, not enrolled\nexit\n", mac)
}

// refuseSecureBootIPXE answers a Secure Boot server's iPXE request: `exit`, no
// token. The DHCP server never offers iPXE to such a server; an iPXE
// asking anyway runs where Secure Boot is off (the BMC did not apply the
// profile, or another DHCP server answered), and gets no ramdisk token
// for an unverified chain.
func (h *Handler) refuseSecureBootIPXE(w http.ResponseWriter, log *slog.Logger, mac net.HardwareAddr) {
	log.Warn("secure boot server asked for an iPXE script: refused")
	writeScript(w, fmt.Appendf(nil, "#!ipxe\necho Machina: %s boots with Secure Boot (shim and GRUB), not iPXE\nexit\n", mac))
}

// scriptParams are the boot script's parameters for mac's assignment a;
// arm64 has no BIOS: UEFI always, with its own ramdisk and console. GRUB
// runs on arm64 machines and, in the Secure Boot chain, on x86-64 UEFI
// ones (${grub_cpu} "x86_64"): those get the amd64 ramdisk and the same
// kernel arguments as iPXE's.
func (h *Handler) scriptParams(mac net.HardwareAddr, a boot.Assignment, reported, arch string, d Dialect) ScriptParams {
	p := ScriptParams{
		MAC: mac.String(), Name: a.Name, Lifecycle: a.Lifecycle, Wipe: a.Wipe, Installer: a.Installer, InstallerImage: a.InstallerImage, Platform: platform(reported, a.Mode),
		Controller: h.cfg.ControllerURL, KernelURL: h.cfg.KernelURL, InitrdURL: h.cfg.InitrdURL, KernelArgs: h.cfg.KernelArgs, Arch: arch,
	}
	if d == DialectGRUB && arch == "x86_64" {
		p.Platform = PlatformEFI
	} else if arch == "arm64" || d == DialectGRUB {
		p.Arch, p.Platform = "arm64", PlatformEFI
		p.KernelURL, p.InitrdURL, p.KernelArgs = h.cfg.ARM64KernelURL, h.cfg.ARM64InitrdURL, h.cfg.ARM64KernelArgs
	}
	if h.cfg.LLDPWait != 0 && modeFor(p.Lifecycle, p.Wipe, p.Installer) == PurposeCommission {
		p.KernelArgs += " machina.lldp_wait=" + max(h.cfg.LLDPWait, 0).String() // "0s" turns it off
	}
	return p
}

// platform prefers what iPXE reports (${platform}: the firmware actually
// running), then the inventory's boot mode, then BIOS.
func platform(reported string, m boot.Mode) Platform {
	switch {
	case reported == string(PlatformEFI):
		return PlatformEFI
	case reported == string(PlatformBIOS):
		return PlatformBIOS
	case m == boot.ModeUEFI:
		return PlatformEFI
	}
	return PlatformBIOS
}

// scriptParamsQuery holds the script request's query parameters.
type scriptParamsQuery struct{ mac, platform, arch string }

// scriptQuery reads mac, platform and arch from a raw query as
// url.ParseQuery followed by Get would (the first value of each; a pair
// with a semicolon or a bad escape is skipped), without building the map
// of every parameter: a script request of a boot storm allocated six
// times for it (BenchmarkScript). TestScriptQueryMatchesURL
// holds it to url.ParseQuery.
func scriptQuery(raw string) scriptParamsQuery {
	var q scriptParamsQuery
	var seen [3]bool // mac, platform, arch
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		if pair == "" || strings.Contains(pair, ";") {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		if strings.ContainsAny(k, "%+") {
			var err error
			if k, err = url.QueryUnescape(k); err != nil {
				continue
			}
		}
		i, dst := 0, &q.mac
		switch k {
		case "mac":
		case "platform":
			i, dst = 1, &q.platform
		case "arch":
			i, dst = 2, &q.arch
		default:
			continue
		}
		if seen[i] {
			continue // Get returns the first value
		}
		if strings.ContainsAny(v, "%+") {
			u, err := url.QueryUnescape(v)
			if err != nil {
				continue // url.ParseQuery skips the pair: the key stays unseen
			}
			v = u
		}
		*dst, seen[i] = v, true
	}
	return q
}

func writeScript(w http.ResponseWriter, b []byte) {
	// The header map is filled directly with shared, canonical values
	// (net/http only reads them): Header().Set allocates a slice per call,
	// three per script of a boot storm (BenchmarkScript).
	h := w.Header()
	h["Content-Type"] = scriptContentType
	h["Cache-Control"] = noStore
	h["Content-Length"] = []string{strconv.Itoa(len(b))}
	_, _ = w.Write(b)
}

var (
	scriptContentType = []string{"text/plain; charset=utf-8"}
	noStore           = []string{"no-store"}
)

func (h *Handler) limited(w http.ResponseWriter, mac string, ip netip.Addr, why string, wait time.Duration) {
	h.event(Event{Kind: EventRateLimited, MAC: mac, IP: ip, Reason: why})
	w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)+1))
	http.Error(w, "rate limited", http.StatusTooManyRequests)
}

func (h *Handler) event(e Event) {
	h.log.Debug("event", "kind", e.Kind, "mac", e.MAC, "ip", e.IP.String(), "reason", e.Reason)
	if h.cfg.OnEvent != nil {
		h.cfg.OnEvent(e)
	}
}

// Close releases the ISO, binary and ramdisk folders.
func (h *Handler) Close() error {
	var errs []error
	for _, r := range []*boot.Files{h.isos, h.bins, h.ramdisk} {
		if r != nil {
			errs = append(errs, r.Close())
		}
	}
	return errors.Join(errs...)
}

type tokenCtxKey struct{}

// Grant is what [Handler.RequireToken] proved about a request, available to
// the wrapped handler through [GrantFrom].
type Grant struct {
	MAC     net.HardwareAddr
	Purpose string
}

// GrantFrom returns the grant RequireToken attached to ctx.
func GrantFrom(ctx context.Context) (Grant, bool) {
	g, ok := ctx.Value(tokenCtxKey{}).(Grant)
	return g, ok
}

// RequireToken wraps next (a machine-facing ramdisk endpoint) so that it runs
// only for a request carrying a valid token for one of purposes: the MAC in
// the `mac` query parameter or X-Machina-MAC header, the token in
// "Authorization: Bearer TOKEN". The token is consumed (single use). A
// missing, unknown, expired or reused token gets 403 and an
// [EventTokenRejected]; a bad MAC gets 400. Requests are rate-limited like
// script requests.
func (h *Handler) RequireToken(next http.Handler, purposes ...string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ip := peerIP(r)
		if ok, wait := h.ipLim.Allow(ip.String()); !ok {
			h.limited(w, "", ip, "per-ip", wait)
			return
		}
		ms := r.URL.Query().Get("mac")
		if ms == "" {
			ms = r.Header.Get("X-Machina-MAC")
		}
		parsed, err := macaddr.ParseUnicast(ms)
		if err != nil {
			http.Error(w, "bad mac", http.StatusBadRequest)
			return
		}
		mac := parsed.HardwareAddr()
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || tok == "" {
			h.reject(w, mac, ip, errors.New("no bearer token"))
			return
		}
		var cerr error
		for _, p := range purposes {
			if cerr = h.cfg.Tokens.Consume(r.Context(), mac, p, tok); cerr == nil {
				next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tokenCtxKey{}, Grant{MAC: mac, Purpose: p})))
				return
			}
			if !errors.Is(cerr, boot.ErrTokenInvalid) {
				break // expired or used: no other purpose can match the same token
			}
		}
		if cerr == nil {
			cerr = errors.New("no purpose allowed")
		}
		h.reject(w, mac, ip, cerr)
	})
}

func (h *Handler) reject(w http.ResponseWriter, mac net.HardwareAddr, ip netip.Addr, err error) {
	reason := "token invalid"
	switch {
	case errors.Is(err, boot.ErrTokenExpired):
		reason = "token expired"
	case errors.Is(err, boot.ErrTokenUsed):
		reason = "token already used"
	case !errors.Is(err, boot.ErrTokenInvalid):
		reason = err.Error()
	}
	h.log.Warn("token rejected", "mac", mac.String(), "ip", ip.String(), "reason", reason)
	h.event(Event{Kind: EventTokenRejected, MAC: mac.String(), IP: ip, Reason: reason})
	http.Error(w, "forbidden", http.StatusForbidden)
}

func peerIP(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}
