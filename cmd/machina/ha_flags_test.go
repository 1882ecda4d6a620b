package main

import (
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/controller"
)

func TestHAFlagsConfig(t *testing.T) {
	none := func(string) bool { return false }
	const etcd = "etcd://127.0.0.1:2379/site"
	for _, c := range []struct {
		name  string
		f     haFlags
		state string
		set   func(string) bool
		want  string // error substring; "" means ok
	}{
		{"single controller", haFlags{ttl: 10 * time.Second}, "/var/lib/machina/state.db", none, ""},
		{"vip without id", haFlags{vip: "10.0.0.2/24", vipIf: "eth0", ttl: 10 * time.Second}, etcd, func(n string) bool { return n == "vip" }, "--vip needs --ha-id"},
		{"bbolt state", haFlags{id: "a", ttl: 10 * time.Second}, "/var/lib/machina/state.db", none, "needs the state in etcd"},
		{"fractional ttl", haFlags{id: "a", ttl: 2500 * time.Millisecond}, etcd, none, "whole seconds"},
		{"vip without interface", haFlags{id: "a", ttl: 10 * time.Second, vip: "10.0.0.2/24"}, etcd, none, "go together"},
		{"bad vip", haFlags{id: "a", ttl: 10 * time.Second, vip: "10.0.0.2", vipIf: "eth0"}, etcd, none, "want ADDR/PREFIX"},
		{"ipv6 vip", haFlags{id: "a", ttl: 10 * time.Second, vip: "fd00::2/64", vipIf: "eth0"}, etcd, none, "only IPv4"},
		{"bad interface", haFlags{id: "a", ttl: 10 * time.Second, vip: "10.0.0.2/24", vipIf: "a/b"}, etcd, none, "not a valid interface name"},
		{"group", haFlags{id: "a", ttl: 3 * time.Second, vip: "10.0.0.2/24", vipIf: "eth0", adminURL: "https://a:8444"}, etcd, none, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := c.f.config(c.state, c.set)
			if c.want != "" {
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("config = %+v, %v; want error containing %q", cfg, err, c.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.f.id == "" {
				if cfg != nil {
					t.Fatalf("config = %+v, want nil for a single controller", cfg)
				}
				return
			}
			if cfg.ID != "a" || cfg.TTL != 3*time.Second || cfg.AdminURL != "https://a:8444" || cfg.VIP == nil || cfg.VIP.Prefix.String() != "10.0.0.2/24" || cfg.VIP.Interface != "eth0" {
				t.Fatalf("config = %+v (vip %+v)", cfg, cfg.VIP)
			}
		})
	}
}

// TestGroupFlags: --group and --zones go together, need --ha-id, and are
// checked by the inventory's name rule (RFC 1123 labels) before anything
// starts; a good pair fills the controller's Group and Zones.
func TestGroupFlags(t *testing.T) {
	for _, c := range []struct {
		name string
		f    haFlags
		want string
	}{
		{"zones without group", haFlags{id: "a", zones: []string{"z1"}}, "--zones needs --group"},
		{"group without ha", haFlags{group: "east", zones: []string{"z1"}}, "--group needs --ha-id"},
		{"group without zones", haFlags{id: "a", group: "east"}, "needs --zones"},
		{"bad group", haFlags{id: "a", group: "East_1", zones: []string{"z1"}}, `--group "East_1"`},
		{"bad zone", haFlags{id: "a", group: "east", zones: []string{"z1", "Z 2"}}, `zone "Z 2"`},
		{"zone twice", haFlags{id: "a", group: "east", zones: []string{"z1", "z1"}}, "given twice"},
		{"ok", haFlags{id: "a", group: "east", zones: []string{"z1", "z2"}}, ""},
		{"none", haFlags{}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var cc controller.Config
			err := c.f.checkGroup(&cc)
			if c.want != "" {
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("checkGroup = %v, want error containing %q", err, c.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cc.Group != c.f.group || strings.Join(cc.Zones, ",") != strings.Join(c.f.zones, ",") {
				t.Fatalf("config group %q zones %v", cc.Group, cc.Zones)
			}
		})
	}
}
