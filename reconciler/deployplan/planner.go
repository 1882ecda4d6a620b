// Package deployplan makes what the machine-facing API hands a machine to
// install it: the ramdisk's deploy plan (image URL and digest, disk rule,
// NoCloud seed with the first-boot join command), the wipe's disk hint, and
// an installer profile's document and extracted tree. It implements api's
// DeployPlanner, WipePlanner and InstallerSource over the desired inventory
// and the image store, and checks the ramdisk's image tokens against the
// allocation a served plan bound (images.TokenChecker).
package deployplan

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/deploy"
	"github.com/machina-metal/machina/deploy/netplan"
	"github.com/machina-metal/machina/images"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// JoinCommander renders the first-boot join command a deployed host's
// NoCloud seed runs (the join listener's URL, pinned CA fingerprint and
// script checksum) and issues a fresh enrolment token for srv. The
// command reads the token from v1.JoinTokenPath, which the seed or the
// installer document writes (0600) from token; token is "" when cmd
// carries what it needs itself.
type JoinCommander interface {
	JoinCommand(ctx context.Context, srv state.Server, p inventory.Profile) (cmd, token string, err error)
}

// Planner makes deploy plans from the desired inventory and the image
// store. It implements api.DeployPlanner, api.WipePlanner and
// api.InstallerSource. Desired, Images and BaseURL are required.
type Planner struct {
	// Desired returns the desired inventory (nil: no valid revision yet).
	Desired func() *inventory.Inventory
	// Images is the image store plans and installer trees come from.
	Images *images.Store
	// BaseURL is the controller's base URL as machines reach it.
	BaseURL string
	// Join renders the first-boot join command; nil leaves the seed's
	// v1.JoinPlaceholder in place.
	Join JoinCommander
	// Store, when set, records the image a served plan writes and when
	// (Allocation.Image, Allocation.PlanServedAt); nil in tests that only
	// render plans.
	Store *state.Store
	// Waves, when set, adds the image's piece manifest and the machine's
	// deploy wave to each plan (waves.go); nil plans whole-image fetches.
	Waves *Waves
	// Logger receives re-plan notices; nil discards.
	Logger *slog.Logger
	// Addresses assigns the addresses of pool-mode interfaces (IPAM);
	// nil: none are assigned, so a profile with a pool-mode interface
	// gets no deploy plan.
	Addresses AddressSource
}

// DeployPlan implements api.DeployPlanner.
func (p *Planner) DeployPlan(ctx context.Context, srv state.Server) (v1.Plan, error) {
	inv := p.Desired()
	if inv == nil {
		return v1.Plan{}, errors.New("no valid inventory revision")
	}
	if srv.Allocation == nil {
		return v1.Plan{}, fmt.Errorf("server %s has no allocation", srv.Name)
	}
	prof := inv.Profile(srv.Allocation.Profile)
	if prof == nil {
		return v1.Plan{}, fmt.Errorf("profile %q is not in the inventory any more", srv.Allocation.Profile)
	}
	if prof.Deploy != inventory.DeployImage {
		return v1.Plan{}, fmt.Errorf("profile %s deploys with %s: the installer path does not use an image plan", prof.Name, prof.Deploy)
	}
	// The image: the profile's current one while the write has not
	// started (a change after allocation re-plans with the new image);
	// once a plan was served, the one it named (a retried plan request
	// gets the same image; a newer profile image waits for a redeploy).
	image := prof.Image
	if !srv.Allocation.PlanServedAt.IsZero() && srv.Allocation.Image != "" {
		image = srv.Allocation.Image
	}
	if err := archRefusal(inv, image, srv); err != nil {
		return v1.Plan{}, err
	}
	rec, err := p.Images.Lookup(image)
	if err != nil {
		return v1.Plan{}, fmt.Errorf("image %s: %w", image, err)
	}
	if rec.State != images.StateVerified {
		return v1.Plan{}, fmt.Errorf("image %s is %s, not verified yet", image, rec.State)
	}
	if err := p.bindImage(srv, prof.Name, image); err != nil {
		return v1.Plan{}, err
	}
	plan := v1.Plan{
		ImageURL:       strings.TrimRight(p.BaseURL, "/") + "/images/" + image,
		ImageSHA256:    rec.Raw.Hex,
		ImageSizeBytes: rec.SizeBytes,
		Seed: v1.Seed{
			InstanceID:  fmt.Sprintf("%s-%d", srv.Name, srv.Allocation.At.Unix()),
			Hostname:    srv.Name,
			SSHKeys:     prof.SSHKeys,
			JoinCommand: v1.JoinPlaceholder,
		},
	}
	if plan.Seed.NetworkConfig, err = p.networkConfig(ctx, inv, prof, srv); err != nil {
		return v1.Plan{}, err
	}
	if err := cloudInitSeed(prof, &plan.Seed); err != nil {
		return v1.Plan{}, err
	}
	p.addPieces(ctx, srv, *prof, image, &plan)
	plan.RootDevice = rootDeviceHint(inv, prof, srv.Name)
	if plan.Storage, err = storagePlan(prof, srv.Hardware); err != nil {
		return v1.Plan{}, err
	}
	if p.Join != nil {
		cmd, tok, err := p.Join.JoinCommand(ctx, srv, *prof)
		if err != nil {
			return v1.Plan{}, fmt.Errorf("join command: %w", err)
		}
		plan.Seed.JoinCommand, plan.Seed.JoinToken = cmd, tok
	}
	return plan, nil
}

