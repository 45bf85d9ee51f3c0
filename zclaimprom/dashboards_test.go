package zclaimprom_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/zclaim/zclaim/zclaimprom"
)

// collected is the set of metric names the collector describes.
func collected(t *testing.T) map[string]bool {
	t.Helper()
	ch := make(chan *prometheus.Desc, 64)
	zclaimprom.NewCollector(zclaimprom.Options{}).Describe(ch)
	close(ch)
	names := map[string]bool{}
	fq := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	for d := range ch {
		m := fq.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("no name in %s", d)
		}
		names[m[1]] = true
	}
	return names
}

// dashboardExprs returns the PromQL of every panel of the Grafana
// dashboard, its variables filled in as Grafana would.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile("dashboards/zclaim.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct{ List []struct{ Definition string } }
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("dashboards/zclaim.json: %v", err)
	}
	var out []string
	fill := strings.NewReplacer("$__rate_interval", "5m", "$key", ".*")
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out = append(out, fill.Replace(tg.Expr))
		}
	}
	if len(out) < 10 {
		t.Fatalf("the dashboard has %d queries", len(out))
	}
	return out
}

var metricName = regexp.MustCompile(`\bzclaim_[a-z_]+`)

// Every metric the dashboard and the alert rules name is one the
// collector exports (a histogram's _bucket, _sum and _count series
// included), and every metric the collector exports is on the dashboard.
func TestDashboardsNameExportedMetrics(t *testing.T) {
	t.Parallel()
	names := collected(t)
	rules, err := os.ReadFile("dashboards/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for where, text := range map[string]string{"the dashboard": strings.Join(dashboardExprs(t), "\n"),
		"the alert rules": string(rules)} {
		for _, n := range metricName.FindAllString(text, -1) {
			base := n
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(n, s); ok && names[b] {
					base = b
				}
			}
			if !names[base] {
				t.Errorf("%s names %s, which the collector does not export", where, n)
			}
			if where == "the dashboard" {
				used[base] = true
			}
		}
	}
	for n := range names {
		if !used[n] {
			t.Errorf("the dashboard shows no panel of %s", n)
		}
	}
}

// promtool (Debian's prometheus package) accepts the alert rules, and
// every query of the dashboard as a recording rule.
func TestPromtoolChecksRules(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		const install = "the rules' check needs promtool: apt-get install prometheus"
		if os.Getenv("ZCLAIM_CI") != "" {
			t.Fatal(install + " (CI runs every test)")
		}
		fmt.Fprintln(os.Stderr, install+"; TestPromtoolChecksRules is skipped")
		t.Skip(install)
	}
	if out, err := exec.Command(promtool, "check", "rules", "dashboards/alerts.yml").CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules dashboards/alerts.yml: %v\n%s", err, out)
	}
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range dashboardExprs(t) {
		q, _ := json.Marshal(e) // a JSON string is a YAML string
		fmt.Fprintf(&b, "      - record: zclaim_dashboard_query_%d\n        expr: %s\n", i, q)
	}
	f := filepath.Join(t.TempDir(), "dashboard.yml")
	if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput(); err != nil {
		t.Fatalf("promtool rejects a dashboard query: %v\n%s", err, out)
	}
}
