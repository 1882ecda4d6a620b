package api_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/state"
	"github.com/prometheus/client_golang/prometheus"
)

// TestServeConnCapAndBodyTimeout: with a bounded load on loopback, one
// source address holding MaxConnsPerIP slow-body connections gets its
// next connection closed at accept (counted), while another address is
// served; the slow bodies are cut after BodyTimeout, freeing the address.
// Before the fix slow bodies held connections (and descriptors) forever
// and no listener capped an address.
func TestServeConnCapAndBodyTimeout(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	reg := prometheus.NewRegistry()
	a, err := api.New(api.Config{Store: st, Registry: reg, Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
		MaxConnsPerIP: 4, BodyTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.HandlePublic("POST /t/echo", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			w.WriteHeader(http.StatusRequestTimeout)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	addr := ln.Addr().String()

	dialFrom := func(src string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 2 * time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	slow := make([]net.Conn, 4)
	for i := range slow {
		slow[i] = dialFrom("127.0.0.1")
		fmt.Fprintf(slow[i], "POST /t/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
	}
	time.Sleep(100 * time.Millisecond) // the four are accepted and counted
	extra := dialFrom("127.0.0.1")
	_ = extra.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := extra.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("fifth connection from a capped address: read %d, %v; want closed", n, err)
	}
	extra.Close()
	other := dialFrom("127.0.0.2")
	fmt.Fprintf(other, "POST /t/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
	_ = other.SetReadDeadline(time.Now().Add(2 * time.Second))
	b, _ := io.ReadAll(other)
	if !strings.HasPrefix(string(b), "HTTP/1.1 204") {
		t.Errorf("another address while the first is capped: %q, want 204", b)
	}
	other.Close()
	// The slow bodies are cut after BodyTimeout.
	for i, c := range slow {
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		b, err := io.ReadAll(c)
		if err != nil {
			t.Errorf("slow connection %d not closed by the server within 3s: %v", i, err)
		}
		if !strings.Contains(string(b), "408") {
			t.Errorf("slow connection %d answered %q, want 408 from its handler", i, b)
		}
		c.Close()
	}
	time.Sleep(100 * time.Millisecond)
	again := dialFrom("127.0.0.1")
	fmt.Fprintf(again, "POST /t/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
	_ = again.SetReadDeadline(time.Now().Add(2 * time.Second))
	if b, _ := io.ReadAll(again); !strings.HasPrefix(string(b), "HTTP/1.1 204") {
		t.Errorf("the address after its slow bodies were cut: %q, want 204", b)
	}
	again.Close()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := -1.0
	for _, mf := range mfs {
		if mf.GetName() == "machina_api_conns_refused_total" {
			got = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if got != 1 {
		t.Errorf("machina_api_conns_refused_total = %v, want 1", got)
	}
}

// TestServeConnKeepsReadFrom: under Serve (with its per-address cap) the
// connection a handler's response goes out on still has the TCP
// connection's ReadFrom, which net/http's response.ReadFrom needs to send
// a file (http.ServeContent, the ramdisk route) with sendfile(2). Fails
// without connlimit's ReadFrom: the ramdisk step of the boot storm
// copied every byte through user space.
func TestServeConnKeepsReadFrom(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a, err := api.New(api.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.HandlePublic("GET /t/conn", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		defer c.Close()
		_, ok := c.(io.ReaderFrom)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\n%5v", ok)
	})); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	resp, err := http.Get("http://" + ln.Addr().String() + "/t/conn")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.TrimSpace(string(b)) != "true" {
		t.Fatalf("the served connection has ReadFrom: %q, want true", b)
	}
}

// TestServeBodyTimeoutEveryMethod: a slow body on a GET or a DELETE (the
// handler reads none; net/http then discards it before the next request)
// is cut after BodyTimeout like a POST's, and an event-stream-like GET
// without a body keeps its connection and context past it. Before the
// fix only POST, PUT and PATCH had a deadline: slow GETs with a
// Content-Length held their connections, and descriptors, forever.
func TestServeBodyTimeoutEveryMethod(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a, err := api.New(api.Config{Store: st, Logger: slog.New(slog.NewTextHandler(t.Output(), nil)), BodyTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.HandlePublic("DELETE /t/x", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})); err != nil {
		t.Fatal(err)
	}
	// /t/stream writes one line, then another once the test says so,
	// unless its request context was cancelled first.
	next := make(chan struct{})
	if err := a.HandlePublic("GET /t/stream", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "first\n")
		_ = http.NewResponseController(w).Flush()
		select {
		case <-next:
			fmt.Fprintf(w, "second\n")
		case <-r.Context().Done():
		}
	})); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	for _, req := range []string{
		"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789",
		"DELETE /t/x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789",
		"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n01234\r\n",
	} {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprint(c, req)
		// Generous: the cut comes 300ms after the headers; 10s only
		// bounds a test whose server never cuts.
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadAll(c); err != nil {
			t.Errorf("%q: the server did not close the slow-body connection: %v", strings.SplitN(req, "\r\n", 2)[0], err)
		}
		c.Close()
	}
	// A GET without a body outlives BodyTimeout (the event streams).
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "GET /t/stream HTTP/1.1\r\nHost: x\r\n\r\n")
	br := make([]byte, 4096)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := ""
	for !strings.Contains(got, "first") {
		n, err := c.Read(br)
		if err != nil {
			t.Fatalf("stream: %v (read %q)", err, got)
		}
		got += string(br[:n])
	}
	// Wait past BodyTimeout (3x), without asserting time: the stream must
	// still be open and its context alive afterwards.
	wait := time.NewTimer(900 * time.Millisecond)
	<-wait.C
	close(next)
	for !strings.Contains(got, "second") {
		n, err := c.Read(br)
		if err != nil {
			t.Fatalf("stream cut after BodyTimeout: %v (read %q)", err, got)
		}
		got += string(br[:n])
	}
}
