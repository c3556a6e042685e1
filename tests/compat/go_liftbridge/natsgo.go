// Scenarios with nats.go on the NATS door: plain NATS messages (with and without a reply
// subject) made durable, messages framed with go-liftbridge's envelope helpers (NewMessage)
// acked on their ack inbox (UnmarshalAck), and what go-liftbridge reads back. Also what a plain
// NATS subscriber of the subject sees of PublishToSubject (UnmarshalMessage).
package main

import (
	"time"

	lift "github.com/liftbridge-io/go-liftbridge/v2"
	"github.com/nats-io/nats.go"
)

func init() {
	scenarios["nats"] = natsDoor
	scenarios["nats_login"] = natsLogin
}

func natsConnect(args Args, options ...nats.Option) *nats.Conn {
	nc, err := nats.Connect(args.Nats, append([]nats.Option{nats.Timeout(10 * time.Second)},
		options...)...)
	must(err, "nats connect")
	return nc
}

// nextAck: the Ack on inbox (decoded with go-liftbridge's UnmarshalAck), or nil after wait.
func nextAck(sub *nats.Subscription, wait time.Duration) any {
	msg, err := sub.NextMsg(wait)
	if err == nats.ErrTimeout {
		return nil
	}
	must(err, "ack inbox")
	ack, err := lift.UnmarshalAck(msg.Data)
	if err != nil {
		return map[string]any{"undecodable": err.Error()}
	}
	return ackInfo(ack)
}

func natsDoor(args Args) result {
	client := connect(args)
	defer client.Close()
	create(client, args, lift.Partitions(2))
	nc := natsConnect(args)
	defer nc.Close()
	out := result{}
	must(nc.Publish(args.Stream, []byte("plain")), "publish plain")
	must(nc.PublishRequest(args.Stream+".1", "reply.here", []byte("plain-reply")),
		"publish plain with a reply subject")

	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	must(err, "subscribe inbox")
	policies := map[string]lift.MessageOption{"leader": lift.AckPolicyLeader(),
		"all": lift.AckPolicyAll(), "none": lift.AckPolicyNone()}
	acks := map[string]any{}
	for _, name := range []string{"leader", "all", "none"} {
		data := lift.NewMessage([]byte("env-"+name), lift.Key([]byte("k-"+name)),
			lift.AckInbox(inbox), lift.CorrelationID("n-"+name), policies[name],
			lift.Header("h", []byte(name)))
		must(nc.Publish(args.Stream, data), "publish enveloped")
		wait := 5 * time.Second
		if name == "none" {
			wait = 500 * time.Millisecond
		}
		acks[name] = nextAck(sub, wait)
	}
	out["acks"] = acks
	// an enveloped message without an ack inbox: stored, acked nowhere
	must(nc.Publish(args.Stream, lift.NewMessage([]byte("env-no-inbox"),
		lift.AckPolicyLeader())), "publish enveloped without inbox")

	// PublishToSubject as a plain NATS subscriber of the subject sees it
	watch, err := nc.SubscribeSync(args.Stream + ".1")
	must(err, "subscribe subject")
	must(nc.Flush(), "flush")
	_, err = client.PublishToSubject(timeout(10), args.Stream+".1", []byte("via-grpc"),
		lift.Key([]byte("kg")), lift.AckPolicyLeader(), lift.CorrelationID("g1"))
	must(err, "PublishToSubject")
	seen, err := watch.NextMsg(5 * time.Second)
	must(err, "the subject's NATS message")
	if msg, err := lift.UnmarshalMessage(seen.Data); err != nil {
		out["seen_on_subject"] = map[string]any{"undecodable": err.Error()}
	} else {
		out["seen_on_subject"] = map[string]any{"value": string(msg.Value()),
			"key": string(msg.Key())}
	}
	must(nc.Flush(), "flush")

	read := map[string]any{}
	read["0"] = collect(client, args.Stream, 5, 10*time.Second, lift.StartAtEarliestReceived(),
		lift.Partition(0)).Messages
	read["1"] = collect(client, args.Stream, 2, 10*time.Second, lift.StartAtEarliestReceived(),
		lift.Partition(1)).Messages
	out["read"] = read
	return out
}

// natsLogin: nats.go logging in with args "user"/"password" (none when empty); with "subject",
// publishes a plain message there and reports the asynchronous error nats-server sends.
func natsLogin(args Args) result {
	options := []nats.Option{nats.NoReconnect(), nats.Timeout(5 * time.Second)}
	if user := args.str("user"); user != "" {
		options = append(options, nats.UserInfo(user, args.str("password")))
	}
	asyncErrs := make(chan error, 4)
	options = append(options, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription,
		err error) {
		asyncErrs <- err
	}))
	nc, err := nats.Connect(args.Nats, options...)
	if err != nil {
		return result{"connect": errInfo(err)}
	}
	defer nc.Close()
	out := result{"connect": nil}
	if subject := args.str("subject"); subject != "" {
		must(nc.Publish(subject, []byte("plain")), "publish")
		must(nc.Flush(), "flush")
		select {
		case err := <-asyncErrs:
			out["publish"] = errInfo(err)
		case <-time.After(2 * time.Second):
			out["publish"] = nil
		}
	}
	return out
}
