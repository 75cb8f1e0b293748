package relay

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/pkg/outbox"
	"github.com/pgoutbox/pgoutbox/poll"
	"github.com/pgoutbox/pgoutbox/replication"
	"github.com/pgoutbox/pgoutbox/router"
)

// Config is the whole relay configuration: where to read, where to write,
// how to map rows, and the relay's own limits.
type Config struct {
	Postgres replication.Config `yaml:"postgres"`
	Kafka    kafka.Config       `yaml:"kafka"`
	Router   router.Options     `yaml:"router"`
	// Routes gives outbox tables their own router options, by Debezium
	// option name, over the router section: for example a fixed topic
	// (route.topic) or other column names for a second outbox table.
	Routes   map[string]map[string]string `yaml:"routes"`
	Relay    Limits                       `yaml:"relay"`
	Messages Messages                     `yaml:"messages"`
	// Poll configures the poll source (relay.source: poll); Snapshot the
	// WAL source's initial snapshot. See poll_config.go.
	Poll     poll.Config `yaml:"poll"`
	Snapshot Snapshot    `yaml:"snapshot"`
}

// Messages configures the table-less outbox: events written with
// pg_logical_emit_message(true, '<prefix>', '<json object>') inside the
// business transaction, routed exactly like outbox rows.
type Messages struct {
	// Prefix selects the messages that are events; empty turns the
	// table-less outbox off.
	Prefix string `yaml:"prefix"`
	// NonTransactional says what to do with a message written with
	// transactional = false, which is not tied to any transaction's outcome:
	// "refuse" (stop with an error naming it) or "accept" (route it too).
	NonTransactional string `yaml:"nontransactional"`
	// Format is how a message's JSON becomes the row the router maps:
	// "pgoutbox" (the default, also ""; see messageRow) or "debezium", as
	// Debezium 3's table-less outbox reads it: its
	// DecodeLogicalDecodingMessageContent transform before the EventRouter
	// (router.DecodeMessage: a null field is left out, numbers keep their
	// JSON type, a payload object is written as an object). A connector
	// JSON with that transform sets it; it needs
	// value.converter=JsonConverter.
	Format string `yaml:"format"`
	// Debezium, set by the Kafka Connect import (--connector), is what
	// Debezium's connector does with logical decoding messages; nil
	// otherwise. See DebeziumMessages.
	Debezium *DebeziumMessages `yaml:"-"`
}

// The values of Messages.Format.
const (
	MessagesPgoutbox = "pgoutbox"
	MessagesDebezium = "debezium"
)

// DebeziumMessages is what Debezium's PostgreSQL connector does with the
// logical decoding messages of its database: it writes each one whose
// prefix its message.prefix.include.list / exclude.list let through to
// Topic (<topic.prefix>.message) with its change-event envelope, and its
// EventRouter passes them on unchanged (it routes rows, not messages). A
// real Debezium 3.6.1 did both (a black-box review). pgoutbox writes the
// same records, but for the messages it routes as events (those of
// messages.prefix) and under converters whose bytes it does not
// reproduce: the session names each such message once per prefix, at
// Warn, so that a cutover from Debezium does not lose a consumer's
// records unseen.
type DebeziumMessages struct {
	Topic            string
	Include, Exclude []*regexp.Regexp // whole-prefix matches, either case
	// Name is the connector's logical name (topic.prefix) and DB its
	// database.dbname, which its message records name in their source
	// block (see session.debeziumRecord).
	Name, DB string
	// Certain is false when a list had an expression Go does not compile:
	// Writes then guesses (an include list lets every prefix through, an
	// exclude list leaves none out), and the relay writes no records on
	// that guess.
	Certain bool
}

// Writes says whether Debezium would write a message with prefix to Topic.
func (d *DebeziumMessages) Writes(prefix string) bool {
	match := func(res []*regexp.Regexp) bool {
		return slices.ContainsFunc(res, func(re *regexp.Regexp) bool { return re.MatchString(prefix) })
	}
	if len(d.Include) > 0 {
		return match(d.Include)
	}
	return !match(d.Exclude)
}

