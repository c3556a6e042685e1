// Helpers the scenarios share: publish bodies and wait for every confirm, collect what a
// consumer receives. Bodies are strings; a received message is reported as its offset and
// body.
package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/message"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

// Confirms counts what a producer's confirmation channel reported.
type Confirms struct {
	mu        sync.Mutex
	confirmed []string // bodies, in the order confirmed
	failed    map[int]int
	ids       []int64 // publishing ids confirmed
}

func newConfirms() *Confirms { return &Confirms{failed: map[int]int{}} }

func (c *Confirms) watch(ch stream.ChannelPublishConfirm) {
	go func() {
		for batch := range ch {
			c.record(batch)
		}
	}()
}

func (c *Confirms) record(batch []*stream.ConfirmationStatus) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range batch {
		if s.IsConfirmed() {
			c.confirmed = append(c.confirmed, string(s.GetMessage().GetData()[0]))
			c.ids = append(c.ids, s.GetPublishingId())
		} else {
			c.failed[int(s.GetErrorCode())]++
		}
	}
}

func (c *Confirms) counts() (int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	failed := 0
	for _, n := range c.failed {
		failed += n
	}
	return len(c.confirmed), failed
}

// wait until n messages were confirmed or failed, at most timeout.
func (c *Confirms) wait(n int, timeout time.Duration) bool {
	return until(timeout, func() bool { ok, bad := c.counts(); return ok+bad >= n })
}

func (c *Confirms) failedCodes() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for code, n := range c.failed {
		out[fmt.Sprint(code)] = n
	}
	return out
}

func bodies(prefix string, from, to int) []message.StreamMessage {
	var out []message.StreamMessage
	for i := from; i < to; i++ {
		out = append(out, amqp.NewMessage([]byte(fmt.Sprintf("%s%d", prefix, i))))
	}
	return out
}

// publish sends msgs (one Send each, or one BatchSend) and waits for their confirms.
func publish(env *stream.Environment, streamName string, opts *stream.ProducerOptions,
	msgs []message.StreamMessage, batch bool) (*Confirms, error) {
	producer, err := env.NewProducer(streamName, opts)
	if err != nil {
		return nil, err
	}
	defer producer.Close()
	c := newConfirms()
	c.watch(producer.NotifyPublishConfirmation())
	if batch {
		if err := producer.BatchSend(msgs); err != nil {
			return nil, err
		}
	} else {
		for _, m := range msgs {
			if err := producer.Send(m); err != nil {
				return nil, err
			}
		}
	}
	if !c.wait(len(msgs), 30*time.Second) {
		ok, bad := c.counts()
		return nil, fmt.Errorf("%d of %d messages answered after 30s (%d confirmed)",
			ok+bad, len(msgs), ok)
	}
	return c, nil
}

// Received collects what a consumer's handler gets.
type Received struct {
	mu      sync.Mutex
	offsets []int64
	bodies  []string
}

func (r *Received) handler(ctx stream.ConsumerContext, m *amqp.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.offsets = append(r.offsets, ctx.Consumer.GetOffset())
	r.bodies = append(r.bodies, string(m.GetData()))
}

func (r *Received) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.bodies)
}

func (r *Received) snapshot() ([]int64, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.offsets...), append([]string(nil), r.bodies...)
}

func (r *Received) result() Result {
	offsets, got := r.snapshot()
	return Result{"offsets": offsets, "bodies": got}
}

// consume subscribes with opts until n messages arrived (at most timeout), then waits
// settle more so that extra deliveries show, and closes the consumer.
func consume(env *stream.Environment, streamName string, opts *stream.ConsumerOptions, n int,
	timeout, settle time.Duration) (*Received, error) {
	r := &Received{}
	consumer, err := env.NewConsumer(streamName, r.handler, opts)
	if err != nil {
		return nil, err
	}
	until(timeout, func() bool { return r.count() >= n })
	time.Sleep(settle)
	return r, consumer.Close()
}

func stats(env *stream.Environment, streamName string) (Result, error) {
	s, err := env.StreamStats(streamName)
	if err != nil {
		return nil, err
	}
	out := Result{}
	if v, err := s.FirstOffset(); err == nil {
		out["first_offset"] = v
	}
	if v, err := s.CommittedChunkId(); err == nil {
		out["committed_chunk_id"] = v
	}
	return out, nil
}
