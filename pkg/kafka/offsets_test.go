package kafka

import (
	"testing"
	"time"
)

// TestOffsetRecordCarriesItsTimelineAndTime: the offsets record holds the
// server's timeline and a time of its clock beside the position (the relay
// compares them with the server's history at start); a record written
// before they were added reads as timeline 0 and no time, which the relay
// takes for "not known".
//
// It holds the last transaction read too, which a start skipping what
// Kafka holds must meet (an earlier version's record has none).
func TestOffsetRecordCarriesItsTimelineAndTime(t *testing.T) {
	id := SlotIdentity{SystemIdentifier: "7", Database: "shop", Slot: "s", Timeline: 3}
	at := time.Date(2026, 12, 6, 23, 59, 1, 123456789, time.FixedZone("x", 3600))
	o, err := decodeOffset(encodeOffset(id, "txn", 0x1_0000_2000, at, TxnMark{}))
	if err != nil || o.lsn != 0x1_0000_2000 || o.timeline != 3 || !o.at.Equal(at) {
		t.Fatalf("decoded %+v (%v); want 1/2000 on 3 at %s", o, err, at)
	}
	if o, err := decodeOffset(encodeOffset(id, "txn", 0x2000, time.Time{}, TxnMark{})); err != nil || !o.at.IsZero() || !o.last.IsZero() {
		t.Fatalf("no time: decoded %+v (%v)", o, err)
	}
	// The last transaction read, by its commit position, xid and commit
	// time to the microsecond; a message by its position alone.
	txn := TxnMark{LSN: 0x1_0000_1f00, XID: 4_000_000_000, Time: time.Date(2026, 12, 6, 23, 59, 0, 999999000, time.UTC)}
	if o, err := decodeOffset(encodeOffset(id, "txn", 0x1_0000_2000, at, txn)); err != nil || !o.last.Is(txn) || o.last.Message() {
		t.Fatalf("last transaction: decoded %+v (%v); want %s", o.last, err, txn)
	}
	msg := MessageMark(0x1_0000_1f80, "outbox", []byte(`{"id":"1"}`))
	if o, err := decodeOffset(encodeOffset(id, "txn", 0x1_0000_2000, at, msg)); err != nil || !o.last.Is(msg) || !o.last.Message() {
		t.Fatalf("last message: decoded %+v (%v); want %s", o.last, err, msg)
	}
	if txn.Is(TxnMark{LSN: txn.LSN, XID: txn.XID, Time: txn.Time.Add(time.Microsecond)}) || txn.Is(TxnMark{LSN: txn.LSN, XID: 7, Time: txn.Time}) {
		t.Fatal("a transaction at the same position with another xid or commit time was taken for the one named")
	}
	if msg.Is(MessageMark(msg.LSN, "outbox", []byte(`{"id":"2"}`))) || msg.Is(MessageMark(msg.LSN, "outbox2", []byte(`{"id":"1"}`))) {
		t.Fatal("another message ending at the same position was taken for the one named")
	}
	if string(id.Key()) != "pgoutbox/7/shop/s" || id.TransactionalID() != "pgoutbox-7-shop-s" {
		t.Fatalf("the timeline must not change the key (%s) or the transactional id (%s)", id.Key(), id.TransactionalID())
	}
	old := `{"lsn":"1/2000","system_identifier":"7","database":"shop","slot":"s","transactional_id":"txn"}`
	if o, err := decodeOffset([]byte(old)); err != nil || o.lsn != 0x1_0000_2000 || o.timeline != 0 || !o.at.IsZero() || !o.last.IsZero() {
		t.Fatalf("an earlier version's record: %+v (%v); want 1/2000 on 0, no time", o, err)
	}
	if _, err := decodeOffset([]byte(`{"lsn":"1/2000","at":"yesterday"}`)); err == nil {
		t.Fatal("a record with an unreadable time was read")
	}
}
