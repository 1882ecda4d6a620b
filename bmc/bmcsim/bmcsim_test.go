package bmcsim_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc/bmcsim"
)

var trees bmcsim.Trees

func tree(t testing.TB, name string) *bmcsim.Tree {
	t.Helper()
	dir, err := bmcsim.TreeDir("", name)
	if err != nil {
		t.Fatalf("%v (run scripts/sync-fixtures.sh)", err)
	}
	tr, err := trees.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

type client struct {
	t    *testing.T
	base string
	tok  string
}

func start(t *testing.T, cfg bmcsim.Config) (*bmcsim.Server, *client) {
	t.Helper()
	if cfg.Username == "" {
		cfg.Username, cfg.Password = "admin", "pw"
	}
	s, err := bmcsim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, &client{t: t, base: ts.URL}
}

// do sends a request and returns status, headers and decoded body.
func (c *client) do(method, path string, body any, hdr ...string) (int, http.Header, map[string]any) {
	c.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, c.base+path, rd)
	if c.tok != "" {
		req.Header.Set("X-Auth-Token", c.tok)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, resp.Header, m
}

func (c *client) login(user, pass string) int {
	c.t.Helper()
	st, h, _ := c.do("POST", "/redfish/v1/SessionService/Sessions", map[string]any{"UserName": user, "Password": pass})
	if st == 201 {
		c.tok = h.Get("X-Auth-Token")
	}
	return st
}

func msgID(m map[string]any) string {
	e, _ := m["error"].(map[string]any)
	ei, _ := e["@Message.ExtendedInfo"].([]any)
	if len(ei) == 0 {
		return ""
	}
	id, _ := ei[0].(map[string]any)["MessageId"].(string)
	return id
}

func TestAuth(t *testing.T) {
	_, c := start(t, bmcsim.Config{Tree: tree(t, "dell-poweredge-r750-idrac9")})
	if st, _, _ := c.do("GET", "/redfish/v1", nil); st != 200 {
		t.Errorf("service root: %d, want 200 without auth", st)
	}
	if st, _, _ := c.do("GET", "/redfish/v1/Systems", nil); st != 401 {
		t.Errorf("Systems without auth: %d, want 401", st)
	}
	req, _ := http.NewRequest("GET", c.base+"/redfish/v1/Systems", nil)
	req.SetBasicAuth("admin", "pw")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("basic auth: %v %v", resp, err)
	}
	resp.Body.Close()
	if st := c.login("admin", "pw"); st != 201 {
		t.Fatalf("login: %d", st)
	}
	st, _, coll := c.do("GET", "/redfish/v1/SessionService/Sessions", nil)
	if st != 200 || coll["Members@odata.count"] != float64(1) {
		t.Errorf("sessions collection: %d %v", st, coll["Members"])
	}
	loc := coll["Members"].([]any)[0].(map[string]any)["@odata.id"].(string)
	if st, _, _ := c.do("DELETE", loc, nil); st != 204 {
		t.Errorf("logout: %d", st)
	}
	if st, _, _ := c.do("GET", "/redfish/v1/Systems", nil); st != 401 {
		t.Errorf("after logout: %d, want 401", st)
	}
}

func TestLockout(t *testing.T) {
	s, c := start(t, bmcsim.Config{Tree: tree(t, "hpe-proliant-dl385gen10plusv2-ilo5"), LockoutThreshold: 3, LockoutDuration: time.Hour})
	for i := range 3 {
		if st := c.login("admin", "bad"); st != 401 {
			t.Fatalf("bad login %d: %d", i, st)
		}
	}
	if !s.Locked() {
		t.Fatal("not locked")
	}
	if st := c.login("admin", "pw"); st != 401 {
		t.Errorf("good password while locked: %d, want 401", st)
	}
}

