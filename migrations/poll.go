package migrations

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"text/template"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

//go:embed 0002_poll.sql
var pollSQL string

//go:embed 0003_poll_notify.sql
var pollNotifySQL string

//go:embed 0004_poll_state.sql
var pollStateSQL string

var (
	pollTemplate       = template.Must(template.New("0002_poll.sql").Option("missingkey=error").Parse(pollSQL))
	pollNotifyTemplate = template.Must(template.New("0003_poll_notify.sql").Option("missingkey=error").Parse(pollNotifySQL))
	pollStateTemplate  = template.Must(template.New("0004_poll_state.sql").Option("missingkey=error").Parse(pollStateSQL))
)

// PollParams name what the poll source's migration creates for one table.
type PollParams struct {
	// Table is the schema-qualified outbox table.
	Table string
	// Notify creates the notification trigger (on Channel); without it the
	// trigger is dropped, so that writers no longer pay for it.
	Notify  bool
	Channel string
	// LockTimeout bounds each wait of ApplyPoll for a lock on the table,
	// and LockAttempts is how many times it tries (DefaultLockTimeout and
	// DefaultLockAttempts when zero).
	LockTimeout  time.Duration
	LockAttempts int
}

// NotifyTrigger is the name of the poll source's trigger on its table.
const NotifyTrigger = "pgoutbox_notify"

// KeepTrigger is the poll source's trigger that skips the deletes of rows
// not published yet, unless DeleteUnpublished is on in the session (the
// setting 0002_poll.sql's functions read). KeepTruncateTrigger refuses a
// TRUNCATE of the table while it holds unpublished rows.
const (
	KeepTrigger         = "pgoutbox_keep_unpublished"
	KeepTruncateTrigger = "pgoutbox_keep_unpublished_truncate"
	DeleteUnpublished   = "pgoutbox.delete_unpublished"
)

// PollStateTable is the table, in each poll table's schema, where the
// poll source records the table it last checked under each name
// (0004_poll_state.sql).
const PollStateTable = "pgoutbox_poll_state"

// PollState returns the quoted name of the poll source's record table for
// the poll table table (schema.table, or table for public), and the
// statement that creates it if it does not exist.
func PollState(table string) (quoted, create string, err error) {
	schema, _, ok := strings.Cut(table, ".")
	if !ok {
		schema = "public"
	}
	if _, err := Ident(table); err != nil {
		return "", "", err
	}
	quoted = pgx.Identifier{schema, PollStateTable}.Sanitize()
	var b bytes.Buffer
	if err := pollStateTemplate.Execute(&b, map[string]string{"StateTable": quoted}); err != nil {
		return "", "", fmt.Errorf("migrations: render the poll record of %s: %w", table, err)
	}
	return quoted, b.String(), nil
}

// PollPlan says which of the poll migration's statements that lock the
// table run: ALTER TABLE and CREATE TRIGGER take locks that conflict with
// an application's INSERT, and so does CREATE INDEX IF NOT EXISTS even
// when the index exists. Each is true only when the catalog shows its
// object missing or different (PlanPoll), so that migrate run again on a
// table that has it all takes no such lock: upgrading users run migrate
// while the relays run, and a lock request queued behind a poll claim
// waiting on Kafka makes every INSERT queue behind it.
type PollPlan struct {
	// TableExists is false when the table is made: everything runs then.
	TableExists                                      bool
	CreatedAt, Seq, PublishedAt, Attempts, LastError bool // columns to add
	UnpublishedIndex, PublishedIndex                 bool
	// KeepTrigger and KeepTruncateTrigger are (re)created when missing,
	// disabled, firing in replica mode only, or different; each is then
	// made to fire always (ENABLE ALWAYS).
	KeepTrigger, KeepTruncateTrigger bool
	// KeepAlways and KeepTruncateAlways: the trigger is current but fires
	// in origin mode only (as created by earlier versions), so that a
	// session with session_replication_role = replica deletes or
	// truncates unpublished rows unchecked: ALTER TABLE ... ENABLE ALWAYS
	// TRIGGER alone runs.
	KeepAlways, KeepTruncateAlways bool
	// NotifyTrigger is (re)created with Notify; DropNotifyTrigger drops an
	// existing one without it.
	NotifyTrigger, DropNotifyTrigger bool
}