// archRefusal refuses image on srv when their architectures differ. The
// plan's arch guard keeps such a deploy from being planned; this refuses
// it at the last step too (an image changed under a deploying server): a
// foreign-architecture image would write and then not boot. The server's
// arch is the report's machine arch (the SMBIOS one under a 32-bit kernel
// of its family); a kernel and firmware that conflict refuse any image.
func archRefusal(inv *inventory.Inventory, image string, srv state.Server) error {
	if srv.Hardware.ArchConflict() {
		return fmt.Errorf("server %s: kernel reported arch %s, SMBIOS firmware states %s: refusing to write an image", srv.Name, srv.Hardware.Arch, srv.Hardware.SMBIOSArch)
	}
	if im := inv.Image(image); im != nil && srv.Hardware.MachineArch() != "" && im.Arch != srv.Hardware.MachineArch() {
		return fmt.Errorf("image %s is %s; server %s reported %s: refusing to write it", image, im.Arch, srv.Name, srv.Hardware.MachineArch())
	}
	return nil
}

// rootDeviceHint is the disk the image goes to: the server's rootDevice
// in servers.yaml, else the profile's disk rule, as for the installer
// documents: the smallest disk of at least min.diskGiB, the disk
// allocation counted when it found the server big enough (a smaller disk
// that merely holds the image is not it).
func rootDeviceHint(inv *inventory.Inventory, prof *inventory.Profile, name string) v1.RootDeviceHint {
	if ws := inv.Server(name); ws != nil && ws.RootDevice != nil {
		return v1.RootDeviceHint{Serial: ws.RootDevice.Serial, WWN: ws.RootDevice.WWN, ByPath: ws.RootDevice.ByPath, MinSizeBytes: ws.RootDevice.MinSizeGiB << 30}
	}
	return v1.RootDeviceHint{MinSizeBytes: prof.Min.DiskGiB << 30}
}

// cloudInitSeed puts profile prof's own cloud-config into seed. The
// inventory checked both parts against cloud-init's schema and Machina's
// reserved parts; the agent merges user-data after Machina's own and
// refuses those parts again.
func cloudInitSeed(prof *inventory.Profile, seed *v1.Seed) error {
	ci := prof.CloudInit
	if ci == nil {
		return nil
	}
	var err error
	if ci.UserData != nil {
		if seed.UserData, err = json.Marshal(ci.UserData); err != nil {
			return fmt.Errorf("profile %s cloudInit.userData: %w", prof.Name, err)
		}
	}
	if ci.VendorData != nil {
		if seed.VendorData, err = json.Marshal(ci.VendorData); err != nil {
			return fmt.Errorf("profile %s cloudInit.vendorData: %w", prof.Name, err)
		}
	}
	return nil
}

// AddressSource hands out the addresses of a server's pool-mode
// interfaces (the controller's IPAM): by interface name of the profile's
// layout, at most one per family, from the subnet's pools. An interface it
// returns none for makes the deploy plan fail (never a DHCP fallback).
type AddressSource interface {
	PoolAddresses(ctx context.Context, srv state.Server, p inventory.Profile) (map[string][]netip.Addr, error)
}

// Leases is the AddressSource of the controller's IPAM: the addresses
// the server's allocation took (state.Server.Addresses, written in the
// allocation move's transaction) for the profile's pool-mode interfaces.
// A lease taken for another profile does not count.
type Leases struct{}

// PoolAddresses implements AddressSource.
func (Leases) PoolAddresses(_ context.Context, srv state.Server, p inventory.Profile) (map[string][]netip.Addr, error) {
	out := map[string][]netip.Addr{}
	for _, l := range srv.Addresses {
		if l.Profile != p.Name {
			continue
		}
		a, err := netip.ParseAddr(l.Address)
		if err != nil {
			return nil, fmt.Errorf("lease of %s on %s: %w", l.Interface, l.Subnet, err)
		}
		out[l.Interface] = append(out[l.Interface], a)
	}
	return out, nil
}

