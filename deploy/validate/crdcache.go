package validate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// CRDCache is where the pinned CRDs are kept, in this module: a folder per
// source, module@version (slashes of the module path as '_'), holding the
// CRD files of the kinds the manifests use, copied unchanged from the
// module at their path in it, and SHA256SUMS over them. The tests read
// them from here: no download and no `go` command at test time.
// RefreshCRDCache rewrites it (KVGATE_CRD_REFRESH=1 go test -run
// TestCRDCache, after changing Sources or using a new kind).
const CRDCache = "testdata/crds"

// cacheFolder is the folder of src under the cache.
func cacheFolder(cache string, src CRDSource) string {
	return filepath.Join(cache, strings.ReplaceAll(src.Module, "/", "_")+"@"+src.Version)
}

// LoadCachedSchemas reads every CRD of sources from the cache folder.
func LoadCachedSchemas(cache string, sources []CRDSource) (Schemas, error) {
	s := Schemas{}
	for _, src := range sources {
		dir := cacheFolder(cache, src)
		var files []string
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(p, ".yaml") {
				files = append(files, p)
			}
			return err
		})
		if err != nil || len(files) == 0 {
			return nil, fmt.Errorf("no cached CRDs of %s@%s in %s (%v): run `KVGATE_CRD_REFRESH=1 go test -run TestCRDCache` in deploy/validate", src.Module, src.Version, dir, err)
		}
		sort.Strings(files)
		for _, f := range files {
			rel, _ := filepath.Rel(dir, f)
			if err := s.addFile(f, src.Module+"@"+src.Version+"/"+filepath.ToSlash(rel)); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// RefreshCRDCache rewrites the cache from the Go module cache (downloading
// the modules through the module proxy when needed): for each source, the
// files its globs match that define a kind in kinds. Folders of other
// sources or versions are removed.
func RefreshCRDCache(ctx context.Context, cache string, sources []CRDSource, kinds map[schema.GroupKind]bool) error {
	if err := os.RemoveAll(cache); err != nil {
		return err
	}
	for _, src := range sources {
		dir, err := ModuleDir(ctx, src.Module, src.Version)
		if err != nil {
			return err
		}
		var sums []string
		for _, g := range src.Globs {
			m, err := filepath.Glob(filepath.Join(dir, g))
			if err != nil {
				return err
			}
			if len(m) == 0 {
				return fmt.Errorf("%s@%s: no CRD file matches %s", src.Module, src.Version, g)
			}
			sort.Strings(m)
			for _, f := range m {
				data, err := os.ReadFile(f)
				if err != nil {
					return err
				}
				if !definesAny(data, kinds) {
					continue
				}
				rel, _ := filepath.Rel(dir, f)
				out := filepath.Join(cacheFolder(cache, src), rel)
				if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
					return err
				}
				if err := os.WriteFile(out, data, 0o644); err != nil {
					return err
				}
				sum := sha256.Sum256(data)
				sums = append(sums, hex.EncodeToString(sum[:])+"  "+filepath.ToSlash(rel))
			}
		}
		if len(sums) == 0 {
			return fmt.Errorf("%s@%s: no CRD of a kind the manifests use", src.Module, src.Version)
		}
		if err := os.WriteFile(filepath.Join(cacheFolder(cache, src), "SHA256SUMS"), []byte(strings.Join(sums, "\n")+"\n"), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// definesAny tells whether a CRD file defines a group/kind of kinds.
func definesAny(data []byte, kinds map[schema.GroupKind]bool) bool {
	for _, doc := range splitYAML(data) {
		var crd struct {
			Kind string
			Spec struct {
				Group string
				Names struct{ Kind string }
			}
		}
		if yaml.Unmarshal(doc, &crd) == nil && crd.Kind == "CustomResourceDefinition" &&
			kinds[schema.GroupKind{Group: crd.Spec.Group, Kind: crd.Spec.Names.Kind}] {
			return true
		}
	}
	return false
}

// VerifyCRDCache checks the cache against its SHA256SUMS and sources: one
// folder per source, no other, every file listed and unchanged.
func VerifyCRDCache(cache string, sources []CRDSource) []error {
	var errs []error
	want := map[string]bool{}
	for _, src := range sources {
		want[filepath.Base(cacheFolder(cache, src))] = true
	}
	entries, err := os.ReadDir(cache)
	if err != nil {
		return []error{err}
	}
	for _, e := range entries {
		if !want[e.Name()] {
			errs = append(errs, fmt.Errorf("%s/%s: not a pinned source (Sources)", cache, e.Name()))
		}
	}
	for _, src := range sources {
		dir := cacheFolder(cache, src)
		sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s@%s is not cached: %v", src.Module, src.Version, err))
			continue
		}
		listed := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
			sum, rel, ok := strings.Cut(line, "  ")
			if !ok {
				errs = append(errs, fmt.Errorf("%s/SHA256SUMS: bad line %q", dir, line))
				continue
			}
			listed[rel] = true
			data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(rel)))
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if got := sha256.Sum256(data); hex.EncodeToString(got[:]) != sum {
				errs = append(errs, fmt.Errorf("%s/%s: changed since it was copied from %s@%s", dir, rel, src.Module, src.Version))
			}
		}
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && d.Name() != "SHA256SUMS" {
				rel, _ := filepath.Rel(dir, p)
				if !listed[filepath.ToSlash(rel)] {
					errs = append(errs, fmt.Errorf("%s: not in SHA256SUMS", p))
				}
			}
			return nil
		})
	}
	return errs
}
