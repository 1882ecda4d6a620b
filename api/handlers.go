package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

// maxReason bounds TransitionRequest.Reason in bytes.
const maxReason = 1024

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	if _, err := s.store.LastEventSeq(); err != nil {
		writeError(w, http.StatusServiceUnavailable, v1.Error{Message: "state store unavailable", Code: v1.CodeUnavailable})
		return
	}
	writeJSON(w, http.StatusOK, v1.Health{Status: "ok"})
}

func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	counts, err := s.store.CountServers()
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	sec, err := s.store.SecretsStatus()
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	seq, err := s.store.LastEventSeq()
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	out := v1.Status{Servers: map[string]int{}, LastEventSeq: seq,
		Secrets: v1.SecretsStatus{Sealing: sec.Sealing, Sealed: sec.Sealed, Unsealed: sec.Unsealed}}
	for _, l := range state.Lifecycles() {
		out.Servers[string(l)] = counts[l]
	}
	if s.cfg.Git != nil {
		g := s.cfg.Git()
		out.Git = &g
	}
	writeJSON(w, http.StatusOK, out)
}

// parseLimit reads ?limit= (1..state.MaxPageSize; absent means def).
func parseLimit(r *http.Request, def int) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > state.MaxPageSize {
		return 0, fmt.Errorf("limit must be an integer from 1 to %d", state.MaxPageSize)
	}
	return n, nil
}

func parseAfterSeq(v string) (uint64, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("after must be an event sequence number")
	}
	return n, nil
}

// handleListServers answers GET /api/v1/servers?zone=&lifecycle=&after=&limit=.
func (s *Server) handleListServers(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	opts := state.ListOptions{Zone: q.Get("zone"), After: q.Get("after")}
	if l := q.Get("lifecycle"); l != "" {
		lc, err := state.ParseLifecycle(l)
		if err != nil {
			badRequest(w, "unknown lifecycle (want new, commissioning, ready, allocated, deploying, deployed, failed or retired)")
			return
		}
		opts.Lifecycle = lc
	}
	limit, err := parseLimit(r, 100)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	opts.Limit = limit
	page, err := s.store.ListServers(opts)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	// Assembled from per-server cached JSON; the bytes equal
	// json.Marshal(v1.ServerList{...}) plus a newline.
	var buf bytes.Buffer
	buf.Grow(len(page.Servers) * 512)
	buf.WriteString(`{"servers":[`)
	for i, srv := range page.Servers {
		data, err := s.encoded.get(srv)
		if err != nil {
			s.internal(w, r, err)
			return
		}
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.Write(data)
	}
	buf.WriteByte(']')
	if page.Next != "" {
		next, _ := json.Marshal(page.Next)
		buf.WriteString(`,"next":`)
		buf.Write(next)
	}
	buf.WriteString("}\n")
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(buf.Bytes()) // the client went away; nothing to do
}

func (s *Server) handleGetServer(w http.ResponseWriter, r *http.Request) {
	srv, err := s.store.Server(r.PathValue("name"))
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toServer(srv))
}

func (s *Server) handleServerEvents(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if _, err := s.store.Server(name); err != nil {
		s.storeError(w, r, err)
		return
	}
	s.listEvents(w, r, name)
}

func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) { s.listEvents(w, r, "") }

func (s *Server) listEvents(w http.ResponseWriter, r *http.Request, server string) {
	after, err := parseAfterSeq(r.URL.Query().Get("after"))
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	limit, err := parseLimit(r, 100)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	evs, err := s.store.Events(state.EventQuery{Server: server, After: after, Limit: limit})
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toEventList(evs, limit))
}

