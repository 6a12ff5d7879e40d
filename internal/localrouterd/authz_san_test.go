package localrouterd

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/internal/tlsconfig"
)

// x509PKI issues certificates with crypto/x509 directly, so a test can
// give a client certificate any subject and SANs.
type x509PKI struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caFile string
	serial int64
}

func newX509PKI(t *testing.T) *x509PKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "authz test CA"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	p := &x509PKI{dir: t.TempDir(), ca: ca, caKey: key, serial: 1}
	p.caFile = filepath.Join(p.dir, "ca.crt")
	if err := os.WriteFile(p.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// issue writes a certificate (and its key) for the given subject and SANs.
func (p *x509PKI) issue(t *testing.T, file, cn string, dns []string, ips []net.IP, uris []string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		DNSNames: dns, IPAddresses: ips,
	}
	for _, u := range uris {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(p.dir, file+".crt"), filepath.Join(p.dir, file+".key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestAuthorizedClientsBySAN: a client certificate is named by its SANs
// when it has any, by its common name only when it has none (Go's
// crypto/x509, Kubernetes, Envoy's match_subject_alt_names). Over a real
// mutual-TLS gRPC connection to a local router, a certificate whose CN is
// authorised but whose SANs are not is refused a lifecycle call.
func TestAuthorizedClientsBySAN(t *testing.T) {
	const name = "kvgate-extproc"
	const spiffe = "spiffe://cluster.local/ns/kvgate/sa/extproc"
	e := newEnv(t)
	p := newX509PKI(t)
	srvCert, srvKey := p.issue(t, "server", "localrouter", []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")}, nil, x509.ExtKeyUsageServerAuth)
	cfg := e.config("san")
	cfg.TLS = tlsconfig.Server{CertFile: srvCert, KeyFile: srvKey, ClientCAFile: p.caFile}
	cfg.AuthorizedClients = []string{name, spiffe}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	svc, err := Start(ctx, cfg, Deps{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close(context.Background())

	for _, tc := range []struct {
		name    string
		cn      string
		dns     []string
		ips     []net.IP
		uris    []string
		allowed bool
	}{
		{name: "CN only, authorised", cn: name, allowed: true},
		{name: "CN only, not authorised", cn: "someone"},
		{name: "DNS SAN authorised", cn: "anything", dns: []string{name}, allowed: true},
		{name: "DNS SAN authorised among others", dns: []string{"other.example", name}, allowed: true},
		{name: "CN authorised, DNS SAN not", cn: name, dns: []string{"tenant-a.example"}},
		{name: "CN authorised, IP SAN only", cn: name, ips: []net.IP{net.ParseIP("10.0.0.7")}},
		{name: "CN authorised, URI SAN not", cn: name, uris: []string{"spiffe://cluster.local/ns/other/sa/x"}},
		{name: "URI SAN (SPIFFE) authorised", cn: "x", uris: []string{spiffe}, allowed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cf, kf := p.issue(t, "client", tc.cn, tc.dns, tc.ips, tc.uris, x509.ExtKeyUsageClientAuth)
			c := (&testPKI{caFile: p.caFile, clients: map[string][2]string{"c": {cf, kf}}}).dial(t, svc.GRPCAddr(), "c")
			_, err := c.Free(ctx, &localrouterv1.FreeRequest{RequestId: "unknown"})
			switch {
			case tc.allowed && status.Code(err) != codes.NotFound:
				t.Errorf("Free: %v, want past authorisation to the handler's NotFound", err)
			case !tc.allowed && status.Code(err) != codes.PermissionDenied:
				t.Errorf("Free: %v, want PermissionDenied", err)
			}
			// A probe stays open to every verified client.
			if _, err := c.Workers(ctx, &localrouterv1.WorkersRequest{}); err != nil {
				t.Errorf("Workers: %v", err)
			}
		})
	}
}
