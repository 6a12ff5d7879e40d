package mockerd

import "testing"

func TestOffsetEndpoint(t *testing.T) {
	for _, tc := range []struct {
		in   string
		rank int
		want string
		ok   bool
	}{
		{"tcp://*:5557", 0, "tcp://*:5557", true},
		{"tcp://*:5557", 1, "tcp://*:5558", true},
		{"tcp://127.0.0.1:0", 3, "tcp://127.0.0.1:0", true},
		{"tcp://[::1]:6000", 2, "tcp://[::1]:6002", true},
		{"ipc:///tmp/kv", 1, "", false},
		{"tcp://h:65535", 1, "", false},
		{"tcp://h:port", 1, "", false},
	} {
		got, err := offsetEndpoint(tc.in, tc.rank)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("offsetEndpoint(%q, %d) = %q, %v; want %q (ok %v)", tc.in, tc.rank, got, err, tc.want, tc.ok)
		}
	}
}