func TestResetHonoursAllowableValues(t *testing.T) {
	for _, tc := range []struct {
		tree, sys, rt string
		want          int
	}{
		{"hpe-proliant-dl385gen10plusv2-ilo5", "/redfish/v1/Systems/1", "PowerCycle", 400},  // inline list lacks it
		{"hpe-proliant-dl385gen10plusv2-ilo5", "/redfish/v1/Systems/1", "ForceOff", 204},    // listed
		{"supermicro-sys821ge-tnhr-x13", "/redfish/v1/Systems/1", "PushPowerButton", 400},   // ActionInfo lacks it
		{"supermicro-sys821ge-tnhr-x13", "/redfish/v1/Systems/1", "PowerCycle", 204},        // ActionInfo lists it
		{"lenovo-thinksystem-sr670v2-xcc", "/redfish/v1/Systems/1", "PushPowerButton", 400}, // inline + ActionInfo
		{"openbmc-bmcweb-stock", "/redfish/v1/Systems/system", "GracefulRestartBogus", 400}, // not a value at all
	} {
		t.Run(tc.tree+"/"+tc.rt, func(t *testing.T) {
			pw := bmcsim.NewMemoryPower(true)
			_, c := start(t, bmcsim.Config{Tree: tree(t, tc.tree), Power: pw})
			c.login("admin", "pw")
			st, _, body := c.do("POST", tc.sys+"/Actions/ComputerSystem.Reset", map[string]any{"ResetType": tc.rt})
			if st != tc.want {
				t.Fatalf("status %d, want %d", st, tc.want)
			}
			if st == 400 && msgID(body) != "Base.1.8.ActionParameterValueNotInList" {
				t.Errorf("error MessageId = %q", msgID(body))
			}
			if st == 400 && len(pw.Resets) != 0 {
				t.Errorf("refused reset reached the backend: %v", pw.Resets)
			}
		})
	}
}

func TestPowerStateServedFromBackend(t *testing.T) {
	pw := bmcsim.NewMemoryPower(false)
	pw.Lag = 2
	_, c := start(t, bmcsim.Config{Tree: tree(t, "dmtf-public-rackmount1"), Power: pw})
	c.login("admin", "pw")
	sys := "/redfish/v1/Systems/437XR1138R2"
	if st, _, _ := c.do("POST", sys+"/Actions/ComputerSystem.Reset", map[string]any{"ResetType": "On"}); st != 204 {
		t.Fatal(st)
	}
	var seen []string
	for range 4 {
		_, _, b := c.do("GET", sys, nil)
		seen = append(seen, b["PowerState"].(string))
	}
	if strings.Join(seen, ",") != "Off,Off,On,On" {
		t.Errorf("PowerState reads = %v, want Off,Off,On,On (Lag 2)", seen)
	}
}

func TestETagChecks(t *testing.T) {
	s, c := start(t, bmcsim.Config{Tree: tree(t, "lenovo-thinksystem-sr670v2-xcc")})
	c.login("admin", "pw")
	sys := "/redfish/v1/Systems/1"
	_, h, b := c.do("GET", sys, nil)
	etag := h.Get("ETag")
	if etag == "" || etag != b["@odata.etag"] {
		t.Fatalf("ETag header %q, body %v", etag, b["@odata.etag"])
	}
	patch := map[string]any{"Boot": map[string]any{"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"}}
	if st, _, body := c.do("PATCH", sys, patch); st != 428 {
		t.Errorf("PATCH without If-Match: %d %v, want 428 (XCC)", st, body)
	}
	if st, _, _ := c.do("PATCH", sys, patch, "If-Match", `"stale"`); st != 412 {
		t.Errorf("PATCH with stale If-Match: %d, want 412", st)
	}
	if st, _, _ := c.do("PATCH", sys, patch, "If-Match", etag); st != 204 {
		t.Errorf("PATCH with current If-Match: %d, want 204", st)
	}
	_, h2, b2 := c.do("GET", sys, nil)
	if h2.Get("ETag") == etag {
		t.Error("ETag unchanged after a write")
	}
	if boot := b2["Boot"].(map[string]any); boot["BootSourceOverrideTarget"] != "Pxe" {
		t.Errorf("Boot after PATCH = %v", boot)
	}
	if st, _, _ := c.do("PATCH", sys, patch, "If-Match", etag); st != 412 {
		t.Errorf("PATCH with the old ETag: %d, want 412", st)
	}
	if n := len(s.Requests()); n != 7 {
		t.Errorf("recorded %d requests, want 7", n)
	}
}

