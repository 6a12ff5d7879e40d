//go:build unix

package loadbench

import "syscall"

// sysFDLimit is the process's own RLIMIT_NOFILE. (syscall.Setrlimit also
// updates the Go runtime's record of it, which it restores for children.)
type sysFDLimit struct{}

func (sysFDLimit) Get() (cur, max uint64, err error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, 0, err
	}
	return uint64(r.Cur), uint64(r.Max), nil
}

func (sysFDLimit) Set(cur, max uint64) error {
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: cur, Max: max})
}
