package app

import (
	"errors"
	"flag"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/extprocd"
)

// usageDefaults reads a subcommand's -h output (config.FlagSet's usage):
// each flag's printed default ("" when it prints none: the zero value).
func usageDefaults(t *testing.T, usage string) map[string]string {
	t.Helper()
	out := map[string]string{}
	name := ""
	for _, line := range strings.Split(usage, "\n") {
		if strings.HasPrefix(line, "  -") {
			name = strings.Fields(line)[0][1:]
			out[name] = ""
			continue
		}
		if name != "" {
			if i := strings.LastIndex(line, "(default "); i >= 0 && strings.HasSuffix(line, ")") {
				out[name] = strings.Trim(line[i+len("(default "):len(line)-1], `"`)
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("no flags in the usage:\n%s", usage)
	}
	return out
}

// sameDefault compares a documented default with a printed one: equal as
// text, numbers or durations; "none", "off", "0" and "false" match the
// zero value (no printed default).
func sameDefault(doc, printed string) bool {
	doc = strings.Trim(doc, "`")
	if doc == printed {
		return true
	}
	switch doc {
	case "none", "off", "0", "false":
		return printed == ""
	}
	if a, err := strconv.ParseFloat(doc, 64); err == nil {
		b, err := strconv.ParseFloat(printed, 64)
		return err == nil && a == b
	}
	if a, err := time.ParseDuration(strings.ReplaceAll(doc, " ", "")); err == nil {
		b, err := time.ParseDuration(printed)
		return err == nil && a == b
	}
	return false
}

// TestMockerDocFlagTable: docs/mocker.md's flag table names flags the
// mocker has, with their defaults, and every flag but the deprecated ones
// is in it.
func TestMockerDocFlagTable(t *testing.T) {
	var usage strings.Builder
	if _, _, err := parseMocker([]string{"-h"}, nil, &usage); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	checkDocFlagTable(t, "../docs/mocker.md", "### Flags", usage.String())
}

// TestExtprocDocFlagTable and TestUpDocFlagTable: docs/operating.md's
// flag reference, as TestMockerDocFlagTable.
func TestExtprocDocFlagTable(t *testing.T) {
	var usage strings.Builder
	if _, err := extprocd.ParseFlags("extproc", []string{"-h"}, &usage); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	checkDocFlagTable(t, "../docs/operating.md", "### `kvgate extproc`", usage.String())
}

func TestUpDocFlagTable(t *testing.T) {
	var usage strings.Builder
	if _, _, err := parseUpTo([]string{"-h"}, nil, &usage); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	checkDocFlagTable(t, "../docs/operating.md", "### `kvgate up`", usage.String())
}

// checkDocFlagTable holds the flag table under heading in file to a
// subcommand's usage: every flag the table names exists, with the
// default the usage prints (a row's defaults in its flags' order; a
// default described in words, "listen address", "num-blocks ×
// block-size", is not compared), and every flag but the deprecated ones
// and the aliases is in the table.
func checkDocFlagTable(t *testing.T, file, heading, usage string) {
	t.Helper()
	defaults := usageDefaults(t, usage)
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("%s: no heading %q", file, heading)
	}
	doc = doc[i+len(heading)+2:]
	if j := strings.Index(doc, "\n#"); j >= 0 {
		doc = doc[:j]
	}
	row := regexp.MustCompile("(?m)^\\| (`--?[a-z0-9-]+`(?:, `--?[a-z0-9-]+`)*) \\| ([^|]*) \\|")
	seen := map[string]bool{}
	rows := row.FindAllStringSubmatch(doc, -1)
	if len(rows) == 0 {
		t.Fatalf("%s: no flag rows under %q", file, heading)
	}
	for _, r := range rows {
		var names []string
		for _, n := range strings.Split(r[1], ", ") {
			names = append(names, strings.Trim(n, "`-"))
		}
		docs := strings.Split(strings.TrimSpace(r[2]), ", ")
		for i, n := range names {
			seen[n] = true
			printed, ok := defaults[n]
			if !ok {
				t.Errorf("%s: --%s: no such flag", file, n)
				continue
			}
			if len(docs) != len(names) {
				continue // one description for the row
			}
			d := docs[i]
			if strings.ContainsAny(d, "×&;") || strings.Contains(d, "address") || strings.Contains(d, "mocker-") {
				continue // described, not a value
			}
			if !sameDefault(strings.Fields(d)[0], printed) {
				t.Errorf("%s: --%s: default %q, the flag's is %q", file, n, d, printed)
			}
		}
	}
	lines := strings.Split(usage, "\n")
	for i, line := range lines {
		f := strings.Fields(line)
		if !strings.HasPrefix(line, "  -") || len(f) == 0 || i+1 == len(lines) {
			continue
		}
		n := f[0][1:]
		next := strings.TrimSpace(lines[i+1])
		if !seen[n] && !strings.HasPrefix(next, "deprecated") && !strings.HasPrefix(next, "alias of") {
			t.Errorf("%s: the flag table under %q lacks --%s", file, heading, n)
		}
	}
}
