// Command tessera-sim replays the openb GPU trace through kube-scheduler with
// Tessera's plugin and shipped profiles, following the FGD artifact's
// protocol, and writes the allocation curves (the artifact's CSV layout), a
// table of unallocated GPU at arrived = 100 % beside the artifact's figures,
// and one plot per trace. See docs/performance.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/term"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/sim"
	"github.com/tessera-gpu/tessera/pkg/simreport"
	"github.com/tessera-gpu/tessera/pkg/trace"
)

const (
	nodeFile     = "openb_node_list_gpu_node.csv"
	artifactFile = "fgd_artifact_allocation.csv"
	resultsFile  = "allocation.csv"
	tableFile    = "summary.md"
)

type options struct {
	traces     string
	workloads  string
	profiles   string
	seeds      string
	parallel   int
	out        string
	plotFormat string
	reportOnly bool
}

func main() {
	var o options
	flag.StringVar(&o.traces, "traces", "../shared/traces/openb", "directory with the openb node list, task lists and the FGD artifact's results")
	flag.StringVar(&o.workloads, "workloads", "default", `task lists to replay, comma-separated short names (e.g. "default,gpushare40"), or "all"`)
	flag.StringVar(&o.profiles, "profiles", "", "scheduler profiles to replay with, comma-separated (default: every shipped profile)")
	flag.StringVar(&o.seeds, "seeds", "42-51", `seeds, e.g. "42-51" or "42,43"`)
	flag.IntVar(&o.parallel, "parallel", runtime.NumCPU(), "replays run at once")
	flag.StringVar(&o.out, "out", "sim-results", "output directory; its "+resultsFile+" is kept and extended across runs")
	flag.StringVar(&o.plotFormat, "plot-format", "png", "plot file type: png, svg or pdf")
	flag.BoolVar(&o.reportOnly, "report-only", false, "only rewrite the table and plots from "+resultsFile)
	flag.Parse()
	klog.SetLogger(logr.Discard())
	// Replays allocate many short-lived objects; trade memory for less GC.
	debug.SetGCPercent(400)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(klog.NewContext(ctx, logr.Discard()), o, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "tessera-sim:", err)
		os.Exit(1)
	}
}

type job struct {
	workload string
	profile  string
	seed     uint64
}

// run replays what o asks for (or nothing, with --report-only) and writes the
// report; the table and file names go to out, progress to progress.
func run(ctx context.Context, o options, out, progress io.Writer) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	resultsPath := filepath.Join(o.out, resultsFile)
	previous, err := readRuns(resultsPath)
	if err != nil {
		return err
	}
	var runs []simreport.Run
	if o.reportOnly {
		runs = previous
	} else {
		jobs, err := plan(o)
		if err != nil {
			return err
		}
		runs, err = replay(ctx, o, jobs, previous, resultsPath, progress)
		if err != nil {
			return err
		}
	}
	return report(o, runs, out)
}

// plan lists the replays the flags ask for.
func plan(o options) ([]job, error) {
	workloads, err := workloadNames(o.traces, o.workloads)
	if err != nil {
		return nil, err
	}
	profiles := splitList(o.profiles)
	if len(profiles) == 0 {
		if profiles, err = sim.Profiles(); err != nil {
			return nil, err
		}
	}
	seeds, err := parseSeeds(o.seeds)
	if err != nil {
		return nil, err
	}
	var jobs []job
	for _, w := range workloads {
		for _, p := range profiles {
			for _, s := range seeds {
				jobs = append(jobs, job{workload: w, profile: p, seed: s})
			}
		}
	}
	return jobs, nil
}

// replay runs the jobs o.parallel at a time, saving the results file after
// each so an interrupted run keeps what it finished.
func replay(ctx context.Context, o options, jobs []job, previous []simreport.Run, resultsPath string, progress io.Writer) ([]simreport.Run, error) {
	nodes, err := readFile(filepath.Join(o.traces, nodeFile), trace.ReadNodes)
	if err != nil {
		return nil, err
	}
	tasks := map[string][]trace.Task{}
	for _, j := range jobs {
		if tasks[j.workload] == nil {
			if tasks[j.workload], err = readFile(filepath.Join(o.traces, simreport.TracePrefix+j.workload+".csv"), trace.ReadTasks); err != nil {
				return nil, err
			}
		}
	}
	// Results of the jobs about to run replace earlier ones.
	runs := slices.DeleteFunc(previous, func(r simreport.Run) bool {
		return slices.Contains(jobs, job{workload: r.Trace, profile: r.Policy, seed: r.Seed})
	})
	bar := newProgress(progress, len(jobs))
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	queue := make(chan job)
	for w := 0; w < max(o.parallel, 1); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range queue {
				name := fmt.Sprintf("%s/%s/%d", j.workload, j.profile, j.seed)
				res, err := sim.Run(ctx, sim.Config{
					Nodes: nodes, Tasks: tasks[j.workload], Seed: j.seed, Profile: j.profile,
					Progress: func(done, total int) { bar.update(name, done, total) },
				})
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("%s: %w", name, err)
				}
				if err == nil {
					runs = append(runs, simreport.FromResult(j.workload, res))
					if res.Errors > 0 {
						bar.note(fmt.Sprintf("%s: %d tasks failed with scheduler errors", name, res.Errors))
					}
					if err := writeRuns(resultsPath, runs); err != nil && firstErr == nil {
						firstErr = err
					}
				}
				bar.finish(name, res)
				mu.Unlock()
			}
		}()
	}
	for _, j := range jobs {
		mu.Lock()
		failed := firstErr != nil
		mu.Unlock()
		if failed || ctx.Err() != nil {
			break
		}
		queue <- j
	}
	close(queue)
	wg.Wait()
	bar.end()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return runs, firstErr
}

