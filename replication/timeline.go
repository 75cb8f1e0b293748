package replication

import (
	"bytes"
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"
)

// TimelineFork returns where timeline from ended in the history of
// timeline to: the position at which the server left it, for to directly
// or through timelines between. A promotion or a point-in-time restore
// starts a new timeline at such a position, and what the old timeline
// wrote past it is not in this server's WAL: the new timeline writes other
// transactions at the same positions. ok is false when from is not in
// to's history (a restore onto another branch). It asks the server on a
// replication connection of its own (TIMELINE_HISTORY).
func TimelineFork(ctx context.Context, cfg Config, from, to int32) (fork LSN, ok bool, err error) {
	if from >= to || to < 2 {
		return 0, false, nil
	}
	conn, err := connectReplication(ctx, cfg)
	if err != nil {
		return 0, false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	h, err := pglogrepl.TimelineHistory(ctx, conn, to)
	if err != nil {
		return 0, false, fmt.Errorf("replication: history of timeline %d: %w", to, err)
	}
	return timelineEnd(h.Content, from)
}

// timelineEnd reads a timeline history file ("<timeline>\t<LSN>\t<reason>"
// a line, each line the end of one earlier timeline) and returns where
// timeline tli ended.
func timelineEnd(content []byte, tli int32) (LSN, bool, error) {
	for line := range bytes.Lines(content) {
		f := bytes.Fields(line)
		if len(f) < 2 || f[0][0] == '#' {
			continue
		}
		n, err := strconv.ParseInt(string(f[0]), 10, 32)
		if err != nil {
			return 0, false, fmt.Errorf("replication: timeline history line %q: %w", bytes.TrimSpace(line), err)
		}
		if int32(n) != tli {
			continue
		}
		end, err := parseLSN(string(f[1]))
		if err != nil {
			return 0, false, err
		}
		return end, true, nil
	}
	return 0, false, nil
}
