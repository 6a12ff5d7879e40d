package extproc_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/tlsconfig"
)

// TestJWTMetadataReachesDecider: the jwt_authn filter's namespace, which
// an EnvoyExtensionPolicy's extProc.metadata.accessibleNamespaces forwards
// in metadata_context, becomes Request.JWTAuthn (tenancy.identity
// jwt-claim reads it); without it JWTAuthn is nil.
func TestJWTMetadataReachesDecider(t *testing.T) {
	d := &deciderDouble{}
	conn, _ := startServer(t, extproc.Config{}, d)
	for _, m := range allModes {
		c := eppClient(t, conn, m, globalrouter.JWTAuthnNamespace)
		payload, err := structpb.NewStruct(map[string]any{"idp": map[string]any{"sub": "u1", "tenant": "team-a"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, md := range []map[string]*structpb.Struct{nil, {globalrouter.JWTAuthnNamespace: payload}} {
			n := len(d.requests())
			if _, err := c.Process(testenv.Context(t), extprocclient.Request{Metadata: md, Message: extprocclient.Message{
				Headers: post("/v1/completions"), Body: [][]byte{[]byte(`{"model":"m1","prompt":"hi"}`)},
			}}); err != nil {
				t.Fatal(err)
			}
			got := d.requests()[n].JWTAuthn
			claim := got.GetFields()["idp"].GetStructValue().GetFields()["tenant"].GetStringValue()
			if md == nil && got != nil || md != nil && claim != "team-a" {
				t.Errorf("%s: metadata %v: Request.JWTAuthn %v", m.name, md, got)
			}
			if d.requests()[n].PeerVerified {
				t.Errorf("%s: PeerVerified over plaintext", m.name)
			}
		}
	}
}

// TestPeerVerifiedOverMutualTLS: a stream over the ext_proc listener's
// mutual TLS (a client certificate the server verified) is PeerVerified,
// the Envoy that may vouch for the identity it forwards; over TLS without
// a client certificate it is not.
func TestPeerVerifiedOverMutualTLS(t *testing.T) {
	now := time.Now()
	ca, err := tlsconfig.NewCA("test-ca", now, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	srvCert, err := ca.Issue("extproc", []string{"127.0.0.1"}, now, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	cliCert, err := ca.Issue("envoy", []string{"envoy.gateway"}, now, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	d := &deciderDouble{}
	srv, err := extproc.New(extproc.Config{}, d, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	stc := &tls.Config{Certificates: []tls.Certificate{*srvCert}, ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12}
	go func() { done <- srv.Serve(ctx, lis, grpc.Creds(credentials.NewTLS(stc))) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	for _, tc := range []struct {
		name string
		cert []tls.Certificate
		want bool
	}{{"client certificate", []tls.Certificate{*cliCert}, true}, {"none", nil, false}} {
		ctc := &tls.Config{RootCAs: pool, Certificates: tc.cert, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
		conn, err := grpc.NewClient(lis.Addr().String(), append(extprocclient.DialOptions(), grpc.WithTransportCredentials(credentials.NewTLS(ctc)))...)
		if err != nil {
			t.Fatal(err)
		}
		n := len(d.requests())
		_, err = envoyClient(t, conn, allModes[0]).Process(testenv.Context(t), extprocclient.Request{Message: extprocclient.Message{
			Headers: post("/v1/completions"), Body: [][]byte{[]byte(`{"model":"m1","prompt":"hi"}`)},
		}})
		conn.Close()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := d.requests()[n].PeerVerified; got != tc.want {
			t.Errorf("%s: PeerVerified %v, want %v", tc.name, got, tc.want)
		}
	}
}
