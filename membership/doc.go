// Package membership is who is alive in a kvgate system: the
// etcd keys under which workers and local routers register, the records
// stored there (WorkerInfo, RouterInfo), and the one Role type that workers,
// pools and policies share.
//
// Keys:
//
//	/kvgate/pools/<pool>/workers/<id>  → JSON WorkerInfo   (engines: kvgate relay, kvgate mocker)
//	/kvgate/pools/<pool>/routers/<id>  → JSON RouterInfo   (kvgate localrouter)
//
// Both are held under a lease, so a process that dies leaves the set when its
// lease expires. This package is plain data with no etcd dependency, so the
// policies and the KV-event code can import it; registration with leases and
// watching live in membership/registry.
//
// Files: records.go (Role, WorkerInfo, RouterInfo, the key prefixes and
// keys).
package membership
