package sim_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	"github.com/machina-metal/machina/ha"
	"github.com/machina-metal/machina/internal/peertest"
)

// monitoringDir is the monitoring kit the package installs in
// /usr/share/machina/monitoring/ (packaging/deb/nfpm.yaml).
const monitoringDir = "../../packaging/monitoring"

// TestMonitoringRulesPromtool runs Prometheus's own checker and rule unit
// tests over the shipped alerting rules: `promtool check rules` (syntax,
// PromQL, templates) and `promtool test rules` over
// machina.rules.test.yml, where every alert has input series that fire it
// and series that do not.
func TestMonitoringRulesPromtool(t *testing.T) {
	promtool := peertest.Command(t, "promtool")
	for _, args := range [][]string{
		{"check", "rules", "machina.rules.yml"},
		{"test", "rules", "machina.rules.test.yml"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, promtool, args...)
		cmd.Dir = monitoringDir
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// Every alert of the rules file has a test case that fires it.
	rules := monitoringRules(t)
	tests, err := os.ReadFile(filepath.Join(monitoringDir, "machina.rules.test.yml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		if !strings.Contains(string(tests), "alertname: "+r.Alert+"\n") {
			t.Errorf("alert %s has no firing case in machina.rules.test.yml", r.Alert)
		}
	}
}

// TestMonitoringMetricsExported scrapes the simulated lab's controller
// (its real /metrics, after the example site settled, so the executor's
// counters have series) and fails when an alerting rule or a dashboard
// panel names a metric the controller does not export, or a label that
// metric does not carry. The HA metrics are exported only by controllers
// on an etcd store; they are read from ha.NewMetrics's registry.
func TestMonitoringMetricsExported(t *testing.T) {
	r := startRig(t, rigOptions{})
	r.steady()
	code, body := r.admin("GET", "/metrics", nil)
	if code != 200 {
		t.Fatalf("GET /metrics = %d", code)
	}
	exported, err := parseExposition(string(body))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	ha.NewMetrics(reg)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		labels := exported[mf.GetName()]
		if labels == nil {
			labels = map[string]bool{}
			exported[mf.GetName()] = labels
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
	}
	// up is the scrape's own series; job and instance are target labels
	// Prometheus adds to every series.
	exported["up"] = map[string]bool{}

	var exprs []struct{ where, expr string }
	for _, r := range monitoringRules(t) {
		exprs = append(exprs, struct{ where, expr string }{"machina.rules.yml alert " + r.Alert, r.Expr})
	}
	for _, p := range monitoringDashboard(t).Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, struct{ where, expr string }{fmt.Sprintf("machina-dashboard.json panel %q", p.Title), tg.Expr})
		}
	}
	if len(exprs) < 20 {
		t.Fatalf("only %d expressions read from the kit", len(exprs))
	}
	for _, e := range exprs {
		sels, err := promqlSelectors(e.expr)
		if err != nil {
			t.Errorf("%s: %v", e.where, err)
			continue
		}
		if len(sels) == 0 {
			t.Errorf("%s: no metric in %q", e.where, e.expr)
		}
		for _, s := range sels {
			labels, ok := exported[s.name]
			if !ok {
				t.Errorf("%s: metric %s is not exported by the controller", e.where, s.name)
				continue
			}
			for _, l := range s.labels {
				if !labels[l] && l != "job" && l != "instance" {
					t.Errorf("%s: metric %s has no label %q (it has %v)", e.where, s.name, l, keys(labels))
				}
			}
		}
	}
}

// TestPromQLSelectors pins the metric-name extraction the exported-metrics
// test relies on: functions, aggregations with by/without lists, binary
// operators, ranges, numbers and strings are not metric names.
func TestPromQLSelectors(t *testing.T) {
	for _, c := range []struct {
		expr string
		want []string
	}{
		{`up{job="machina"} == 0`, []string{"up{job}"}},
		{`sum by (instance, le) (rate(a_total{x=~"a|b",y!="}"}[5m])) / on(instance) group_left(z) b > 0.25 and c >= 5`,
			[]string{"a_total{x,y}", "b", "c"}},
		{`histogram_quantile(0.99, sum without (route) (rate(d_bucket[5m] offset 1h)))`, []string{"d_bucket"}},
		{`e > 0 and time() - e > 3600`, []string{"e", "e"}},
		{`count(f) unless bool g`, []string{"f", "g"}},
	} {
		sels, err := promqlSelectors(c.expr)
		if err != nil {
			t.Errorf("promqlSelectors(%q): %v", c.expr, err)
			continue
		}
		var got []string
		for _, s := range sels {
			n := s.name
			if len(s.labels) > 0 {
				n += "{" + strings.Join(s.labels, ",") + "}"
			}
			got = append(got, n)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("promqlSelectors(%q) = %v, want %v", c.expr, got, c.want)
		}
	}
	for _, bad := range []string{`{job="x"}`, `a{b="c"`, `a{b}`, `"open`} {
		if _, err := promqlSelectors(bad); err == nil {
			t.Errorf("promqlSelectors(%q) = nil error", bad)
		}
	}
}

