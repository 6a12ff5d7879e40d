package docwalk

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"time"
)

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