// networkConfig is the seed's network-config: DHCP on the boot NIC for a
// profile without a network layout, else the layout rendered for srv's
// commissioned NICs and its fixed and pool addresses (deploy/netplan).
// A layout the server cannot carry (NICs missing, an address missing) is
// an error: no plan, rather than a half-configured host.
func (p *Planner) networkConfig(ctx context.Context, inv *inventory.Inventory, prof *inventory.Profile, srv state.Server) (string, error) {
	if prof.Network == nil {
		return fmt.Sprintf("version: 2\nethernets:\n  boot:\n    match:\n      macaddress: \"%s\"\n    dhcp4: true\n", srv.BootMAC), nil
	}
	var nics []inventory.NIC
	if srv.Hardware != nil {
		for _, n := range srv.Hardware.NICs {
			nics = append(nics, inventory.NIC{Name: n.Name, MAC: n.MAC, Driver: n.Driver, PCIAddress: n.PCIAddress, SpeedMbps: n.SpeedMbps})
		}
	}
	var assigned map[string][]netip.Addr
	if p.Addresses != nil {
		var err error
		if assigned, err = p.Addresses.PoolAddresses(ctx, srv, *prof); err != nil {
			return "", fmt.Errorf("pool addresses of %s: %w", srv.Name, err)
		}
	}
	b, err := netplan.ForServer(inv, prof, inv.Server(srv.Name), nics, assigned)
	if err != nil {
		return "", fmt.Errorf("network layout of profile %s on %s: %w", prof.Name, srv.Name, err)
	}
	return string(b), nil
}

// bindImage records on srv's allocation the image a served plan names
// and when it was first served (Allocation.Image, PlanServedAt), so the
// image token the API mints next is checked against it; a change from the
// allocation's image is logged and written as an event. Nothing without
// a Store.
func (p *Planner) bindImage(srv state.Server, profile, image string) error {
	if p.Store == nil {
		return nil
	}
	// Bind the allocation (and so the image token the API mints next,
	// checked against Allocation.Image) to the image this plan names.
	old := srv.Allocation.Image
	if _, err := p.Store.UpdateServer(srv.Name, func(s *state.Server) error {
		if s.Allocation == nil || s.Lifecycle != state.LifecycleDeploying {
			return fmt.Errorf("server %s is not deploying", srv.Name)
		}
		s.Allocation.Image = image
		if s.Allocation.PlanServedAt.IsZero() {
			s.Allocation.PlanServedAt = time.Now().UTC()
		}
		return nil
	}); err != nil {
		return fmt.Errorf("record the planned image: %w", err)
	}
	if old != image {
		msg := fmt.Sprintf("profile %s's image changed from %s to %s before the write started: deploying %s", profile, old, image, image)
		if p.Logger != nil {
			p.Logger.Info("deploy re-planned with the profile's new image", "machine", srv.Name, "profile", profile, "from", old, "to", image)
		}
		_, _ = p.Store.AppendEvent(state.Event{Server: srv.Name, Kind: "deploy.image_replanned", Message: msg})
	}
	return nil
}

// WipeHint implements api.WipePlanner: the inventory's root device hint
// of srv (the disk its deploy wrote), or the zero hint (every eligible
// disk) when it has none or the server left the inventory.
func (p *Planner) WipeHint(_ context.Context, srv state.Server) (v1.RootDeviceHint, error) {
	inv := p.Desired()
	if inv == nil {
		return v1.RootDeviceHint{}, nil
	}
	if ws := inv.Server(srv.Name); ws != nil && ws.RootDevice != nil {
		return v1.RootDeviceHint{Serial: ws.RootDevice.Serial, WWN: ws.RootDevice.WWN, ByPath: ws.RootDevice.ByPath, MinSizeBytes: ws.RootDevice.MinSizeGiB << 30}, nil
	}
	return v1.RootDeviceHint{}, nil
}

// InstallerKind maps an installer profile's deploy method (inventory
// DeployAutoinstall, DeployKickstart) to the image store's installer kind;
// false for any other method.
func InstallerKind(d string) (images.InstallerKind, bool) {
	switch d {
	case string(inventory.DeployAutoinstall):
		return images.InstallerAutoinstall, true
	case string(inventory.DeployKickstart):
		return images.InstallerKickstart, true
	}
	return "", false
}

