package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
)

// maxNameLen is PostgreSQL's identifier limit, which also bounds replication
// slot names; Kafka allows longer topic names.
const maxNameLen = 63

// UniqueName returns a fresh name made of prefix, the test's name and a
// random suffix, using only lower-case letters, digits and underscores and
// at most 63 bytes: valid unquoted as a PostgreSQL database, table or
// replication slot name and as a Kafka topic.
func UniqueName(t testing.TB, prefix string) string {
	t.Helper()
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("testenv: random name: %v", err)
	}
	suffix := hex.EncodeToString(b[:])
	clean := func(s string) string {
		var sb strings.Builder
		under := false
		for _, r := range strings.ToLower(s) {
			if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
				sb.WriteRune(r)
				under = false
			} else if !under && sb.Len() > 0 {
				sb.WriteByte('_')
				under = true
			}
		}
		return strings.Trim(sb.String(), "_")
	}
	p := clean(prefix)
	if p == "" || p[0] >= '0' && p[0] <= '9' {
		p = "t" + p
	}
	if len(p) > 16 {
		p = p[:16]
	}
	name := clean(strings.TrimPrefix(t.Name(), "Test"))
	if room := maxNameLen - len(p) - len(suffix) - 2; len(name) > room {
		name = strings.TrimRight(name[:room], "_")
	}
	if name == "" {
		return p + "_" + suffix
	}
	return p + "_" + name + "_" + suffix
}
