// The RabbitMQ Stream Go client (github.com/rabbitmq/rabbitmq-stream-go-client, pinned in
// go.mod) driven by the compat tests (tests/compat/_go.py). Usage:
//
//	riverlog-go-compat SCENARIO 'JSON'
//
// JSON holds host, port, username, password (or uris: a list of rabbitmq-stream:// URIs),
// optional tls_ca (a PEM file: then the connection is TLS; tls_cert and tls_key: a client
// certificate), sasl (PLAIN or EXTERNAL), heartbeat_s, max_frame_size, debug (the client's debug log, where
// it reports a Close from the server), and the scenario's own fields. The program prints exactly one JSON object, its last line on
// stdout, and exits 0; an unexpected failure exits 1 with the reason on stderr. Scenarios
// that wait for the test (reliable_*) print {"phase": ...} lines first and read one line on
// stdin to go on. Errors the client returns are reported as the protocol's response code
// (codeOf), so the tests compare codes, not the client's wording.
package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/logs"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

// Args is the JSON argument of a scenario.
type Args map[string]any

func (a Args) str(key, fallback string) string {
	if v, ok := a[key].(string); ok {
		return v
	}
	return fallback
}

func (a Args) num(key string, fallback int) int {
	if v, ok := a[key].(float64); ok {
		return int(v)
	}
	return fallback
}

func (a Args) strs(key string) []string {
	var out []string
	if list, ok := a[key].([]any); ok {
		for _, v := range list {
			out = append(out, fmt.Sprint(v))
		}
	}
	return out
}

// Result is what a scenario prints.
type Result map[string]any

var scenarios = map[string]func(Args) (Result, error){}

func register(name string, run func(Args) (Result, error)) { scenarios[name] = run }

// the client's error values and the response codes they stand for (constants.go lookErrorCode)
var codes = []struct {
	err  error
	code int
}{
	{stream.StreamDoesNotExist, 0x02}, {stream.StreamAlreadyExists, 0x05},
	{stream.StreamNotAvailable, 0x06}, {stream.AuthenticationFailure, 0x08},
	{stream.AuthenticationFailureLoopbackError, 0x0b}, {stream.VirtualHostAccessFailure, 0x0c},
	{stream.UnknownFrame, 0x0d}, {stream.FrameTooLarge, 0x0e}, {stream.InternalError, 0x0f},
	{stream.CodeAccessRefused, 0x10}, {stream.PreconditionFailed, 0x11},
	{stream.PublisherDoesNotExist, 0x12}, {stream.OffsetNotFoundError, 0x13},
}

// codeOf maps an error of the client to its response code: 1 for nil, -1 for an error
// that stands for no response code (a client-side check, a timeout).
func codeOf(err error) int {
	if err == nil {
		return 1
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return -1
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// capture keeps every line the client logs (and copies it to stderr): the client reports a
// Close from the server only in its log (server_frame.go closeFrameHandler).
type capture struct {
	mu    sync.Mutex
	lines []string
}

func (c *capture) add(level, message string, v ...any) {
	line := fmt.Sprintf("[%s] %s", level, fmt.Sprintf(message, v...))
	c.mu.Lock()
	c.lines = append(c.lines, line)
	c.mu.Unlock()
	fmt.Fprintln(os.Stderr, line)
}
func (c *capture) Info(m string, v ...any)  { c.add("info", m, v...) }
func (c *capture) Error(m string, v ...any) { c.add("error", m, v...) }
func (c *capture) Warn(m string, v ...any)  { c.add("warn", m, v...) }
func (c *capture) Debug(m string, v ...any) {
	if logs.LogLevel > logs.INFO {
		c.add("debug", m, v...)
	}
}

func (c *capture) matching(part string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, l := range c.lines {
		if strings.Contains(l, part) {
			out = append(out, l)
		}
	}
	return out
}

var logged = &capture{}

// options builds EnvironmentOptions from the common fields.
func options(a Args) (*stream.EnvironmentOptions, error) {
	o := stream.NewEnvironmentOptions()
	if uris := a.strs("uris"); len(uris) > 0 {
		o.SetUris(uris)
	} else {
		o.SetHost(a.str("host", "127.0.0.1")).SetPort(a.num("port", 5552)).
			SetUser(a.str("username", "guest")).SetPassword(a.str("password", "guest")).
			SetVHost(a.str("vhost", "/"))
	}
	if hb := a.num("heartbeat_s", 0); hb > 0 {
		o.SetRequestedHeartbeat(time.Duration(hb) * time.Second)
	}
	if fm := a.num("max_frame_size", 0); fm > 0 {
		o.SetRequestedMaxFrameSize(fm)
	}
	if ca := a.str("tls_ca", ""); ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificate in %s", ca)
		}
		config := &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
		if cert := a.str("tls_cert", ""); cert != "" {
			pair, err := tls.LoadX509KeyPair(cert, a.str("tls_key", ""))
			if err != nil {
				return nil, err
			}
			config.Certificates = []tls.Certificate{pair}
		}
		o.IsTLS(true).SetTLSConfig(config)
	}
	if mechanism := a.str("sasl", ""); mechanism != "" {
		o.SetSaslConfiguration(mechanism)
	}
	return o, nil
}

func environment(a Args) (*stream.Environment, error) {
	o, err := options(a)
	if err != nil {
		return nil, err
	}
	return stream.NewEnvironment(o)
}

// withStream: an Environment and the stream `stream`, declared (an existing one is fine).
func withStream(a Args) (*stream.Environment, string, error) {
	env, err := environment(a)
	if err != nil {
		return nil, "", err
	}
	name := a.str("stream", "")
	if err := env.DeclareStream(name, nil); err != nil {
		_ = env.Close()
		return nil, "", err
	}
	return env, name, nil
}

// until polls cond every 10 ms for at most timeout; it returns cond's last answer.
func until(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// stdinLine blocks until the test writes a line on stdin.
var stdin = bufio.NewReader(os.Stdin)

func phase(name string, fields Result) {
	out := Result{"phase": name}
	for k, v := range fields {
		out[k] = v
	}
	line, _ := json.Marshal(out)
	fmt.Println(string(line))
	_, _ = stdin.ReadString('\n')
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: riverlog-go-compat SCENARIO JSON")
		os.Exit(2)
	}
	run, ok := scenarios[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown scenario %q\n", os.Args[1])
		os.Exit(2)
	}
	var a Args
	if err := json.Unmarshal([]byte(os.Args[2]), &a); err != nil {
		fmt.Fprintf(os.Stderr, "bad JSON argument: %v\n", err)
		os.Exit(2)
	}
	logs.SetLogger(logged)
	if a["debug"] == true {
		logs.LogLevel = logs.DEBUG
	}
	result, err := run(a)
	if err != nil {
		fmt.Fprintf(os.Stderr, "scenario %s failed: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	line, err := json.Marshal(result)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cannot encode the result: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(string(line))
}