type alertRule struct {
	Alert string `json:"alert"`
	Expr  string `json:"expr"`
}

func monitoringRules(t *testing.T) []alertRule {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(monitoringDir, "machina.rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []alertRule `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("machina.rules.yml: %v", err)
	}
	var out []alertRule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	if len(out) == 0 {
		t.Fatal("machina.rules.yml: no rules")
	}
	return out
}

type dashboard struct {
	UID    string `json:"uid"`
	Panels []struct {
		ID      int    `json:"id"`
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

func monitoringDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(monitoringDir, "machina-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("machina-dashboard.json: %v", err)
	}
	if d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("machina-dashboard.json: no uid or no panels")
	}
	return d
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// parseExposition reads the Prometheus text exposition format: metric
// name to the label names its samples carry.
func parseExposition(text string) (map[string]map[string]bool, error) {
	out := map[string]map[string]bool{}
	for n, line := range strings.Split(text, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		end := strings.IndexAny(line, "{ ")
		if end <= 0 {
			return nil, fmt.Errorf("exposition line %d: %q", n+1, line)
		}
		name := line[:end]
		labels := out[name]
		if labels == nil {
			labels = map[string]bool{}
			out[name] = labels
		}
		if line[end] != '{' {
			continue
		}
		names, _, err := scanMatchers(line, end)
		if err != nil {
			return nil, fmt.Errorf("exposition line %d: %w", n+1, err)
		}
		for _, l := range names {
			labels[l] = true
		}
	}
	return out, nil
}

// selector is one vector selector of a PromQL expression: the metric name
// and the label names of its matchers.
type selector struct {
	name   string
	labels []string
}

// promqlSelectors returns the vector selectors of expr in order. It knows
// PromQL's lexical shape (strings, ranges, numbers, durations, keywords,
// aggregation operators with by/without lists, vector matching with
// on/ignoring/group_left/group_right lists, function calls); it is not a
// full parser, which TestMonitoringRulesPromtool's promtool run is.
func promqlSelectors(expr string) ([]selector, error) {
	keywords := map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true,
		"Inf": true, "NaN": true, "inf": true, "nan": true}
	lists := map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}
	aggregations := map[string]bool{"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
		"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true}
	var out []selector
	i := 0
	skipSpace := func() {
		for i < len(expr) && strings.ContainsRune(" \t\r\n", rune(expr[i])) {
			i++
		}
	}
	for i < len(expr) {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			j, err := skipString(expr, i)
			if err != nil {
				return nil, err
			}
			i = j
		case c == '[':
			j := strings.IndexByte(expr[i:], ']')
			if j < 0 {
				return nil, fmt.Errorf("unclosed [ at %d", i)
			}
			i += j + 1
		case c == '{':
			return nil, fmt.Errorf("selector without a metric name at %d", i)
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isIdent(expr[i]) || expr[i] == '.') {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(expr) && isIdent(expr[j]) {
				j++
			}
			word := expr[i:j]
			i = j
			skipSpace()
			switch {
			case lists[word]:
				if i < len(expr) && expr[i] == '(' {
					k := strings.IndexByte(expr[i:], ')')
					if k < 0 {
						return nil, fmt.Errorf("unclosed %s list", word)
					}
					i += k + 1
				}
			case keywords[word], aggregations[word]:
			case i < len(expr) && expr[i] == '(': // a function call
			default:
				s := selector{name: word}
				if i < len(expr) && expr[i] == '{' {
					names, end, err := scanMatchers(expr, i)
					if err != nil {
						return nil, err
					}
					s.labels, i = names, end
				}
				out = append(out, s)
			}
		default:
			i++
		}
	}
	return out, nil
}

// scanMatchers reads the label matchers (or exposition labels) of the
// {...} starting at s[i]: the label names and the index after '}'.
func scanMatchers(s string, i int) ([]string, int, error) {
	var names []string
	i++ // {
	for {
		for i < len(s) && (s[i] == ' ' || s[i] == ',') {
			i++
		}
		if i >= len(s) {
			return nil, 0, fmt.Errorf("unclosed { in %q", s)
		}
		if s[i] == '}' {
			return names, i + 1, nil
		}
		j := i
		for j < len(s) && isIdent(s[j]) {
			j++
		}
		if j == i {
			return nil, 0, fmt.Errorf("bad label name at %d in %q", i, s)
		}
		names = append(names, s[i:j])
		for j < len(s) && s[j] == ' ' {
			j++
		}
		k := j
		for k < len(s) && strings.IndexByte("=!~", s[k]) >= 0 {
			k++
		}
		if k == j || k >= len(s) || (s[k] != '"' && s[k] != '\'' && s[k] != '`') {
			return nil, 0, fmt.Errorf("bad matcher at %d in %q", j, s)
		}
		end, err := skipString(s, k)
		if err != nil {
			return nil, 0, err
		}
		i = end
	}
}

// skipString returns the index after the quoted string starting at s[i].
func skipString(s string, i int) (int, error) {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch {
		case s[j] == '\\' && q != '`':
			j++
		case s[j] == q:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unclosed string at %d in %q", i, s)
}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func isIdent(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }
