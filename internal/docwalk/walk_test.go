package docwalk

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testenv"
)

const (
	commandTimeout = 60 * time.Second // one foreground command
	readyTimeout   = 20 * time.Second // a server's ports listening
	stopTimeout    = 10 * time.Second // a server's stop after SIGINT
	settle         = 5 * time.Second  // retries of a command whose output misses an expectation
)

// TestDocs walks every document's commands (doc.go).
func TestDocs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvgate and runs every document's commands (about 30 s): not in -short")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range more {
		files = append(files, filepath.ToSlash(must(filepath.Rel(root, m))))
	}
	docs := map[string][]command{}
	for _, f := range files {
		cs, err := extract(filepath.Join(root, f), f)
		if err != nil {
			t.Fatal(err)
		}
		docs[f] = cs
	}
	tb := newTables()
	bin := build(t, root, docs)
	sys := startUp(t, bin)
	t.Run("doc", func(t *testing.T) {
		for _, f := range files {
			if len(docs[f]) == 0 {
				continue
			}
			t.Run(strings.ReplaceAll(f, "/", "_"), func(t *testing.T) {
				t.Parallel()
				w := &walker{t: t, root: root, bin: bin, sys: sys, tb: tb, file: f,
					ports: map[string]string{}, owner: map[string]*server{}, unset: map[string]string{}, shared: map[string]bool{}}
				w.walk(docs[f])
			})
		}
	})
	tb.checkUsed(t)
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// tables wraps the rows of table_test.go with their use, so a row that
// matches no command fails the walk.
type tables struct {
	mu   sync.Mutex
	used map[string]bool
}

func newTables() *tables { return &tables{used: map[string]bool{}} }

func (tb *tables) match(rows []rule, c command) (rule, bool) {
	for _, r := range rows {
		if r.file == c.file && strings.Contains(c.text, r.match) {
			tb.mu.Lock()
			tb.used[r.String()] = true
			tb.mu.Unlock()
			return r, true
		}
	}
	return rule{}, false
}

func (tb *tables) expectations(c command) []string {
	var want []string
	for _, e := range expectations {
		if e.file == c.file && strings.Contains(c.text, e.match) {
			tb.mu.Lock()
			tb.used[rule{file: e.file, match: e.match}.String()] = true
			tb.mu.Unlock()
			want = append(want, e.want...)
		}
	}
	return want
}

func (tb *tables) checkUsed(t *testing.T) {
	for name, rows := range map[string][]rule{"skips": skips, "standIns": standIns, "knownFailing": knownFailing} {
		for _, r := range rows {
			if !tb.used[r.String()] {
				t.Errorf("%s row %s matches no command: remove it or fix its match", name, r)
			}
		}
	}
	for _, e := range expectations {
		if !tb.used[rule{file: e.file, match: e.match}.String()] {
			t.Errorf("expectations row %s %q matches no command", e.file, e.match)
		}
	}
}

// binaries are the walk's built programs: kvgate, and each other package
// a document runs with `go run ./PATH`.
type binaries struct {
	dir  string
	runs map[string]string // "./examples/patterns/query" → its binary
	help *helpCache
}

type helpCache struct {
	mu    sync.Mutex
	flags map[string]map[string]bool // subcommand → flag → takes a value
}

var goRunRE = regexp.MustCompile(`\bgo run (\./[A-Za-z0-9_./-]+)`)

