package secret

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for body, want := range map[string]string{"pw\n": "pw", "pw\r\n": "pw", "pw": "pw", "pw\n\n": "pw\n", " pw ": " pw "} {
		got, err := ReadFile("x.password.file", write("f", body))
		if err != nil || got != want {
			t.Errorf("%q: got %q, %v; want %q", body, got, err, want)
		}
	}
	_, err := ReadFile("x.password.file", write("empty", "\n"))
	if err == nil || !strings.Contains(err.Error(), "x.password.file") || !strings.Contains(err.Error(), "is empty") {
		t.Errorf("empty file: %v", err)
	}
	_, err = ReadFile("x.password.file", filepath.Join(dir, "missing"))
	if err == nil || !strings.Contains(err.Error(), "x.password.file: cannot read the password file") || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing file: %v", err)
	}
}
