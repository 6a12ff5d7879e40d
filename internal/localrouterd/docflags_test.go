package localrouterd

import (
	"flag"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/lib/config"
)

// TestDocFlagTable: docs/localrouter.md's flag table tells the truth:
// every flag it names exists, every variable it lists sets that flag, and
// every default it states as a number, a duration or a boolean is the
// flag's (descriptive defaults, "(required)" or "the listen address", are
// not checked). Every flag of the process is in the table.
func TestDocFlagTable(t *testing.T) {
	data, err := os.ReadFile("../../docs/localrouter.md")
	if err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	fs := config.NewFlagSet("localrouter", io.Discard)
	flags(fs, &c)
	if err := fs.Parse(nil, nil); err != nil { // fills each usage's [env …]
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| (`--[a-z-]+`(?:, `--[a-z-]+`)*) \\| ([^|]*) \\| ([^|]*) \\|")
	code := regexp.MustCompile("`([^`]+)`")
	inTable := map[string]bool{}
	rows := row.FindAllStringSubmatch(string(data), -1)
	if len(rows) < 30 {
		t.Fatalf("docs/localrouter.md: %d flag rows, want the whole table", len(rows))
	}
	for _, r := range rows {
		var names []string
		for _, m := range code.FindAllStringSubmatch(r[1], -1) {
			names = append(names, strings.TrimLeft(m[1], "-"))
		}
		fl := fs.Lookup(names[0])
		if fl == nil {
			t.Errorf("docs/localrouter.md: --%s: no such flag", names[0])
			continue
		}
		for _, n := range names {
			inTable[n] = true
			if fs.Lookup(n) == nil {
				t.Errorf("docs/localrouter.md: --%s: no such flag", n)
			}
		}
		var usages string // the row's flags' usages, each ending in its [env …]
		for _, n := range names {
			if f := fs.Lookup(n); f != nil {
				usages += f.Usage + "\n"
			}
		}
		for _, m := range code.FindAllStringSubmatch(r[2], -1) {
			if v := m[1]; !strings.Contains(usages, v+",") && !strings.Contains(usages, v+"]") {
				t.Errorf("docs/localrouter.md: --%s: %s sets none of the row's flags", names[0], v)
			}
		}
		checkDefault(t, "--"+names[0], strings.Trim(strings.TrimSpace(r[3]), "`"), fl)
	}
	fs.VisitAll(func(fl *flag.Flag) {
		if !inTable[fl.Name] && !strings.HasPrefix(fl.Usage, "deprecated") && !strings.HasPrefix(fl.Usage, "alias of") {
			t.Errorf("docs/localrouter.md: the flag table lacks --%s", fl.Name)
		}
	})
}

// checkDefault compares a documented default with the flag's when the
// document states a number, a duration or a boolean first.
func checkDefault(t *testing.T, name, doc string, fl *flag.Flag) {
	t.Helper()
	word, _, _ := strings.Cut(doc, " ")
	switch {
	case word == "true" || word == "false":
		if word != fl.DefValue {
			t.Errorf("docs: %s: default %s, the flag's is %s", name, word, fl.DefValue)
		}
	case isNumber(word):
		want, _ := strconv.ParseFloat(word, 64)
		got, err := strconv.ParseFloat(fl.DefValue, 64)
		if d, derr := time.ParseDuration(fl.DefValue); err != nil && derr == nil {
			got, err = d.Seconds(), nil // "0" for a duration
		}
		if err != nil || got != want {
			t.Errorf("docs: %s: default %s, the flag's is %s", name, word, fl.DefValue)
		}
	default:
		if want, err := time.ParseDuration(word); err == nil {
			if got, err := time.ParseDuration(fl.DefValue); err != nil || got != want {
				t.Errorf("docs: %s: default %s, the flag's is %s", name, word, fl.DefValue)
			}
		}
	}
}

func isNumber(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}