// fullPlan runs every statement: for a table not there yet, and for
// --print, which cannot know what exists.
func fullPlan(notify bool) PollPlan {
	return PollPlan{CreatedAt: true, Seq: true, PublishedAt: true, Attempts: true, LastError: true,
		UnpublishedIndex: true, PublishedIndex: true, KeepTrigger: true, KeepTruncateTrigger: true,
		KeepAlways: true, KeepTruncateAlways: true,
		NotifyTrigger: notify, DropNotifyTrigger: !notify}
}

// Changes names what the plan adds to or changes on an existing table
// (nil: nothing, and the migration takes no lock on the table).
func (p PollPlan) Changes() []string {
	var out []string
	add := func(on bool, what string) {
		if on {
			out = append(out, what)
		}
	}
	add(p.CreatedAt, "column created_at")
	add(p.Seq, "column seq")
	add(p.PublishedAt, "column published_at")
	add(p.Attempts, "column attempts")
	add(p.LastError, "column last_error")
	add(p.UnpublishedIndex, "the unpublished rows' index")
	add(p.PublishedIndex, "the published rows' index")
	add(p.KeepTrigger, "trigger "+KeepTrigger)
	add(p.KeepTruncateTrigger, "trigger "+KeepTruncateTrigger)
	add(p.KeepAlways && !p.KeepTrigger, "ENABLE ALWAYS of trigger "+KeepTrigger)
	add(p.KeepTruncateAlways && !p.KeepTruncateTrigger, "ENABLE ALWAYS of trigger "+KeepTruncateTrigger)
	add(p.NotifyTrigger, "trigger "+NotifyTrigger)
	add(p.DropNotifyTrigger, "drop trigger "+NotifyTrigger)
	return out
}

// pollNames are the quoted and plain names of the poll migration's
// objects for one table.
type pollNames struct {
	schema, rel, table                           string // table: quoted schema.table
	unpublishedIdx, publishedIdx                 string // plain names
	function, keepFunction, keepTruncateFunction string // quoted schema.name
}

func namesOf(table string) (pollNames, error) {
	schema, rel, ok := strings.Cut(table, ".")
	if !ok {
		schema, rel = "public", table
	}
	q, err := Ident(schema + "." + rel)
	if err != nil {
		return pollNames{}, err
	}
	index := func(suffix string) string {
		name := rel
		if len(name)+len(suffix) > 63 {
			name = name[:63-len(suffix)]
		}
		return name + suffix
	}
	return pollNames{schema: schema, rel: rel, table: q,
		unpublishedIdx: index("_unpublished_seq_idx"), publishedIdx: index("_published_at_idx"),
		function:             pgx.Identifier{schema, "pgoutbox_notify"}.Sanitize(),
		keepFunction:         pgx.Identifier{schema, KeepTrigger}.Sanitize(),
		keepTruncateFunction: pgx.Identifier{schema, KeepTruncateTrigger}.Sanitize(),
	}, nil
}

