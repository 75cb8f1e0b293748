package metrics

import (
	"errors"
	"fmt"
	"net"
	"time"
)

// Config configures metrics and health. Embed it in the process's
// configuration under a "metrics" key.
type Config struct {
	// Listen is the HTTP address of /metrics, /healthz and /readyz, such
	// as ":9180" or "127.0.0.1:9180". Empty: no HTTP server.
	Listen string `yaml:"listen"`
	// ReadyStaleAfter is how long the confirmed LSN may stand still, while
	// the relay is not idle and caught up, before /readyz reports 503. Keep
	// it well above postgres.status.update.interval.
	ReadyStaleAfter time.Duration `yaml:"ready.stale.after"`
	// SlotPollInterval is how often the slot's WAL usage is read from
	// pg_replication_slots; 0 turns the poller off.
	SlotPollInterval time.Duration `yaml:"slot.poll.interval"`
	// MaxTopics caps the distinct values of the topic label. Topics come
	// from data; past the cap, events are counted under topic="(other)".
	MaxTopics int `yaml:"max.topics"`
	// BacklogPollInterval is how often the poll source's backlog (its
	// unpublished rows and the age of the oldest) is read.
	BacklogPollInterval time.Duration `yaml:"backlog.poll.interval"`
	// ReadyBacklogMaxAge: with the poll source, /readyz reports 503 while
	// the oldest unpublished row is older than this.
	ReadyBacklogMaxAge time.Duration `yaml:"ready.backlog.max.age"`
	// LiveStaleAfter: while a WAL session streams, /healthz reports 503 once
	// the relay's loop has sent no progress report for this long. The loop
	// reports with every status update (postgres.status.update.interval, at
	// most 30 s), whatever Kafka or the server do, so a silence this long
	// means the loop itself is stuck. 0 turns the check off.
	LiveStaleAfter time.Duration `yaml:"live.stale.after"`
}

// DefaultConfig returns every default: no HTTP server, readiness stale
// after 30 s, the slot polled every 15 s, at most 1000 topic labels, the
// poll source's backlog read every 5 s and not ready past a minute, and
// not live after two minutes without a progress report.
func DefaultConfig() Config {
	return Config{ReadyStaleAfter: 30 * time.Second, SlotPollInterval: 15 * time.Second, MaxTopics: 1000,
		BacklogPollInterval: 5 * time.Second, ReadyBacklogMaxAge: time.Minute, LiveStaleAfter: 2 * time.Minute}
}

// Validate checks every field and names the offending option.
func (c *Config) Validate() error {
	var errs []error
	if c.Listen != "" {
		if _, _, err := net.SplitHostPort(c.Listen); err != nil {
			errs = append(errs, fmt.Errorf("metrics: listen %q: want host:port or :port: %w", c.Listen, err))
		}
	}
	if c.ReadyStaleAfter < time.Second {
		errs = append(errs, fmt.Errorf("metrics: ready.stale.after %s: use at least 1s", c.ReadyStaleAfter))
	}
	if c.SlotPollInterval != 0 && c.SlotPollInterval < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("metrics: slot.poll.interval %s: use 0 (off) or at least 100ms", c.SlotPollInterval))
	}
	if c.MaxTopics < 1 || c.MaxTopics > 100_000 {
		errs = append(errs, fmt.Errorf("metrics: max.topics %d out of range [1, 100000]", c.MaxTopics))
	}
	if c.BacklogPollInterval < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("metrics: backlog.poll.interval %s: use at least 100ms", c.BacklogPollInterval))
	}
	if c.ReadyBacklogMaxAge < time.Second {
		errs = append(errs, fmt.Errorf("metrics: ready.backlog.max.age %s: use at least 1s", c.ReadyBacklogMaxAge))
	}
	if c.LiveStaleAfter != 0 && c.LiveStaleAfter < time.Minute {
		errs = append(errs, fmt.Errorf("metrics: live.stale.after %s: use 0 (off) or at least 1m (progress is reported with each status update, up to 30s apart)", c.LiveStaleAfter))
	}
	return errors.Join(errs...)
}
