package membership_test

import (
	"encoding/json"
	"testing"

	"github.com/kvgate/kvgate/membership"
)

func TestRouterInfo(t *testing.T) {
	good := membership.RouterInfo{ID: "r", GRPCAddress: "h:1", Pool: "p", BlockSize: 16}
	b, _ := json.Marshal(good)
	got, err := membership.ParseRouterInfo(b)
	if err != nil || got != good {
		t.Errorf("ParseRouterInfo = %+v, %v", got, err)
	}
	for _, bad := range []string{`{}`, `{"id":"r","grpc_address":"h:1","pool":"p"}`, `{"id":"a/b","grpc_address":"h:1","pool":"p","block_size":1}`, `[`} {
		if _, err := membership.ParseRouterInfo([]byte(bad)); err == nil {
			t.Errorf("ParseRouterInfo(%s) succeeded", bad)
		}
	}
}

func TestWorkerInfo(t *testing.T) {
	good := membership.WorkerInfo{ID: "w", Address: "h:1", DPSize: 1, BlockSize: 16, Role: membership.RolePrefill}
	b, _ := json.Marshal(good)
	got, err := membership.ParseWorkerInfo(b)
	if err != nil || got != good {
		t.Errorf("ParseWorkerInfo = %+v, %v", got, err)
	}
	for _, bad := range []string{`{}`, `{"id":"w","address":"h:1","block_size":16,"role":"boss"}`, `{"id":"a.b","address":"h:1","block_size":1}`, `[`} {
		if _, err := membership.ParseWorkerInfo([]byte(bad)); err == nil {
			t.Errorf("ParseWorkerInfo(%s) succeeded", bad)
		}
	}
	if got, want := membership.WorkerKey("p", "w"), "/kvgate/pools/p/workers/w"; got != want {
		t.Errorf("WorkerKey = %q, want %q", got, want)
	}
	if got, want := membership.RouterKey("p", "r"), "/kvgate/pools/p/routers/r"; got != want {
		t.Errorf("RouterKey = %q, want %q", got, want)
	}
}

func TestRoleSet(t *testing.T) {
	var r membership.Role
	if err := r.Set("decode"); err != nil || r != membership.RoleDecode {
		t.Errorf("Set(decode) = %v, role %q", err, r)
	}
	if err := r.Set("boss"); err == nil {
		t.Error("Set(boss) succeeded")
	}
}

func TestParseWorkerInfoDefaults(t *testing.T) {
	w, err := membership.ParseWorkerInfo([]byte(`{"id":"w1","address":"127.0.0.1:8001","block_size":16,"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	if w.DPSize != 1 {
		t.Errorf("DPSize = %d, want default 1", w.DPSize)
	}
	for _, bad := range []string{
		`{"id":"a/b","address":"x","block_size":16}`,
		`{"id":"w","address":"","block_size":16}`,
		`{"id":"w","address":"x","block_size":0}`,
		`{"id":"w","address":"x","block_size":16,"role":"boss"}`,
		`[1,2]`,
	} {
		if _, err := membership.ParseWorkerInfo([]byte(bad)); err == nil {
			t.Errorf("membership.ParseWorkerInfo(%s) = nil error, want one", bad)
		}
	}
}
