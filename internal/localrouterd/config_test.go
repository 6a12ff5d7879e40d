package localrouterd

import (
	"errors"
	"flag"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/localrouter"
)

func TestParseFlags(t *testing.T) {
	base := []string{"--pool", "p", "--etcd", "a:2379,b:2379", "--nats-url", "nats://n:4222", "--router-id", "r1"}
	want := func(edit func(*Config)) Config {
		c := DefaultConfig()
		c.Pool, c.Etcd, c.NATS, c.RouterID = "p", []string{"a:2379", "b:2379"}, "nats://n:4222", "r1"
		if edit != nil {
			edit(&c)
		}
		return c
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want Config
	}{
		{"defaults", nil, nil, want(nil)},
		{"router flags", []string{
			"--router-overlap-score-credit=0.5", "--router-prefill-load-scale", "2", "--router-temperature=0.3",
			"--router-use-kv-events=false", "--router-track-active-blocks=false", "--router-replica-sync",
			"--router-ttl=30s", "--router-max-tree-size=1000", "--router-min-initial-workers=3", "--router-request-expiry=60",
			"--router-block-size=64", "--addr=:1", "--metrics-addr=", "--advertise-addr=h:1", "--register-ttl=3s",
		}, nil, want(func(c *Config) {
			r := &c.Router
			r.OverlapScoreCredit, r.PrefillLoadScale, r.RouterTemperature = 0.5, 2, 0.3
			r.UseKVEvents, r.TrackActiveBlocks, r.ReplicaSync = false, false, true
			r.TTL, r.MaxTreeSize, r.MinInitialWorkers, r.RequestExpiry, r.BlockSize = 30*time.Second, 1000, 3, time.Minute, 64
			c.GRPCAddr, c.MetricsAddr, c.AdvertiseAddr, c.RegisterTTL = "127.0.0.1:1", "", "h:1", 3*time.Second // a port alone is loopback
		})},
		{"engine signals", []string{
			"--router-metrics-period=2s", "--router-waiting-weight=1.5", "--router-kv-usage-weight=20",
			"--router-saturation-kv-usage=0.95", "--router-saturation-waiting=8",
		}, nil, want(func(c *Config) {
			c.MetricsPeriod = 2 * time.Second
			c.Router.WaitingWeight, c.Router.KVUsageWeight, c.Router.SaturationKVUsage, c.Router.SaturationWaiting = 1.5, 20, 0.95, 8
		})},
		{"metrics period from the environment, 0 disables", []string{"--router-metrics-period=0s"}, map[string]string{
			"KVGATE_ROUTER_METRICS_PERIOD": "5", "KVGATE_ROUTER_SATURATION_WAITING": "3",
		}, want(func(c *Config) { c.Router.SaturationWaiting = 3 })},
		{"deprecated names", []string{"--grpc-addr=:2", "--nats=nats://old:4222"}, nil, want(func(c *Config) {
			c.GRPCAddr, c.NATS = "127.0.0.1:2", "nats://old:4222"
		})},
		{"log flags", []string{"--log-format=text", "--log-level=debug"}, nil, want(func(c *Config) { c.Log.Format, c.Log.Level = "text", "debug" })},
		{"deprecated environment name", nil, map[string]string{"KVGATE_GRPC_ADDR": ":3"}, want(func(c *Config) { c.GRPCAddr = "127.0.0.1:3" })},
		{"short names", []string{"--block-size=32", "--min-initial-workers=2"}, nil, want(func(c *Config) {
			c.Router.BlockSize, c.Router.MinInitialWorkers = 32, 2
		})},
		{"dynamo aliases", nil, map[string]string{
			"DYN_ROUTER_TEMPERATURE": "0.7", "DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT": "0.25", "DYN_ROUTER_PREFILL_LOAD_SCALE": "3",
			"DYN_KV_CACHE_BLOCK_SIZE": "64", "DYN_ROUTER_MIN_INITIAL_WORKERS": "4",
		}, want(func(c *Config) {
			c.Router.RouterTemperature, c.Router.OverlapScoreCredit, c.Router.PrefillLoadScale = 0.7, 0.25, 3
			c.Router.BlockSize, c.Router.MinInitialWorkers = 64, 4
		})},
		{"kvgate env beats dynamo env, flag beats both", []string{"--router-temperature=0.9"}, map[string]string{
			"DYN_ROUTER_TEMPERATURE": "0.7", "KVGATE_ROUTER_TEMPERATURE": "0.8",
			"DYN_KV_CACHE_BLOCK_SIZE": "64", "KVGATE_ROUTER_BLOCK_SIZE": "128",
			"KVGATE_ROUTER_USE_KV_EVENTS": "false", "KVGATE_ROUTER_TTL": "90",
		}, want(func(c *Config) {
			c.Router.RouterTemperature, c.Router.BlockSize, c.Router.UseKVEvents, c.Router.TTL = 0.9, 128, false, 90*time.Second
		})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseFlags("localrouter", append(append([]string{}, base...), tt.args...), func(k string) string { return tt.env[k] }, io.Discard)
			if err != nil {
				t.Fatalf("ParseFlags: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseFlagsErrorsNameTheSource(t *testing.T) {
	base := []string{"--pool", "p", "--etcd", "e:1", "--nats-url", "n"}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"bad float flag", []string{"--router-temperature=hot"}, nil, "-router-temperature: not a finite number"},
		{"negative flag", []string{"--router-overlap-score-credit=-1"}, nil, "-router-overlap-score-credit: must be ≥ 0"},
		{"bad bool flag", []string{"--router-replica-sync=maybe"}, nil, "-router-replica-sync"},
		{"zero block size", []string{"--block-size=0"}, nil, "-block-size: must be ≥ 1"},
		{"bad duration flag", []string{"--router-ttl=soon"}, nil, "-router-ttl: not a duration"},
		{"unknown flag", []string{"--router-tempreature=1"}, nil, "router-tempreature"},
		{"bad dynamo env", nil, map[string]string{"DYN_ROUTER_TEMPERATURE": "x"}, `DYN_ROUTER_TEMPERATURE="x": not a finite number`},
		{"bad kvgate env", nil, map[string]string{"KVGATE_ROUTER_MIN_INITIAL_WORKERS": "-2"}, `KVGATE_ROUTER_MIN_INITIAL_WORKERS="-2": must be ≥ 0`},
		{"bad block size env", nil, map[string]string{"DYN_KV_CACHE_BLOCK_SIZE": "sixteen"}, "DYN_KV_CACHE_BLOCK_SIZE"},
		{"missing pool", []string{"--pool="}, nil, "--pool (KVGATE_POOL) is required"},
		{"missing nats", []string{"--nats-url="}, nil, "--nats-url (KVGATE_NATS_URL) is required"},
		{"stray argument", []string{"extra"}, nil, "unexpected arguments"},
		{"bad log format", []string{"--log-format=xml"}, nil, `-log-format "xml": want json or text`},
		{"negative metrics period", []string{"--router-metrics-period=-1s"}, nil, "-router-metrics-period: must be positive"},
		{"saturation kv usage above 1", []string{"--router-saturation-kv-usage=1.5"}, nil, "saturation_kv_usage 1.5 must be within 0..1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseFlags("localrouter", append(append([]string{}, base...), tt.args...), func(k string) string { return tt.env[k] }, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want one containing %q", err, tt.want)
			}
		})
	}
	var b strings.Builder
	if _, err := ParseFlags("localrouter", []string{"-h"}, func(string) string { return "" }, &b); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
	for _, s := range []string{"--router-temperature", "DYN_ROUTER_TEMPERATURE", "KVGATE_ROUTER_REPLICA_SYNC"} {
		if !strings.Contains(b.String(), strings.TrimPrefix(s, "-")) {
			t.Errorf("usage does not mention %s", s)
		}
	}
}

