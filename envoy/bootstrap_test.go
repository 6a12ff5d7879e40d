package envoy

import (
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	roundrobinv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
)

func TestShippedBootstrap(t *testing.T) {
	b, err := DecodeBootstrap(BootstrapYAML())
	if err != nil {
		t.Fatal(err)
	}

	ls := b.GetStaticResources().GetListeners()
	if len(ls) != 1 || ls[0].GetAddress().GetSocketAddress().GetPortValue() != 8080 {
		t.Fatalf("listeners: got %v, want one on 8080", ls)
	}
	hcms, err := HTTPConnectionManagers(b)
	if err != nil || len(hcms) != 1 {
		t.Fatalf("got %d connection managers (%v), want 1", len(hcms), err)
	}
	var names []string
	for _, f := range hcms[0].GetHttpFilters() {
		names = append(names, f.GetName())
	}
	if diff := cmp.Diff([]string{ExtProcFilterName, "envoy.filters.http.router"}, names); diff != "" {
		t.Errorf("http filters (-want +got):\n%s", diff)
	}

	p, err := ExtProcFilter(b)
	if err != nil {
		t.Fatal(err)
	}
	wantMode := &extprocfilterv3.ProcessingMode{
		RequestHeaderMode:   extprocfilterv3.ProcessingMode_SEND,
		RequestBodyMode:     extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		RequestTrailerMode:  extprocfilterv3.ProcessingMode_SEND,
		ResponseHeaderMode:  extprocfilterv3.ProcessingMode_SEND,
		ResponseBodyMode:    extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		ResponseTrailerMode: extprocfilterv3.ProcessingMode_SEND,
	}
	if diff := cmp.Diff(wantMode, p.GetProcessingMode(), protocmp.Transform()); diff != "" {
		t.Errorf("processing_mode (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"envoy.lb"}, p.GetMetadataOptions().GetReceivingNamespaces().GetUntyped()); diff != "" {
		t.Errorf("receiving namespaces (-want +got):\n%s", diff)
	}
	if p.GetFailureModeAllow() || p.GetAllowModeOverride() {
		t.Errorf("failure_mode_allow %v allow_mode_override %v, want both false", p.GetFailureModeAllow(), p.GetAllowModeOverride())
	}
	extprocCluster := p.GetGrpcService().GetEnvoyGrpc().GetClusterName()

	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	// The route's cluster picks with override_host: the envoy.lb list first,
	// then the header, round robin when neither names a host of the
	// cluster; a connect failure is retried on the next listed host.
	route := hcms[0].GetRouteConfig().GetVirtualHosts()[0].GetRoutes()[0].GetRoute()
	w := clusters[route.GetCluster()]
	if w == nil {
		t.Fatalf("route cluster %q missing", route.GetCluster())
	}
	if w.GetType() == clusterv3.Cluster_ORIGINAL_DST {
		t.Errorf("route cluster %q is ORIGINAL_DST: it parses one address, the protocol sends a list", w.GetName())
	}
	oh, err := OverrideHostPolicy(w)
	if err != nil {
		t.Fatal(err)
	}
	var sources []string
	for _, src := range oh.GetOverrideHostSources() {
		if md := src.GetMetadata(); md != nil {
			var keys []string
			for _, seg := range md.GetPath() {
				keys = append(keys, seg.GetKey())
			}
			sources = append(sources, "metadata "+md.GetKey()+"/"+strings.Join(keys, "/"))
		} else {
			sources = append(sources, "header "+src.GetHeader())
		}
	}
	wantSources := []string{"metadata envoy.lb/x-gateway-destination-endpoint", "header x-gateway-destination-endpoint"}
	if diff := cmp.Diff(wantSources, sources); diff != "" {
		t.Errorf("override_host sources (-want +got):\n%s", diff)
	}
	fb := oh.GetFallbackPolicy().GetPolicies()
	if len(fb) != 1 || !fb[0].GetTypedExtensionConfig().GetTypedConfig().MessageIs(&roundrobinv3.RoundRobin{}) {
		t.Errorf("override_host fallback: got %v, want round robin", fb)
	}
	rp := route.GetRetryPolicy()
	if !strings.Contains(rp.GetRetryOn(), "connect-failure") || rp.GetNumRetries().GetValue() < 1 {
		t.Errorf("route retry policy: got %v, want connect-failure retried at least once", rp)
	}
	// Circuit breakers sized for long generations on both clusters: every
	// generation in flight holds one worker request and one ext_proc stream.
	for _, name := range []string{route.GetCluster(), extprocCluster} {
		c := clusters[name]
		if c == nil {
			t.Fatalf("cluster %q missing", name)
		}
		th := c.GetCircuitBreakers().GetThresholds()
		if len(th) == 0 {
			t.Errorf("cluster %s: no circuit_breakers (Envoy's default caps it at 1,024 requests)", name)
			continue
		}
		for _, x := range th {
			for what, v := range map[string]uint32{"max_requests": x.GetMaxRequests().GetValue(), "max_pending_requests": x.GetMaxPendingRequests().GetValue(), "max_connections": x.GetMaxConnections().GetValue()} {
				if v < minCircuitBreaker {
					t.Errorf("cluster %s %v: %s %d, want at least %d", name, x.GetPriority(), what, v, minCircuitBreaker)
				}
			}
		}
	}
	// The ext_proc cluster speaks HTTP/2 to 127.0.0.1:9002.
	e := clusters[extprocCluster]
	if e == nil {
		t.Fatalf("ext_proc cluster %q missing", extprocCluster)
	}
	opts := &upstreamhttpv3.HttpProtocolOptions{}
	if err := e.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].UnmarshalTo(opts); err != nil {
		t.Fatal(err)
	}
	if opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Error("ext_proc cluster is not HTTP/2")
	}
	sa := e.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
	if sa.GetAddress() != "127.0.0.1" || sa.GetPortValue() != 9002 {
		t.Errorf("ext_proc endpoint: got %s:%d, want 127.0.0.1:9002", sa.GetAddress(), sa.GetPortValue())
	}
}

