package controller

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/boot/dhcp"
	"github.com/machina-metal/machina/boot/ipxe"
	"github.com/machina-metal/machina/boot/tftp"
)

// NetbootConfig turns on the network boot servers of the provisioning
// segment: DHCP (full or proxyDHCP), TFTP with the iPXE binaries, and the
// IPv6 router advertisement that ends iPXE's IPv6 wait. Zero value: none
// run (the simulated lab, or a site whose DHCP and TFTP are elsewhere).
type NetbootConfig struct {
	// Interfaces are the provisioning interfaces; empty disables DHCP.
	Interfaces []string
	// Mode is dhcp.ModeFull (our addresses) or dhcp.ModeProxy (PXE
	// options only, beside the site's DHCP server); zero means full.
	Mode dhcp.Mode
	// Subnet, PoolStart, PoolEnd, Router and DNS are the full-mode pool.
	Subnet             netip.Prefix
	PoolStart, PoolEnd netip.Addr
	Router             netip.Addr
	DNS                []netip.Addr
	// ServerIP is our address on the segment; zero: the first IPv4 address
	// of Interfaces[0].
	ServerIP netip.Addr
	// TFTPRoot holds undionly.kpxe and snponly.efi (Debian's ipxe package:
	// /usr/lib/ipxe); empty disables TFTP.
	TFTPRoot string
	// TFTPAddr is the TFTP listen address. Zero: port 69 on the
	// provisioning address, the one the DHCP server answers as (ServerIP,
	// else the first IPv4 address of Interfaces[0]), so TFTP is not served
	// on the management or any other network; ":69" (every interface, with
	// a warning) only when neither is configured.
	TFTPAddr string
	// GRUBARM64 is the arm64 GRUB network image (scripts/build-grub-arm64.sh:
	// out/boot/grubnetaa64.efi), read at start and served by TFTP as
	// grubnetaa64.efi to DHCP arch 11 clients, with the generated
	// machina-grub.cfg that chains to /boot/grub; empty: arm64 machines
	// get what the TFTP root holds under that name, if anything.
	GRUBARM64 string
	// ShimX64 and GRUBX64 are the signed shim and GRUB network image of
	// the Secure Boot chain (boot/secureboot.go; Debian's shim-signed and
	// grub-efi-amd64-signed: boot.DefaultShimPath and
	// boot.DefaultGRUBX64Path), read at start, checked to be signed x86-64
	// images, and served by TFTP as shimx64.efi and grubx64.efi; the DHCP
	// server answers a Secure Boot server's x64 UEFI PXE client with
	// shimx64.efi. Empty: Secure Boot servers get no boot file.
	ShimX64, GRUBX64 string
	// RouterAdvert sends the IPv6 RA with router lifetime 0 on Interfaces.
	RouterAdvert bool
}

// startNetboot builds the DHCP, TFTP and RA servers; run starts them.
//
// stored, when non-nil, keeps the leases the DHCP server hands out (full
// mode) in the state file: the machine endpoints and the join listener
// check requests against them, across restarts.
//
// sb is the TFTP side of the Secure Boot chain: the per-machine GRUB
// scripts and the ramdisk folder whose vmlinuz and initrd.cpio.gz TFTP
// serves to the signed GRUB (used when cfg.ShimX64 is set).
func startNetboot(cfg NetbootConfig, lookup boot.Lookup, publicURL string, autoEnroll bool, enr boot.Enroller, stored *api.StateLeases, sb secureBootTFTP, log *slog.Logger) ([]func(context.Context) error, error) {
	var runs []func(context.Context) error
	var leases dhcp.LeaseStore // nil (in memory) in proxy mode, where no address is leased
	if stored != nil {
		leases = stored
	}
	script := publicURL + ipxe.ScriptPath
	provisioning := cfg.ServerIP // the address the DHCP server answers as
	if len(cfg.Interfaces) > 0 {
		d, err := dhcp.New(dhcp.Config{Mode: cfg.Mode, Interfaces: cfg.Interfaces, ServerIP: cfg.ServerIP, Subnet: cfg.Subnet,
			PoolStart: cfg.PoolStart, PoolEnd: cfg.PoolEnd, Router: cfg.Router, DNS: cfg.DNS,
			Boot: dhcp.BootFiles{ScriptURL: script}, Lookup: lookup, AutoEnroll: autoEnroll, Enroller: enr, Leases: leases, Logger: log.With("component", "dhcp")})
		if err != nil {
			return nil, fmt.Errorf("dhcp: %w", err)
		}
		if err := d.Listen(context.Background()); err != nil {
			return nil, fmt.Errorf("dhcp: %w", err)
		}
		runs = append(runs, d.Serve)
		provisioning = d.ServerIP()
		if cfg.RouterAdvert {
			ra, err := dhcp.NewAdvertiser(dhcp.RAConfig{Interfaces: cfg.Interfaces, Logger: log.With("component", "ra")})
			if err != nil {
				return nil, fmt.Errorf("router advertisement: %w", err)
			}
			if err := ra.Listen(); err != nil {
				return nil, fmt.Errorf("router advertisement: %w", err)
			}
			runs = append(runs, ra.Serve)
		}
	}
	if cfg.TFTPRoot != "" {
		tc := tftp.Config{Root: cfg.TFTPRoot, Addr: tftpAddr(cfg.TFTPAddr, provisioning, log), ScriptURL: script, Logger: log.With("component", "tftp")}
		if strings.HasPrefix(publicURL, "http://") {
			tc.GRUBScriptURL = publicURL + boot.GRUBScriptPath
		} else {
			log.Warn("arm64 GRUB network boot needs an http public URL (GRUB has no TLS); machina-grub.cfg not served", "url", publicURL)
		}
		tc.Files = map[string][]byte{}
		if cfg.GRUBARM64 != "" {
			img, err := os.ReadFile(cfg.GRUBARM64)
			if err != nil {
				return nil, fmt.Errorf("tftp: arm64 GRUB image: %w", err)
			}
			tc.Files[boot.GRUBImageARM64] = img
		}
		if cfg.ShimX64 != "" || cfg.GRUBX64 != "" {
			if err := secureBootFiles(cfg, sb, &tc, log); err != nil {
				return nil, err
			}
		}
		t, err := tftp.New(tc)
		if err != nil {
			return nil, fmt.Errorf("tftp: %w", err)
		}
		if err := t.Listen(); err != nil {
			return nil, fmt.Errorf("tftp: %w", err)
		}
		runs = append(runs, t.Serve)
	}
	return runs, nil
}

