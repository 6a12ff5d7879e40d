package app

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/policies"
)

// errCheckFailed is `kvgate policy check` finding a bad file (exit status
// 1; the errors are printed already).
var errCheckFailed = errors.New("check failed")

// runPolicy is `kvgate policy SUBCOMMAND`: check (validate a global router
// configuration and show what it builds). Exit status: 0 valid, 1 invalid,
// 2 bad usage.
func runPolicy(ctx context.Context, args []string, x *extensions) error {
	return policyCmd(ctx, x, args, os.Stdout, os.Stderr)
}

const policyUsage = "usage: kvgate policy check [-shadow-config FILE] [-etcd ENDPOINTS] CONFIG (one or more)\n       kvgate policy replay CONFIG --trace T|--generate G [kvgate replay flags]"

func policyCmd(ctx context.Context, x *extensions, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return &usageError{errors.New(policyUsage)}
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stderr, policyUsage+"\n\ncheck: validate each configuration, print what it builds (kvgate policy check -h)\nreplay: replay a configuration on a trace (kvgate policy replay -h)")
		return flag.ErrHelp
	case "check":
		return policyCheck(x, args[1:], stdout, stderr)
	case "replay":
		return policyReplay(ctx, x, args[1:], stdout, stderr)
	}
	return &usageError{fmt.Errorf("unknown policy subcommand %q (want check or replay)", args[0])}
}

// policyReplay is `kvgate policy replay CONFIG [flags]`: kvgate replay
// --config CONFIG [flags], the configuration replayed through the real
// Decide against simulated workers (docs/replay.md).
func policyReplay(ctx context.Context, x *extensions, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		fmt.Fprintln(stderr, "usage: kvgate policy replay CONFIG --trace T|--generate G [kvgate replay flags]\n\nkvgate replay --config CONFIG: the configuration replayed through the real Decide\nagainst simulated workers (docs/replay.md); its flags are kvgate replay's (kvgate replay -h).")
		return flag.ErrHelp
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return &usageError{errors.New("replay: the configuration file comes first: " + policyUsage)}
	}
	for _, a := range args[1:] {
		if a == "--config" || a == "-config" || strings.HasPrefix(a, "--config=") || strings.HasPrefix(a, "-config=") {
			return &usageError{errors.New("replay: the configuration is the first argument; --config does not apply")}
		}
	}
	return replayCmd(ctx, x, "policy replay", append([]string{"--config", args[0]}, args[1:]...), stdout, stderr)
}

func policyCheck(x *extensions, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("policy check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	shadow := fs.String("shadow-config", "", "a shadow file (the candidate chain, as kvgate extproc -shadow-config reads it) to check with each configuration")
	etcd := fs.String("etcd", "", "the etcd endpoints kvgate extproc will be given (as its -etcd): without them, a pool that discovers its routers in etcd (routers.etcd) is warned about, since kvgate extproc refuses to start")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: kvgate policy check [-shadow-config FILE] [-etcd ENDPOINTS] CONFIG...\n\nValidates each global router configuration strictly (errors as file:line:column)\nand prints the chain it builds and what each pool's policy section resolves to.\nExit status: 0 all valid, 1 one is not, 2 bad usage.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{err}
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return &usageError{errors.New("check: no configuration file given")}
	}
	failed := false
	for i, path := range fs.Args() {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		if err := checkConfig(x, path, *shadow, *etcd != "", stdout, stderr); err != nil {
			failed = true
			fmt.Fprintf(stdout, "%s: INVALID\n", path)
			fmt.Fprintf(stderr, "%v\n", err)
		}
	}
	if failed {
		return errCheckFailed
	}
	return nil
}

