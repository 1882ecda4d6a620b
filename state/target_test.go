package state_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/machina-metal/machina/state"
)

// TestParseEtcdTarget: hosts become endpoints (default port 2379; https
// with TLS files), the path the prefix; bad URLs are refused naming the
// part at fault, a password without echoing it.
func TestParseEtcdTarget(t *testing.T) {
	for _, c := range []struct {
		in      string
		eps     []string
		prefix  string
		wantErr string
	}{
		{"etcd://h1:2379,h2:2379,h3/machina", []string{"http://h1:2379", "http://h2:2379", "http://h3:2379"}, "/machina/", ""},
		{"etcd://127.0.0.1:1234/sites/a/", []string{"http://127.0.0.1:1234"}, "/sites/a/", ""},
		{"etcd://h1", []string{"http://h1:2379"}, "/machina/", ""},
		{"etcd://h1//", []string{"http://h1:2379"}, "/machina/", ""},
		{"etcd://user:hunter2@h1/x", nil, "", "secrets never in argv"},
		{"etcd://h1,,h2/x", nil, "", "empty host"},
		{"etcd://h1/x?token=1", nil, "", "unknown query parameter"},
		{"etcd://h1/x?cert=/c.pem", nil, "", "needs both cert and key"},
		{"/var/lib/machina/state.db", nil, "", "want etcd://"},
	} {
		cfg, _, err := state.ParseEtcdTarget(c.in, state.EtcdTLSFiles{})
		if c.wantErr != "" {
			if err == nil || !errors.Is(err, state.ErrInvalid) || !contains(err.Error(), c.wantErr) || contains(err.Error(), "hunter2") {
				t.Errorf("%s: err = %v, want %q", c.in, err, c.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(cfg.Endpoints, c.eps) || cfg.Prefix != c.prefix || cfg.TLS != nil {
			t.Errorf("%s = %v %q %v, %v", c.in, cfg.Endpoints, cfg.Prefix, cfg.TLS, err)
		}
	}
	if _, _, err := state.ParseEtcdTarget("etcd://h1/x", state.EtcdTLSFiles{CAFile: "/nonexistent/ca.pem"}); err == nil {
		t.Error("a missing CA file was accepted")
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
