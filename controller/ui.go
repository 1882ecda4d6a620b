package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/console"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/reconciler"
	"github.com/machina-metal/machina/reconciler/fleet"
	"github.com/machina-metal/machina/state"
	"github.com/machina-metal/machina/ui"
)

// mountConsoleAndUI mounts the serial console WebSocket (one handler shared
// by machinactl and browsers, so one writer holds across both) and the web
// console under /ui/. log (non-nil) gets the console's attach/detach lines
// as component=console and the web console's logins, refusals and
// approvals as component=ui.
func mountConsoleAndUI(srv *api.Server, st *state.Store, drivers reconciler.Drivers, src *gitops.Source, ctrl *reconciler.Controller,
	imgs *imageStatus, gitDir string, gitHealth func() v1.GitHealth, log *slog.Logger) (uiRoutes []string, err error) {
	bearer := func(r *http.Request) (string, error) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || tok == "" {
			return "", ui.ErrNoSession
		}
		at, err := st.AuthenticateAdmin(tok)
		if err != nil {
			return "", err
		}
		// The console needs the role api.RouteRoles gives its pattern
		// (operator): a viewer's token is refused like a bad one.
		if need, _ := api.RouteRole(console.Pattern); !at.Role.Allows(need) {
			return "", fmt.Errorf("admin token %s has role %s; the serial console needs role %s: %w", at.Name, at.Role, need, state.ErrTokenUnknown)
		}
		return at.Name, nil
	}
	lookup := func(ctx context.Context, name string) (bmc.Driver, error) {
		s, err := st.Server(name)
		if errors.Is(err, state.ErrNotFound) {
			return nil, fmt.Errorf("%s: %w", name, console.ErrServerNotFound)
		}
		if err != nil {
			return nil, err
		}
		return drivers.Driver(ctx, s)
	}
	con, err := console.New(console.Config{Opener: console.DriverOpener(lookup), Authenticate: ui.ConsoleAuthenticate(bearer),
		Logger: log.With("component", "console"),
		Audit: func(_ context.Context, e console.Event) {
			_, _ = st.AppendEvent(state.Event{Server: e.Server, Kind: state.EventKind(e.Action), Actor: e.Principal,
				Message: fmt.Sprintf("%s from %s as %s %s", e.Action, e.Remote, e.Role, e.Reason)})
		}})
	if err != nil {
		return nil, err
	}
	if err := srv.HandleOperator(console.Pattern, con); err != nil {
		return nil, err
	}
	h, err := ui.New(ui.Config{Store: st, API: srv.Handler(), Console: con, ConsoleSupport: consoleSupport(lookup),
		RouteRole: func(p string) state.Role { r, _ := api.RouteRole(p); return r },
		BMC:       bmcInfo{st: st, drivers: drivers},
		Images:    uiImages{imgs}, Inventory: uiInventory{src: src, ctrl: ctrl, repoDir: filepath.Join(gitDir, "inventory.git"), git: gitHealth},
		Logger: log.With("component", "ui")})
	if err != nil {
		return nil, err
	}
	if r, ok := h.(interface{ Routes() []string }); ok {
		uiRoutes = r.Routes()
	}
	return uiRoutes, srv.HandleOperator(ui.Prefix, h)
}

// uiPrefix is where the web console is mounted.
const uiPrefix = ui.Prefix

// consoleSupport answers whether a server's driver offers a serial console:
// the check console.DriverOpener makes before opening one (bmc.Console), so
// the console page and the WebSocket agree.
type consoleSupport func(ctx context.Context, server string) (bmc.Driver, error)

func (c consoleSupport) ConsoleSupported(ctx context.Context, server string) error {
	d, err := c(ctx, server)
	if err != nil {
		return err
	}
	if _, ok := d.(bmc.Console); !ok {
		return fmt.Errorf("console: server %s: %w", server, bmc.ErrUnsupported)
	}
	return nil
}

// bmcInfo reads a server's BMC read model through its driver.
type bmcInfo struct {
	st      *state.Store
	drivers reconciler.Drivers
}

