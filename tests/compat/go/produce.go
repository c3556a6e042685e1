// Scenarios of streams and producers: declare/delete with arguments and StreamStats,
// publish with confirms (Send and BatchSend) and read back, deduplication with a named
// producer, sub-entry batching with each compression the client offers.
package main

import (
	"fmt"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/message"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

func init() {
	register("publish_consume", publishConsume)
	register("dedup", dedup)
	register("subentry", subEntry)
	register("declare", declare)
}

// publishConsume: create `stream` (unless create is false), `count` messages with Send and
// `batch` with one BatchSend, all confirmed, then read from the first offset; StreamStats,
// and where the producer and the consumer were placed (StreamMetaData).
func publishConsume(a Args) (Result, error) {
	env, err := environment(a)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	name := a.str("stream", "")
	if a["create"] != false {
		if err := env.DeclareStream(name, nil); err != nil {
			return nil, err
		}
	}
	count, batch := a.num("count", 100), a.num("batch", 50)
	sent, err := publish(env, name, nil, bodies("s-", 0, count), false)
	if err != nil {
		return nil, err
	}
	batched, err := publish(env, name, nil, bodies("b-", 0, batch), true)
	if err != nil {
		return nil, err
	}
	got, err := consume(env, name, stream.NewConsumerOptions().
		SetOffset(stream.OffsetSpecification{}.First()), count+batch, 30*time.Second,
		200*time.Millisecond)
	if err != nil {
		return nil, err
	}
	st, err := stats(env, name)
	if err != nil {
		return nil, err
	}
	meta, err := env.StreamMetaData(name)
	if err != nil {
		return nil, err
	}
	replicas := []string{}
	for _, r := range meta.Replicas {
		if r != nil {
			replicas = append(replicas, r.Host+":"+r.Port)
		}
	}
	sentOK, sentBad := sent.counts()
	batchOK, batchBad := batched.counts()
	out := got.result()
	out["confirmed"], out["failed"] = sentOK+batchOK, sentBad+batchBad
	out["stats"] = st
	out["leader"] = meta.Leader.Host + ":" + meta.Leader.Port
	out["replicas"] = replicas
	if a["delete"] == true {
		out["deleted"] = codeOf(env.DeleteStream(name))
	}
	return out, nil
}

func withId(body string, id int64) message.StreamMessage {
	m := amqp.NewMessage([]byte(body))
	m.SetPublishingId(id)
	return m
}

// dedup: a producer named `producer` sends ids 1..10; a second one with the same name reads
// the last id back and sends ids 6..15 (6..10 are duplicates: confirmed, not stored); a
// third sends 3 messages without ids (the client numbers them after the stored id).
func dedup(a Args) (Result, error) {
	env, name, err := withStream(a)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	ref := a.str("producer", "go-dedup")
	out := Result{}
	rounds := []struct {
		key  string
		msgs []message.StreamMessage
	}{
		{"first", nil}, {"second", nil}, {"third", bodies("auto-", 0, 3)},
	}
	for i := 1; i <= 10; i++ {
		rounds[0].msgs = append(rounds[0].msgs, withId(fmt.Sprintf("d-%d", i), int64(i)))
	}
	for i := 6; i <= 15; i++ {
		rounds[1].msgs = append(rounds[1].msgs, withId(fmt.Sprintf("again-%d", i), int64(i)))
	}
	for _, round := range rounds {
		producer, err := env.NewProducer(name, stream.NewProducerOptions().SetProducerName(ref))
		if err != nil {
			return nil, err
		}
		last, err := producer.GetLastPublishingId()
		if err != nil {
			return nil, err
		}
		out["last_id_before_"+round.key] = last
		c := newConfirms()
		c.watch(producer.NotifyPublishConfirmation())
		for _, m := range round.msgs {
			if err := producer.Send(m); err != nil {
				return nil, err
			}
		}
		if !c.wait(len(round.msgs), 30*time.Second) {
			return nil, fmt.Errorf("round %s: confirms missing", round.key)
		}
		ok, bad := c.counts()
		out["confirmed_"+round.key], out["failed_"+round.key] = ok, bad
		out["ids_"+round.key] = c.ids
		if err := producer.Close(); err != nil {
			return nil, err
		}
	}
	seq, err := env.QuerySequence(ref, name)
	if err != nil {
		return nil, err
	}
	out["query_sequence"] = seq
	got, err := consume(env, name, stream.NewConsumerOptions().
		SetOffset(stream.OffsetSpecification{}.First()), 18, 10*time.Second, 300*time.Millisecond)
	if err != nil {
		return nil, err
	}
	_, out["bodies"] = got.snapshot()
	return out, nil
}

var compressions = map[string]stream.Compression{
	"none": stream.Compression{}.None(), "gzip": stream.Compression{}.Gzip(),
	"snappy": stream.Compression{}.Snappy(), "lz4": stream.Compression{}.Lz4(),
	"zstd": stream.Compression{}.Zstd(),
}

// subEntry: `count` messages in sub-entries of `size` compressed with `compression`, then
// read back from the first offset (the client checks each chunk's CRC).
func subEntry(a Args) (Result, error) {
	compression, ok := compressions[a.str("compression", "none")]
	if !ok {
		return nil, fmt.Errorf("no compression %q", a.str("compression", ""))
	}
	env, name, err := withStream(a)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	count := a.num("count", 95)
	// varied, compressible bodies
	var msgs []message.StreamMessage
	for i := 0; i < count; i++ {
		msgs = append(msgs, amqp.NewMessage([]byte(fmt.Sprintf("z-%d-%s", i,
			string(make([]byte, i%40)))))) // zero bytes compress well
	}
	c, err := publish(env, name, stream.NewProducerOptions().
		SetSubEntrySize(a.num("size", 10)).SetCompression(compression), msgs, false)
	if err != nil {
		return nil, err
	}
	got, err := consume(env, name, stream.NewConsumerOptions().
		SetOffset(stream.OffsetSpecification{}.First()), count, 20*time.Second,
		200*time.Millisecond)
	if err != nil {
		return nil, err
	}
	out := got.result()
	out["confirmed"], out["failed"] = c.counts()
	out["expected"] = func() []string {
		var want []string
		for _, m := range msgs {
			want = append(want, string(m.GetData()[0]))
		}
		return want
	}()
	return out, nil
}

// declare: DeclareStream with max-age, max-length-bytes and a segment size; the same again;
// other arguments on the same name; bad arguments; StreamExists, StreamStats of an empty
// stream, DeleteStream twice. Each step is reported as a response code.
func declare(a Args) (Result, error) {
	env, err := environment(a)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	name := a.str("stream", "")
	opts := stream.NewStreamOptions().SetMaxAge(time.Hour).
		SetMaxLengthBytes(stream.ByteCapacity{}.GB(2)).
		SetMaxSegmentSizeBytes(stream.ByteCapacity{}.MB(10))
	out := Result{}
	out["declare"] = codeOf(env.DeclareStream(name, opts))
	// the Environment answers OK for 0x05 (stream exists, same arguments)
	out["declare_same"] = codeOf(env.DeclareStream(name, opts))
	out["declare_other_max_age"] = codeOf(env.DeclareStream(name, stream.NewStreamOptions().
		SetMaxAge(2*time.Hour).SetMaxLengthBytes(stream.ByteCapacity{}.GB(2)).
		SetMaxSegmentSizeBytes(stream.ByteCapacity{}.MB(10))))
	exists, err := env.StreamExists(name)
	if err != nil {
		return nil, err
	}
	out["exists"] = exists
	s, err := env.StreamStats(name)
	out["stats_code"] = codeOf(err)
	if err == nil {
		_, e1 := s.FirstOffset()
		_, e2 := s.CommittedChunkId()
		out["empty_first_offset_error"] = e1 != nil
		out["empty_committed_error"] = e2 != nil
	}
	out["delete"] = codeOf(env.DeleteStream(name))
	exists, err = env.StreamExists(name)
	if err != nil {
		return nil, err
	}
	out["exists_after_delete"] = exists
	out["delete_again"] = codeOf(env.DeleteStream(name))
	// a segment size above RabbitMQ's 3 GB bound is refused (0x11)
	out["declare_bad_segment"] = codeOf(env.DeclareStream(name+"-bad",
		stream.NewStreamOptions().SetMaxSegmentSizeBytes(stream.ByteCapacity{}.GB(4))))
	return out, nil
}
