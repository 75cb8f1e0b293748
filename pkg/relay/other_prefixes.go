package relay

import (
	"maps"
	"slices"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/replication"
)

// Which messages.prefix other slots relay with is read at the session's
// start (replication.Start.OtherPrefixes) and again by the catalog checks
// while it streams. Read at the start only, a relay added to the database
// while this one ran had its prefix taken for a writer's misspelt one:
// every one of its messages was an Error here and fed the
// PgoutboxEventMessagesUnclaimed alert until this relay's next session
// (stop 40's note). And a relay taken away (its slot dropped) went on
// covering its prefix, so that events written with it since were skipped
// at Info.
//
// A message that looks like an event, of a prefix no slot recorded at the
// last read, is held (counted, not yet said) until a read that began after
// it: the prefix is then another relay's (Info) or no one's (Error). The
// message itself is skipped at once either way, so nothing waits on the
// read, and the slot's confirmations do not either. A session that ends
// first judges what it holds by what it knows.

// maxUnsure bounds the prefixes held: past it a message is judged at once.
const maxUnsure = 100

// unsurePrefix is what is held of a prefix's messages: the ask its read
// answers, how many came, and the first one's position.
type unsurePrefix struct {
	ask           uint64
	n             int
	lsn           checkpoint.LSN
	transactional bool
}

// holdUnsure holds an event-shaped message of a prefix no slot recorded at
// the last read, and asks the catalog checks to read the prefixes again.
// Without a state table nothing records them: it is judged at once.
func (s *session) holdUnsure(m *replication.Message) {
	u := s.unsure[m.Prefix]
	if u == nil {
		if s.r.cfg.Postgres.StateTable == "" || len(s.unsure) >= maxUnsure {
			s.unclaimedEvent(m.Prefix, m.LSN, m.Transactional, 1)
			return
		}
		s.prefixAsk++
		u = &unsurePrefix{ask: s.prefixAsk, lsn: m.LSN, transactional: m.Transactional}
		if s.unsure == nil {
			s.unsure = map[string]*unsurePrefix{}
		}
		s.unsure[m.Prefix] = u
		s.watcher.ReadPrefixes(s.prefixAsk)
	}
	u.n++
}

// prefixesRead takes a catalog check's reading of the other slots'
// prefixes, and judges the messages held that it answers.
func (s *session) prefixesRead(res catalogResult) {
	if res.OtherPrefixes != nil {
		s.otherPrefixes = res.OtherPrefixes
	}
	s.settleUnsure(res.PrefixesFor)
}

// settleUnsure judges the prefixes held whose ask is at most upTo, by the
// prefixes last read.
func (s *session) settleUnsure(upTo uint64) {
	for _, prefix := range slices.Sorted(maps.Keys(s.unsure)) {
		u := s.unsure[prefix]
		if u.ask > upTo {
			continue
		}
		delete(s.unsure, prefix)
		if slots, ok := s.otherPrefixes[prefix]; ok {
			s.anotherRelays(prefix, slots, u.lsn, u.n)
		} else {
			s.unclaimedEvent(prefix, u.lsn, u.transactional, u.n)
		}
	}
}
