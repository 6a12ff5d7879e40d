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
// mocker has, with their defaults (a row's defaults in its flags' order;
// a default the document describes in words, "listen address",
// "num-blocks × block-size", is not compared), and every flag but the
// deprecated ones is in it.
func TestMockerDocFlagTable(t *testing.T) {
	var usage strings.Builder
	if _, _, err := parseMocker([]string{"-h"}, nil, &usage); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	defaults := usageDefaults(t, usage.String())
	data, err := os.ReadFile("../docs/mocker.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| (`--[a-z-]+`(?:, `--[a-z-]+`)*) \\| ([^|]*) \\|")
	seen := map[string]bool{}
	for _, r := range row.FindAllStringSubmatch(string(data), -1) {
		var names []string
		for _, n := range strings.Split(r[1], ", ") {
			names = append(names, strings.Trim(n, "`-"))
		}
		docs := strings.Split(strings.TrimSpace(r[2]), ", ")
		for i, n := range names {
			seen[n] = true
			printed, ok := defaults[n]
			if !ok {
				t.Errorf("docs/mocker.md: --%s: no such flag", n)
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
				t.Errorf("docs/mocker.md: --%s: default %q, the flag's is %q", n, d, printed)
			}
		}
	}
	lines := strings.Split(usage.String(), "\n")
	for i, line := range lines {
		f := strings.Fields(line)
		if !strings.HasPrefix(line, "  -") || len(f) == 0 || i+1 == len(lines) {
			continue
		}
		n := f[0][1:]
		if !seen[n] && !strings.Contains(lines[i+1], "deprecated") {
			t.Errorf("docs/mocker.md: the flag table lacks --%s", n)
		}
	}
}
