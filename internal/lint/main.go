// Command lint holds kvgate's own lint checks, run by `make lint` beside
// gofmt, go vet and staticcheck:
//
//	go run ./internal/lint [dir]
//
// Import aliases: one import path is called by one name across the
// module. A file that imports a package under a different name than
// another file does (localrouterv1 in one, lrv1 in the next) is reported
// with both names and where each is used. The name of an import without
// an alias is its package's name (from `go list`); blank and dot imports
// are not names and are skipped, as are testdata directories and
// generated files.
//
// File length: a hand-written Go file (tests included; generated files
// and testdata excluded) over 600 lines is reported: it holds more than
// one concern and is split by concern (length.go).
//
// File index: a package's doc comment names each of its hand-written
// files (tests and generated files aside; its doc file excepted) with what
// it holds, and no file the package does not hold; a name written with a
// path (pool/config.go) is another package's and is not checked. A
// package of a single file needs no index (fileindex.go).
//
// It exits 1 when it reports anything, 2 when it cannot run.
//
// Files: main.go (main, the import-alias check, generated), length.go
// (the file-length check; walkSources, the walk every check shares),
// fileindex.go (the file-index check).
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
)

func main() {
	dir := "."
	if len(os.Args) > 1 {
		dir = os.Args[1]
	}
	findings, err := importAliases(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lint:", err)
		os.Exit(2)
	}
	for _, f := range findings {
		fmt.Println(f)
	}
	longs, err := longFiles(dir, maxLines)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lint:", err)
		os.Exit(2)
	}
	for _, l := range longs {
		fmt.Println(l)
	}
	gaps, err := fileIndexGaps(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lint:", err)
		os.Exit(2)
	}
	for _, g := range gaps {
		fmt.Println(g)
	}
	if len(findings) > 0 || len(longs) > 0 || len(gaps) > 0 {
		os.Exit(1)
	}
}

// use is one file's name for an import path.
type use struct {
	name string
	pos  token.Position
}

// finding is an import path called by several names.
type finding struct {
	path  string
	names []string            // in order of first use
	where map[string][]string // name → the positions using it
}

func (f finding) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "import %q has %d names:", f.path, len(f.names))
	for _, n := range f.names {
		fmt.Fprintf(&sb, "\n\t%s: %s", n, strings.Join(f.where[n], ", "))
	}
	return sb.String()
}

// importAliases checks the Go files under dir.
func importAliases(dir string) ([]finding, error) {
	names, err := packageNames(dir)
	if err != nil {
		return nil, err
	}
	byPath := map[string][]use{}
	fset := token.NewFileSet()
	err = walkSources(dir, func(p string, src []byte) error {
		f, err := parser.ParseFile(fset, p, src, parser.ImportsOnly)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		for _, is := range f.Imports {
			path, err := strconv.Unquote(is.Path.Value)
			if err != nil {
				return fmt.Errorf("%s: import %s: %w", fset.Position(is.Pos()), is.Path.Value, err)
			}
			name := ""
			if is.Name != nil {
				name = is.Name.Name
			}
			if name == "_" || name == "." {
				continue
			}
			if name == "" {
				if name = names[path]; name == "" {
					name = defaultName(path)
				}
			}
			byPath[path] = append(byPath[path], use{name, fset.Position(is.Pos())})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out []finding
	for _, path := range slices.Sorted(maps.Keys(byPath)) {
		f := finding{path: path, where: map[string][]string{}}
		for _, u := range byPath[path] {
			if _, ok := f.where[u.name]; !ok {
				f.names = append(f.names, u.name)
			}
			f.where[u.name] = append(f.where[u.name], u.pos.String())
		}
		if len(f.names) > 1 {
			out = append(out, f)
		}
	}
	return out, nil
}

// packageNames maps every package the module's packages and tests import
// to its name, as `go list` reports them.
func packageNames(dir string) (map[string]string, error) {
	cmd := exec.Command("go", "list", "-e", "-deps", "-test", "-f", "{{.ImportPath}} {{.Name}}", "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list in %s: %w: %s", dir, err, strings.TrimSpace(stderr.String()))
	}
	return parseList(bytes.NewReader(out))
}

func parseList(r io.Reader) (map[string]string, error) {
	names := map[string]string{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		path, name, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			return nil, fmt.Errorf("go list: unexpected line %q", sc.Text())
		}
		if name != "" {
			names[path] = name
		}
	}
	if err := sc.Err(); err != nil {
		return nil, errors.Join(errors.New("go list output"), err)
	}
	return names, nil
}

// defaultName guesses the name of a package go list did not report: the
// last path element, without a major-version element.
func defaultName(path string) string {
	parts := strings.Split(path, "/")
	last := parts[len(parts)-1]
	if len(parts) > 1 && len(last) > 1 && last[0] == 'v' && strings.Trim(last[1:], "0123456789") == "" {
		last = parts[len(parts)-2]
	}
	return strings.ReplaceAll(last, "-", "_")
}

// generated reports a file carrying Go's "Code generated ... DO NOT EDIT."
// line before its package clause.
func generated(src []byte) bool {
	head, _, _ := bytes.Cut(src, []byte("\npackage "))
	for line := range bytes.Lines(head) {
		if bytes.HasPrefix(line, []byte("// Code generated ")) && bytes.HasSuffix(bytes.TrimSpace(line), []byte(" DO NOT EDIT.")) {
			return true
		}
	}
	return false
}
