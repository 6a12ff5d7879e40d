package app

import (
	"strings"
	"testing"
)

// TestMockerFlagsNotRead: a mocker flag given in a configuration that
// does not read it (another role's, another events mode's, another
// tokenizer's, the registration's without -etcd) is warned about, naming
// where it was set and why; one that is read is not.
func TestMockerFlagsNotRead(t *testing.T) {
	for _, tt := range []struct {
		args []string
		env  map[string]string
		want []string // warnings; none when empty
	}{
		{[]string{"-tokenizer=word", "-role=decode", "-prefill-timeout=5s", "-kv-transfer-bandwidth=1e9", "-events=nats", "-nats-url=nats://n:4222"}, nil, nil},
		{[]string{"-tokenizer=word", "-role=prefill", "-kv-hold-timeout=1m", "-advertise-addr=h:1"}, nil, nil},
		{[]string{"-tokenizer=word", "-prefill-timeout=5s", "-kv-hold-timeout=1m"}, nil, []string{
			"warning: -kv-hold-timeout set but not read: read by -role prefill only (this is -role aggregated)",
			"warning: -prefill-timeout set but not read: read by -role decode only (this is -role aggregated)"}},
		{[]string{"-tokenizer=word", "-events=none"}, map[string]string{"KVGATE_ZMQ_TOPIC": "t", "KVGATE_NATS_URL": "nats://x"}, []string{
			"warning: KVGATE_ZMQ_TOPIC set but not read: read by -events zmq only (this is -events none)",
			"warning: KVGATE_NATS_URL set but not read: read by -events nats only (this is -events none)"}},
		{[]string{"-tokenizer=word", "-lease-ttl=5s", "-encoding=o200k_base", "-kv-bytes-per-token=1"}, nil, []string{
			"warning: -lease-ttl set but not read: read by the etcd registration only (no -etcd)",
			"warning: -encoding set but not read: read by -tokenizer openai only",
			"warning: -kv-bytes-per-token set but not read: read by -role decode (the transfer time) and -cpu-blocks (the reload time) only"}},
		{[]string{"-tokenizer=word", "-cpu-blocks=64", "-kv-bytes-per-token=1", "-cpu-reload-bandwidth=1e9"}, nil, nil},
	} {
		var out strings.Builder
		if _, _, err := parseMocker(tt.args, func(k string) string { return tt.env[k] }, &out); err != nil {
			t.Errorf("%v: %v", tt.args, err)
			continue
		}
		got := out.String()
		for _, w := range tt.want {
			if !strings.Contains(got, w+"\n") {
				t.Errorf("%v %v: output %q lacks %q", tt.args, tt.env, got, w)
			}
		}
		if n := strings.Count(got, "warning:"); n != len(tt.want) {
			t.Errorf("%v %v: %d warnings, want %d:\n%s", tt.args, tt.env, n, len(tt.want), got)
		}
	}
}
