package docwalk

import (
	"fmt"
	"regexp"
	"strings"
)

// The reviewed tables of the walk. A command runs unless a row here says
// otherwise; every row must match a command of the documents (a stale row
// fails the test), so adding, excluding or expecting is a conscious edit.

// kind is what the walk does with a program.
type kind int

const (
	run     kind = iota // run in bash; exit 0 wanted
	tool                // run when the program is on PATH, else reported as not run
	never               // not run, for the reason given
	standIn             // not run: something the walk starts itself stands for it
)

type program struct {
	kind     kind
	reason   string
	prepared bool // a tool make test installs (mk/docwalk.mk): missing there, the walk fails
}

// programs is every program a document's command may start with. An
// unknown one fails the walk: classify it here.
var programs = map[string]program{
	"kvgate":     {kind: run, reason: "the binary under test (bin/kvgate and go run ./cmd/kvgate run the one built binary)"},
	"bin/kvgate": {kind: run, reason: "as kvgate"},
	"curl":       {kind: run, reason: "against the walk's servers, ports moved"},
	"sed":        {kind: run, reason: ""},
	"for":        {kind: run, reason: "a shell loop: its body runs"},
	"echo":       {kind: run, reason: ""},
	"printf":     {kind: run, reason: ""},
	"grep":       {kind: run, reason: ""},
	"seq":        {kind: run, reason: ""},
	"go":         {kind: run, reason: "go run of a package in the module runs its prebuilt binary; other go commands as rows below say"},

	"grpcurl": {kind: tool, reason: "make docwalk-tools installs it (make test does, and requires it); elsewhere the gRPC calls run where grpcurl is on PATH", prepared: true},
	"etcdctl": {kind: run, reason: "the walk's stand-in (internal/docwalk/etcdctl: get [--prefix], put) on the document's embedded etcd; etcdctl itself is not installed by make test"},
	"envoy":   {kind: tool, reason: "not installed by make test: e2e and the ext_proc tests play Envoy's part; runs where envoy is on PATH"},

	"etcd":        {kind: standIn, reason: "an etcd embedded in the test (internal/embedded, the one kvgate up runs) takes its place; its address is moved to it"},
	"nats-server": {kind: standIn, reason: "a NATS server embedded in the test takes its place; its address is moved to it"},

	"make":    {kind: never, reason: "make run is the `kvgate up` the walk starts itself; make test runs this walk"},
	"kubectl": {kind: never, reason: "needs a Kubernetes cluster; deploy/validate builds and validates the overlays in make test"},
	"helm":    {kind: never, reason: "needs a Kubernetes cluster"},
	"vllm":    {kind: never, reason: "needs a GPU and vLLM"},
}

// rule matches the commands of one document whose text contains match.
type rule struct {
	file, match, reason string
}

func (r rule) String() string { return fmt.Sprintf("%s %q", r.file, r.match) }

// skips are commands not run although their program runs elsewhere.
var skips = []rule{
	{"docs/localrouter.md", "kvgate localrouter ... --worker-chain", "a fragment: `...` elides the connection flags"},
	{"docs/mocker.md", "kvgate relay --zmq tcp://127.0.0.1:5557 --pool pool-a --worker-id gpu-0", "relays the vLLM above (not run) in a cluster: host names nats and etcd"},
	{"docs/security.md", "kvgate localrouter --pool a", "needs a cluster's certificate files under /tls and host names etcd, nats"},
	{"docs/security.md", "kvgate extproc --config pools.yaml", "needs a cluster's certificate files under /tls"},
	{"docs/tokenizer.md", "--tokenizer-dir /models/qwen3", "needs a Hugging Face tokenizer folder; the tokenizer tests cover the backend"},
	{"docs/tokenizer.md", "--config pools.yaml --model qwen3", "needs the reader's pools file with a model qwen3 and a tokenizer for it"},
	{"docs/tokenizer.md", "go test -run '^$' -bench", "a benchmark: make bench runs it"},
	{"docs/operating.md", "kvgate policy check pools.yaml", "shows the error output of a file with a typo, not shipped"},
	{"docs/envoy.md", "http://127.0.0.1:10000", "talks to the Envoy of the lines above, which needs envoy (not installed)"},
	{"docs/envoy.md", "curl -s 127.0.0.1:9901/stats", "Envoy's admin port: needs envoy (not installed)"},
	{"README.md", "kvgate bench -chaos", "the load-and-chaos run: a minute of load and faults, past the walk's budget (internal/chaos has its tests)"},
	{"README.md", "kvgate bench -overload", "a benchmark: half a minute of calibration and overload, past the walk's budget (internal/overload has its test)"},
	{"docs/replay-results.md", "kvgate bench -overload", "a benchmark: half a minute of calibration and overload, past the walk's budget (internal/overload has its test)"},
	{"README.md", "kvgate bench -probe -rate 5000", "a benchmark: seconds of load at 5000/s, past the walk's budget (internal/loadbench has its tests)"},
	{"README.md", "kvgate policy check pools.yaml", "the reader's pools file (examples/pools.yaml runs in docs/operating.md)"},
	{"docs/hierarchy.md", "tree=RxP", "names the topology's form: R and P are placeholders"},
	{"docs/security.md", "kvgate extproc --addr 0.0.0.0:9002", "names the flag a pod's deployment sets; the ext_proc needs its -config too (docs/kubernetes.md's overlay)"},
	{"docs/security.md", "kvgate localrouter --addr 0.0.0.0:7100", "names the flag a pod's deployment sets; the router needs its --pool and the rest too"},
	{"docs/operating.md", "kvgate extproc -otlp-endpoint collector:4317", "names the flag; the ext_proc needs its -config too, and collector is a host name of the reader's"},
	{"docs/operating.md", "kvgate extproc -shadow-config candidate.yaml", "names the flag; the ext_proc it starts needs a -config too"},
}

