package config_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/lib/config"
)

// TestNotFlagVariablesListed: NotFlagVariables is the one list of the
// variables kvgate's tests and harnesses read. Every KVGATE_* variable a
// Go file of the module reads by a literal name with os.Getenv or
// os.LookupEnv is listed, and internal/loadbench names its variables by
// the Env constants only (no KVGATE_* literal), so a new harness variable
// cannot be forgotten: Parse would warn about it as set but not read.
func TestNotFlagVariablesListed(t *testing.T) {
	root := filepath.Join("..", "..")
	read := regexp.MustCompile(`(?:Getenv|LookupEnv)\("(KVGATE_[A-Z0-9_]+)"\)`)
	literal := regexp.MustCompile(`"KVGATE_[A-Z0-9_]*`)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != root || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range read.FindAllSubmatch(data, -1) {
			if name := string(m[1]); !slices.Contains(config.NotFlagVariables, name) {
				t.Errorf("%s reads %s with os.Getenv, and config.NotFlagVariables (lib/config/harnessenv.go) does not list it", path, name)
			}
		}
		rel, _ := filepath.Rel(root, path)
		if strings.HasPrefix(filepath.ToSlash(rel), "internal/loadbench/") {
			for _, m := range literal.FindAll(data, -1) {
				t.Errorf("%s: %s…: name loadbench's variables by the lib/config Env constants, listed in NotFlagVariables", path, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