func (b bmcInfo) BMCInfo(ctx context.Context, server string) (*bmc.Info, error) {
	s, err := b.st.Server(server)
	if err != nil {
		return nil, err
	}
	d, err := b.drivers.Driver(ctx, s)
	if err != nil {
		return nil, err
	}
	at := time.Now()
	in, err := d.Info(ctx)
	if err != nil {
		return nil, err
	}
	// What an operator just read is the freshest observation there is.
	if _, err := b.st.ObserveBMC(server, at, fleet.StatePower(in.Power), in.Health); err != nil {
		return nil, err
	}
	return in, nil
}

type uiImages struct{ s *imageStatus }

func (u uiImages) ImageStatuses(context.Context) ([]ui.ImageStatus, error) {
	u.s.mu.Lock()
	defer u.s.mu.Unlock()
	var out []ui.ImageStatus
	for name, st := range u.s.m {
		is := ui.ImageStatus{Name: name, State: string(st.State), Percent: st.Percent, Reason: st.Reason, SizeBytes: st.SizeBytes}
		if st.Raw.Hex != "" {
			is.Digest = string(st.Raw.Algo) + ":" + st.Raw.Hex
		}
		out = append(out, is)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

type uiInventory struct {
	src  *gitops.Source
	ctrl *reconciler.Controller
	// repoDir is the Source's bare clone, read for commit subjects and times.
	repoDir string
	// git reports the Git side's health (wiring.gitHealth); nil: none shown.
	git func() v1.GitHealth
}

// describe fills rev's Message (the subject line) and At (committer time)
// from the controller's clone; a commit it cannot read leaves them empty
// (the page shows "—").
func (u uiInventory) describe(rev *ui.Revision) {
	if rev.Commit == "" {
		return
	}
	repo, err := git.PlainOpen(u.repoDir)
	if err != nil {
		return
	}
	c, err := repo.CommitObject(plumbing.NewHash(rev.Commit))
	if err != nil {
		return
	}
	rev.Message, _, _ = strings.Cut(strings.TrimSpace(c.Message), "\n")
	rev.At = c.Committer.When
}

func (u uiInventory) InventoryStatus(context.Context) (ui.InventoryStatus, error) {
	good, invalid := u.src.Latest()
	out := ui.InventoryStatus{Acting: ui.Revision{Commit: good.Commit, Digest: good.Digest}}
	u.describe(&out.Acting)
	out.Newest = out.Acting
	if invalid != nil {
		out.Newest = ui.Revision{Commit: invalid.Commit}
		u.describe(&out.Newest)
		for _, e := range invalid.Errors {
			out.Errors = append(out.Errors, ui.ValidationError{File: e.File, Line: e.Line, Column: e.Col, Path: e.Path, Message: e.Msg})
		}
	}
	plan := u.ctrl.LastPlan()
	for _, s := range plan.Held {
		out.Held = append(out.Held, ui.PlanStep{Server: s.Server, Action: string(s.Action), Profile: s.Profile, Why: s.Why})
	}
	out.Brake = plan.Brake
	for _, c := range plan.Conditions {
		out.Conditions = append(out.Conditions, ui.Condition{Subject: c.Subject, Type: c.Type, Reason: c.Reason, Message: c.Message})
	}
	if u.git != nil {
		out.Git = uiGitHealth(u.git())
	}
	return out, nil
}

// uiGitHealth is the API's Git health as the inventory page shows it.
func uiGitHealth(g v1.GitHealth) *ui.GitHealth {
	loop := func(h v1.GitLoopHealth) ui.GitLoop {
		l := ui.GitLoop{ConsecutiveFailures: h.ConsecutiveFailures, Failing: h.Failing, LastError: h.LastError}
		if h.LastSuccess != nil {
			l.LastSuccess = *h.LastSuccess
		}
		return l
	}
	return &ui.GitHealth{Poll: loop(g.Poll), Push: loop(g.Push), RemoteTip: g.RemoteTip, Behind: g.Behind,
		LastStatusCommit: g.LastStatusCommit, LastStatusPackBytes: int64(g.LastStatusPackBytes)}
}
