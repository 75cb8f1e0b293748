package replication

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Publication auto-creation modes, named as Debezium's publication.autocreate.mode.
const (
	PublicationDisabled  = "disabled"   // never create; refuse to start when missing
	PublicationFiltered  = "filtered"   // create FOR TABLE <table.include.list> WITH (publish = 'insert')
	PublicationAllTables = "all_tables" // create FOR ALL TABLES WITH (publish = 'insert')
)

// Config says which slot and publication to stream from.
type Config struct {
	// DSN is a libpq connection string or URL for the database that holds the
	// outbox table. The replication connection adds replication=database.
	// TLS is set here as for libpq: sslmode (disable, prefer, require,
	// verify-ca, verify-full), sslrootcert, sslcert, sslkey.
	DSN string `yaml:"dsn"`
	// Password, when set, is used instead of a password in the DSN (or
	// PGPASSWORD, or a passfile); better given in the environment as
	// PGOUTBOX_POSTGRES_PASSWORD than in a file others can read.
	Password string `yaml:"password"`
	// PasswordFile names a file that holds the password (a mounted secret,
	// say); a trailing newline is ignored. It is read at each connection.
	// Set Password or PasswordFile, not both.
	PasswordFile string `yaml:"password.file"`
	// Slot is the logical replication slot (plugin pgoutput).
	Slot string `yaml:"slot.name"`
	// CreateSlot creates the slot when it does not exist.
	CreateSlot bool `yaml:"slot.create"`
	// SlotFailover makes the slot a failover slot (PostgreSQL 17+, as
	// Debezium's slot.failover): a standby with sync_replication_slots
	// keeps a copy of it, so that it survives a promotion.
	SlotFailover bool `yaml:"slot.failover"`
	// Publication is the publication named in publication_names.
	Publication string `yaml:"publication.name"`
	// PublicationAutocreate is disabled, filtered or all_tables.
	PublicationAutocreate string `yaml:"publication.autocreate.mode"`
	// Tables lists the schema-qualified outbox tables (Debezium's
	// table.include.list); a filtered publication is created for them and an
	// existing publication must contain them.
	Tables []string `yaml:"table.include.list"`
	// StatusInterval is how often a standby status update is sent even when
	// the server does not ask for one (Debezium: status.update.interval.ms).
	StatusInterval time.Duration `yaml:"status.update.interval"`
	// ReceiveBatchWait: while the stream is live, a read that emptied the
	// replication socket is followed by the next one no sooner than this,
	// so that the messages arriving meanwhile are read and processed
	// together (fewer wake-ups: less CPU); 0 reads as soon as anything
	// arrives. It adds at most this much latency.
	ReceiveBatchWait time.Duration `yaml:"receive.batch.wait"`
	// ReceiveMaxMessageBytes caps one message from the walsender (a row,
	// whole, or a logical decoding message): a longer one stops the relay
	// (exit 1) naming where, before it is read, instead of the process
	// being OOM-killed decoding it. 0 derives the cap from the memory
	// limit of the process's control group (MessageCap).
	ReceiveMaxMessageBytes int `yaml:"receive.max.message.bytes"`
	// ConnectTimeout bounds each connection attempt.
	ConnectTimeout time.Duration `yaml:"connect.timeout"`
	// PublicationCheckInterval is how often, while streaming, the relay
	// checks that the publication and the outbox tables are still the ones
	// it started with. The slot is never confirmed past the WAL position of
	// the last check that passed.
	PublicationCheckInterval time.Duration `yaml:"publication.check.interval"`
	// StateTable is the schema-qualified table that keeps the relay's
	// history of its slot (created when missing); empty keeps none.
	StateTable string `yaml:"state.table"`
	// RecreateVanishedSlot lets Prepare create the slot although the state
	// table says it was used before, and record the catalog as it is now.
	// Only pgoutbox migrate --recreate-slot sets it, after it has recorded
	// the cleanup hold: it is never read from a configuration.
	RecreateVanishedSlot bool `yaml:"-"`
	// HoldOnFencePassed lets Prepare record a cleanup hold when the slot
	// is past the fence of the last session (see Start.CheckFence): set by
	// the relay for its first session, where it judges the fence; not by
	// a reconnect in the same process (its own history knows more), nor
	// by migrate.
	HoldOnFencePassed bool `yaml:"-"`
	// BeforeCreate, when set, is called by Prepare before it creates the
	// slot (not for RecreateVanishedSlot): an error refuses the creation.
	// The relay sets it to refuse a slot that would start after rows the
	// poll source left unpublished (relay.PollRowsRefusal).
	BeforeCreate func(ctx context.Context, conn *pgx.Conn) error `yaml:"-"`
}

// DefaultConfig returns the defaults: slot and publication named pgoutbox,
// both created when missing, the outbox table public.outbox.
func DefaultConfig() Config {
	return Config{
		Slot:                  "pgoutbox",
		CreateSlot:            true,
		Publication:           "pgoutbox",
		PublicationAutocreate: PublicationFiltered,
		Tables:                []string{"public.outbox"},
		StatusInterval:        time.Second,
		ReceiveBatchWait:      5 * time.Millisecond,
		ConnectTimeout:        10 * time.Second,

		PublicationCheckInterval: time.Second,
		StateTable:               DefaultStateTable,
	}
}