// queryer is a connection or a transaction.
type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// PlanPoll reads the catalog and returns which of the poll migration's
// statements that lock the table p would run now. It takes no lock on the
// table.
func PlanPoll(ctx context.Context, q queryer, p PollParams) (PollPlan, error) {
	n, err := namesOf(p.Table)
	if err != nil {
		return PollPlan{}, err
	}
	var exists bool
	if err := q.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", n.table).Scan(&exists); err != nil {
		return PollPlan{}, fmt.Errorf("migrations: look up %s: %w", p.Table, err)
	}
	if !exists {
		plan := fullPlan(p.Notify)
		plan.DropNotifyTrigger = false
		return plan, nil
	}
	plan := PollPlan{TableExists: true}
	have := map[string]bool{}
	rows, err := q.Query(ctx, `SELECT attname::text FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped
		UNION ALL SELECT 'index:' || c.relname FROM pg_class c WHERE c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = to_regclass($1))
			AND c.relname = ANY($2::text[])`, n.table, []string{n.unpublishedIdx, n.publishedIdx})
	if err != nil {
		return PollPlan{}, fmt.Errorf("migrations: read the columns of %s: %w", p.Table, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return PollPlan{}, fmt.Errorf("migrations: read the columns of %s: %w", p.Table, err)
	}
	for _, c := range names {
		have[c] = true
	}
	plan.CreatedAt, plan.Seq, plan.PublishedAt = !have["created_at"], !have["seq"], !have["published_at"]
	plan.Attempts, plan.LastError = !have["attempts"], !have["last_error"]
	plan.UnpublishedIndex, plan.PublishedIndex = !have["index:"+n.unpublishedIdx], !have["index:"+n.publishedIdx]

	// A trigger is current when it fires in origin mode and is what the
	// migration makes: its timing and events (tgtype), function, arguments
	// and WHEN. A keep trigger must also fire always (tgenabled 'A'): one
	// that fires in origin mode only ('O') needs ENABLE ALWAYS alone.
	type want struct {
		tgtype   int16
		function string
		args     []byte
		when     string
	}
	wanted := map[string]want{
		KeepTrigger:         {tgtype: 11 /* ROW | BEFORE | DELETE */, function: n.keepFunction, when: "(old.published_at IS NULL)"},
		KeepTruncateTrigger: {tgtype: 34 /* BEFORE | TRUNCATE */, function: n.keepTruncateFunction},
		NotifyTrigger:       {tgtype: 4 /* AFTER INSERT, per statement */, function: n.function, args: []byte(p.Channel + "\x00")},
	}
	current := map[string]bool{}
	present := map[string]bool{}
	always := map[string]bool{}
	rows, err = q.Query(ctx, `SELECT tgname::text, tgtype, tgenabled::text, coalesce(tgfoid = to_regprocedure(CASE tgname
			WHEN $2 THEN $3 WHEN $4 THEN $5 ELSE $6 END || '()'), false),
			tgargs, coalesce(substring(pg_get_triggerdef(oid) from ' WHEN \((.*)\) EXECUTE '), '')
		FROM pg_trigger WHERE tgrelid = to_regclass($1) AND NOT tgisinternal AND tgname IN ($2, $4, $7)`,
		n.table, KeepTrigger, n.keepFunction, KeepTruncateTrigger, n.keepTruncateFunction, n.function, NotifyTrigger)
	if err != nil {
		return PollPlan{}, fmt.Errorf("migrations: read the triggers of %s: %w", p.Table, err)
	}
	var (
		name, enabled string
		tgtype        int16
		same          bool
		args          []byte
		when          string
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &tgtype, &enabled, &same, &args, &when}, func() error {
		w := wanted[name]
		present[name] = true
		current[name] = (enabled == "O" || enabled == "A") && same && tgtype == w.tgtype && bytes.Equal(args, w.args) && when == w.when
		always[name] = enabled == "A"
		return nil
	})
	if err != nil {
		return PollPlan{}, fmt.Errorf("migrations: read the triggers of %s: %w", p.Table, err)
	}
	plan.KeepTrigger, plan.KeepTruncateTrigger = !current[KeepTrigger], !current[KeepTruncateTrigger]
	plan.KeepAlways, plan.KeepTruncateAlways = !always[KeepTrigger], !always[KeepTruncateTrigger]
	plan.NotifyTrigger = p.Notify && !current[NotifyTrigger]
	plan.DropNotifyTrigger = !p.Notify && present[NotifyTrigger]
	return plan, nil
}

