package extprocd

import (
	"io"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tokenizer"
)

// TestDuplicateKeysFlag: -duplicate-keys (and KVGATE_DUPLICATE_KEYS)
// sets extproc.Config.DuplicateKeys; refuse is the default.
func TestDuplicateKeysFlag(t *testing.T) {
	env := func(k string) string {
		if k == "KVGATE_DUPLICATE_KEYS" {
			return "last"
		}
		return ""
	}
	noEnv := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		env  func(string) string
		want tokenizer.DuplicateKeys
	}{
		{nil, noEnv, tokenizer.DuplicatesRefuse},
		{[]string{"-duplicate-keys", "last"}, noEnv, tokenizer.DuplicatesLast},
		{[]string{"-duplicate-keys=refuse"}, env, tokenizer.DuplicatesRefuse},
		{nil, env, tokenizer.DuplicatesLast},
	} {
		o, err := parseFlags("extproc", append([]string{"-config", "p.yaml"}, tc.args...), tc.env, io.Discard)
		if err != nil || o.DuplicateKeys != tc.want {
			t.Errorf("%v: %v, %v, want %v", tc.args, o.DuplicateKeys, err, tc.want)
		}
	}
	_, err := parseFlags("extproc", []string{"-config", "p.yaml", "-duplicate-keys", "first"}, noEnv, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "duplicate-keys") || !strings.Contains(err.Error(), "refuse or last") {
		t.Errorf("-duplicate-keys first: %v, want an error naming the flag and the choices", err)
	}
}