// RouterSet builds the router for every table: the router section for all,
// with each table's routes entry applied over a copy of it (a table's own
// route.topic replaces the section's regex and replacement). With extended
// headers on and no run id, it picks one, once per Config, as Debezium does
// at each task start.
func (c *Config) RouterSet() (*router.Set, error) {
	if c.Router.ExtendedHeaders && c.Router.ExtendedHeadersRunID == "" {
		c.Router.ExtendedHeadersRunID = outbox.NewID()
	}
	per := make(map[string]router.Options, len(c.Routes))
	tables := map[string]bool{}
	for _, t := range c.Postgres.QualifiedTables() {
		tables[t] = true
	}
	var errs []error
	// Two keys may name one table ("outbox" and "public.outbox", as a base
	// file and an overlay merged by Helm or kustomize leave them): per holds
	// one set of options a table, so the last key in Go's random map order
	// would win, and the table's events would go to either key's topic,
	// another at each start. Refuse it instead; sorted, so the error names
	// the same keys in the same order every time.
	keys := slices.Sorted(maps.Keys(c.Routes))
	given := make(map[string]string, len(keys))
	for _, table := range keys {
		opts := c.Routes[table]
		qualified := table
		if !strings.Contains(table, ".") {
			qualified = "public." + table
		}
		if prev, dup := given[qualified]; dup {
			errs = append(errs, fmt.Errorf("routes: keys %q and %q both name table %s, and only one set of options can apply to it: keep one key and move the other's options into it", prev, table, qualified))
			continue
		}
		given[qualified] = table
		if !tables[qualified] {
			errs = append(errs, fmt.Errorf("routes: table %q is not in postgres.table.include.list %v", table, c.Postgres.Tables))
			continue
		}
		o := c.Router
		if _, fixed := opts["route.topic"]; fixed {
			d := router.DefaultOptions()
			o.RouteTopicRegex, o.RouteTopicReplacement = d.RouteTopicRegex, d.RouteTopicReplacement
		}
		for k, v := range opts {
			if err := o.Set(k, v); err != nil {
				errs = append(errs, fmt.Errorf("routes.%s: %w", table, err))
			}
		}
		per[qualified] = o
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return router.NewSet(c.Router, per)
}

// UsesEventTimestamp says whether records may carry a column's value as
// their Kafka timestamp (table.field.event.timestamp, in the router section
// or a table's routes entry) rather than the time they are relayed: an old
// value makes a record its topic may delete at once (see
// kafka.RecordTooOldError).
func (c *Config) UsesEventTimestamp() bool {
	if c.Router.EventTimestampField != "" {
		return true
	}
	for _, opts := range c.Routes {
		if opts["table.field.event.timestamp"] != "" {
			return true
		}
	}
	return false
}

// Limits bounds memory and time.
type Limits struct {
	// MaxInFlightRecords caps records sent to Kafka and not yet acknowledged.
	// When reached, the relay stops reading WAL (it still answers the server).
	MaxInFlightRecords int `yaml:"max.inflight.records"`
	// MaxInFlightBytes caps the key, value and header bytes of those records.
	MaxInFlightBytes int64 `yaml:"max.inflight.bytes"`
	// ShutdownTimeout bounds how long a stop waits for the open transaction to
	// end and for Kafka to acknowledge what is in flight.
	ShutdownTimeout time.Duration `yaml:"shutdown.timeout"`
	// ProgressInterval is how often, while the relay is behind (a backlog
	// after a restart or an outage), it logs how far behind it is, how fast
	// it catches up and when it expects to be done.
	ProgressInterval time.Duration `yaml:"progress.interval"`
	// RestartBackoff is the first wait before a new session after a failure;
	// it doubles (with jitter) up to RestartBackoffMax.
	RestartBackoff    time.Duration `yaml:"restart.backoff"`
	RestartBackoffMax time.Duration `yaml:"restart.backoff.max"`
	// PoisonPolicy says what happens to a row that cannot become a record
	// (the router cannot map it) or a record Kafka can never accept (too
	// large, topic missing or not writable): "fail" stops with the event
	// id, the LSN and the reason, confirming nothing at or after it;
	// "dead-letter" produces the original bytes to DeadLetterTopic with
	// headers giving the reason, source and LSN, and goes on.
	PoisonPolicy    string `yaml:"poison.policy"`
	DeadLetterTopic string `yaml:"dead.letter.topic"`
	// Source is where events come from: "wal" (a replication slot) or
	// "poll" (the outbox table itself); see poll_config.go.
	Source string `yaml:"source"`
}

// DefaultConfig returns every default.
func DefaultConfig() Config {
	var k kafka.Config
	k.Defaults()
	return Config{
		Postgres: replication.DefaultConfig(),
		Kafka:    k,
		Router:   router.DefaultOptions(),
		Relay: Limits{
			MaxInFlightRecords: 5000,
			MaxInFlightBytes:   8 << 20,
			ShutdownTimeout:    30 * time.Second,
			ProgressInterval:   10 * time.Second,
			RestartBackoff:     500 * time.Millisecond,
			RestartBackoffMax:  30 * time.Second,
			PoisonPolicy:       "fail",
			DeadLetterTopic:    "pgoutbox.dead-letter",
			Source:             SourceWAL,
		},
		Messages: Messages{Prefix: "outbox", NonTransactional: "refuse"},
		Poll:     poll.DefaultConfig(),
		Snapshot: defaultSnapshot(),
	}
}

// Validate checks every section and names the offending option.
func (c *Config) Validate() error {
	var errs []error
	if err := c.Postgres.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Kafka.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Kafka.ValidateExplicit(); err != nil {
		errs = append(errs, err)
	}
	// RouterSet validates the router section too: each problem once.
	if _, err := c.RouterSet(); err != nil {
		errs = append(errs, err)
	}
	l := c.Relay
	if l.MaxInFlightRecords < 1 || l.MaxInFlightRecords > 1_000_000 {
		errs = append(errs, fmt.Errorf("relay: max.inflight.records %d out of range [1, 1000000]", l.MaxInFlightRecords))
	}
	if l.MaxInFlightBytes < 1<<10 {
		errs = append(errs, fmt.Errorf("relay: max.inflight.bytes %d too small: use at least 1024", l.MaxInFlightBytes))
	}
	if h := int64(eosHeadroom(c.Kafka.ExactlyOnce)); c.Kafka.RetryBufferBytes > 0 && l.MaxInFlightBytes > 0 &&
		c.Kafka.RetryBufferBytes < h*l.MaxInFlightBytes+int64(c.Kafka.MaxMessageBytes) {
		// sarama drops records from the middle of a full retry buffer and
		// sends later ones: their keys' order is lost, and each dropped
		// record restarts the relay. (The loop may pass the cap by one
		// record.)
		errs = append(errs, fmt.Errorf("relay: max.inflight.bytes %d is more than kafka retry.buffer.bytes %d can hold while a broker is away (%d times it with kafka.exactly.once, plus one record of kafka.max.message.bytes %d): raise retry.buffer.bytes or lower max.inflight.bytes",
			l.MaxInFlightBytes, c.Kafka.RetryBufferBytes, h, c.Kafka.MaxMessageBytes))
	}
	if l.ProgressInterval <= 0 {
		errs = append(errs, fmt.Errorf("relay: progress.interval %s must be positive", l.ProgressInterval))
	}
	if l.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("relay: shutdown.timeout %s must be positive", l.ShutdownTimeout))
	}
	if l.RestartBackoff <= 0 || l.RestartBackoffMax < l.RestartBackoff {
		errs = append(errs, fmt.Errorf("relay: restart.backoff %s and restart.backoff.max %s: need 0 < backoff <= max", l.RestartBackoff, l.RestartBackoffMax))
	}
	switch l.PoisonPolicy {
	case "fail":
	case "dead-letter":
		if err := validTopic(l.DeadLetterTopic); err != nil {
			errs = append(errs, fmt.Errorf("relay: dead.letter.topic %q: %w", l.DeadLetterTopic, err))
		}
	default:
		errs = append(errs, fmt.Errorf("relay: poison.policy %q: use fail or dead-letter", l.PoisonPolicy))
	}
	switch c.Messages.NonTransactional {
	case "refuse", "accept":
	default:
		errs = append(errs, fmt.Errorf("messages: nontransactional %q: use refuse or accept", c.Messages.NonTransactional))
	}
	switch c.Messages.Format {
	case "", MessagesPgoutbox:
	case MessagesDebezium:
		if c.Messages.Prefix == "" {
			errs = append(errs, fmt.Errorf("messages: format %s reads the messages of messages.prefix, which is empty (the table-less outbox off): set the prefix", MessagesDebezium))
		}
		if !router.IsJSONConverter(c.Router.ValueConverter) {
			errs = append(errs, fmt.Errorf("messages: format %s writes a payload object as Kafka Connect's JsonConverter does: set router value.converter to JsonConverter (with value.converter.schemas.enable false), as Debezium's connector is run", MessagesDebezium))
		}
	default:
		errs = append(errs, fmt.Errorf("messages: format %q: use %s or %s", c.Messages.Format, MessagesPgoutbox, MessagesDebezium))
	}
	if err := c.validateSources(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// validTopic checks a Kafka topic name as the broker does: 1 to 249 of
// ASCII letters, digits, '.', '_' and '-', and not "." or "..".
func validTopic(t string) error {
	if t == "" || len(t) > 249 {
		return errors.New("a topic name has 1 to 249 characters")
	}
	if t == "." || t == ".." {
		return errors.New(`"." and ".." are not topic names`)
	}
	for _, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("%q is not allowed in a topic name (use ASCII letters, digits, '.', '_' and '-')", r)
		}
	}
	return nil
}
