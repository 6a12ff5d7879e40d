package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// EnvPrefix starts the environment variable of every flag.
const EnvPrefix = "KVGATE_"

// EnvName is the environment variable of flag name: -foo-bar → KVGATE_FOO_BAR.
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// FlagSet is a flag.FlagSet whose flags are also read from the environment.
// Define flags on the embedded *flag.FlagSet as usual, then Alias and Env
// where needed, then Parse. Not safe for concurrent use.
type FlagSet struct {
	*flag.FlagSet
	aliases    map[string]string   // alias → canonical flag
	deprecated map[string]string   // deprecated flag → the flag to use instead
	extra      map[string][]string // canonical flag → extra env names, lowest precedence first
	given      map[string]string   // canonical flag → where Parse set it: "-name" or an environment variable
}

// NewFlagSet returns an empty FlagSet that reports errors instead of
// exiting; usage and errors go to out.
func NewFlagSet(name string, out io.Writer) *FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	f := &FlagSet{FlagSet: fs, aliases: map[string]string{}, deprecated: map[string]string{}, extra: map[string][]string{}, given: map[string]string{}}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: kvgate %s [flags]\n\nflags (the environment variables in brackets set them too; the command line wins):\n", name)
		f.PrintDefaults()
	}
	return f
}

// PrintDefaults prints every flag as flag.PrintDefaults does, but names
// each flag's type (int, float, duration, list, string), including the
// flags built from a Value, which the flag package calls "value".
func (f *FlagSet) PrintDefaults() {
	var b strings.Builder
	f.VisitAll(func(fl *flag.Flag) {
		fmt.Fprintf(&b, "  -%s", fl.Name)
		name, usage := flag.UnquoteUsage(fl)
		if name == "value" { // a Value, or another flag.Value: all read text
			name = "string"
			if v, ok := fl.Value.(*Value); ok && v.Kind != "" {
				name = v.Kind
			}
		}
		if isBool(fl.Value) {
			name = ""
		}
		if name != "" {
			b.WriteString(" " + name)
		}
		b.WriteString("\n    \t")
		b.WriteString(strings.ReplaceAll(usage, "\n", "\n    \t"))
		if d := fl.DefValue; d != "" && d != "0" && d != "false" && d != "0s" {
			if name == "string" {
				fmt.Fprintf(&b, " (default %q)", d)
			} else {
				fmt.Fprintf(&b, " (default %v)", d)
			}
		}
		b.WriteString("\n")
	})
	fmt.Fprint(f.Output(), b.String())
}

