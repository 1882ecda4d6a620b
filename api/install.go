package api

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/boot/ipxe"
	"github.com/machina-metal/machina/state"
)

// InstallerSource backs the installer path of a deploying server whose
// profile deploys with the distribution installer (Allocation.Deploy
// "autoinstall" or "kickstart").
type InstallerSource interface {
	// InstallerFiles returns the directory holding the files extracted
	// from srv's installer ISO (kernel, initrd; RHEL: the whole tree) and
	// the ISO's own path. An error answers 503.
	InstallerFiles(ctx context.Context, srv state.Server) (tree, iso string, err error)
	// InstallerDocument renders srv's installer document (autoinstall
	// user-data, or the kickstart) with the real first-boot join command
	// and a completion callback carrying callbackToken (see
	// InstallDonePath). An error answers 503.
	InstallerDocument(ctx context.Context, srv state.Server, callbackToken string) ([]byte, error)
}

// InstallDonePath is the completion callback's path prefix: the installer
// POSTs to InstallDonePath + TOKEN (single-use, purpose "installed") as its
// last step; the server moves deploying → deployed.
const InstallDonePath = "/install/done/"

// mountInstaller registers the installer routes (see ipxe.InstallPrefix).
// The documents and the callback are rate-limited per IP like the other
// machine endpoints; the tree and the ISO are not, like /images/: anaconda
// fetches every package of the installation from the tree (inst.repo), and
// a 429 there would fail the install. Every route checks its token first.
func (m *Machine) mountInstaller(srv *Server) error {
	for pattern, h := range map[string]http.HandlerFunc{
		"GET " + ipxe.InstallPrefix + "{token}/tree/{path...}": m.installTree,
		"GET " + ipxe.InstallPrefix + "{token}/iso/{name}":     m.installISO,
		"GET " + ipxe.InstallPrefix + "{token}/nocloud/{doc}":  m.limited(m.installNoCloud),
		"GET " + ipxe.InstallPrefix + "{token}/ks.cfg":         m.limited(m.installKickstart),
		"POST " + InstallDonePath + "{token}":                  m.limited(m.installDone),
	} {
		if err := srv.HandlePublic(pattern, h); err != nil {
			return err
		}
	}
	return nil
}

// installServer checks the install token in the path (reusable, not
// consumed) and that its server is deploying with an installer; it answers
// the refusal itself and returns false.
func (m *Machine) installServer(w http.ResponseWriter, r *http.Request, kinds ...string) (state.Server, bool) {
	t, err := m.cfg.Store.CheckToken(r.PathValue("token"), state.TokenClaim{Purpose: state.PurposeInstall})
	if err != nil {
		m.refuse(w, r, err)
		return state.Server{}, false
	}
	srv, err := m.cfg.Store.Server(t.Server)
	if m.readFailed(w, r, err) {
		return state.Server{}, false
	}
	if err != nil || srv.Lifecycle != state.LifecycleDeploying || srv.Allocation == nil {
		writeError(w, http.StatusConflict, v1.Error{Message: "server is not deploying", Code: "conflict", Lifecycle: string(srv.Lifecycle)})
		return state.Server{}, false
	}
	ok := false
	for _, k := range kinds {
		ok = ok || srv.Allocation.Deploy == k
	}
	if !ok {
		http.NotFound(w, r) // not this installer's document
		return state.Server{}, false
	}
	if m.cfg.Installer == nil {
		writeError(w, http.StatusServiceUnavailable, v1.Error{Message: "no installer source configured", Code: "unavailable"})
		return state.Server{}, false
	}
	return srv, true
}

// unavailable answers 503 for an installer file or document the controller
// cannot serve. The event is paced like a refusal (the first at once, then
// one summary per interval) and logged once per interval at Error: an
// installer retrying, or a holder of the reusable install token in a loop,
// costs no event or log line per request (each document fetch still
// writes its fresh completion token).
func (m *Machine) unavailable(w http.ResponseWriter, srv state.Server, what string, err error) {
	if m.cfg.Store.RecordRefusal(srv.Name, "install.unavailable", state.RefusalUnavailable, what+": "+err.Error()) {
		m.log.Error("installer "+what, "machine", srv.Name, "err", err)
	} else {
		m.log.Debug("installer "+what, "machine", srv.Name, "err", err)
	}
	writeError(w, http.StatusServiceUnavailable, v1.Error{Message: what + " unavailable", Code: "unavailable"})
}

