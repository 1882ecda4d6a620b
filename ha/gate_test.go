package ha

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

type view struct {
	mu      sync.Mutex
	leading bool
	leader  Candidate
	known   bool
}

func (v *view) IsLeader() bool { v.mu.Lock(); defer v.mu.Unlock(); return v.leading }
func (v *view) Leader() (Candidate, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.leader, v.known
}

// echo answers "<who> <method> <path> auth=<Authorization> body=<body>
// fwd=<ForwardedHeader> xff=<X-Forwarded-For>".
func echo(who string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, _ = io.WriteString(w, who+" "+r.Method+" "+r.URL.RequestURI()+" auth="+r.Header.Get("Authorization")+" body="+string(b)+
			" fwd="+r.Header.Get(ForwardedHeader)+" xff="+r.Header.Get("X-Forwarded-For"))
	})
}

func do(t *testing.T, c *http.Client, method, url, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// TestGateForwardsWritesToLeader: a standby's admin API serves reads
// itself and forwards writes over TLS to the leader named in the election
// value (Authorization and body unchanged, ForwardedHeader and
// X-Forwarded-For added); without a known leader writes answer 503 with
// Retry-After; a forwarded request that reaches a non-leader is refused,
// not forwarded again; an unreachable leader answers 502.
func TestGateForwardsWritesToLeader(t *testing.T) {
	leaderView := &view{leading: true}
	lgate, err := Gate(GateConfig{Leader: leaderView, Self: "a"})
	if err != nil {
		t.Fatal(err)
	}
	leader := httptest.NewTLSServer(lgate(echo("a")))
	defer leader.Close()

	sv := &view{leader: Candidate{ID: "a", AdminURL: leader.URL}, known: true}
	sgate, err := Gate(GateConfig{Leader: sv, Self: "b", Transport: leader.Client().Transport})
	if err != nil {
		t.Fatal(err)
	}
	standby := httptest.NewServer(sgate(echo("b")))
	defer standby.Close()
	c := standby.Client()

	if code, _, body := do(t, c, "GET", standby.URL+"/api/v1/servers?x=1", ""); code != 200 || !strings.HasPrefix(body, "b GET /api/v1/servers?x=1") {
		t.Fatalf("standby GET = %d %q, want served by b", code, body)
	}
	code, _, body := do(t, c, "POST", standby.URL+"/api/v1/servers/r1-n01/power?on=1", `{"action":"on"}`)
	for _, want := range []string{"a POST /api/v1/servers/r1-n01/power?on=1", "auth=Bearer tok", `body={"action":"on"}`, "fwd=b", "xff=127.0.0.1"} {
		if code != 200 || !strings.Contains(body, want) {
			t.Fatalf("standby POST = %d %q, want forwarded to a with %q", code, body, want)
		}
	}
	if code, _, body := do(t, leader.Client(), "DELETE", leader.URL+"/api/v1/x", ""); code != 200 || !strings.HasPrefix(body, "a DELETE") {
		t.Fatalf("leader DELETE = %d %q, want served by a", code, body)
	}

	// The request was forwarded to a controller that no longer leads.
	leaderView.mu.Lock()
	leaderView.leading = false
	leaderView.mu.Unlock()
	if code, h, body := do(t, c, "POST", standby.URL+"/api/v1/x", "{}"); code != 503 || h.Get("Retry-After") != "10" || !strings.Contains(body, `"code":"unavailable"`) {
		t.Fatalf("forwarded POST to a non-leader = %d %v %q, want 503 unavailable with Retry-After 10", code, h, body)
	}

	sv.mu.Lock()
	sv.known = false
	sv.mu.Unlock()
	if code, h, _ := do(t, c, "PUT", standby.URL+"/api/v1/x", "{}"); code != 503 || h.Get("Retry-After") != "10" {
		t.Fatalf("standby PUT with no leader = %d %v, want 503 with Retry-After", code, h)
	}

	sv.mu.Lock()
	sv.known = true
	sv.leader.AdminURL = "https://127.0.0.1:1" // nothing listens there
	sv.mu.Unlock()
	if code, _, body := do(t, c, "POST", standby.URL+"/api/v1/x", "{}"); code != 502 || !strings.Contains(body, "forwarding to the leader a failed") {
		t.Fatalf("standby POST to an unreachable leader = %d %q, want 502", code, body)
	}
}
