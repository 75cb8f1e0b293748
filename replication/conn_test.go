package replication

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPasswordOptionsOverrideTheDSNsAndKeepItsTLS(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "pw")
	if err := os.WriteFile(file, []byte("from-file\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const dsn = "postgres://app:in-dsn@127.0.0.1:5432/shop?sslmode=require"
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"dsn", Config{DSN: dsn}, "in-dsn"},
		{"password", Config{DSN: dsn, Password: "inline"}, "inline"},
		{"password file", Config{DSN: dsn, PasswordFile: file}, "from-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sql, err := tc.cfg.SQLConfig()
			if err != nil {
				t.Fatal(err)
			}
			repl, err := tc.cfg.replicationConfig()
			if err != nil {
				t.Fatal(err)
			}
			if sql.Password != tc.want || repl.Password != tc.want {
				t.Fatalf("passwords %q and %q, want %q", sql.Password, repl.Password, tc.want)
			}
			// sslmode=require: TLS on both connections.
			if sql.TLSConfig == nil || repl.TLSConfig == nil {
				t.Fatal("sslmode=require lost its TLS configuration")
			}
			if repl.RuntimeParams["replication"] != "database" {
				t.Fatalf("replication connection params %v", repl.RuntimeParams)
			}
		})
	}
}

func TestPasswordFileErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		missing: "postgres: password.file: cannot read the password file: open " + missing,
		empty:   "postgres: password.file: the password file " + empty + " is empty",
	} {
		c := Config{DSN: "postgres://app@h/db", PasswordFile: path}
		if _, err := c.SQLConfig(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", path, err, want)
		}
	}
	c := DefaultConfig()
	c.DSN, c.Password, c.PasswordFile = "postgres://h/db", "x", empty
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "password and password.file") {
		t.Fatalf("both set: %v", err)
	}
	bad := Config{DSN: "postgres://u:s3cret@host:notaport/db"}
	if _, err := bad.SQLConfig(); !errors.Is(err, ErrInvalidDSN) || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("invalid DSN: %v", err)
	}
}
