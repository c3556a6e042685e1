// Scenarios on streams as a whole: CreateStream with every StreamOption, DeleteStream,
// PauseStream (resume-all, resume on publish, Resume on subscribe), SetStreamReadonly,
// FetchMetadata and FetchPartitionMetadata.
package main

import (
	"time"

	lift "github.com/liftbridge-io/go-liftbridge/v2"
)

func init() {
	scenarios["create_stream"] = createStream
	scenarios["delete_stream"] = deleteStream
	scenarios["pause"] = pause
	scenarios["readonly"] = readonly
}

// createStream: CreateStream with every option go-liftbridge has, again (exists), and the
// metadata of the new stream as the client sees it.
func createStream(args Args) result {
	client := connect(args)
	defer client.Close()
	options := []lift.StreamOption{
		lift.Partitions(3), lift.Group("workers"), lift.ReplicationFactor(1),
		lift.RetentionMaxBytes(1 << 30), lift.RetentionMaxMessages(100000),
		lift.RetentionMaxAge(48 * time.Hour), lift.CleanerInterval(2 * time.Minute),
		lift.SegmentMaxBytes(1 << 20), lift.SegmentMaxAge(24 * time.Hour),
		lift.CompactMaxGoroutines(3), lift.CompactEnabled(true),
		lift.AutoPauseTime(time.Hour), lift.AutoPauseDisableIfSubscribers(true),
		lift.MinISR(1), lift.OptimisticConcurrencyControl(false),
	}
	out := result{}
	out["create"] = errInfo(client.CreateStream(timeout(10), args.str("subject"), args.Stream,
		options...))
	out["again"] = errInfo(client.CreateStream(timeout(10), args.str("subject"), args.Stream))
	meta, err := client.FetchMetadata(timeout(10), lift.Streams([]string{args.Stream}))
	must(err, "FetchMetadata")
	brokers := []map[string]any{}
	for _, b := range meta.Brokers() {
		brokers = append(brokers, map[string]any{"id": b.ID(), "addr": b.Addr(),
			"partitions": b.PartitionCount(), "leaders": b.LeaderCount()})
	}
	out["brokers"] = brokers
	stream := meta.GetStream(args.Stream)
	partitions := map[int32]any{}
	for id, p := range stream.Partitions() {
		partitions[id] = partitionInfo(p)
	}
	out["stream"] = map[string]any{"name": stream.Name(), "subject": stream.Subject(),
		"partitions": partitions, "created_ns": stream.CreationTime().UnixNano()}
	part, err := client.FetchPartitionMetadata(timeout(10), args.Stream, 2)
	must(err, "FetchPartitionMetadata")
	out["partition2"] = partitionInfo(part)
	return out
}

// deleteStream: DeleteStream twice (the second: ErrNoSuchStream), then what FetchMetadata
// and a publish say about the stream.
func deleteStream(args Args) result {
	client := connect(args)
	defer client.Close()
	ctx := timeout(10)
	subscription := make(chan error, 1)
	err := client.Subscribe(ctx, args.Stream, func(m *lift.Message, err error) {
		if err != nil {
			subscription <- err
		}
	}, lift.StartAtEarliestReceived())
	must(err, "subscribe")
	out := result{"delete": errInfo(client.DeleteStream(timeout(10), args.Stream))}
	select {
	case err := <-subscription:
		out["subscriber"] = errInfo(err)
	case <-time.After(5 * time.Second):
		out["subscriber"] = "still running"
	}
	out["again"] = errInfo(client.DeleteStream(timeout(10), args.Stream))
	meta, err := client.FetchMetadata(timeout(10))
	must(err, "FetchMetadata")
	out["listed"] = meta.GetStream(args.Stream) != nil
	_, err = client.Publish(timeout(5), args.Stream, []byte("gone"), lift.AckPolicyLeader())
	out["publish"] = errInfo(err)
	return out
}

func flags(client lift.Client, stream string, partitions int32) []map[string]any {
	out := []map[string]any{}
	for p := int32(0); p < partitions; p++ {
		info, err := client.FetchPartitionMetadata(timeout(10), stream, p)
		must(err, "FetchPartitionMetadata")
		out = append(out, map[string]any{"paused": info.Paused(),
			"pause_first_ns": info.PauseTimestamps().FirstTime().UnixNano()})
	}
	return out
}

