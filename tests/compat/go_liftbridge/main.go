// Liftbridge's own Go client (go-liftbridge v2.3.0) and nats.go against riverlog's Liftbridge
// doors, driven by tests/compat/_go.py. One program, one scenario per run:
//
//	go_liftbridge SCENARIO 'JSON ARGUMENT'
//
// The argument names the doors ({"grpc": ["host:port", ...], "nats": "nats://..."}) and the
// scenario's own fields; the program prints exactly one JSON object on its last stdout line:
// what the client saw (acks, messages, errors as {"error", "code", "is"}), for the test to
// judge. It exits non-zero only when the scenario itself cannot go on (a call that must work
// failed, a wait ran out): the test then fails with what it wrote on stderr. It never decides
// what riverlog should answer; the tests do.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	lift "github.com/liftbridge-io/go-liftbridge/v2"
	api "github.com/liftbridge-io/liftbridge-api/go"
	"google.golang.org/grpc/status"
)

// Args is the JSON argument; Extra holds every field for the scenario's own use.
type Args struct {
	Grpc   []string `json:"grpc"`
	Nats   string   `json:"nats"`
	Stream string   `json:"stream"`
	Extra  map[string]any
}

type result map[string]any

var scenarios = map[string]func(Args) result{}

func main() {
	if len(os.Args) != 3 {
		fail("usage: go_liftbridge SCENARIO JSON")
	}
	run, ok := scenarios[os.Args[1]]
	if !ok {
		fail("unknown scenario %q", os.Args[1])
	}
	var args Args
	if err := json.Unmarshal([]byte(os.Args[2]), &args); err != nil {
		fail("bad argument: %v", err)
	}
	if err := json.Unmarshal([]byte(os.Args[2]), &args.Extra); err != nil {
		fail("bad argument: %v", err)
	}
	out, err := json.Marshal(run(args))
	if err != nil {
		fail("cannot encode the result: %v", err)
	}
	fmt.Println(string(out))
}

// fail ends the run: the scenario could not go on.
func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", a...)
	os.Exit(1)
}

// must fails the run on an error a scenario cannot go on without.
func must(err error, what string) {
	if err != nil {
		fail("%s: %v", what, err)
	}
}

func (a Args) str(key string) string {
	s, _ := a.Extra[key].(string)
	return s
}

func (a Args) num(key string, otherwise int) int {
	if f, ok := a.Extra[key].(float64); ok {
		return int(f)
	}
	return otherwise
}

// connect: a go-liftbridge client of every address in args.Grpc, plus client options.
// (Connect, not ConnectCtx with a deadline: go-liftbridge opens each broker's long-lived
// PublishAsync stream with the context it connects with, so a cancelled one ends them.)
func connect(args Args, options ...lift.ClientOption) lift.Client {
	client, err := lift.Connect(args.Grpc, options...)
	must(err, "connect")
	return client
}

var (
	cancelsMu sync.Mutex
	cancels   []context.CancelFunc // of timeout's contexts: the program is short-lived
)

// timeout: a context that ends after `seconds`.
func timeout(seconds int) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(seconds)*time.Second)
	cancelsMu.Lock()
	cancels = append(cancels, cancel)
	cancelsMu.Unlock()
	return ctx
}

// sentinels are go-liftbridge's own errors, reported by name in "is".
var sentinels = map[string]error{
	"ErrStreamExists": lift.ErrStreamExists, "ErrNoSuchStream": lift.ErrNoSuchStream,
	"ErrNoSuchPartition": lift.ErrNoSuchPartition, "ErrStreamDeleted": lift.ErrStreamDeleted,
	"ErrPartitionPaused": lift.ErrPartitionPaused, "ErrAckTimeout": lift.ErrAckTimeout,
	"ErrReadonlyPartition": lift.ErrReadonlyPartition,
}

// errInfo: nil for no error, else {"error": text, "code": gRPC code name, "is": sentinel}.
func errInfo(err error) any {
	if err == nil {
		return nil
	}
	info := map[string]any{"error": err.Error(), "code": status.Code(err).String()}
	for name, sentinel := range sentinels {
		if errors.Is(err, sentinel) {
			info["is"] = name
		}
	}
	return info
}

func ackInfo(ack *lift.Ack) any {
	if ack == nil {
		return nil
	}
	return map[string]any{
		"stream": ack.Stream(), "partition_subject": ack.PartitionSubject(),
		"msg_subject": ack.MessageSubject(), "offset": ack.Offset(),
		"ack_inbox": ack.AckInbox(), "correlation_id": ack.CorrelationID(),
		"ack_policy":   int(ack.AckPolicy()),
		"reception_ns": ack.ReceptionTimestamp().UnixNano(),
		"commit_ns":    ack.CommitTimestamp().UnixNano(),
	}
}

