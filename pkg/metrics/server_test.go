package metrics_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/metrics"
)

func TestServerServesUntilCancelledThenShutsDown(t *testing.T) {
	h := newHarness(t, metrics.DefaultConfig())
	s := metrics.NewServer("127.0.0.1:0", h.m.Handler())
	if s.Addr() != "" {
		t.Fatalf("Addr %q before Listen", s.Addr())
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	addr := s.Addr()
	if !strings.HasPrefix(addr, "127.0.0.1:") || strings.HasSuffix(addr, ":0") {
		t.Fatalf("Addr %q after Listen", addr)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	if code, body := get(t, "http://"+addr+"/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, _ := get(t, "http://"+addr+"/readyz"); code != 503 {
		t.Fatalf("/readyz before a session: %d, want 503", code)
	}
	f := scrape(t, "http://"+addr)
	if f["pgoutbox_build_info"] == nil {
		t.Fatal("no pgoutbox_build_info in /metrics")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("still accepting connections after Run returned")
	}
}

// TestServerShutdownWaitsForRunningRequests: a scrape in progress when the
// context ends completes; one that outlives ShutdownTimeout is cut off.
func TestServerShutdownWaitsForRunningRequests(t *testing.T) {
	for _, c := range []struct {
		name     string
		timeout  time.Duration
		wantBody bool
	}{
		{"within the timeout", 10 * time.Second, true},
		{"past the timeout", 100 * time.Millisecond, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			entered, release := make(chan struct{}), make(chan struct{})
			slow := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				close(entered)
				<-release
				io.WriteString(w, "done")
			})
			s := metrics.NewServer("127.0.0.1:0", slow)
			s.ShutdownTimeout = c.timeout
			if err := s.Listen(); err != nil {
				t.Fatal(err)
			}
			addr := s.Addr()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			type result struct {
				body string
				err  error
			}
			got := make(chan result, 1)
			go func() {
				resp, err := http.Get("http://" + addr + "/")
				if err != nil {
					got <- result{err: err}
					return
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				got <- result{string(b), err}
			}()
			<-entered
			cancel()
			if c.wantBody {
				// Shutdown waits for the request; let it finish.
				close(release)
				if err := <-done; err != nil {
					t.Fatalf("Run: %v", err)
				}
				if r := <-got; r.err != nil || r.body != "done" {
					t.Fatalf("request during shutdown: %q, %v", r.body, r.err)
				}
				return
			}
			err := <-done
			close(release)
			if err == nil || !strings.Contains(err.Error(), "shut down") {
				t.Fatalf("Run: %v, want a shutdown timeout error", err)
			}
			if r := <-got; r.err == nil && r.body == "done" {
				t.Fatal("a request past the shutdown timeout completed")
			}
		})
	}
}

func TestServerListenErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s := metrics.NewServer(ln.Addr().String(), http.NotFoundHandler())
	if err := s.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "listen") {
		t.Fatalf("Run on a taken address: %v", err)
	}
}
