package v1

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestNewClientValidatesURL(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:8080", "ftp://x", "http://", "http://u:p@host", "http://host/?q=1"} {
		if _, err := NewClient(u, "t"); err == nil {
			t.Errorf("NewClient(%q) accepted", u)
		}
	}
	if _, err := NewClient("https://controller.lan:8443/prefix/", "t"); err != nil {
		t.Errorf("NewClient(https with prefix) = %v", err)
	}
}

func TestClientRequestsAndErrors(t *testing.T) {
	var gotAuth, gotPath, gotQuery string
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth, gotPath, gotQuery = r.Header.Get("Authorization"), r.URL.EscapedPath(), r.URL.RawQuery
		switch r.URL.Path {
		case "/p/api/v1/servers":
			w.Write([]byte(`{"servers":[{"name":"a","lifecycle":"new"}],"next":"a"}`))
		case "/p/api/v1/servers/a b/transitions":
			w.WriteHeader(http.StatusConflict)
			w.Write([]byte(`{"error":"stale","code":"conflict","lifecycle":"ready"}`))
		default:
			w.WriteHeader(http.StatusBadGateway)
			w.Write([]byte(`<html>proxy error</html>`))
		}
	}))
	defer hs.Close()
	c, err := NewClient(hs.URL+"/p", "tok")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	list, err := c.ListServers(ctx, ListServersOptions{Zone: "z", Lifecycle: "new", After: "x", Limit: 5})
	if err != nil || len(list.Servers) != 1 || list.Next != "a" {
		t.Fatalf("ListServers = %+v, %v", list, err)
	}
	if gotAuth != "Bearer tok" || gotQuery != "after=x&lifecycle=new&limit=5&zone=z" {
		t.Errorf("request auth %q query %q", gotAuth, gotQuery)
	}
	_, err = c.Transition(ctx, "a b", TransitionRequest{From: "new", To: "commissioning"})
	var ae *APIError
	if !errors.As(err, &ae) || ae.StatusCode != 409 || ae.Body.Lifecycle != "ready" || !IsCode(err, CodeConflict) {
		t.Errorf("Transition = %v", err)
	}
	if gotPath != "/p/api/v1/servers/a%20b/transitions" {
		t.Errorf("path %q, want the name escaped", gotPath)
	}
	// A non-JSON error body still yields an APIError with the status.
	_, err = c.Status(ctx)
	if !errors.As(err, &ae) || ae.StatusCode != 502 || ae.Body.Code != "http_502" {
		t.Errorf("Status = %v", err)
	}
}
