package kafka

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

func TestValidateCheckTopicsReportsPartitionsAndMissingTopics(t *testing.T) {
	env := testenv.Require(t)
	present := testenv.UniqueName(t, "inspect")
	missing := testenv.UniqueName(t, "inspect_missing")
	env.CreateTopic(t, present, 3)

	cfg := Config{Brokers: env.KafkaBrokers}
	// auto.create.topics on must not matter: asking never creates.
	cfg.AutoCreateTopics = true
	got, err := CheckTopics(context.Background(), cfg, []string{missing, present})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("got %d states, want 2: %+v", len(got), got)
	}
	if got[0].Topic != missing || !errors.Is(got[0].Err, ErrTopicMissing) || got[0].Partitions != 0 {
		t.Errorf("missing topic: got %+v, want ErrTopicMissing", got[0])
	}
	if got[1].Topic != present || got[1].Err != nil || got[1].Partitions != 3 {
		t.Errorf("present topic: got %+v, want 3 partitions", got[1])
	}

	// Still missing: the metadata request did not create it.
	again, err := CheckTopics(context.Background(), cfg, []string{missing})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(again[0].Err, ErrTopicMissing) {
		t.Errorf("CheckTopics created %s: %+v", missing, again[0])
	}
}

func TestValidatePingReachesTheBroker(t *testing.T) {
	env := testenv.Require(t)
	if err := Ping(context.Background(), Config{Brokers: env.KafkaBrokers}); err != nil {
		t.Fatal(err)
	}
}

func TestValidatePingAndCheckTopicsNameAnUnreachableBroker(t *testing.T) {
	cfg := Config{Brokers: []string{"127.0.0.1:1"}, DialTimeout: 2 * time.Second}
	start := time.Now()
	err := Ping(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("Ping: want an error naming 127.0.0.1:1, got %v", err)
	}
	_, err = CheckTopics(context.Background(), cfg, []string{"t"})
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("CheckTopics: want an error naming 127.0.0.1:1, got %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %s against a closed port", d)
	}
}

// TestPingAndCheckTopicsEndWithTheirContextOnASilentBroker: a broker that
// accepts connections and never answers (paused, overloaded) must hold
// Ping and CheckTopics no longer than their context, not for
// kafka.read.timeout: the relay's topic checker and its shutdown wait for
// them.
func TestPingAndCheckTopicsEndWithTheirContextOnASilentBroker(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	var mu sync.Mutex
	var accepted []net.Conn
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted = append(accepted, c) // held open, never answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range accepted {
			c.Close()
		}
	})
	cfg := Config{Brokers: []string{silent.Addr().String()}, ReadTimeout: time.Minute, RequestTimeout: 10 * time.Second}
	for name, call := range map[string]func(context.Context) error{
		"Ping": func(ctx context.Context) error { return Ping(ctx, cfg) },
		"CheckTopics": func(ctx context.Context) error {
			_, err := CheckTopics(ctx, cfg, []string{"t"})
			return err
		},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		start := time.Now()
		err := call(ctx)
		took := time.Since(start)
		cancel()
		if err == nil {
			t.Errorf("%s: no error from a broker that never answers", name)
		}
		if took > 3*time.Second {
			t.Errorf("%s took %s with a 300 ms context (read timeout 1 minute): %v", name, took, err)
		}
	}
}
