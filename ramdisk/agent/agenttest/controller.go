package agenttest

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
)

// Controller is a reference implementation of the machine-facing endpoints
// for tests: one machine, tokens stored as SHA-256 hashes, single-use
// commission/plan/done tokens, a reusable image token, request size limits
// and strict JSON decoding. A refused request is answered 4xx, recorded in
// Events and never stored. Safe for concurrent use.
type Controller struct {
	mu      sync.Mutex
	tokens  map[[32]byte]tokenUse
	plan    v1.Plan
	image   []byte
	reports []v1.AgentReport
	done    []v1.DeployResult
	prog    []v1.Progress
	events  []string
	// ImagePath is where the image is served; "/images/os.img" by default.
	imagePath string
}

type tokenUse struct {
	scope    string // "commission", "plan", "image", "done"
	reusable bool
}

// ControllerConfig seeds a Controller.
type ControllerConfig struct {
	// CommissionToken authorises one report (and payload GETs until then).
	CommissionToken string
	// DeployToken authorises one GET of the plan.
	DeployToken string
	// Plan is answered to the deploy token; ImageURL is filled from BaseURL
	// and fresh ImageToken/DoneToken are minted.
	Plan v1.Plan
	// Image is served at "/images/os.img" to the image token.
	Image []byte
	// BaseURL is the URL the agent reaches the controller at (for ImageURL).
	BaseURL string
}

// NewController returns a Controller with the tokens of cfg.
func NewController(cfg ControllerConfig) *Controller {
	c := &Controller{tokens: map[[32]byte]tokenUse{}, imagePath: "/images/os.img", image: cfg.Image, plan: cfg.Plan}
	if cfg.CommissionToken != "" {
		c.tokens[sha256.Sum256([]byte(cfg.CommissionToken))] = tokenUse{scope: "commission"}
	}
	if cfg.DeployToken != "" {
		c.tokens[sha256.Sum256([]byte(cfg.DeployToken))] = tokenUse{scope: "plan"}
	}
	if cfg.Image != nil {
		c.plan.ImageURL = strings.TrimRight(cfg.BaseURL, "/") + c.imagePath
		c.plan.ImageSizeBytes = int64(len(cfg.Image))
		if c.plan.ImageSHA256 == "" {
			s := sha256.Sum256(cfg.Image)
			c.plan.ImageSHA256 = hex.EncodeToString(s[:])
		}
	}
	return c
}

// SetBaseURL fixes the plan's ImageURL once the listener address is known.
func (c *Controller) SetBaseURL(base string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.plan.ImageURL = strings.TrimRight(base, "/") + c.imagePath
}

// Reports returns the stored reports.
func (c *Controller) Reports() []v1.AgentReport {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]v1.AgentReport(nil), c.reports...)
}

// Done returns the stored deploy results.
func (c *Controller) Done() []v1.DeployResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]v1.DeployResult(nil), c.done...)
}

// Progress returns the stored progress reports, oldest first.
func (c *Controller) Progress() []v1.Progress {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]v1.Progress(nil), c.prog...)
}

// Events returns the event log (one line per accepted or refused request).
func (c *Controller) Events() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.events...)
}

func (c *Controller) mint(scope string, reusable bool) string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux (Go 1.24+)
	tok := hex.EncodeToString(b[:])
	c.tokens[sha256.Sum256([]byte(tok))] = tokenUse{scope: scope, reusable: reusable}
	return tok
}

// auth checks the bearer token for scope, consuming it if consume is set
// and the token is single-use. Caller holds mu.
func (c *Controller) auth(r *http.Request, scope string, consume bool) bool {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return false
	}
	h := sha256.Sum256([]byte(tok))
	for k, u := range c.tokens {
		if subtle.ConstantTimeCompare(k[:], h[:]) == 1 && u.scope == scope {
			if consume && !u.reusable {
				delete(c.tokens, k)
			}
			return true
		}
	}
	return false
}

func (c *Controller) refuse(w http.ResponseWriter, code int, what string) {
	c.events = append(c.events, fmt.Sprintf("refused %d: %s", code, what))
	http.Error(w, what, code)
}

