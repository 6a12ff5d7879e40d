// Package app is the kvgate binary as a library: Main runs a subcommand
// (extproc, localrouter, mocker, relay, up, replay, bench, tokenize,
// policy, version) exactly as cmd/kvgate does, and Options add a program's own pool
// policies and worker scorers to the built-ins without copying a process's
// Run (the way grpc-go's ServerOption or Caddy's modules extend a server):
//
//	func main() {
//		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
//		defer stop()
//		os.Exit(app.Main(ctx, os.Args[1:],
//			app.WithPolicy("mine", newMyPolicy),
//			app.WithScorer("gpu-temp", newGPUTempScorer)))
//	}
//
// A policy added with WithPolicy may be named in the configuration's
// chain, a scorer added with WithScorer or WithFilter in a worker chain
// (kvgate localrouter -worker-chain, kvgate up -pool-a-worker-chain, a
// pool's worker_chain), wherever the binary reads them: kvgate extproc,
// localrouter, up, policy check, replay --config and policy replay.
// examples/custompolicy is one.
//
// Each subcommand lives in its own file and hands off to a package at
// once (the processes are internal/*d; cmd/kvgate/main.go only calls
// Main).
//
// Files: app.go (Main, Run, the subcommand table, exit statuses, usage),
// options.go (Option: WithPolicy, WithScorer, WithFilter, and the
// registries they build), extproc.go (kvgate extproc → internal/extprocd),
// localrouter.go (kvgate localrouter → internal/localrouterd), mocker.go
// (kvgate mocker: its flags and tokenizer → internal/mockerd), relay.go
// (kvgate relay → internal/relayd), up.go (kvgate up → internal/up), up_tenancy.go (kvgate up's
// tenancy flags),
// replay.go (kvgate replay: a trace against simulated workers, a global
// router configuration, a sweep), policy.go (kvgate policy check and
// policy replay), bench.go (kvgate bench: the headline figures, the probe,
// decision and soak benches, -chaos), tokenize.go (kvgate tokenize: a
// body's token ids and block hashes), version.go (kvgate version).
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/kvgate/kvgate/internal/loadbench"
)

// command is one subcommand: its name, a one-line summary, and its entry
// point, which receives the arguments after the subcommand name.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string) error
}

func commands(x *extensions) []command {
	return []command{
		{"up", "start the whole system locally (embedded etcd and NATS, mock workers, routers, gateway)", func(ctx context.Context, args []string) error { return runUp(ctx, args, x) }},
		{"extproc", "run the global router: the Envoy ext_proc server", func(ctx context.Context, args []string) error { return runExtproc(ctx, args, x) }},
		{"localrouter", "run one pool's local router (gRPC)", func(ctx context.Context, args []string) error { return runLocalRouter(ctx, args, x) }},
		{"mocker", "run a simulated inference engine (OpenAI API, KV events)", runMocker},
		{"relay", "relay a vLLM/SGLang ZMQ KV-event stream to NATS", runRelay},
		{"replay", "replay a trace against simulated workers: compare policies, replay a configuration (--config), sweep parameters (--sweep)", func(ctx context.Context, args []string) error { return runReplay(ctx, args, x) }},
		{"tokenize", "print the token ids and block hashes the router computes for a request body (stdin)", runTokenize},
		{"bench", "run the built-in micro-benchmarks and print the figures (-chaos: the load-and-chaos run)", runBench},
		{"policy", "check a global router configuration (the chain it builds, each pool's policy section; exit status 0/1/2), or replay it on a trace", func(ctx context.Context, args []string) error { return runPolicy(ctx, args, x) }},
		{"version", "print the module version and the VCS revision this binary was built from", runVersion},
	}
}

// Main runs the subcommand args[0] with args[1:] and returns the process's
// exit status (0 success or -h, 2 bad usage, 1 any other failure), having
// printed the error. opts add policies and scorers to the built-ins.
func Main(ctx context.Context, args []string, opts ...Option) int {
	// `kvgate bench -probe -probe-server-process` re-executes this binary
	// as its local-router process.
	if loadbench.ServeChild() {
		return 0
	}
	err := Run(ctx, args, opts...)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "kvgate:", err)
	}
	return exitStatus(err)
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

// Run runs the subcommand args[0] with args[1:] and returns its error (Main
// without the exit status). No subcommand is bad usage (the usage, exit
// status 2); -h, --help and help print it (flag.ErrHelp, exit status 0),
// and `help SUBCOMMAND` is `SUBCOMMAND -h`.
func Run(ctx context.Context, args []string, opts ...Option) error {
	x, err := newExtensions(opts)
	if err != nil {
		return err
	}
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
	for _, c := range commands(x) {
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
	for _, c := range commands(nil) {
		fmt.Fprintf(w, "  %-12s %s\n", c.name, c.summary)
	}
}
