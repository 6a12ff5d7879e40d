package localrouter

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// activeLog is an ActiveObserver that records its calls.
type activeLog []string

func (l *activeLog) Added(id string, k WorkerKey, _ time.Time) {
	*l = append(*l, fmt.Sprintf("+%s %s/%d", id, k.ID, k.DPRank))
}

func (l *activeLog) Removed(id string, k WorkerKey, _ time.Time) {
	*l = append(*l, fmt.Sprintf("-%s %s/%d", id, k.ID, k.DPRank))
}

// TestActiveObserver: the observer sees every change of the request count,
// in order, whatever made it (free, rename, a worker removed, expiry); a
// refused Add and a free of an unknown id change nothing and are not seen.
func TestActiveObserver(t *testing.T) {
	a := NewActiveSequences()
	var log activeLog
	a.Observe(&log)
	now := time.Now()
	w0, w1 := WorkerKey{ID: "w0"}, WorkerKey{ID: "w1", DPRank: 1}
	for _, add := range []struct {
		id string
		k  WorkerKey
	}{{"a", w0}, {"b", w1}, {"c", w0}, {"a", w1}} {
		_ = a.Add(now, add.id, add.k, []uint64{1, 2}, 32, 0, 16)
	}
	a.Free("b")
	a.Free("b")
	if err := a.Rename("c", "d"); err != nil {
		t.Fatal(err)
	}
	_ = a.Add(now, "e", w1, nil, 8, 0, 16)
	a.RemoveWorker("w1")
	a.Expire(now.Add(time.Hour), time.Minute)
	want := activeLog{"+a w0/0", "+b w1/1", "+c w0/0", "-b w1/1", "-c w0/0", "+d w0/0", "+e w1/1", "-e w1/1"}
	// Expiry frees a and d in map order.
	if len(log) != len(want)+2 {
		t.Fatalf("observer calls %q, want %q and the expiry of a and d", log, want)
	}
	if diff := cmp.Diff(want, log[:len(want)]); diff != "" {
		t.Errorf("observer calls (-want +got):\n%s", diff)
	}
	if got := map[string]bool{log[len(want)]: true, log[len(want)+1]: true}; !got["-a w0/0"] || !got["-d w0/0"] {
		t.Errorf("expiry seen as %q, want -a and -d on w0", log[len(want):])
	}
	if n := a.Stats().Requests; n != 0 {
		t.Errorf("%d requests left, want 0", n)
	}
}