// pause: a stream of 2 partitions, paused with ResumeAll and resumed by a publish to one
// partition; paused again without it (one partition resumes); a subscriber ended by a pause;
// Subscribe on a paused partition with and without Resume.
func pause(args Args) result {
	client := connect(args)
	defer client.Close()
	create(client, args, lift.Partitions(2))
	out := result{}
	// a subscriber on partition 0 when it is paused
	ended := make(chan error, 1)
	must(client.Subscribe(timeout(30), args.Stream, func(m *lift.Message, err error) {
		if err != nil {
			ended <- err
		}
	}, lift.StartAtEarliestReceived()), "subscribe")
	out["pause_all"] = errInfo(client.PauseStream(timeout(10), args.Stream, lift.ResumeAll()))
	select {
	case err := <-ended:
		out["subscriber"] = errInfo(err)
	case <-time.After(5 * time.Second):
		out["subscriber"] = "still running"
	}
	out["after_pause_all"] = flags(client, args.Stream, 2)
	paused := collect(client, args.Stream, 1, 3*time.Second, lift.Partition(1),
		lift.StartAtEarliestReceived())
	out["subscribe_paused"] = paused.info()
	ack, err := client.Publish(timeout(10), args.Stream, []byte("wakes-all"),
		lift.ToPartition(1), lift.AckPolicyLeader())
	must(err, "publish to a paused partition")
	out["resume_ack_offset"] = ack.Offset()
	out["after_publish_resume_all"] = flags(client, args.Stream, 2)

	out["pause_0"] = errInfo(client.PauseStream(timeout(10), args.Stream, lift.PausePartitions(0)))
	out["pause_1"] = errInfo(client.PauseStream(timeout(10), args.Stream, lift.PausePartitions(1)))
	_, err = client.Publish(timeout(10), args.Stream, []byte("wakes-1"), lift.ToPartition(1),
		lift.AckPolicyLeader())
	must(err, "publish to partition 1")
	out["after_publish_1"] = flags(client, args.Stream, 2)
	resumed := collect(client, args.Stream, 1, time.Second, lift.Partition(0),
		lift.StartAtEarliestReceived(), lift.Resume())
	out["subscribe_resume"] = resumed.info()
	out["after_subscribe_resume"] = flags(client, args.Stream, 2)
	return out
}

// readonly: SetStreamReadonly ends a subscriber at the end of the partition and refuses
// Publish and PublishAsync; Readonly(false) lifts it.
func readonly(args Args) result {
	client := connect(args)
	defer client.Close()
	create(client, args)
	publishAll(client, args.Stream, values("r", 3))
	out := result{}
	live := make(chan error, 1)
	count := 0
	must(client.Subscribe(timeout(30), args.Stream, func(m *lift.Message, err error) {
		if err != nil {
			live <- err
			return
		}
		count++
	}, lift.StartAtEarliestReceived()), "subscribe")
	out["set"] = errInfo(client.SetStreamReadonly(timeout(10), args.Stream))
	select {
	case err := <-live:
		out["subscriber"] = map[string]any{"end": errInfo(err), "received": count}
	case <-time.After(5 * time.Second):
		out["subscriber"] = "still running"
	}
	_, err := client.Publish(timeout(10), args.Stream, []byte("no"), lift.AckPolicyLeader())
	out["publish"] = errInfo(err)
	async := make(chan error, 1)
	must(client.PublishAsync(timeout(10), args.Stream, []byte("no"), func(a *lift.Ack, err error) {
		async <- err
	}, lift.AckPolicyLeader()), "PublishAsync")
	out["publish_async"] = errInfo(<-async)
	out["new_subscriber"] = collect(client, args.Stream, 4, 5*time.Second,
		lift.StartAtEarliestReceived()).info()
	out["unset"] = errInfo(client.SetStreamReadonly(timeout(10), args.Stream, lift.Readonly(false)))
	ack, err := client.Publish(timeout(10), args.Stream, []byte("yes"), lift.AckPolicyLeader())
	out["publish_after"] = map[string]any{"error": errInfo(err), "ack": ackInfo(ack)}
	return out
}
