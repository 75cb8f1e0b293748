package kafka

import (
	"context"
	"errors"
	"strings"
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
