// Bad input through the Go client: an unknown stream, a refused login, a frame above the
// negotiated frame_max (refused by the client itself for Publish, by the server for a frame
// the client does not check), and a user without permission. Each outcome is a response
// code, as the client reports it.
package main

import (
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

func init() {
	register("unknown_stream", unknownStream)
	register("login", login)
	register("frame_too_large", frameTooLarge)
	register("permissions", permissions)
}

func noop(stream.ConsumerContext, *amqp.Message) {}

// unknownStream: every call naming a stream that does not exist.
func unknownStream(a Args) (Result, error) {
	env, err := environment(a)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	name := a.str("stream", "")
	out := Result{}
	_, err = env.NewProducer(name, nil)
	out["new_producer"] = codeOf(err)
	_, err = env.NewConsumer(name, noop, nil)
	out["new_consumer"] = codeOf(err)
	_, err = env.StreamStats(name)
	out["stream_stats"] = codeOf(err)
	_, err = env.StreamMetaData(name)
	out["stream_metadata"] = codeOf(err)
	out["delete_stream"] = codeOf(env.DeleteStream(name))
	exists, err := env.StreamExists(name)
	out["exists"], out["exists_code"] = exists, codeOf(err)
	_, err = env.QueryPartitions(name)
	out["query_partitions"] = codeOf(err)
	_, err = env.NewSuperStreamProducer(name, stream.NewSuperStreamProducerOptions(
		stream.NewHashRoutingStrategy(routingKey)))
	out["new_super_stream_producer"] = codeOf(err)
	return out, nil
}

// login: NewEnvironment with the given credentials (and vhost); the error's code.
func login(a Args) (Result, error) {
	env, err := environment(a)
	out := Result{"code": codeOf(err), "error": errText(err)}
	if err == nil {
		_ = env.Close()
	}
	return out, nil
}

var serverClose = regexp.MustCompile(`Received close from server, reason: .* (\d+)$`)

// closesLogged: the codes of the Close frames the server sent, as the client logged them
// (it logs the answer to its own Close, code 1, the same way: those are left out).
func closesLogged() []int {
	out := []int{}
	for _, line := range logged.matching("Received close from server") {
		if m := serverClose.FindStringSubmatch(line); m != nil {
			if code, _ := strconv.Atoi(m[1]); code != 1 {
				out = append(out, code)
			}
		}
	}
	return out
}

// frameTooLarge (needs "debug": true and a small max_frame_size): a message bigger than the
// negotiated frame_max is refused by the client (FrameTooLarge, 0x0e in its confirm); a
// StoreOffset frame (which the client sends unchecked) of exactly frame_max bytes is taken,
// one byte more is answered with Close 0x0e; the Environment then connects again and works.
func frameTooLarge(a Args) (Result, error) {
	env, name, err := withStream(a)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	frameMax := a.num("max_frame_size", 0)
	out := Result{}
	producer, err := env.NewProducer(name, nil)
	if err != nil {
		return nil, err
	}
	c := newConfirms()
	c.watch(producer.NotifyPublishConfirmation())
	out["send_code"] = codeOf(producer.Send(amqp.NewMessage([]byte(strings.Repeat("x", frameMax)))))
	out["small_send_code"] = codeOf(producer.Send(amqp.NewMessage([]byte("fits"))))
	c.wait(2, 10*time.Second)
	out["confirmed"], out["failed"] = c.counts()
	out["failed_codes"] = c.failedCodes()
	_ = producer.Close()
	// StoreOffset: 4 (size) + 2 + 2 (key, version) + 2 + len(ref) + 2 + len(stream) + 8
	refFor := func(total int) string { return strings.Repeat("r", total-20-len(name)) }
	for _, step := range []struct {
		key   string
		total int
	}{{"at_frame_max", frameMax + 4}, {"above_frame_max", frameMax + 5}} {
		// the size field counts what follows it: frame_max + 4 bytes in all is the largest
		// frame RabbitMQ takes (rabbit_stream_core frame_size_ok: Size =< FrameMax)
		closes := len(closesLogged())
		err := env.StoreOffset(refFor(step.total), name, 1)
		if step.total <= frameMax+4 {
			// a request on the same connection: the server handles frames in order, so
			// its answer comes after any Close for the StoreOffset
			_, _ = env.QueryOffset("probe", name)
		} else {
			until(10*time.Second, func() bool { return len(closesLogged()) > closes })
		}
		out[step.key] = Result{"store_code": codeOf(err), "closes": closesLogged()[closes:]}
	}
	// the Environment's connection was closed: it connects again. The client logs the
	// server's Close before its locator's socket counts as closed, and a Metadata asked on
	// that socket meanwhile gets no answer within the client's 10 s RPC timeout
	// (StreamExists false, no error): asked again, past that timeout, until it comes (CI saw
	// it twice)
	var exists bool
	until(35*time.Second, func() bool {
		exists, err = env.StreamExists(name)
		return exists
	})
	out["exists_after"], out["exists_after_code"] = exists, codeOf(err)
	out["delete"] = codeOf(env.DeleteStream(name))
	return out, nil
}

// permissions: a user (credentials in the arguments) tries every kind of call on `stream`
// (which exists) and on `own` (a stream it may create).
func permissions(a Args) (Result, error) {
	env, err := environment(a)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	name := a.str("stream", "")
	out := Result{}
	out["declare"] = codeOf(env.DeclareStream(name+"-new", nil))
	producer, err := env.NewProducer(name, nil)
	out["new_producer"] = codeOf(err)
	if err == nil {
		c := newConfirms()
		c.watch(producer.NotifyPublishConfirmation())
		out["send"] = codeOf(producer.Send(amqp.NewMessage([]byte("from " + a.str("username", "")))))
		c.wait(1, 10*time.Second)
		out["confirmed"], _ = c.counts()
		_ = producer.Close()
	}
	// a named producer asks QueryPublisherSequence first (read permission in RabbitMQ)
	_, err = env.NewProducer(name, stream.NewProducerOptions().SetProducerName("named"))
	out["new_named_producer"] = codeOf(err)
	_, err = env.QuerySequence("named", name)
	out["query_sequence"] = codeOf(err)
	r := &Received{}
	consumer, err := env.NewConsumer(name, r.handler, stream.NewConsumerOptions().
		SetOffset(stream.OffsetSpecification{}.First()))
	out["new_consumer"] = codeOf(err)
	if err == nil {
		until(20*time.Second, func() bool { return r.count() >= a.num("expect", 0) })
		time.Sleep(200 * time.Millisecond)
		out["received"] = r.count()
		_ = consumer.Close()
	}
	_, err = env.QueryOffset("someone", name)
	out["query_offset"] = codeOf(err)
	out["delete"] = codeOf(env.DeleteStream(name))
	_, err = env.StreamStats(name)
	out["stream_stats"] = codeOf(err)
	return out, nil
}