func isBool(v flag.Value) bool {
	b, ok := v.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// Deprecated is Alias for an old name kept for old command lines: using it
// (on the command line or as KVGATE_<ALIAS>) still works and prints a
// warning naming the flag to use instead.
func (f *FlagSet) Deprecated(alias, canonical string) {
	f.Alias(alias, canonical)
	f.Lookup(alias).Usage = "deprecated alias of -" + canonical
	f.deprecated[alias] = "-" + canonical
}

// MarkDeprecated marks the defined flag name as kept for old command lines
// only: using it warns, naming use (e.g. "-addr") instead.
func (f *FlagSet) MarkDeprecated(name, use string) {
	fl := f.Lookup(name)
	if fl == nil {
		panic("config: deprecating undefined flag -" + name)
	}
	fl.Usage = "deprecated: use " + use + " (" + fl.Usage + ")"
	f.deprecated[name] = use
}

// Alias defines -alias as another name of the already defined -canonical.
// It panics when canonical is not defined: a programming error.
func (f *FlagSet) Alias(alias, canonical string) {
	c := f.Lookup(canonical)
	if c == nil {
		panic("config: alias of undefined flag -" + canonical)
	}
	f.Var(c.Value, alias, "alias of -"+canonical)
	f.aliases[alias] = canonical
}

// Env adds environment variables read for -canonical, with a lower
// precedence than KVGATE_*: for names other projects use (Dynamo's DYN_*).
// Later names win over earlier ones.
func (f *FlagSet) Env(canonical string, names ...string) {
	f.extra[canonical] = append(f.extra[canonical], names...)
}

// envs returns the variables read for canonical flag c, lowest precedence
// first: the extra names, then KVGATE_ of each alias, then of c itself.
func (f *FlagSet) envs(c string) []string {
	out := append([]string(nil), f.extra[c]...)
	var aliases []string
	for a, to := range f.aliases {
		if to == c {
			aliases = append(aliases, a)
		}
	}
	slices.Sort(aliases)
	for _, a := range aliases {
		out = append(out, EnvName(a))
	}
	return append(out, EnvName(c))
}

// Parse parses args, then sets each flag not given on the command line from
// its environment variables (getenv; nil means none). It returns
// flag.ErrHelp after printing the usage for -h, and an error naming the
// flag or variable at fault otherwise. Positional arguments are refused.
func (f *FlagSet) Parse(args []string, getenv func(string) string) error {
	f.VisitAll(func(fl *flag.Flag) {
		if _, isAlias := f.aliases[fl.Name]; !isAlias {
			fl.Usage += " [env " + strings.Join(f.envs(fl.Name), ", ") + "]"
		}
	})
	if err := f.FlagSet.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", f.Args())
	}
	f.Visit(func(fl *flag.Flag) {
		if use, ok := f.deprecated[fl.Name]; ok {
			fmt.Fprintf(f.Output(), "warning: -%s is deprecated; use %s\n", fl.Name, use)
		}
	})
	onCLI := map[string]bool{}
	f.Visit(func(fl *flag.Flag) {
		name := fl.Name
		if c, ok := f.aliases[name]; ok {
			name = c
		}
		onCLI[name] = true
		f.given[name] = "-" + fl.Name
	})
	if getenv == nil {
		return nil
	}
	var errs []error
	f.VisitAll(func(fl *flag.Flag) {
		if _, isAlias := f.aliases[fl.Name]; isAlias || onCLI[fl.Name] {
			return
		}
		for _, env := range f.envs(fl.Name) {
			v := getenv(env)
			if v == "" {
				continue
			}
			if a, ok := strings.CutPrefix(env, EnvPrefix); ok {
				if use, ok := f.deprecated[strings.ToLower(strings.ReplaceAll(a, "_", "-"))]; ok {
					fmt.Fprintf(f.Output(), "warning: %s is deprecated; use %s (%s)\n", env, use, EnvName(strings.TrimPrefix(use, "-")))
				}
			}
			if err := fl.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("environment variable %s=%q: %w (flag -%s)", env, v, err, fl.Name))
				continue
			}
			f.given[fl.Name] = env
		}
	})
	f.warnStrayEnv(getenv)
	return errors.Join(errs...)
}

// environ is the process's environment (a variable of tests).
var environ = os.Environ

// warnStrayEnv warns about each KVGATE_* variable of the environment
// (that getenv also returns) that sets no flag of f: another
// subcommand's, or a misspelling, which would otherwise pass in silence.
func (f *FlagSet) warnStrayEnv(getenv func(string) string) {
	read := map[string]bool{}
	f.VisitAll(func(fl *flag.Flag) {
		if _, isAlias := f.aliases[fl.Name]; !isAlias {
			for _, e := range f.envs(fl.Name) {
				read[e] = true
			}
		}
	})
	var stray []string
	for _, kv := range environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, EnvPrefix) && !read[name] && !slices.Contains(NotFlagVariables, name) && getenv(name) != "" {
			stray = append(stray, name)
		}
	}
	slices.Sort(stray)
	for _, name := range slices.Compact(stray) {
		fmt.Fprintf(f.Output(), "warning: %s is set but not read: kvgate %s has no flag it sets (kvgate %s -h lists its variables)\n", name, f.Name(), f.Name())
	}
}

// Given reports whether Parse set -name (or an alias of it), on the command
// line or from the environment: the operator asked for it, whatever its
// value (a flag set to its default is given too).
func (f *FlagSet) Given(name string) bool { return f.Source(name) != "" }

// Source is where Parse set -name: "-name" (or "-alias") for the command
// line, the environment variable's name otherwise; "" when not set.
func (f *FlagSet) Source(name string) string {
	if c, ok := f.aliases[name]; ok {
		name = c
	}
	return f.given[name]
}

// NotRead is nil unless some of names were given (Given); then it is an
// error naming each where it was set and why the running configuration
// does not read it: a knob set but not read is refused or warned about,
// never passed over in silence.
func (f *FlagSet) NotRead(why string, names ...string) error {
	var set []string
	for _, n := range names {
		if src := f.Source(n); src != "" {
			set = append(set, src)
		}
	}
	if len(set) == 0 {
		return nil
	}
	return fmt.Errorf("%s set but not read: %s", strings.Join(set, ", "), why)
}

// WarnNotRead prints NotRead's error, if any, as a warning to the flag
// set's output (where the usage and the deprecation warnings go), for a
// knob that is harmless to keep but takes no effect.
func (f *FlagSet) WarnNotRead(why string, names ...string) {
	if err := f.NotRead(why, names...); err != nil {
		fmt.Fprintf(f.Output(), "warning: %v\n", err)
	}
}

