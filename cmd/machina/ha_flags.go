package main

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/spf13/pflag"

	"github.com/machina-metal/machina/controller"
	"github.com/machina-metal/machina/ha"
	"github.com/machina-metal/machina/namerule"
	"github.com/machina-metal/machina/state"
)

// haFlags are machina serve's high-availability flags (docs/ha.md), each
// also read from MACHINA_<FLAG> (MACHINA_HA_ID, ...).
type haFlags struct {
	id, adminURL, vip, vipIf string
	ttl                      time.Duration
	group                    string   // --group: this controller's group on a sharded site
	zones                    []string // --zones: the group's zones
}

func addHAFlags(f *pflag.FlagSet, h *haFlags) {
	f.StringVar(&h.id, "ha-id", "", "run as one controller of a group on etcd (needs --state etcd://…): this controller's unique id, e.g. its host name; only the elected leader acts")
	f.DurationVar(&h.ttl, "ha-ttl", 10*time.Second, "leader election lease TTL, whole seconds: a leader cut off etcd steps down within it, a standby takes over about one TTL after the leader died")
	f.StringVar(&h.adminURL, "ha-admin-url", "", "this controller's admin API URL as the other controllers reach it (standbys forward writes there); empty: the admin TLS listener's URL")
	f.StringVar(&h.vip, "vip", "", "provisioning virtual IP ADDR/PREFIX (IPv4) the leader adds to --vip-interface and announces with gratuitous ARP; the DHCP server answers as it (option 54, siaddr)")
	f.StringVar(&h.vipIf, "vip-interface", "", "interface that carries --vip (the provisioning interface)")
	f.StringVar(&h.group, "group", "", "sharding (docs/ha.md): the controller group this controller belongs to, an RFC 1123 label; the group plans only --zones, has its own leader and writes status under status/GROUP/ (needs --ha-id and --zones)")
	f.StringSliceVar(&h.zones, "zones", nil, "sharding: the zones of the inventory the --group plans, comma-separated RFC 1123 labels (servers.yaml zone names); a zone another group claims too is refused for both")
}

// checkGroup checks --group and --zones and fills cc.Group and cc.Zones.
func (h haFlags) checkGroup(cc *controller.Config) error {
	if h.group == "" {
		if len(h.zones) > 0 {
			return errors.New("--zones needs --group: name the controller group that plans them")
		}
		return nil
	}
	if h.id == "" {
		return errors.New("--group needs --ha-id (and --state etcd://…): the group's leader election and zone claims live in etcd")
	}
	if err := namerule.Label.Check(h.group); err != nil {
		return fmt.Errorf("--group %q: want %s", h.group, namerule.Label.What)
	}
	if len(h.zones) == 0 {
		return fmt.Errorf("--group %s needs --zones: the zones it plans", h.group)
	}
	seen := map[string]bool{}
	for _, z := range h.zones {
		if !namerule.Label.Valid(z) {
			return fmt.Errorf("--zones: zone %q: want %s, as servers.yaml's zone", z, namerule.Label.What)
		}
		if seen[z] {
			return fmt.Errorf("--zones: zone %s given twice", z)
		}
		seen[z] = true
	}
	cc.Group, cc.Zones = h.group, h.zones
	return nil
}

// config checks the flags against the state target and returns the HA
// configuration, nil when --ha-id is not set (a single controller).
func (h haFlags) config(statePath string, set func(name string) bool) (*controller.HAConfig, error) {
	if h.id == "" {
		for _, n := range []string{"ha-ttl", "ha-admin-url", "vip", "vip-interface"} {
			if set(n) {
				return nil, fmt.Errorf("--%s needs --ha-id (and --state etcd://…)", n)
			}
		}
		return nil, nil
	}
	if !state.IsEtcdTarget(statePath) {
		return nil, fmt.Errorf("--ha-id needs the state in etcd: --state %sHOST:PORT[,HOST:PORT]/PREFIX, not a bbolt file", state.EtcdScheme)
	}
	if h.ttl < time.Second || h.ttl%time.Second != 0 {
		return nil, fmt.Errorf("--ha-ttl %s: want whole seconds, at least 1s", h.ttl)
	}
	cfg := &controller.HAConfig{ID: h.id, TTL: h.ttl, AdminURL: h.adminURL}
	if (h.vip == "") != (h.vipIf == "") {
		return nil, errors.New("--vip and --vip-interface go together")
	}
	if h.vip != "" {
		p, err := netip.ParsePrefix(h.vip)
		if err != nil {
			return nil, fmt.Errorf("--vip %q: want ADDR/PREFIX, e.g. 10.10.0.2/24: %v", h.vip, err)
		}
		vc := &ha.VIPConfig{Prefix: p, Interface: h.vipIf}
		if _, err := ha.NewVIP(*vc); err != nil {
			return nil, fmt.Errorf("--vip: %w", err)
		}
		cfg.VIP = vc
	}
	return cfg, nil
}

// checkServeFlags checks the reconciler's plan flags and the HA flags of
// machina serve and fills cc.HA (and, with a VIP, the DHCP server's
// address: option 54 and siaddr follow the leader). changed reports
// whether a flag was given.
func checkServeFlags(cc *controller.Config, h haFlags, statePath string, changed func(string) bool) error {
	if share := cc.Reconciler.Plan.BrakeShare; !(share > 0 && share <= 1) {
		return fmt.Errorf("--brake-share %v: want a share above 0 and at most 1 (0.2 is 20%% of the fleet)", share)
	}
	if cc.Reconciler.Plan.DeployTimeout <= 0 {
		return fmt.Errorf("--deploy-timeout %s: want a positive duration", cc.Reconciler.Plan.DeployTimeout)
	}
	if h.id != "" && cc.Repo.URL == "" {
		return usageError{errors.New("--ha-id needs --repo: only the full controller runs in a group")}
	}
	ha, err := h.config(statePath, changed)
	if err != nil {
		return usageError{err}
	}
	cc.HA = ha
	if err := h.checkGroup(cc); err != nil {
		return usageError{err}
	}
	if ha != nil && ha.VIP != nil {
		cc.Netboot.ServerIP = ha.VIP.Prefix.Addr()
	}
	return nil
}
