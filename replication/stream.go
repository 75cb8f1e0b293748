package replication

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
	"unsafe"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"
)

// Sentinel errors callers act on.
var (
	ErrSlotInUse          = errors.New("replication: slot is in use by another connection")
	ErrSlotMissing        = errors.New("replication: slot does not exist")
	ErrPublicationMissing = errors.New("replication: publication does not exist")
	ErrStreamEnded        = errors.New("replication: server ended the replication stream")
	ErrSlotLost           = errors.New("replication: slot has wal_status 'lost'")
	ErrSlotUnusable       = errors.New("replication: slot cannot be streamed by pgoutbox")
	ErrReceive            = errors.New("replication: connection lost")
)

// Keepalive is a primary keepalive message.
type Keepalive struct {
	WALEnd         LSN
	ServerTime     time.Time
	ReplyRequested bool
}

// Event is what Receive returns: exactly one of its pointer fields is set,
// or none when the deadline passed without a message.
type Event struct {
	// WALStart is the XLogData position of a decoded message (0 for others).
	WALStart  LSN
	Begin     *Begin
	Commit    *Commit
	Relation  *Relation
	Change    *Change
	Truncate  *Truncate
	Message   *Message
	Keepalive *Keepalive
	// StreamAbort is PostgreSQL 18's stray Stream Abort (see StreamAbort).
	StreamAbort *StreamAbort
}

// SlotState is a row of pg_replication_slots.
type SlotState struct {
	Name              string
	Plugin            string
	SlotType          string
	Database          string
	Active            bool
	ActivePID         int32
	RestartLSN        LSN
	ConfirmedFlushLSN LSN
	WALStatus         string
	// InvalidationReason says why PostgreSQL invalidated the slot
	// ("wal_removed", PostgreSQL 18's "idle_timeout", ...); empty for a
	// valid slot and before PostgreSQL 17, which does not report it. An
	// invalidated slot's wal_status is "lost" on every version.
	InvalidationReason string
	// Failover is a PostgreSQL 17+ failover slot's flag (false before 17).
	Failover bool
	// TwoPhase is the slot's two_phase flag: PostgreSQL then decodes a
	// prepared transaction at its PREPARE, whatever the client asks.
	TwoPhase bool
}

// Stream is one logical replication session on a slot.
//
// Concurrency: a Stream is owned by one goroutine. pgconn connections are not
// safe for concurrent use, so Receive, SendStatus and Close must never run at
// the same time.
type Stream struct {
	cfg     Config
	log     *zap.Logger
	conn    *pgconn.PgConn
	dec     *Decoder
	start   LSN
	written LSN // highest WAL position received, reported as the write position
	wal     walArena
	rd      readDeadline
	// behind is the age of the last transaction begun, by its commit
	// time; catchingUp is set while reads wait for catchUpLowWater bytes
	// (see Receive).
	behind     time.Duration
	catchingUp bool
	// broken: a write failed, possibly half-way; nothing more is written.
	broken bool
	// pace paces the socket's reads while live (receive.batch.wait); nil
	// when that is off.
	pace *pacedConn
	// msgCap caps the length of a message read (receive.max.message.bytes).
	msgCap MessageCap
}

// Catch-up reading. Far behind, pgoutbox drains the socket faster than the
// walsender fills it, and waking up for every message costs CPU the
// walsender on the same machine is short of (DESIGN.md has the
// measurements). From transactions committed catchUpEnter ago until back within
// catchUpLeave, a read waiting for data wakes only once catchUpLowWater
// bytes are queued (SO_RCVLOWAT), or after catchUpWait: at most that much
// latency is added, and only while behind anyway. (The age comes from the
// commit times; the walsender's XLogData carries no end of WAL in logical
// replication. A server clock off by more than catchUpEnter costs at most
// catchUpWait per wake-up, or leaves catch-up reading off.)
const (
	catchUpEnter    = 500 * time.Millisecond
	catchUpLeave    = 100 * time.Millisecond
	catchUpLowWater = 32 << 10
	catchUpWait     = 2 * time.Millisecond
)

