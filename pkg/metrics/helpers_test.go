package metrics_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pgoutbox/pgoutbox/pkg/metrics"
)

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// harness is a Metrics with its handler served over HTTP.
type harness struct {
	m   *metrics.Metrics
	reg *prometheus.Registry
	srv *httptest.Server
	clk *fakeClock
}

func newHarness(t *testing.T, cfg metrics.Config) *harness {
	t.Helper()
	h := &harness{reg: prometheus.NewRegistry(), clk: newFakeClock()}
	var err error
	h.m, err = metrics.New(h.reg, cfg, metrics.WithClock(h.clk.Now), metrics.WithVersion("v1.2.3"))
	if err != nil {
		t.Fatal(err)
	}
	h.srv = httptest.NewServer(h.m.Handler())
	t.Cleanup(h.srv.Close)
	return h
}

func get(t testing.TB, url string) (code int, body string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// scrape fetches /metrics and parses the text exposition.
func scrape(t testing.TB, base string) families {
	t.Helper()
	code, body := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return families(mfs)
}

type families map[string]*dto.MetricFamily

// find returns the series of name whose labels include want, or nil.
func (f families) find(name string, want ...string) *dto.Metric {
	mf := f[name]
	if mf == nil {
		return nil
	}
next:
	for _, m := range mf.GetMetric() {
		for i := 0; i+1 < len(want); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == want[i] && l.GetValue() == want[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return m
	}
	return nil
}

// value returns a counter's or gauge's value; -1 when the series is absent.
func (f families) value(name string, labels ...string) float64 {
	m := f.find(name, labels...)
	switch {
	case m == nil:
		return -1
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return -1
}

// wantValues checks each named counter's or gauge's value.
func (f families) wantValues(t testing.TB, want map[string]float64) {
	t.Helper()
	for name, w := range want {
		if got := f.value(name); got != w {
			t.Errorf("%s = %v, want %v", name, got, w)
		}
	}
}

// sum adds a counter's or gauge's series.
func (f families) sum(name string) float64 {
	var s float64
	if mf := f[name]; mf != nil {
		for _, m := range mf.GetMetric() {
			if m.Counter != nil {
				s += m.Counter.GetValue()
			}
			if m.Gauge != nil {
				s += m.Gauge.GetValue()
			}
		}
	}
	return s
}

// labelValues lists a label's values across a family's series.
func (f families) labelValues(name, label string) []string {
	var out []string
	if mf := f[name]; mf != nil {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					out = append(out, l.GetValue())
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

func (f families) histogram(name string) *dto.Histogram {
	if m := f.find(name); m != nil {
		return m.Histogram
	}
	return nil
}
