package router

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
)

// topicRoute is route.topic.regex and route.topic.replacement compiled with
// the semantics of Kafka Connect's RegexRouter, which Debezium uses: if the
// regex matches the whole routing value (Java's Matcher.matches), the topic
// is Matcher.replaceFirst(replacement); otherwise the routing value itself.
type topicRoute struct {
	re    *regexp.Regexp // the regex as given, for replaceFirst
	whole *regexp.Regexp // \A(?:re)\z, for matches
	parts []replPart     // the parsed replacement

	// usesTable is set when the replacement holds ${table}, pgoutbox's
	// reference to the row's table, so topics depend on the table too.
	usesTable bool
}

// replPart is a literal (group == groupLiteral), the row's table (group ==
// groupTable) or a reference to capture group number group (0 is the whole
// match).
type replPart struct {
	lit   string
	group int
}

const (
	groupLiteral = -1
	groupTable   = -2
)

// compileRoute compiles the Java regex and replacement.
func compileRoute(javaRegex, replacement string) (*topicRoute, error) {
	bad := func(opt, value, reason string) error {
		return &OptionError{Option: opt, Value: value, Reason: reason, Err: ErrInvalidOption}
	}
	if javaRegex == "" {
		return nil, bad(optRouteTopicRegex, javaRegex, "must not be empty")
	}
	goRegex, err := translateJavaRegex(javaRegex)
	if err != nil {
		return nil, bad(optRouteTopicRegex, javaRegex, err.Error())
	}
	re, err := regexp.Compile(goRegex)
	if err != nil {
		return nil, bad(optRouteTopicRegex, javaRegex, "does not compile (Java-only syntax such as lookaround, backreferences, possessive quantifiers and atomic groups is not supported): "+err.Error())
	}
	whole, err := regexp.Compile(`\A(?:` + goRegex + `)\z`)
	if err != nil {
		return nil, bad(optRouteTopicRegex, javaRegex, "does not compile when anchored: "+err.Error())
	}
	if replacement == "" {
		return nil, bad(optRouteReplacement, replacement, "must not be empty")
	}
	parts, err := parseReplacement(replacement, re)
	if err != nil {
		return nil, bad(optRouteReplacement, replacement, err.Error())
	}
	t := &topicRoute{re: re, whole: whole, parts: parts}
	constant := true
	var text strings.Builder
	for _, p := range parts {
		text.WriteString(p.lit)
		switch p.group {
		case groupTable:
			t.usesTable = true
			constant = false
		case groupLiteral:
			if i := strings.IndexFunc(p.lit, func(r rune) bool { return r > 0x7f || !topicChar(byte(r)) }); i >= 0 {
				return nil, bad(optRouteReplacement, replacement, "its text "+strconv.Quote(p.lit)+" has "+strconv.QuoteRune([]rune(p.lit[i:])[0])+", which no Kafka topic name may hold (1 to 249 characters of [a-zA-Z0-9._-])")
			}
		default:
			constant = false
		}
	}
	if constant && !validTopic(text.String()) {
		return nil, bad(optRouteReplacement, replacement, "is not a legal Kafka topic name (1 to 249 characters of [a-zA-Z0-9._-], not . or ..), and with no group reference it is the topic of every row the regex matches")
	}
	return t, nil
}

// topic maps a routing value of a row of table to its topic.
func (t *topicRoute) topic(v, table string) string {
	if !t.whole.MatchString(v) {
		return v
	}
	// Java's replaceFirst searches again from the start, so the match it
	// replaces is the preferred (leftmost-first) one, which can be shorter
	// than the whole value; the rest of the value is then kept. Go's
	// leftmost-first matching makes the same choice.
	m := t.re.FindStringSubmatchIndex(v)
	if m == nil {
		return v
	}
	var b strings.Builder
	b.WriteString(v[:m[0]])
	for _, p := range t.parts {
		switch p.group {
		case groupLiteral:
			b.WriteString(p.lit)
			continue
		case groupTable:
			b.WriteString(table)
			continue
		}
		// A group that did not take part in the match appends nothing, as in Java.
		if s, e := m[2*p.group], m[2*p.group+1]; s >= 0 && e >= 0 {
			b.WriteString(v[s:e])
		}
	}
	b.WriteString(v[m[1]:])
	return b.String()
}

// GoRegex rewrites a Java regular expression (java.util.regex) into Go's
// syntax with the same meaning (translateJavaRegex), checking that it
// compiles on its own; an error says why it cannot.
func GoRegex(java string) (string, error) {
	g, err := translateJavaRegex(java)
	if err != nil {
		return "", err
	}
	if _, err := regexp.Compile(g); err != nil {
		return "", err
	}
	return g, nil
}

