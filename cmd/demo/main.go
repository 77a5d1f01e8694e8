// Command demo holds the small parts of the local demo and the container
// images: a trivial upstream API, a traffic generator (ordinary clients,
// one hot key, a few NAT-like IPs), a probe for container healthchecks
// (distroless images have no curl), and the open-loop load generator of
// make bench (load.go).
//
//	demo upstream -listen 127.0.0.1:8081
//	demo traffic -gateway http://127.0.0.1:8080 -duration 2m
//	demo probe http://127.0.0.1:9090/readyz
//	demo kafka -listen 127.0.0.1:19092   (franz-go's kfake, the embedded default)
//	demo topic -brokers 127.0.0.1:9092 -partitions 4 decisions
//	demo load -url http://127.0.0.1:8080/v1/check -body '{"ip":"{ip}"}' -rate 5000
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/internal/boot"
)

func main() {
	boot.Main("demo", func(ctx context.Context, args []string, _ func(string) string, stdout io.Writer) error {
		return run(ctx, args, stdout)
	})
}

// commands are demo's subcommands, in the order its usage lists them.
var commands = []struct {
	name string
	run  func(ctx context.Context, args []string, stdout io.Writer) error
}{
	{"upstream", upstream},
	{"traffic", traffic},
	{"probe", probe},
	{"kafka", embeddedKafka},
	{"keyhash", keyHash},
	{"topic", createTopics},
	{"load", load},
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		names := make([]string, len(commands))
		for i, c := range commands {
			names[i] = c.name
		}
		return fmt.Errorf("usage: demo %s [flags]", strings.Join(names, "|"))
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout)
		}
	}
	return fmt.Errorf("unknown subcommand %q", args[0])
}

// keyHash prints the SHA-256 a gateway config uses for each raw key.
func keyHash(_ context.Context, keys []string, stdout io.Writer) error {
	for _, k := range keys {
		sum := sha256.Sum256([]byte(k))
		fmt.Fprintln(stdout, hex.EncodeToString(sum[:]))
	}
	return nil
}

// upstream serves a trivial JSON API behind the gateway.
func upstream(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("upstream", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8081", "address to serve on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stdout, nil))
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"path": r.URL.Path, "method": r.Method, "served_by": "demo-upstream"})
	})
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Info("demo upstream listening", "addr", *listen)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// DemoKeys are the raw API keys of the demo configuration
// (deploy/demo/gateway.yaml holds only their SHA-256).
var demoKeys = []string{"demo-key-1", "demo-key-2", "demo-key-3", "demo-key-4", "demo-key-5", "demo-key-6", "demo-key-7", "demo-key-8"}

const demoHotKey = "demo-key-hot"

// The demo traffic's make-up: percent of all requests for the hot key, the
// ordinary keyed clients and the NAT-shared IPs (the rest are ordinary
// anonymous clients), and how many user agents and addresses each kind
// spreads over. TestDemoThresholds holds deploy/demo's plans and analytics
// thresholds to these, so the dashboard shows what the README promises.
const (
	hotPercent   = 40
	keyedPercent = 30
	natPercent   = 15

	natUserAgents = 200 // per NAT-shared IP
	anonIPs       = 250
	anonAgents    = 500 // over anonIPs, so two per address
)

// natIPs are the NAT-shared addresses of the demo traffic.
var natIPs = []string{"198.51.100.10", "198.51.100.11", "203.0.113.50"}

// defaultTrafficRate is traffic's -rate: requests per second, all clients
// together.
const defaultTrafficRate = 200

// trafficConns bounds traffic's requests in flight: at its default rate a
// gateway answering within 150ms needs no more.
const trafficConns = 32

