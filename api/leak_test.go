package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

const knownPassword = "Kn0wn-P4ssw0rd-must-never-leak"

// TestSecretNeverInResponses stores a known password (sealed and unsealed
// stores alike), drives every route and every error path, decodes each body
// into its v1 response type, and checks the password appears in no body, no
// header, no event and no log line. It also checks every v1 response type
// was exercised.
func TestSecretNeverInResponses(t *testing.T) {
	for _, sealed := range []bool{false, true} {
		t.Run(fmt.Sprintf("sealed=%v", sealed), func(t *testing.T) {
			opts := state.Options{}
			if sealed {
				opts.MasterKey = []byte("a-master-key-of-adequate-length")
			}
			f := newFixture(t, opts)
			ctx := context.Background()
			if _, err := f.client.PutSecret(ctx, "bmc-default", v1.SecretRequest{Username: "admin", Password: knownPassword,
				Extra: map[string]string{"community": knownPassword}}); err != nil {
				t.Fatal(err)
			}
			if _, err := f.store.CreateServer(state.Server{Name: "r1-n01", Zone: "zone-a", BootMAC: "52:54:00:00:01:01",
				BMC: state.BMCFacts{Driver: "redfish", Address: "https://10.10.0.11", Credentials: "bmc-default"}}); err != nil {
				t.Fatal(err)
			}
			if _, err := f.store.UpdateServer("r1-n01", func(s *state.Server) error {
				s.Hardware = &state.Hardware{Cores: 8, Disks: []state.Disk{{Name: "sda", SizeBytes: 1 << 40}}, NICs: []state.NIC{{Name: "eth0", MAC: "52:54:00:00:01:01"}}}
				s.Allocation = &state.Allocation{Profile: "hypervisor"}
				return nil
			}); err != nil {
				t.Fatal(err)
			}

			seen := map[reflect.Type]bool{}
			check := func(what string, body []byte, h http.Header, into any) {
				t.Helper()
				if strings.Contains(string(body), knownPassword) {
					t.Errorf("%s: body leaks the password: %s", what, body)
				}
				for k, vs := range h {
					if strings.Contains(strings.Join(vs, " "), knownPassword) {
						t.Errorf("%s: header %s leaks the password", what, k)
					}
				}
				if into == nil {
					return
				}
				if err := json.Unmarshal(body, into); err != nil {
					t.Errorf("%s: decode into %T: %v (%s)", what, into, err, body)
				}
				seen[reflect.TypeOf(into).Elem()] = true
			}
			type call struct {
				method, path, token, body string
				into                      func() any
			}
			calls := []call{
				{"GET", "/healthz", "", "", func() any { return &v1.Health{} }},
				{"GET", "/metrics", "", "", nil},
				{"GET", "/api/v1/status", f.token, "", func() any { return &v1.Status{} }},
				{"GET", "/api/v1/servers", f.token, "", func() any { return &v1.ServerList{} }},
				{"GET", "/api/v1/servers?zone=zone-a&lifecycle=new&limit=1", f.token, "", func() any { return &v1.ServerList{} }},
				{"GET", "/api/v1/servers/r1-n01", f.token, "", func() any { return &v1.Server{} }},
				{"GET", "/api/v1/servers/r1-n01/events", f.token, "", func() any { return &v1.EventList{} }},
				{"POST", "/api/v1/servers/r1-n01/transitions", f.token, `{"from":"new","to":"commissioning","reason":"leak test"}`, func() any { return &v1.Error{} }},
				{"POST", "/api/v1/servers/r1-n01/transitions", f.token, `{"from":"new","to":"commissioning"}`, func() any { return &v1.Error{} }},
				{"POST", "/api/v1/servers/r1-n01/transitions", f.token, `{"from":"new","to":"` + knownPassword + `"}`, func() any { return &v1.Error{} }},
				{"GET", "/api/v1/events", f.token, "", func() any { return &v1.EventList{} }},
				{"GET", "/api/v1/secrets", f.token, "", func() any { return &v1.SecretList{} }},
				{"PUT", "/api/v1/secrets/other", f.token, `{"username":"u","password":"` + knownPassword + `"}`, func() any { return &v1.Secret{} }},
				{"PUT", "/api/v1/secrets/bad", f.token, `{"username":"u","password":"` + knownPassword + `","bogus":"` + knownPassword + `"}`, func() any { return &v1.Error{} }},
				{"PUT", "/api/v1/secrets/bad", f.token, `{"username":"u","password":` + knownPassword + `}`, func() any { return &v1.Error{} }},
				{"PUT", "/api/v1/secrets/bad", f.token, `{"username":"u","password":["` + knownPassword + `"]}`, func() any { return &v1.Error{} }},
				{"PUT", "/api/v1/secrets/Bad_" + knownPassword, f.token, `{}`, func() any { return &v1.Error{} }},
				{"GET", "/api/v1/servers", knownPassword, "", func() any { return &v1.Error{} }},
				{"GET", "/api/v1/nothing", f.token, "", func() any { return &v1.Error{} }},
				{"PATCH", "/api/v1/secrets/bmc-default", f.token, "", func() any { return &v1.Error{} }},
				{"DELETE", "/api/v1/secrets/other", f.token, "", nil},
			}
			for _, c := range calls {
				code, h, body := f.do(t, c.method, c.path, c.token, c.body)
				var into any
				if c.into != nil {
					into = c.into()
				}
				check(fmt.Sprintf("%s %s (%d)", c.method, c.path, code), body, h, into)
			}
			// The event stream replays every event.
			req, _ := http.NewRequest("GET", f.srv.URL+"/api/v1/events/stream?after=0", nil)
			req.Header.Set("Authorization", "Bearer "+f.token)
			resp, err := f.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(resp.Body)
			last, _ := f.store.LastEventSeq()
			for {
				id, _, data := readSSE(t, br)
				var e v1.Event
				check("SSE", []byte(data), nil, &e)
				if id == fmt.Sprint(last) {
					break
				}
			}
			resp.Body.Close()
			// Events in the store and the server's logs.
			evs, _ := f.store.Events(state.EventQuery{Limit: 1000})
			for _, e := range evs {
				if strings.Contains(fmt.Sprintf("%+v", e), knownPassword) {
					t.Errorf("event leaks the password: %+v", e)
				}
			}
			if strings.Contains(f.logs.String(), knownPassword) {
				t.Errorf("logs leak the password")
			}
			// Every v1 response type was exercised.
			for _, typ := range []any{v1.Health{}, v1.Status{}, v1.ServerList{}, v1.Server{}, v1.EventList{}, v1.Event{},
				v1.SecretList{}, v1.Secret{}, v1.Error{}} {
				if !seen[reflect.TypeOf(typ)] {
					t.Errorf("response type %T not exercised", typ)
				}
			}
			// The request type redacts itself when printed.
			r := v1.SecretRequest{Username: "u", Password: knownPassword}
			for _, s := range []string{fmt.Sprint(r), fmt.Sprintf("%+v", r), fmt.Sprintf("%#v", r)} {
				if strings.Contains(s, knownPassword) {
					t.Errorf("SecretRequest prints the password: %s", s)
				}
			}
		})
	}
}