// pollStatements renders the statements of the poll migration, in order,
// with the table-locking ones plan names.
func pollStatements(p PollParams, plan PollPlan) ([]string, error) {
	n, err := namesOf(p.Table)
	if err != nil {
		return nil, err
	}
	_, state, err := PollState(p.Table)
	if err != nil {
		return nil, err
	}
	vals := map[string]any{
		"Table":                n.table,
		"UnpublishedIndex":     pgx.Identifier{n.unpublishedIdx}.Sanitize(),
		"PublishedIndex":       pgx.Identifier{n.publishedIdx}.Sanitize(),
		"Function":             n.function,
		"Trigger":              pgx.Identifier{NotifyTrigger}.Sanitize(),
		"KeepFunction":         n.keepFunction,
		"KeepTrigger":          pgx.Identifier{KeepTrigger}.Sanitize(),
		"KeepTruncateFunction": n.keepTruncateFunction,
		"KeepTruncateTrigger":  pgx.Identifier{KeepTruncateTrigger}.Sanitize(),
		"Channel":              "'" + strings.ReplaceAll(p.Channel, "'", "''") + "'",
		"Plan":                 plan,
	}
	var b bytes.Buffer
	if err := pollTemplate.Execute(&b, vals); err != nil {
		return nil, fmt.Errorf("migrations: render the poll table %s: %w", p.Table, err)
	}
	stmts := []string{b.String()}
	if p.Notify {
		b.Reset()
		if err := pollNotifyTemplate.Execute(&b, vals); err != nil {
			return nil, fmt.Errorf("migrations: render the poll trigger of %s: %w", p.Table, err)
		}
		stmts = append(stmts, b.String())
	} else if plan.DropNotifyTrigger {
		stmts = append(stmts, "DROP TRIGGER IF EXISTS "+vals["Trigger"].(string)+" ON "+n.table+";\n")
	}
	return append(stmts, state), nil
}

// RenderPoll returns the SQL ApplyPoll runs, for `pgoutbox migrate --print`:
// every statement, as for a table that lacks everything (ApplyPoll runs
// the ones that lock the table only for what is missing).
func RenderPoll(p PollParams) ([]string, error) { return pollStatements(p, fullPlan(p.Notify)) }

// The bounds of ApplyPoll's waits for a lock on the table, when
// PollParams leaves them zero.
const (
	DefaultLockTimeout  = 2 * time.Second
	DefaultLockAttempts = 5
)

// LockHolder is a session that holds a lock on a table.
type LockHolder struct {
	PID             uint32
	Modes           string
	ApplicationName string
	ClientAddr      string
	State           string
	XactStart       *time.Time
}

func (h LockHolder) String() string {
	s := fmt.Sprintf("PID %d (application_name %q", h.PID, h.ApplicationName)
	if h.ClientAddr != "" {
		s += " from " + h.ClientAddr
	}
	s += fmt.Sprintf(", state %q", h.State)
	if h.XactStart != nil {
		s += fmt.Sprintf(", transaction started %s, %s ago", h.XactStart.UTC().Format(time.RFC3339), time.Since(*h.XactStart).Round(time.Second))
	}
	return s + ", holding " + h.Modes + ")"
}

// LockError is returned by ApplyPoll when the migration did not get its
// lock on the table within its attempts. Nothing was changed.
type LockError struct {
	Table    string
	Attempts int
	Timeout  time.Duration
	Changes  []string // what needed the lock
	Holders  []LockHolder
	Err      error // the last attempt's
}

func (e *LockError) Error() string {
	held := "no session holds a lock on it any more"
	if len(e.Holders) > 0 {
		hs := make([]string, len(e.Holders))
		for i, h := range e.Holders {
			hs[i] = h.String()
		}
		held = "sessions holding locks on it: " + strings.Join(hs, "; ")
	}
	return fmt.Sprintf("migrations: poll table %s: no lock on it in %d attempts of lock_timeout %s, needed to add %s; nothing was changed. %s. Run migrate again once they end (a poll relay's claim ends when Kafka answers, or the relay stops), or with a longer --lock-timeout; each wait holds up the table's INSERTs for as long",
		e.Table, e.Attempts, e.Timeout, strings.Join(e.Changes, ", "), held)
}

func (e *LockError) Unwrap() error { return e.Err }

