package router

import (
	"testing"
)

func TestTranslateJavaRegex(t *testing.T) {
	for _, c := range []struct{ java, want string }{
		{`(?<routedByValue>.*)`, `(?P<routedByValue>.*)`},
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
