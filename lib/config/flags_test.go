package config_test

import (
	"errors"
	"flag"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/lib/config"
)

func TestFlagSetEnv(t *testing.T) {
	type cfg struct {
		addr  string
		n     int
		d     time.Duration
		list  []string
		alias int
	}
	parse := func(args []string, env map[string]string) (cfg, error) {
		var c cfg
		fs := config.NewFlagSet("t", io.Discard)
		fs.StringVar(&c.addr, "listen-addr", "127.0.0.1:1", "")
		fs.Var(config.Int(&c.n, 0), "max-things", "")
		fs.Var(config.Duration(&c.d), "wait", "")
		fs.Var(config.List(&c.list), "peers", "")
		fs.Var(config.Int(&c.alias, 1), "block-size", "")
		fs.Alias("router-block-size", "block-size")
		fs.Env("block-size", "DYN_KV_CACHE_BLOCK_SIZE")
		return c, fs.Parse(args, func(k string) string { return env[k] })
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want cfg
	}{
		{"defaults", nil, nil, cfg{addr: "127.0.0.1:1"}},
		{"env", nil, map[string]string{"KVGATE_LISTEN_ADDR": ":2", "KVGATE_MAX_THINGS": "3", "KVGATE_WAIT": "5", "KVGATE_PEERS": "a, b"},
			cfg{addr: ":2", n: 3, d: 5 * time.Second, list: []string{"a", "b"}}},
		{"flag beats env", []string{"-listen-addr", ":9"}, map[string]string{"KVGATE_LISTEN_ADDR": ":2"}, cfg{addr: ":9"}},
		{"kvgate env beats alias env beats dynamo env", nil, map[string]string{"DYN_KV_CACHE_BLOCK_SIZE": "16", "KVGATE_ROUTER_BLOCK_SIZE": "32", "KVGATE_BLOCK_SIZE": "64"},
			cfg{addr: "127.0.0.1:1", alias: 64}},
		{"alias flag beats every env", []string{"-router-block-size=8"}, map[string]string{"KVGATE_BLOCK_SIZE": "64"}, cfg{addr: "127.0.0.1:1", alias: 8}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parse(tt.args, tt.env)
			if err != nil {
				t.Fatal(err)
			}
			if got.addr != tt.want.addr || got.n != tt.want.n || got.d != tt.want.d || strings.Join(got.list, ",") != strings.Join(tt.want.list, ",") || got.alias != tt.want.alias {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	if _, err := parse(nil, map[string]string{"KVGATE_MAX_THINGS": "-1"}); err == nil || !strings.Contains(err.Error(), `KVGATE_MAX_THINGS="-1": must be ≥ 0 (flag -max-things)`) {
		t.Errorf("bad env: got %v", err)
	}
	if _, err := parse([]string{"stray"}, nil); err == nil || !strings.Contains(err.Error(), "unexpected arguments") {
		t.Errorf("stray argument: got %v", err)
	}
	if _, err := parse([]string{"-h"}, nil); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: got %v, want flag.ErrHelp", err)
	}
}

func TestYAMLErrorsNameFileAndLine(t *testing.T) {
	type inner struct {
		Size int `yaml:"size"`
	}
	type doc struct {
		Name  string `yaml:"name"`
		Inner inner  `yaml:"inner"`
	}
	n, err := config.ParseFile("f.yaml", []byte("name: x\ninner:\n  sise: 3\n"))
	if err != nil {
		t.Fatal(err)
	}
	var d doc
	err = config.DecodeStrict("f.yaml", "pool", n, &d)
	if got, want := err.Error(), `f.yaml:3:3: pool.inner: unknown field "sise" (known: size)`; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if !errors.Is(err, config.ErrInvalid) {
		t.Errorf("%v does not wrap ErrInvalid", err)
	}
	if _, err := config.ParseFile("g.yaml", []byte("a: [\n")); err == nil || !strings.HasPrefix(err.Error(), "g.yaml:") {
		t.Errorf("syntax error: got %v", err)
	}
}

// TestFlagSetUsageAndDeprecated: the usage names each flag's type (never
// "value"), and a deprecated alias still sets its flag but warns.
func TestFlagSetUsageAndDeprecated(t *testing.T) {
	var n int
	var d time.Duration
	var l []string
	var s, url string
	var b bool
	var out strings.Builder
	fs := config.NewFlagSet("t", &out)
	fs.Var(config.Int(&n, 0), "count", "how many")
	fs.Var(config.Duration(&d), "wait", "how long")
	fs.Var(config.List(&l), "peers", "who")
	fs.Var(config.String(&s), "name", "what")
	fs.Var(config.Bool(&b), "on", "whether")
	fs.StringVar(&url, "nats-url", "nats://x", "NATS")
	fs.Deprecated("nats", "nats-url")
	if err := fs.Parse([]string{"-h"}, nil); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: got %v, want flag.ErrHelp", err)
	}
	usage := out.String()
	for _, want := range []string{"-count int\n", "-wait duration\n", "-peers list\n", "-name string\n", "-on\n", "-nats-url string\n", "deprecated alias of -nats-url", `(default "nats://x")`} {
		if !strings.Contains(usage, want) {
			t.Errorf("usage lacks %q:\n%s", want, usage)
		}
	}
	if strings.Contains(usage, " value\n") {
		t.Errorf("usage names a type \"value\":\n%s", usage)
	}

	out.Reset()
	fs = config.NewFlagSet("t", &out)
	fs.StringVar(&url, "nats-url", "nats://x", "NATS")
	fs.Deprecated("nats", "nats-url")
	if err := fs.Parse([]string{"-nats", "nats://y"}, nil); err != nil {
		t.Fatal(err)
	}
	if url != "nats://y" || !strings.Contains(out.String(), "warning: -nats is deprecated; use -nats-url") {
		t.Errorf("deprecated flag: got url %q, output %q", url, out.String())
	}
	out.Reset()
	fs = config.NewFlagSet("t", &out)
	fs.StringVar(&url, "nats-url", "nats://x", "NATS")
	fs.Deprecated("nats", "nats-url")
	if err := fs.Parse(nil, func(k string) string { return map[string]string{"KVGATE_NATS": "nats://z"}[k] }); err != nil {
		t.Fatal(err)
	}
	if url != "nats://z" || !strings.Contains(out.String(), "warning: KVGATE_NATS is deprecated; use -nats-url (KVGATE_NATS_URL)") {
		t.Errorf("deprecated env: got url %q, output %q", url, out.String())
	}
}

// TestLogging: -log-format picks JSON (the default) or text; bad values
// are refused naming the flag.
func TestLogging(t *testing.T) {
	for _, tt := range []struct {
		args   []string
		prefix string
		err    string
	}{
		{nil, `{"time":`, ""},
		{[]string{"-log-format", "text"}, "time=", ""},
		{[]string{"-log-format", "xml"}, "", "-log-format"},
		{[]string{"-log-level", "loud"}, "", "-log-level"},
	} {
		var l config.Logging
		fs := config.NewFlagSet("t", io.Discard)
		l.Flags(fs, "info")
		if err := fs.Parse(tt.args, nil); err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		log, err := l.Logger(&out)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%v: got error %v, want one naming %s", tt.args, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		log.Info("hello")
		if !strings.HasPrefix(out.String(), tt.prefix) {
			t.Errorf("%v: logged %q, want it to start %q", tt.args, out.String(), tt.prefix)
		}
	}
}

// TestFlagSetGivenAndNotRead: Given and NotRead see a flag set on the
// command line (under its name or an alias) or from the environment, and
// never one left at its default, even when a flag is set to that value.
func TestFlagSetGivenAndNotRead(t *testing.T) {
	parse := func(args []string, env map[string]string) (*config.FlagSet, *strings.Builder) {
		t.Helper()
		var out strings.Builder
		fs := config.NewFlagSet("t", &out)
		var n, bs int
		fs.Var(config.Int(&n, 0), "max-things", "")
		fs.Var(config.Int(&bs, 1), "block-size", "")
		fs.Alias("router-block-size", "block-size")
		fs.Env("block-size", "DYN_KV_CACHE_BLOCK_SIZE")
		fs.String("other", "", "")
		if err := fs.Parse(args, func(k string) string { return env[k] }); err != nil {
			t.Fatal(err)
		}
		return fs, &out
	}
	fs, _ := parse(nil, nil)
	if fs.Given("max-things") || fs.NotRead("why", "max-things", "block-size") != nil {
		t.Errorf("nothing set: Given %v, NotRead %v", fs.Given("max-things"), fs.NotRead("why", "max-things", "block-size"))
	}
	fs, out := parse([]string{"-max-things=0", "-router-block-size", "8"}, map[string]string{"KVGATE_OTHER": "x"})
	for name, want := range map[string]string{"max-things": "-max-things", "block-size": "-router-block-size", "router-block-size": "-router-block-size", "other": "KVGATE_OTHER"} {
		if got := fs.Source(name); got != want {
			t.Errorf("Source(%q) = %q, want %q", name, got, want)
		}
	}
	err := fs.NotRead("-topology regions makes its own pools", "max-things", "block-size")
	if want := "-max-things, -router-block-size set but not read: -topology regions makes its own pools"; err == nil || err.Error() != want {
		t.Errorf("NotRead = %v, want %q", err, want)
	}
	fs.WarnNotRead("read with -x only", "other")
	if want := "warning: KVGATE_OTHER set but not read: read with -x only\n"; out.String() != want {
		t.Errorf("WarnNotRead wrote %q, want %q", out.String(), want)
	}
	fs, _ = parse(nil, map[string]string{"DYN_KV_CACHE_BLOCK_SIZE": "32"})
	if got := fs.Source("block-size"); got != "DYN_KV_CACHE_BLOCK_SIZE" {
		t.Errorf("Source from Dynamo's variable = %q", got)
	}
}

func TestSignedDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{"-1s": -time.Second, "0": 0, "90": 90 * time.Second, "2m": 2 * time.Minute, "-5": -5 * time.Second} {
		var d time.Duration
		if err := config.SignedDuration(&d).Set(in); err != nil || d != want {
			t.Errorf("%q: %v, %v; want %v", in, d, err, want)
		}
	}
	var d time.Duration
	if err := config.SignedDuration(&d).Set("soon"); err == nil {
		t.Error("soon: no error")
	}
}

