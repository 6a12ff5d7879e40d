package main

import (
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// indexGap is a package whose doc comment does not index its files: a
// hand-written file it does not name, or a name of a file it does not
// hold.
type indexGap struct {
	dir     string   // the package's directory
	noDoc   bool     // no file carries a package doc comment
	missing []string // hand-written files the doc comment does not name
	stale   []string // names in the doc comment of no file in the package
}

func (g indexGap) String() string {
	var parts []string
	if g.noDoc {
		parts = append(parts, "no package doc comment to index its files")
	}
	if len(g.missing) > 0 {
		parts = append(parts, "doc comment does not name "+strings.Join(g.missing, ", "))
	}
	if len(g.stale) > 0 {
		parts = append(parts, "doc comment names files it does not hold: "+strings.Join(g.stale, ", "))
	}
	return fmt.Sprintf("%s: %s (the file index: name each hand-written file with what it holds)", g.dir, strings.Join(parts, "; "))
}

// goFileName is a Go file's name in a doc comment, with the path it is
// written with, if any: a name written with a path (pool/config.go) is
// another package's file and is not checked. A name right after a
// character that may begin or continue one (`*_test.go`) is no name.
var goFileName = regexp.MustCompile(`(?:^|[^A-Za-z0-9_./*-])((?:[A-Za-z0-9_.-]+/)*[A-Za-z0-9_-][A-Za-z0-9_.-]*\.go)\b`)

// fileIndexGaps checks every package under dir: its doc comment (the
// `// Package x` comment, in doc.go or wherever it is) names each of the
// package's hand-written files (not tests, not generated; doc.go
// excepted) and no file the package does not hold (tests and generated
// files count as held). A package of a single hand-written file needs no
// index, but may not name a file it does not hold either. Testdata, hidden and underscore directories are skipped, as are
// files built only with the ignore tag.
func fileIndexGaps(dir string) ([]indexGap, error) {
	var out []indexGap
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if p != dir && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_")) {
			return filepath.SkipDir
		}
		g, err := packageIndex(p)
		if err != nil {
			return err
		}
		if g.noDoc || len(g.missing) > 0 || len(g.stale) > 0 {
			out = append(out, g)
		}
		return nil
	})
	return out, err
}

// packageIndex checks the Go package in one directory (none: no gap).
func packageIndex(dir string) (indexGap, error) {
	g := indexGap{dir: dir}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return g, err
	}
	held := map[string]bool{} // every Go file in the directory
	var own []string          // the hand-written, non-test files
	var doc strings.Builder
	fset := token.NewFileSet()
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") {
			continue
		}
		held[name] = true
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return g, err
		}
		if generated(src) || ignored(src) {
			continue
		}
		own = append(own, name)
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), src, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return g, err
		}
		if f.Doc != nil {
			doc.WriteString(f.Doc.Text())
			doc.WriteString("\n")
		}
	}
	if len(own) > 1 && doc.Len() == 0 {
		g.noDoc = true
		return g, nil
	}
	named := map[string]bool{}
	for _, m := range goFileName.FindAllStringSubmatch(doc.String(), -1) {
		if !strings.Contains(m[1], "/") {
			named[m[1]] = true
		}
	}
	for _, name := range own {
		if len(own) > 1 && name != "doc.go" && !named[name] {
			g.missing = append(g.missing, name)
		}
	}
	for name := range named {
		if !held[name] {
			g.stale = append(g.stale, name)
		}
	}
	slices.Sort(g.stale)
	return g, nil
}

// ignored reports a file built only with the ignore tag (a generator
// run by go run, not part of the package).
func ignored(src []byte) bool {
	head, _, _ := strings.Cut(string(src), "\npackage ")
	for line := range strings.Lines(head) {
		if strings.TrimSpace(line) == "//go:build ignore" {
			return true
		}
	}
	return false
}
