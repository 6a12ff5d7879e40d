// Command etcdctl is the docwalk test's stand-in for etcd's etcdctl (not
// installed by make test): the two calls the documents make, `get
// [--prefix] KEY` and `put KEY VALUE`, against $ETCDCTL_ENDPOINTS, printed
// as etcdctl prints them (key, then value, one a line). Anything else is
// refused, so a document using more fails the walk until this grows.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/runner"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "etcdctl (docwalk stand-in):", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	eps := os.Getenv("ETCDCTL_ENDPOINTS")
	prefix := false
	var rest []string
	for _, a := range args {
		switch {
		case a == "--prefix":
			prefix = true
		case strings.HasPrefix(a, "--endpoints="):
			eps = strings.TrimPrefix(a, "--endpoints=")
		case strings.HasPrefix(a, "-"):
			return fmt.Errorf("flag %s not supported", a)
		default:
			rest = append(rest, a)
		}
	}
	if eps == "" {
		return errors.New("no endpoints: set ETCDCTL_ENDPOINTS")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli, err := runner.Etcd{Endpoints: strings.Split(eps, ",")}.Client(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	switch {
	case len(rest) == 2 && rest[0] == "get":
		var opts []clientv3.OpOption
		if prefix {
			opts = append(opts, clientv3.WithPrefix())
		}
		resp, err := cli.Get(ctx, rest[1], opts...)
		if err != nil {
			return err
		}
		for _, kv := range resp.Kvs {
			fmt.Printf("%s\n%s\n", kv.Key, kv.Value)
		}
		return nil
	case len(rest) == 3 && rest[0] == "put" && !prefix:
		if _, err := cli.Put(ctx, rest[1], rest[2]); err != nil {
			return err
		}
		fmt.Println("OK")
		return nil
	}
	return fmt.Errorf("only get [--prefix] KEY and put KEY VALUE are supported, not %q", args)
}