// installTree serves one file of the extracted installer tree (kernel and
// initrd; for kickstart also anaconda's stage2 and repository), read through
// an os.Root so no path or symlink leaves the tree, with Range support
// (boot.ServeFile, after the token check).
func (m *Machine) installTree(w http.ResponseWriter, r *http.Request) {
	srv, ok := m.installServer(w, r, ipxe.InstallerAutoinstall, ipxe.InstallerKickstart)
	if !ok {
		return
	}
	tree, _, err := m.cfg.Installer.InstallerFiles(r.Context(), srv)
	if err != nil {
		m.unavailable(w, srv, "installer files", err)
		return
	}
	root, err := os.OpenRoot(tree)
	if err != nil {
		m.unavailable(w, srv, "installer files", err)
		return
	}
	defer root.Close()
	boot.ServeFile(w, r, root, r.PathValue("path"), boot.FileOptions{Hidden: true, NoStore: true})
}

// installISO serves the installer ISO itself (Ubuntu casper's url=), under
// the image's own name only.
func (m *Machine) installISO(w http.ResponseWriter, r *http.Request) {
	srv, ok := m.installServer(w, r, ipxe.InstallerAutoinstall, ipxe.InstallerKickstart)
	if !ok {
		return
	}
	if r.PathValue("name") != srv.Allocation.Image+".iso" {
		http.NotFound(w, r)
		return
	}
	_, iso, err := m.cfg.Installer.InstallerFiles(r.Context(), srv)
	if err != nil {
		m.unavailable(w, srv, "installer ISO", err)
		return
	}
	root, err := os.OpenRoot(path.Dir(iso))
	if err != nil {
		m.unavailable(w, srv, "installer ISO", err)
		return
	}
	defer root.Close()
	boot.ServeFile(w, r, root, path.Base(iso), boot.FileOptions{Hidden: true, NoStore: true, Flat: true})
}

// installNoCloud serves cloud-init's NoCloud seed over HTTP to Ubuntu's
// installer (ds=nocloud-net;s=.../nocloud/): meta-data (instance-id and
// hostname), user-data (the autoinstall document with a fresh single-use
// completion token) and an empty vendor-data.
func (m *Machine) installNoCloud(w http.ResponseWriter, r *http.Request) {
	srv, ok := m.installServer(w, r, ipxe.InstallerAutoinstall)
	if !ok {
		return
	}
	var body []byte
	switch r.PathValue("doc") {
	case "meta-data":
		body = fmt.Appendf(nil, "instance-id: %s-%d\nlocal-hostname: %s\n", srv.Name, srv.Allocation.At.Unix(), srv.Name)
	case "vendor-data":
		body = []byte("#cloud-config\n{}\n")
	case "user-data":
		doc, err := m.installDocument(r.Context(), srv)
		if err != nil {
			m.unavailable(w, srv, "autoinstall user-data", err)
			return
		}
		body = doc
	default:
		http.NotFound(w, r)
		return
	}
	writeDoc(w, body)
}

// installKickstart serves the kickstart with a fresh single-use completion token.
func (m *Machine) installKickstart(w http.ResponseWriter, r *http.Request) {
	srv, ok := m.installServer(w, r, ipxe.InstallerKickstart)
	if !ok {
		return
	}
	doc, err := m.installDocument(r.Context(), srv)
	if err != nil {
		m.unavailable(w, srv, "kickstart", err)
		return
	}
	writeDoc(w, doc)
}

func (m *Machine) installDocument(ctx context.Context, srv state.Server) ([]byte, error) {
	cb, _, err := m.cfg.Store.IssueToken(state.TokenSpec{Purpose: state.PurposeInstalled, Server: srv.Name, MAC: srv.BootMAC, TTL: m.cfg.ImageTokenTTL})
	if err != nil {
		return nil, err
	}
	doc, err := m.cfg.Installer.InstallerDocument(ctx, srv, cb)
	if err != nil {
		return nil, err
	}
	m.log.Info("installer document served", "machine", srv.Name, "installer", srv.Allocation.Deploy)
	return doc, nil
}

func writeDoc(w http.ResponseWriter, b []byte) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

// installDone is the installer's completion callback: the single-use
// token moves the server deploying → deployed with FinishDeploy set, so
// the executor sets the boot override to disk (read back), as after an
// image deploy.
func (m *Machine) installDone(w http.ResponseWriter, r *http.Request) {
	m.use(w, r, r.PathValue("token"), state.PurposeInstalled, nil, false, func(tx *state.Tx, t state.Token) (state.Answer, error) {
		if err := deployOutcomeTx(tx, t.Server, true, "installer finished (completion callback)", false); err != nil {
			return state.Answer{}, err
		}
		return state.Answer{Status: http.StatusNoContent}, nil
	})
}
