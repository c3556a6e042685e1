// Scenarios of super streams: declare with partitions and with binding keys, Partitions and
// Route, a SuperStreamProducer with hash routing (murmur3) and key routing, two
// SuperStreamConsumers with single active consumer that share the partitions, delete.
package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/message"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

func init() { register("superstream", superStream) }

func keyed(prefix string, from, to int) []message.StreamMessage {
	msgs := bodies(prefix, from, to)
	for i, m := range msgs {
		m.(*amqp.AMQP10).ApplicationProperties = map[string]any{"key": fmt.Sprintf("k-%d", from+i)}
	}
	return msgs
}

func routingKey(m message.StreamMessage) string {
	return fmt.Sprint(m.GetApplicationProperties()["key"])
}

// sendSuper sends msgs through a SuperStreamProducer; returns body -> partition of each
// confirmed message and the number not confirmed.
func sendSuper(env *stream.Environment, super string, strategy stream.RoutingStrategy,
	msgs []message.StreamMessage) (map[string]string, int, []int, error) {
	producer, err := env.NewSuperStreamProducer(super, stream.NewSuperStreamProducerOptions(strategy))
	if err != nil {
		return nil, 0, nil, err
	}
	defer producer.Close()
	var mu sync.Mutex
	routed, answered, failed := map[string]string{}, 0, 0
	confirms := producer.NotifyPublishConfirmation(1)
	go func() {
		for c := range confirms {
			mu.Lock()
			for _, s := range c.ConfirmationStatus {
				answered++
				if s.IsConfirmed() {
					routed[string(s.GetMessage().GetData()[0])] = c.Partition
				} else {
					failed++
				}
			}
			mu.Unlock()
		}
	}()
	var sendCodes []int
	sent := 0
	for _, m := range msgs {
		err := producer.Send(m)
		sendCodes = append(sendCodes, codeOf(err))
		if err == nil {
			sent++
		}
	}
	until(20*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return answered >= sent })
	mu.Lock()
	defer mu.Unlock()
	return routed, failed, sendCodes, nil
}

// PartitionReceived is what a super stream consumer got: partition -> bodies.
type PartitionReceived struct {
	mu  sync.Mutex
	got map[string][]string
	n   int
}

func (p *PartitionReceived) handler(ctx stream.ConsumerContext, m *amqp.Message) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := ctx.Consumer.GetStreamName()
	p.got[s] = append(p.got[s], string(m.GetData()))
	p.n++
}

func (p *PartitionReceived) count() int { p.mu.Lock(); defer p.mu.Unlock(); return p.n }

func (p *PartitionReceived) copy() map[string][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string][]string{}
	for k, v := range p.got {
		out[k] = append([]string(nil), v...)
	}
	return out
}

func superStream(a Args) (Result, error) {
	env, err := environment(a)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	name := a.str("stream", "")
	out := Result{}
	out["declare"] = codeOf(env.DeclareSuperStream(name, stream.NewPartitionsOptions(3)))
	partitions, err := env.QueryPartitions(name)
	if err != nil {
		return nil, err
	}
	out["partitions"] = partitions
	route, err := env.QueryRoute(name, "1")
	out["route_of_binding_1"], out["route_code"] = route, codeOf(err)
	// two single active consumers of one group: each partition has one active consumer
	// (with "sac": false one plain SuperStreamConsumer, "one", and no hand-over below)
	sac := a["sac"] != false
	members := []string{"one", "two"}
	if !sac {
		members = members[:1]
	}
	updates := &Updates{}
	received := map[string]*PartitionReceived{"two": {got: map[string][]string{}}}
	consumers := map[string]*stream.SuperStreamConsumer{}
	for _, who := range members {
		who := who
		received[who] = &PartitionReceived{got: map[string][]string{}}
		opts := stream.NewSuperStreamConsumerOptions().SetConsumerName("ss-group").
			SetOffset(stream.OffsetSpecification{}.First())
		if sac {
			opts.SetSingleActiveConsumer(stream.NewSingleActiveConsumer(
				func(partition string, active bool) stream.OffsetSpecification {
					updates.add(fmt.Sprintf("%s:%s:%t", who, partition, active))
					return stream.OffsetSpecification{}.First()
				}))
		}
		c, err := env.NewSuperStreamConsumer(name, received[who].handler, opts)
		if err != nil {
			return nil, err
		}
		consumers[who] = c
		time.Sleep(300 * time.Millisecond)
	}
	routed, failed, _, err := sendSuper(env, name,
		stream.NewHashRoutingStrategy(routingKey), keyed("h-", 0, 30))
	if err != nil {
		return nil, err
	}
	out["hash_routed"], out["hash_failed"] = routed, failed
	until(10*time.Second, func() bool { return received["one"].count()+received["two"].count() >= 30 })
	time.Sleep(300 * time.Millisecond)
	out["one_before_close"], out["two_before_close"] = received["one"].copy(), received["two"].copy()
	// closing "one" hands its partitions to "two"
	if err := consumers["one"].Close(); err != nil {
		return nil, err
	}
	if sac {
		if err := handOver(env, name, received["two"], out); err != nil {
			return nil, err
		}
		out["updates"] = updates.list()
		if err := consumers["two"].Close(); err != nil {
			return nil, err
		}
	}
	return out, superStreamCleanup(env, name, out)
}

// handOver: after "one" closed, 15 more messages all reach "two".
func handOver(env *stream.Environment, name string, two *PartitionReceived, out Result) error {
	before := two.count()
	if _, _, _, err := sendSuper(env, name, stream.NewHashRoutingStrategy(routingKey),
		keyed("after-", 30, 45)); err != nil {
		return err
	}
	// "two" restarts each partition it takes over from First (its ConsumerUpdate): it gets
	// at least the 15 new messages
	until(10*time.Second, func() bool {
		got := two.copy()
		n := 0
		for _, bodies := range got {
			for _, b := range bodies {
				if len(b) > 6 && b[:6] == "after-" {
					n++
				}
			}
		}
		return n >= 15
	})
	time.Sleep(300 * time.Millisecond)
	out["two_after_close"] = two.copy()
	out["two_count_before"] = before
	return nil
}

// superStreamCleanup deletes the super stream, then tries binding keys and key routing on a
// second one: a key without a binding is not sent.
func superStreamCleanup(env *stream.Environment, name string, out Result) error {
	out["delete"] = codeOf(env.DeleteSuperStream(name))
	_, err := env.QueryPartitions(name)
	out["partitions_after_delete_code"] = codeOf(err)
	keys := name + "-keys"
	out["declare_keys"] = codeOf(env.DeclareSuperStream(keys,
		stream.NewBindingsOptions([]string{"eu", "us"})))
	route, err := env.QueryRoute(keys, "eu")
	out["route_eu"], out["route_eu_code"] = route, codeOf(err)
	route, err = env.QueryRoute(keys, "asia")
	out["route_asia"], out["route_asia_code"] = route, codeOf(err)
	var msgs []message.StreamMessage
	for _, region := range []string{"eu", "us", "eu", "asia"} {
		m := amqp.NewMessage([]byte("region-" + region))
		m.ApplicationProperties = map[string]any{"key": region}
		msgs = append(msgs, m)
	}
	routed, failed, sendCodes, err := sendSuper(env, keys, stream.NewKeyRoutingStrategy(routingKey), msgs)
	if err != nil {
		return err
	}
	out["key_routed"], out["key_failed"], out["key_send_codes"] = routed, failed, sendCodes
	out["delete_keys"] = codeOf(env.DeleteSuperStream(keys))
	return nil
}
