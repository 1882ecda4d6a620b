package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/console"
)

func TestEscapeFilter(t *testing.T) {
	cases := []struct {
		chunks []string
		want   string
		leave  bool
	}{
		{[]string{"ls\r"}, "ls\r", false},
		{[]string{"~."}, "", true},
		{[]string{"ls\r~.rest"}, "ls\r", true},
		{[]string{"ls\r~", ".x"}, "ls\r", true},
		{[]string{"a~.b"}, "a~.b", false},
		{[]string{"\n~~x"}, "\n~x", false},
		{[]string{"\r~a"}, "\r~a", false},
	}
	for _, tc := range cases {
		f := &escapeFilter{atLineStart: true}
		var got []byte
		leave := false
		for _, c := range tc.chunks {
			out, l := f.filter([]byte(c))
			got = append(got, out...)
			if l {
				leave = true
				break
			}
		}
		if string(got) != tc.want || leave != tc.leave {
			t.Errorf("filter(%q) = %q, %v; want %q, %v", tc.chunks, got, leave, tc.want, tc.leave)
		}
	}
}

// FuzzEscapeFilter: the result does not depend on how input is split into
// reads (one chunk or byte by byte).
func FuzzEscapeFilter(f *testing.F) {
	f.Add([]byte("ls\r~.x"))
	f.Add([]byte("~~\n~a"))
	f.Fuzz(func(t *testing.T, in []byte) {
		whole := &escapeFilter{atLineStart: true}
		out1, leave1 := whole.filter(in)
		bytewise := &escapeFilter{atLineStart: true}
		var out2 []byte
		leave2 := false
		for _, c := range in {
			o, l := bytewise.filter([]byte{c})
			out2 = append(out2, o...)
			if l {
				leave2 = true
				break
			}
		}
		if string(out1) != string(out2) || leave1 != leave2 {
			t.Errorf("filter(%q): whole = %q,%v; byte-wise = %q,%v", in, out1, leave1, out2, leave2)
		}
	})
}

// echo is a stand-in console stream.
type echo struct {
	pr *io.PipeReader
	pw *io.PipeWriter
}

func (e echo) Read(p []byte) (int, error)  { return e.pr.Read(p) }
func (e echo) Write(p []byte) (int, error) { return e.pw.Write(p) }
func (e echo) Close() error                { e.pw.Close(); return e.pr.Close() }

type redfishOnly struct{ bmc.Driver }

func consoleServer(t *testing.T) *httptest.Server {
	h, err := console.New(console.Config{
		Opener: console.DriverOpener(func(ctx context.Context, name string) (bmc.Driver, error) {
			if name == "rf-1" {
				return redfishOnly{}, nil
			}
			return nil, console.ErrServerNotFound
		}),
		Authenticate: func(r *http.Request) (string, error) {
			if r.Header.Get("Authorization") != "Bearer tok" {
				return "", errors.New("bad token")
			}
			return "op", nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	echoH, err := console.New(console.Config{
		Opener: console.OpenerFunc(func(ctx context.Context, name string) (io.ReadWriteCloser, error) {
			pr, pw := io.Pipe()
			return echo{pr, pw}, nil
		}),
		Authenticate: func(r *http.Request) (string, error) { return "op", nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /api/v1/servers/node-1/console", echoH)
	mux.Handle(console.Pattern, h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// TestConsoleVerbRoundTripAndEscape: typed bytes come back through the API,
// and "~." at line start detaches with exit code 0.
func TestConsoleVerbRoundTripAndEscape(t *testing.T) {
	srv := consoleServer(t)
	t.Setenv("MACHINA_TOKEN", "tok")
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	var stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(t.Context(), []string{"console", "node-1", "--api", srv.URL}, inR, outW, &stderr)
		outW.Close()
	}()
	if _, err := inW.Write([]byte("hello\r")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len("hello\r"))
	if _, err := io.ReadFull(outR, got); err != nil || string(got) != "hello\r" {
		t.Fatalf("echo = %q, %v", got, err)
	}
	if _, err := inW.Write([]byte("~.")); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, outR)
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit code %d, stderr %q", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("console did not detach on ~.")
	}
}

func TestConsoleVerbErrors(t *testing.T) {
	srv := consoleServer(t)
	cases := []struct {
		args  []string
		token string
		code  int
		msg   string
	}{
		{[]string{"console", "rf-1", "--api", srv.URL}, "tok", 1, "not supported by this BMC"},
		{[]string{"console", "rf-1", "--api", srv.URL}, "wrong", 1, "401"},
		{[]string{"console", "rf-1", "--api", srv.URL}, "", 2, "MACHINA_TOKEN"},
		{[]string{"console", "rf-1"}, "tok", 2, "no API URL"},
		{[]string{"console", "a/b", "--api", srv.URL}, "tok", 2, "invalid server name"},
	}
	for _, tc := range cases {
		t.Setenv("MACHINA_TOKEN", tc.token)
		t.Setenv("MACHINA_API", "")
		var stdout, stderr bytes.Buffer
		code := run(t.Context(), tc.args, strings.NewReader(""), &stdout, &stderr)
		if code != tc.code || !strings.Contains(stderr.String(), tc.msg) {
			t.Errorf("%q with token %q: exit %d, stderr %q; want %d containing %q", tc.args, tc.token, code, stderr.String(), tc.code, tc.msg)
		}
	}
}
