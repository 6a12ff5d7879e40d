package main

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// maxLines is the most lines a hand-written Go file may hold: past it a
// file holds more than one concern and is split by concern (STYLE.md).
const maxLines = 600

// long is a hand-written Go file over maxLines.
type long struct {
	path  string
	lines int
}

func (l long) String() string {
	return fmt.Sprintf("%s: %d lines, over %d: split it by concern", l.path, l.lines, maxLines)
}

// longFiles reports the hand-written Go files under dir, tests included,
// with more than max lines. Generated files (Go's "Code generated ... DO
// NOT EDIT." line), testdata and hidden directories are skipped.
func longFiles(dir string, max int) ([]long, error) {
	var out []long
	err := walkSources(dir, func(p string, src []byte) error {
		n := bytes.Count(src, []byte("\n"))
		if len(src) > 0 && src[len(src)-1] != '\n' {
			n++
		}
		if n > max {
			out = append(out, long{p, n})
		}
		return nil
	})
	return out, err
}

// walkSources calls fn with the path and contents of every hand-written Go
// file under dir, tests included: generated files (Go's "Code generated
// ... DO NOT EDIT." line), testdata, hidden and _ directories are skipped.
func walkSources(dir string, fn func(path string, src []byte) error) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != dir && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if generated(src) {
			return nil
		}
		return fn(p, src)
	})
}
