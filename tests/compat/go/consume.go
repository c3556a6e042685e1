// Scenarios of consumers: every offset specification, manual and automatic offset
// tracking, single active consumer, filtering.
package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/message"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

func init() {
	register("offsets", offsets)
	register("tracking", tracking)
	register("sac", singleActive)
	register("filter", filtering)
	register("manual_credit", manualCredit)
	register("idle", idle)
}

// idle: a consumer and a producer stay idle for `idle_s` seconds on connections that asked
// for `heartbeat_s` heartbeats (the client closes a connection after two silent periods),
// then a message still goes through both.
func idle(a Args) (Result, error) {
	env, name, err := withStream(a)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	r := &Received{}
	consumer, err := env.NewConsumer(name, r.handler, stream.NewConsumerOptions().
		SetOffset(stream.OffsetSpecification{}.Next()))
	if err != nil {
		return nil, err
	}
	producer, err := env.NewProducer(name, nil)
	if err != nil {
		return nil, err
	}
	c := newConfirms()
	c.watch(producer.NotifyPublishConfirmation())
	time.Sleep(time.Duration(a.num("idle_s", 10)) * time.Second)
	out := Result{"send": codeOf(producer.Send(amqp.NewMessage([]byte("after idle"))))}
	c.wait(1, 10*time.Second)
	until(10*time.Second, func() bool { return r.count() >= 1 })
	out["confirmed"], _ = c.counts()
	_, out["received"] = r.snapshot()
	out["closed_for_heartbeats"] = len(logged.matching("Too many heartbeat missing"))
	out["missed_heartbeats"] = len(logged.matching("Missing heart beat"))
	_ = producer.Close()
	return out, consumer.Close()
}

// manualCredit: three chunks of 10; a consumer with ManualCreditStrategy and 1 initial
// credit gets the first chunk only (credit counts chunks), then one more per Credit(1).
func manualCredit(a Args) (Result, error) {
	env, name, err := withStream(a)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	for b := 0; b < 3; b++ {
		if _, err := publish(env, name, nil, bodies(fmt.Sprintf("c%d-", b), 0, 10), true); err != nil {
			return nil, err
		}
	}
	r := &Received{}
	consumer, err := env.NewConsumer(name, r.handler, stream.NewConsumerOptions().
		SetOffset(stream.OffsetSpecification{}.First()).
		SetCreditStrategy(stream.ManualCreditStrategy).SetInitialCredits(1))
	if err != nil {
		return nil, err
	}
	var counts []int
	for step := 0; step < 3; step++ {
		want := 10 * (step + 1)
		until(20*time.Second, func() bool { return r.count() >= want })
		time.Sleep(500 * time.Millisecond) // nothing more may come without credit
		counts = append(counts, r.count())
		if step < 2 {
			if err := consumer.Credit(1); err != nil {
				return nil, err
			}
		}
	}
	return Result{"counts": counts}, consumer.Close()
}

func first(r *Received) Result {
	offsets, got := r.snapshot()
	out := Result{"count": len(got)}
	if len(got) > 0 {
		out["first_offset"], out["first_body"] = offsets[0], got[0]
		out["last_offset"] = offsets[len(offsets)-1]
	}
	return out
}

// offsets: three confirmed batches of 10 (offsets 0..29, one chunk each, 300 ms apart), then
// a consumer per offset specification; `next` gets only a message published after it
// subscribed.
func offsets(a Args) (Result, error) {
	env, name, err := withStream(a)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	var second int64
	for b := 0; b < 3; b++ {
		if b == 1 {
			second = time.Now().UnixMilli()
		}
		if _, err := publish(env, name, nil, bodies(fmt.Sprintf("o%d-", b), 0, 10), true); err != nil {
			return nil, err
		}
		time.Sleep(300 * time.Millisecond)
	}
	specs := []struct {
		key  string
		spec stream.OffsetSpecification
		want int // what RabbitMQ delivers: the wait ends there, then 300 ms more
	}{
		{"first", stream.OffsetSpecification{}.First(), 30},
		{"last", stream.OffsetSpecification{}.Last(), 10},
		{"offset_15", stream.OffsetSpecification{}.Offset(15), 15},
		{"timestamp_second_batch", stream.OffsetSpecification{}.Timestamp(second), 20},
	}
	out := Result{}
	for _, s := range specs {
		got, err := consume(env, name, stream.NewConsumerOptions().SetOffset(s.spec), s.want,
			20*time.Second, 300*time.Millisecond)
		if err != nil {
			return nil, err
		}
		out[s.key] = first(got)
	}
	// next: nothing of the 30 stored, only what comes after the subscription
	r := &Received{}
	consumer, err := env.NewConsumer(name, r.handler, stream.NewConsumerOptions().
		SetOffset(stream.OffsetSpecification{}.Next()))
	if err != nil {
		return nil, err
	}
	time.Sleep(500 * time.Millisecond)
	before := r.count()
	if _, err := publish(env, name, nil, bodies("after-", 0, 1), true); err != nil {
		return nil, err
	}
	until(20*time.Second, func() bool { return r.count() > before })
	time.Sleep(200 * time.Millisecond)
	next := first(r)
	next["before_publish"] = before
	out["next"] = next
	return out, consumer.Close()
}

