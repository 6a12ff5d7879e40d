package flowcontrol_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/kvgate/kvgate/globalrouter/flowcontrol"
)

// BenchmarkQueue is one waiting request's work in the core: Enqueue, then
// Peek and Dispatch, in a queue holding 64 requests of 8 tenants in two
// bands (BenchmarkFlowControl in globalrouter sets it beside a decision).
func BenchmarkQueue(b *testing.B) {
	for _, fairness := range []string{flowcontrol.FairnessRoundRobin, flowcontrol.FairnessWeighted} {
		b.Run(fairness, func(b *testing.B) {
			q, err := flowcontrol.New(flowcontrol.Config{Enabled: true, Fairness: fairness, Capacity: flowcontrol.Capacity{Requests: 1 << 20, Bytes: 1 << 40}}, nil)
			if err != nil {
				b.Fatal(err)
			}
			now := time.Unix(0, 0)
			flows := make([]string, 8)
			for i := range flows {
				flows[i] = "tenant-" + strconv.Itoa(i)
			}
			for i := range 64 {
				if _, err := q.Enqueue(now, flowcontrol.Request{Priority: i % 2, Flow: flows[i%8]}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				// Steady state: the request served is replaced by one of
				// its band and tenant.
				t := q.Peek()
				q.Dispatch(t)
				now = now.Add(time.Microsecond)
				if _, err := q.Enqueue(now, flowcontrol.Request{Priority: t.Priority, Flow: t.Flow}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