// minCircuitBreaker is the least concurrency the shipped clusters admit:
// Envoy's defaults (1,024) cap concurrent generations per Envoy.
const minCircuitBreaker = 10000

// No message timer bounds anything under FULL_DUPLEX_STREAMED: Envoy starts
// none in such a direction, headers and trailers included
// (ProcessorState::onStartProcessorCall). So the bootstrap must not set
// message_timeout as if it did, and every direction that sends anything
// must be full duplex (a BUFFERED or STREAMED direction would run the
// 200ms default, which kvgate's full-body wait cannot meet).
func TestNoMessageTimeoutUnderFullDuplex(t *testing.T) {
	b, err := DecodeBootstrap(BootstrapYAML())
	if err != nil {
		t.Fatal(err)
	}
	p, err := ExtProcFilter(b)
	if err != nil {
		t.Fatal(err)
	}
	pm := p.GetProcessingMode()
	for dir, mode := range map[string]extprocfilterv3.ProcessingMode_BodySendMode{"request": pm.GetRequestBodyMode(), "response": pm.GetResponseBodyMode()} {
		if mode != extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			t.Errorf("%s body mode %v: a non-full-duplex direction runs a message timer", dir, mode)
		}
	}
	if p.GetMessageTimeout() != nil || p.GetMaxMessageTimeout() != nil {
		t.Errorf("message_timeout %v max_message_timeout %v set: they bound nothing under FULL_DUPLEX_STREAMED", p.GetMessageTimeout(), p.GetMaxMessageTimeout())
	}
}

// The client reproduces every setting the shipped bootstrap uses.
func TestClientConfigFromBootstrap(t *testing.T) {
	c, err := ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	if c.MessageTimeout != 0 || c.FailureModeAllow {
		t.Errorf("got message timeout %v fail-open %v, want unset and false", c.MessageTimeout, c.FailureModeAllow)
	}
	if diff := cmp.Diff([]string{"envoy.lb"}, c.ReceivingNamespaces); diff != "" {
		t.Errorf("receiving namespaces (-want +got):\n%s", diff)
	}
}

// Broken bootstraps are refused, including errors inside typed_config.
func TestDecodeBootstrapRefuses(t *testing.T) {
	extproc := func(inner string) string {
		return `
static_resources:
  listeners:
  - name: l
    address: {socket_address: {address: 0.0.0.0, port_value: 8080}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: s
          route_config: {name: r}
          http_filters:
          - name: envoy.filters.http.ext_proc
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
` + inner + `
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
`
	}
	tests := []struct {
		name, yaml, wantErr string
	}{
		{"not YAML", "a: [", "bootstrap"},
		{"unknown field", "static_resources: {listners: []}", "listners"},
		{"unknown typed_config type", "static_resources: {clusters: [{name: c, typed_extension_protocol_options: {x: {\"@type\": type.googleapis.com/no.Such}}}]}", "no.Such"},
		{"invalid inner config (message_timeout too long)", extproc(`              grpc_service: {envoy_grpc: {cluster_name: x}}
              message_timeout: 7200s`), "MessageTimeout"},
		{"invalid inner config (empty cluster name)", extproc(`              grpc_service: {envoy_grpc: {cluster_name: ""}}`), "ClusterName"},
		{"valid inner config", extproc(`              grpc_service: {envoy_grpc: {cluster_name: x}}`), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeBootstrap([]byte(tt.yaml))
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("got %v, want no error", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("got %v, want an error mentioning %q", err, tt.wantErr)
			}
		})
	}
}

func FuzzDecodeBootstrap(f *testing.F) {
	f.Add(BootstrapYAML())
	f.Add([]byte("static_resources: {clusters: [{name: c}]}"))
	f.Add([]byte(`{"admin": {}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := DecodeBootstrap(data)
		if err == nil && b == nil {
			t.Fatal("nil bootstrap without error")
		}
	})
}