// walArena copies the WAL data of row and message payloads out of pgconn's
// read buffer (which pgconn reuses) into shared chunks, so that the bytes a
// record points to need no allocation of their own per message. A chunk is
// freed by the garbage collector once nothing points into it any more, that
// is once Kafka has acknowledged every record cut from it. One slow record
// keeps its whole chunk alive, so the relay counts a chunk as held, in full,
// while any record cut from it is in flight (Chunk.Pin).
type walArena struct{ cur *Chunk }

// walChunk is the size of one arena chunk; messages bigger than an eighth of
// it (aloneBytes) get a chunk of their own, so a chunk wastes at most that
// much.
const walChunk = 64 << 10

// Chunk is memory that the WAL bytes of decoded rows and messages are
// copied into; the Change or Message decoded from them names it. It is owned
// by the goroutine that reads the stream, like the Stream itself.
type Chunk struct {
	buf  []byte
	pins int
}

// Size is the chunk's size in bytes: what it holds in memory.
func (c *Chunk) Size() int { return cap(c.buf) }

// Pin counts one more record that points into the chunk and reports
// whether it is the first, that is whether the chunk just became held.
func (c *Chunk) Pin() bool { c.pins++; return c.pins == 1 }

// Unpin counts one record fewer and reports whether it was the last, that is
// whether the chunk is no longer held.
func (c *Chunk) Unpin() bool { c.pins--; return c.pins == 0 }

// Contains reports whether b lies inside the chunk, so that a record's
// bytes are not counted twice: once in the chunk and once on their own.
func (c *Chunk) Contains(b []byte) bool {
	if c == nil || len(b) == 0 || cap(c.buf) == 0 {
		return false
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(c.buf[:1])))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return p >= start && p+uintptr(len(b)) <= start+uintptr(cap(c.buf))
}

func (a *walArena) copy(b []byte) ([]byte, *Chunk) {
	n := len(b)
	if n > aloneBytes {
		c := &Chunk{buf: make([]byte, n)}
		copy(c.buf, b)
		return c.buf, c
	}
	if a.cur == nil || cap(a.cur.buf)-len(a.cur.buf) < n {
		a.cur = &Chunk{buf: make([]byte, 0, walChunk)}
	}
	start := len(a.cur.buf)
	a.cur.buf = append(a.cur.buf, b...)
	// Capped: an append to one message's bytes must never reach the next.
	return a.cur.buf[start:len(a.cur.buf):len(a.cur.buf)], a.cur
}

// Open connects with replication=database and starts streaming from the
// slot's own confirmed position (START_REPLICATION ... 0/0), protocol v1,
// with the configured publication and logical decoding messages on. start
// is the position the caller's tracker begins at (the slot's
// confirmed_flush_lsn as read by Prepare); it is only used for reporting.
func Open(ctx context.Context, cfg Config, start LSN, log *zap.Logger) (*Stream, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	conn, err := connectReplication(ctx, cfg)
	if err != nil {
		return nil, err
	}
	args := []string{
		"proto_version '1'",
		// pgoutput splits the value as a list of identifiers, and the
		// replication command reads it as a string literal.
		"publication_names " + quoteLiteral(quoteIdent(cfg.Publication)),
		"messages 'true'",
	}
	err = pglogrepl.StartReplication(ctx, conn, cfg.Slot, 0, pglogrepl.StartReplicationOptions{Mode: pglogrepl.LogicalReplication, PluginArgs: args})
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "55006" { // object_in_use
			return nil, fmt.Errorf("%w: slot %q: %s", ErrSlotInUse, cfg.Slot, pe.Message)
		}
		return nil, fmt.Errorf("replication: start replication on slot %q at its confirmed position %s: %w", cfg.Slot, start, err)
	}
	log.Info("replication started", zap.String("slot", cfg.Slot), zap.String("publication", cfg.Publication), zap.Stringer("confirmed_lsn", start))
	st := &Stream{cfg: cfg, log: log, conn: conn, dec: NewDecoder(), start: start, written: start, msgCap: cfg.MessageCap()}
	conn.Frontend().SetMaxBodyLen(st.msgCap.Bytes)
	if st.pace = pacer(conn.Conn()); st.pace != nil {
		st.pace.set(true)
	}
	return st, nil
}