// standIns are commands the walk does not run because it starts their
// equivalent itself.
var standIns = []rule{
	{"docs/envoy.md", "go run ./cmd/kvgate up", "the walk's own kvgate up (free ports) stands for it"},
	{"README.md", "go build -o bin/kvgate ./cmd/kvgate", "the walk builds the binary once"},
	{"docs/localrouter.md", "go build -o bin/kvgate ./cmd/kvgate", "the walk builds the binary once"},
}

// expectation: the output of the matching commands must match every
// regexp; a curl row with an HTTP status in want replaces the 2xx rule.
type expectation struct {
	file, match string
	want        []string
}

var expectations = []expectation{
	{"README.md", "curl -si http://127.0.0.1:8080/v1/chat/completions", []string{`(?m)^HTTP/1.1 200`, `(?mi)^x-kvgate-pool: pool-`, `(?mi)^x-kvgate-worker-id: `}},
	{"docs/quickstart.md", `"content":"Tell me about KV caches."}]}'`, []string{`(?m)^HTTP/1.1 200`, `(?mi)^x-kvgate-pool: pool-a`, `(?mi)^x-kvgate-overlap-blocks: \d+`}},
	{"docs/quickstart.md", `"stream":true,"max_tokens":3`, []string{`(?mi)^content-type: text/event-stream`, `data: \[DONE\]`, `"completion_tokens":3`}},
	{"docs/quickstart.md", `for q in 1 2 3`, []string{`(?mi)^x-kvgate-overlap-blocks: [1-9]\d*`}},
	{"docs/quickstart.md", `x-kvgate-explain: 1`, []string{`(?i)x-kvgate-explain: model=mock-llama`, `winner pool-`}},
	{"docs/quickstart.md", `-H 'x-kvgate-pool: pool-b'`, []string{`(?mi)^x-kvgate-pool: pool-b`, `(?mi)^x-kvgate-worker-id: pool-b-w1`}},
	{"docs/quickstart.md", `"max_output_tokens":4}'`, []string{`"object":"response"`, `"type":"output_text"`, `"input_tokens":\d+`}},
	{"docs/quickstart.md", `"max_tokens":2,"stream":true,"messages"`, []string{`event: message_start`, `"type":"text_delta"`, `event: message_stop`}},
	{"docs/quickstart.md", `"model":"claude-x"`, []string{`(?m)^HTTP/1.1 404`, `(?mi)^x-kvgate-dropped-reason: unknown_model`, `"type":"not_found_error"`}},
	{"docs/quickstart.md", `"model":"gpt-5"`, []string{`(?m)^HTTP/1.1 404`, `(?mi)^x-kvgate-dropped-reason: unknown_model`, `model_not_found`}},
	{"docs/mocker.md", "curl -N http://127.0.0.1:8001/v1/completions", []string{`data: \[DONE\]`, `"completion_tokens":4`}},
	{"README.md", "kvgate.localrouter.v1.LocalRouter/BestWorker", []string{`"workerId": "w1"`}},
	{"docs/localrouter.md", "grpc.health.v1.Health/Check", []string{`"status": "SERVING"`}},
	{"docs/localrouter.md", "LocalRouter/Workers", []string{`"w1"`}},
	{"docs/localrouter.md", `{"prompt":{"token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20]}}`, []string{`"workerId": "w1"`, `"requestBlocks": 1`}},
	{"docs/localrouter.md", "etcdctl get --prefix /kvgate/pools/demo/routers/", []string{`(?m)^/kvgate/pools/demo/routers/\S+$`, `"pool":"demo"`, `"grpc_address":"127\.0\.0\.1:\d+"`}},
	{"docs/localrouter.md", "go run ./examples/patterns/query", []string{`best worker:`, `"WorkerID": "w1"`}},
	{"docs/operating.md", "kvgate policy check examples/pools.yaml", []string{`ok|valid|OK`}},
}

