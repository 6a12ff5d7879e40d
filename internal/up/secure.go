package up

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/kvgate/kvgate/internal/tlsconfig"
)

// secureClientName is the certificate name of the global router, the one
// client the local routers authorise for lifecycle calls.
const secureClientName = "kvgate-extproc"

// secure is `kvgate up -secure-serving`'s PKI: a CA made at start, a
// server certificate for the ext_proc server and the local routers, and a
// client certificate for the global router; the files live in dir.
type secure struct {
	dir, caFile   string
	cliCert       string // the global router's client certificate and key:
	cliKey        string // what a local router's mutual TLS asks of a client
	routerServer  tlsconfig.Server
	routerClient  credentials.TransportCredentials
	extprocServer credentials.TransportCredentials
	extprocClient credentials.TransportCredentials
}

func newSecure(host string) (_ *secure, err error) {
	dir, err := os.MkdirTemp("", "kvgate-up-tls-")
	if err != nil {
		return nil, fmt.Errorf("secure serving: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	now := time.Now()
	ca, err := tlsconfig.NewCA("kvgate up CA", now, now.Add(365*24*time.Hour))
	if err != nil {
		return nil, err
	}
	s := &secure{dir: dir, caFile: filepath.Join(dir, "ca.crt")}
	if err := os.WriteFile(s.caFile, ca.PEM, 0o600); err != nil {
		return nil, fmt.Errorf("secure serving: %w", err)
	}
	hosts := append([]string{host}, tlsconfig.DefaultHosts()...)
	srvCert, srvKey, err := ca.WriteFiles(dir, "server", "kvgate-server", hosts)
	if err != nil {
		return nil, err
	}
	cliCert, cliKey, err := ca.WriteFiles(dir, "extproc-client", secureClientName, []string{secureClientName})
	if err != nil {
		return nil, err
	}
	s.cliCert, s.cliKey = cliCert, cliKey
	s.routerServer = tlsconfig.Server{CertFile: srvCert, KeyFile: srvKey, ClientCAFile: s.caFile}
	xs, err := (tlsconfig.Server{CertFile: srvCert, KeyFile: srvKey}).Config(nil)
	if err != nil {
		return nil, err
	}
	rc, err := (tlsconfig.Client{CAFile: s.caFile, CertFile: cliCert, KeyFile: cliKey}).Config(nil)
	if err != nil {
		return nil, err
	}
	xc, err := (tlsconfig.Client{CAFile: s.caFile}).Config(nil)
	if err != nil {
		return nil, err
	}
	s.extprocServer, s.routerClient, s.extprocClient = credentials.NewTLS(xs), credentials.NewTLS(rc), credentials.NewTLS(xc)
	return s, nil
}
