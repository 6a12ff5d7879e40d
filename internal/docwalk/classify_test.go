package docwalk

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
)

var (
	assignOnlyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=("(?s:.*)"|'[^']*'|\$\((?s:.*)\)|\S*)$`)
	singleRE     = regexp.MustCompile(`'[^']*'`)
	cmdWordRE    = regexp.MustCompile(`(?:^|[|;&(\n]|\$\()\s*(?:[A-Za-z_][A-Za-z0-9_]*=(?:"[^"]*"|''|[^\s"']*)(?:\s+|$))*([A-Za-z./][A-Za-z0-9_./-]*)(?:\s|$)`)
	keywordRE    = regexp.MustCompile(`\b(do|then|else)\b`)
	varRefRE     = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)`)
)

// isAssignment reports whether the command only sets a shell variable.
func isAssignment(text string) bool { return assignOnlyRE.MatchString(strings.TrimSpace(text)) }

// commandWords are the programs a command runs: the word at each command
// position (the start, after | ; & ( $( do then else), past VAR=value
// words, single-quoted text left out.
func commandWords(text string) []string {
	t := singleRE.ReplaceAllString(stripComments(text), "''")
	t = keywordRE.ReplaceAllString(t, ";")
	var words []string
	seen := map[string]bool{}
	for _, m := range cmdWordRE.FindAllStringSubmatch(t, -1) {
		w := m[1]
		if _, kw := openers[w]; kw || w == "in" || seen[w] {
			continue
		}
		seen[w] = true
		words = append(words, w)
	}
	return words
}

// stripComments drops each line's shell comment (a # starting a word,
// outside quotes), quotes followed across lines.
func stripComments(text string) string {
	var b strings.Builder
	single, double := false, false
	for i := 0; i < len(text); i++ {
		c := text[i]
		switch {
		case single:
			single = c != '\''
		case double:
			if c == '\\' && i+1 < len(text) {
				b.WriteByte(c)
				i++
				c = text[i]
			} else if c == '"' {
				double = false
			}
		case c == '\'':
			single = true
		case c == '"':
			double = true
		case c == '\\' && i+1 < len(text):
			b.WriteByte(c)
			i++
			c = text[i]
		case c == '#' && (i == 0 || text[i-1] == ' ' || text[i-1] == '\t' || text[i-1] == '\n'):
			for i+1 < len(text) && text[i+1] != '\n' {
				i++
			}
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// programOf is the command's first program ("" for a bare assignment).
func programOf(text string) string {
	if isAssignment(text) {
		if ws := commandWords(text); len(ws) > 0 && strings.Contains(text, "$(") {
			return ws[0]
		}
		return ""
	}
	if ws := commandWords(text); len(ws) > 0 {
		return ws[0]
	}
	return ""
}

var (
	subRE      = regexp.MustCompile(`^(?:kvgate|bin/kvgate|go run \./cmd/kvgate)\s+([a-z]+)\b`)
	helpFlagRE = regexp.MustCompile(`(?m)^\s+-([a-z0-9-]+)(?: (\S+))?$`)
)

// namedFlag is the flag a prose span ends with when that flag takes a
// value (`kvgate up -max-body-bytes`, `kvgate replay --cpu-kv-tokens`):
// the span names the flag, it is not a command. kvgate SUB -h says which
// flags take a value.
func (w *walker) namedFlag(c command) string {
	if !c.inline {
		return ""
	}
	words := strings.Fields(c.text)
	last := words[len(words)-1]
	m := subRE.FindStringSubmatch(c.text)
	if m == nil || !strings.HasPrefix(last, "-") || strings.Contains(last, "=") {
		return ""
	}
	if w.bin.takesValue(m[1])[strings.TrimLeft(last, "-")] {
		return last
	}
	return ""
}

// takesValue is the flags of kvgate SUB that take a value, read from its
// -h once.
func (b binaries) takesValue(sub string) map[string]bool {
	b.help.mu.Lock()
	defer b.help.mu.Unlock()
	if f, ok := b.help.flags[sub]; ok {
		return f
	}
	out, _ := exec.Command(b.runs["./cmd/kvgate"], sub, "-h").CombinedOutput()
	f := map[string]bool{}
	for _, m := range helpFlagRE.FindAllStringSubmatch(string(out), -1) {
		f[m[1]] = m[2] != ""
	}
	b.help.flags[sub] = f
	return f
}

// skip records a command not run; a variable it would have set is unset
// for the commands after it.
func (w *walker) skip(c command, where, short, reason string) {
	w.skipped = append(w.skipped, fmt.Sprintf("%s %s (%s)", where, short, reason))
	w.markUnset(c, reason)
}

func (w *walker) markUnset(c command, reason string) {
	if isAssignment(c.text) {
		name, _, _ := strings.Cut(strings.TrimSpace(c.text), "=")
		w.unset[name] = reason
	}
}

func (w *walker) step(c command) {
	t := w.t
	where := fmt.Sprintf("%s:%d", c.file, c.line)
	short := c.text
	if i := strings.IndexByte(short, '\n'); i >= 0 {
		short = short[:i] + " …"
	}
	if c.skip != "" {
		w.skip(c, where, short, "docwalk: skip "+c.skip)
		return
	}
	if r, ok := w.tb.match(skips, c); ok {
		w.skip(c, where, short, r.reason)
		return
	}
	if flag := w.namedFlag(c); flag != "" {
		w.skip(c, where, short, "names the flag "+flag+", its value left out (kvgate -h: it takes one)")
		return
	}
	if r, ok := w.tb.match(standIns, c); ok {
		w.skipped = append(w.skipped, fmt.Sprintf("%s %s (stand-in: %s)", where, short, r.reason))
		return
	}
	for _, m := range varRefRE.FindAllStringSubmatch(c.text, -1) {
		if why, ok := w.unset[m[1]]; ok {
			w.skip(c, where, short, fmt.Sprintf("uses $%s, whose command was not run: %s", m[1], why))
			return
		}
	}
	// every program the command runs is classified; the most restrictive
	// kind decides
	words := commandWords(c.text)
	decide, prog := program{kind: run}, ""
	for _, word := range words {
		p, ok := programs[word]
		if !ok {
			t.Errorf("%s: program %q is not in docwalk's programs table: classify it (table_test.go)\n  %s", where, word, c.text)
			return
		}
		if prog == "" || p.kind > decide.kind {
			decide, prog = p, word
		}
	}
	switch decide.kind {
	case never:
		w.skip(c, where, short, decide.reason)
		return
	case standIn:
		switch prog {
		case "etcd":
			w.startEtcd()
		case "nats-server":
			w.startNATS()
		}
		w.skipped = append(w.skipped, fmt.Sprintf("%s %s (stand-in: %s)", where, short, decide.reason))
		return
	case tool:
		if !lookTool(prog) {
			if decide.prepared && (os.Getenv(toolsEnv) != "" || os.Getenv("KVGATE_REQUIRE_TOOLS") != "") {
				t.Errorf("%s: %s is not in $%s (%q) nor on PATH, and make test requires it: make docwalk-tools installs it", where, prog, toolsEnv, os.Getenv(toolsEnv))
				return
			}
			w.absent = append(w.absent, fmt.Sprintf("%s %s (%s)", where, short, decide.reason))
			w.markUnset(c, decide.reason)
			return
		}
	}
	if isAssignment(c.text) { // VAR=value: kept for the document's later commands
		w.prelude = append(w.prelude, c.text)
		w.run(c, where, false)
		return
	}
	if prog == "go" {
		if !goRunRE.MatchString(c.text) {
			t.Errorf("%s: a go command other than go run ./PKG: add a skips or standIns row\n  %s", where, c.text)
			return
		}
	}
	_, known := w.tb.match(knownFailing, c)
	if isServer(c.text) {
		w.serve(c, where, known)
		return
	}
	w.run(c, where, known)
}

var serverRE = regexp.MustCompile(`^(?:\S+=\S+\s+)*(?:kvgate|bin/kvgate|go run \./cmd/kvgate)\s+(localrouter|mocker|extproc|relay|up)\b`)

var helpRE = regexp.MustCompile(`\s--?(h|help)(\s|$)`)

// isServer reports whether the command starts a server (not its -h).
func isServer(text string) bool {
	return serverRE.MatchString(strings.TrimSpace(text)) && !helpRE.MatchString(text)
}
