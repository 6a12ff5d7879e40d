package config

import (
	"fmt"
	"net"
	"strings"
)

// ListenKind is the Kind, in a usage, of every listen-address flag.
const ListenKind = "listen-address"

// ListenHost is the host a listen address without one gets: a port alone
// (":9002") listens on loopback, as every default does. Binding every
// interface is written out: 0.0.0.0:9002 (IPv4), [::]:9002 (IPv6 and,
// on a dual-stack host, IPv4). Go's net reads ":9002" as every interface;
// kvgate does not, so that no spelling of an address exposes a port by
// accident (docs/security.md, "Addresses").
const ListenHost = "127.0.0.1"

// ListenAddr is the address to listen on for addr, a listen flag's value:
// "" stays "" (the flag's own meaning: off, or its default), a port alone
// gets ListenHost, anything else is as written. Every listener of every
// kvgate process goes through it (runner.Listen, kvgate up, the mocker).
func ListenAddr(addr string) string {
	addr = strings.TrimSpace(addr)
	if strings.HasPrefix(addr, ":") {
		return ListenHost + addr
	}
	return addr
}

// Listen is a listen-address flag on *p: a value is stored as ListenAddr
// reads it, so the configuration, its logs and its status pages show the
// host that is bound, and a value without a port is refused.
func Listen(p *string) *Value {
	return &Value{
		Kind: ListenKind,
		SetFunc: func(s string) error {
			a := ListenAddr(s)
			if a != "" {
				if _, _, err := net.SplitHostPort(a); err != nil {
					return fmt.Errorf("want host:port or :port, got %q", s)
				}
			}
			*p = a
			return nil
		},
		GetFunc: func() string { return *p },
	}
}
