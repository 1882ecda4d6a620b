package main

import (
	"errors"
	"testing"
	"time"
)

func TestParseCmdline(t *testing.T) {
	c, err := parseCmdline("console=ttyS0 quiet machina.url=http://10.0.2.100:8080/ machina.token=abcDEF123456 machina.mode=deploy BOOTIF=01-52-54-00-12-34-56 machina.entropy_wait=3s")
	if err != nil {
		t.Fatal(err)
	}
	if c.URL != "http://10.0.2.100:8080" || c.Token != "abcDEF123456" || c.Mode != "deploy" || c.MAC.String() != "52:54:00:12:34:56" || c.Final != "reboot" || c.EntropyWait != 3*time.Second {
		t.Errorf("parseCmdline = %+v", c)
	}
	c, err = parseCmdline("machina.url=https://ctl machina.token=abcdefgh machina.mac=52:54:00:AA:bb:cc")
	if err != nil || c.Mode != "commission" || c.Final != "poweroff" || c.MAC.String() != "52:54:00:aa:bb:cc" || c.LLDPWait != 0 {
		t.Errorf("parseCmdline = %+v, %v", c, err)
	}
	// A release wipe may zero or erase a large disk for hours: its session
	// bound is 24 h unless the line sets one.
	if c, err := parseCmdline("machina.url=http://x machina.token=abcdefgh machina.mode=wipe"); err != nil || c.Timeout != 24*time.Hour || c.Final != "poweroff" {
		t.Errorf("wipe: timeout %s final %s, %v; want 24h, poweroff", c.Timeout, c.Final, err)
	}
	if c, err := parseCmdline("machina.url=http://x machina.token=abcdefgh machina.mode=wipe machina.timeout=3h"); err != nil || c.Timeout != 3*time.Hour {
		t.Errorf("wipe with machina.timeout=3h: %s, %v", c.Timeout, err)
	}
	if c.Timeout != 2*time.Hour {
		t.Errorf("commission timeout %s, want 2h", c.Timeout)
	}
	for v, want := range map[string]time.Duration{"45s": 45 * time.Second, "0": -1} {
		if c, err := parseCmdline("machina.url=https://ctl machina.token=abcdefgh machina.lldp_wait=" + v); err != nil || c.LLDPWait != want {
			t.Errorf("machina.lldp_wait=%s: LLDPWait = %v, %v; want %v", v, c.LLDPWait, err, want)
		}
	}
	for _, bad := range []string{
		"",
		"machina.url=http://x",
		"machina.url=ftp://x machina.token=abcdefgh",
		"machina.url=http://u:p@x machina.token=abcdefgh",
		"machina.url=http://x machina.token=a;rm",
		"machina.url=http://x machina.token=abcdefgh machina.mode=shell",
		"machina.url=http://x machina.token=abcdefgh BOOTIF=52-54-00-12-34-56",
		"machina.url=http://x machina.token=abcdefgh machina.mac=zz",
		"machina.url=http://x machina.token=abcdefgh machina.entropy_wait=1h",
		"machina.url=http://x machina.token=abcdefgh machina.lldp_wait=1h",
		"machina.url=http://x machina.token=abcdefgh machina.lldp_wait=-1s",
	} {
		if _, err := parseCmdline(bad); !errors.Is(err, errCmdline) {
			t.Errorf("parseCmdline(%q) err = %v, want errCmdline", bad, err)
		}
	}
}

func FuzzParseCmdline(f *testing.F) {
	f.Add("machina.url=http://10.0.2.100:8080 machina.token=abcdefgh BOOTIF=01-52-54-00-12-34-56")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := parseCmdline(s)
		if err == nil && (c.URL == "" || c.Token == "") {
			t.Errorf("accepted without url/token: %q", s)
		}
	})
}