// handleTransition answers POST /api/v1/servers/{name}/transitions: 200
// with the server after the move; 409 with the current lifecycle when the
// move is illegal or stale; 400 for unknown lifecycles; 404.
//
// deployed → ready is a release, as the reconciler's: the
// allocation is dropped, the server is marked for the release wipe
// (NeedsWipe: the controller PXE-boots it into the ramdisk's wipe mode,
// which wipes its disks' partition tables and signatures and powers off;
// it is not allocated again before that), and its hosts are marked
// released with their node certificates forgotten, all in the move's one
// transaction (state.Move.ForgetHosts). This is how a server
// taken by POST /api/v1/provision is given back.
func (s *Server) handleTransition(w http.ResponseWriter, r *http.Request) {
	var req v1.TransitionRequest
	if !decodeBody(w, r, &req) {
		return
	}
	from, err1 := state.ParseLifecycle(req.From)
	to, err2 := state.ParseLifecycle(req.To)
	if err1 != nil || err2 != nil {
		badRequest(w, "from and to must be lifecycles (new, commissioning, ready, allocated, deploying, deployed, failed, retired)")
		return
	}
	if len(req.Reason) > maxReason {
		badRequest(w, "reason longer than %d bytes", maxReason)
		return
	}
	if why := apiMoveRefused(r.PathValue("name"), to); why != "" {
		writeError(w, http.StatusConflict, v1.Error{Message: why, Code: v1.CodeConflict})
		return
	}
	release := from == state.LifecycleDeployed && to == state.LifecycleReady
	m := state.Move{Server: r.PathValue("name"), From: from, To: to, Reason: req.Reason, Actor: actor(r)}
	if release {
		m.Update = func(srv *state.Server) error {
			srv.WipeErase, srv.WipeEraseDisks = srv.Allocation.EraseMethod(), srv.Allocation.EraseDiskMethods()
			srv.Allocation, srv.NeedsWipe, srv.FinishDeploy = nil, true, false
			return nil
		}
		// In the move's transaction: a failure leaves neither the move
		// nor a host still trusted after it.
		m.ForgetHosts, m.ForgetReason = state.HostReleased, "server "+m.Server+" released by "+actor(r)
	}
	srv, err := s.store.Apply(m)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	s.log.Info("lifecycle moved", "machine", srv.Name, "from", from, "to", to, "actor", actor(r))
	writeJSON(w, http.StatusOK, toServer(srv))
}

// apiMoveRefused says why a move to the lifecycle to through the API is
// refused, naming what does it, or "" when the move is one the reconciler
// carries on from. Moves into commissioning, allocated, deploying and
// deployed need the controller to boot the machine or the machine to
// report: made through the API, nothing would power the server and its
// deadline would fail it.
func apiMoveRefused(name string, to state.Lifecycle) string {
	switch to {
	case state.LifecycleCommissioning:
		return "the API does not start commissioning (nothing would boot " + name + "): bump actions.commission of " + name +
			" in servers.yaml and push; a new server is commissioned by itself"
	case state.LifecycleAllocated, state.LifecycleDeploying:
		return "the API does not start a deploy (nothing would boot " + name + "): set want: deployed and a profile for " + name +
			" in servers.yaml, raise the profile's count, or run machinactl provision PROFILE N"
	case state.LifecycleDeployed:
		return "only the ramdisk's verified done (or the installer's callback) moves " + name + " to deployed"
	}
	return ""
}

func (s *Server) handleListSecrets(w http.ResponseWriter, r *http.Request) {
	list, err := s.store.Secrets()
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	out := v1.SecretList{Secrets: make([]v1.Secret, 0, len(list))}
	for _, i := range list {
		out.Secrets = append(out.Secrets, toSecret(i))
	}
	writeJSON(w, http.StatusOK, out)
}

// handlePutSecret answers PUT /api/v1/secrets/{name} with the stored
// secret's description (never its value).
func (s *Server) handlePutSecret(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !state.ValidName(name) {
		badRequest(w, "secret name is not an RFC 1123 label (lower-case letters, digits and inner hyphens, at most 63)")
		return
	}
	var req v1.SecretRequest
	if !decodeBody(w, r, &req) {
		return
	}
	if req.Username == "" || req.Password == "" {
		badRequest(w, "username and password are required")
		return
	}
	info, err := s.store.PutSecret(name, state.Credential{Username: req.Username, Password: req.Password, Extra: req.Extra}, actor(r))
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	s.log.Info("secret set", "secret", name, "sealed", info.Sealed, "actor", actor(r))
	writeJSON(w, http.StatusOK, toSecret(info))
}

