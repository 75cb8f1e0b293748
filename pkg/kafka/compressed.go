package kafka

import (
	"bytes"
	"io"

	"github.com/IBM/sarama"
	"github.com/klauspost/compress/gzip"
	snappy "github.com/klauspost/compress/snappy/xerial"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"

	"github.com/pgoutbox/pgoutbox/router"
)

// BatchOverhead is the header of a v2 record batch, which the broker counts
// against a topic's max.message.bytes with the records.
const BatchOverhead = 61

// Compresses says whether codec (kafka.compression) is one that compresses.
func Compresses(codec string) bool {
	cc, err := compressionCodec(codec)
	return err == nil && cc != sarama.CompressionNone
}

// CompressedRecordSize estimates what rec takes in a batch of its own
// compressed with codec (kafka.compression: none, gzip, snappy, lz4, zstd; as
// sarama compresses a batch, at each codec's default level): the size the
// broker holds against a topic's max.message.bytes, the batch's header
// included. The record's bytes are compressed as one stream, framing
// uncompressed. For codec none it is RecordSize plus the header.
//
// A record larger than a topic's limit uncompressed may be far smaller
// compressed, and then Kafka takes it; one larger compressed too is
// refused with the whole batch it shares, and sarama sends later batches
// meanwhile: the other keys of that batch would reach Kafka after later
// records of theirs. So the relay judges such a record by this estimate
// before it sends it.
func CompressedRecordSize(rec *router.Record, codec string) int {
	size := RecordSize(rec) + BatchOverhead
	cc, err := compressionCodec(codec)
	if err != nil || cc == sarama.CompressionNone {
		return size
	}
	var raw bytes.Buffer
	raw.Grow(size)
	raw.Write(rec.Key)
	raw.Write(rec.Value)
	for _, h := range rec.Headers {
		raw.WriteString(h.Key)
		raw.Write(h.Value)
	}
	framing := size - raw.Len()
	var out []byte
	switch cc {
	case sarama.CompressionGZIP:
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		_, _ = w.Write(raw.Bytes())
		_ = w.Close()
		out = b.Bytes()
	case sarama.CompressionSnappy:
		out = snappy.Encode(nil, raw.Bytes())
	case sarama.CompressionLZ4:
		var b bytes.Buffer
		w := lz4.NewWriter(&b)
		_ = w.Apply(lz4.BlockSizeOption(lz4.Block64Kb))
		_, _ = io.Copy(w, &raw)
		_ = w.Close()
		out = b.Bytes()
	case sarama.CompressionZSTD:
		enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
		if err != nil {
			return size
		}
		out = enc.EncodeAll(raw.Bytes(), nil)
		_ = enc.Close()
	default:
		return size
	}
	return framing + len(out)
}
