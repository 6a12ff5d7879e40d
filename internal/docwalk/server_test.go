package docwalk

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

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
		} else if def == "" || !readsDefault(sub, flag, c.text) {
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
