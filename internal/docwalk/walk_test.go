package docwalk

import (
	"bufio"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
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
	// The Dockerfile's settings, as make test's static build and non-race
	// passes use: the packages are in the build cache already, so this is
	// mostly a link, not a second build of the module.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false -trimpath")
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

// freePort is a loopback port free now, below the kernel's ephemeral
// range (net.ipv4.ip_local_port_range). The walk hands it to a server it
// starts later, and a port of the ephemeral range could meanwhile become
// another process's outbound connection or :0 listener: make test runs
// packages side by side, and the walk once failed with "address already
// in use" on such a port. Ports are taken in turn from a random start, so
// the walks of one process never hand out the same one twice; none left
// below the range: a :0 port, as before.
func freePort() int {
	portMu.Lock()
	defer portMu.Unlock()
	if portNext == 0 {
		portLow = ephemeralLow()
		portNext = portBase + rand.IntN(max(1, (portLow-portBase)/2))
	}
	for ; portNext < portLow; portNext++ {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(portNext))
		if err == nil {
			_ = l.Close()
			portNext++
			return portNext - 1
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// portBase is the lowest port freePort hands out.
const portBase = 12000

var (
	portMu            sync.Mutex
	portNext, portLow int
)

// ephemeralLow is the first port of the kernel's ephemeral range
// (32768 where it cannot be read: Linux's default).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n <= portBase {
		return 32768
	}
	return n
}
