package ipxe

import (
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/boot"
)

// TestLLDPWaitOnKernelLine: Config.LLDPWait reaches a commissioning
// ramdisk's kernel command line as machina.lldp_wait= (x86_64 and arm64),
// a negative one as 0s (the agent's "off"), none without it and none on a
// deploy script; over 10 minutes or a fraction of a second (Duration's
// "µs" is no kernel-argument character) is refused.
func TestLLDPWaitOnKernelLine(t *testing.T) {
	var look boot.MemLookup
	_ = look.Set(boot.Assignment{MAC: mustMAC(t, "52:54:00:00:0c:01"), Lifecycle: boot.LifecycleCommissioning, Mode: boot.ModeBIOS})
	for _, tc := range []struct {
		wait time.Duration
		want string
	}{{45 * time.Second, " machina.lldp_wait=45s "}, {-1, " machina.lldp_wait=0s "}, {0, ""}} {
		_, srv := newTestHandler(t, Config{Lookup: &look, Tokens: &seqTokens{}, LLDPWait: tc.wait})
		for _, arch := range []string{"x86_64", "arm64"} {
			_, body := get(t, srv.URL+"/boot/ipxe?mac=52:54:00:00:0c:01&platform=pcbios&arch="+arch)
			if got := strings.Contains(body, "machina.lldp_wait="); got != (tc.want != "") || (tc.want != "" && !strings.Contains(body, tc.want)) {
				t.Errorf("LLDPWait %v, %s script:\n%s\nwant %q", tc.wait, arch, body, tc.want)
			}
		}
	}
	_ = look.Set(boot.Assignment{MAC: mustMAC(t, "52:54:00:00:0c:02"), Lifecycle: boot.LifecycleDeploying, Mode: boot.ModeBIOS})
	_, srv := newTestHandler(t, Config{Lookup: &look, Tokens: &seqTokens{}, LLDPWait: time.Minute})
	if _, body := get(t, srv.URL+"/boot/ipxe?mac=52:54:00:00:0c:02&platform=pcbios"); !strings.Contains(body, "machina.mode=deploy") || strings.Contains(body, "lldp_wait") {
		t.Errorf("deploy script:\n%s\nwant no machina.lldp_wait", body)
	}
	for _, bad := range []time.Duration{11 * time.Minute, 1500 * time.Microsecond} {
		if _, err := New(Config{Lookup: &look, Tokens: &seqTokens{}, ControllerURL: "http://10.99.0.1:8080", LLDPWait: bad}); err == nil {
			t.Errorf("LLDPWait %v accepted", bad)
		}
	}
}
