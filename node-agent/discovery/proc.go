package discovery

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unicode"
)

// ContainerOfProcess returns the ID of the container whose cgroup holds
// process pid, among the IDs known accepts, from procRoot/<pid>/cgroup; ""
// for none (or a process gone). The runtimes put the container's ID in the
// cgroup's path, whatever the cgroup driver: ".../cri-containerd-<id>.scope"
// (systemd), ".../pod<uid>/<id>" (cgroupfs), ".../crio-<id>.scope" (CRI-O).
func ContainerOfProcess(procRoot string, pid uint32, known func(id string) bool) string {
	raw, err := os.ReadFile(filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10), "cgroup"))
	if err != nil {
		return ""
	}
	for _, word := range strings.FieldsFunc(string(raw), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) {
		if known(word) {
			return word
		}
	}
	return ""
}

// KillContainerProcess kills process pid (as procRoot numbers it: the
// host's) with SIGKILL once its cgroup shows it is still container's, so a
// PID reused since it was read is never killed.
func KillContainerProcess(procRoot string, pid uint32, container string) error {
	if pid == 0 {
		return fmt.Errorf("no process of container %s is known", container)
	}
	cgroup, err := os.ReadFile(filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10), "cgroup"))
	if err != nil {
		return fmt.Errorf("reading process %d: %w", pid, err)
	}
	if !strings.Contains(string(cgroup), container) {
		return fmt.Errorf("process %d is no longer container %s's", pid, container)
	}
	if err := syscall.Kill(int(pid), syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing process %d: %w", pid, err)
	}
	return nil
}
