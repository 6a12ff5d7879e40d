package globalrouter

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"gopkg.in/yaml.v3"
)

// What WatchFile looks at: the configuration file and every file it
// references — the pools' policy files, the models' tokenizer files and
// chat templates, flow control's objectives file — and the shadow file (WithShadowFile). The list is read
// from the configuration file's content at each look, not from the current
// configuration, so a file a refused configuration added is watched too: fixing it
// reloads.

// refsView is the lenient view of a configuration file that names the
// files it references (the strict decode is parseConfig's).
type refsView struct {
	Pools []struct {
		PolicyFile string `yaml:"policy_file"`
	} `yaml:"pools"`
	Models []struct {
		Tokenizer struct {
			Path         string `yaml:"path"`
			ChatTemplate string `yaml:"chat_template"`
		} `yaml:"tokenizer"`
	} `yaml:"models"`
	FlowControl struct {
		ObjectivesFile string `yaml:"objectives_file"`
	} `yaml:"flow_control"`
}

// ReferencedFiles returns the files the configuration file at file, of
// content data, references, resolved against its folder, sorted and
// distinct. A file that does not parse references nothing.
func ReferencedFiles(file string, data []byte) []string {
	var v refsView
	if yaml.Unmarshal(data, &v) != nil {
		return nil
	}
	var out []string
	add := func(p string) {
		if p == "" {
			return
		}
		if !filepath.IsAbs(p) && file != "" && file[0] != '<' {
			p = filepath.Join(filepath.Dir(file), p)
		}
		out = append(out, p)
	}
	for _, p := range v.Pools {
		add(p.PolicyFile)
	}
	for _, m := range v.Models {
		add(m.Tokenizer.Path)
		add(m.Tokenizer.ChatTemplate)
	}
	add(v.FlowControl.ObjectivesFile)
	slices.Sort(out)
	return slices.Compact(out)
}

// watchSum is the SHA-256 of data (file's content) and of the content of
// every file it references (a missing one, or a folder, by its error or
// its name only; one past 1 MiB by its size and modification time).
func watchSum(file string, data []byte) [32]byte {
	h := sha256.New()
	h.Write(data)
	for _, ref := range ReferencedFiles(file, data) {
		h.Write([]byte{0})
		h.Write([]byte(ref))
		h.Write([]byte{0})
		writeFile(h, ref)
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

// bigFile is the size past which a referenced file (a tokenizer.json of
// many megabytes) is known by its size and modification time rather than
// hashed at every look.
const bigFile = 1 << 20

func writeFile(h io.Writer, path string) {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		h.Write([]byte("error: " + err.Error()))
		return
	case !fi.Mode().IsRegular():
		h.Write([]byte("not a regular file"))
		return
	case fi.Size() > bigFile:
		fmt.Fprintf(h, "size %d modified %d", fi.Size(), fi.ModTime().UnixNano())
		return
	}
	b, err := os.ReadFile(path)
	if err != nil {
		h.Write([]byte("error: " + err.Error()))
		return
	}
	h.Write(b)
}

// fileSum is what WatchFile compares: the configuration file with its
// references, and the shadow file.
func (r *Router) fileSum(path string) ([32]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return [32]byte{}, err
	}
	return r.withShadowSum(watchSum(path, b)), nil
}

// withShadowSum folds the shadow file's content into sum (sum unchanged
// without one).
func (r *Router) withShadowSum(sum [32]byte) [32]byte {
	if r.opts.shadowFile == "" {
		return sum
	}
	h := sha256.New()
	h.Write(sum[:])
	writeFile(h, r.opts.shadowFile)
	var out [32]byte
	h.Sum(out[:0])
	return out
}
