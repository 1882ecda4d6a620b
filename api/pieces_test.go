package api

import (
	"net/http/httptest"
	"testing"
)

// TestPeerAddrFromPlanRequest: the agent's piece listener is its request's
// source address with the announced port; a missing or invalid port names
// no listener (the agent then fetches the whole image).
func TestPeerAddrFromPlanRequest(t *testing.T) {
	for q, want := range map[string]string{
		"?peerPort=7480":  "10.0.0.5:7480",
		"":                "",
		"?peerPort=0":     "",
		"?peerPort=70000": "",
		"?peerPort=x":     "",
		"?peerPort=-1":    "",
	} {
		r := httptest.NewRequest("GET", "/v1/agent/plan"+q, nil)
		r.RemoteAddr = "10.0.0.5:41234"
		if got := PeerAddr(withPeerAddr(r)); got != want {
			t.Errorf("PeerAddr(%q) = %q, want %q", q, got, want)
		}
	}
}
