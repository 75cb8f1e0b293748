package kafka

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/router"
)

// TestCompressedRecordSizeIsWhatTheBrokerMeasures holds the estimate of a
// record's size compressed against the real broker, the oracle: with each
// codec, a record sent alone whose estimate is 120 bytes under a topic's
// max.message.bytes is accepted, and one whose estimate is 120 bytes over it
// is refused as too large. (The relay refuses the second itself, so that it
// never takes a batch of other records down with it.) The values are JSON
// objects with random numbers, which every codec compresses.
func TestCompressedRecordSizeIsWhatTheBrokerMeasures(t *testing.T) {
	env := testenv.Require(t)
	const limit, slack = 20000, 120
	rng := rand.New(rand.NewPCG(1, 2))
	var b strings.Builder
	for b.Len() < 200000 {
		fmt.Fprintf(&b, `{"order":%d,"customer":"c-%d","sku":"%x","qty":%d},`, rng.Uint32(), rng.IntN(5000), rng.Uint32(), rng.IntN(9))
	}
	text := b.String()
	for _, codec := range []string{"gzip", "snappy", "lz4", "zstd"} {
		t.Run(codec, func(t *testing.T) {
			topic := testenv.UniqueName(t, "kafka-size-"+codec)
			if err := CreateTopicsWithConfig(Config{Brokers: env.KafkaBrokers}, []string{topic}, 1, 1,
				map[string]string{"max.message.bytes": "20000"}); err != nil {
				t.Fatal(err)
			}
			// The longest prefix of text whose estimate is at most target.
			sized := func(target int) *router.Record {
				lo, hi := 1, len(text)
				for lo < hi {
					mid := (lo + hi + 1) / 2
					if CompressedRecordSize(&router.Record{Key: []byte("k"), Value: []byte(text[:mid])}, codec) <= target {
						lo = mid
					} else {
						hi = mid - 1
					}
				}
				return &router.Record{Topic: topic, Key: []byte("k"), Value: []byte(text[:lo]), Partition: -1, EventID: []byte(codec)}
			}
			p := newTestProducer(t, Config{Brokers: env.KafkaBrokers, Compression: codec, MaxMessageBytes: 1 << 20})
			under, over := sized(limit-slack), sized(limit+slack)
			if len(under.Value) <= limit {
				t.Fatalf("the record under the limit compressed is %d bytes uncompressed: the case needs more than %d", len(under.Value), limit)
			}
			p.Send(under, Meta{Ref: 1})
			if a := waitAcks(t, p, 1, time.Minute)[0]; a.Err != nil {
				t.Fatalf("%d bytes uncompressed, estimated %d compressed, against a limit of %d: refused: %v", len(under.Value), CompressedRecordSize(under, codec), limit, a.Err)
			}
			p.Send(over, Meta{Ref: 2})
			if a := waitAcks(t, p, 1, time.Minute)[0]; !IsBatchRefused(a.Err) {
				t.Fatalf("%d bytes uncompressed, estimated %d compressed, against a limit of %d: %v, want refused as too large", len(over.Value), CompressedRecordSize(over, codec), limit, a.Err)
			}
		})
	}
}
