package validate

import (
	"encoding/json"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

var positional = regexp.MustCompile(`/[0-9]+(/|$)`)

func (x *index) checkPatches() {
	for _, o := range x.byKind["EnvoyPatchPolicy"] {
		for i, p := range list(o.Obj, "spec", "jsonPatches") {
			for _, k := range []string{"path", "from"} {
				if v := str(p, "operation", k); positional.MatchString(v) {
					x.fail(o, "positional-patch", "jsonPatches[%d].operation.%s %q indexes a list by position: Envoy Gateway's generated order changes with any other route", i, k, v)
				}
			}
		}
	}
}

// poolsConfig is the part of kvgate's pools.yaml the checks read.
type poolsConfig struct {
	Pools []struct {
		Name      string `json:"name"`
		BlockSize int    `json:"block_size"`
	} `json:"pools"`
}

func (x *index) poolBlockSizes() (map[string]int, bool) {
	for _, o := range x.byKind["ConfigMap"] {
		data, ok := get(o.Obj, "data", "pools.yaml").(string)
		if !ok {
			continue
		}
		var pc poolsConfig
		if err := yaml.Unmarshal([]byte(data), &pc); err != nil {
			x.fail(o, "block-size", "pools.yaml: %v", err)
			return nil, false
		}
		out := map[string]int{}
		for _, p := range pc.Pools {
			bs := p.BlockSize
			if bs == 0 {
				bs = 16
			}
			out[p.Name] = bs
		}
		return out, true
	}
	return nil, false
}

// checkBlockSizes: a pool's block size is one number, in the pools config,
// its local routers' -block-size, its relays' -block-size and its engines'
// block size (mocker -block-size, vLLM --block-size) in the relay's pod.
func (x *index) checkBlockSizes() {
	pools, ok := x.poolBlockSizes()
	if !ok {
		return
	}
	x.kvgateContainers(func(p pod, c corev1.Container, sub string) {
		if sub != "localrouter" && sub != "relay" {
			return
		}
		pool := flagValue(c.Args, "pool")
		want, known := pools[pool]
		if !known {
			x.fail(p.owner, "block-size", "container %s: -pool %q is not in pools.yaml", c.Name, pool)
			return
		}
		if got := flagValue(c.Args, "block-size"); got != strconv.Itoa(want) {
			x.fail(p.owner, "block-size", "container %s: -block-size %q, pool %s has block_size %d", c.Name, got, pool, want)
		}
		if sub != "relay" {
			return
		}
		for _, e := range p.spec.Containers {
			if e.Name == c.Name {
				continue
			}
			var got string
			switch {
			case isKvgateImage(e.Image) && len(e.Args) > 0 && e.Args[0] == "mocker":
				got = flagValue(e.Args, "block-size")
			case strings.Contains(e.Image, "vllm"):
				got = flagValue(append(slices.Clone(e.Command), e.Args...), "block-size")
			default:
				continue
			}
			if got != strconv.Itoa(want) {
				x.fail(p.owner, "block-size", "engine container %s: block size %q, pool %s has block_size %d", e.Name, got, pool, want)
			}
		}
	})
}

// checkEngines: a vLLM engine next to a relay publishes KV events where the
// relay listens, with prefix caching on.
func (x *index) checkEngines() {
	for _, p := range x.pods {
		var relay *corev1.Container
		for i, c := range p.spec.Containers {
			if isKvgateImage(c.Image) && len(c.Args) > 0 && c.Args[0] == "relay" {
				relay = &p.spec.Containers[i]
			}
		}
		for _, c := range p.spec.Containers {
			if !strings.Contains(c.Image, "vllm") {
				continue
			}
			args := append(slices.Clone(c.Command), c.Args...)
			if relay == nil {
				x.fail(p.owner, "engine", "vLLM container %s has no kvgate relay sidecar", c.Name)
				continue
			}
			if flagValue(args, "enable-prefix-caching") == "" {
				x.fail(p.owner, "engine", "vLLM container %s: --enable-prefix-caching not set", c.Name)
			}
			var kc struct {
				Enable    bool   `json:"enable_kv_cache_events"`
				Publisher string `json:"publisher"`
				Endpoint  string `json:"endpoint"`
				Replay    string `json:"replay_endpoint"`
				Topic     string `json:"topic"`
			}
			raw := flagValue(args, "kv-events-config")
			if err := json.Unmarshal([]byte(raw), &kc); err != nil {
				x.fail(p.owner, "engine", "vLLM container %s: --kv-events-config %q: %v", c.Name, raw, err)
				continue
			}
			if !kc.Enable || kc.Publisher != "zmq" {
				x.fail(p.owner, "engine", "vLLM container %s: --kv-events-config wants enable_kv_cache_events true and publisher zmq, got %+v", c.Name, kc)
			}
			if port(kc.Endpoint) != port(flagValue(relay.Args, "zmq")) || kc.Topic != flagValue(relay.Args, "topic") {
				x.fail(p.owner, "engine", "vLLM publishes on %s topic %q, the relay subscribes to %s topic %q", kc.Endpoint, kc.Topic, flagValue(relay.Args, "zmq"), flagValue(relay.Args, "topic"))
			}
		}
	}
}

// checkFlags: every flag given to kvgate exists on its subcommand. A flag
// in Pending that the binary lacks is reported as "[flags-pending]".
func (x *index) checkFlags(flags Flags) {
	x.kvgateContainers(func(p pod, c corev1.Container, sub string) {
		known, ok := flags[sub]
		if !ok {
			x.fail(p.owner, "flags", "container %s: kvgate has no subcommand %q", c.Name, sub)
			return
		}
		for _, a := range c.Args[1:] {
			if !strings.HasPrefix(a, "-") {
				x.fail(p.owner, "flags", "container %s: argument %q is not a flag", c.Name, a)
				continue
			}
			n, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if known[n] {
				continue
			}
			if Pending[n] {
				x.fail(p.owner, "flags-pending", "container %s: kvgate %s has no -%s yet (issue 11)", c.Name, sub, n)
				continue
			}
			x.fail(p.owner, "flags", "container %s: kvgate %s has no flag -%s", c.Name, sub, n)
		}
	})
}

// listenFlags are kvgate's listen-address flags (kvgate's app
// TestListenFlags keeps their list).
var listenFlags = []string{"addr", "grpc-addr", "admin-addr", "metrics-addr", "health-addr", "subtree-listen", "gateway-addr", "extproc-addr"}

// checkListen: a kvgate listener in a pod must bind beyond loopback to be
// reached by the kubelet, a Service or Prometheus. A port alone (":9002")
// is loopback for every kvgate listen flag (docs/security.md, "Addresses"),
// unlike Go's net: write 0.0.0.0:9002.
func (x *index) checkListen() {
	x.kvgateContainers(func(p pod, c corev1.Container, sub string) {
		for _, f := range listenFlags {
			v := flagValue(c.Args, f)
			if v == "" {
				continue
			}
			host, _, err := net.SplitHostPort(v)
			if ip := net.ParseIP(host); err == nil && (host == "" || host == "localhost" || ip != nil && ip.IsLoopback()) {
				x.fail(p.owner, "listen", "container %s: -%s=%s binds loopback only (a port alone is loopback in kvgate): write 0.0.0.0:PORT", c.Name, f, v)
			}
		}
	})
}
