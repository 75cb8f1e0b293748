package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func completionScript(t *testing.T, shell string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := run([]string{"completion", shell}, nil, &out, &errOut); code != exitOK {
		t.Fatalf("completion %s: exit %d: %s", shell, code, errOut.String())
	}
	return out.String()
}

// TestBashCompletion sources the generated script in a real bash and asks
// it for completions as bash would, word by word.
func TestBashCompletion(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash on this machine")
	}
	script := filepath.Join(t.TempDir(), "pgoutbox.bash")
	if err := os.WriteFile(script, []byte(completionScript(t, "bash")), 0o600); err != nil {
		t.Fatal(err)
	}
	complete := func(words ...string) string {
		t.Helper()
		// COMP_WORDS holds the words typed so far; the last is the one
		// being completed.
		var quoted []string
		for _, w := range words {
			quoted = append(quoted, "'"+w+"'")
		}
		prog := "source " + script + "\nCOMP_WORDS=(" + strings.Join(quoted, " ") + ")\nCOMP_CWORD=" +
			string(rune('0'+len(words)-1)) + "\n_pgoutbox\necho \"${COMPREPLY[*]}\"\n"
		out, err := exec.Command(bash, "--norc", "--noprofile", "-c", prog).CombinedOutput()
		if err != nil {
			t.Fatalf("bash: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	cases := []struct {
		words []string
		want  string
	}{
		{[]string{"pgoutbox", "va"}, "validate"},
		{[]string{"pgoutbox", "ver"}, "version"},
		{[]string{"pgoutbox", "status", "--fo"}, "--format"},
		{[]string{"pgoutbox", "status", "--format", ""}, "table json"},
		{[]string{"pgoutbox", "run", "--log-level", "w"}, "warn"},
		{[]string{"pgoutbox", "validate", "--to"}, "--topics"},
		{[]string{"pgoutbox", "migrate", "--pr"}, "--print"},
		{[]string{"pgoutbox", "completion", "f"}, "fish"},
	}
	for _, c := range cases {
		if got := complete(c.words...); got != c.want {
			t.Errorf("%q: completions %q, want %q", strings.Join(c.words, " "), got, c.want)
		}
	}
}

// The flags in the scripts come from the commands' own --help; every
// flag a command defines must be offered.
func TestCompletionOffersEveryFlag(t *testing.T) {
	flags := commandFlags(nil)
	if !strings.Contains(strings.Join(flags["run"], " "), "dsn") || len(flags["validate"]) < 8 {
		t.Fatalf("flags read from --help look wrong: %v", flags)
	}
	bash, fish := completionScript(t, "bash"), completionScript(t, "fish")
	zsh := completionScript(t, "zsh")
	for cmd, names := range flags {
		for _, n := range names {
			if !strings.Contains(bash, "--"+n) {
				t.Errorf("bash script lacks --%s (%s)", n, cmd)
			}
			if !strings.Contains(fish, "__fish_seen_subcommand_from "+cmd+"' -o "+n) {
				t.Errorf("fish script lacks -o %s for %s", n, cmd)
			}
		}
	}
	if !strings.HasPrefix(zsh, "#compdef pgoutbox\n") || !strings.Contains(zsh, "bashcompinit") {
		t.Errorf("zsh script header:\n%s", zsh[:min(len(zsh), 200)])
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"completion", "tcsh"}, nil, &out, &errOut); code != exitConfig || !strings.Contains(errOut.String(), `unknown shell "tcsh"`) {
		t.Errorf("unknown shell: exit %d, %q", code, errOut.String())
	}
}