// TestPoolsFile: -pools-file F takes -pool's worker_chain from the global
// router's file (the pools file's worker_chain configures the pool's
// local routers), and refuses what would make two answers to one
// question: a -worker-chain as well, a block size other than the pool's.
func TestPoolsFile(t *testing.T) {
	dir := t.TempDir()
	file := dir + "/pools.yaml"
	pools := `chain: [cost]
pools:
  - name: p
    models: [m]
    block_size: 32
    routers: {etcd: true}
    worker_chain:
      - name: saturation
      - {name: cost, weight: 1}
  - name: q
    models: [m]
    routers: {etcd: true}
  - name: bad
    models: [m]
    routers: {etcd: true}
    worker_chain:
      - {name: cost, args: {normalise: max}}
`
	if err := os.WriteFile(file, []byte(pools), 0o600); err != nil {
		t.Fatal(err)
	}
	parse := func(args ...string) (Config, error) {
		base := []string{"--etcd", "e:1", "--nats", "n", "--pools-file", file}
		return ParseFlags("localrouter", append(base, args...), func(string) string { return "" }, io.Discard)
	}
	c, err := parse("--pool", "p", "--block-size", "32")
	if err != nil {
		t.Fatal(err)
	}
	if got := localrouter.FormatWorkerChain(c.Router.WorkerChain); got != "saturation,cost=1" {
		t.Errorf("pool p's chain %q, want the file's saturation,cost=1", got)
	}
	if c, err := parse("--pool", "q"); err != nil || len(c.Router.WorkerChain) != 0 {
		t.Errorf("pool q (no worker_chain): chain %v, %v; want the default", c.Router.WorkerChain, err)
	}
	if c, err := parse("--pool", "q", "--worker-chain", "cost"); err != nil || localrouter.FormatWorkerChain(c.Router.WorkerChain) != "cost" {
		t.Errorf("pool q with -worker-chain: chain %v, %v; want cost", c.Router.WorkerChain, err)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--pool", "p"}, `pool "p" has block_size 32, this router -block-size 16`},
		{[]string{"--pool", "p", "--block-size", "32", "--worker-chain", "cost"}, "both set the worker chain"},
		{[]string{"--pool", "nosuch"}, `no pool "nosuch" (pools: p, q, bad)`},
		{[]string{"--pool", "bad"}, `pools.yaml:17:9: pool "bad": worker_chain[0]: worker chain "cost": unknown argument "normalise"`},
	} {
		if _, err := parse(tt.args...); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %v, want one containing %q", tt.args, err, tt.want)
		}
	}
}