// Receive waits until deadline for the next message. It returns a zero Event
// and no error when the deadline passes first. Errors other than that leave
// the stream unusable: close it and open a new one.
func (s *Stream) Receive(ctx context.Context, deadline time.Time) (Event, error) {
	// The deadline is set on the socket, and only when it changes (once per
	// status interval), instead of wrapping each read in a context: that
	// cost a context, a timer and pgconn's watcher registration per message
	// (11 allocations), which at 5,000 one-event transactions/s was 60% of
	// pgoutbox's allocations. ctx still interrupts a blocked read: one
	// context.AfterFunc per ctx moves the deadline into the past.
	if err := ctx.Err(); err != nil {
		return Event{}, fmt.Errorf("%w: receive from slot %q: %w", ErrReceive, s.cfg.Slot, err)
	}
	if ctx != s.rd.ctx {
		s.watch(ctx)
	}
	if s.takeWake() {
		return Event{}, nil
	}
	behind := s.behind >= catchUpEnter || (s.catchingUp && s.behind > catchUpLeave)
	if behind != s.catchingUp {
		s.setCatchingUp(behind)
	}
	readBy := deadline
	if s.catchingUp {
		if short := time.Now().Add(catchUpWait); short.Before(deadline) {
			readBy = short
		}
	}
	if err := s.setReadDeadline(readBy); err != nil {
		return Event{}, fmt.Errorf("%w: receive from slot %q: set read deadline: %w", ErrReceive, s.cfg.Slot, err)
	}
	// timedOut: the read deadline passed, the stream is still usable.
	timedOut := func(err error) bool { return ctx.Err() == nil && pgconn.Timeout(err) && !s.conn.IsClosed() }
	msg, err := s.conn.ReceiveMessage(context.Background())
	if err != nil && s.catchingUp && !readBy.Equal(deadline) && timedOut(err) {
		// Less than the low-water mark came within catchUpWait: read
		// whatever there is, waking for every message again.
		// (Should the mark stay up, return now: the next Receive reads
		// with the short wait again.)
		if s.setCatchingUp(false); s.catchingUp {
			return Event{}, nil
		}
		if err = s.setReadDeadline(deadline); err == nil {
			msg, err = s.conn.ReceiveMessage(context.Background())
		}
	}
	if err != nil {
		if timedOut(err) {
			s.takeWake() // a Wake during the read made it return: used
			return Event{}, nil
		}
		if cerr := ctx.Err(); cerr != nil {
			err = cerr
		}
		if tl := (*pgproto3.ExceededMaxBodyLenErr)(nil); errors.As(err, &tl) {
			return Event{}, &MessageTooLargeError{Slot: s.cfg.Slot, Size: tl.ActualBodyLen, Cap: s.msgCap, After: s.written}
		}
		return Event{}, fmt.Errorf("%w: receive from slot %q: %w", ErrReceive, s.cfg.Slot, err)
	}
	switch msg := msg.(type) {
	case *pgproto3.CopyData:
		return s.handleCopyData(msg.Data)
	case *pgproto3.ErrorResponse:
		return Event{}, fmt.Errorf("replication: slot %q: %w", s.cfg.Slot, pgconn.ErrorResponseToPgError(msg))
	case *pgproto3.CopyDone:
		return Event{}, ErrStreamEnded
	case *pgproto3.NoticeResponse:
		s.log.Info("server notice", zap.String("message", msg.Message))
		return Event{}, nil
	default:
		return Event{}, fmt.Errorf("replication: unexpected %T from server on slot %q", msg, s.cfg.Slot)
	}
}