func (s *Server) handleDeleteSecret(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := s.store.DeleteSecret(name, actor(r)); err != nil {
		s.storeError(w, r, err)
		return
	}
	s.log.Info("secret deleted", "secret", name, "actor", actor(r))
	w.WriteHeader(http.StatusNoContent)
}

// handleStream answers GET /api/v1/events/stream[?server=][&after=][&unnamed=1]
// as Server-Sent Events (WHATWG HTML "Server-sent events"): each event is
// "id: <seq>", "event: <kind>", "data: <v1.Event JSON>"; with unnamed=1 the
// "event:" line is left out, so a browser's EventSource delivers every kind
// (kinds are open-ended: wipe.done, console.open, boot.*) as "message"
// instead of only those it registered a listener for. A reconnecting
// client's Last-Event-ID header resumes after that seq; without it or
// after= the stream starts with the next new event. Comment lines keep
// idle connections alive every Config.Heartbeat. The stream ends when the
// request's token is revoked (checked on every wake-up and heartbeat).
func (s *Server) handleStream(w http.ResponseWriter, r *http.Request) {
	server := r.URL.Query().Get("server")
	afterStr := r.URL.Query().Get("after")
	var unnamed bool
	switch u := r.URL.Query().Get("unnamed"); u {
	case "", "0", "false":
	case "1", "true":
		unnamed = true
	default:
		badRequest(w, "unnamed: %q is not 1, true, 0 or false", u)
		return
	}
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		afterStr = id
	}
	var after uint64
	var err error
	if afterStr != "" {
		if after, err = parseAfterSeq(afterStr); err != nil {
			badRequest(w, "%v", err)
			return
		}
	} else if after, err = s.store.LastEventSeq(); err != nil {
		s.storeError(w, r, err)
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		s.internal(w, r, fmt.Errorf("response writer cannot flush"))
		return
	}
	wake, stop := s.store.Notify()
	defer stop()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, "retry: 2000\n\n")
	flusher.Flush()
	tick := time.NewTicker(s.cfg.Heartbeat)
	defer tick.Stop()
	for {
		if after, ok = s.streamEvents(w, flusher, server, after, unnamed); !ok {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-wake:
		case <-tick.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
			flusher.Flush()
		}
		if !s.stillAuthorized(r) { // a revoked token ends its streams
			return
		}
	}
}

// streamEvents writes the events after seq after (of server, "" for
// all) as Server-Sent Events, 500 at a time, flushing each batch; it
// returns the last seq written and false when the stream ends (a read or
// write failed).
func (s *Server) streamEvents(w http.ResponseWriter, flusher http.Flusher, server string, after uint64, unnamed bool) (uint64, bool) {
	for {
		evs, err := s.store.Events(state.EventQuery{Server: server, After: after, Limit: 500})
		if err != nil {
			s.log.Error("event stream read", "err", err)
			return after, false
		}
		for _, e := range evs {
			data, _ := json.Marshal(toEvent(e))
			if unnamed {
				_, err = fmt.Fprintf(w, "id: %d\ndata: %s\n\n", e.Seq, data)
			} else {
				_, err = fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", e.Seq, e.Kind, data)
			}
			if err != nil {
				return after, false
			}
			after = e.Seq
		}
		flusher.Flush()
		if len(evs) < 500 {
			return after, true
		}
	}
}

// handleListAdminTokens answers GET /api/v1/admin-tokens: the admin
// tokens' names, IDs and creation (never a value).
func (s *Server) handleListAdminTokens(w http.ResponseWriter, r *http.Request) {
	toks, err := s.store.AdminTokens()
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	out := v1.AdminTokenList{Tokens: []v1.AdminToken{}}
	for _, t := range toks {
		out.Tokens = append(out.Tokens, v1.AdminToken{Name: t.Name, ID: t.ID, CreatedAt: t.CreatedAt, CreatedBy: t.CreatedBy, Role: string(t.Role)})
	}
	writeJSON(w, http.StatusOK, out)
}