// tracking: 30 messages; a named consumer stores offsets by hand (StoreOffset at the 10th
// message, StoreCustomOffset(19) at the end); QueryOffset through the consumer and the
// Environment; a consumer starting at LastConsumed; an automatic-tracking consumer
// (every 10 messages, flushed after 1 s and on close, here after all 30); QueryOffset of a name never stored.
func tracking(a Args) (Result, error) {
	env, name, err := withStream(a)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	if _, err := publish(env, name, nil, bodies("t-", 0, 30), true); err != nil {
		return nil, err
	}
	out := Result{}
	var mu sync.Mutex
	stored := []int{}
	seen := 0
	manual, err := env.NewConsumer(name, func(ctx stream.ConsumerContext, _ *amqp.Message) {
		mu.Lock()
		defer mu.Unlock()
		seen++
		if seen == 10 {
			stored = append(stored, codeOf(ctx.Consumer.StoreOffset()))
		}
	}, stream.NewConsumerOptions().SetConsumerName("manual").
		SetOffset(stream.OffsetSpecification{}.First()))
	if err != nil {
		return nil, err
	}
	until(10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return seen >= 30 })
	// StoreOffset sends no answer: poll QueryOffset until the store took effect
	var q int64
	until(20*time.Second, func() bool { q, err = manual.QueryOffset(); return err == nil && q == 9 })
	out["after_store_offset"] = q
	stored = append(stored, codeOf(manual.StoreCustomOffset(19)))
	until(20*time.Second, func() bool { q, err = env.QueryOffset("manual", name); return q == 19 })
	out["store_codes"] = stored
	out["env_query_offset"], out["env_query_code"] = q, codeOf(err)
	if err := manual.Close(); err != nil {
		return nil, err
	}
	resumed, err := consume(env, name, stream.NewConsumerOptions().SetConsumerName("manual").
		SetOffset(stream.OffsetSpecification{}.LastConsumed()), 11, 20*time.Second, 200*time.Millisecond)
	if err != nil {
		return nil, err
	}
	out["last_consumed"] = first(resumed)
	auto, err := consume(env, name, stream.NewConsumerOptions().SetConsumerName("auto").
		SetAutoCommit(stream.NewAutoCommitStrategy().SetCountBeforeStorage(10).
			SetFlushInterval(time.Second)).SetOffset(stream.OffsetSpecification{}.First()),
		30, 20*time.Second, 0)
	if err != nil {
		return nil, err
	}
	out["auto_received"] = auto.count()
	until(20*time.Second, func() bool { q, err = env.QueryOffset("auto", name); return q == 29 })
	out["auto_query_offset"], out["auto_query_code"] = q, codeOf(err)
	_, err = env.QueryOffset("never-stored", name)
	out["unknown_reference_code"] = codeOf(err)
	return out, nil
}

// Updates records the ConsumerUpdate calls of a single active consumer.
type Updates struct {
	mu    sync.Mutex
	calls []string
}

func (u *Updates) add(s string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.calls = append(u.calls, s)
}

func (u *Updates) list() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.calls...)
}

