package extprocd

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/localrouter/client"
	"github.com/kvgate/kvgate/pool/pooltest"
)

func TestSubtreeFlags(t *testing.T) {
	env := func(string) string { return "" }
	o, err := parseFlags("extproc", []string{"-config", "p.yaml", "-subtree-listen", ":9300", "-subtree-pool", "region-a", "-etcd", "127.0.0.1:2379", "-subtree-max-depth", "4"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Subtree.Enabled() || o.Subtree.ListenAddr() != "127.0.0.1:9300" || o.Subtree.Pool != "region-a" || o.Subtree.MaxDepth != 4 {
		t.Errorf("subtree = %+v", o.Subtree)
	}
	if o, err := parseFlags("extproc", []string{"-config", "p.yaml", "-subtree-listen", ":9300", "-anonymous-commit-expiry", "-1s", "-subtree-router-id", "r"}, env, io.Discard); err != nil || o.Subtree.AnonymousCommitExpiry >= 0 {
		t.Errorf("-anonymous-commit-expiry -1s (off, as its usage says): %v, %v", o.Subtree.AnonymousCommitExpiry, err)
	}
	var warned strings.Builder
	if _, err := parseFlags("extproc", []string{"-config", "p.yaml", "-etcd-ca-file", "ca.pem"}, env, &warned); err != nil || !strings.Contains(warned.String(), "warning: -etcd-ca-file set but not read: read by the etcd client only, and there is no -etcd\n") {
		t.Errorf("-etcd-ca-file without -etcd: %v, output %q", err, warned.String())
	}
	if _, err := parseFlags("extproc", []string{"-config", "p.yaml"}, func(k string) string { return map[string]string{"KVGATE_SUBTREE_MODEL": "m"}[k] }, io.Discard); err == nil || !strings.Contains(err.Error(), "KVGATE_SUBTREE_MODEL set but not read") {
		t.Errorf("KVGATE_SUBTREE_MODEL without -subtree-listen: %v", err)
	}
	if o, err := parseFlags("extproc", []string{"-config", "p.yaml"}, env, io.Discard); err != nil || o.Subtree.Enabled() {
		t.Errorf("the subtree is off by default: %+v, %v", o.Subtree, err)
	}
	for args, want := range map[string]string{
		"-subtree-pool region-a":                       "needs -subtree-listen",
		"-subtree-listen :9300 -subtree-pool region-a": "-subtree-pool: needs -etcd",
		"-subtree-listen 127.0.0.1":                    "-subtree-listen",
		// Every -subtree-* flag is read by the service alone; the
		// registration's only with -subtree-pool; -authorized-clients
		// only under mutual TLS.
		"-subtree-max-depth 4":                           "-subtree-max-depth set but not read: the subtree service is off",
		"-subtree-model m -subtree-router-id r":          "-subtree-model, -subtree-router-id set but not read",
		"-authorized-clients a":                          "-authorized-clients set but not read: the subtree service is off",
		"-anonymous-commit-expiry 0":                     "-anonymous-commit-expiry set but not read",
		"-subtree-listen :9300 -subtree-register-ttl 5s": "-subtree-register-ttl set but not read: they shape the subtree's etcd registration, made only with -subtree-pool",
		"-subtree-listen :9300 -subtree-block-size 16":   "-subtree-block-size set but not read",
		"-subtree-listen :9300 -authorized-clients a":    "-authorized-clients set but not read: it authorises callers by their client certificates",
		"-otlp-insecure=false":                           "-otlp-insecure set but not read: traces are sent only with -otlp-endpoint",
	} {
		_, err := parseFlags("extproc", append([]string{"-config", "p.yaml"}, strings.Fields(args)...), env, io.Discard)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", args, err, want)
		}
	}
}

// freeAddr is a loopback address nothing listens on (just closed).
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestRunServesSubtree: `kvgate extproc -subtree-listen` answers the local
// router's probe for its pools (the worker id qualified by its pool), and
// refuses a configuration that routes to its own subtree address.
func TestRunServesSubtree(t *testing.T) {
	ctx := testenv.Context(t)
	lr := pooltest.Start(t, "pool-a", 16, pooltest.Workers("a", 2)...)
	saddr := freeAddr(t)
	o, err := parseFlags("extproc", []string{"-config", writePools(t, t.TempDir(), lr.Addr), "-addr", "127.0.0.1:0", "-subtree-listen", saddr, "-config-watch", "-1s"}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := startRun(ctx, o, lis, nil)
	c, err := client.Dial(saddr, []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var sel routing.Selection
	testenv.Eventually(t, 10*time.Second, func() (string, bool) {
		sel, err = c.BestWorker(ctx, client.HashPrompt([]uint64{1, 2, 3}, 16), client.BestWorkerOptions{})
		return fmt.Sprint(err), err == nil
	})
	if !strings.HasPrefix(sel.WorkerID, "pool-a/a-") || sel.BlockSize != 16 {
		t.Errorf("probe through the subtree = %+v, want a worker of pool-a, qualified", sel)
	}
	if err := stop(); err != nil {
		t.Errorf("run: %v", err)
	}

	// A configuration whose pool is this router's own subtree.
	loop, err := parseFlags("extproc", []string{"-config", writePools(t, t.TempDir(), saddr), "-addr", "127.0.0.1:0", "-subtree-listen", saddr}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	lis2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := startRun(ctx, loop, lis2, nil)(); err == nil || !strings.Contains(err.Error(), "routing loop") {
		t.Errorf("run over its own subtree: %v, want a routing loop refusal", err)
	}
}