// traffic sends a mix through the gateway: ordinary keyed clients at a
// gentle pace, one hot key above its limit, and a few IPs (set via
// X-Forwarded-For; the demo gateway trusts loopback as a proxy) each
// carrying many user agents, as NATs do.
func traffic(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("traffic", flag.ContinueOnError)
	gws := fs.String("gateway", "http://127.0.0.1:8080", "gateway base URLs, comma separated")
	weights := fs.String("weights", "", "relative traffic per gateway, comma separated (default even), e.g. 3,1 for uneven load balancing")
	duration := fs.Duration("duration", 2*time.Minute, "how long to send")
	rate := fs.Int("rate", defaultTrafficRate, "requests per second, all clients together")
	if err := fs.Parse(args); err != nil {
		return err
	}
	targets := strings.Split(*gws, ",")
	for _, t := range targets {
		// A URL that does not parse would make every request nil.
		if u, err := url.Parse(t); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("traffic: -gateway %q: want http(s)://host[:port]", t)
		}
	}
	weight := make([]int, len(targets))
	total := 0
	for i := range targets {
		weight[i] = 1
		if *weights != "" {
			ws := strings.Split(*weights, ",")
			if len(ws) != len(targets) {
				return fmt.Errorf("traffic: %d weights for %d gateways", len(ws), len(targets))
			}
			n, err := strconv.Atoi(ws[i])
			if err != nil || n < 0 {
				return fmt.Errorf("traffic: bad weight %q", ws[i])
			}
			weight[i] = n
		}
		total += weight[i]
	}
	if total == 0 {
		return errors.New("traffic: weights sum to zero")
	}
	gateway := func(r *rand.Rand) string {
		x := r.IntN(total)
		for i, w := range weight {
			if x < w {
				return targets[i]
			}
			x -= w
		}
		return targets[0]
	}
	client := &http.Client{Timeout: 5 * time.Second}
	pick := func(ctx context.Context, r *rand.Rand) *http.Request {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, gateway(r)+"/api/items", nil)
		switch x := r.IntN(100); {
		case x < hotPercent: // the hot key
			req.Header.Set("X-API-Key", demoHotKey)
		case x < hotPercent+keyedPercent: // ordinary keyed clients
			req.Header.Set("X-API-Key", demoKeys[r.IntN(len(demoKeys))])
		case x < hotPercent+keyedPercent+natPercent: // NAT-shared IPs: many user agents behind one address
			req.Header.Set("X-Forwarded-For", natIPs[r.IntN(len(natIPs))])
			req.Header.Set("User-Agent", fmt.Sprintf("device-%d", r.IntN(natUserAgents)))
		default: // ordinary anonymous clients, a couple of agents each
			n := r.IntN(anonAgents)
			req.Header.Set("X-Forwarded-For", fmt.Sprintf("192.0.2.%d", n%anonIPs+1))
			req.Header.Set("User-Agent", fmt.Sprintf("browser-%d", n))
		}
		return req
	}
	// Open loop, as load's: a slow gateway meets the same rate, and what
	// the connections cannot carry is dropped and counted, not silently
	// sent later at a lower rate.
	s, err := newSchedule(float64(*rate), *duration, trafficConns)
	if err != nil {
		return fmt.Errorf("traffic: %w", err)
	}
	res := s.dispatch(ctx, func(w int) sender {
		r := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
		return func(ctx context.Context, _ int) (int, error) {
			resp, err := client.Do(pick(ctx, r))
			if err != nil {
				return 0, err
			}
			defer resp.Body.Close()
			_, err = io.Copy(io.Discard, resp.Body)
			return resp.StatusCode, err
		}
	}).wait()
	allowed, denied, failed := 0, 0, res.errors
	for code, n := range res.status {
		switch {
		case code == http.StatusTooManyRequests:
			denied += n
		case code < 400:
			allowed += n
		default:
			failed += n
		}
	}
	fmt.Fprintf(stdout, "traffic: sent %d, allowed %d, denied %d, failed %d, dropped %d\n", res.sent, allowed, denied, failed, res.dropped)
	return nil
}

// probe exits non-zero unless url answers 2xx within two seconds.
func probe(ctx context.Context, args []string, _ io.Writer) error {
	if len(args) != 1 {
		return errors.New("usage: demo probe URL")
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, args[0], nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s", args[0], resp.Status)
	}
	return nil
}

// embeddedKafka runs franz-go's in-memory Kafka (kfake) on a loopback port:
// the embedded default of `make run` when no real broker is configured.
// It keeps everything in memory and is for trying the product, not for
// production.
func embeddedKafka(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("kafka", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:19092", "address to serve the Kafka protocol on")
	partitions := fs.Int("partitions", 4, "default partitions of auto-created topics")
	if err := fs.Parse(args); err != nil {
		return err
	}
	_, portStr, err := net.SplitHostPort(*listen)
	if err != nil {
		return fmt.Errorf("kafka: -listen %q: %w", *listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("kafka: -listen %q: bad port", *listen)
	}
	c, err := kfake.NewCluster(
		kfake.Ports(port),
		kfake.DefaultNumPartitions(*partitions),
		kfake.AllowAutoTopicCreation(),
	)
	if err != nil {
		return fmt.Errorf("start embedded kafka: %w", err)
	}
	defer c.Close()
	fmt.Fprintf(stdout, "embedded kafka (kfake) listening on %s\n", strings.Join(c.ListenAddrs(), ","))
	<-ctx.Done()
	return nil
}

// createTopics creates topics on a real broker, whose gateways do not
// create them (franz-go asks for no auto-creation): make bench's events
// case publishes to a fresh one. A topic that exists is not an error.
func createTopics(ctx context.Context, args []string, _ io.Writer) error {
	fs := flag.NewFlagSet("topic", flag.ContinueOnError)
	brokers := fs.String("brokers", "", "seed brokers, comma separated (required)")
	partitions := fs.Int("partitions", 4, "partitions of each topic")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *brokers == "" || fs.NArg() == 0 || *partitions < 1 {
		return errors.New("usage: demo topic -brokers HOST:PORT[,...] [-partitions N] TOPIC...")
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(*brokers, ",")...))
	if err != nil {
		return fmt.Errorf("topic: %w", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).CreateTopics(ctx, int32(*partitions), -1, nil, fs.Args()...)
	if err != nil {
		return fmt.Errorf("topic: %w", err)
	}
	for _, r := range resp {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("topic %s: %w", r.Topic, r.Err)
		}
	}
	return nil
}
