package kafka

import "testing"

// TestOffsetRecordCarriesItsTimeline: the offsets record holds the
// server's timeline beside the position (the relay compares it with the
// server's history at start); a record written before it was added reads
// as timeline 0, which the relay takes for "not known".
func TestOffsetRecordCarriesItsTimeline(t *testing.T) {
	id := SlotIdentity{SystemIdentifier: "7", Database: "shop", Slot: "s", Timeline: 3}
	lsn, tl, err := decodeOffset(encodeOffset(id, "txn", 0x1_0000_2000))
	if err != nil || lsn != 0x1_0000_2000 || tl != 3 {
		t.Fatalf("decoded %X on timeline %d (%v); want 1/2000 on 3", lsn, tl, err)
	}
	if string(id.Key()) != "pgoutbox/7/shop/s" || id.TransactionalID() != "pgoutbox-7-shop-s" {
		t.Fatalf("the timeline must not change the key (%s) or the transactional id (%s)", id.Key(), id.TransactionalID())
	}
	old := `{"lsn":"1/2000","system_identifier":"7","database":"shop","slot":"s","transactional_id":"txn"}`
	if lsn, tl, err := decodeOffset([]byte(old)); err != nil || lsn != 0x1_0000_2000 || tl != 0 {
		t.Fatalf("an earlier version's record: %X on timeline %d (%v); want 1/2000 on 0", lsn, tl, err)
	}
}
