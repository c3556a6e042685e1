// The client's reliable producer and consumer (pkg/ha) across a server fault the test makes:
// publish without pause, tell the test (phase "publishing", with the leader's address), wait
// for its line on stdin (it has restarted or killed a server by then), go on until `after`
// more messages are confirmed, then check that the reliable consumer and a fresh consumer
// reading from the first offset have every confirmed message.
package main

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/ha"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

func init() { register("reliable", reliable) }

// watchStatus records whether status() was ever StatusReconnecting.
func watchStatus(status func() int, stop <-chan struct{}) *atomic.Bool {
	seen := &atomic.Bool{}
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				if status() == ha.StatusReconnecting {
					seen.Store(true)
				}
			}
		}
	}()
	return seen
}

func missing(want []string, have map[string]int) []string {
	var out []string
	for _, b := range want {
		if have[b] == 0 {
			out = append(out, b)
		}
	}
	return out
}

func reliable(a Args) (Result, error) {
	env, name, err := withStream(a)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	confirms := newConfirms()
	producer, err := ha.NewReliableProducer(env, name, stream.NewProducerOptions(),
		confirms.record)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	seen := map[string]int{}
	consumer, err := ha.NewReliableConsumer(env, name, stream.NewConsumerOptions().
		SetOffset(stream.OffsetSpecification{}.First()),
		func(_ stream.ConsumerContext, m *amqp.Message) {
			mu.Lock()
			seen[string(m.GetData())]++
			mu.Unlock()
		})
	if err != nil {
		return nil, err
	}
	stop := make(chan struct{})
	producerReconnected := watchStatus(producer.GetStatus, stop)
	consumerReconnected := watchStatus(consumer.GetStatus, stop)
	var sent atomic.Int64
	sending := make(chan struct{})
	go func() { // Send blocks while the producer reconnects
		defer close(sending)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := producer.Send(amqp.NewMessage([]byte(fmt.Sprintf("r-%d", i)))); err == nil {
				sent.Add(1)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	before := a.num("before", 200)
	if !until(30*time.Second, func() bool { ok, _ := confirms.counts(); return ok >= before }) {
		return nil, fmt.Errorf("fewer than %d confirms before the fault", before)
	}
	phase("publishing", Result{"leader": producer.GetBroker().Host + ":" + producer.GetBroker().Port})
	atSignal, _ := confirms.counts()
	after := a.num("after", 200)
	recovered := until(time.Duration(a.num("timeout_s", 90))*time.Second, func() bool {
		ok, _ := confirms.counts()
		return ok >= atSignal+after
	})
	close(stop)
	<-sending
	answered := until(30*time.Second, func() bool {
		ok, bad := confirms.counts()
		return int64(ok+bad) >= sent.Load()
	})
	confirms.mu.Lock()
	confirmed := append([]string(nil), confirms.confirmed...)
	confirms.mu.Unlock()
	caughtUp := until(60*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(missing(confirmed, seen)) == 0
	})
	out := Result{"recovered": recovered, "all_answered": answered, "caught_up": caughtUp,
		"sent": sent.Load(), "confirmed": len(confirmed), "confirmed_at_signal": atSignal,
		"failed_codes":         confirms.failedCodes(),
		"producer_reconnected": producerReconnected.Load(),
		"consumer_reconnected": consumerReconnected.Load(),
		"producer_status":      producer.GetStatusAsString(),
		"consumer_status":      consumer.GetStatusAsString()}
	mu.Lock()
	duplicates := 0
	for _, n := range seen {
		if n > 1 {
			duplicates++
		}
	}
	lost := missing(confirmed, seen)
	mu.Unlock()
	out["reliable_consumer_missing"], out["reliable_consumer_duplicates"] = len(lost), duplicates
	if len(lost) > 5 {
		lost = lost[:5]
	}
	out["reliable_consumer_missing_sample"] = lost
	_ = producer.Close()
	_ = consumer.Close()
	// a fresh consumer from the first offset: every confirmed message is in the stream
	fresh := &Received{}
	reader, err := env.NewConsumer(name, fresh.handler, stream.NewConsumerOptions().
		SetOffset(stream.OffsetSpecification{}.First()))
	if err != nil {
		return nil, err
	}
	counts := map[string]int{}
	var stored []string
	until(30*time.Second, func() bool {
		_, stored = fresh.snapshot()
		counts = map[string]int{}
		for _, b := range stored {
			counts[b]++
		}
		return len(missing(confirmed, counts)) == 0
	})
	_ = reader.Close()
	lost = missing(confirmed, counts)
	out["stored"], out["stored_missing"] = len(stored), len(lost)
	if len(lost) > 5 {
		lost = lost[:5]
	}
	out["stored_missing_sample"] = lost
	return out, nil
}