// TestFlagSetWarnsOfStrayVariables: a KVGATE_* variable of the
// environment that sets none of the subcommand's flags (another
// subcommand's, a misspelling) is warned about; the flags' own variables,
// their aliases', and the harness variables are not.
func TestFlagSetWarnsOfStrayVariables(t *testing.T) {
	t.Setenv("KVGATE_ROUTER_TEMPRATURE", "0.5")
	t.Setenv("KVGATE_MAX_THINGS", "3")
	t.Setenv("KVGATE_ROUTER_BLOCK_SIZE", "32")
	t.Setenv("KVGATE_REQUIRE_TOOLS", "1")
	var out strings.Builder
	fs := config.NewFlagSet("up", &out)
	var n, bs int
	fs.Var(config.Int(&n, 0), "max-things", "")
	fs.Var(config.Int(&bs, 1), "block-size", "")
	fs.Alias("router-block-size", "block-size")
	if err := fs.Parse(nil, os.Getenv); err != nil {
		t.Fatal(err)
	}
	if want := "warning: KVGATE_ROUTER_TEMPRATURE is set but not read: kvgate up has no flag it sets (kvgate up -h lists its variables)\n"; out.String() != want {
		t.Errorf("output %q, want %q", out.String(), want)
	}
	out.Reset()
	fs = config.NewFlagSet("up", &out)
	fs.Var(config.Int(&n, 0), "max-things", "")
	if err := fs.Parse(nil, func(string) string { return "" }); err != nil || out.Len() != 0 {
		t.Errorf("a getenv that returns nothing reads no variable: %v, output %q", err, out.String())
	}
}