func messageInfo(m *lift.Message) map[string]any {
	headers := map[string]string{}
	for k, v := range m.Headers() {
		headers[k] = string(v)
	}
	var key any
	if m.Key() != nil {
		key = string(m.Key())
	}
	return map[string]any{
		"offset": m.Offset(), "key": key, "value": string(m.Value()),
		"partition": m.Partition(), "stream": m.Stream(), "subject": m.Subject(),
		"reply": m.ReplySubject(), "headers": headers, "timestamp_ns": m.Timestamp().UnixNano(),
	}
}

func partitionInfo(p *lift.PartitionInfo) map[string]any {
	ids := func(brokers []*lift.BrokerInfo) []string {
		out := []string{}
		for _, b := range brokers {
			if b != nil {
				out = append(out, b.ID())
			}
		}
		sort.Strings(out)
		return out
	}
	leader := ""
	if p.Leader() != nil {
		leader = p.Leader().ID()
	}
	return map[string]any{
		"id": p.ID(), "leader": leader, "replicas": ids(p.Replicas()), "isr": ids(p.ISR()),
		"high_watermark": p.HighWatermark(), "newest_offset": p.NewestOffset(),
		"paused": p.Paused(), "readonly": p.Readonly(),
	}
}

// Received is what one subscription got: messages, and the error that ended it (if any).
type Received struct {
	Messages []map[string]any
	End      error
	Ended    bool
}

// Subscription is a running go-liftbridge subscription whose handler feeds channels.
type Subscription struct {
	msgs   chan *lift.Message
	ends   chan error
	err    error // from Subscribe itself
	cancel context.CancelFunc
}

// subscribe: Subscribe with opts; it returns once the server has started the subscription
// (go-liftbridge waits for its first, empty message) or refused it.
func subscribe(client lift.Client, stream string, opts ...lift.SubscriptionOption) *Subscription {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Subscription{msgs: make(chan *lift.Message, 4096), ends: make(chan error, 1),
		cancel: cancel}
	s.err = client.Subscribe(ctx, stream, func(m *lift.Message, err error) {
		if err != nil {
			select {
			case s.ends <- err:
			default:
			}
			return
		}
		s.msgs <- m
	}, opts...)
	return s
}

// wait until the subscription has `count` messages, ends with an error, or `wait` passes;
// then cancel it. An error from Subscribe itself is the End.
func (s *Subscription) wait(count int, wait time.Duration) Received {
	defer s.cancel()
	got := Received{Messages: []map[string]any{}}
	if s.err != nil {
		got.End, got.Ended = s.err, true
		return got
	}
	deadline := time.After(wait)
	for len(got.Messages) < count {
		select {
		case m := <-s.msgs:
			got.Messages = append(got.Messages, messageInfo(m))
		case err := <-s.ends:
			for len(s.msgs) > 0 { // what arrived before the end
				got.Messages = append(got.Messages, messageInfo(<-s.msgs))
			}
			got.End, got.Ended = err, true
			return got
		case <-deadline:
			return got
		}
	}
	return got
}

// collect: subscribe, then wait.
func collect(client lift.Client, stream string, count int, wait time.Duration,
	opts ...lift.SubscriptionOption) Received {
	return subscribe(client, stream, opts...).wait(count, wait)
}

func (r Received) info() map[string]any {
	offsets := []int64{}
	values := []string{}
	for _, m := range r.Messages {
		offsets = append(offsets, m["offset"].(int64))
		values = append(values, m["value"].(string))
	}
	return map[string]any{"offsets": offsets, "values": values, "end": errInfo(r.End),
		"ended": r.Ended}
}

// create makes stream args.Stream (subject: its name) and waits until every server of
// args.Grpc lists it: in a cluster a server applies the stream a little after the one asked
// (Liftbridge's too), and until then refuses publishes to it (NotFound), which go-liftbridge
// sends to whichever server its hash ring picks.
func create(client lift.Client, args Args, options ...lift.StreamOption) {
	must(client.CreateStream(timeout(20), args.Stream, args.Stream, options...), "create")
	for _, address := range args.Grpc {
		stub, done := raw(Args{Grpc: []string{address}})
		for try := 0; ; try++ {
			resp, err := stub.FetchMetadata(timeout(10), &api.FetchMetadataRequest{
				Streams: []string{args.Stream}})
			if err == nil && len(resp.StreamMetadata) == 1 &&
				resp.StreamMetadata[0].Error == api.StreamMetadata_OK {
				break
			}
			if try == 200 {
				fail("%s does not list %s: %v", address, args.Stream, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		done()
	}
}

// publishAll publishes values with ALL acks and fails the run on any error.
func publishAll(client lift.Client, stream string, values []string, opts ...lift.MessageOption) []int64 {
	offsets := []int64{}
	for _, v := range values {
		ack, err := client.Publish(timeout(10), stream, []byte(v),
			append([]lift.MessageOption{lift.AckPolicyAll()}, opts...)...)
		must(err, "publish "+v)
		offsets = append(offsets, ack.Offset())
	}
	return offsets
}

func values(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}
