// Package e2e holds kvgate's end-to-end tests: the parts `kvgate up` runs
// (embedded etcd and NATS, mock workers, local routers, the global router,
// the ext_proc server and the Envoy-faithful gateway), started in-process
// on free loopback ports, driven with HTTP requests and Envoy-faithful
// ext_proc streams, and with the official OpenAI and Anthropic Node SDKs
// (sdk_test.go runs testdata/sdk/sdk.mjs with node; `make sdk`, part of
// `make test`, installs the SDKs).
//
// Each test starts its own system, so most tests run in parallel
// (t.Parallel; -parallel, GOMAXPROCS by default, at a time): most of their
// time is waiting on outages and streams. Some run alone, before the
// others: TestAccountingUnderCPUPressure starves its process of CPU on
// purpose, TestDuplicateRequestIDs needs its streams to outlast their own
// opening, and the tests that check where the cache sends a request
// (TestSharedPrefixSameWorker, TestAPIsRouteWithCache, TestSDKs, the
// tenancy tests) wait for KV events and engine caches that a busier
// process delays.
package e2e
