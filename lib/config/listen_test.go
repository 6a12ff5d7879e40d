package config

import (
	"net"
	"testing"
)

func TestListen(t *testing.T) {
	for in, want := range map[string]string{
		":9002": "127.0.0.1:9002", "0.0.0.0:9002": "0.0.0.0:9002", "[::]:9002": "[::]:9002",
		"127.0.0.1:1": "127.0.0.1:1", "localhost:1": "localhost:1", "": "", " :5 ": "127.0.0.1:5",
	} {
		var got string
		if err := Listen(&got).Set(in); err != nil || got != want {
			t.Errorf("Listen(%q) = %q, %v, want %q", in, got, err, want)
		}
		if got := ListenAddr(in); got != want {
			t.Errorf("ListenAddr(%q) = %q, want %q", in, got, want)
		}
	}
	var got string
	if err := Listen(&got).Set("9002"); err == nil {
		t.Errorf("Listen(9002) = %q, want an error (no port)", got)
	}
	// A port alone binds loopback, never every interface.
	lis, err := net.Listen("tcp", ListenAddr(":0"))
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	if ip := lis.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
		t.Errorf(":0 listens on %v, want loopback", ip)
	}
}
