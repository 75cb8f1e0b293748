package testenv

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// PGLog is a place in PostgreSQL's log (DIR/pg/postgresql.log): Lines
// returns what the server logged after it. Lines start with
// "<time> [<pid>] <user>@<database> <application_name>: " (log_line_prefix
// '%m [%p] %q%u@%d %a: '), so a test picks its own by its database.
type PGLog struct {
	path   string
	offset int64
}

// MarkPGLog returns the current end of PostgreSQL's log. It fails the test
// when the environment has no directory (the log is in it).
func (e *Env) MarkPGLog(t testing.TB) PGLog {
	t.Helper()
	if e.Dir == "" {
		t.Fatalf("testenv: %s is not set, so PostgreSQL's log cannot be read", envDir)
	}
	l := PGLog{path: filepath.Join(e.Dir, "pg", "postgresql.log")}
	st, err := os.Stat(l.path)
	if err != nil {
		t.Fatalf("testenv: PostgreSQL's log: %v", err)
	}
	l.offset = st.Size()
	return l
}

// Lines returns the lines logged since the mark that contain every one of
// the substrings (all lines when none is given).
func (l PGLog) Lines(t testing.TB, substrings ...string) []string {
	t.Helper()
	f, err := os.Open(l.path)
	if err != nil {
		t.Fatalf("testenv: PostgreSQL's log: %v", err)
	}
	defer f.Close()
	if _, err := f.Seek(l.offset, io.SeekStart); err != nil {
		t.Fatalf("testenv: PostgreSQL's log: %v", err)
	}
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		keep := true
		for _, s := range substrings {
			if !bytes.Contains(line, []byte(s)) {
				keep = false
				break
			}
		}
		if keep {
			out = append(out, string(line))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("testenv: PostgreSQL's log: %v", err)
	}
	return out
}
