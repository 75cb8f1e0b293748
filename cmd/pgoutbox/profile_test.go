package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestProfilesAreWrittenWhenAskedFor(t *testing.T) {
	dir := t.TempDir()
	cpu, mem, tr := filepath.Join(dir, "cpu.prof"), filepath.Join(dir, "mem.prof"), filepath.Join(dir, "trace.out")
	var stderr bytes.Buffer
	stop := startProfiles([]string{"PATH=/bin", envCPUProfile + "=" + cpu, envMemProfile + "=" + mem, envTrace + "=" + tr}, &stderr)
	stop()
	for _, p := range []string{cpu, mem, tr} {
		if st, err := os.Stat(p); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v (stderr %q)", p, err, stderr.String())
		}
	}
	stop = startProfiles([]string{"PATH=/bin"}, &stderr)
	stop()
	if stderr.Len() != 0 {
		t.Errorf("stderr %q", stderr.String())
	}
	// A profile that cannot be written is reported, and the run goes on.
	stop = startProfiles([]string{envCPUProfile + "=" + filepath.Join(dir, "missing", "cpu.prof")}, &stderr)
	stop()
	if !bytes.Contains(stderr.Bytes(), []byte(envCPUProfile)) {
		t.Errorf("stderr %q does not name %s", stderr.String(), envCPUProfile)
	}
}
