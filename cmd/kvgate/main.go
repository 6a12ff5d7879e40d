// Command kvgate is the one binary of the project: a KV-cache-aware router
// for LLM inference behind Envoy. Each subcommand lives in its own file and
// hands off to a package at once; main only parses the subcommand name.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvgate/kvgate/internal/loadbench"
)

// command is one subcommand: its name, a one-line summary, and its entry
// point, which receives the arguments after the subcommand name.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string) error
}

func commands() []command {
	return []command{
		{"up", "start the whole system locally (embedded etcd and NATS, mock workers, routers, gateway)", runUp},
		{"extproc", "run the global router: the Envoy ext_proc server", runExtproc},
		{"localrouter", "run one pool's local router (gRPC)", runLocalRouter},
		{"mocker", "run a simulated inference engine (OpenAI API, KV events)", runMocker},
		{"relay", "relay a vLLM/SGLang ZMQ KV-event stream to NATS", runRelay},
		{"replay", "replay a trace against simulated workers: compare policies, replay a configuration (--config), sweep parameters (--sweep)", runReplay},
		{"tokenize", "print the token ids and block hashes the router computes for a request body (stdin)", runTokenize},
		{"bench", "run the built-in micro-benchmarks and print the figures (-chaos: the load-and-chaos run)", runBench},
		{"policy", "check a global router configuration (the chain it builds, each pool's policy section; exit status 0/1/2), or replay it on a trace", runPolicy},
		{"version", "print the module version and the VCS revision this binary was built from", runVersion},
	}
}

func main() {
	// `kvgate bench -probe -probe-server-process` re-executes this binary
	// as its local-router process.
	if loadbench.ServeChild() {
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:])
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "kvgate:", err)
	}
	os.Exit(exitStatus(err))
}

// exitStatus is the process's exit status after err: 0 success or -h, 2
// bad usage, 1 any other failure.
func exitStatus(err error) int {
	var ue *usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		return 2
	}
	return 1
}

// run runs the subcommand args name. No subcommand is bad usage (the
// usage, exit status 2); -h, --help and help print it (exit status 0), and
// `help SUBCOMMAND` is `SUBCOMMAND -h`.
func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		usage(os.Stderr)
		return &usageError{errors.New("no subcommand given")}
	}
	switch args[0] {
	case "-h", "-help", "--help":
		usage(os.Stderr)
		return flag.ErrHelp
	case "help":
		if len(args) == 1 {
			usage(os.Stderr)
			return flag.ErrHelp
		}
		args = []string{args[1], "-h"}
	}
	for _, c := range commands() {
		if c.name == args[0] {
			if err := c.run(ctx, args[1:]); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			return nil
		}
	}
	usage(os.Stderr)
	return &usageError{fmt.Errorf("unknown subcommand %q", args[0])}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: kvgate <subcommand> [flags]   (kvgate <subcommand> -h for its flags)\n\nsubcommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-12s %s\n", c.name, c.summary)
	}
}
