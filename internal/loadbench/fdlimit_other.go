//go:build !unix

package loadbench

import "errors"

// sysFDLimit: no RLIMIT_NOFILE here; the soak refuses to guess.
type sysFDLimit struct{}

func (sysFDLimit) Get() (cur, max uint64, err error) {
	return 0, 0, errors.New("RLIMIT_NOFILE is unix only")
}

func (sysFDLimit) Set(cur, max uint64) error { return errors.New("RLIMIT_NOFILE is unix only") }