// build builds kvgate and every go-run package of the documents in one go
// build.
func build(t *testing.T, root string, docs map[string][]command) binaries {
	b := binaries{dir: t.TempDir(), runs: map[string]string{}, help: &helpCache{flags: map[string]map[string]bool{}}}
	pkgs := map[string]bool{"./cmd/kvgate": true, "./internal/docwalk/etcdctl": true}
	for _, cs := range docs {
		for _, c := range cs {
			for _, m := range goRunRE.FindAllStringSubmatch(c.text, -1) {
				pkgs[strings.TrimSuffix(m[1], "/")] = true
			}
		}
	}
	args := []string{"build", "-o", b.dir + string(filepath.Separator)}
	for p := range pkgs {
		args = append(args, p)
		b.runs[p] = filepath.Join(b.dir, filepath.Base(p))
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("built %d packages in %v", len(pkgs), time.Since(start).Round(time.Millisecond))
	return b
}

// upSystem is the walk's shared `kvgate up`: the documents' 8080, 8081 and
// 9002 move to its addresses.
type upSystem struct {
	gateway, admin, extproc string // host:port
}

var (
	gatewayRE = regexp.MustCompile(`gateway \(HTTP\)\s+http://(\S+)`)
	adminRE   = regexp.MustCompile(`status page\s+http://([^/\s]+)/`)
	extprocRE = regexp.MustCompile(`ext_proc \(gRPC\)\s+(\S+)`)
)

func startUp(t *testing.T, bin binaries) *upSystem {
	cmd := exec.Command(bin.runs["./cmd/kvgate"], "up", "--gateway-addr", "127.0.0.1:0", "--extproc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0")
	cmd.Env = cleanEnv(bin.dir, t.TempDir())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	srv := &server{cmd: cmd, out: &stderr, done: make(chan struct{})}
	go func() { srv.err = cmd.Wait(); close(srv.done) }()
	t.Cleanup(func() {
		if err := srv.stop(); err != nil {
			t.Errorf("kvgate up: stop: %v\n%s", err, stderr.String())
		}
	})
	banner := make(chan string, 1)
	go func() {
		var b strings.Builder
		sc := bufio.NewScanner(stdout)
		sent := false
		for sc.Scan() {
			b.WriteString(sc.Text() + "\n")
			if !sent && strings.HasPrefix(sc.Text(), "  nats ") {
				banner <- b.String()
				sent = true
			}
		}
		if !sent {
			banner <- b.String()
		}
	}()
	var text string
	select {
	case text = <-banner:
	case <-time.After(time.Minute):
		t.Fatalf("kvgate up: no banner after a minute\n%s", stderr.String())
	}
	s := &upSystem{}
	for re, dst := range map[*regexp.Regexp]*string{gatewayRE: &s.gateway, adminRE: &s.admin, extprocRE: &s.extproc} {
		m := re.FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("kvgate up: banner without %s:\n%s\n%s", re, text, stderr.String())
		}
		*dst = m[1]
	}
	t.Logf("kvgate up in %v: gateway %s, admin %s, ext_proc %s", time.Since(start).Round(time.Millisecond), s.gateway, s.admin, s.extproc)
	return s
}

// cleanEnv is the environment of the documents' commands: the built
// binaries first on PATH, no KVGATE_* or DYN_* setting of the caller's,
// a fresh TMPDIR, and the hidden fixed ports moved.
func cleanEnv(binDir, tmp string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "KVGATE_") || strings.HasPrefix(k, "DYN_") || k == "PATH" || k == "TMPDIR" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "PATH="+binDir+string(os.PathListSeparator)+toolPath(), "TMPDIR="+tmp)
}

// toolsEnv names the folder of the tools make test installs
// (mk/docwalk.mk); set, or KVGATE_REQUIRE_TOOLS set (make test sets it),
// a prepared tool missing fails the walk.
const toolsEnv = "KVGATE_DOCWALK_TOOLS"

// toolPath is PATH with the prepared tools' folder first: $KVGATE_DOCWALK_TOOLS,
// else .cache/docwalk/bin when a make test left it.
func toolPath() string {
	dir := os.Getenv(toolsEnv)
	if dir == "" {
		if d, err := filepath.Abs("../../.cache/docwalk/bin"); err == nil {
			dir = d
		}
	}
	if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
		return dir + string(os.PathListSeparator) + os.Getenv("PATH")
	}
	return os.Getenv("PATH")
}

// lookTool finds a tool on toolPath.
func lookTool(name string) bool {
	for _, d := range filepath.SplitList(toolPath()) {
		if fi, err := os.Stat(filepath.Join(d, name)); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return true
		}
	}
	return false
}