func (s *Stream) handleCopyData(data []byte) (Event, error) {
	if len(data) == 0 {
		return Event{}, errors.New("replication: empty CopyData message from server")
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return Event{}, fmt.Errorf("replication: keepalive: %w", err)
		}
		return Event{Keepalive: &Keepalive{WALEnd: LSN(k.ServerWALEnd), ServerTime: k.ServerTime, ReplyRequested: k.ReplyRequested}}, nil
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return Event{}, fmt.Errorf("replication: XLogData: %w", err)
		}
		// pgconn reuses its read buffer: a decoded row or message must own
		// its bytes because records point into them until Kafka acknowledges
		// them. The other messages are decoded into values of their own.
		wal := x.WALData
		var chunk *Chunk
		if len(wal) > 0 {
			switch wal[0] {
			case 'I', 'U', 'D', 'M':
				wal, chunk = s.wal.copy(wal)
			}
		}
		if end := LSN(x.WALStart); end > s.written {
			s.written = end
		}
		v, err := s.dec.Decode(wal)
		if err != nil {
			return Event{}, fmt.Errorf("at WAL %s: %w", LSN(x.WALStart), err)
		}
		ev := Event{WALStart: LSN(x.WALStart)}
		switch v := v.(type) {
		case *Begin:
			ev.Begin = v
			s.behind = time.Since(v.CommitTime)
		case *Commit:
			ev.Commit = v
		case *Relation:
			ev.Relation = v
		case *Change:
			v.Chunk = chunk
			ev.Change = v
		case *Truncate:
			ev.Truncate = v
		case *Message:
			v.Chunk = chunk
			ev.Message = v
		case *StreamAbort:
			ev.StreamAbort = v
		}
		return ev, nil
	}
	return Event{}, fmt.Errorf("replication: unknown CopyData message type %q", data[0])
}

// SendStatus sends a standby status update whose flush and apply positions
// are confirmed, the caller's tracker's confirmed LSN: PostgreSQL moves the
// slot's confirmed_flush_lsn to the flush position. Every field is set
// explicitly because pglogrepl fills a zero flush position from the write
// position, which would confirm unacknowledged data.
//
// The write is bounded by ctx's deadline (pglogrepl ignores the context,
// so the deadline is set on the socket); a cancelled ctx sends nothing.
func (s *Stream) SendStatus(ctx context.Context, confirmed LSN, replyRequested bool) error {
	if confirmed == 0 {
		return errors.New("replication: refusing to send a status update with confirmed LSN 0/0")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("replication: send status update (flush %s) on slot %q: %w", confirmed, s.cfg.Slot, err)
	}
	if s.broken {
		return fmt.Errorf("%w: send status update (flush %s) on slot %q: an earlier write failed", ErrReceive, confirmed, s.cfg.Slot)
	}
	if d, ok := ctx.Deadline(); ok {
		if nc := s.conn.Conn(); nc != nil {
			_ = nc.SetWriteDeadline(d)
			defer nc.SetWriteDeadline(time.Time{}) //nolint:errcheck // an error here means the connection is gone, which the next read reports
		}
	}
	write := s.written
	if write < confirmed {
		write = confirmed
	}
	err := pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pglogrepl.LSN(write),
		WALFlushPosition: pglogrepl.LSN(confirmed),
		WALApplyPosition: pglogrepl.LSN(confirmed),
		ClientTime:       time.Now(),
		ReplyRequested:   replyRequested,
	})
	if err != nil {
		// A write cut short by its deadline may have left half a message on
		// the socket: nothing more may follow it (Close discards it).
		s.broken = true
		return fmt.Errorf("%w: send status update (flush %s) on slot %q: %w", ErrReceive, confirmed, s.cfg.Slot, err)
	}
	return nil
}

// EndStream ends the replication stream politely after a final status
// update: it sends CopyDone and reads (discarding any WAL data still in
// flight) until the server has finished the command. The server processes
// messages in order, so once it answers, the status update before the
// CopyDone has been applied to the slot. Closing the connection instead can
// lose that last update: a walsender blocked writing to a client that
// stopped reading exits on the broken connection without reading it.
func (s *Stream) EndStream(timeout time.Duration) error {
	if s.pace != nil {
		s.pace.set(false)
	}
	if nc := s.conn.Conn(); nc != nil {
		s.rd.mu.Lock()
		_ = nc.SetDeadline(time.Now().Add(timeout))
		s.rd.deadline = time.Time{} // reset below; Receive sets its own again
		s.rd.mu.Unlock()
		defer nc.SetDeadline(time.Time{}) //nolint:errcheck // the connection is closed next
	}
	if _, err := pglogrepl.SendStandbyCopyDone(context.Background(), s.conn); err != nil {
		return fmt.Errorf("replication: end the stream on slot %q: %w", s.cfg.Slot, err)
	}
	return nil
}

// Wake makes a Receive that is waiting for data, or the next one, return at
// once with a zero Event, so that its caller looks at its other inputs. It
// is safe to call from any goroutine.
func (s *Stream) Wake() {
	s.rd.mu.Lock()
	defer s.rd.mu.Unlock()
	if s.rd.cancelled {
		return
	}
	s.rd.woken = true // a Wake before the next read starts is not lost
	if nc := s.conn.Conn(); nc != nil {
		past := time.Unix(1, 0)
		_ = nc.SetReadDeadline(past)
		s.rd.deadline = past // so that the next Receive sets its own again
	}
}

