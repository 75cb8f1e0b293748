package poll

import (
	"errors"
	"fmt"
	"regexp"
	"time"
)

// What the relay does with a row once Kafka acknowledged it (poll.on.publish).
const (
	OnPublishMark   = "mark"   // set published_at = now(); cleanup deletes it after poll.retention
	OnPublishDelete = "delete" // delete it in the claiming transaction
)

// Config is the poll source's section of the configuration ("poll").
type Config struct {
	// Interval is how long the relay waits for new rows when a claim found
	// fewer than BatchSize: the fallback when no notification arrives
	// (notifications off, lost, or their connection down).
	Interval time.Duration `yaml:"interval"`
	// BatchSize is how many rows one claim transaction takes at most (it
	// is also bounded by relay.max.inflight.records).
	BatchSize int `yaml:"batch.size"`
	// Buckets is how many key buckets the keys hash into; each bucket is
	// owned by one instance at a time. Every instance on a table must use
	// the same number (an instance that finds another number refuses to
	// start).
	Buckets int `yaml:"buckets"`
	// Notify listens for the notifications of the table's trigger (created
	// by pgoutbox migrate) and claims at once when one arrives.
	Notify bool `yaml:"notify"`
	// NotifyChannel is the channel the trigger notifies; empty: derived
	// from the table ("pgoutbox.<schema>.<table>").
	NotifyChannel string `yaml:"notify.channel"`
	// OnPublish is mark or delete.
	OnPublish string `yaml:"on.publish"`
	// MaxAttempts is how often a row that cannot be published (the router
	// cannot map it, or Kafka can never accept its record) is tried before
	// relay.poison.policy applies. Retriable broker errors do not count.
	MaxAttempts int `yaml:"max.attempts"`
	// RetryBackoff is the wait after a row's first failed attempt; it
	// doubles up to RetryBackoffMax. Later rows of the row's key wait too.
	RetryBackoff    time.Duration `yaml:"retry.backoff"`
	RetryBackoffMax time.Duration `yaml:"retry.backoff.max"`
	// Retention is how long published rows are kept before the running
	// relay (and pgoutbox cleanup) deletes them; 0 keeps them.
	Retention time.Duration `yaml:"retention"`
	// CleanupInterval is how often the running relay deletes rows older
	// than Retention.
	CleanupInterval time.Duration `yaml:"cleanup.interval"`
	// CleanupBatchSize bounds the rows one cleanup transaction deletes.
	CleanupBatchSize int `yaml:"cleanup.batch.size"`
	// RebalanceInterval is how often an instance looks at the other
	// instances and takes or gives up buckets.
	RebalanceInterval time.Duration `yaml:"rebalance.interval"`
	// HandoverSlot names the replication slot of a WAL-source relay this
	// poll relay takes over from: at its first start it marks as published
	// the rows that slot relayed, and drops the slot (see DESIGN.md).
	HandoverSlot string `yaml:"handover.slot"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Interval:          500 * time.Millisecond,
		BatchSize:         1000,
		Buckets:           64,
		Notify:            true,
		OnPublish:         OnPublishMark,
		MaxAttempts:       5,
		RetryBackoff:      time.Second,
		RetryBackoffMax:   time.Minute,
		Retention:         7 * 24 * time.Hour,
		CleanupInterval:   time.Minute,
		CleanupBatchSize:  500,
		RebalanceInterval: time.Second,
	}
}

// MaxBuckets is the largest poll.buckets: the bucket count is part of each
// instance's lock key (15 bits).
const MaxBuckets = 1<<15 - 1

var slotNameRE = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// Validate checks every field and names the offending option.
func (c *Config) Validate() error {
	var errs []error
	if c.Interval < 10*time.Millisecond || c.Interval > time.Hour {
		errs = append(errs, fmt.Errorf("poll: interval %s out of range [10ms, 1h]", c.Interval))
	}
	if c.BatchSize < 1 || c.BatchSize > 100_000 {
		errs = append(errs, fmt.Errorf("poll: batch.size %d out of range [1, 100000]", c.BatchSize))
	}
	if c.Buckets < 1 || c.Buckets > MaxBuckets {
		errs = append(errs, fmt.Errorf("poll: buckets %d out of range [1, %d]", c.Buckets, MaxBuckets))
	}
	if len(c.NotifyChannel) > 63 {
		errs = append(errs, fmt.Errorf("poll: notify.channel %q is longer than PostgreSQL's 63 bytes", c.NotifyChannel))
	}
	switch c.OnPublish {
	case OnPublishMark, OnPublishDelete:
	default:
		errs = append(errs, fmt.Errorf("poll: on.publish %q: use mark or delete", c.OnPublish))
	}
	if c.MaxAttempts < 1 || c.MaxAttempts > 1000 {
		errs = append(errs, fmt.Errorf("poll: max.attempts %d out of range [1, 1000]", c.MaxAttempts))
	}
	if c.RetryBackoff <= 0 || c.RetryBackoffMax < c.RetryBackoff {
		errs = append(errs, fmt.Errorf("poll: retry.backoff %s and retry.backoff.max %s: need 0 < backoff <= max", c.RetryBackoff, c.RetryBackoffMax))
	}
	if c.Retention < 0 {
		errs = append(errs, fmt.Errorf("poll: retention %s must not be negative (0 keeps published rows)", c.Retention))
	}
	if c.CleanupInterval < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("poll: cleanup.interval %s: use at least 100ms", c.CleanupInterval))
	}
	if c.CleanupBatchSize < 1 || c.CleanupBatchSize > 100_000 {
		errs = append(errs, fmt.Errorf("poll: cleanup.batch.size %d out of range [1, 100000]", c.CleanupBatchSize))
	}
	if c.RebalanceInterval < 10*time.Millisecond || c.RebalanceInterval > time.Minute {
		errs = append(errs, fmt.Errorf("poll: rebalance.interval %s out of range [10ms, 1m]", c.RebalanceInterval))
	}
	if c.HandoverSlot != "" && !slotNameRE.MatchString(c.HandoverSlot) {
		errs = append(errs, fmt.Errorf("poll: handover.slot %q: use 1-63 lower-case letters, digits or underscores", c.HandoverSlot))
	}
	return errors.Join(errs...)
}

// Channel is the notification channel of table (schema.table): NotifyChannel,
// or "pgoutbox.<schema>.<table>", cut to PostgreSQL's 63 bytes.
func (c *Config) Channel(table string) string {
	if c.NotifyChannel != "" {
		return c.NotifyChannel
	}
	ch := "pgoutbox." + table
	if len(ch) > 63 {
		ch = ch[:63]
	}
	return ch
}

// Backoff is the wait after a row's attempt-th failed attempt (from 1).
func (c *Config) Backoff(attempt int) time.Duration {
	d := c.RetryBackoff
	for i := 1; i < attempt && d < c.RetryBackoffMax; i++ {
		d *= 2
	}
	return min(d, c.RetryBackoffMax)
}