func envName(flag string) string {
	return "KVGATE_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// walker walks one document.
type walker struct {
	t    *testing.T
	root string
	bin  binaries
	sys  *upSystem
	tb   *tables
	file string

	dir, tmp string
	ports    map[string]string  // the document's host:port → the walk's
	shared   map[string]bool    // the document's host:port mapped to the shared kvgate up
	owner    map[string]*server // the walk's host:port → the server listening there
	servers  []*server
	prelude  []string          // the document's shell variable assignments so far
	unset    map[string]string // variables whose assignment was not run → why
	etcd     string            // host:port of the document's embedded etcd, once started
	nats     string

	ran, skipped, absent []string
}

func (w *walker) walk(cs []command) {
	w.setup()
	for _, c := range cs {
		w.step(c)
	}
	w.stopServers()
	w.t.Logf("%s: ran %d, not run %d, tool absent %d", w.file, len(w.ran), len(w.skipped), len(w.absent))
	for _, s := range w.ran {
		w.t.Logf("  ran: %s", s)
	}
	for _, s := range w.skipped {
		w.t.Logf("  not run: %s", s)
	}
	for _, s := range w.absent {
		w.t.Logf("  tool absent: %s", s)
	}
}

// setup makes the document's working folder: the repository's top-level
// entries linked in, the fixtures written.
func (w *walker) setup() {
	base := w.t.TempDir()
	w.dir, w.tmp = filepath.Join(base, "repo"), filepath.Join(base, "tmp")
	for _, d := range []string{w.dir, w.tmp} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			w.t.Fatal(err)
		}
	}
	ents, err := os.ReadDir(w.root)
	if err != nil {
		w.t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == ".git" || e.Name() == "bin" || e.Name() == ".cache" {
			continue
		}
		if err := os.Symlink(filepath.Join(w.root, e.Name()), filepath.Join(w.dir, e.Name())); err != nil {
			w.t.Fatal(err)
		}
	}
	for name, content := range fixtures {
		p := filepath.Join(w.dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			w.t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			w.t.Fatal(err)
		}
	}
}

// env is a command's environment: cleanEnv and the document's etcd for
// etcdctl.
func (w *walker) env() []string {
	env := cleanEnv(w.bin.dir, w.tmp)
	if w.etcd != "" {
		env = append(env, "ETCDCTL_ENDPOINTS=http://"+w.etcd)
	}
	return env
}

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

var (
	addrRE   = regexp.MustCompile(`(\b127\.0\.0\.1|\blocalhost|\*):(\d{2,5})\b`)
	portRE   = regexp.MustCompile(`(\s--?port[ =])(\d{2,5})\b`)
	tmpRE    = regexp.MustCompile(`(^|[\s='"])/tmp/`)
	binRE    = regexp.MustCompile(`(^|[\s;|&(])bin/kvgate\b`)
	maxReqRE = regexp.MustCompile(`--?max-requests[ =](\d+)`)
	replayRE = regexp.MustCompile(`\bkvgate (?:policy )?replay\b[^-\n]*`)
)

// rewrite is the command as the walk runs it: its binaries, its ports,
// /tmp and its replay size moved.
func (w *walker) rewrite(text string) string {
	text = tmpRE.ReplaceAllString(text, "${1}"+w.tmp+"/")
	text = goRunRE.ReplaceAllStringFunc(text, func(m string) string {
		pkg := strings.TrimSuffix(goRunRE.FindStringSubmatch(m)[1], "/")
		return w.bin.runs[pkg]
	})
	text = binRE.ReplaceAllString(text, "${1}kvgate")
	text = addrRE.ReplaceAllStringFunc(text, func(m string) string { return w.addr(m) })
	text = portRE.ReplaceAllStringFunc(text, func(m string) string {
		sm := portRE.FindStringSubmatch(m)
		_, port, _ := net.SplitHostPort(w.addr("127.0.0.1:" + sm[2]))
		return sm[1] + port
	})
	if replayRE.MatchString(text) {
		if m := maxReqRE.FindStringSubmatch(text); m != nil {
			if n, _ := strconv.Atoi(m[1]); n > replayCap {
				text = maxReqRE.ReplaceAllString(text, fmt.Sprintf("--max-requests %d", replayCap))
			}
		} else {
			loc := replayRE.FindStringIndex(text)
			head := strings.TrimRight(text[:loc[1]], " ")
			text = head + fmt.Sprintf(" --max-requests %d ", replayCap) + strings.TrimLeft(text[loc[1]:], " ")
		}
	}
	return text
}