// handleCreateAdminToken answers POST /api/v1/admin-tokens {"name",
// "role"} (role viewer, operator or admin; empty means admin): 201
// with the new token's value, shown this once (the store keeps only its
// hash); 409 when the name is taken, 400 when it is not an RFC 1123
// label. The caller's token name is recorded as the creator (an
// admin_token.created event). This lets an operator create and revoke
// tokens while the controller holds the state file.
func (s *Server) handleCreateAdminToken(w http.ResponseWriter, r *http.Request) {
	var req v1.AdminTokenRequest
	if !decodeBody(w, r, &req) {
		return
	}
	if !state.ValidName(req.Name) {
		badRequest(w, "name: an admin token's name is an RFC 1123 label (lower-case letters, digits and '-', 1 to 63 characters)")
		return
	}
	role := state.RoleAdmin
	if req.Role != "" {
		var err error
		if role, err = state.ParseRole(req.Role); err != nil {
			badRequest(w, "role: want viewer, operator or admin")
			return
		}
	}
	value, tok, err := s.store.CreateAdminTokenRole(req.Name, role, actor(r))
	if errors.Is(err, state.ErrExists) {
		writeError(w, http.StatusConflict, v1.Error{Message: "an admin token named " + req.Name + " exists; revoke it first or pick another name", Code: v1.CodeConflict})
		return
	}
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	s.log.Info("admin token created", "token", tok.Name, "id", tok.ID, "role", tok.Role, "actor", actor(r))
	writeJSON(w, http.StatusCreated, v1.AdminTokenCreated{AdminToken: v1.AdminToken{Name: tok.Name, ID: tok.ID, CreatedAt: tok.CreatedAt, CreatedBy: tok.CreatedBy, Role: string(tok.Role)}, Token: value})
}

// handleRevokeAdminToken answers DELETE /api/v1/admin-tokens/{name}: 204;
// the token's next request is refused and its event streams and web
// console sessions end. A token may revoke itself, but not the last one:
// with the controller running nothing else could create another (machina
// token needs the state file), so that is a 409. 404 for an unknown name.
func (s *Server) handleRevokeAdminToken(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	err := s.store.RevokeAdminTokenKeepOne(name, actor(r))
	if errors.Is(err, state.ErrLastAdminToken) {
		writeError(w, http.StatusConflict, v1.Error{Message: "admin token " + name + " is the last one: create another first (machinactl admin-token create NAME), or stop the controller and use machina token", Code: v1.CodeConflict})
		return
	}
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	s.log.Info("admin token revoked", "token", name, "actor", actor(r))
	w.WriteHeader(http.StatusNoContent)
}

// handleListApprovals answers GET /api/v1/approvals: every recorded
// approval of a held plan (inventory digest prefix and who approved it),
// so a client planning a revision itself (machinactl plan) knows the
// safety brake will not hold it.
func (s *Server) handleListApprovals(w http.ResponseWriter, r *http.Request) {
	aps, err := s.store.Approvals()
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	out := v1.ApprovalList{Approvals: []v1.Approval{}}
	for _, a := range aps {
		out.Approvals = append(out.Approvals, v1.Approval{Revision: a.Revision, Actor: a.Actor})
	}
	writeJSON(w, http.StatusOK, out)
}

// handleSnapshot answers GET /api/v1/state/snapshot: the whole state file
// as of one read transaction (bbolt Tx.WriteTo), streamed as
// application/octet-stream with its Content-Length, while the controller
// keeps running: the online backup `machinactl state snapshot FILE` saves.
// Admin token only. The copy holds sealed secrets (unsealed ones when no
// master key is set) and admin-token hashes, so the answer says
// Cache-Control: no-store. A state.snapshot event records who took it.
func (s *Server) handleSnapshot(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", `attachment; filename="machina-state.db"`)
	w.Header().Set("Cache-Control", "no-store")
	started := false
	n, err := s.store.WriteBackup(w, func(size int64) {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		started = true
	})
	if err != nil {
		if !started {
			s.storeError(w, r, err)
			return
		}
		// Headers are gone: the client sees a short body against the
		// Content-Length and must discard the copy.
		s.log.Error("state snapshot interrupted", "bytes", n, "err", err)
		return
	}
	_, _ = s.store.AppendEvent(state.Event{Kind: "state.snapshot", Actor: actor(r), Message: fmt.Sprintf("state snapshot of %d bytes", n)})
}
