package loadbench

import (
	"errors"
	"strings"
	"syscall"
	"testing"
)

// fakeLimit behaves as the kernel does for RLIMIT_NOFILE: anyone may move
// the soft limit up to the hard one, raising the hard one needs root, and
// nothing goes past nr_open.
type fakeLimit struct {
	cur, max, nrOpen uint64
	root             bool
	ignore           bool // accepts a Set and does not apply it
	sets             int
}

func (f *fakeLimit) Get() (uint64, uint64, error) { return f.cur, f.max, nil }

func (f *fakeLimit) Set(cur, max uint64) error {
	f.sets++
	switch {
	case cur > max:
		return syscall.EINVAL
	case max > f.max && !f.root:
		return syscall.EPERM
	case max > f.nrOpen:
		return syscall.EPERM
	}
	if !f.ignore {
		f.cur, f.max = cur, max
	}
	return nil
}

func TestSoakFDs(t *testing.T) {
	if got, want := SoakFDs(10000), uint64(10000*4+4096); got != want {
		t.Errorf("SoakFDs(10000) = %d, want %d", got, want)
	}
	for _, tt := range []struct {
		limit uint64
		want  int
	}{{20000, 3976}, {4096, 0}, {100, 0}, {SoakFDs(10000), 10000}, {SoakFDs(10000) - 1, 9999}} {
		if got := soakStreamsFor(tt.limit); got != tt.want {
			t.Errorf("soakStreamsFor(%d) = %d, want %d", tt.limit, got, tt.want)
		}
	}
}

func TestRaiseFDLimit(t *testing.T) {
	need := SoakFDs(10000)
	tests := []struct {
		name             string
		f                fakeLimit
		wantErr          bool
		wantCur, wantMax uint64
		wantSets         int
		wantInErr        []string
	}{
		{name: "already enough", f: fakeLimit{cur: 1 << 20, max: 1 << 20, nrOpen: 1 << 20}, wantCur: 1 << 20, wantMax: 1 << 20},
		{name: "soft up to hard, unprivileged", f: fakeLimit{cur: 1024, max: 1 << 16, nrOpen: 1 << 20}, wantCur: need, wantMax: 1 << 16, wantSets: 1},
		{name: "root raises the hard limit", f: fakeLimit{cur: 20000, max: 20000, nrOpen: 1 << 20, root: true}, wantCur: need, wantMax: need, wantSets: 1},
		{name: "not root: refused, naming the limit and what it allows", f: fakeLimit{cur: 20000, max: 20000, nrOpen: 1 << 20},
			wantErr: true, wantCur: 20000, wantMax: 20000, wantSets: 1,
			wantInErr: []string{"10000 streams", "≥ 44096", "limit is 20000 (hard 20000)", "at most 3976 streams", "operation not permitted"}},
		{name: "root past nr_open: refused", f: fakeLimit{cur: 20000, max: 20000, nrOpen: 30000, root: true},
			wantErr: true, wantCur: 20000, wantMax: 20000, wantSets: 1, wantInErr: []string{"at most 3976 streams"}},
		{name: "a set that does not apply is refused", f: fakeLimit{cur: 20000, max: 1 << 20, nrOpen: 1 << 20, ignore: true},
			wantErr: true, wantCur: 20000, wantMax: 1 << 20, wantSets: 1, wantInErr: []string{"reads 20000", "at most 3976 streams"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.f
			_, err := raiseFDLimit(&f, 10000)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, ErrFDLimit) {
				t.Errorf("err = %v, want ErrFDLimit", err)
			}
			for _, s := range tt.wantInErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
			if f.cur != tt.wantCur || f.max != tt.wantMax || f.sets != tt.wantSets {
				t.Errorf("limit %d/%d after %d sets, want %d/%d after %d", f.cur, f.max, f.sets, tt.wantCur, tt.wantMax, tt.wantSets)
			}
		})
	}
}

// TestSoakFDsHTTP2: multiplexed, 10,000 streams fit the 20,000 limit that
// refuses them over HTTP/1.1, and the refusal logic holds per mode.
func TestSoakFDsHTTP2(t *testing.T) {
	h2 := SoakFDsHTTP2(10000, 16)
	if h2 >= 20000 || h2 <= fdsBase {
		t.Errorf("SoakFDsHTTP2(10000, 16) = %d, want within (%d, 20000)", h2, fdsBase)
	}
	if h1 := SoakFDs(10000); h1 <= 20000 {
		t.Errorf("SoakFDs(10000) = %d, want > 20000", h1)
	}
	if SoakFDsHTTP2(20000, 16) <= h2 {
		t.Errorf("SoakFDsHTTP2 does not grow with streams")
	}
}
