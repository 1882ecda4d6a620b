package main

import (
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
)

// TestFromWireKeepsBootFetch: the plan machinactl computes from the API
// sees the server's last boot file fetch, from which it tells BootStalled
// from MachineSilent as the controller does.
func TestFromWireKeepsBootFetch(t *testing.T) {
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	s := fromWire(v1.Server{Name: "x1", LastHeard: "boot file fetched: /boot/ramdisk/vmlinuz by http", LastHeardAt: at,
		BootFetch: &v1.BootFetch{File: "/boot/ramdisk/vmlinuz", Via: "http", At: at}})
	if f := s.BootFetch; f == nil || f.File != "/boot/ramdisk/vmlinuz" || f.Via != "http" || f.SecureBoot || !f.At.Equal(s.LastHeardAt) {
		t.Fatalf("fromWire boot fetch = %+v", f)
	}
}