func TestBootPatchValidation(t *testing.T) {
	_, c := start(t, bmcsim.Config{Tree: tree(t, "hpe-proliant-dl385gen10plusv2-ilo5")})
	c.login("admin", "pw")
	sys := "/redfish/v1/Systems/1"
	for _, tc := range []struct {
		boot map[string]any
		want int
	}{
		{map[string]any{"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideMode": "UEFI"}, 400}, // iLO refuses the mode even unchanged
		{map[string]any{"BootSourceOverrideTarget": "Floppy"}, 400},                                // not in the tree's list
		{map[string]any{"BootSourceOverrideTarget": 5}, 400},
		{map[string]any{"BootSourceOverrideTarget": "Cd", "BootSourceOverrideEnabled": "Continuous"}, 204},
	} {
		if st, _, _ := c.do("PATCH", sys, map[string]any{"Boot": tc.boot}); st != tc.want {
			t.Errorf("PATCH %v: %d, want %d", tc.boot, st, tc.want)
		}
	}
}

func TestVirtualMediaQuirks(t *testing.T) {
	img := "http://10.0.0.1/x.iso"
	t.Run("supermicro refuses extra fields", func(t *testing.T) {
		_, c := start(t, bmcsim.Config{Tree: tree(t, "supermicro-sys821ge-tnhr-x13")})
		c.login("admin", "pw")
		act := "/redfish/v1/Managers/1/VirtualMedia/VirtualMedia1/Actions/VirtualMedia.InsertMedia"
		if st, _, b := c.do("POST", act, map[string]any{"Image": img, "Inserted": true}); st != 400 || msgID(b) != "Base.1.8.ActionParameterNotSupported" {
			t.Errorf("extra field: %d %v", st, msgID(b))
		}
		if st, _, _ := c.do("POST", act, map[string]any{"Image": img}); st != 204 {
			t.Errorf("minimal body: %d", st)
		}
		_, _, vm := c.do("GET", "/redfish/v1/Managers/1/VirtualMedia/VirtualMedia1", nil)
		if vm["Image"] != img || vm["Inserted"] != true || vm["ConnectedVia"] != "URI" {
			t.Errorf("slot after insert: %v %v %v", vm["Image"], vm["Inserted"], vm["ConnectedVia"])
		}
	})
	t.Run("idrac refuses WriteProtected false", func(t *testing.T) {
		_, c := start(t, bmcsim.Config{Tree: tree(t, "dell-poweredge-r750-idrac9")})
		c.login("admin", "pw")
		act := "/redfish/v1/Systems/System.Embedded.1/VirtualMedia/1/Actions/VirtualMedia.InsertMedia"
		if st, _, _ := c.do("POST", act, map[string]any{"Image": img, "WriteProtected": false}); st != 400 {
			t.Errorf("WriteProtected false: %d, want 400", st)
		}
	})
}

func TestCopyOnWriteIsolation(t *testing.T) {
	tr := tree(t, "dell-poweredge-r750-idrac9")
	before := tr.Paths()
	s1, c1 := start(t, bmcsim.Config{Tree: tr})
	s2, _ := start(t, bmcsim.Config{Tree: tr})
	c1.login("admin", "pw")
	sys := "/redfish/v1/Systems/System.Embedded.1"
	if st, _, _ := c1.do("PATCH", sys, map[string]any{"Boot": map[string]any{"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"}}); st != 204 {
		t.Fatal(st)
	}
	b1 := s1.Get(sys)["Boot"].(map[string]any)["BootSourceOverrideTarget"]
	b2 := s2.Get(sys)["Boot"].(map[string]any)["BootSourceOverrideTarget"]
	if b1 != "Pxe" || b2 != "None" {
		t.Errorf("targets = %v / %v; want Pxe in the written instance, None in the other", b1, b2)
	}
	s3, _ := start(t, bmcsim.Config{Tree: tr})
	if got := s3.Get(sys)["Boot"].(map[string]any)["BootSourceOverrideTarget"]; got != "None" || tr.Paths() != before {
		t.Errorf("shared tree changed: %v", got)
	}
}