// secureBootTFTP is what TFTP serves the Secure Boot chain's GRUB besides
// the images: its per-machine scripts (ipxe.Handler.TFTPScript) and the
// ramdisk folder.
type secureBootTFTP struct {
	script     func(ctx context.Context, mac string, peer netip.Addr) ([]byte, error)
	ramdiskDir string
	// fetches, when set, notes the kernel and initrd each machine fetched
	// (BootStalled); nil notes nothing.
	fetches *bootFetches
}

// tftpAddr is the TFTP listen address: addr when set, else port 69 on the
// provisioning address, else every interface (logged at Warn: TFTP then
// answers on the management network too).
func tftpAddr(addr string, provisioning netip.Addr, log *slog.Logger) string {
	switch {
	case addr != "":
		return addr
	case provisioning.IsValid():
		return netip.AddrPortFrom(provisioning, 69).String()
	}
	log.Warn("tftp: no provisioning interface or server address configured (--dhcp-interface): listening on every interface")
	return ":69"
}

// warnUnsignedKernel logs, at Warn, a Secure Boot chain kernel that
// carries no Authenticode signature: shim refuses it (GRUB: "bad shim
// signature"), and every Secure Boot server then stops in GRUB and shows
// BootStalled. It is not refused at start as an unsigned shim or GRUB is:
// the same ramdisk folder boots the servers without Secure Boot over iPXE,
// which an unsigned kernel serves well. A signed kernel may still be
// refused, when shim does not trust its signer; only the machine can tell.
func warnUnsignedKernel(img []byte, path string, log *slog.Logger) {
	if err := boot.CheckSignedX64(img); err != nil {
		log.Warn("tftp: the Secure Boot chain's kernel is not signed: Secure Boot servers will refuse it and show BootStalled", "kernel", path, "err", err)
	}
}

// secureBootFiles adds the Secure Boot chain to tc: the signed shim and
// GRUB (checked), the per-machine GRUB scripts, the ramdisk's kernel and
// initrd by their TFTP names, and the fetch notes (sb.fetches).
func secureBootFiles(cfg NetbootConfig, sb secureBootTFTP, tc *tftp.Config, log *slog.Logger) error {
	imgs, err := boot.LoadSecureBootImages(cfg.ShimX64, cfg.GRUBX64)
	if err != nil {
		return fmt.Errorf("tftp: %w", err)
	}
	tc.Files[boot.ShimImageX64], tc.Files[boot.GRUBImageX64] = imgs.Shim, imgs.GRUB
	if sb.script == nil || sb.ramdiskDir == "" {
		return fmt.Errorf("tftp: the Secure Boot chain needs the ramdisk folder (--ramdisk-dir)")
	}
	tc.Script = sb.script
	if sb.fetches != nil {
		tc.OnServed = sb.fetches.tftpServed
	}
	for name, file := range map[string]string{boot.TFTPRamdiskKernel: "vmlinuz", boot.TFTPRamdiskInitrd: "initrd.cpio.gz"} {
		b, err := os.ReadFile(filepath.Join(sb.ramdiskDir, file))
		if err != nil {
			return fmt.Errorf("tftp: secure boot ramdisk: %w", err)
		}
		if name == boot.TFTPRamdiskKernel {
			warnUnsignedKernel(b, filepath.Join(sb.ramdiskDir, file), log)
		}
		tc.Files[name] = b
	}
	return nil
}