// translateJavaRegex rewrites a Java regex (java.util.regex, which
// Debezium's router uses) into Go's syntax with the same meaning: named
// groups (?<name>...) become (?P<name>...), an unterminated \Q quote is
// closed, and the constructs both engines accept with different meanings
// are written out as Java reads them: \s, \v and . (Java's \s has the
// vertical tab, its \v is every vertical whitespace, its . stops at \r,
// U+0085, U+2028 and U+2029 too), octal \0nnn and \uXXXX escapes. Those Go
// would read another way with no equivalent are refused: && (intersection)
// and a nested [ (union; Go takes [:alpha:] for a POSIX class) inside a
// character class, and \S inside one. Everything else (escapes, character
// classes, \Q...\E quotes) is left as it is; Go refuses what it lacks
// (lookaround, possessive quantifiers, backreferences). Java group names
// are a letter followed by letters and digits; other names (Go would
// accept an underscore) are rejected, so that a configuration moves both
// ways between pgoutbox and Debezium.
func translateJavaRegex(s string) (string, error) {
	var b strings.Builder
	inClass := false
	// With DOTALL on somewhere ((?s)), Java's . matches everything there,
	// as Go's does: . is then left as it is.
	dotAll := javaFlagsSet(s, 's')
	at := func(i int, what string) error {
		return errors.New(what + " at offset " + strconv.Itoa(i) + ": Java and Go read it differently, and pgoutbox routes as Debezium does; write the regex without it")
	}
	if javaFlagsSet(s, 'U') {
		return "", errors.New("the inline flag U: Java reads it as UNICODE_CHARACTER_CLASS, Go as ungreedy matching, and pgoutbox routes as Debezium does; write the regex without it")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && i+1 < len(s) && s[i+1] == 'Q':
			end := strings.Index(s[i+2:], `\E`)
			if end < 0 {
				b.WriteString(s[i:])
				b.WriteString(`\E`)
				return b.String(), nil
			}
			b.WriteString(s[i : i+2+end+2])
			i += 2 + end + 1
		case c == '\\' && i+1 < len(s):
			i++
			switch e := s[i]; {
			case e == 's' && inClass:
				b.WriteString(javaSpace)
			case e == 's':
				b.WriteString("[" + javaSpace + "]")
			case e == 'S' && inClass:
				return "", at(i-1, `\S inside a character class`)
			case e == 'S':
				b.WriteString("[^" + javaSpace + "]")
			case e == 'v' && inClass:
				b.WriteString(javaVertical)
			case e == 'v':
				b.WriteString("[" + javaVertical + "]")
			case e == 'u' && i+4 < len(s) && isHex(s[i+1:i+5]):
				// A surrogate pair, as Java reads it, is one character.
				hi, _ := strconv.ParseUint(s[i+1:i+5], 16, 32)
				if hi >= 0xD800 && hi <= 0xDBFF && i+10 < len(s) && s[i+5] == '\\' && s[i+6] == 'u' && isHex(s[i+7:i+11]) {
					if lo, _ := strconv.ParseUint(s[i+7:i+11], 16, 32); lo >= 0xDC00 && lo <= 0xDFFF {
						b.WriteString(`\x{` + strconv.FormatUint(0x10000+(hi-0xD800)<<10+(lo-0xDC00), 16) + `}`)
						i += 10
						break
					}
				}
				b.WriteString(`\x{` + s[i+1:i+5] + `}`)
				i += 4
			case e >= '1' && e <= '9':
				// A backreference in Java; Go has none, and reads \12 as an
				// octal character.
				return "", at(i-1, `a backreference (\`+string(e)+`)`)
			case e == '0' && i+1 < len(s) && isOctal(s[i+1]):
				// \0n, \0nn, \0mnn with m at most 3.
				j := i + 1
				for j < len(s) && j < i+4 && isOctal(s[j]) && (j < i+3 || s[i+1] <= '3') {
					j++
				}
				v, _ := strconv.ParseUint(s[i+1:j], 8, 16)
				b.WriteString(`\x{` + strconv.FormatUint(v, 16) + `}`)
				i = j - 1
			default:
				b.WriteByte('\\')
				b.WriteByte(e)
			}
		case c == '\\':
			b.WriteByte(c)
		case inClass && c == '[':
			return "", at(i, "a character class nested in another (a union in Java, a POSIX class such as [:alpha:] in Go)")
		case inClass && c == '&' && i+1 < len(s) && s[i+1] == '&':
			return "", at(i, "&& inside a character class (an intersection in Java, two & in Go)")
		case inClass:
			if c == ']' {
				inClass = false
			}
			b.WriteByte(c)
		case c == '[':
			inClass = true
			b.WriteByte(c)
			if i+1 < len(s) && s[i+1] == '^' {
				i++
				b.WriteByte('^')
			}
			if i+1 < len(s) && s[i+1] == ']' { // a leading ] is literal
				i++
				b.WriteByte(']')
			}
		case c == '.' && !dotAll:
			b.WriteString(`[^\n\r\x{85}\x{2028}\x{2029}]`)
		case c == '(' && strings.HasPrefix(s[i:], "(?<") && i+3 < len(s) && s[i+3] != '=' && s[i+3] != '!':
			j := i + 3
			for j < len(s) && isASCIIAlnum(s[j]) {
				j++
			}
			name := s[i+3 : j]
			if j >= len(s) || s[j] != '>' || name == "" || !isASCIILetter(name[0]) {
				return "", errors.New("named group at offset " + strconv.Itoa(i) + ": a group name is a letter followed by letters or digits, closed by >")
			}
			b.WriteString("(?P<")
			b.WriteString(name)
			b.WriteByte('>')
			i = j
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// Java's \s and \v, as the members of a Go character class.
const (
	javaSpace    = `\t\n\x0B\f\r `
	javaVertical = `\n\x0B\f\r\x{85}\x{2028}\x{2029}`
)

// javaFlagsSet says whether an inline flag group ((?s), (?is:...)) sets
// flag somewhere in s (not inside a class or quote: a rough look, erring
// towards finding it).
func javaFlagsSet(s string, flag byte) bool {
	for i := 0; i+2 < len(s); i++ {
		if s[i] != '(' || s[i+1] != '?' || (i > 0 && s[i-1] == '\\') {
			continue
		}
		for j := i + 2; j < len(s) && s[j] != ')' && s[j] != ':' && s[j] != '-'; j++ {
			if s[j] == flag {
				return true
			}
			if !isASCIILetter(s[j]) {
				break
			}
		}
	}
	return false
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

// parseReplacement parses a replacement string as Java's
// Matcher.appendReplacement does: \x is a literal x; $n refers to group n,
// taking further digits while the number stays a valid group; ${name}
// refers to a named group; any other $ is an error. pgoutbox adds ${table},
// the row's table, when the regex has no group named table.
func parseReplacement(s string, re *regexp.Regexp) ([]replPart, error) {
	groups := re.NumSubexp()
	var parts []replPart
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			parts = append(parts, replPart{lit: lit.String(), group: groupLiteral})
			lit.Reset()
		}
	}
	for i := 0; i < len(s); {
		switch c := s[i]; c {
		case '\\':
			i++
			if i == len(s) {
				return nil, errors.New("character to be escaped is missing after the final \\")
			}
			lit.WriteByte(s[i])
			i++
		case '$':
			i++
			if i == len(s) {
				return nil, errors.New("illegal group reference: group index is missing after the final $")
			}
			var ref int
			if s[i] == '{' {
				i++
				j := i
				for j < len(s) && isASCIIAlnum(s[j]) {
					j++
				}
				name := s[i:j]
				switch {
				case name == "":
					return nil, errors.New("named capturing group has 0 length name")
				case j == len(s) || s[j] != '}':
					return nil, errors.New("named capturing group ${" + name + " is missing trailing '}'")
				case !isASCIILetter(name[0]):
					return nil, errors.New("capturing group name {" + name + "} starts with digit character")
				}
				ref = re.SubexpIndex(name)
				if ref < 0 && name == "table" {
					ref = groupTable
				}
				if ref == -1 {
					return nil, errors.New("no group with name {" + name + "} in " + optRouteTopicRegex)
				}
				i = j + 1
			} else {
				if s[i] < '0' || s[i] > '9' {
					return nil, errors.New("illegal group reference: $ must be followed by a group number or {name}; write \\$ for a literal $")
				}
				ref = int(s[i] - '0')
				i++
				for i < len(s) && s[i] >= '0' && s[i] <= '9' {
					next := ref*10 + int(s[i]-'0')
					if next > groups {
						break
					}
					ref = next
					i++
				}
				if ref > groups {
					return nil, errors.New("no group " + strconv.Itoa(ref) + " in " + optRouteTopicRegex + " (it has " + strconv.Itoa(groups) + ")")
				}
			}
			flush()
			parts = append(parts, replPart{group: ref})
		default:
			lit.WriteByte(c)
			i++
		}
	}
	flush()
	return parts, nil
}

func isASCIILetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
func isASCIIAlnum(c byte) bool  { return isASCIILetter(c) || c >= '0' && c <= '9' }

// validTopic reports whether t is a legal Kafka topic name: 1 to 249
// characters from [a-zA-Z0-9._-], and neither "." nor "..".
func validTopic(t string) bool {
	if t == "" || len(t) > 249 || t == "." || t == ".." {
		return false
	}
	for i := 0; i < len(t); i++ {
		if !topicChar(t[i]) {
			return false
		}
	}
	return true
}

func topicChar(c byte) bool { return isASCIIAlnum(c) || c == '.' || c == '_' || c == '-' }
