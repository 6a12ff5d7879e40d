package docwalk

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testenv"
)

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
	defer w.stopServers() // on a t.Fatal too; before the embedded etcd and NATS close
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
	addrRE   = regexp.MustCompile(`(\b127\.0\.0\.1|\blocalhost|\*):(\d{2,5})\b`)
	portRE   = regexp.MustCompile(`(\s--?port[ =])(\d{2,5})\b`)
	tmpRE    = regexp.MustCompile(`(^|[\s='"])/tmp/`)
	binRE    = regexp.MustCompile(`(^|[\s;|&(])bin/kvgate\b`)
	maxReqRE = regexp.MustCompile(`--?max-requests[ =](\d+)`)
	replayRE = regexp.MustCompile(`\bkvgate (?:policy )?replay\b[^-\n]*`)
	// benchRE and overloadRE find `kvgate bench -overload`; overloadSetRE
	// its windows when the command sets them itself.
	benchRE       = regexp.MustCompile(`\bkvgate bench\b`)
	overloadRE    = regexp.MustCompile(`(^|\s)--?overload(\s|$)`)
	overloadSetRE = regexp.MustCompile(`--?overload-(?:calibration|duration)\b`)
)

// rewrite is the command as the walk runs it: its binaries, its ports,
// /tmp, its replay size and its overload bench's windows moved.
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
	if loc := benchRE.FindStringIndex(text); loc != nil && overloadRE.MatchString(text) && !overloadSetRE.MatchString(text) {
		text = text[:loc[1]] + " " + overloadWindows + text[loc[1]:]
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
	if !ok || w.shared[key] || !w.reusable(real) {
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

// reusable reports whether a port the walk gave an earlier server of the
// document can be given again: that server still holds it (serve stops it
// first, as the reader would), or nobody does. A port the earlier server
// let go may since have been taken by another test package's process (an
// ephemeral port): then the walk picks a new one, and the document's later
// commands follow the new mapping.
func (w *walker) reusable(addr string) bool {
	if s := w.owner[addr]; s != nil && !s.exited() {
		return true
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
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
