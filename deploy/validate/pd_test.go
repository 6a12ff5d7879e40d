package validate

import (
	"encoding/json"
	"flag"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

const pdOverlay = "overlays/disaggregated-vllm"

// The flag table parses as Go's flag package would: both dash forms,
// -name=value, a string flag's value as the next argument; a typo, a bool
// given its value as the next argument, and a bad type are errors.
func TestParseGoFlags(t *testing.T) {
	got, errs := ParseGoFlags([]string{"--port=8000", "-vllm-port", "8200", "--connector=nixlv2", "-secure-proxy=false", "-v=2"}, RoutingSidecarFlags)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	want := map[string]string{"port": "8000", "vllm-port": "8200", "connector": "nixlv2", "secure-proxy": "false", "v": "2"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("-%s = %q, want %q", k, got[k], v)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--vllm-prot=8200"}, "no flag -vllm-prot"},
		{[]string{"--connecter=nixlv2"}, "no flag -connecter"},
		{[]string{"--secure-proxy", "false", "--port=8000"}, `argument 1 "false" is not a flag: Go's flag package stops there and ignores 1 argument(s)`},
		{[]string{"--secure-proxy=no"}, `flag -secure-proxy: "no" is not a bool`},
		{[]string{"--data-parallel-size=two"}, `flag -data-parallel-size: "two" is not an int`},
		{[]string{"--port"}, "flag -port needs a value"},
		{[]string{"---port=1"}, "bad flag syntax"},
		{[]string{"--port=1", "--port=2"}, "given twice"},
	} {
		_, errs := ParseGoFlags(tc.args, RoutingSidecarFlags)
		if !slices.ContainsFunc(errs, func(e error) bool { return strings.Contains(e.Error(), tc.want) }) {
			t.Errorf("%q: got %v, want an error containing %q", tc.args, errs, tc.want)
		}
	}
}

// The klog rows of the table are flags klog.InitFlags defines, with the
// defaults it gives them (klog's own code, the version this module pins).
func TestKlogFlags(t *testing.T) {
	fs := flag.NewFlagSet("sidecar", flag.ContinueOnError)
	klog.InitFlags(fs)
	for name, f := range klogFlags {
		got := fs.Lookup(name)
		if got == nil {
			t.Errorf("klog.InitFlags defines no -%s", name)
			continue
		}
		_, isBool := got.Value.(interface{ IsBoolFlag() bool })
		if got.DefValue != f.Default || isBool != (f.Kind == "bool") {
			t.Errorf("-%s: klog's default %q (bool %v), the table's %q (%s)", name, got.DefValue, isBool, f.Default, f.Kind)
		}
	}
}

func FuzzParseGoFlags(f *testing.F) {
	f.Add("--port=8000\x00-vllm-port\x008200\x00--secure-proxy\x00false")
	f.Add("-=\x00--\x00-")
	f.Fuzz(func(t *testing.T, s string) {
		args := strings.Split(s, "\x00")
		got, _ := ParseGoFlags(args, RoutingSidecarFlags)
		for k := range got {
			if _, ok := RoutingSidecarFlags[k]; !ok {
				t.Fatalf("returned unknown flag %q", k)
			}
		}
	})
}

// The disaggregated vLLM overlay renders llm-d's routing sidecar beside
// every decode engine, with each flag in RoutingSidecarFlags, and no
// container of any overlay is without a readiness probe.
func TestRenderedSidecarsAndReadiness(t *testing.T) {
	sidecars := 0
	for name, dir := range overlays(t) {
		objs, err := Build(dir, name)
		if err != nil {
			t.Fatal(err)
		}
		x := &index{objs: objs, byKind: map[string][]Object{}, services: map[string]*corev1.Service{}, secrets: map[string]bool{}}
		for _, o := range objs {
			x.byKind[o.Kind()] = append(x.byKind[o.Kind()], o)
		}
		x.decodeWorkloads()
		containers := 0
		for _, p := range x.pods {
			containers += len(p.spec.Containers)
			for _, c := range p.spec.Containers {
				if !isImage(c.Image, RoutingSidecarImage) {
					continue
				}
				sidecars++
				if name != pdOverlay || p.labels["kvgate.io/pool"] != "decode" {
					t.Errorf("%s: %s runs the routing sidecar; want it on the decode pool of %s only", name, p.owner, pdOverlay)
				}
				if _, errs := ParseGoFlags(c.Args, RoutingSidecarFlags); len(errs) > 0 {
					t.Errorf("%s: %s: %v", name, p.owner, errs)
				}
			}
		}
		if containers == 0 {
			t.Errorf("%s: no containers rendered", name)
		}
		x.checkReadiness()
		x.checkPD()
		for _, err := range x.errs {
			t.Error(err)
		}
	}
	if sidecars != 1 {
		t.Errorf("%d Deployments run the routing sidecar, want 1 (the decode engines of %s)", sidecars, pdOverlay)
	}
}

func setEngineArg(c map[string]any, flag, value string) {
	args := c["args"].([]any)
	for i, a := range args {
		if n, _, _ := strings.Cut(strings.TrimLeft(a.(string), "-"), "="); n == flag {
			if value == "" {
				c["args"] = append(args[:i:i], args[i+1:]...)
			} else {
				args[i] = "--" + flag + "=" + value
			}
			return
		}
	}
	panic("no flag " + flag)
}

func addArg(c map[string]any, arg ...any) { c["args"] = append(c["args"].([]any), arg...) }

func pdMutations() []mutation {
	const decode, prefill = "Deployment/kvgate-vllm-decode", "Deployment/kvgate-vllm-prefill"
	proxy := func(o map[string]any) map[string]any { return container(o, "routing-proxy") }
	return []mutation{
		{name: "typo'd sidecar flag", overlay: pdOverlay, kind: decode,
			edit: func(o map[string]any) { setEngineArg(proxy(o), "vllm-port", ""); addArg(proxy(o), "--vllm-prot=8200") },
			want: "[pd-sidecar] container routing-proxy: argument 4: no flag -vllm-prot"},
		{name: "bool sidecar flag with its value apart", overlay: pdOverlay, kind: decode,
			edit: func(o map[string]any) {
				setEngineArg(proxy(o), "secure-proxy", "")
				addArg(proxy(o), "--secure-proxy", "false")
			},
			want: `"false" is not a flag: Go's flag package stops there`},
		{name: "unknown connector", overlay: pdOverlay, kind: decode,
			edit: func(o map[string]any) { setEngineArg(proxy(o), "connector", "nixl") }, want: `--connector "nixl": want one of`},
		{name: "secure proxy left at its default", overlay: pdOverlay, kind: decode,
			edit: func(o map[string]any) { setEngineArg(proxy(o), "secure-proxy", "") }, want: "--secure-proxy is true (its default)"},
		{name: "SSRF protection without a pool", overlay: pdOverlay, kind: decode,
			edit: func(o map[string]any) { setEngineArg(proxy(o), "enable-ssrf-protection", "true") }, want: "--enable-ssrf-protection needs --inference-pool-name"},
		{name: "sidecar forwards to the wrong engine port", overlay: pdOverlay, kind: decode,
			edit: func(o map[string]any) { setEngineArg(proxy(o), "vllm-port", "8001") }, want: "--vllm-port 8001, but vLLM container vllm listens on --port 8200"},
		{name: "sidecar listens on an undeclared port", overlay: pdOverlay, kind: decode,
			edit: func(o map[string]any) { setEngineArg(proxy(o), "port", "8100") }, want: "listens on --port 8100, which the container does not declare"},
		{name: "relay registers vLLM's port, past the sidecar", overlay: pdOverlay, kind: decode,
			edit: func(o map[string]any) { setArg(container(o, "relay"), "address", "$(POD_IP):8200") }, want: "kvgate would send this worker's requests past the sidecar"},
		{name: "Service targets vLLM's port on decode pods", overlay: pdOverlay, kind: "Service/kvgate-workers",
			edit: func(o map[string]any) { list(o, "spec", "ports")[0].(map[string]any)["targetPort"] = 8200 },
			want: "does not reach the routing sidecar's --port 8000"},
		{name: "decode engine without the sidecar", overlay: pdOverlay, kind: decode,
			edit: func(o map[string]any) {
				cs := list(o, "spec", "template", "spec", "containers")
				obj(o, "spec", "template", "spec")["containers"] = slices.DeleteFunc(cs, func(c any) bool { return str(c, "name") == "routing-proxy" })
			}, want: "[pd] vLLM decode worker vllm has no llm-d routing sidecar"},
		{name: "decode engine without KV transfer", overlay: pdOverlay, kind: decode,
			edit: func(o map[string]any) { setEngineArg(container(o, "vllm"), "kv-transfer-config", "") }, want: "vLLM decode worker vllm: no --kv-transfer-config"},
		{name: "prefill engine with another connector", overlay: pdOverlay, kind: prefill,
			edit: func(o map[string]any) {
				setEngineArg(container(o, "vllm"), "kv-transfer-config", `{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}`)
			}, want: `kv_connector "LMCacheConnectorV1"`},
		{name: "prefill engine as a consumer", overlay: pdOverlay, kind: prefill,
			edit: func(o map[string]any) {
				setEngineArg(container(o, "vllm"), "kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}`)
			}, want: `kv_role "kv_consumer", want NixlConnector and one of [kv_both kv_producer]`},
		{name: "NIXL side channel on localhost", overlay: pdOverlay, kind: prefill,
			edit: func(o map[string]any) { delete(container(o, "vllm"), "env") }, want: "VLLM_NIXL_SIDE_CHANNEL_HOST not set"},
		{name: "prefill relay registers another port", overlay: pdOverlay, kind: prefill,
			edit: func(o map[string]any) { setArg(container(o, "relay"), "address", "$(POD_IP):9000") }, want: "registers a port other than vLLM's --port 8000"},
		{name: "no NetworkPolicy in front of the sidecar", overlay: pdOverlay, kind: "NetworkPolicy/kvgate-vllm-decode-sidecar", drop: true,
			want: "no NetworkPolicy limits who reaches port 8000"},
		{name: "NetworkPolicy opens the sidecar's port to every source", overlay: pdOverlay, kind: "NetworkPolicy/kvgate-vllm-decode-sidecar",
			edit: func(o map[string]any) { delete(list(o, "spec", "ingress")[1].(map[string]any), "ports") },
			want: "NetworkPolicy kvgate-vllm-decode-sidecar ingress[1] admits every source to the sidecar's port 8000"},
		{name: "NetworkPolicy selects no pod", overlay: pdOverlay, kind: "NetworkPolicy/kvgate-vllm-decode-sidecar",
			edit: func(o map[string]any) { obj(o, "spec", "podSelector", "matchLabels")["kvgate.io/pool"] = "decod" },
			want: "[selectors] podSelector map[app.kubernetes.io/name:kvgate-vllm kvgate.io/pool:decod] matches no pod"},
		{name: "relay without readiness probe", overlay: "overlays/disaggregated", kind: "Deployment/kvgate-mocker-decode",
			edit: func(o map[string]any) { delete(container(o, "relay"), "readinessProbe") }, want: "[readiness] container relay has no readinessProbe"},
		{name: "routing sidecar without readiness probe", overlay: pdOverlay, kind: decode,
			edit: func(o map[string]any) { delete(proxy(o), "readinessProbe") }, want: "[readiness] container routing-proxy has no readinessProbe"},
		{name: "native sidecar without readiness probe", overlay: "overlays/two-pools", kind: "Deployment/kvgate-mocker-pool-a",
			edit: func(o map[string]any) {
				c := deepCopy(container(o, "relay"))
				delete(c, "readinessProbe")
				delete(c, "livenessProbe")
				delete(c, "ports")
				c["name"], c["restartPolicy"] = "relay-init", "Always"
				obj(o, "spec", "template", "spec")["initContainers"] = []any{c}
			}, want: "[readiness] sidecar init container relay-init has no readinessProbe"},
	}
}

// Each planted P/D or readiness error is caught with its check's message;
// the unchanged overlay has none of them. Only Check runs (these checks
// are its own; the schemas are TestPlantedErrors' and TestOverlays').
func TestPDPlantedErrors(t *testing.T) {
	dirs := overlays(t)
	built := map[string][]Object{}
	baseline := map[string][]error{}
	for _, m := range pdMutations() {
		t.Run(m.name, func(t *testing.T) {
			if built[m.overlay] == nil {
				objs, err := Build(dirs[m.overlay], m.overlay)
				if err != nil {
					t.Fatal(err)
				}
				built[m.overlay], baseline[m.overlay] = objs, Check(objs, nil)
			}
			var objs []Object
			found := false
			for _, o := range built[m.overlay] {
				o = Object{Overlay: o.Overlay, Obj: deepCopy(o.Obj)}
				if o.Kind()+"/"+o.Name() == m.kind {
					found = true
					if m.drop {
						continue
					}
					m.edit(o.Obj)
				}
				objs = append(objs, o)
			}
			if !found {
				t.Fatalf("%s: no %s", m.overlay, m.kind)
			}
			var msgs []string
			for _, e := range Check(objs, nil) {
				msgs = append(msgs, e.Error())
			}
			if !slices.ContainsFunc(msgs, func(s string) bool { return strings.Contains(s, m.want) }) {
				b, _ := json.Marshal(m.kind)
				t.Errorf("%s: got errors:\n%s\nwant one containing %q", b, strings.Join(msgs, "\n"), m.want)
			}
			for _, e := range baseline[m.overlay] {
				if strings.Contains(e.Error(), m.want) {
					t.Errorf("the unchanged overlay already fails with %v", e)
				}
			}
		})
	}
}
