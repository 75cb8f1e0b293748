package router

import (
	"strings"
	"testing"
)

func TestTranslateJavaRegex(t *testing.T) {
	for _, c := range []struct{ java, want string }{
		{`(?<routedByValue>.*)`, `(?P<routedByValue>[^\n\r\x{85}\x{2028}\x{2029}]*)`}, // Java's . (below)
		{`(?s)(?<v>.*)`, `(?s)(?P<v>.*)`},                                             // DOTALL: . is Go's
		{`(?<a>x)(?<b2>y)`, `(?P<a>x)(?P<b2>y)`},
		{`\(?<a>x\)`, `\(?<a>x\)`},                // escaped paren is no group
		{`[(?<a>]`, `[(?<a>]`},                    // inside a class
		{`[]a](?<b>c)`, `[]a](?P<b>c)`},           // leading ] is literal
		{`[^]a](?<b>c)`, `[^]a](?P<b>c)`},         // after ^ too
		{`\Q(?<a>\E(?<b>c)`, `\Q(?<a>\E(?P<b>c)`}, // quoted
		{`\Q(?<a>`, `\Q(?<a>\E`},                  // an open quote is closed
		{`(?:x)(?i)y(?=z)`, `(?:x)(?i)y(?=z)`},    // others untouched (Go rejects lookahead later)
		{`(?<=x)(?<!y)`, `(?<=x)(?<!y)`},          // lookbehind untouched
		{`a\\(?<b>c)`, `a\\(?P<b>c)`},             // escaped backslash
	} {
		got, err := translateJavaRegex(c.java)
		if err != nil || got != c.want {
			t.Errorf("translateJavaRegex(%q) = %q, %v; want %q", c.java, got, err, c.want)
		}
	}
	for _, bad := range []string{`(?<1a>x)`, `(?<a_b>x)`, `(?<>x)`, `(?<a`} {
		if got, err := translateJavaRegex(bad); err == nil {
			t.Errorf("translateJavaRegex(%q) = %q, want an error", bad, got)
		}
	}
}

// TestJavaRegexMatchesAsJavaDoes: constructs that Java and Go both accept
// with different meanings are written out as Java reads them, or refused.
// A hostile prober routed aggregatetype revp_order with
// (?<routedByValue>[a-z_&&[^x]]+): Debezium matched it (intersection), Go
// did not (two &, then a literal [), and pgoutbox sent the record to
// another topic without a word. The expected matches are Java's, each run
// with Pattern.compile(regex).matcher(input).matches() on OpenJDK 17
// (2026-12-07); that is the oracle, not this code.
func TestJavaRegexMatchesAsJavaDoes(t *testing.T) {
	for _, c := range []struct {
		regex, in string
		java      bool
	}{
		{`[]a]+`, "]a", true},
		{`[^]a]+`, "bc", true},
		{`\v`, "\n", true},
		{`\v`, "\x0b", true},
		{`[\v]`, "\n", true},
		{`\s`, "\x0b", true},
		{`[\s]`, "\x0b", true},
		{`\S`, "\x0b", false},
		{`\0101`, "A", true},
		{`\01011`, "A1", true},
		{`\0400`, " 0", true},
		{`\u0041`, "A", true},
		{`[\u0041-\u0043]+`, "ABC", true},
		{`.`, "\r", false},
		{`.`, "\u2028", false},
		{`x&&y`, "x&&y", true},
		{`[a&]`, "&", true},
		{`[\[]`, "[", true},
		{`[a\&&b]`, "&", true},
		{`\uD83D\uDE00`, "\U0001F600", true}, // a surrogate pair is one character
	} {
		tr, err := compileRoute(c.regex, "t")
		if err != nil {
			t.Errorf("compileRoute(%q): %v", c.regex, err)
			continue
		}
		if got := tr.re.MatchString(c.in) && tr.re.FindStringIndex(c.in)[0] == 0 && tr.re.FindStringIndex(c.in)[1] == len(c.in); got != c.java {
			t.Errorf("regex %q on %q: matches %v; Java %v", c.regex, c.in, got, c.java)
		}
	}
	// Java: [a-z_&&[^x]]+ and [a-z[_]]+ match revp_order, [[:alpha:]_]+
	// does not (a nested class of :, a, l, p, h); [a&&b] does not match &.
	// Java: (a)\12 matches "aa2" (group 1, then 2), Go read \12 as an
	// octal newline; (?U) is UNICODE_CHARACTER_CLASS in Java, ungreedy in Go.
	for _, bad := range []string{`(?<routedByValue>[a-z_&&[^x]]+)`, `[a-z[_]]+`, `[[:alpha:]_]+`, `[a&&b]`, `[\S]`, `(a)\12`, `(a)\1`, `(?U)(?<x>\w+)_(?<y>\w+)`} {
		if _, err := compileRoute(bad, "t"); err == nil || !strings.Contains(err.Error(), "Java") {
			t.Errorf("compileRoute(%q) = %v; want a refusal saying Java and Go differ", bad, err)
		}
	}
}

func TestTopicRouteFollowsJavaReplacement(t *testing.T) {
	for _, c := range []struct{ regex, repl, in, want string }{
		{`(?<routedByValue>.*)`, `outbox.event.${routedByValue}`, "Order", "outbox.event.Order"},
		{`(?<routedByValue>.*)`, `outbox.event.${routedByValue}`, "", "outbox.event."},
		{`(\w)(\w)(\w)(\w)(\w)(\w)(\w)(\w)(\w)(\w)(\w)`, `$11.$10.$1`, "abcdefghijk", "k.j.a"},
		{`(\w)(\w)`, `$10`, "ab", "a0"},   // 10 is no group: $1 then a literal 0
		{`(\w+)`, `$01`, "ab", "ab"},      // 01 is group 1: digits are taken while the group exists
		{`(\w+)`, `$011`, "ab", "ab1"},    // 011 is no group: group 01, then a literal 1
		{`(\w)`, `x\.y\-z`, "a", `x.y-z`}, // escapes
		{`(?i)order`, `orders`, "ORDER", "orders"},
		{`a|ab`, `x`, "ab", "xb"},  // replaceFirst replaces the preferred match only
		{`a+?`, `x`, "aaa", "xaa"}, // matches() as a whole, then replaceFirst takes the lazy "a"
		{`(?<v>[a-z]+)`, `t.${v}`, "Abc", "Abc"},
		{`.*`, `t`, "a\nb", "a\nb"}, // . does not match a line break
	} {
		tr, err := compileRoute(c.regex, c.repl)
		if err != nil {
			t.Errorf("compileRoute(%q, %q): %v", c.regex, c.repl, err)
			continue
		}
		if got := tr.topic(c.in, "public.outbox"); got != c.want {
			t.Errorf("regex %q replacement %q on %q = %q, want %q", c.regex, c.repl, c.in, got, c.want)
		}
	}
}

func TestValidTopic(t *testing.T) {
	long := make([]byte, 250)
	for i := range long {
		long[i] = 'a'
	}
	for _, c := range []struct {
		topic string
		ok    bool
	}{
		{"outbox.event.Order", true}, {"a-b_c.D9", true}, {string(long[:249]), true},
		{"", false}, {".", false}, {"..", false}, {"...", true}, {string(long), false}, {"a b", false}, {"a/b", false}, {"é", false},
	} {
		if got := validTopic(c.topic); got != c.ok {
			t.Errorf("validTopic(%q) = %v, want %v", c.topic, got, c.ok)
		}
	}
}
