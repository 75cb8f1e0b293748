package relay

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/pgoutbox/pgoutbox/poll"
	"github.com/pgoutbox/pgoutbox/router"
)

// The sources a relay reads (relay.source).
const (
	// SourceWAL streams the outbox tables' inserts from a logical
	// replication slot (the default).
	SourceWAL = "wal"
	// SourcePoll claims unpublished rows of the outbox table with SELECT
	// ... FOR NO KEY UPDATE SKIP LOCKED and marks them published: for databases
	// where logical replication is not available.
	SourcePoll = "poll"
)

// Snapshot modes (snapshot.mode), named as Debezium's.
const (
	// SnapshotNoData streams only what is committed after the slot was
	// created.
	SnapshotNoData = "no_data"
	// SnapshotInitial publishes, when the WAL source creates its slot, the
	// rows the outbox tables hold at that moment (read in the snapshot the
	// slot exports), and then streams.
	SnapshotInitial = "initial"
)

// Which rows an initial snapshot publishes (snapshot.rows).
const (
	SnapshotRowsAll         = "all"
	SnapshotRowsUnpublished = "unpublished" // published_at IS NULL: the cutover from the poll source
)

// Snapshot configures the WAL source's initial snapshot (section
// "snapshot").
type Snapshot struct {
	// Mode is no_data or initial.
	Mode string `yaml:"mode"`
	// Rows is all, or unpublished (the rows with published_at NULL, after
	// the poll source).
	Rows string `yaml:"rows"`
	// BatchSize is how many rows are read and sent at a time.
	BatchSize int `yaml:"batch.size"`
}

func defaultSnapshot() Snapshot {
	return Snapshot{Mode: SnapshotNoData, Rows: SnapshotRowsAll, BatchSize: 1000}
}

// validateSources checks relay.source, the poll section and the snapshot
// section.
func (c *Config) validateSources() error {
	var errs []error
	switch c.Relay.Source {
	case SourceWAL:
	case SourcePoll:
		if n := len(c.Postgres.Tables); n != 1 {
			errs = append(errs, fmt.Errorf("relay: source poll reads one outbox table; postgres.table.include.list has %d", n))
		}
		if c.Snapshot.Mode == SnapshotInitial {
			errs = append(errs, errors.New("snapshot: mode initial belongs to the WAL source (relay.source=wal); the poll source publishes every unpublished row anyway: set snapshot.mode to no_data"))
		}
	default:
		errs = append(errs, fmt.Errorf("relay: source %q: use wal or poll", c.Relay.Source))
	}
	if err := c.ValidateExactlyOnce(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Poll.Validate(); err != nil {
		errs = append(errs, err)
	}
	s := c.Snapshot
	switch s.Mode {
	case SnapshotNoData, SnapshotInitial:
	default:
		errs = append(errs, fmt.Errorf("snapshot: mode %q: use no_data or initial", s.Mode))
	}
	switch s.Rows {
	case SnapshotRowsAll, SnapshotRowsUnpublished:
	default:
		errs = append(errs, fmt.Errorf("snapshot: rows %q: use all or unpublished", s.Rows))
	}
	if s.BatchSize < 1 || s.BatchSize > 100_000 {
		errs = append(errs, fmt.Errorf("snapshot: batch.size %d out of range [1, 100000]", s.BatchSize))
	}
	return errors.Join(errs...)
}

// PollTable is the poll source's table with the key and id columns the
// router uses for it.
func (c *Config) PollTable() (*poll.Table, error) {
	tables := c.Postgres.QualifiedTables()
	if len(tables) != 1 {
		return nil, fmt.Errorf("relay: source poll reads one outbox table; postgres.table.include.list has %d", len(tables))
	}
	key, id := c.columnsOf(tables[0])
	return poll.NewTable(tables[0], key, id)
}

// columnsOf is the key and id columns of table: the router section's, or
// its routes entry's.
func (c *Config) columnsOf(table string) (key, id string) {
	key, id = c.Router.EventKeyField, c.Router.EventIDField
	for t, o := range c.Routes {
		if t == table || "public."+t == table {
			if k, ok := o["table.field.event.key"]; ok {
				key = k
			}
			if v, ok := o["table.field.event.id"]; ok {
				id = v
			}
		}
	}
	return key, id
}

// PollDestination is the fingerprint of where the poll source publishes
// table (poll.Destination), which every instance on the table must share:
// the Kafka brokers, trimmed, lower-cased and sorted (the list: one
// cluster listed otherwise counts as another), and the settings that
// decide a row's topic (route.by.field, route.topic.regex,
// route.topic.replacement, route.topic, with the table's routes entry
// over the router section, as RouterSet applies it) and
// relay.dead.letter.topic. Only hashes leave the process. Settings that
// shape records but not where they go (converters, headers, columns)
// are not in it, so that changing one is no reason to stop.
func (c *Config) PollDestination(table string) poll.Destination {
	return poll.Destination{Kafka: poll.Fingerprint("kafka", c.brokersText()), Router: poll.Fingerprint("router", c.routeText(table))}
}

// brokersText is the Kafka part of a destination's fingerprint: the
// brokers, trimmed, lower-cased, sorted and without repeats.
func (c *Config) brokersText() string {
	brokers := make([]string, 0, len(c.Kafka.Brokers))
	for _, b := range c.Kafka.Brokers {
		brokers = append(brokers, strings.ToLower(strings.TrimSpace(b)))
	}
	slices.Sort(brokers)
	brokers = slices.Compact(brokers)
	return strings.Join(brokers, ",")
}

// routeText is the router part of a destination's fingerprint for table:
// the settings that decide its rows' topics, with the table's routes
// entry over the router section ("" for a table without one: the
// section's), and relay.dead.letter.topic.
func (c *Config) routeText(table string) string {
	o := c.Router
	for _, t := range slices.Sorted(maps.Keys(c.Routes)) {
		if t != table && "public."+t != table {
			continue
		}
		opts := c.Routes[t]
		if _, fixed := opts["route.topic"]; fixed {
			d := router.DefaultOptions()
			o.RouteTopicRegex, o.RouteTopicReplacement = d.RouteTopicRegex, d.RouteTopicReplacement
		}
		for _, k := range slices.Sorted(maps.Keys(opts)) {
			_ = o.Set(k, opts[k]) // Validate refused what Set refuses
		}
	}
	return fmt.Sprintf("route.by.field=%q route.topic.regex=%q route.topic.replacement=%q route.topic=%q dead.letter.topic=%q",
		o.RouteByField, o.RouteTopicRegex, o.RouteTopicReplacement, o.RouteTopic, c.Relay.DeadLetterTopic)
}

// ValidateExactlyOnce refuses kafka.exactly.once where it cannot hold: with
// the poll source, and without a state table (Validate calls it; migrate,
// which validates less, too).
func (c *Config) ValidateExactlyOnce() error {
	if !c.Kafka.ExactlyOnce {
		return nil
	}
	if c.Relay.Source == SourcePoll {
		return errors.New("kafka: exactly.once belongs to the WAL source (relay.source=wal): the poll source marks a row published once Kafka acknowledged it, and a crash between the two sends the row again (at least once, with its event id); remove kafka.exactly.once")
	}
	if c.Postgres.StateTable == "" {
		return errors.New("kafka: exactly.once needs postgres.state.table: the state row records the timeline the last session read, by which a start after a failover tells that the position Kafka holds lies past where the new primary's history forked (the transactions committed there since are not those in Kafka, and would be skipped); set postgres.state.table")
	}
	return nil
}