// knownFailing are the commands that fail today, each with the error seen;
// the walk runs them and wants them to fail. Fix the document or the
// binary, then remove the row (the walk fails on a row that passes).
var knownFailing = []rule{}

// fixtures are the files the documents name that the repository does not
// ship, written into each document's working folder (paths relative to
// it; ../ is the folder above, where ../shared/traces lives).
var fixtures = map[string]string{
	"body.json":      `{"model":"mock-llama","messages":[{"role":"user","content":"Tell me about KV caches."}]}` + "\n",
	"anthropic.json": `{"model":"mock-llama","max_tokens":8,"messages":[{"role":"user","content":"Tell me about KV caches."}]}` + "\n",
	// the candidate shadow chain of docs/operating.md's YAML block, its
	// keys at the top level as the document says
	"candidate.yaml": "chain: [model-match, header-match, cost, failover, kv-overlap]\n",
	// a short Mooncake trace for the replay commands (the documents'
	// ../shared/traces file is not in the repository)
	"trace.jsonl": mooncakeTrace(),
	"../shared/traces/mooncake_synthetic_trace.jsonl": mooncakeTrace(),
}

// replayCap bounds the requests of a replay command (--max-requests is
// set, or lowered, to it): the walk checks that the command runs, not its
// figures, within its time budget.
const replayCap = 80

// overloadWindows are the windows (and the calibration's clients and
// answer length) a `kvgate bench -overload` command runs with when it
// sets no window (its defaults, 6 s of calibration, 20 s of load and
// 64-token answers, took 35 s each in the walk): the walk checks that the
// command runs and prints its report, not its figures; internal/overload's
// TestShortRun measures with the same settings.
const overloadWindows = "-overload-calibration 1s -overload-duration 1500ms -overload-streams 8 -overload-max-tokens 8"

// mooncakeTrace is a small trace of the Mooncake format: requests sharing
// prefixes of 512-token blocks, 100 ms apart.
func mooncakeTrace() string {
	var b strings.Builder
	for i := range replayCap {
		n := 2 + i%5
		ids := make([]string, n)
		for j := range n {
			if j < n/2 {
				ids[j] = fmt.Sprint(j + 1000*(i%3))
			} else {
				ids[j] = fmt.Sprint(100000 + i*10 + j)
			}
		}
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [%s]}`+"\n",
			i*100, n*512-100, 4+i%7, strings.Join(ids, ", "))
	}
	return b.String()
}

// serverDefaults are the kvgate subcommands that serve (run in the
// background until the document ends), each with its listening flags and
// their defaults as a document would write them. A listening address,
// given or left to its default, gets a free port of its own (never the
// shared kvgate up's), the same for the same address within a document:
// a default is set through the environment (KVGATE_<FLAG>), so two
// listeners a document puts on one address still collide, as they would
// for the reader. The walk waits until each accepts connections (not the
// ZMQ endpoint: with --events nats nothing binds it).
var serverDefaults = map[string]map[string]string{
	"up":          {"gateway-addr": "127.0.0.1:8080", "extproc-addr": "127.0.0.1:9002", "admin-addr": "127.0.0.1:8081"},
	"extproc":     {"addr": "127.0.0.1:9002", "admin-addr": "127.0.0.1:9003"},
	"localrouter": {"grpc-addr": "127.0.0.1:7100", "admin-addr": "127.0.0.1:9100", "health-addr": ""},
	"mocker":      {"port": "8001", "zmq-endpoint": "tcp://127.0.0.1:5557"},
	"relay":       {"admin-addr": ""},
}

// eventsRE finds a command's --events value.
var eventsRE = regexp.MustCompile(`\s--?events[ =](\S+)`)

// readsDefault reports whether the server command text reads flag, so that
// its default is worth setting: a mocker run with --events other than zmq
// does not read --zmq-endpoint, and would warn that KVGATE_ZMQ_ENDPOINT is
// set but not read (app/mocker.go).
func readsDefault(sub, flag, text string) bool {
	if sub == "mocker" && flag == "zmq-endpoint" {
		if m := eventsRE.FindStringSubmatch(text); m != nil && strings.Trim(m[1], `"'`) != "zmq" {
			return false
		}
	}
	return true
}
