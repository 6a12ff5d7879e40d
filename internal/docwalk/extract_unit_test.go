package docwalk

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// TestExtract pins the extraction rules on a small document.
func TestExtract(t *testing.T) {
	doc := "# t\n" +
		"```sh\n" +
		"make run    # comment\n" +
		"            # more comment\n" +
		"curl -s http://127.0.0.1:8080/x \\\n" +
		"  -d '{\n" +
		"  \"a\": 1}'\n" +
		"etcd --data-dir /tmp/etcd &  nats-server -p 4222 &\n" +
		"for q in 1 2; do\n" +
		"  echo $q\n" +
		"done\n" +
		"```\n" +
		"\n" +
		"```\n" +
		"1\n" +
		"```\n" +
		"```\n" +
		"kvgate is up (1s to start)\n" +
		"  gateway (HTTP)  http://127.0.0.1:8080\n" +
		"```\n" +
		"```\n" +
		"kvgate tokenize --encoding cl100k_base < body.json\n" +
		"```\n" +
		"<!-- docwalk: skip because -->\n" +
		"```console\n" +
		"$ kvgate policy check x.yaml\n" +
		"x.yaml: INVALID\n" +
		"```\n" +
		"```yaml\n" +
		"kvgate: 1\n" +
		"```\n"
	p := filepath.Join(t.TempDir(), "d.md")
	if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	cs, err := extract(p, "d.md")
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		Line         int
		Text         string
		BG           bool
		Output, Skip string
	}
	var got []row
	for _, c := range cs {
		got = append(got, row{c.line, c.text, c.bg, c.output, c.skip})
	}
	want := []row{
		{3, "make run    # comment", false, "", ""},
		{5, "curl -s http://127.0.0.1:8080/x \\\n  -d '{\n  \"a\": 1}'", false, "", ""},
		{8, "etcd --data-dir /tmp/etcd", true, "", ""},
		{8, "nats-server -p 4222", true, "", ""},
		{9, "for q in 1 2; do\n  echo $q\ndone", false, "1\n", ""},
		{22, "kvgate tokenize --encoding cl100k_base < body.json", false, "", ""},
		{26, "kvgate policy check x.yaml", false, "x.yaml: INVALID\n", "because"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%#v\nwant\n%#v", got, want)
	}
	for _, c := range []struct{ text, prog string }{
		{"ETCDCTL_API=3 etcdctl get x", "etcdctl"},
		{`PROMPT="$(for i in 1; do printf 'a %d' $i; done)"`, "printf"},
		{`A="x y"`, ""},
		{"kvgate up", "kvgate"},
	} {
		if got := programOf(c.text); got != c.prog {
			t.Errorf("programOf(%q) = %q, want %q", c.text, got, c.prog)
		}
	}
}

func TestInlineCommands(t *testing.T) {
	line := "run `kvgate extproc --config examples/pools.yaml`, not `kvgate extproc`, `kvgate policy check CONFIG...`, " +
		"`kvgate mocker --etcd …`, `kvgate <sub> -h`, `go run ./cmd/kvgate up -h`, `kvgate replay --config pools.yaml --trace T`, `curl -s 127.0.0.1:9901/stats | grep x`, `kvgate policy replay`"
	var got []string
	for _, c := range inlineCommands("f.md", []docLine{{7, line}, {8, "wrapped `go run"}, {9, "./cmd/kvgate up -gateway-addr 127.0.0.1:8081`."}}) {
		got = append(got, fmt.Sprint(c.line, " ", c.text))
	}
	want := []string{"7 kvgate extproc --config examples/pools.yaml", "7 go run ./cmd/kvgate up -h", "7 curl -s 127.0.0.1:9901/stats | grep x",
		"8 go run ./cmd/kvgate up -gateway-addr 127.0.0.1:8081"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
}

// TestRewrite pins how a command is moved onto the walk's binaries,
// ports and folders.
func TestRewrite(t *testing.T) {
	w := &walker{bin: binaries{runs: map[string]string{"./cmd/kvgate": "/b/kvgate", "./examples/q": "/b/q"}},
		sys: &upSystem{gateway: "127.0.0.1:1", admin: "127.0.0.1:2", extproc: "127.0.0.1:3"}, tmp: "/T",
		ports: map[string]string{"127.0.0.1:7100": "127.0.0.1:5"}, shared: map[string]bool{}}
	for _, c := range []struct{ in, want string }{
		{"curl -si http://127.0.0.1:8080/v1 -H x", "curl -si http://127.0.0.1:1/v1 -H x"},
		{"bin/kvgate localrouter --grpc-addr 127.0.0.1:7100", "kvgate localrouter --grpc-addr 127.0.0.1:5"},
		{"go run ./examples/q -router 127.0.0.1:7100", "/b/q -router 127.0.0.1:5"},
		{"sed s/a/b/ x > /tmp/y.yaml", "sed s/a/b/ x > /T/y.yaml"},
		{"go run ./cmd/kvgate replay --trace t --rate 6 # or x", "/b/kvgate replay --max-requests 80 --trace t --rate 6 # or x"},
		{"kvgate policy replay c.yaml --generate agentic --max-requests 1500", "kvgate policy replay c.yaml --generate agentic --max-requests 80"},
		{"kvgate replay --generate agentic --max-requests 20", "kvgate replay --generate agentic --max-requests 20"},
		{"kvgate bench -overload -overload-flow-control", "kvgate bench " + overloadWindows + " -overload -overload-flow-control"},
		{"kvgate bench -overload", "kvgate bench " + overloadWindows + " -overload"},
		{"kvgate bench -overload -overload-duration 5s", "kvgate bench -overload -overload-duration 5s"},
		{"kvgate bench -chaos -streams 200", "kvgate bench -chaos -streams 200"},
	} {
		if got := w.rewrite(c.in); got != c.want {
			t.Errorf("rewrite(%q)\n = %q\nwant %q", c.in, got, c.want)
		}
	}
}

// TestReadsDefault: a mocker run with --events other than zmq gets no
// KVGATE_ZMQ_ENDPOINT (it would warn that the variable is not read); with
// zmq, or no --events (zmq by default), it does.
func TestReadsDefault(t *testing.T) {
	for _, tt := range []struct {
		sub, flag, text string
		want            bool
	}{
		{"mocker", "zmq-endpoint", "kvgate mocker --model-name m --events nats --nats-url nats://127.0.0.1:4222", false},
		{"mocker", "zmq-endpoint", "kvgate mocker --events=none", false},
		{"mocker", "zmq-endpoint", "kvgate mocker --events zmq", true},
		{"mocker", "zmq-endpoint", "kvgate mocker --model-name m", true},
		{"mocker", "port", "kvgate mocker --events nats", true},
		{"up", "gateway-addr", "kvgate up --events nats", true},
	} {
		if got := readsDefault(tt.sub, tt.flag, tt.text); got != tt.want {
			t.Errorf("readsDefault(%s, %s, %q) = %v, want %v", tt.sub, tt.flag, tt.text, got, tt.want)
		}
	}
}
