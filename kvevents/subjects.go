package kvevents

// NATS subjects shared by publishers, relays and routers.
// Who is alive (the etcd keys and records) is package membership's.

// EventsSubject is the NATS subject of a pool's KV events.
func EventsSubject(pool string) string { return "kvgate." + pool + ".kv-events" }

// ActiveSeqsSubject is the NATS subject where a pool's router replicas share
// lifecycle events.
func ActiveSeqsSubject(pool string) string { return "kvgate." + pool + ".active-seqs" }

// DumpSubject is the NATS request-reply subject where a worker's publisher
// answers with its current blocks.
func DumpSubject(pool, worker string) string { return "kvgate." + pool + "." + worker + ".kv-dump" }