func TestCaseInsensitivePathsAnd404(t *testing.T) {
	_, c := start(t, bmcsim.Config{Tree: tree(t, "hpe-proliant-dl385gen10plusv2-ilo5")})
	c.login("admin", "pw")
	if st, _, _ := c.do("GET", "/redfish/v1/systems/1/bios/", nil); st != 200 {
		t.Errorf("lower-case iLO BIOS link: %d, want 200", st)
	}
	if st, _, b := c.do("GET", "/redfish/v1/JsonSchemas", nil); st != 404 || msgID(b) != "Base.1.8.ResourceMissingAtURI" {
		t.Errorf("dropped subtree: %d %v", st, b)
	}
}

func TestTaskMonitor(t *testing.T) {
	s, c := start(t, bmcsim.Config{Tree: tree(t, "openbmc-bmcweb-stock")})
	c.login("admin", "pw")
	s.Inject(bmcsim.Fault{PathSuffix: "ComputerSystem.Reset", Kind: bmcsim.FaultAccepted, TaskPolls: 1})
	st, h, _ := c.do("POST", "/redfish/v1/Systems/system/Actions/ComputerSystem.Reset", map[string]any{"ResetType": "On"})
	mon := h.Get("Location")
	if st != 202 || mon == "" {
		t.Fatalf("reset: %d Location %q", st, mon)
	}
	var states []string
	for range 2 {
		st, _, b := c.do("GET", mon, nil)
		states = append(states, http.StatusText(st)+":"+b["TaskState"].(string))
	}
	if strings.Join(states, ",") != "Accepted:Running,OK:Completed" {
		t.Errorf("monitor = %v", states)
	}
}

func TestFaultUnavailableRetryAfter(t *testing.T) {
	s, c := start(t, bmcsim.Config{Tree: tree(t, "openbmc-bmcweb-stock")})
	s.Inject(bmcsim.Fault{Kind: bmcsim.FaultUnavailable, RetryAfter: 3 * time.Second, Times: 1})
	st, h, _ := c.do("GET", "/redfish/v1", nil)
	if st != 503 || h.Get("Retry-After") != "3" {
		t.Errorf("got %d Retry-After %q", st, h.Get("Retry-After"))
	}
	if st, _, _ := c.do("GET", "/redfish/v1", nil); st != 200 {
		t.Errorf("after Times exhausted: %d", st)
	}
}

func TestFaultDrop(t *testing.T) {
	s, c := start(t, bmcsim.Config{Tree: tree(t, "openbmc-bmcweb-stock")})
	s.Inject(bmcsim.Fault{Kind: bmcsim.FaultDrop, Times: 1})
	req, _ := http.NewRequest("GET", c.base+"/redfish/v1", nil)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("dropped connection answered")
	}
}

