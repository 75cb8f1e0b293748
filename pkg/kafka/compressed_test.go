package kafka

import (
	"bytes"
	"testing"

	"github.com/pgoutbox/pgoutbox/router"
)

// TestCompressedRecordSizeTakesTheCodecInAnyCase: kafka.compression is read
// in any case (GZIP is gzip); the estimate must be too, or a record that
// compresses well counts at its uncompressed size.
func TestCompressedRecordSizeTakesTheCodecInAnyCase(t *testing.T) {
	rec := &router.Record{Key: []byte("k"), Value: bytes.Repeat([]byte("outbox "), 10000)}
	for _, c := range []string{"gzip", "snappy", "lz4", "zstd"} {
		lower, upper := CompressedRecordSize(rec, c), CompressedRecordSize(rec, string(bytes.ToUpper([]byte(c))))
		if lower != upper || lower > len(rec.Value)/4 {
			t.Errorf("%s: %d bytes, %d in upper case, for %d bytes that compress well", c, lower, upper, len(rec.Value))
		}
	}
	if n, want := CompressedRecordSize(rec, "none"), RecordSize(rec)+BatchOverhead; n != want {
		t.Errorf("none: %d, want RecordSize plus the batch header, %d", n, want)
	}
}