// takeWake reports, and forgets, a Wake not yet acted on.
func (s *Stream) takeWake() bool {
	s.rd.mu.Lock()
	defer s.rd.mu.Unlock()
	w := s.rd.woken
	s.rd.woken = false
	return w
}

// readDeadline is the state of the socket's read deadline, which Receive
// sets (from the session's goroutine) and a cancelled context's AfterFunc
// moves into the past (from another goroutine).
type readDeadline struct {
	mu        sync.Mutex
	deadline  time.Time       // the deadline last set by Receive
	ctx       context.Context // the context being watched
	stop      func() bool     // unregisters the watch of ctx
	cancelled bool            // ctx ended: the deadline stays in the past
	woken     bool            // Wake was called and no Receive returned for it yet
}

// watch makes the end of ctx interrupt a read blocked in Receive.
func (s *Stream) watch(ctx context.Context) {
	s.rd.mu.Lock()
	defer s.rd.mu.Unlock()
	if s.rd.stop != nil {
		s.rd.stop()
	}
	s.rd.ctx, s.rd.cancelled = ctx, false
	s.rd.stop = context.AfterFunc(ctx, func() {
		s.rd.mu.Lock()
		defer s.rd.mu.Unlock()
		if s.rd.ctx != ctx {
			return
		}
		s.rd.cancelled = true
		if nc := s.conn.Conn(); nc != nil {
			_ = nc.SetReadDeadline(time.Unix(1, 0)) // the read fails at once; Receive reports ctx's error
		}
	})
}

// setCatchingUp switches catch-up reading on or off; catchingUp says what
// the socket's low-water mark is. Where it cannot be set (not TCP), reads
// stay as they are.
func (s *Stream) setCatchingUp(on bool) {
	if s.pace != nil {
		s.pace.set(false) // the pacing's low-water mark down: the mark is set below
	}
	n := 1
	if on {
		n = catchUpLowWater
	}
	if nc := s.conn.Conn(); nc != nil && setRecvLowWater(nc, n) {
		s.catchingUp = on
	}
	if s.pace != nil {
		// Catching up, the low-water mark gathers the reads instead.
		s.pace.set(!s.catchingUp)
	}
}

// setReadDeadline sets the socket's read deadline unless it is set to t
// already (Wake may have moved it meanwhile).
func (s *Stream) setReadDeadline(t time.Time) error {
	s.rd.mu.Lock()
	defer s.rd.mu.Unlock()
	if s.rd.cancelled || t.Equal(s.rd.deadline) {
		return nil
	}
	nc := s.conn.Conn()
	if nc == nil {
		return errors.New("connection closed")
	}
	if err := nc.SetReadDeadline(t); err != nil {
		return err
	}
	s.rd.deadline = t
	return nil
}

// Close ends the session, within ctx's deadline (5 s at most). Send the
// final status before calling it. After a failed write the connection is
// reset rather than closed politely, so that what is queued on the socket
// (perhaps half a message) is discarded instead of sent.
func (s *Stream) Close(ctx context.Context) error {
	s.rd.mu.Lock()
	if s.rd.stop != nil {
		s.rd.stop()
	}
	s.rd.mu.Unlock()
	if s.broken {
		if nc := s.conn.Conn(); nc != nil {
			resetOnClose(nc)
		}
	}
	d := time.Now().Add(5 * time.Second)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		d = cd
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), d)
	defer cancel()
	return s.conn.Close(ctx)
}

// resetOnClose makes closing nc discard unsent data (SO_LINGER 0).
func resetOnClose(nc net.Conn) {
	if tcp, ok := underlying(nc).(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
}

// NewChunk returns a chunk of size bytes that starts with a copy of b, as
// Receive would copy a message into one; for tests of what holds memory.
func NewChunk(b []byte, size int) (*Chunk, []byte) {
	c := &Chunk{buf: make([]byte, len(b), max(size, len(b)))}
	copy(c.buf, b)
	return c, c.buf[:len(b):len(b)]
}