// Value is a flag.Value built from two functions, for fields whose parsing
// the standard flag types do not cover.
type Value struct {
	SetFunc func(string) error
	GetFunc func() string
	// Bool makes it a boolean flag (-x means -x=true).
	Bool bool
	// Kind names the value's type in the usage (int, float, duration,
	// list; empty: string).
	Kind string
}

func (v *Value) String() string {
	if v == nil || v.GetFunc == nil {
		return ""
	}
	return v.GetFunc()
}

// Set implements flag.Value.
func (v *Value) Set(s string) error { return v.SetFunc(s) }

// IsBoolFlag implements the flag package's boolFlag.
func (v *Value) IsBoolFlag() bool { return v.Bool }

// List is a comma-separated list flag: each Set replaces the list, empty
// elements are dropped.
func List(p *[]string) *Value {
	return &Value{
		Kind:    "list",
		SetFunc: func(s string) error { *p = SplitList(s); return nil },
		GetFunc: func() string { return strings.Join(*p, ",") },
	}
}

// SplitList splits a comma-separated list, trimming spaces and dropping
// empty elements.
func SplitList(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// Int is an integer flag of at least minimum.
func Int(p *int, minimum int) *Value {
	return &Value{
		Kind: "int",
		SetFunc: func(s string) error {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil {
				return errors.New("not an integer")
			}
			if n < minimum {
				return fmt.Errorf("must be ≥ %d", minimum)
			}
			*p = n
			return nil
		},
		GetFunc: func() string { return strconv.Itoa(*p) },
	}
}

// Float is a finite, non-negative number flag.
func Float(p *float64) *Value {
	return &Value{
		Kind: "float",
		SetFunc: func(s string) error {
			f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
			if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
				return errors.New("not a finite number")
			}
			if f < 0 {
				return errors.New("must be ≥ 0")
			}
			*p = f
			return nil
		},
		GetFunc: func() string { return strconv.FormatFloat(*p, 'g', -1, 64) },
	}
}

// Bool is a boolean flag.
func Bool(p *bool) *Value {
	return &Value{
		Bool: true,
		SetFunc: func(s string) error {
			b, err := strconv.ParseBool(strings.TrimSpace(s))
			if err != nil {
				return errors.New("not a boolean (true or false)")
			}
			*p = b
			return nil
		},
		GetFunc: func() string { return strconv.FormatBool(*p) },
	}
}

// Duration is a positive duration flag: a Go duration ("90s", "2m") or a
// number of seconds ("120").
func Duration(p *time.Duration) *Value {
	return &Value{
		Kind: "duration",
		SetFunc: func(s string) error {
			s = strings.TrimSpace(s)
			d, err := time.ParseDuration(s)
			if err != nil {
				f, ferr := strconv.ParseFloat(s, 64)
				if ferr != nil || math.IsNaN(f) || math.IsInf(f, 0) {
					return errors.New("not a duration (like 120s) or a number of seconds")
				}
				d = time.Duration(f * float64(time.Second))
			}
			if d <= 0 {
				return errors.New("must be positive")
			}
			*p = d
			return nil
		},
		GetFunc: func() string { return p.String() },
	}
}

// DurationOrZero is Duration that also accepts 0 (for "disabled").
func DurationOrZero(p *time.Duration) *Value {
	d := Duration(p)
	set := d.SetFunc
	d.SetFunc = func(s string) error {
		t := strings.TrimSpace(s)
		if v, err := time.ParseDuration(t); err == nil && v == 0 {
			*p = 0
			return nil
		}
		if f, err := strconv.ParseFloat(t, 64); err == nil && f == 0 {
			*p = 0
			return nil
		}
		return set(s)
	}
	return d
}

// String is a string flag whose value is trimmed of spaces.
func String(p *string) *Value {
	return &Value{
		SetFunc: func(s string) error { *p = strings.TrimSpace(s); return nil },
		GetFunc: func() string { return *p },
	}
}

// SignedDuration is Duration that also accepts 0 and negative durations,
// for flags whose usage gives them a meaning (0: the default; negative:
// off).
func SignedDuration(p *time.Duration) *Value {
	d := Duration(p)
	d.SetFunc = func(s string) error {
		s = strings.TrimSpace(s)
		v, err := time.ParseDuration(s)
		if err != nil {
			f, ferr := strconv.ParseFloat(s, 64)
			if ferr != nil || math.IsNaN(f) || math.IsInf(f, 0) {
				return errors.New("not a duration (like 120s, -1s) or a number of seconds")
			}
			v = time.Duration(f * float64(time.Second))
		}
		*p = v
		return nil
	}
	return d
}
