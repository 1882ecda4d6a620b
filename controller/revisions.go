package controller

import (
	"context"
	"log/slog"
	"time"

	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/images"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler"
	"github.com/machina-metal/machina/reconciler/deployplan"
	"github.com/machina-metal/machina/state"
)

// follow hands every new good revision to the reconciler
// (reconciler.Follow: while the newest revision is invalid nothing new is
// acted on) and imports its images.
func follow(ctx context.Context, src *gitops.Source, ctrl *reconciler.Controller, importer *images.Importer, store *images.Store,
	fails *importFailures, mirrors images.Mirrors, log *slog.Logger) {
	stopImports := func() {}
	defer func() { stopImports() }()
	ctrl.Follow(ctx, src, func(inv *inventory.Inventory) {
		reqs := imageRequests(inv, mirrors)
		// A new revision starts a new import round; the previous one's
		// retries stop (its failures are re-recorded by this round).
		stopImports()
		ictx, cancel := context.WithCancel(ctx)
		stopImports = cancel
		go importWithRetry(ictx, importer.ImportAll, reqs, fails, importRetryMin, importRetryMax, func() {
			// Installer ISOs: extract the kernel and initrd (RHEL: the
			// tree) now, so the first deploy does not wait for it.
			for _, p := range inv.Profiles {
				if kind, ok := deployplan.InstallerKind(string(p.Deploy)); ok {
					if _, err := store.InstallerTree(ictx, p.Image, kind); err != nil {
						log.Warn("installer image", "image", p.Image, "profile", p.Name, "err", err)
					}
				}
			}
			ctrl.Trigger()
		}, log)
	})
}

// imageRequests turns images.yaml entries (OS images and the firmware
// catalog) into import requests.
func imageRequests(inv *inventory.Inventory, mirrors images.Mirrors) []images.Request {
	var out []images.Request
	installer := map[string]bool{}
	for _, p := range inv.Profiles {
		if _, ok := deployplan.InstallerKind(string(p.Deploy)); ok {
			installer[p.Image] = true
		}
	}
	for _, im := range inv.Images {
		r := images.Request{Name: im.Name, Catalog: im.Catalog, Arch: im.Arch, URL: im.URL, Checksum: im.Checksum, ChecksumURL: im.ChecksumURL, Mirrors: mirrors,
			Installer: installer[im.Name]}
		if im.Mirror != "" {
			r.Mirrors.Base = im.Mirror
		}
		out = append(out, r)
	}
	// The firmware catalog: stored as downloaded, size and sha256
	// checked (served to BMCs, see firmwareOffers).
	for _, fi := range inv.FirmwareImages {
		out = append(out, images.Request{Name: fi.Name, URL: fi.URL, Checksum: fi.Checksum, SizeBytes: fi.SizeBytes, Firmware: true})
	}
	return out
}

// prune removes expired tokens and old events every interval until ctx is done.
func prune(ctx context.Context, st *state.Store, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := st.Prune(); err != nil {
				log.Error("prune state", "err", err)
			}
		}
	}
}
