// Package tlsconfig builds the TLS configurations of kvgate's gRPC hops from
// files named by flags: servers (ext_proc, local router) with optional mutual
// TLS, clients (of local routers, etcd, NATS), and a self-signed certificate
// for -secure-serving. Certificates and keys are re-read when their files
// change, at the next handshake: a rotation needs no restart and drops no
// open connection (a connection keeps the certificate it was made with).
// Peer identities (DNS SANs and the common name of a verified client
// certificate) are what authorisation looks at.
package tlsconfig

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/kvgate/kvgate/lib/config"
)

// Server is a TLS server's configuration (flags -tls-cert-file,
// -tls-key-file, -tls-client-ca-file, -secure-serving).
type Server struct {
	// CertFile and KeyFile are the PEM certificate chain and key served.
	CertFile, KeyFile string
	// ClientCAFile, when set, turns on mutual TLS: clients must present a
	// certificate signed by one of its CAs.
	ClientCAFile string
	// SecureServing without files serves a self-signed certificate
	// generated at start.
	SecureServing bool
}

// Enabled reports whether the server serves TLS.
func (s Server) Enabled() bool { return s.SecureServing || s.CertFile != "" || s.KeyFile != "" }

// MutualTLS reports whether client certificates are required.
func (s Server) MutualTLS() bool { return s.ClientCAFile != "" }

// Flags defines the server's flags on fs.
func (s *Server) Flags(fs *config.FlagSet) {
	fs.StringVar(&s.CertFile, "tls-cert-file", s.CertFile, "PEM certificate (chain) served over TLS; re-read when the file changes")
	fs.StringVar(&s.KeyFile, "tls-key-file", s.KeyFile, "PEM private key of -tls-cert-file")
	fs.StringVar(&s.ClientCAFile, "tls-client-ca-file", s.ClientCAFile, "PEM CA bundle: require client certificates signed by it (mutual TLS)")
	fs.BoolVar(&s.SecureServing, "secure-serving", s.SecureServing, "serve TLS; without -tls-cert-file, with a self-signed certificate generated at start")
}

// Validate reports an incomplete configuration.
func (s Server) Validate() error {
	switch {
	case (s.CertFile == "") != (s.KeyFile == ""):
		return errors.New("-tls-cert-file and -tls-key-file go together")
	case s.ClientCAFile != "" && !s.Enabled():
		return errors.New("-tls-client-ca-file needs TLS: set -tls-cert-file and -tls-key-file, or -secure-serving")
	}
	return nil
}

// Config returns the server's TLS configuration. Files are read now (an
// error names the file) and again at each handshake after they change; a
// file that became unreadable keeps the last good certificate (logged).
func (s Server) Config(log *slog.Logger) (*tls.Config, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	var certs func() (*tls.Certificate, error)
	if s.CertFile != "" {
		kp := &keyPair{certFile: s.CertFile, keyFile: s.KeyFile, log: log}
		if _, err := kp.get(); err != nil {
			return nil, err
		}
		certs = kp.get
	} else {
		c, err := SelfSigned(nil, time.Now())
		if err != nil {
			return nil, err
		}
		certs = func() (*tls.Certificate, error) { return c, nil }
	}
	var cas *caPool
	if s.ClientCAFile != "" {
		cas = &caPool{file: s.ClientCAFile, log: log}
		if _, err := cas.get(); err != nil {
			return nil, err
		}
	}
	base := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c, err := certs()
		if err != nil {
			return nil, err
		}
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}, Certificates: []tls.Certificate{*c}}
		if cas != nil {
			pool, err := cas.get()
			if err != nil {
				return nil, err
			}
			cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
		}
		return cfg, nil
	}
	return base, nil
}

// Client is a TLS client's configuration: the CA to trust, the client
// certificate for mutual TLS, and the name expected of the server.
type Client struct {
	CAFile, CertFile, KeyFile string
	// ServerName overrides the name verified in the server's certificate
	// (default: the host dialled).
	ServerName string
}