// report writes the table and a plot per trace.
func report(o options, runs []simreport.Run, out io.Writer) error {
	artifactRuns, err := readRuns(filepath.Join(o.traces, artifactFile))
	if err != nil {
		return err
	}
	tessera, artifact := simreport.Means(runs), simreport.Means(artifactRuns)
	var traces, policies []string
	for _, m := range tessera {
		if !slices.Contains(traces, m.Trace) {
			traces = append(traces, m.Trace)
		}
		if !slices.Contains(policies, m.Policy) {
			policies = append(policies, m.Policy)
		}
	}
	slices.Sort(traces)
	table := "Unallocated GPU % at arrived workload = 100 % of capacity (mean over seeds; lower is better). " +
		"Tessera's profiles in bold, then the FGD artifact's policies.\n\n" + simreport.Table(tessera, artifact, policies, traces)
	if err := os.WriteFile(filepath.Join(o.out, tableFile), []byte(table), 0o644); err != nil {
		return err
	}
	fmt.Fprintln(out, table)
	for _, t := range traces {
		path := filepath.Join(o.out, t+"."+o.plotFormat)
		if err := simreport.Plot(path, t, tessera, artifact); err != nil {
			return fmt.Errorf("plotting %s: %w", t, err)
		}
		fmt.Fprintln(out, "wrote", path)
	}
	return nil
}

func workloadNames(dir, list string) ([]string, error) {
	if list != "all" {
		return splitList(list), nil
	}
	files, err := filepath.Glob(filepath.Join(dir, simreport.TracePrefix+"*.csv"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no task lists %s*.csv in %s", simreport.TracePrefix, dir)
	}
	var names []string
	for _, f := range files {
		names = append(names, strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), simreport.TracePrefix), ".csv"))
	}
	return names, nil
}

func parseSeeds(s string) ([]uint64, error) {
	var seeds []uint64
	for _, part := range splitList(s) {
		lo, hi, isRange := strings.Cut(part, "-")
		first, err := strconv.ParseUint(lo, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("--seeds %q: %w", s, err)
		}
		last := first
		if isRange {
			if last, err = strconv.ParseUint(hi, 10, 64); err != nil || last < first {
				return nil, fmt.Errorf("--seeds %q: bad range %q", s, part)
			}
		}
		for v := first; v <= last; v++ {
			seeds = append(seeds, v)
		}
	}
	if len(seeds) == 0 {
		return nil, fmt.Errorf("--seeds: none given")
	}
	return seeds, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func readFile[T any](path string, read func(io.Reader) (T, error)) (T, error) {
	f, err := os.Open(path)
	if err != nil {
		var zero T
		return zero, err
	}
	defer f.Close()
	v, err := read(f)
	if err != nil {
		return v, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// readRuns reads a results file; a missing one holds no runs.
func readRuns(path string) ([]simreport.Run, error) {
	runs, err := readFile(path, simreport.ReadCSV)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return runs, err
}

func writeRuns(path string, runs []simreport.Run) error {
	sorted := slices.Clone(runs)
	slices.SortStableFunc(sorted, func(a, b simreport.Run) int {
		if c := strings.Compare(a.Trace, b.Trace); c != 0 {
			return c
		}
		if c := strings.Compare(a.Policy, b.Policy); c != 0 {
			return c
		}
		return int(a.Seed) - int(b.Seed)
	})
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := simreport.WriteCSV(f, sorted); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// progressBar reports the replays. On a terminal it draws one status line:
// finished replays out of all, and the progress of those running. Elsewhere
// (a log, CI) it writes only a line per finished replay.
type progressBar struct {
	mu       sync.Mutex
	w        io.Writer
	live     bool
	total    int
	finished int
	running  map[string]float64
	drawn    time.Time
}

func newProgress(w io.Writer, total int) *progressBar {
	f, ok := w.(*os.File)
	live := ok && term.IsTerminal(int(f.Fd()))
	return &progressBar{w: w, live: live, total: total, running: map[string]float64{}}
}

func (b *progressBar) update(name string, done, total int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.running[name] = float64(done) / float64(total)
	if b.live && time.Since(b.drawn) > 250*time.Millisecond {
		b.draw()
	}
}

func (b *progressBar) finish(name string, res *sim.Result) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.running, name)
	b.finished++
	if res != nil {
		b.line(fmt.Sprintf("%s: %.2f%% unallocated at arrived 100%%, %d/%d tasks placed, %s (%d/%d replays)", name, res.Unallocated(), res.Placed, res.Tasks, res.Elapsed.Round(time.Second), b.finished, b.total))
	}
	if b.live {
		b.draw()
	}
}

func (b *progressBar) note(msg string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.line(msg)
}

// line writes msg on a line of its own, over the status line when live.
func (b *progressBar) line(msg string) {
	if b.live {
		fmt.Fprint(b.w, "\r\033[K")
	}
	fmt.Fprintln(b.w, msg)
}

// end moves past the status line.
func (b *progressBar) end() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.live {
		b.draw()
		fmt.Fprintln(b.w)
	}
}

func (b *progressBar) draw() {
	b.drawn = time.Now()
	frac := float64(b.finished)
	names := make([]string, 0, len(b.running))
	for name, f := range b.running {
		frac += f
		names = append(names, fmt.Sprintf("%s %d%%", name, int(f*100)))
	}
	slices.Sort(names)
	const width = 30
	filled := int(frac / float64(b.total) * width)
	fmt.Fprintf(b.w, "\r\033[K[%s%s] %d/%d replays  %s", strings.Repeat("#", filled), strings.Repeat(".", width-filled), b.finished, b.total, strings.Join(names, "  "))
}