// InstallerFiles implements api.InstallerSource: the extracted tree of the
// allocation's installer ISO (extracted now if the import did not yet)
// and the ISO blob's path.
func (p *Planner) InstallerFiles(ctx context.Context, srv state.Server) (string, string, error) {
	if srv.Allocation == nil {
		return "", "", fmt.Errorf("server %s has no allocation", srv.Name)
	}
	kind, ok := InstallerKind(srv.Allocation.Deploy)
	if !ok {
		return "", "", fmt.Errorf("server %s deploys with %q, not an installer", srv.Name, srv.Allocation.Deploy)
	}
	tree, err := p.Images.InstallerTree(ctx, srv.Allocation.Image, kind)
	if err != nil {
		return "", "", err
	}
	rec, err := p.Images.Lookup(srv.Allocation.Image)
	if err != nil {
		return "", "", err
	}
	iso, err := p.Images.BlobPath(rec.Raw)
	if err != nil {
		return "", "", err
	}
	return tree, iso, nil
}

// InstallerDocument implements api.InstallerSource: the autoinstall
// user-data or kickstart of srv's profile (hostname, SSH keys, the
// inventory's root device hint), with the real first-boot join command and
// the completion callback URL carrying callbackToken.
func (p *Planner) InstallerDocument(ctx context.Context, srv state.Server, callbackToken string) ([]byte, error) {
	inv := p.Desired()
	if inv == nil {
		return nil, errors.New("no valid inventory revision")
	}
	if srv.Allocation == nil {
		return nil, fmt.Errorf("server %s has no allocation", srv.Name)
	}
	prof := inv.Profile(srv.Allocation.Profile)
	if prof == nil {
		return nil, fmt.Errorf("profile %q is not in the inventory any more", srv.Allocation.Profile)
	}
	cfg := deploy.InstallerConfig{Hostname: srv.Name, SSHKeys: prof.SSHKeys,
		CompletionURL: strings.TrimRight(p.BaseURL, "/") + api.InstallDonePath + callbackToken}
	if ws := inv.Server(srv.Name); ws != nil && ws.RootDevice != nil {
		cfg.Disk = deploy.DiskChoice{Serial: ws.RootDevice.Serial, WWN: ws.RootDevice.WWN, ByPath: ws.RootDevice.ByPath, MinSizeBytes: ws.RootDevice.MinSizeGiB << 30}
	} else {
		cfg.Disk.MinSizeBytes = prof.Min.DiskGiB << 30
	}
	if p.Join != nil {
		cmd, tok, err := p.Join.JoinCommand(ctx, srv, *prof)
		if err != nil {
			return nil, fmt.Errorf("join command: %w", err)
		}
		cfg.JoinCommand, cfg.JoinToken = cmd, tok
	}
	switch prof.Deploy {
	case inventory.DeployAutoinstall:
		return deploy.RenderAutoinstall(cfg)
	case inventory.DeployKickstart:
		return deploy.RenderKickstart(cfg)
	}
	return nil, fmt.Errorf("profile %s deploys with %s, not an installer", prof.Name, prof.Deploy)
}

// ImageTokens checks the ramdisk's image tokens against the store: the
// reusable image token of a deploying server whose allocation uses image.
// An accepted GET is recorded as the server's LastHeard at most once a
// minute per server (a long image download is not silence, and costs no
// write per Range request).
type ImageTokens struct {
	st    *state.Store
	mu    sync.Mutex
	heard map[string]time.Time
}

// NewImageTokens returns the image-token checker over st.
func NewImageTokens(st *state.Store) *ImageTokens {
	return &ImageTokens{st: st, heard: map[string]time.Time{}}
}

func (t *ImageTokens) noteHeard(server string) {
	now := time.Now()
	t.mu.Lock()
	if now.Sub(t.heard[server]) < time.Minute {
		t.mu.Unlock()
		return
	}
	if len(t.heard) > 100000 {
		clear(t.heard)
	}
	t.heard[server] = now
	t.mu.Unlock()
	_, _ = t.st.UpdateServer(server, func(s *state.Server) error {
		s.LastHeard, s.LastHeardAt = "image download", now.UTC()
		return nil
	})
}

// CheckImageToken implements images.TokenChecker.
func (t *ImageTokens) CheckImageToken(_ context.Context, token, image string) error {
	tok, err := t.st.CheckToken(token, state.TokenClaim{Purpose: state.PurposeImage})
	if err != nil {
		return fmt.Errorf("%w: %v", images.ErrTokenRejected, err)
	}
	srv, err := t.st.Server(tok.Server)
	if err != nil {
		return fmt.Errorf("%w: server %s: %v", images.ErrTokenRejected, tok.Server, err)
	}
	switch {
	case srv.Allocation == nil:
		return fmt.Errorf("%w: server %s has no allocation (%s)", images.ErrTokenRejected, srv.Name, srv.Lifecycle)
	case srv.Allocation.Image != image:
		return fmt.Errorf("%w: server %s's deploy plan names image %s, not %s", images.ErrTokenRejected, srv.Name, srv.Allocation.Image, image)
	}
	t.noteHeard(srv.Name)
	return nil
}
