// Scenarios on messages: Publish with each ack policy and every MessageOption, PublishAsync
// with an ack handler, PublishToSubject, Subscribe from every start position and to every
// stop position, ReadISRReplica, cursors and the consumer-group Consumer.
package main

import (
	"sync"
	"time"

	lift "github.com/liftbridge-io/go-liftbridge/v2"
)

func init() {
	scenarios["publish"] = publish
	scenarios["positions"] = positions
	scenarios["cursors"] = cursors
	scenarios["group"] = group
}

// publish: a stream of 2 partitions; Publish with LEADER (key, headers, correlation id),
// ALL (to partition 1), NONE; PublishAsync x20 with an ack handler; Publish partitioned by
// key and round robin; PublishToSubject; then every message read back.
func publish(args Args) result {
	client := connect(args)
	defer client.Close()
	create(client, args, lift.Partitions(2))
	out := result{}
	ack, err := client.Publish(timeout(10), args.Stream, []byte("leader"), lift.Key([]byte("k1")),
		lift.Header("h1", []byte("v1")), lift.Headers(map[string][]byte{"h2": []byte("v2")}),
		lift.CorrelationID("c-leader"), lift.AckPolicyLeader())
	out["leader"] = map[string]any{"ack": ackInfo(ack), "error": errInfo(err)}
	ack, err = client.Publish(timeout(10), args.Stream, []byte("all"), lift.ToPartition(1),
		lift.CorrelationID("c-all"), lift.AckPolicyAll())
	out["all"] = map[string]any{"ack": ackInfo(ack), "error": errInfo(err)}
	ack, err = client.Publish(timeout(10), args.Stream, []byte("none"), lift.AckPolicyNone())
	out["none"] = map[string]any{"ack": ackInfo(ack), "error": errInfo(err)}

	var mu sync.Mutex
	var wg sync.WaitGroup
	asyncAcks := map[string]any{}
	for i := 0; i < 20; i++ {
		wg.Add(1)
		value := values("async", 20)[i]
		err := client.PublishAsync(timeout(10), args.Stream, []byte(value),
			func(a *lift.Ack, err error) {
				mu.Lock()
				asyncAcks[value] = map[string]any{"ack": ackInfo(a), "error": errInfo(err)}
				mu.Unlock()
				wg.Done()
			}, lift.AckPolicyLeader(), lift.ToPartition(int32(i%2)))
		must(err, "PublishAsync")
	}
	wg.Wait()
	out["async"] = asyncAcks

	byKey := map[string]any{}
	for _, key := range []string{"a", "b", "c", "d"} {
		ack, err := client.Publish(timeout(10), args.Stream, []byte("key-"+key),
			lift.Key([]byte(key)), lift.PartitionByKey(), lift.AckPolicyLeader())
		must(err, "publish by key")
		byKey[key] = ack.MessageSubject()
	}
	out["by_key"] = byKey
	roundRobin := []string{}
	for i := 0; i < 4; i++ {
		ack, err := client.Publish(timeout(10), args.Stream, []byte("rr"),
			lift.PartitionByRoundRobin(), lift.AckPolicyLeader())
		must(err, "publish round robin")
		roundRobin = append(roundRobin, ack.MessageSubject())
	}
	out["round_robin"] = roundRobin

	ack, err = client.PublishToSubject(timeout(10), args.Stream+".1", []byte("to-subject"),
		lift.Key([]byte("ks")), lift.CorrelationID("c-subject"), lift.AckPolicyLeader())
	out["to_subject"] = map[string]any{"ack": ackInfo(ack), "error": errInfo(err)}
	// ack policy NONE: fire and forget (nil ack; go-liftbridge always sets a deadline, and
	// the policy's zero value is LEADER)
	ack, err = client.PublishToSubject(timeout(10), args.Stream, []byte("to-subject-none"),
		lift.AckPolicyNone())
	out["to_subject_none"] = map[string]any{"ack": ackInfo(ack), "error": errInfo(err)}
	// one more on the same path, acked: the one before is stored by then
	_, err = client.PublishToSubject(timeout(10), args.Stream, []byte("to-subject-last"),
		lift.AckPolicyLeader())
	must(err, "PublishToSubject")

	read := map[string]any{}
	for p := int32(0); p < 2; p++ {
		var got Received
		// the NONE publish of partition 0 is stored some time after its call returned: on a
		// cluster it may go through another server than the acked one after it
		for try := 0; try < 25; try++ {
			got = collect(client, args.Stream, 1000, 10*time.Second, lift.Partition(p),
				lift.StartAtEarliestReceived(), lift.StopAtLatestReceived())
			if p == 1 || hasValue(got, "to-subject-none") {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		read[map[int32]string{0: "0", 1: "1"}[p]] = map[string]any{
			"messages": got.Messages, "end": errInfo(got.End)}
	}
	out["read"] = read
	return out
}

func hasValue(r Received, value string) bool {
	for _, m := range r.Messages {
		if m["value"] == value {
			return true
		}
	}
	return false
}

// positions: 5 messages, a pause around time T, 5 more; then Subscribe from every start
// position and to every stop position.
func positions(args Args) result {
	client := connect(args)
	defer client.Close()
	create(client, args)
	publishAll(client, args.Stream, values("a", 5))
	time.Sleep(300 * time.Millisecond)
	t := time.Now()
	time.Sleep(300 * time.Millisecond)
	publishAll(client, args.Stream, values("b", 5))
	wait := 5 * time.Second
	out := result{}
	out["earliest"] = collect(client, args.Stream, 10, wait, lift.StartAtEarliestReceived()).info()
	out["latest"] = collect(client, args.Stream, 1, wait, lift.StartAtLatestReceived()).info()
	out["offset"] = collect(client, args.Stream, 7, wait, lift.StartAtOffset(3)).info()
	out["time"] = collect(client, args.Stream, 5, wait, lift.StartAtTime(t)).info()
	out["time_delta"] = collect(client, args.Stream, 5, wait,
		lift.StartAtTimeDelta(time.Since(t))).info()
	out["default"] = collect(client, args.Stream, 1, 500*time.Millisecond).info()
	// new only: nothing until a new message
	newOnly := subscribe(client, args.Stream, lift.StartAtNewOnly())
	publishAll(client, args.Stream, []string{"new"})
	out["new_only"] = newOnly.wait(1, wait).info()
	out["stop_offset"] = collect(client, args.Stream, 100, wait, lift.StartAtEarliestReceived(),
		lift.StopAtOffset(4)).info()
	out["stop_time"] = collect(client, args.Stream, 100, wait, lift.StartAtEarliestReceived(),
		lift.StopAtTime(t)).info()
	out["stop_latest"] = collect(client, args.Stream, 100, wait, lift.StartAtOffset(8),
		lift.StopAtLatestReceived()).info()
	out["isr_replica"] = collect(client, args.Stream, 11, wait, lift.StartAtEarliestReceived(),
		lift.ReadISRReplica()).info()
	out["stop_before_start"] = collect(client, args.Stream, 100, wait, lift.StartAtOffset(5),
		lift.StopAtOffset(2)).info()
	return out
}

// cursors: SetCursor and FetchCursor on two partitions; a cursor never set is -1.
func cursors(args Args) result {
	client := connect(args)
	defer client.Close()
	create(client, args, lift.Partitions(2))
	out := result{}
	out["set0"] = errInfo(client.SetCursor(timeout(10), "reader", args.Stream, 0, 5))
	out["set1"] = errInfo(client.SetCursor(timeout(10), "reader", args.Stream, 1, 7))
	out["set0_again"] = errInfo(client.SetCursor(timeout(10), "reader", args.Stream, 0, 6))
	fetched := map[string]any{}
	for name, call := range map[string][2]any{"reader0": {"reader", int32(0)},
		"reader1": {"reader", int32(1)}, "other0": {"other", int32(0)}} {
		offset, err := client.FetchCursor(timeout(10), call[0].(string), args.Stream,
			call[1].(int32))
		fetched[name] = map[string]any{"offset": offset, "error": errInfo(err)}
	}
	out["fetch"] = fetched
	return out
}

// member is one Consumer of a group and what its handler received.
type member struct {
	consumer *lift.Consumer
	mu       sync.Mutex
	got      []map[string]any
	errs     []string
}

func join(client lift.Client, args Args, groupID, id string, streams []string) *member {
	consumer, err := client.CreateConsumer(groupID, lift.ConsumerID(id),
		lift.AutoOffsetEarliest(), lift.AutoCheckpoint(0),
		lift.FetchAssignmentsInterval(func(time.Duration) time.Duration {
			return 200 * time.Millisecond
		}))
	must(err, "CreateConsumer")
	m := &member{consumer: consumer}
	must(consumer.Subscribe(timeout(60), streams, func(msg *lift.Message, err error) {
		m.mu.Lock()
		defer m.mu.Unlock()
		if err != nil {
			m.errs = append(m.errs, err.Error())
			return
		}
		m.got = append(m.got, messageInfo(msg))
	}), "consumer Subscribe")
	return m
}

// close: Consumer.Close, which sends LeaveConsumerGroup first, then cancels the consumer's
// context and waits for its loop. In go-liftbridge v2.3.0 that loop leaves only from its idle
// wait: cancelled while a fetch fails (or is under way) it retries at once, forever, and Close
// never returns. So "hung" after 5 s is reported as such (the member has left by then; the
// test checks what the group does next).
func (m *member) close() any {
	done := make(chan error, 1)
	go func() { done <- m.consumer.Close() }()
	select {
	case err := <-done:
		return errInfo(err)
	case <-time.After(5 * time.Second):
		return "hung"
	}
}

// waitFor waits until the members together received every value of want (or wait passes);
// returns what each got (values by partition) and their errors.
func waitFor(members map[string]*member, want []string, wait time.Duration) map[string]any {
	deadline := time.Now().Add(wait)
	for {
		seen := map[string]bool{}
		for _, m := range members {
			m.mu.Lock()
			for _, msg := range m.got {
				seen[msg["value"].(string)] = true
			}
			m.mu.Unlock()
		}
		missing := 0
		for _, v := range want {
			if !seen[v] {
				missing++
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	out := map[string]any{}
	for id, m := range members {
		m.mu.Lock()
		byPartition := map[string][]string{}
		for _, msg := range m.got {
			p := map[int32]string{0: "0", 1: "1"}[msg["partition"].(int32)]
			byPartition[p] = append(byPartition[p], msg["value"].(string))
		}
		out[id] = map[string]any{"values": byPartition, "errors": m.errs}
		m.got, m.errs = nil, nil
		m.mu.Unlock()
	}
	return out
}

// group: a consumer group (named as the stream) on a stream of 2 partitions. One member reads everything from the
// earliest, checkpoints and leaves; the group's cursors say where it stopped; a new member
// goes on after them; two members split the partitions.
func group(args Args) result {
	client := connect(args)
	defer client.Close()
	create(client, args, lift.Partitions(2))
	for p := int32(0); p < 2; p++ {
		publishAll(client, args.Stream, values(map[int32]string{0: "p0-", 1: "p1-"}[p], 3),
			lift.ToPartition(p))
	}
	streams := []string{args.Stream}
	groupID := args.Stream // one group per run
	out := result{}
	first := join(client, args, groupID, "first", streams)
	out["first"] = waitFor(map[string]*member{"first": first},
		append(values("p0-", 3), values("p1-", 3)...), 15*time.Second)
	out["checkpoint"] = errInfo(first.consumer.Checkpoint(timeout(10)))
	out["close"] = first.close()
	cursors := []int64{}
	for p := int32(0); p < 2; p++ {
		offset, err := client.FetchCursor(timeout(10), "__group:"+groupID, args.Stream, p)
		must(err, "FetchCursor")
		cursors = append(cursors, offset)
	}
	out["cursors"] = cursors
	publishAll(client, args.Stream, []string{"p0-new"}, lift.ToPartition(0))
	publishAll(client, args.Stream, []string{"p1-new"}, lift.ToPartition(1))
	second := join(client, args, groupID, "second", streams)
	out["second"] = waitFor(map[string]*member{"second": second},
		[]string{"p0-new", "p1-new"}, 15*time.Second)
	third := join(client, args, groupID, "third", streams)
	// let the assignments settle (both members fetch every 200 ms), then one message each
	time.Sleep(1500 * time.Millisecond)
	publishAll(client, args.Stream, []string{"p0-split"}, lift.ToPartition(0))
	publishAll(client, args.Stream, []string{"p1-split"}, lift.ToPartition(1))
	out["split"] = waitFor(map[string]*member{"second": second, "third": third},
		[]string{"p0-split", "p1-split"}, 15*time.Second)
	meta, err := client.FetchMetadata(timeout(10), lift.ConsumerGroups([]string{groupID}))
	must(err, "FetchMetadata groups")
	if g := meta.GetConsumerGroup(groupID); g != nil {
		out["group"] = map[string]any{"coordinator": g.Coordinator(), "epoch": g.Epoch()}
	}
	// let both members' loops go back to their idle wait (a member told of a new epoch
	// backs off 2 s) so that Close returns (see member.close)
	time.Sleep(2500 * time.Millisecond)
	out["close_second"] = second.close()
	out["close_third"] = third.close()
	meta, err = client.FetchMetadata(timeout(10), lift.ConsumerGroups([]string{groupID}))
	must(err, "FetchMetadata groups")
	out["group_after_close"] = meta.GetConsumerGroup(groupID).Coordinator()
	return out
}
