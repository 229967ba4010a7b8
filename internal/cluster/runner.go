package cluster

import (
	"fmt"
	"os"
	"sync"
)

// runner satisfies the test-helper interface that kube-apiserver's in-process
// test server expects, outside of a Go test: logs go to logf, failures
// become errors, and cleanups run in Stop.
type runner struct {
	logf     func(format string, args ...any)
	mu       sync.Mutex
	cleanups []func()
	failed   bool
}

// fatal is the panic value of Fatal/FailNow, recovered by start.
type fatal struct{ msg string }

func (r *runner) Attr(string, string)             {}
func (r *runner) Chdir(string)                    {}
func (r *runner) Helper()                         {}
func (r *runner) Name() string                    { return "tessera" }
func (r *runner) Setenv(key, value string)        { _ = os.Setenv(key, value) }
func (r *runner) Log(args ...any)                 { r.logf("%s", fmt.Sprint(args...)) }
func (r *runner) Logf(format string, args ...any) { r.logf(format, args...) }
func (r *runner) Error(args ...any)               { r.fail(fmt.Sprint(args...)) }
func (r *runner) Errorf(format string, args ...any) {
	r.fail(fmt.Sprintf(format, args...))
}
func (r *runner) Fail()    { r.fail("failed") }
func (r *runner) FailNow() { panic(fatal{"failed"}) }
func (r *runner) Fatal(args ...any) {
	panic(fatal{fmt.Sprint(args...)})
}
func (r *runner) Fatalf(format string, args ...any) {
	panic(fatal{fmt.Sprintf(format, args...)})
}
func (r *runner) Skip(args ...any) { panic(fatal{"skipped: " + fmt.Sprint(args...)}) }
func (r *runner) Skipf(format string, args ...any) {
	panic(fatal{"skipped: " + fmt.Sprintf(format, args...)})
}
func (r *runner) SkipNow()      { panic(fatal{"skipped"}) }
func (r *runner) Skipped() bool { return false }

func (r *runner) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *runner) fail(msg string) {
	r.mu.Lock()
	r.failed = true
	r.mu.Unlock()
	r.logf("error: %s", msg)
}

func (r *runner) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

func (r *runner) TempDir() string {
	dir, err := os.MkdirTemp("", "tessera-")
	if err != nil {
		panic(fatal{err.Error()})
	}
	r.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// cleanup runs the registered cleanups, last first.
func (r *runner) cleanup() {
	r.mu.Lock()
	fs := r.cleanups
	r.cleanups = nil
	r.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}
