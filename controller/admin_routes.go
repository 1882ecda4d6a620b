package controller

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/images"
	"github.com/machina-metal/machina/reconciler"
	"github.com/machina-metal/machina/state"
)

// adminRoutes is the one list of the admin routes the api server carries
// besides the join stage's (join.RegisterAdmin): the reconciler's and
// discovery's, the fence routes, images, firmware, the push webhook, the
// serial console and the web console. routes() mounts it for Run; the
// route tests (OpenAPI document, role table) mount the same list with nil
// dependencies, so a route added here is checked by both.
type adminRoutes struct {
	ctrl        *reconciler.Controller
	src         *gitops.Source
	scan        scanFunc
	propose     proposeFunc
	branch      string
	fencer      *fencer
	trigger     func()
	heartbeat   time.Duration
	imgStore    *images.Store
	imgStatus   *imageStatus
	importFails *importFailures
	// webhook, when non-nil, is served at WebhookPattern.
	webhook   http.Handler
	drivers   reconciler.Drivers
	gitDir    string
	gitHealth func() v1.GitHealth
	log       *slog.Logger
}

// mount adds every route of the list to srv, in order, and returns the
// web console's own routes (which srv lists as its prefix).
func (a adminRoutes) mount(srv *api.Server, st *state.Store) ([]string, error) {
	if err := mountAdmin(srv, st, a.ctrl, a.src, a.scan, a.propose, a.branch); err != nil {
		return nil, err
	}
	if err := mountHosts(srv, st, a.fencer, a.trigger, a.heartbeat); err != nil {
		return nil, err
	}
	if err := mountImages(srv, a.ctrl, a.imgStore, a.imgStatus, a.importFails); err != nil {
		return nil, err
	}
	if err := MountFirmwareRead(srv, st); err != nil {
		return nil, err
	}
	if a.webhook != nil {
		if err := srv.HandleOperator(WebhookPattern, a.webhook); err != nil {
			return nil, err
		}
	}
	log := a.log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return mountConsoleAndUI(srv, st, a.drivers, a.src, a.ctrl, a.imgStatus, a.gitDir, a.gitHealth, log)
}
