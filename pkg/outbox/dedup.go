package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// DedupConfig configures a Dedup.
type DedupConfig struct {
	// Table records the processed ids, "schema.table" or "table" (schema
	// public), plain identifiers, quoted. Default "public.processed_events".
	Table string `yaml:"table"`
	// Consumer names the consumer (group) whose processing is recorded;
	// it is part of the key, so several consumers can share the table and
	// each processes every event once. Default "" (one consumer).
	Consumer string `yaml:"consumer"`
}

// WithDefaults returns c with every empty field set to its default.
func (c DedupConfig) WithDefaults() DedupConfig {
	if c.Table == "" {
		c.Table = DefaultDedupTable
	}
	return c
}

// Validate reports the first problem of c after defaults.
func (c DedupConfig) Validate() error {
	c = c.WithDefaults()
	if _, err := quoteTable(c.Table); err != nil {
		return err
	}
	if strings.IndexByte(c.Consumer, 0) >= 0 {
		return errors.New("outbox: consumer name contains a NUL byte")
	}
	return nil
}

// ErrEmptyEventID is returned by Process and ProcessSQL for an empty id.
var ErrEmptyEventID = errors.New("outbox: empty event id")

// Dedup makes a consumer's handling of an event happen at most once, given
// an at-least-once delivery such as Kafka's: the relay, like Debezium, may
// deliver an event again after a restart.
//
// The pattern: for each delivered event, in one transaction of the
// consumer's own database,
//
//  1. call Process with the event's id (the Kafka header "id");
//  2. if it returns false, the event was processed before: commit (or roll
//     back) and skip it;
//  3. otherwise apply the event's change and commit.
//
// Because the id is recorded in the same transaction as the change, both
// commit or neither does: a crash between them leaves no trace, and the
// redelivered event is processed then. Commit the Kafka offset after the
// database commit.
//
// Process inserts the id with INSERT ... ON CONFLICT (consumer, event_id)
// DO NOTHING: a table without that unique key (one EnsureSchema found
// already made, of another shape) makes Process fail rather than take
// another consumer's record for this one's. When two
// transactions process the same id at once, the second waits on the first's
// row lock: if the first commits, the second gets false; if it rolls back,
// the second gets true. In REPEATABLE READ or SERIALIZABLE transactions the
// second may fail with a serialization error (SQLSTATE 40001) instead;
// retry the transaction then.
//
// The table has the columns consumer text, event_id text and processed_at
// timestamptz (default now()), with primary key (consumer, event_id); see
// EnsureSchema. It grows by one row per event: Prune removes old rows once
// redelivery of such old events is impossible.
//
// A Dedup holds only its configuration and is safe for concurrent use.
type Dedup struct {
	cfg       DedupConfig
	table     string
	createSQL string
	insertSQL string
	pruneSQL  string
}

// NewDedup returns a Dedup for cfg after defaults.
func NewDedup(cfg DedupConfig) (*Dedup, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	table, _ := quoteTable(cfg.Table) // validated
	return &Dedup{
		cfg:   cfg,
		table: table,
		createSQL: "CREATE TABLE IF NOT EXISTS " + table + ` (
    consumer     text        NOT NULL DEFAULT '',
    event_id     text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
)`,
		insertSQL: "INSERT INTO " + table + " (consumer, event_id) VALUES ($1, $2) ON CONFLICT (consumer, event_id) DO NOTHING",
		pruneSQL:  "DELETE FROM " + table + " WHERE consumer = $1 AND processed_at < $2",
	}, nil
}

// Config returns the Dedup's configuration, defaults filled in.
func (d *Dedup) Config() DedupConfig { return d.cfg }

// EnsureSchema creates the table if it does not exist. It is safe to call
// at every start, from several processes at once. Call it outside a
// transaction: a concurrent creation aborts the transaction that loses.
func (d *Dedup) EnsureSchema(ctx context.Context, db PgxExecer) error {
	return d.ensureSchema(ctx, pgxExec{db})
}

// EnsureSchemaSQL is EnsureSchema for database/sql.
func (d *Dedup) EnsureSchemaSQL(ctx context.Context, db SQLExecer) error {
	return d.ensureSchema(ctx, sqlExec{db})
}

func (d *Dedup) ensureSchema(ctx context.Context, db execer) error {
	var err error
	for range 3 {
		_, err = db.exec(ctx, d.createSQL, nil)
		// CREATE TABLE IF NOT EXISTS is not safe against a concurrent CREATE
		// of the same table: the loser fails on a catalog's unique index
		// (23505), or on the table's row type (42710) or relation (42P07)
		// found created, once the winner has committed. Trying again then
		// finds the table; a name taken by something else fails again.
		if state := sqlState(err); state != "23505" && state != "42710" && state != "42P07" {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("outbox: create table %s: %w", d.cfg.Table, err)
	}
	return nil
}

// Process records that the consumer processes eventID in tx, and reports
// whether this is the first time: false means an earlier transaction that
// committed has processed it already, and the caller should skip the
// event. See Dedup for the pattern. Any error aborts the transaction (as
// for Write): roll it back.
func (d *Dedup) Process(ctx context.Context, tx pgx.Tx, eventID string) (first bool, err error) {
	if tx == nil {
		return false, ErrNoTx
	}
	return d.process(ctx, pgxExec{tx}, eventID)
}

// ProcessSQL is Process for a database/sql transaction.
func (d *Dedup) ProcessSQL(ctx context.Context, tx *sql.Tx, eventID string) (first bool, err error) {
	if tx == nil {
		return false, ErrNoTx
	}
	return d.process(ctx, sqlExec{tx}, eventID)
}

func (d *Dedup) process(ctx context.Context, db execer, eventID string) (bool, error) {
	first, err := d.record(ctx, db, eventID)
	if err != nil {
		// Committing would keep the consumer's change without the record
		// that it processed the event: delivered again, it would be
		// processed twice.
		return false, failTx(ctx, db, err)
	}
	return first, nil
}

func (d *Dedup) record(ctx context.Context, db execer, eventID string) (bool, error) {
	if eventID == "" {
		return false, ErrEmptyEventID
	}
	n, err := db.exec(ctx, d.insertSQL, []any{d.cfg.Consumer, eventID})
	if err != nil {
		return false, fmt.Errorf("outbox: record event %s in %s: %w", eventID, d.cfg.Table, err)
	}
	return n == 1, nil
}

// Prune deletes this consumer's records of events processed before t and
// returns how many it deleted. Choose t so that no event that old can be
// delivered again (older than the topic's retention, say).
func (d *Dedup) Prune(ctx context.Context, db PgxExecer, before time.Time) (int64, error) {
	return d.prune(ctx, pgxExec{db}, before)
}

// PruneSQL is Prune for database/sql.
func (d *Dedup) PruneSQL(ctx context.Context, db SQLExecer, before time.Time) (int64, error) {
	return d.prune(ctx, sqlExec{db}, before)
}

func (d *Dedup) prune(ctx context.Context, db execer, before time.Time) (int64, error) {
	n, err := db.exec(ctx, d.pruneSQL, []any{d.cfg.Consumer, before})
	if err != nil {
		return 0, fmt.Errorf("outbox: prune %s before %s: %w", d.cfg.Table, before.Format(time.RFC3339), err)
	}
	return n, nil
}

// sqlState returns the SQLSTATE of a PostgreSQL error from pgx (also
// through database/sql) or any driver whose errors have a SQLState method.
func sqlState(err error) string {
	var pgErr interface{ SQLState() string }
	if errors.As(err, &pgErr) {
		return pgErr.SQLState()
	}
	return ""
}