// checkConfig validates path (with shadowPath's candidate chain when set)
// and prints what it builds; warnings (what kvgate extproc would refuse
// with its flags, withEtcd: -etcd given) go to warn.
func checkConfig(x *extensions, path, shadowPath string, withEtcd bool, w, warn io.Writer) error {
	cfg, err := globalrouter.LoadConfig(path, x.policyRegistry())
	if err != nil {
		return err
	}
	if err := cfg.CheckWorkerChains(localrouter.PoolChainCheck(x.scorerRegistry())); err != nil {
		return err
	}
	if shadowPath != "" {
		sc, err := globalrouter.LoadShadowFile(shadowPath)
		if err != nil {
			return err
		}
		cfg.Shadow = sc
		if err := cfg.Validate(x.policyRegistry()); err != nil {
			return err
		}
	}
	// Files the router would read at start: refused there, refused here.
	for _, m := range cfg.Models {
		for _, f := range []string{m.Tokenizer.Path, m.Tokenizer.ChatTemplate} {
			if f == "" {
				continue
			}
			if _, err := os.Stat(f); err != nil {
				return fmt.Errorf("%s: %w: model %q: tokenizer: %w", path, policies.ErrConfig, m.Name, err)
			}
		}
	}
	for _, why := range cfg.Unread() {
		fmt.Fprintf(warn, "warning: %s\n", why)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s: ok\n", path)
	fmt.Fprintf(&b, "probe: timeout %v, backoff %v..%v\n", cfg.Probe.Timeout, cfg.Probe.BackoffBase, cfg.Probe.BackoffMax)
	if t := cfg.Tenancy; t.Header != "" {
		fmt.Fprintf(&b, "tenancy: header %s, salted %v, identity %s", t.Header, t.Salt, t.Identity)
		switch {
		case t.XFCC != nil && t.XFCC.SAN == "dns":
			fmt.Fprintf(&b, " (the DNS SAN's label before %s)", t.XFCC.Suffix)
		case t.XFCC != nil:
			fmt.Fprintf(&b, " (the URI SAN's segment after %s)", t.XFCC.Prefix)
		case t.JWT != nil:
			fmt.Fprintf(&b, " (claim %s of provider %s's JWT)", t.JWT.Claim, t.JWT.Provider)
		}
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "chain (%d policies, run in order; the last sorts with the strongest key):\n", len(cfg.Chain))
	writeChain(&b, cfg.Chain)
	if len(cfg.Models) > 0 {
		b.WriteString("models:\n")
		for _, m := range cfg.Models {
			tc := cfg.TokenizerFor(m.Name)
			fmt.Fprintf(&b, "  %s: tokenizer %s", m.Name, tc.Backend)
			if tc.Encoding != "" {
				fmt.Fprintf(&b, " %s", tc.Encoding)
			}
			if tc.Path != "" {
				fmt.Fprintf(&b, " %s", tc.Path)
			}
			if m.LoRAOf != "" {
				fmt.Fprintf(&b, " (LoRA adapter of %s)", m.LoRAOf)
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("pools:\n")
	inChain := map[string]bool{}
	for _, s := range cfg.Chain {
		inChain[s.Name] = true
	}
	for _, p := range cfg.Pools {
		fmt.Fprintf(&b, "  %s: role %s, models [%s], block size %d, weight %v\n", p.Name, p.Role, strings.Join(p.Models, " "), p.BlockSize, p.Weight)
		if p.Routers.Etcd {
			b.WriteString("    routers: discovered in etcd (kvgate extproc -etcd)\n")
			if !withEtcd {
				fmt.Fprintf(warn, "warning: %s: pool %q: routers.etcd is set: kvgate extproc needs -etcd ENDPOINTS with this file, and refuses to start without (check with -etcd to say it will have them)\n", path, p.Name)
			}
		} else {
			fmt.Fprintf(&b, "    routers: %s\n", strings.Join(p.Routers.Static, ", "))
		}
		switch {
		case p.PolicyFile != "":
			fmt.Fprintf(&b, "    policy file %s → %s\n", p.PolicyFile, resolvedPolicyFile(path, p.PolicyFile))
		case len(p.Policy) > 0:
			b.WriteString("    policy inline\n")
		default:
			b.WriteString("    no policy section: every policy's defaults\n")
		}
		for _, name := range slices.Sorted(maps.Keys(p.Policy)) {
			sec := p.Policy[name]
			line := ""
			if sec.Node != nil {
				line = fmt.Sprintf(" (%s:%d)", sec.File, sec.Node.Line)
			}
			fmt.Fprintf(&b, "      %s: %s%s\n", name, flow(sec.Node), line)
		}
		if len(p.WorkerChain) > 0 {
			fmt.Fprintf(&b, "    worker chain %s: its local routers take it with kvgate localrouter -pools-file %s -pool %s\n", localrouter.FormatWorkerChain(p.WorkerChain), path, p.Name)
			if e := localrouter.EngineMetricEntries(p.WorkerChain); len(e) > 0 {
				fmt.Fprintf(&b, "    warning: worker chain entries %s read the workers' engine metrics: start the pool's local routers with -router-metrics-period, or they see nothing there\n", strings.Join(e, ", "))
			}
		}
	}
	if sc := cfg.ShadowChain(); sc != nil {
		fmt.Fprintf(&b, "shadow chain (%d policies; ranks alongside the live chain, never commits):\n", len(sc))
		writeChain(&b, cfg.Shadow.Chain)
	} else {
		b.WriteString("shadow chain: none\n")
	}
	if fc := cfg.FlowControl; fc.Enabled {
		var bands []string
		for i, band := range fc.Bands {
			sat := fc.BandSaturation(i)
			mark := fmt.Sprintf("saturated above %d prefill tokens, %d decode tokens", max(sat.MaxPrefillTokens, 0), sat.MaxDecodeTokens)
			if band.MinPriority != nil {
				bands = append(bands, fmt.Sprintf("%s (priority ≥ %d; %s)", band.Name, *band.MinPriority, mark))
			} else {
				bands = append(bands, fmt.Sprintf("%s (%s)", band.Name, mark))
			}
		}
		fmt.Fprintf(&b, "flow control: requests to saturated pools wait (bands %s; %d requests, %d bytes per queue; deadline %v; %s between tenants; 0 tokens: not checked; %d objectives named inline%s)\n",
			strings.Join(bands, " > "), fc.Capacity.Requests, fc.Capacity.Bytes, fc.Deadline, fc.Fairness, len(fc.Objectives), objectivesFile(fc.ObjectivesFile))
	}
	unread, err := cfg.UnreadHeaders(x.policyRegistry())
	if err != nil {
		return err
	}
	if len(unread) == 0 {
		b.WriteString("request headers not read: none\n")
	} else {
		b.WriteString("request headers not read (a request carrying one gets a note in its explanation, is counted in kvgate_globalrouter_unread_headers_total, and a warning is logged once):\n")
	}
	for _, u := range unread {
		fmt.Fprintf(&b, "  %s: %s\n", u.Name, u.Why)
	}
	_, err = w.Write(b.Bytes())
	return err
}

// objectivesFile names flow control's objectives file in the summary.
func objectivesFile(f string) string {
	if f == "" {
		return ""
	}
	return ", more in " + f
}

func writeChain(b *bytes.Buffer, specs []policies.Spec) {
	for i, s := range specs {
		fmt.Fprintf(b, "  %d. %s", i+1, s.Name)
		if !s.Args.Empty() {
			fmt.Fprintf(b, " %s", flow(s.Args.Node))
		}
		b.WriteString("\n")
	}
}

func resolvedPolicyFile(config, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(filepath.Dir(config), p)
}

// flow renders a YAML node on one line, comments dropped.
func flow(n *yaml.Node) string {
	if n == nil {
		return "{}"
	}
	c := flowCopy(n)
	out, err := yaml.Marshal(c)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return strings.TrimSpace(string(out))
}

func flowCopy(n *yaml.Node) *yaml.Node {
	c := *n
	c.HeadComment, c.LineComment, c.FootComment = "", "", ""
	if c.Kind == yaml.MappingNode || c.Kind == yaml.SequenceNode {
		c.Style |= yaml.FlowStyle
	}
	c.Content = make([]*yaml.Node, len(n.Content))
	for i, k := range n.Content {
		c.Content[i] = flowCopy(k)
	}
	return &c
}