// decodeStrict reads at most limit bytes of JSON into v, refusing unknown
// fields and trailing data.
func decodeStrict(r *http.Request, limit int64, v any) (int, error) {
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return http.StatusBadRequest, err
	}
	if int64(len(b)) > limit {
		return http.StatusRequestEntityTooLarge, errors.New("body too large")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return http.StatusBadRequest, err
	}
	if dec.More() {
		return http.StatusBadRequest, errors.New("trailing data")
	}
	return 0, nil
}

// ServeHTTP implements the endpoints of api/v1 (see its package comment).
func (c *Controller) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case r.Method == http.MethodPost && r.URL.Path == v1.PathAgentReport:
		// validate before consuming the token, so a malformed report can be retried
		if !c.auth(r, "commission", false) {
			c.refuse(w, http.StatusUnauthorized, "report: bad token")
			return
		}
		var rep v1.AgentReport
		if code, err := decodeStrict(r, v1.MaxReportBytes, &rep); err != nil {
			c.refuse(w, code, "report: "+err.Error())
			return
		}
		c.auth(r, "commission", true)
		c.reports = append(c.reports, rep)
		ack := v1.ReportAck{Lifecycle: "ready"}
		if !rep.Passed() {
			ack.Lifecycle = "failed"
			for _, t := range rep.Tests {
				if !t.Passed {
					ack.Reason = t.Name + ": " + t.Reason
					break
				}
			}
			if len(rep.Tests) == 0 {
				ack.Reason = "no tests ran"
			}
		}
		c.events = append(c.events, "report from "+rep.BootMAC+": "+ack.Lifecycle)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(ack)
	case r.Method == http.MethodGet && r.URL.Path == v1.PathAgentPayload:
		if !c.auth(r, "commission", false) {
			c.refuse(w, http.StatusUnauthorized, "payload: bad token")
			return
		}
		n, err := strconv.ParseInt(r.URL.Query().Get("bytes"), 10, 64)
		if err != nil || n < 0 || n > v1.MaxPayloadBytes {
			c.refuse(w, http.StatusBadRequest, "payload: bad size")
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		chunk := bytes.Repeat([]byte{0x5a}, 64<<10)
		for n > 0 {
			k := min(n, int64(len(chunk)))
			if _, err := w.Write(chunk[:k]); err != nil {
				return
			}
			n -= k
		}
	case r.Method == http.MethodGet && r.URL.Path == v1.PathAgentPlan:
		if !c.auth(r, "plan", true) {
			c.refuse(w, http.StatusUnauthorized, "plan: bad token")
			return
		}
		p := c.plan
		p.ImageToken = c.mint("image", true)
		p.DoneToken = c.mint("done", false)
		c.events = append(c.events, "plan served")
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(p)
	case r.Method == http.MethodGet && r.URL.Path == c.imagePath:
		if !c.auth(r, "image", false) {
			c.refuse(w, http.StatusUnauthorized, "image: bad token")
			return
		}
		c.events = append(c.events, "image served")
		img := c.image
		c.mu.Unlock()
		http.ServeContent(w, r, "os.img", timeZero, bytes.NewReader(img))
		c.mu.Lock()
	case r.Method == http.MethodPost && r.URL.Path == v1.PathAgentProgress:
		// Taken with the reusable image token and stored, every one: the
		// controller's rate limit (api.Machine) is not modelled.
		if !c.auth(r, "image", false) {
			c.refuse(w, http.StatusUnauthorized, "progress: bad token")
			return
		}
		var p v1.Progress
		if code, err := decodeStrict(r, v1.MaxProgressBytes, &p); err != nil {
			c.refuse(w, code, "progress: "+err.Error())
			return
		}
		c.prog = append(c.prog, p)
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPost && r.URL.Path == v1.PathAgentDone:
		if !c.auth(r, "done", false) {
			c.refuse(w, http.StatusUnauthorized, "done: bad token")
			return
		}
		var res v1.DeployResult
		if code, err := decodeStrict(r, v1.MaxDoneBytes, &res); err != nil {
			c.refuse(w, code, "done: "+err.Error())
			return
		}
		c.auth(r, "done", true)
		c.done = append(c.done, res)
		c.events = append(c.events, fmt.Sprintf("done from %s: ok=%v %s", res.BootMAC, res.OK, res.Reason))
		w.WriteHeader(http.StatusNoContent)
	default:
		c.refuse(w, http.StatusNotFound, r.Method+" "+r.URL.Path)
	}
}

var timeZero = time.Time{}
