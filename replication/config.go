package replication

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
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
	// ConnectTimeout bounds each connection attempt.
	ConnectTimeout time.Duration `yaml:"connect.timeout"`
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
		ConnectTimeout:        10 * time.Second,
	}
}

var (
	slotNameRE  = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)
	identRE     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)
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
		return fmt.Errorf("replication: invalid publication.name %q: use a letter or underscore followed by up to 62 letters, digits, underscores or $", name)
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
		return "", "", fmt.Errorf("replication: invalid table %q in table.include.list: use schema.table with plain identifiers", t)
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
	return nil
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
