// Package outbox is the application side of pgoutbox: it writes outbox
// events in the application's own database transaction, and helps consumers
// process each event once.
//
// # Writing events
//
// The transactional outbox pattern: record the event in the same
// transaction as the business change it describes. Both commit or neither
// does, so no event is lost and none is published for a change that rolled
// back. pgoutbox reads committed events from PostgreSQL's WAL and produces
// them to Kafka with Debezium's Outbox Event Router semantics: topic
// "outbox.event.<aggregatetype>", key aggregateid, value payload, header
// "id".
//
//	w, err := outbox.NewWriter(outbox.Config{}) // public.outbox, ModeTable
//	...
//	tx, err := conn.Begin(ctx)
//	if err != nil {
//		return err
//	}
//	defer tx.Rollback(ctx) // does nothing once Commit succeeded
//	if _, err := tx.Exec(ctx, "INSERT INTO orders (id, total) VALUES ($1, $2)", 42, 12); err != nil {
//		return err
//	}
//	ev, err := outbox.NewEvent("Order", "42", "OrderCreated", map[string]any{"total": 12})
//	if err != nil {
//		return err
//	}
//	if _, err := w.Write(ctx, tx, ev); err != nil {
//		return err // the deferred Rollback undoes the order too
//	}
//	return tx.Commit(ctx)
//
// Any error from Write aborts the transaction: roll it back. Write makes
// the transaction fail on the server even when it refused an event before
// sending anything, so a Commit that follows a failed Write fails too,
// rather than keeping the business change without its event.
//
// Write takes a pgx.Tx; WriteSQL takes a *sql.Tx (database/sql with any
// PostgreSQL driver, e.g. github.com/jackc/pgx/v5/stdlib). Several events in
// one call are sent in one statement. An event without an ID gets a UUIDv7
// (NewID), which sorts by time; Write returns the ids.
//
// # Modes
//
// ModeTable inserts rows into the outbox table (Debezium's shape: id uuid,
// aggregatetype, aggregateid, type varchar(255), payload jsonb, created_at
// timestamptz default now(); `pgoutbox migrate` creates it). The rows stay
// until the application deletes them.
//
// ModeTableDeleteAfterInsert inserts the rows and deletes them in the same
// transaction: the table stays empty, and the WAL still carries the inserts
// that the relay publishes (it ignores deletes).
//
// Which to choose (measured by make bench-writers; see the README's
// "Choosing a mode"): with the slot check below, ModeMessage and ModeTable
// cost writers about the same (15–52% and 18–43% fewer transactions/s than
// the business change alone, on a busy machine), ModeTableDeleteAfterInsert
// most (29–65%); without the check (Config.AssumeSlot) ModeMessage costs
// least (10–28%, measured before the check). Prefer ModeMessage with the
// WAL relay; ModeTable with pgoutbox cleanup when the rows are needed
// (Debezium's outbox router, the polling relay); ModeTableDeleteAfterInsert
// only when no cleanup can run.
//
// ModeMessage writes no row. Each event is a transactional logical decoding
// message, pg_logical_emit_message(true, prefix, content), prefix "outbox"
// by default, whose content is a JSON object with the row's fields, sent as
// UTF-8 bytes (the bytea variant, so that the database's encoding does not
// change them):
//
//	{"id":"0192...","aggregatetype":"Order","aggregateid":"42","type":"OrderCreated","payload":{"total":12}}
//
// The keys are the configured column names (Debezium's by default) in that
// order; the payload is embedded as JSON (null when the event has none). The
// message is decoded at commit, in commit order with the transaction's
// other changes, and discarded on rollback, as a row would be.
//
// # Make the slot before the first write
//
// In ModeMessage and ModeTableDeleteAfterInsert only the WAL holds the
// events, and only a logical replication slot that exists when they are
// written ever decodes them: a slot made later starts after them, and the
// poll source (relay.source=poll) reads no messages. So in these modes a
// write in a database that has no logical slot (pgoutbox's not made yet,
// or dropped; wal_level not logical) fails with a *NoSlotError
// (errors.Is(err, ErrNoSlot)) naming the database, and the transaction
// fails with it. Make the relay's slot first (pgoutbox migrate, or the
// relay's first start); with the poll source, write with ModeTable. The
// check is part of the statement each write sends anyway, so it costs no
// round trip, only the server's read of pg_replication_slots (some
// microseconds per statement).
//
// Any logical slot of the database that is neither temporary nor
// invalidated lets the write through, pgoutbox's or another consumer's
// (Debezium's slot during a migration): the writer cannot tell which slot
// is the relay's, so the check is a minimum, not a proof that the relay
// reads the event. It is made when the event is written: a slot dropped
// between the write and the commit is not noticed.
//
// A ModeTableDeleteAfterInsert write also needs a slot that could decode
// the table's inserts: it fails with a *NotPublishedError
// (errors.Is(err, ErrNotPublished)) when the table is unlogged or no
// publication publishes its inserts (a second outbox table not yet added
// to the relay, a tenant schema's table). The same statement checks it.
//
// A ModeTableDeleteAfterInsert write to the poll source's table (made by
// pgoutbox migrate with relay.source=poll) needs no slot: the table's keep
// trigger skips the delete of a row not yet published, the row stays, and
// the poll source publishes it. Only a write that really deleted rows is
// refused without a slot.
//
// # Consuming events once
//
// Kafka delivers at least once, and the relay, like Debezium, may deliver
// an event again after a restart. Dedup records processed event ids in the
// consumer's database, in the same transaction as the consumer's own change;
// its Process method reports whether an id is new. See Dedup for the
// pattern.
package outbox
