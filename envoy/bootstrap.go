package envoy

import (
	_ "embed"
	"errors"
	"fmt"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/envoy/extprocclient"

	// Types a bootstrap's typed_config may name; importing them registers
	// them for protojson's Any resolution.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

//go:embed bootstrap.yaml
var bootstrapYAML []byte

// ExtProcFilterName is the ext_proc HTTP filter's name in a bootstrap.
const ExtProcFilterName = "envoy.filters.http.ext_proc"

// BootstrapYAML returns the shipped bootstrap (envoy/bootstrap.yaml).
func BootstrapYAML() []byte { return append([]byte(nil), bootstrapYAML...) }

// DecodeBootstrap decodes a YAML (or JSON) Envoy bootstrap into Envoy's
// own proto, strictly (an unknown field is an error), and validates it with
// Validate.
func DecodeBootstrap(data []byte) (*bootstrapv3.Bootstrap, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	b := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(js, b); err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	if err := Validate(b); err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	return b, nil
}

type validator interface{ ValidateAll() error }

// Validate runs Envoy's proto validation (protoc-gen-validate's
// ValidateAll) on m and on every message packed in an Any beneath it
// (typed_config and the like), recursively. An Any whose type is not
// registered is an error: Envoy would refuse it too.
func Validate(m proto.Message) error {
	var errs []error
	if v, ok := m.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			errs = append(errs, err)
		}
	}
	walkAnys(m.ProtoReflect(), string(m.ProtoReflect().Descriptor().Name()), &errs)
	return errors.Join(errs...)
}

// walkAnys finds every Any under m, unpacks it, validates it and descends
// into it. path names the place for error messages.
func walkAnys(m protoreflect.Message, path string, errs *[]error) {
	if a, ok := m.Interface().(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			*errs = append(*errs, fmt.Errorf("%s: unpack %s: %w", path, a.GetTypeUrl(), err))
			return
		}
		path = path + "<" + string(inner.ProtoReflect().Descriptor().FullName()) + ">"
		if v, ok := inner.(validator); ok {
			if err := v.ValidateAll(); err != nil {
				*errs = append(*errs, fmt.Errorf("%s: %w", path, err))
			}
		}
		walkAnys(inner.ProtoReflect(), path, errs)
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := path + "." + string(fd.Name())
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				walkAnys(l.Get(i).Message(), fmt.Sprintf("%s[%d]", name, i), errs)
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				walkAnys(mv.Message(), fmt.Sprintf("%s[%v]", name, k.Interface()), errs)
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			walkAnys(v.Message(), name, errs)
		}
		return true
	})
}

// HTTPConnectionManagers returns the HTTP connection managers of every
// listener's filter chains, in order.
func HTTPConnectionManagers(b *bootstrapv3.Bootstrap) ([]*hcmv3.HttpConnectionManager, error) {
	var out []*hcmv3.HttpConnectionManager
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				tc := f.GetTypedConfig()
				if tc == nil || !tc.MessageIs(&hcmv3.HttpConnectionManager{}) {
					continue
				}
				h := &hcmv3.HttpConnectionManager{}
				if err := tc.UnmarshalTo(h); err != nil {
					return nil, fmt.Errorf("listener %s: %w", l.GetName(), err)
				}
				out = append(out, h)
			}
		}
	}
	return out, nil
}

// ExtProcFilter returns the first ext_proc filter config of the bootstrap's
// HTTP connection managers.
func ExtProcFilter(b *bootstrapv3.Bootstrap) (*extprocfilterv3.ExternalProcessor, error) {
	hcms, err := HTTPConnectionManagers(b)
	if err != nil {
		return nil, err
	}
	for _, h := range hcms {
		for _, f := range h.GetHttpFilters() {
			if f.GetName() != ExtProcFilterName {
				continue
			}
			p := &extprocfilterv3.ExternalProcessor{}
			if err := f.GetTypedConfig().UnmarshalTo(p); err != nil {
				return nil, fmt.Errorf("%s: %w", ExtProcFilterName, err)
			}
			return p, nil
		}
	}
	return nil, fmt.Errorf("no %s filter in the bootstrap", ExtProcFilterName)
}

// ClientConfig returns the ext_proc client configuration that the shipped
// bootstrap gives Envoy, so that the gateway of `kvgate up` behaves as the
// Envoy users run.
func ClientConfig() (extprocclient.Config, error) {
	b, err := DecodeBootstrap(bootstrapYAML)
	if err != nil {
		return extprocclient.Config{}, err
	}
	p, err := ExtProcFilter(b)
	if err != nil {
		return extprocclient.Config{}, err
	}
	return extprocclient.FromFilterConfig(p)
}

// OverrideHostPolicyName is the extension name of Envoy's override_host
// load-balancing policy, which reads an endpoint picker's list.
const OverrideHostPolicyName = "envoy.load_balancing_policies.override_host"

// OverrideHostPolicy returns the override_host policy of cluster c's
// load_balancing_policy, or an error naming the cluster when it has none.
func OverrideHostPolicy(c *clusterv3.Cluster) (*overridehostv3.OverrideHost, error) {
	for _, p := range c.GetLoadBalancingPolicy().GetPolicies() {
		tc := p.GetTypedExtensionConfig().GetTypedConfig()
		if tc == nil || !tc.MessageIs(&overridehostv3.OverrideHost{}) {
			continue
		}
		oh := &overridehostv3.OverrideHost{}
		if err := tc.UnmarshalTo(oh); err != nil {
			return nil, fmt.Errorf("cluster %s: %s: %w", c.GetName(), OverrideHostPolicyName, err)
		}
		return oh, nil
	}
	return nil, fmt.Errorf("cluster %s: no %s load_balancing_policy", c.GetName(), OverrideHostPolicyName)
}