// maxReceiveBatchWait bounds receive.batch.wait.
const maxReceiveBatchWait = 100 * time.Millisecond

var (
	slotNameRE = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)
	// identRE: any name PostgreSQL stores (it is always quoted when used),
	// but no dot, which separates schema and table in configured names.
	identRE     = regexp.MustCompile(`^[^.\x00]{1,63}$`)
	errEmptyDSN = errors.New("replication: dsn is empty: set postgres.dsn (or PGOUTBOX_POSTGRES_DSN)")
)

// ValidateSlotName checks a replication slot name. PostgreSQL allows lower-case
// letters, digits and underscores, at most 63 of them; the name is also put
// unquoted into replication commands, so nothing else may pass.
func ValidateSlotName(name string) error {
	if !slotNameRE.MatchString(name) {
		return fmt.Errorf("replication: invalid slot.name %q: use 1-63 lower-case letters, digits or underscores", name)
	}
	return nil
}

// ValidatePublicationName checks a publication name: an unquoted SQL
// identifier of at most 63 bytes.
func ValidatePublicationName(name string) error {
	if !identRE.MatchString(name) {
		return fmt.Errorf("replication: invalid publication.name %q: use 1 to 63 bytes, without a dot", name)
	}
	return nil
}

// splitTable splits "schema.table" (or "table", meaning public) into its parts
// and validates them as plain identifiers.
func splitTable(t string) (schema, table string, err error) {
	schema, table = "public", t
	if i := strings.IndexByte(t, '.'); i >= 0 {
		schema, table = t[:i], t[i+1:]
	}
	if !identRE.MatchString(schema) || !identRE.MatchString(table) {
		return "", "", fmt.Errorf("replication: invalid table %q in table.include.list: use schema.table, each part 1 to 63 bytes", t)
	}
	return schema, table, nil
}

// QualifiedTables returns the configured tables as schema.table.
func (c *Config) QualifiedTables() []string {
	out := make([]string, 0, len(c.Tables))
	for _, t := range c.Tables {
		s, n, err := splitTable(t)
		if err != nil {
			continue
		}
		out = append(out, s+"."+n)
	}
	return out
}

// Validate checks the configuration and says which option is wrong.
func (c *Config) Validate() error {
	if strings.TrimSpace(c.DSN) == "" {
		return errEmptyDSN
	}
	if err := c.ValidateDSN(); err != nil {
		return err
	}
	if c.Password != "" && c.PasswordFile != "" {
		return errors.New("replication: password and password.file are both set: set one of them")
	}
	if err := ValidateSlotName(c.Slot); err != nil {
		return err
	}
	if err := ValidatePublicationName(c.Publication); err != nil {
		return err
	}
	switch c.PublicationAutocreate {
	case PublicationDisabled, PublicationFiltered, PublicationAllTables:
	default:
		return fmt.Errorf("replication: invalid publication.autocreate.mode %q: use disabled, filtered or all_tables", c.PublicationAutocreate)
	}
	for _, t := range c.Tables {
		if _, _, err := splitTable(t); err != nil {
			return err
		}
	}
	if c.StatusInterval <= 0 || c.StatusInterval > 30*time.Second {
		return fmt.Errorf("replication: status.update.interval %s out of range: use (0, 30s] so the server's wal_sender_timeout never fires", c.StatusInterval)
	}
	if c.ConnectTimeout <= 0 {
		return fmt.Errorf("replication: connect.timeout %s must be positive", c.ConnectTimeout)
	}
	if c.ReceiveBatchWait < 0 || c.ReceiveBatchWait > maxReceiveBatchWait {
		return fmt.Errorf("replication: receive.batch.wait %s out of range: use [0, %s]; it is latency added to every event", c.ReceiveBatchWait, maxReceiveBatchWait)
	}
	if n := c.ReceiveMaxMessageBytes; n != 0 && (n < minMessageBytes || n > maxMessageBytes) {
		return fmt.Errorf("replication: receive.max.message.bytes %d out of range: use 0 (derived from the memory limit) or [%d, %d]", n, minMessageBytes, maxMessageBytes)
	}
	if c.PublicationCheckInterval <= 0 || c.PublicationCheckInterval > time.Minute {
		return fmt.Errorf("replication: publication.check.interval %s out of range: use (0, 1m]; the slot is confirmed only as far as the last check", c.PublicationCheckInterval)
	}
	if c.StateTable != "" {
		if _, _, err := splitTable(c.StateTable); err != nil {
			return fmt.Errorf("replication: invalid state.table %q: use schema.table, or \"\" to keep no history", c.StateTable)
		}
	}
	return nil
}

// quoteIdent quotes an identifier for SQL the way the driver does.
func quoteIdent(s string) string { return pgx.Identifier{s}.Sanitize() }

// quoteLiteral quotes s as an SQL string literal (standard_conforming_strings
// on, as in every supported PostgreSQL).
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
