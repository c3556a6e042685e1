// Bad input through go-liftbridge (what the client makes of riverlog's refusals) and through
// Liftbridge's own generated API stub (liftbridge-api, the code go-liftbridge is built on;
// where go-liftbridge stops before asking the server, the raw answer is checked there):
// unknown streams and partitions, refused stream settings, messages too large, an expected
// offset that is not next, a subject nobody stores, and gRPC logins (Basic metadata, a TLS
// client certificate).
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"os"
	"strings"
	"time"

	lift "github.com/liftbridge-io/go-liftbridge/v2"
	api "github.com/liftbridge-io/liftbridge-api/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

func init() {
	scenarios["unknown"] = unknown
	scenarios["refused"] = refused
	scenarios["login"] = login
}

// raw: Liftbridge's generated API client on the first address (args.Grpc[0]).
func raw(args Args, options ...grpc.DialOption) (api.APIClient, func()) {
	if len(options) == 0 {
		options = []grpc.DialOption{grpc.WithInsecure()}
	}
	conn, err := grpc.Dial(args.Grpc[0], options...)
	must(err, "dial")
	return api.NewAPIClient(conn), func() { conn.Close() }
}

// subscribeStatus: the error a raw Subscribe ends with before or instead of its first
// (empty) message; nil when the subscription started.
func subscribeStatus(stub api.APIClient, ctx context.Context, req *api.SubscribeRequest) any {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	call, err := stub.Subscribe(ctx, req)
	if err == nil {
		_, err = call.Recv()
	}
	return errInfo(err)
}

// unknown: a stream that does not exist, a partition that does not exist.
func unknown(args Args) result {
	client := connect(args)
	defer client.Close()
	name := args.Stream // never created
	must(client.CreateStream(timeout(10), args.str("existing"), args.str("existing")), "create")
	out := result{}
	_, err := client.Publish(timeout(10), name, []byte("x"), lift.AckPolicyLeader())
	out["publish"] = errInfo(err)
	async := make(chan error, 1)
	must(client.PublishAsync(timeout(10), name, []byte("x"), func(_ *lift.Ack, err error) {
		async <- err
	}, lift.AckPolicyLeader()), "PublishAsync")
	out["publish_async"] = errInfo(<-async)
	_, err = client.Publish(timeout(10), args.str("existing"), []byte("x"), lift.ToPartition(9),
		lift.AckPolicyLeader())
	out["publish_partition"] = errInfo(err)
	out["delete"] = errInfo(client.DeleteStream(timeout(10), name))
	out["pause"] = errInfo(client.PauseStream(timeout(10), name))
	out["pause_partition"] = errInfo(client.PauseStream(timeout(10), args.str("existing"),
		lift.PausePartitions(9)))
	out["readonly"] = errInfo(client.SetStreamReadonly(timeout(10), name))
	out["subscribe"] = errInfo(client.Subscribe(timeout(10), name,
		func(*lift.Message, error) {}))
	_, err = client.FetchPartitionMetadata(timeout(10), name, 0)
	out["partition_metadata"] = errInfo(err)
	out["set_cursor"] = errInfo(client.SetCursor(timeout(10), "c", name, 0, 1))
	offset, err := client.FetchCursor(timeout(10), "c", name, 0)
	out["fetch_cursor"] = map[string]any{"offset": offset, "error": errInfo(err)}
	meta, err := client.FetchMetadata(timeout(10), lift.Streams([]string{name}))
	out["metadata"] = map[string]any{"error": errInfo(err), "listed": err == nil &&
		meta.GetStream(name) != nil}

	stub, done := raw(args)
	defer done()
	ctx := timeout(10)
	out["raw_subscribe"] = subscribeStatus(stub, ctx, &api.SubscribeRequest{Stream: name})
	out["raw_subscribe_partition"] = subscribeStatus(stub, ctx, &api.SubscribeRequest{
		Stream: args.str("existing"), Partition: 9})
	_, err = stub.FetchPartitionMetadata(ctx, &api.FetchPartitionMetadataRequest{Stream: name})
	out["raw_partition_metadata"] = errInfo(err)
	_, err = stub.Publish(ctx, &api.PublishRequest{Stream: name, Value: []byte("x"),
		AckPolicy: api.AckPolicy_LEADER})
	out["raw_publish"] = errInfo(err)
	resp, err := stub.FetchMetadata(ctx, &api.FetchMetadataRequest{Streams: []string{name}})
	must(err, "raw FetchMetadata")
	streamErrors := []string{}
	for _, s := range resp.StreamMetadata {
		streamErrors = append(streamErrors, s.Name+":"+s.Error.String())
	}
	out["raw_metadata"] = streamErrors
	return out
}