// TestAnonymousCommitExpiryFlag: the flag takes 0 (the default) and a
// negative duration (off), as its usage says, and is warned about under
// mutual TLS, where no commit is anonymous.
func TestAnonymousCommitExpiryFlag(t *testing.T) {
	base := []string{"--pool", "p", "--etcd", "e:1", "--nats-url", "n"}
	for in, want := range map[string]time.Duration{"-1s": -time.Second, "0": DefaultAnonymousCommitExpiry, "5s": 5 * time.Second} {
		c, err := ParseFlags("localrouter", append(base, "-anonymous-commit-expiry", in), func(string) string { return "" }, io.Discard)
		if err != nil || c.AnonymousCommitExpiry != want {
			t.Errorf("-anonymous-commit-expiry %s: %v, %v; want %v", in, c.AnonymousCommitExpiry, err, want)
		}
	}
	var out strings.Builder
	args := append(base, "-secure-serving", "-tls-client-ca-file", "ca.pem")
	if _, err := ParseFlags("localrouter", args, func(k string) string { return map[string]string{"KVGATE_ANONYMOUS_COMMIT_EXPIRY": "1m"}[k] }, &out); err != nil {
		t.Fatal(err)
	}
	if want := "warning: KVGATE_ANONYMOUS_COMMIT_EXPIRY set but not read: the callers are identified by mutual TLS"; !strings.Contains(out.String(), want) {
		t.Errorf("under mutual TLS, output %q; want %q", out.String(), want)
	}
}

// TestNATSFlagsNotRead: the NATS flags are warned about where the router
// uses no NATS: -nats-url with KV events and replica sync off, the NATS
// client's TLS without -nats-url.
func TestNATSFlagsNotRead(t *testing.T) {
	var out strings.Builder
	args := []string{"--pool", "p", "--etcd", "e:1", "--nats-url", "n", "--router-use-kv-events=false"}
	if _, err := ParseFlags("localrouter", args, func(string) string { return "" }, &out); err != nil {
		t.Fatal(err)
	}
	if want := "warning: -nats-url set but not read: NATS carries the KV events (-router-use-kv-events) and the replica sync (-router-replica-sync), both off here\n"; out.String() != want {
		t.Errorf("output %q, want %q", out.String(), want)
	}
	out.Reset()
	args = []string{"--pool", "p", "--etcd", "e:1", "--router-use-kv-events=false", "--nats-creds-file", "c"}
	if _, err := ParseFlags("localrouter", args, func(string) string { return "" }, &out); err != nil {
		t.Fatal(err)
	}
	if want := "warning: -nats-creds-file set but not read: read by the NATS client only, and there is no -nats-url\n"; out.String() != want {
		t.Errorf("output %q, want %q", out.String(), want)
	}
	out.Reset()
	if _, err := ParseFlags("localrouter", []string{"--pool", "p", "--etcd", "e:1", "--nats-url", "n", "--nats-creds-file", "c"}, func(string) string { return "" }, &out); err != nil || out.Len() != 0 {
		t.Errorf("with KV events: %v, output %q; want no warning", err, out.String())
	}
}