// singleActive: two consumers named `group` with single active consumer on; the first gets
// 10 messages, is closed, the second is promoted (ConsumerUpdate: resume after the stored
// offset) and gets the 10 next.
func singleActive(a Args) (Result, error) {
	env, name, err := withStream(a)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	updates := &Updates{}
	sac := func(who string) *stream.SingleActiveConsumer {
		return stream.NewSingleActiveConsumer(func(s string, active bool) stream.OffsetSpecification {
			updates.add(fmt.Sprintf("%s:%t", who, active))
			off, err := env.QueryOffset("group", s)
			if err != nil {
				return stream.OffsetSpecification{}.First()
			}
			return stream.OffsetSpecification{}.Offset(off + 1)
		})
	}
	received := map[string]*Received{"one": {}, "two": {}}
	consumers := map[string]*stream.Consumer{}
	for _, who := range []string{"one", "two"} {
		r := received[who]
		c, err := env.NewConsumer(name, func(ctx stream.ConsumerContext, m *amqp.Message) {
			r.handler(ctx, m)
			_ = ctx.Consumer.StoreOffset()
		}, stream.NewConsumerOptions().SetConsumerName("group").
			SetSingleActiveConsumer(sac(who)))
		if err != nil {
			return nil, err
		}
		consumers[who] = c
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := publish(env, name, nil, bodies("a-", 0, 10), true); err != nil {
		return nil, err
	}
	until(10*time.Second, func() bool { return received["one"].count() >= 10 })
	time.Sleep(300 * time.Millisecond)
	out := Result{"updates_before_close": updates.list()}
	if err := consumers["one"].Close(); err != nil {
		return nil, err
	}
	if _, err := publish(env, name, nil, bodies("b-", 0, 10), true); err != nil {
		return nil, err
	}
	until(10*time.Second, func() bool { return received["two"].count() >= 10 })
	time.Sleep(300 * time.Millisecond)
	_, out["one"] = received["one"].snapshot()
	_, out["two"] = received["two"].snapshot()
	out["updates"] = updates.list()
	return out, consumers["two"].Close()
}

func colored(color string, from, to int) []message.StreamMessage {
	msgs := bodies(color+"-", from, to)
	for _, m := range msgs {
		m.(*amqp.AMQP10).ApplicationProperties = map[string]any{"color": color}
	}
	return msgs
}

// filtering: a filtering producer writes 20 red, 20 blue, 20 red messages (one chunk each,
// the filter value from the "color" property), a plain producer 5 messages (Publish v1: a
// chunk without filter); consumers filtering on blue, with and without match-unfiltered. The
// post filter sees every message of each chunk the server sent, so it tells which chunks
// were skipped. Last, a filtering producer sends a message whose filter value is empty: the
// client (v1.8.3 sendWithFilter) then writes an int32 -1 where the protocol has an int16 -1
// and leaves those bytes out of the frame size, so the server gets a malformed Publish frame;
// what the client saw of the server's answer (Close codes it logged) is reported.
func filtering(a Args) (Result, error) {
	env, name, err := withStream(a)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	opts := func() *stream.ProducerOptions {
		return stream.NewProducerOptions().SetFilter(stream.NewProducerFilter(
			func(m message.StreamMessage) string {
				if c, ok := m.GetApplicationProperties()["color"]; ok {
					return fmt.Sprint(c)
				}
				return ""
			}))
	}
	for _, batch := range [][]message.StreamMessage{colored("red", 0, 20),
		colored("blue", 0, 20), colored("red", 20, 40)} {
		if _, err := publish(env, name, opts(), batch, true); err != nil {
			return nil, err
		}
	}
	if _, err := publish(env, name, nil, bodies("plain-", 0, 5), true); err != nil {
		return nil, err
	}
	out := Result{}
	for _, unfiltered := range []bool{false, true} {
		var mu sync.Mutex
		var postSeen []string
		filter := stream.NewConsumerFilter([]string{"blue"}, unfiltered, func(m *amqp.Message) bool {
			mu.Lock()
			defer mu.Unlock()
			postSeen = append(postSeen, string(m.GetData()))
			return m.ApplicationProperties["color"] == "blue" ||
				(unfiltered && m.ApplicationProperties["color"] == nil)
		})
		want := 20
		if unfiltered {
			want = 25
		}
		got, err := consume(env, name, stream.NewConsumerOptions().SetFilter(filter).
			SetOffset(stream.OffsetSpecification{}.First()), want, 10*time.Second,
			500*time.Millisecond)
		if err != nil {
			return nil, err
		}
		_, kept := got.snapshot()
		mu.Lock()
		out[fmt.Sprintf("match_unfiltered_%t", unfiltered)] = Result{
			"received": kept, "post_filter_saw": len(postSeen)}
		mu.Unlock()
	}
	producer, err := env.NewProducer(name, opts())
	if err != nil {
		return nil, err
	}
	c := newConfirms()
	c.watch(producer.NotifyPublishConfirmation())
	out["empty_value_send"] = codeOf(producer.BatchSend(bodies("no-color-", 0, 1)))
	until(10*time.Second, func() bool { return len(closesLogged()) > 0 })
	out["empty_value_closes"] = closesLogged()
	out["empty_value_confirmed"], _ = c.counts()
	_ = producer.Close()
	// everything before is still there
	got, err := consume(env, name, stream.NewConsumerOptions().
		SetOffset(stream.OffsetSpecification{}.First()), 65, 10*time.Second, 300*time.Millisecond)
	if err != nil {
		return nil, err
	}
	out["stored_after"] = got.count()
	return out, nil
}
