package validate

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// BuildLine is the `go build` command of a Dockerfile: its environment
// assignments and its arguments, with the output path.
type BuildLine struct {
	Env    []string // KEY=VALUE
	Args   []string // after "go": build ... -o OUT PKG
	Output string
}

// ReadBuildLine finds the one RUN line of dockerfile that runs `go build`
// and splits it as sh would (quotes, no expansion).
func ReadBuildLine(dockerfile string) (BuildLine, error) {
	data, err := os.ReadFile(dockerfile)
	if err != nil {
		return BuildLine{}, err
	}
	var found []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "RUN ") && strings.Contains(line, "go build") {
			found = append(found, strings.TrimPrefix(line, "RUN "))
		}
	}
	if len(found) != 1 {
		return BuildLine{}, fmt.Errorf("%s: %d RUN lines with `go build`, want exactly 1", dockerfile, len(found))
	}
	words, err := shellWords(found[0])
	if err != nil {
		return BuildLine{}, fmt.Errorf("%s: %w", dockerfile, err)
	}
	var bl BuildLine
	i := 0
	for ; i < len(words) && strings.Contains(words[i], "=") && !strings.HasPrefix(words[i], "-"); i++ {
		bl.Env = append(bl.Env, words[i])
	}
	if i >= len(words) || words[i] != "go" || i+1 >= len(words) || words[i+1] != "build" {
		return BuildLine{}, fmt.Errorf("%s: %q: want [VAR=value]... go build <args>", dockerfile, found[0])
	}
	bl.Args = words[i+1:]
	for j, a := range bl.Args {
		if a == "-o" && j+1 < len(bl.Args) {
			bl.Output = bl.Args[j+1]
		}
	}
	if bl.Output == "" {
		return BuildLine{}, fmt.Errorf("%s: the go build line has no -o", dockerfile)
	}
	return bl, nil
}

// shellWords splits s into words with sh's quoting rules for '...' and
// "..." (no variables, no escapes beyond \" in double quotes).
func shellWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, errors.New("unterminated single quote")
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case ch == '"':
			j := i + 1
			for ; j < len(s) && s[j] != '"'; j++ {
				if s[j] == '\\' && j+1 < len(s) {
					j++
				}
			}
			if j >= len(s) {
				return nil, errors.New("unterminated double quote")
			}
			cur.WriteString(strings.ReplaceAll(s[i+1:j], `\"`, `"`))
			i = j
			inWord = true
		case ch == ' ' || ch == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case ch == '&' || ch == ';' || ch == '|':
			return nil, fmt.Errorf("the build line must be one command, found %q", ch)
		default:
			cur.WriteByte(ch)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// BuildBinary runs bl in repo with the output redirected to out.
func BuildBinary(ctx context.Context, bl BuildLine, repo, out string) error {
	args := append([]string(nil), bl.Args...)
	for j := range args {
		if args[j] == bl.Output && j > 0 && args[j-1] == "-o" {
			args[j] = out
		}
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = repo
	cmd.Env = append(append(os.Environ(), "GOFLAGS=-buildvcs=false"), bl.Env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return nil
}

// CheckStatic reports an error unless path is an ELF executable with no
// program interpreter and no dynamic section: it runs on a base image
// without libc.
func CheckStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		switch p.Type {
		case elf.PT_INTERP:
			return fmt.Errorf("%s: has a program interpreter (PT_INTERP): dynamically linked", path)
		case elf.PT_DYNAMIC:
			return fmt.Errorf("%s: has a dynamic section (PT_DYNAMIC): dynamically linked", path)
		}
	}
	if f.Type != elf.ET_EXEC {
		return fmt.Errorf("%s: ELF type %v, want a static executable (ET_EXEC)", path, f.Type)
	}
	return nil
}

var flagLine = regexp.MustCompile(`^\s+-([a-zA-Z0-9][a-zA-Z0-9._-]*)`)

// ReadFlags runs `bin <sub> -h` for each subcommand and collects the flag
// names its usage lists.
func ReadFlags(ctx context.Context, bin string, subs []string) (Flags, error) {
	out := Flags{}
	for _, sub := range subs {
		cmd := exec.CommandContext(ctx, bin, sub, "-h")
		cmd.Dir = filepath.Dir(bin)
		b, _ := cmd.CombinedOutput() // -h exits 0 or 2 depending on the parser
		names := map[string]bool{}
		for _, line := range strings.Split(string(b), "\n") {
			if m := flagLine.FindStringSubmatch(line); m != nil {
				names[m[1]] = true
			}
		}
		if len(names) == 0 {
			return nil, fmt.Errorf("kvgate %s -h listed no flags:\n%s", sub, b)
		}
		out[sub] = names
	}
	return out, nil
}