func BenchmarkNewServer(b *testing.B) {
	tr := tree(b, "supermicro-sys821ge-tnhr-x13")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bmcsim.New(bmcsim.Config{Tree: tr}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGetSystem(b *testing.B) {
	tr := tree(b, "dell-poweredge-r750-idrac9")
	s, _ := bmcsim.New(bmcsim.Config{Tree: tr})
	req := httptest.NewRequest("GET", "/redfish/v1/Systems/System.Embedded.1", nil)
	req.SetBasicAuth("admin", "password")
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		if w.Code != 200 {
			b.Fatal(w.Code)
		}
	}
}

func BenchmarkLoadTree(b *testing.B) {
	dir, err := bmcsim.TreeDir("", "dell-poweredge-r750-idrac9")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bmcsim.LoadTree(dir); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkInstanceWithBootWrite measures one emulator instance that has
// had one boot-override PATCH (its copy-on-write overlay holds the System).
func BenchmarkInstanceWithBootWrite(b *testing.B) {
	dir, err := bmcsim.TreeDir("", "dell-poweredge-r750-idrac9")
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once"}}`)
	b.ReportAllocs()
	for b.Loop() {
		s, err := trees.New(dir, bmcsim.Config{})
		if err != nil {
			b.Fatal(err)
		}
		req := httptest.NewRequest("PATCH", "/redfish/v1/Systems/System.Embedded.1", bytes.NewReader(body))
		req.SetBasicAuth("admin", "password")
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		if w.Code != 204 {
			b.Fatal(w.Code)
		}
	}
}

// clock is a settable time source.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func TestSessionTimeoutFromTreeAndLockoutExpiry(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	// The Lenovo tree's SessionService.SessionTimeout is 300 (seconds).
	s, c := start(t, bmcsim.Config{Tree: tree(t, "lenovo-thinksystem-sr670v2-xcc"), Now: clk.now, LockoutThreshold: 2, LockoutDuration: time.Minute})
	if st := c.login("admin", "pw"); st != 201 {
		t.Fatal(st)
	}
	clk.add(299 * time.Second)
	if st, _, _ := c.do("GET", "/redfish/v1/Systems/1", nil); st != 200 {
		t.Fatalf("within timeout: %d", st)
	}
	clk.add(299 * time.Second) // idle time counts from the last use
	if st, _, _ := c.do("GET", "/redfish/v1/Systems/1", nil); st != 200 {
		t.Fatalf("used again within timeout: %d", st)
	}
	clk.add(301 * time.Second)
	if st, _, _ := c.do("GET", "/redfish/v1/Systems/1", nil); st != 401 {
		t.Fatalf("after 301s idle: %d, want 401", st)
	}
	if n := s.Sessions(); n != 0 {
		t.Errorf("expired session still listed: %d", n)
	}
	c.login("admin", "x")
	c.login("admin", "x")
	if st := c.login("admin", "pw"); st != 401 || !s.Locked() {
		t.Fatalf("locked: login %d locked %v", st, s.Locked())
	}
	clk.add(61 * time.Second)
	if st := c.login("admin", "pw"); st != 201 {
		t.Errorf("after lockout expiry: %d, want 201", st)
	}
}

// hookBackend records the boot and media calls bmcsim forwards.
type hookBackend struct {
	bmcsim.MemoryPower
	mu    sync.Mutex
	calls []string
	fail  bool
}

func (h *hookBackend) record(s string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, s)
	if h.fail {
		return io.ErrUnexpectedEOF
	}
	return nil
}

func (h *hookBackend) SetBootOverride(_ context.Context, target, enabled string) error {
	return h.record("boot " + target + " " + enabled)
}
func (h *hookBackend) InsertMedia(_ context.Context, image string) error {
	return h.record("insert " + image)
}
func (h *hookBackend) EjectMedia(context.Context) error { return h.record("eject") }

// TestBootAndMediaBackendHooks: an accepted boot PATCH and InsertMedia /
// EjectMedia reach a backend implementing BootBackend / MediaBackend, with
// the stored (quirk-applied) values; a rejected request does not; a failing
// backend turns the answer into 500.
func TestBootAndMediaBackendHooks(t *testing.T) {
	be := &hookBackend{}
	_, c := start(t, bmcsim.Config{Tree: tree(t, "dell-poweredge-r750-idrac9"), Power: be})
	c.login("admin", "pw")
	sys := "/redfish/v1/Systems/System.Embedded.1"
	if st, _, _ := c.do("PATCH", sys, map[string]any{"Boot": map[string]any{"BootSourceOverrideTarget": 5}}); st != 400 {
		t.Fatalf("bad target: %d", st)
	}
	if st, _, _ := c.do("PATCH", sys, map[string]any{"Boot": map[string]any{"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"}}); st != 204 {
		t.Fatalf("boot patch: %d", st)
	}
	act := sys + "/VirtualMedia/1/Actions/VirtualMedia."
	if st, _, _ := c.do("POST", act+"InsertMedia", map[string]any{"Image": "http://10.0.0.1/x.iso"}); st != 204 {
		t.Fatalf("insert: %d", st)
	}
	if st, _, _ := c.do("POST", act+"EjectMedia", map[string]any{}); st != 204 {
		t.Fatalf("eject: %d", st)
	}
	want := []string{"boot Pxe Once", "insert http://10.0.0.1/x.iso", "eject"}
	if strings.Join(be.calls, "|") != strings.Join(want, "|") {
		t.Fatalf("backend calls = %q, want %q", be.calls, want)
	}
	be.fail = true
	if st, _, _ := c.do("POST", act+"InsertMedia", map[string]any{"Image": "http://10.0.0.1/y.iso"}); st != 500 {
		t.Fatalf("failing backend insert: %d, want 500", st)
	}
	if _, _, vm := c.do("GET", sys+"/VirtualMedia/1", nil); vm["Inserted"] == true {
		t.Fatal("slot shows inserted after the backend failed")
	}
}
