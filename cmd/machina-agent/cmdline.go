package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"
	"time"
)

// bootConfig is what the agent reads from the kernel command line
// (/proc/cmdline). The controller's iPXE script writes it:
//
//	machina.url=http://10.0.0.1:8080   controller base URL (http or https)
//	machina.token=<token>              single-use token (never logged)
//	machina.mode=commission|deploy|wipe what to do (default commission)
//	BOOTIF=01-52-54-00-12-34-56        boot NIC, pxelinux/iPXE form, or
//	machina.mac=52:54:00:12:34:56      the same in colon form
//	machina.final=poweroff|reboot|wait what to do at the end (default:
//	                                   poweroff after commission and wipe, reboot after deploy)
//	machina.entropy_wait=10s           bound on waiting for the kernel CRNG
//	machina.timeout=2h                 bound on the whole session after DHCP
//	                                   (default 2h; 24h in wipe mode, where a
//	                                   zero or drive erase of a large disk
//	                                   takes hours and the controller's wipe
//	                                   deadline, counted from the erase's
//	                                   last progress, bounds it)
//	machina.lldp_wait=32s              bound on the LLDP listen of commissioning (0 turns it off)
type bootConfig struct {
	URL         string
	Token       string
	Mode        string
	MAC         net.HardwareAddr
	Final       string
	EntropyWait time.Duration
	Timeout     time.Duration
	// LLDPWait is agent.Runner.LLDPWait: zero the default, negative off.
	LLDPWait time.Duration
}

// errCmdline is wrapped by every parseCmdline error.
var errCmdline = errors.New("kernel command line")

var tokenRe = regexp.MustCompile(`^[A-Za-z0-9._~-]{8,256}$`)

// parseCmdline parses the kernel command line. Unknown words are ignored
// (the kernel's own parameters share the line); known ones are validated.
func parseCmdline(s string) (bootConfig, error) {
	c := bootConfig{Mode: "commission", EntropyWait: 10 * time.Second, Timeout: 2 * time.Hour}
	timeoutSet := false
	if len(s) > 4096 {
		return c, fmt.Errorf("%w: longer than 4096 bytes", errCmdline)
	}
	for _, w := range strings.Fields(s) {
		k, v, _ := strings.Cut(w, "=")
		switch k {
		case "machina.url":
			u, err := url.Parse(v)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" {
				return c, fmt.Errorf("%w: machina.url must be an http(s) base URL", errCmdline)
			}
			c.URL = strings.TrimRight(v, "/")
		case "machina.token":
			if !tokenRe.MatchString(v) {
				return c, fmt.Errorf("%w: machina.token malformed", errCmdline)
			}
			c.Token = v
		case "machina.mode":
			if v != "commission" && v != "deploy" && v != "wipe" {
				return c, fmt.Errorf("%w: machina.mode %q", errCmdline, v)
			}
			c.Mode = v
		case "machina.final":
			if v != "poweroff" && v != "reboot" && v != "wait" {
				return c, fmt.Errorf("%w: machina.final %q", errCmdline, v)
			}
			c.Final = v
		case "machina.entropy_wait":
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 || d > 10*time.Minute {
				return c, fmt.Errorf("%w: machina.entropy_wait %q", errCmdline, v)
			}
			c.EntropyWait = d
		case "machina.timeout":
			d, err := time.ParseDuration(v)
			if err != nil || d < time.Minute || d > 24*time.Hour {
				return c, fmt.Errorf("%w: machina.timeout %q (1m..24h)", errCmdline, v)
			}
			c.Timeout, timeoutSet = d, true
		case "machina.lldp_wait":
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 || d > 10*time.Minute {
				return c, fmt.Errorf("%w: machina.lldp_wait %q (0..10m)", errCmdline, v)
			}
			c.LLDPWait = d
			if d == 0 {
				c.LLDPWait = -1 // asked off
			}
		case "machina.mac", "BOOTIF":
			m := v
			if k == "BOOTIF" {
				// "01-aa-bb-cc-dd-ee-ff": ARP hardware type 1 (Ethernet), then the MAC.
				rest, ok := strings.CutPrefix(v, "01-")
				if !ok {
					return c, fmt.Errorf("%w: BOOTIF %q is not 01-xx-xx-xx-xx-xx-xx", errCmdline, v)
				}
				m = strings.ReplaceAll(rest, "-", ":")
			}
			hw, err := net.ParseMAC(m)
			if err != nil || len(hw) != 6 {
				return c, fmt.Errorf("%w: %s %q is not a MAC", errCmdline, k, v)
			}
			c.MAC = hw
		}
	}
	if c.URL == "" || c.Token == "" {
		return c, fmt.Errorf("%w: machina.url and machina.token are required", errCmdline)
	}
	if c.Final == "" {
		c.Final = map[string]string{"commission": "poweroff", "deploy": "reboot", "wipe": "poweroff"}[c.Mode]
	}
	if c.Mode == "wipe" && !timeoutSet {
		c.Timeout = 24 * time.Hour
	}
	return c, nil
}