// ApplyOption is an option of ApplyPoll.
type ApplyOption func(*applyOptions)

type applyOptions struct {
	waited func(attempt int, err *LockError)
}

// OnLockWait has ApplyPoll call f after each attempt that did not get its
// lock, before it tries again.
func OnLockWait(f func(attempt int, err *LockError)) ApplyOption {
	return func(o *applyOptions) { o.waited = f }
}

// ApplyPoll creates (or completes) the poll table, its indexes and its
// trigger, and the table of the poll source's record (PollState), in one
// transaction. It is idempotent. The statements that lock the table run
// only for what the catalog shows missing (PollPlan), each waiting for its
// lock at most p.LockTimeout; the transaction is tried p.Attempts times
// before a *LockError names the sessions holding the table.
func ApplyPoll(ctx context.Context, conn *pgx.Conn, p PollParams, opts ...ApplyOption) error {
	var o applyOptions
	for _, opt := range opts {
		opt(&o)
	}
	timeout, attempts := p.LockTimeout, p.LockAttempts
	if timeout <= 0 {
		timeout = DefaultLockTimeout
	}
	if attempts <= 0 {
		attempts = DefaultLockAttempts
	}
	for attempt := 1; ; attempt++ {
		plan, err := applyPollOnce(ctx, conn, p, timeout)
		var pe *pgconn.PgError
		if err == nil || !errors.As(err, &pe) || pe.Code != "55P03" { // lock_not_available
			return err
		}
		le := &LockError{Table: p.Table, Attempts: attempt, Timeout: timeout, Changes: plan.Changes(), Err: err}
		if le.Holders, err = lockHolders(ctx, conn, p.Table); err != nil {
			return fmt.Errorf("%w (and reading who holds it: %v)", le, err)
		}
		if attempt >= attempts {
			return le
		}
		if o.waited != nil {
			o.waited(attempt, le)
		}
		select {
		case <-ctx.Done():
			return le
		case <-time.After(timeout):
		}
	}
}

func applyPollOnce(ctx context.Context, conn *pgx.Conn, p PollParams, lockTimeout time.Duration) (PollPlan, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return PollPlan{}, fmt.Errorf("migrations: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit this is a no-op
	if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", fmt.Sprintf("%dms", max(lockTimeout.Milliseconds(), 1))); err != nil {
		return PollPlan{}, fmt.Errorf("migrations: set lock_timeout: %w", err)
	}
	plan, err := PlanPoll(ctx, tx, p)
	if err != nil {
		return PollPlan{}, err
	}
	stmts, err := pollStatements(p, plan)
	if err != nil {
		return plan, err
	}
	for _, s := range stmts {
		// Each rendered file holds several statements: the simple protocol
		// runs them in one go.
		if _, err := tx.Exec(ctx, s, pgx.QueryExecModeSimpleProtocol); err != nil {
			return plan, fmt.Errorf("migrations: poll table %s: %w", p.Table, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return plan, fmt.Errorf("migrations: commit: %w", err)
	}
	return plan, nil
}

// lockHolders reads the sessions other than this one holding a lock on
// table.
func lockHolders(ctx context.Context, conn *pgx.Conn, table string) ([]LockHolder, error) {
	q, err := Ident(table)
	if err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, `SELECT l.pid, string_agg(DISTINCT l.mode, ', '), coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''),
			coalesce(a.state, ''), a.xact_start
		FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'relation' AND l.relation = to_regclass($1) AND l.granted AND l.pid <> pg_backend_pid()
		GROUP BY l.pid, a.application_name, a.client_addr, a.state, a.xact_start
		ORDER BY a.xact_start NULLS LAST, l.pid`, q)
	if err != nil {
		return nil, err
	}
	var out []LockHolder
	var h LockHolder
	_, err = pgx.ForEachRow(rows, []any{&h.PID, &h.Modes, &h.ApplicationName, &h.ClientAddr, &h.State, &h.XactStart}, func() error {
		out = append(out, h)
		h.XactStart = nil
		return nil
	})
	return out, err
}
