// Package envoy holds what kvgate ships for Envoy and checks it offline:
// bootstrap.yaml, the Envoy configuration users run in front of kvgate
// (`envoy -c envoy/bootstrap.yaml`), decoded here into Envoy's own protos
// (go-control-plane) and validated with their generated rules, every
// typed_config included; and the ext_proc settings of that bootstrap as a
// client configuration (ClientConfig), so that the Envoy stand-in of
// `kvgate up` runs with exactly what Envoy would.
//
// Subpackages:
//
//   - extprocclient: the Envoy-faithful ext_proc client (what Envoy's
//     ext_proc filter does, mode by mode), for tests and local runs.
//   - gateway: an HTTP gateway that uses extprocclient and proxies to the
//     endpoint kvgate picked; `kvgate up` serves it.
//
// The Kubernetes manifests (deploy/, built by examples/gateway) are
// validated by the deploy/validate module; this package's tests load their
// pools files. docs/envoy.md and docs/kubernetes.md walk through them.
//
// Files: bootstrap.go (the embedded bootstrap.yaml, DecodeBootstrap,
// Validate, the ext_proc filter and its ClientConfig).
package envoy