// listenAddr maps an address a server of the document listens on (a
// flag's value as written: host:port, a port, tcp://host:port) to the
// walk's, in the flag's form: a free port, unless the document already
// gave this address one of its own (not the shared kvgate up's).
func (w *walker) listenAddr(flag, doc string) (string, bool) {
	hp := strings.TrimPrefix(doc, "tcp://")
	if flag == "port" {
		hp = "127.0.0.1:" + hp
	}
	host, port, err := net.SplitHostPort(hp)
	if err != nil || (host != "127.0.0.1" && host != "localhost" && host != "*") {
		return "", false
	}
	key := "127.0.0.1:" + port
	real, ok := w.ports[key]
	if !ok || w.shared[key] {
		real = net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort()))
		w.ports[key], w.shared[key] = real, false
	}
	switch {
	case flag == "port":
		_, p, _ := net.SplitHostPort(real)
		return p, true
	case strings.HasPrefix(doc, "tcp://"):
		return "tcp://" + real, true
	}
	return real, true
}

// hostPort is a listening flag's value as an address to dial.
func hostPort(flag, v string) string {
	if flag == "port" {
		return "127.0.0.1:" + v
	}
	return strings.TrimPrefix(v, "tcp://")
}

// addr maps one of the document's addresses to the walk's.
func (w *walker) addr(docAddr string) string {
	host, port, _ := net.SplitHostPort(docAddr)
	key := "127.0.0.1:" + port
	if a, ok := w.ports[key]; ok {
		return a
	}
	var a string
	switch port {
	case "8080":
		a, w.shared[key] = w.sys.gateway, true
	case "8081":
		a, w.shared[key] = w.sys.admin, true
	case "9002":
		a, w.shared[key] = w.sys.extproc, true
	case "2379":
		a = w.startEtcd()
	case "4222":
		a = w.startNATS()
	default:
		a = net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort()))
	}
	_ = host
	w.ports[key] = a
	return a
}

func (w *walker) startEtcd() string {
	if w.etcd == "" {
		eps := testenv.StartEtcdServer(w.t)
		u, err := url.Parse(eps[0])
		if err != nil {
			w.t.Fatal(err)
		}
		w.etcd = u.Host
		w.ports["127.0.0.1:2379"] = w.etcd
	}
	return w.etcd
}

func (w *walker) startNATS() string {
	if w.nats == "" {
		u, err := url.Parse(testenv.StartNATS(w.t))
		if err != nil {
			w.t.Fatal(err)
		}
		w.nats = u.Host
		w.ports["127.0.0.1:4222"] = w.nats
	}
	return w.nats
}

func (w *walker) script(text string) string {
	return "set -o pipefail\n" + strings.Join(w.prelude, "\n") + "\n" + text + "\n"
}

// run runs a foreground command and checks its exit status and output.
func (w *walker) run(c command, where string, known bool) {
	text := w.rewrite(c.text)
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := w.command(ctx, text)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	// a reader runs the next command seconds after a server starts: a
	// command with an expectation of the table (or a docwalk: expect)
	// that fails or misses it gets those seconds (the README's BestWorker
	// right after its mocker registers)
	expects := !known && len(w.tb.expectations(c))+len(c.expect) > 0
	for deadline := start.Add(settle); expects && (err != nil || w.checkOutput(c, string(out)) != "") && time.Now().Before(deadline); {
		time.Sleep(250 * time.Millisecond)
		cmd = w.command(ctx, text)
		out, err = cmd.CombinedOutput()
	}
	w.ran = append(w.ran, fmt.Sprintf("%s %s (%v)", where, firstLine(c.text), time.Since(start).Round(time.Millisecond)))
	problem := ""
	if err != nil {
		problem = fmt.Sprintf("exit: %v", err)
	} else {
		problem = w.checkOutput(c, string(out))
	}
	w.verdict(c, where, text, known, problem, string(out), time.Since(start))
}