// Enabled reports whether the client uses TLS.
func (c Client) Enabled() bool { return c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" }

// Flags defines -<prefix>-ca-file, -<prefix>-cert-file, -<prefix>-key-file
// (and -<prefix>-server-name when serverName) on fs; what says whose
// server it is, for the usage.
func (c *Client) Flags(fs *config.FlagSet, prefix, what string, serverName bool) {
	fs.StringVar(&c.CAFile, prefix+"-ca-file", c.CAFile, "PEM CA bundle trusted for "+what+" (sets TLS on)")
	fs.StringVar(&c.CertFile, prefix+"-cert-file", c.CertFile, "PEM client certificate presented to "+what+" (mutual TLS; re-read when it changes)")
	fs.StringVar(&c.KeyFile, prefix+"-key-file", c.KeyFile, "PEM private key of -"+prefix+"-cert-file")
	if serverName {
		fs.StringVar(&c.ServerName, prefix+"-server-name", c.ServerName, "name expected in "+what+"' certificates (default: the host dialled)")
	}
}

// Config returns the client's TLS configuration, nil when TLS is off.
func (c Client) Config(log *slog.Logger) (*tls.Config, error) {
	if !c.Enabled() {
		return nil, nil
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, fmt.Errorf("client certificate %q and key %q go together", c.CertFile, c.KeyFile)
	}
	if log == nil {
		log = slog.Default()
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if c.CAFile != "" {
		pool, err := (&caPool{file: c.CAFile, log: log}).get()
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if c.CertFile != "" {
		kp := &keyPair{certFile: c.CertFile, keyFile: c.KeyFile, log: log}
		if _, err := kp.get(); err != nil {
			return nil, err
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return kp.get() }
	}
	return cfg, nil
}

// keyPair is a certificate and key re-read when either file changes. The
// files are read at each handshake and compared with the last good
// contents (a few KiB; connections are long-lived, handshakes rare), so a
// rewrite is seen even when it keeps the size and modification time.
type keyPair struct {
	certFile, keyFile string
	log               *slog.Logger

	mu         sync.Mutex
	certPEM    []byte
	keyPEM     []byte
	cert       *tls.Certificate
	lastFailed []byte
}

func (k *keyPair) get() (*tls.Certificate, error) {
	c, cerr := os.ReadFile(k.certFile)
	key, kerr := os.ReadFile(k.keyFile)
	k.mu.Lock()
	defer k.mu.Unlock()
	if cerr == nil && kerr == nil && k.cert != nil && bytes.Equal(c, k.certPEM) && bytes.Equal(key, k.keyPEM) {
		return k.cert, nil
	}
	err := errors.Join(cerr, kerr)
	var pair tls.Certificate
	if err == nil {
		pair, err = tls.X509KeyPair(c, key)
	}
	if err != nil {
		err = fmt.Errorf("tls certificate %s, key %s: %w", k.certFile, k.keyFile, err)
		if k.cert == nil {
			return nil, err
		}
		// Mid-rotation (the certificate written, not yet its key) or a
		// broken file: keep serving the last good pair, logged once per
		// version.
		if !bytes.Equal(c, k.lastFailed) {
			k.log.Error("keeping the previous tls certificate", "err", err)
			k.lastFailed = c
		}
		return k.cert, nil
	}
	if pair.Leaf == nil && len(pair.Certificate) > 0 {
		pair.Leaf, _ = x509.ParseCertificate(pair.Certificate[0])
	}
	if k.cert != nil {
		k.log.Info("tls certificate reloaded", "file", k.certFile)
	}
	k.cert, k.certPEM, k.keyPEM = &pair, c, key
	return k.cert, nil
}

// caPool is a CA bundle re-read when its file changes.
type caPool struct {
	file string
	log  *slog.Logger

	mu   sync.Mutex
	pem  []byte
	pool *x509.CertPool
}

func (c *caPool) get() (*x509.CertPool, error) {
	b, rerr := os.ReadFile(c.file)
	c.mu.Lock()
	defer c.mu.Unlock()
	if rerr == nil && c.pool != nil && bytes.Equal(b, c.pem) {
		return c.pool, nil
	}
	pool, err := parseCAs(c.file, b, rerr)
	if err != nil {
		if c.pool == nil {
			return nil, err
		}
		c.log.Error("keeping the previous CA bundle", "err", err)
		return c.pool, nil
	}
	c.pool, c.pem = pool, b
	return pool, nil
}

// LoadCAs reads a PEM CA bundle.
func LoadCAs(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	return parseCAs(file, b, err)
}

func parseCAs(file string, b []byte, err error) (*x509.CertPool, error) {
	if err != nil {
		return nil, fmt.Errorf("tls CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("tls CA bundle %s: no PEM certificate in it", file)
	}
	return pool, nil
}

// PeerNames returns what identifies the holder of cert, for
// -authorized-clients: its subject alternative names when it has any (DNS
// names, and URIs such as SPIFFE IDs, as written), its common name only
// when it has none. A certificate with SANs is named by them alone: a CA
// that signs "CN=kvgate-extproc, DNS:tenant-a.example" has vouched for
// tenant-a, not for kvgate-extproc. This is the rule of Go's crypto/x509
// (the CN is no host name once SANs exist, RFC 6125 §6.4.4), of
// Kubernetes' serving certificates and of Envoy's match_subject_alt_names
// (envoyproxy/envoy source/common/tls/cert_validator/default_validator.cc,
// 22fecd20f2d139d305b6b5f6e45e50d64a9a9146).
// An IP or e-mail SAN names nothing here but still retires the CN.
func PeerNames(cert *x509.Certificate) []string {
	names := append([]string(nil), cert.DNSNames...)
	for _, u := range cert.URIs {
		names = append(names, u.String())
	}
	hasSANs := len(names) > 0 || len(cert.IPAddresses) > 0 || len(cert.EmailAddresses) > 0
	if !hasSANs && cert.Subject.CommonName != "" {
		names = append(names, cert.Subject.CommonName)
	}
	return names
}

// SelfSigned returns a certificate for localhost, 127.0.0.1, ::1, the host
// name and extra names, signed by itself, valid for a year from now.
func SelfSigned(extra []string, now time.Time) (*tls.Certificate, error) {
	ca, err := NewCA("kvgate self-signed", now, now.Add(365*24*time.Hour))
	if err != nil {
		return nil, err
	}
	return ca.Issue("kvgate", append(DefaultHosts(), extra...), now, now.Add(365*24*time.Hour))
}

// DefaultHosts are the names a locally served certificate covers.
func DefaultHosts() []string {
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	if h, err := os.Hostname(); err == nil && h != "" {
		hosts = append(hosts, h)
	}
	return hosts
}

// CA is a certificate authority in memory, for self-signed serving,
// `kvgate up -secure-serving`, and tests.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	PEM  []byte
}

// NewCA makes a CA valid from notBefore to notAfter.
func NewCA(name string, notBefore, notAfter time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("tls: generate CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             notBefore.Add(-time.Minute),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("tls: create CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Issue makes a certificate for name (its common name) and hosts (DNS
// names or IP addresses), usable by servers and clients alike.
func (ca *CA) Issue(name string, hosts []string, notBefore, notAfter time.Time) (*tls.Certificate, error) {
	certPEM, keyPEM, err := ca.IssuePEM(name, hosts, notBefore, notAfter)
	if err != nil {
		return nil, err
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	return &c, nil
}

// IssuePEM is Issue returning the PEM certificate chain and key.
func (ca *CA) IssuePEM(name string, hosts []string, notBefore, notAfter time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: generate key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    notBefore.Add(-time.Minute),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: issue %s: %w", name, err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	var chain bytes.Buffer
	_ = pem.Encode(&chain, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	return chain.Bytes(), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), nil
}

// WriteFiles issues a certificate for name and hosts, valid for a year,
// and writes it as dir/<base>.crt and dir/<base>.key (mode 0600); it
// returns the two paths.
func (ca *CA) WriteFiles(dir, base, name string, hosts []string) (certFile, keyFile string, err error) {
	now := time.Now()
	c, k, err := ca.IssuePEM(name, hosts, now, now.Add(365*24*time.Hour))
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, base+".crt"), filepath.Join(dir, base+".key")
	if err := os.WriteFile(certFile, c, 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, k, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}
