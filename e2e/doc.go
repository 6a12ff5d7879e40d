// Package e2e holds kvgate's end-to-end tests: the parts `kvgate up` runs
// (embedded etcd and NATS, mock workers, local routers, the global router,
// the ext_proc server and the Envoy-faithful gateway), started in-process
// on free loopback ports, driven with HTTP requests and Envoy-faithful
// ext_proc streams, and with the official OpenAI and Anthropic Node SDKs
// (sdk_test.go runs testdata/sdk/sdk.mjs with node; `make sdk`, part of
// `make test`, installs the SDKs).
package e2e