// command is a foreground command in bash, in its own process group.
func (w *walker) command(ctx context.Context, text string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "bash", "-c", w.script(text))
	cmd.Dir = w.dir
	cmd.Env = w.env()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = stopTimeout
	return cmd
}

var (
	statusRE      = regexp.MustCompile(`(?m)^HTTP/[0-9.]+ (\d{3})`)
	shownHeaderRE = regexp.MustCompile(`(?mi)^\s*(x-[a-z0-9-]+|content-type):`)
)

// tableHeader is the column header of a replay report (its line whose
// first word is topology or pareto), spaces collapsed.
func tableHeader(out string) (string, bool) {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) > 2 && (f[0] == "topology" || f[0] == "pareto") {
			return strings.Join(f, " "), true
		}
	}
	return "", false
}

// firstStatus is the first status of a response that is not 1xx.
func firstStatus(out string) string {
	for _, m := range statusRE.FindAllStringSubmatch(out, -1) {
		if m[1][0] != '1' {
			return m[1]
		}
	}
	return "(none)"
}

// checkOutput applies the expectations and, to a curl's printed status
// lines, the 2xx rule.
func (w *walker) checkOutput(c command, out string) string {
	want := w.tb.expectations(c)
	for _, re := range c.expect {
		want = append(want, re.String())
	}
	statusExpected := false
	for _, s := range want {
		if strings.Contains(s, "HTTP/") {
			statusExpected = true
		}
		if !regexp.MustCompile(s).MatchString(out) {
			return fmt.Sprintf("output does not match %q", s)
		}
	}
	// what the document shows: its status, its X-* and Content-Type
	// header names, its end of stream
	if m := statusRE.FindStringSubmatch(c.output); m != nil {
		statusExpected = true
		if got := firstStatus(out); got != m[1] {
			return fmt.Sprintf("HTTP status %s where the document shows %s", got, m[1])
		}
	}
	for _, m := range shownHeaderRE.FindAllStringSubmatch(c.output, -1) {
		if !regexp.MustCompile(`(?mi)^` + regexp.QuoteMeta(m[1]) + `:`).MatchString(out) {
			return fmt.Sprintf("no header %s, which the document shows", m[1])
		}
	}
	if strings.Contains(c.output, "data: [DONE]") && !strings.Contains(out, "data: [DONE]") {
		return "no data: [DONE], which the document shows"
	}
	if shown, ok := tableHeader(c.output); ok {
		if got, _ := tableHeader(out); got != shown {
			return fmt.Sprintf("table columns %q where the document shows %q", got, shown)
		}
	}
	if !statusExpected {
		for _, m := range statusRE.FindAllStringSubmatch(out, -1) {
			if m[1][0] != '2' && m[1][0] != '1' {
				return "HTTP status " + m[1]
			}
		}
	}
	return ""
}

func (w *walker) verdict(c command, where, text string, known bool, problem, out string, took time.Duration) {
	switch {
	case problem != "" && known:
		w.t.Logf("%s: known failing (%s): %s", where, problem, lastLine(out))
	case problem != "":
		w.t.Errorf("%s: %s\n  as written: %s\n  as run:     %s\n  output:\n%s", where, problem, c.text, text, indent(out))
	case known:
		w.t.Errorf("%s: in knownFailing but passes now (in %v): remove its row\n  %s", where, took.Round(time.Millisecond), c.text)
	}
}

// lastLine is the last line of a command's output: where its error is.
func lastLine(s string) string {
	l := strings.TrimSpace(s)
	if i := strings.LastIndexByte(l, '\n'); i >= 0 {
		l = l[i+1:]
	}
	return firstLine(l)
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return strings.ReplaceAll(s, "\n", " | ")
}

func indent(s string) string {
	if len(s) > 4000 {
		s = s[:2000] + "\n…\n" + s[len(s)-2000:]
	}
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}

