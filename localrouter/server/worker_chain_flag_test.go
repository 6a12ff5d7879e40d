package server

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/localrouter"
)

func TestWorkerChainFlag(t *testing.T) {
	base := []string{"--pool", "p", "--etcd", "e:1", "--nats-url", "n", "--router-id", "r"}
	dir := t.TempDir()
	file := filepath.Join(dir, "chain.yaml")
	if err := os.WriteFile(file, []byte("- name: saturation\n- {name: cost, args: {normalize: max}}\n- {name: cold, weight: 0.5}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yml")
	if err := os.WriteFile(bad, []byte("- name: cost\n- {name: cold, args: {lru: 3}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		args []string
		env  map[string]string
		want string // the chain, formatted, or an error's text
	}{
		{"none", nil, nil, ""},
		{"inline", []string{"--worker-chain", "saturation,cost=1,prefix=2/"}, nil, `argument "" is not key=value`},
		{"inline ok", []string{"--worker-chain=saturation,cost=1,prefix=2"}, nil, "saturation,cost=1,prefix=2"},
		{"env", nil, map[string]string{"KVGATE_WORKER_CHAIN": "decode"}, "decode"},
		{"file", []string{"--worker-chain", file}, nil, "saturation,cost/normalize=max,cold=0.5"},
		{"@file", []string{"--worker-chain", "@" + file}, nil, "saturation,cost/normalize=max,cold=0.5"},
		{"bad file", []string{"--worker-chain", bad}, nil, `bad.yml:2:3: worker_chain[1]: worker chain "cold": unknown argument "lru" (known: lru_size)`},
		{"unknown scorer", []string{"--worker-chain", "cost,prefixx"}, nil, `unknown filter or scorer "prefixx"`},
		{"missing file", []string{"--worker-chain", filepath.Join(dir, "none.yaml")}, nil, "worker chain file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseFlags("localrouter", append(append([]string{}, base...), tt.args...), func(k string) string { return tt.env[k] }, io.Discard)
			got := ""
			if err != nil {
				got = err.Error()
			} else {
				got = localrouter.FormatWorkerChain(c.Router.WorkerChain)
			}
			if (tt.want == "" && got != "") || !strings.Contains(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}
