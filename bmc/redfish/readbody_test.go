package redfish

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestReadBody: a body of its announced Content-Length is read into one
// buffer of that size (plus the byte the EOF read needs); a body longer
// or shorter than announced, or without a length, is still read whole;
// one longer than maxBody is cut at maxBody.
func TestReadBody(t *testing.T) {
	resp := func(body string, length int64) *http.Response {
		return &http.Response{Body: io.NopCloser(strings.NewReader(body)), ContentLength: length}
	}
	sys := strings.Repeat(`{"PowerState":"On"}`, 300)
	for _, tc := range []struct {
		name   string
		body   string
		length int64
	}{
		{"announced", sys, int64(len(sys))},
		{"longer than announced", sys, 100},
		{"shorter than announced", sys, int64(len(sys)) + 50},
		{"unknown length", sys, -1},
		{"empty", "", 0},
	} {
		got, err := readBody(resp(tc.body, tc.length))
		if err != nil || string(got) != tc.body {
			t.Errorf("%s: read %d bytes, err %v; want the %d-byte body", tc.name, len(got), err, len(tc.body))
		}
		if tc.name == "announced" && cap(got) != len(sys)+1 {
			t.Errorf("announced: buffer capacity %d, want %d (one allocation of the announced size)", cap(got), len(sys)+1)
		}
	}
	huge := bytes.Repeat([]byte{'x'}, maxBody+10)
	for _, length := range []int64{int64(len(huge)), -1} {
		got, err := readBody(&http.Response{Body: io.NopCloser(bytes.NewReader(huge)), ContentLength: length})
		if err != nil || len(got) != maxBody {
			t.Errorf("Content-Length %d over the cap: read %d bytes, err %v; want %d", length, len(got), err, maxBody)
		}
	}
	r := strings.NewReader(sys)
	rs := &http.Response{Body: io.NopCloser(r), ContentLength: int64(len(sys))}
	if a := testing.AllocsPerRun(20, func() { r.Reset(sys); _, _ = readBody(rs) }); a > 2 {
		t.Errorf("readBody of an announced %d-byte body made %.0f allocations, want at most 2 (the limit reader and the buffer)", len(sys), a)
	}
}
