package ipmi

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
)

// TestPowerWaitSaysBMCStoppedAnswering: a BMC that takes the power-on
// command, does nothing and then stops answering (its Get Chassis Status
// responses dropped by the proxy from the command on) is reported as a BMC
// that stopped answering, wrapping ErrTimeout and ErrUnreachable, not as
// "read off": that reading is stale. Before, the error said "wanted power
// on, read off".
func TestPowerWaitSaysBMCStoppedAnswering(t *testing.T) {
	s := startSim(t)
	if err := os.WriteFile(filepath.Join(s.dir, "stuck"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, s.port, "admin", "password")
	d := newDriver(t, "127.0.0.1:"+itoa(p.port()), "admin", "password", func(c *Config) { c.PowerTimeout = 2 * time.Second })
	ctx := testCtx(t)
	if st, err := d.PowerState(ctx); err != nil || st != bmc.PowerOff {
		t.Fatalf("PowerState = %v, %v; want off", st, err)
	}
	before := len(p.sent(0x00, 0x02))
	done := make(chan struct{})
	go func() { // from the Chassis Control on, no status answers
		defer close(done)
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if len(p.sent(0x00, 0x02)) > before {
				p.set(func(p *proxy) { p.dropResponses = 1 << 30 })
				return
			}
		}
	}()
	err := d.Power(ctx, bmc.PowerActionOn)
	<-done
	if !errors.Is(err, bmc.ErrTimeout) || !errors.Is(err, bmc.ErrUnreachable) || !strings.Contains(err.Error(), "stopped answering") {
		t.Fatalf("Power(on) with the BMC gone silent = %v; want ErrTimeout and ErrUnreachable saying it stopped answering", err)
	}
	if strings.Contains(err.Error(), "read off after") {
		t.Errorf("error %q reports a stale reading as the state", err)
	}
}