// server is a document's background command.
type server struct {
	where   string
	cmd     *exec.Cmd
	out     *syncBuffer
	done    chan struct{}
	err     error
	known   bool
	addrs   []string
	stopped bool // stopped by the walk
}

func (s *server) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// stop sends SIGINT to the server's process group, then SIGKILL after
// stopTimeout.
func (s *server) stop() error {
	if s.exited() {
		return nil
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGINT)
	select {
	case <-s.done:
		return nil
	case <-time.After(stopTimeout):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
		return errors.New("did not stop within " + stopTimeout.String() + " of SIGINT")
	}
}

// serve starts a server in the background and waits for its listening
// addresses; a server of the document already on one of them is stopped
// first, as the reader would have.
func (w *walker) serve(c command, where string, known bool) {
	sub := serverRE.FindStringSubmatch(strings.TrimSpace(c.text))[1]
	env := w.env()
	var addrs []string
	for flag, def := range serverDefaults[sub] {
		doc, given := "", false
		if m := regexp.MustCompile(`\s--?` + flag + `[ =](\S+)`).FindStringSubmatch(c.text); m != nil {
			doc, given = m[1], true
		} else if def == "" {
			continue
		} else {
			doc = def
		}
		real, ok := w.listenAddr(flag, doc)
		if !ok {
			continue // not an address of this machine (:7100, a host name): left as written
		}
		if !given {
			env = append(env, envName(flag)+"="+real)
		}
		if flag != "zmq-endpoint" && !slices.Contains(addrs, hostPort(flag, real)) {
			addrs = append(addrs, hostPort(flag, real))
		}
	}
	text := w.rewrite(c.text)
	for _, a := range addrs {
		if prev := w.owner[a]; prev != nil && !prev.exited() {
			w.t.Logf("%s: stopping %s (it holds %s)", where, prev.where, a)
			w.finish(prev)
		}
	}
	cmd := exec.Command("bash", "-c", w.script("exec "+text))
	cmd.Dir, cmd.Env = w.dir, env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	w.ran = append(w.ran, fmt.Sprintf("%s %s (server)", where, firstLine(c.text)))
	if err := cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	s := &server{where: where, cmd: cmd, out: out, done: make(chan struct{}), known: known, addrs: addrs}
	go func() { s.err = cmd.Wait(); close(s.done) }()
	w.servers = append(w.servers, s)
	for _, a := range addrs {
		w.owner[a] = s
	}
	problem := w.waitReady(s)
	w.verdict(c, where, text, known, problem, out.String(), 0)
	if problem != "" {
		_ = s.stop()
		s.known = true // reported
	}
}

func (w *walker) waitReady(s *server) string {
	deadline := time.Now().Add(readyTimeout)
	if len(s.addrs) == 0 {
		select {
		case <-s.done:
			return fmt.Sprintf("exited at once: %v", s.err)
		case <-time.After(time.Second):
			return ""
		}
	}
	for _, a := range s.addrs {
		for {
			conn, err := net.DialTimeout("tcp", a, 200*time.Millisecond)
			if err == nil {
				conn.Close()
				break
			}
			if s.exited() {
				return fmt.Sprintf("exited before listening on %s: %v", a, s.err)
			}
			if time.Now().After(deadline) {
				return fmt.Sprintf("not listening on %s after %v", a, readyTimeout)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return ""
}

// finish stops a server, reporting one that died on its own.
func (w *walker) finish(s *server) {
	if s.exited() && !s.known && !s.stopped {
		w.t.Errorf("%s: server exited during the walk: %v\n  output:\n%s", s.where, s.err, indent(s.out.String()))
		s.known = true
	}
	s.stopped = true
	if err := s.stop(); err != nil {
		w.t.Errorf("%s: %v\n%s", s.where, err, indent(s.out.String()))
	}
}

func (w *walker) stopServers() {
	// stop in reverse order of start: clients before the routers they use
	for i := len(w.servers) - 1; i >= 0; i-- {
		w.finish(w.servers[i])
	}
	w.servers = nil
}

// syncBuffer is a bytes.Buffer safe for a process's writes and the test's
// reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
