package grafana_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/deploy/grafana"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/up"
	"github.com/kvgate/kvgate/internal/uptest"
)

type dashboard struct {
	UID    string  `json:"uid"`
	Title  string  `json:"title"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
}

// exposed is every metric a server exposes, with its label names.
type exposed map[string][]string

var descRE = regexp.MustCompile(`^Desc\{fqName: "([^"]+)", .*constLabels: \{([^}]*)\}, variableLabels: \{([^}]*)\}\}$`)

// describe adds what reg describes (a metric with no series yet counts:
// the dashboard is read against what can appear).
func (e exposed) describe(t *testing.T, reg prometheus.Collector) {
	t.Helper()
	ch := make(chan *prometheus.Desc)
	go func() { reg.Describe(ch); close(ch) }()
	for d := range ch {
		m := descRE.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("unreadable descriptor %s", d)
		}
		var labels []string
		for _, part := range []string{m[2], m[3]} {
			for _, l := range strings.Split(part, ",") {
				if l = strings.TrimSpace(l); l != "" {
					l, _, _ = strings.Cut(l, "=")
					labels = append(labels, strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"))
				}
			}
		}
		e[m[1]] = append(e[m[1]], labels...)
	}
}

var sampleRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? `)

// scrape adds what a /metrics endpoint exposes.
func (e exposed) scrape(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := sampleRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		for _, pair := range strings.Split(m[2], ",") {
			if l, _, ok := strings.Cut(pair, "="); ok {
				e[m[1]] = append(e[m[1]], l)
			}
		}
		if _, ok := e[m[1]]; !ok {
			e[m[1]] = nil
		}
	}
}

// has reports whether the selected metric is exposed, a histogram's
// _bucket, _sum and _count series by its name.
func (e exposed) has(sel grafana.Selector) (labels []string, ok bool) {
	if l, ok := e[sel.Metric]; ok {
		return l, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, cut := strings.CutSuffix(sel.Metric, suffix); cut {
			if l, ok := e[base]; ok {
				if suffix == "_bucket" {
					l = append(l, "le")
				}
				return l, true
			}
		}
	}
	return nil, false
}

// TestDashboardQueriesNameExposedMetrics reads every panel's PromQL and
// checks each metric (and each label a matcher names) against what the
// servers `kvgate up` runs really expose: the ext_proc server and global
// router, the local routers and the mock workers.
func TestDashboardQueriesNameExposedMetrics(t *testing.T) {
	b, err := os.ReadFile("kvgate.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("kvgate.json: %v", err)
	}
	if d.UID == "" || d.Title == "" || len(d.Panels) == 0 {
		t.Fatalf("kvgate.json: uid %q, title %q, %d panels", d.UID, d.Title, len(d.Panels))
	}

	ctx := testenv.ContextWithTimeout(t, time.Minute)
	s := uptest.Start(t, func(c *up.Config) {
		c.Speedup, c.NumBlocks = 50, 1024
		c.Pools = []up.PoolSpec{{Name: "pool-a", Workers: 1}, {Name: "pool-b", Workers: 1}}
	})
	e := exposed{}
	e.describe(t, s.Registry)
	for _, p := range s.Pools {
		e.describe(t, p.Registry)
		for _, w := range p.Workers {
			e.scrape(t, ctx, "http://"+w.Addr+"/metrics")
		}
	}

	ids := map[int]bool{}
	queries := 0
	used := map[string]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: grid position %+v", p.Title, p.GridPos)
		}
		for _, tg := range p.Targets {
			queries++
			sels, err := grafana.MetricSelectors(tg.Expr)
			if err != nil {
				t.Errorf("panel %q: %q: %v", p.Title, tg.Expr, err)
				continue
			}
			if len(sels) == 0 {
				t.Errorf("panel %q: %q selects no metric", p.Title, tg.Expr)
			}
			for _, sel := range sels {
				labels, ok := e.has(sel)
				if !ok {
					t.Errorf("panel %q: %q: no server exposes %s", p.Title, tg.Expr, sel.Metric)
					continue
				}
				used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(sel.Metric, "_bucket"), "_sum"), "_count")] = true
				for _, l := range sel.Labels {
					if !slices.Contains(labels, l) {
						t.Errorf("panel %q: %q: %s has no label %q (labels: %v)", p.Title, tg.Expr, sel.Metric, l, labels)
					}
				}
			}
		}
	}
	t.Logf("%d panels, %d queries, %d metrics checked", len(d.Panels), queries, len(used))
	// Every kvgate_globalrouter_*, kvgate_extproc_* and kvgate_shadow_*
	// metric has a panel.
	for name := range e {
		for _, prefix := range []string{"kvgate_globalrouter_", "kvgate_extproc_", "kvgate_shadow_"} {
			if strings.HasPrefix(name, prefix) && !used[name] {
				t.Errorf("%s has no panel", name)
			}
		}
	}
}
