package ipxe

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/macaddr"
)

// TFTPScript returns the GRUB script of the machine whose boot NIC is mac
// (GRUB's ${net_default_mac}: colon form) for the Secure Boot chain's
// GRUB, which fetches it by TFTP (boot/secureboot.go; the TFTP server's
// Config.Script). It is the script GET /boot/grub gives an x86_64 GRUB —
// the same lookup, limits, token and kernel arguments — except that the
// kernel and initrd are read by TFTP ([boot.TFTPRamdiskKernel],
// [boot.TFTPRamdiskInitrd]): that GRUB has no http. peer is the TFTP
// client's address, for the per-IP limit. An unknown MAC gets the
// `exit` script (auto-enrolment happens on the DHCP side). Errors: a
// malformed MAC, a limit, the lookup's, the token's.
func (h *Handler) TFTPScript(ctx context.Context, mac string, peer netip.Addr) ([]byte, error) {
	if ok, _ := h.ipLim.Allow(peer.String()); !ok {
		h.event(Event{Kind: EventRateLimited, IP: peer, Reason: "per-ip"})
		return nil, errors.New("tftp script: rate limited (per ip)")
	}
	parsed, err := macaddr.ParseUnicast(mac)
	if err != nil {
		return nil, fmt.Errorf("tftp script: %w", err)
	}
	hw := parsed.HardwareAddr()
	if ok, _ := h.macLim.Allow(hw.String()); !ok {
		h.event(Event{Kind: EventRateLimited, MAC: hw.String(), IP: peer, Reason: "per-mac"})
		return nil, errors.New("tftp script: rate limited (per mac)")
	}
	a, err := h.cfg.Lookup.Lookup(ctx, hw)
	switch {
	case errors.Is(err, boot.ErrNotFound):
		return unknownScript(DialectGRUB, hw), nil
	case err != nil:
		return nil, fmt.Errorf("tftp script: %w", err)
	}
	p := h.scriptParams(hw, a, string(PlatformEFI), "x86_64", DialectGRUB)
	p.KernelPath, p.InitrdPath = "/"+boot.TFTPRamdiskKernel, "/"+boot.TFTPRamdiskInitrd
	if mode := modeFor(a.Lifecycle, a.Wipe, a.Installer); mode != "" && mode != PurposeInstall {
		if p.Token, err = h.token(ctx, hw, mode, h.ttlFor(mode)); err != nil {
			return nil, fmt.Errorf("tftp script: token: %w", err)
		}
	}
	b, err := RenderGRUB(p)
	if err != nil {
		return nil, fmt.Errorf("tftp script: %w", err)
	}
	h.log.Debug("tftp grub script served", "mac", hw.String(), "ip", peer.String(), "lifecycle", a.Lifecycle)
	h.scriptServed(a, peer)
	return b, nil
}
