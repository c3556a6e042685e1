// The failover scenario on a 3-server cluster: a replicated stream, a go-liftbridge
// subscriber from the earliest offset and a publisher with ALL acks, then a SIGKILL of the
// partition's leader (args "pids": server id -> pid). go-liftbridge's own resubscribe (on
// Unavailable, from the last offset + 1) and a publisher that publishes anew after an error
// carry on at the new leader; the test checks that every acked message was received and is
// stored once.
//
// go-liftbridge v2.3.0 sends every Publish of a partition on the PublishAsync stream of one
// broker picked by a hash ring of the broker addresses (not the leader: any Liftbridge server
// takes a publish and hands it to the leader through NATS), and never replaces that stream
// once its broker is gone for good (its reconnect gives up after 5 tries; later Publish calls
// fail with EOF). So the stream is named such that the ring picks a server that survives;
// the killed one is the leader, which serves the subscription.
package main

import (
	"fmt"
	"sort"
	"sync"
	"syscall"
	"time"

	lift "github.com/liftbridge-io/go-liftbridge/v2"
	api "github.com/liftbridge-io/liftbridge-api/go"
	"github.com/serialx/hashring"
)

func init() {
	scenarios["failover"] = failover
	scenarios["not_leader"] = notLeader
}

// ringNode: the address go-liftbridge publishes partition 0 of stream to, for these known
// addresses (its metadata's plus the bootstrap ones, duplicates included, as brokers.Update).
func ringNode(stream string, addrs []string) string {
	node, _ := hashring.New(addrs).GetNode(fmt.Sprintf("%s:%d", stream, 0))
	return node
}

func leaderOf(client lift.Client, stream string) *lift.BrokerInfo {
	for i := 0; i < 100; i++ {
		meta, err := client.FetchMetadata(timeout(10), lift.Streams([]string{stream}))
		if err == nil && meta.GetStream(stream) != nil {
			if p := meta.GetStream(stream).GetPartition(0); p != nil && p.Leader() != nil {
				return p.Leader()
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	fail("no leader for %s", stream)
	return nil
}

// pickStream creates replicated streams named <stream>-N until go-liftbridge's publish
// broker for one is not its leader, with or without the leader among the addresses.
func pickStream(client lift.Client, args Args) (string, *lift.BrokerInfo) {
	for n := 0; n < 8; n++ {
		name := fmt.Sprintf("%s-%d", args.Stream, n)
		must(client.CreateStream(timeout(20), name, name, lift.ReplicationFactor(3),
			lift.MinISR(2)), "create "+name)
		leader := leaderOf(client, name)
		survivors := []string{}
		for _, a := range args.Grpc {
			if a != leader.Addr() {
				survivors = append(survivors, a)
			}
		}
		all := append(append([]string{}, args.Grpc...), args.Grpc...)
		after := append(append([]string{}, survivors...), args.Grpc...)
		if ringNode(name, all) != leader.Addr() && ringNode(name, after) != leader.Addr() {
			return name, leader
		}
	}
	fail("no stream name whose publish broker is a follower")
	return "", nil
}

func failover(args Args) result {
	client := connect(args, lift.ResubscribeWaitTime(60*time.Second))
	defer client.Close()
	stream, leader := pickStream(client, args)
	pids := args.Extra["pids"].(map[string]any)
	before, after := args.num("before", 100), args.num("after", 100)

	var mu sync.Mutex
	received := []map[string]any{}
	subErrors := []string{}
	must(client.Subscribe(timeout(600), stream, func(m *lift.Message, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			subErrors = append(subErrors, err.Error())
			return
		}
		received = append(received, map[string]any{"offset": m.Offset(),
			"value": string(m.Value())})
	}, lift.StartAtEarliestReceived()), "subscribe")

	acked := []string{}
	publishErrors := map[string]int{}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			value := fmt.Sprintf("g%d", i) // a retry is a new value: each is acked at most once
			_, err := client.Publish(timeout(10), stream, []byte(value), lift.AckPolicyAll())
			mu.Lock()
			if err != nil {
				publishErrors[err.Error()]++
			} else {
				acked = append(acked, value)
			}
			mu.Unlock()
			if err != nil {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	waitUntil := func(what string, n int, seconds int) {
		deadline := time.Now().Add(time.Duration(seconds) * time.Second)
		for count() < n {
			if time.Now().After(deadline) {
				close(stop)
				fail("%s: %d acks after %ds, not %d; errors %v", what, count(), seconds, n,
					publishErrors)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitUntil("before the kill", before, 60)
	pid := int(pids[leader.ID()].(float64))
	must(syscall.Kill(pid, syscall.SIGKILL), "kill the leader")
	killedAt := count()
	waitUntil("after the kill", killedAt+after, 90)
	close(stop)
	<-done

	mu.Lock()
	wanted := map[string]bool{}
	for _, v := range acked {
		wanted[v] = true
	}
	mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		missing := 0
		seen := map[string]bool{}
		for _, m := range received {
			seen[m["value"].(string)] = true
		}
		for v := range wanted {
			if !seen[v] {
				missing++
			}
		}
		mu.Unlock()
		if missing == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	newLeader := leaderOf(client, stream)
	for i := 0; newLeader.ID() == leader.ID() && i < 100; i++ {
		time.Sleep(100 * time.Millisecond)
		newLeader = leaderOf(client, stream)
	}
	mu.Lock()
	defer mu.Unlock()
	errorList := []string{}
	for e, n := range publishErrors {
		errorList = append(errorList, fmt.Sprintf("%dx %s", n, e))
	}
	sort.Strings(errorList)
	return result{"stream": stream, "killed": leader.ID(), "new_leader": newLeader.ID(),
		"acked": acked, "acked_before_kill": killedAt, "received": received,
		"publish_errors": errorList, "subscriber_errors": subErrors}
}

// notLeader: what each server of args.Grpc answers for partition 0 of args.Stream through
// Liftbridge's API stub (FetchPartitionMetadata, Subscribe with and without readISRReplica, a
// Publish with ALL acks and a 3 s deadline), and what go-liftbridge's Publish (ALL, 3 s) and
// Subscribe make of it.
func notLeader(args Args) result {
	out := result{}
	for _, address := range args.Grpc {
		stub, done := raw(Args{Grpc: []string{address}})
		ctx := timeout(10)
		_, err := stub.FetchPartitionMetadata(ctx, &api.FetchPartitionMetadataRequest{
			Stream: args.Stream})
		answers := map[string]any{"partition_metadata": errInfo(err)}
		answers["subscribe"] = subscribeStatus(stub, ctx, &api.SubscribeRequest{
			Stream: args.Stream, StartPosition: api.StartPosition_EARLIEST})
		answers["subscribe_isr"] = subscribeStatus(stub, ctx, &api.SubscribeRequest{
			Stream: args.Stream, StartPosition: api.StartPosition_EARLIEST, ReadISRReplica: true})
		_, err = stub.Publish(timeout(3), &api.PublishRequest{Stream: args.Stream,
			Value: []byte("to-" + address), AckPolicy: api.AckPolicy_ALL})
		answers["publish"] = errInfo(err)
		done()
		out[address] = answers
	}
	client := connect(args)
	defer client.Close()
	_, err := client.Publish(timeout(3), args.Stream, []byte("go"), lift.AckPolicyAll())
	out["go_publish"] = errInfo(err)
	out["go_subscribe"] = errInfo(client.Subscribe(timeout(10), args.Stream,
		func(*lift.Message, error) {}, lift.StartAtEarliestReceived()))
	return out
}