// refused: stream settings Liftbridge refuses, a message over the size limit (1 MiB) and over
// gRPC's (4 MiB), optimistic concurrency, a subject no stream stores.
func refused(args Args) result {
	client := connect(args)
	defer client.Close()
	s := args.Stream
	out := result{}
	out["empty_name"] = errInfo(client.CreateStream(timeout(10), "x", ""))
	out["reserved"] = errInfo(client.CreateStream(timeout(10), "x", "__cursors"))
	out["bad_subject"] = errInfo(client.CreateStream(timeout(10), "a..b", s+"-bad"))
	out["encryption"] = errInfo(client.CreateStream(timeout(10), s+"-enc", s+"-enc",
		lift.Encryption(true)))
	out["too_many_replicas"] = errInfo(client.CreateStream(timeout(10), s+"-rf", s+"-rf",
		lift.ReplicationFactor(5)))
	must(client.CreateStream(timeout(10), s, s), "create")
	big := []byte(strings.Repeat("x", 2<<20))
	_, err := client.Publish(timeout(10), s, big, lift.AckPolicyLeader())
	out["too_large"] = errInfo(err)
	async := make(chan error, 1)
	must(client.PublishAsync(timeout(10), s, big, func(_ *lift.Ack, err error) {
		async <- err
	}, lift.AckPolicyLeader()), "PublishAsync")
	select {
	case err := <-async:
		out["too_large_async"] = errInfo(err)
	case <-time.After(15 * time.Second):
		out["too_large_async"] = "no answer"
	}
	huge := []byte(strings.Repeat("y", 5<<20))
	stub, done := raw(args)
	defer done()
	_, err = stub.Publish(timeout(20), &api.PublishRequest{Stream: s, Value: huge,
		AckPolicy: api.AckPolicy_LEADER})
	out["over_grpc_limit"] = errInfo(err)
	// the stream still works, and none of the refused messages took an offset
	ack, err := client.Publish(timeout(10), s, []byte("small"), lift.AckPolicyLeader())
	must(err, "publish after the refusals")
	out["next_offset"] = ack.Offset()

	must(client.CreateStream(timeout(10), s+"-occ", s+"-occ",
		lift.OptimisticConcurrencyControl(true)), "create occ")
	ack, err = client.Publish(timeout(10), s+"-occ", []byte("first"), lift.ExpectedOffset(0),
		lift.AckPolicyLeader())
	out["occ_first"] = map[string]any{"ack": ackInfo(ack), "error": errInfo(err)}
	_, err = client.Publish(timeout(10), s+"-occ", []byte("wrong"), lift.ExpectedOffset(5),
		lift.AckPolicyLeader())
	out["occ_wrong"] = errInfo(err)
	_, err = stub.Publish(timeout(10), &api.PublishRequest{Stream: s + "-occ",
		Value: []byte("none"), AckPolicy: api.AckPolicy_NONE, ExpectedOffset: -1})
	out["occ_none"] = errInfo(err)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = client.PublishToSubject(ctx, "nobody.listens", []byte("x"), lift.AckPolicyLeader())
	out["no_stream_on_subject"] = errInfo(err)
	return out
}

// login: go-liftbridge with a TLS client certificate (args "ca", "cert", "key"; it has no
// other login) creating, publishing to and subscribing to args.Stream; the raw stub with
// Basic credentials (args "user", "password") and without any.
func login(args Args) result {
	out := result{}
	if args.str("cert") != "" {
		pool := x509.NewCertPool()
		ca, err := os.ReadFile(args.str("ca"))
		must(err, "read ca")
		pool.AppendCertsFromPEM(ca)
		pair, err := tls.LoadX509KeyPair(args.str("cert"), args.str("key"))
		must(err, "load client certificate")
		config := &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair},
			ServerName: "localhost"}
		client, err := lift.Connect(args.Grpc, lift.TLSConfig(config))
		out["connect"] = errInfo(err)
		if err != nil {
			return out
		}
		defer client.Close()
		out["create"] = errInfo(client.CreateStream(timeout(10), args.Stream, args.Stream))
		ack, err := client.Publish(timeout(10), args.Stream, []byte("x"), lift.AckPolicyLeader())
		out["publish"] = map[string]any{"ack": ackInfo(ack), "error": errInfo(err)}
		out["subscribe"] = errInfo(client.Subscribe(timeout(10), args.Stream,
			func(*lift.Message, error) {}, lift.StartAtEarliestReceived()))
		out["pause"] = errInfo(client.PauseStream(timeout(10), args.Stream))
		return out
	}
	stub, done := raw(args)
	defer done()
	ctx := timeout(10)
	if user := args.str("user"); user != "" {
		token := base64.StdEncoding.EncodeToString([]byte(user + ":" + args.str("password")))
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Basic "+token)
	}
	_, err := stub.FetchMetadata(ctx, &api.FetchMetadataRequest{})
	out["metadata"] = errInfo(err)
	_, err = stub.Publish(ctx, &api.PublishRequest{Stream: args.Stream, Value: []byte("x"),
		AckPolicy: api.AckPolicy_LEADER})
	out["publish"] = errInfo(err)
	out["subscribe"] = subscribeStatus(stub, ctx, &api.SubscribeRequest{Stream: args.Stream})
	return out
}
