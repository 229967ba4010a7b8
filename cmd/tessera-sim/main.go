// Command tessera-sim replays the openb GPU trace through kube-scheduler with
// Tessera's plugin and shipped profiles, following the FGD artifact's
// protocol, and writes the allocation curves (the artifact's CSV layout), a
// table of unallocated GPU at arrived = 100 % beside the artifact's figures,
// and one plot per trace. With --departures tasks also leave after their
// trace duration, and it writes allocation over time and pod waits instead.
// See docs/performance.md.
package main

import (
	"cmp"
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
	// departuresFile and departuresTableFile are --departures' results and
	// table.
	departuresFile      = "departures.csv"
	departuresTableFile = "departures.md"
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
	departures bool
	load       float64
	fleet      float64
	arrivals   float64
	links      bool
	bound      bool
}

func main() {
	var o options
	flag.StringVar(&o.traces, "traces", "../shared/traces/openb", "directory with the openb node list, task lists and the FGD artifact's results")
	flag.StringVar(&o.workloads, "workloads", "default", `task lists to replay, comma-separated short names (e.g. "default,gpushare40"), or "all"`)
	flag.StringVar(&o.profiles, "profiles", "", `scheduler profiles to replay with, comma-separated, and "`+sim.RandomProfile+`" for a random choice among the nodes that fit (default: every shipped profile, and `+sim.RandomProfile+` with --departures)`)
	flag.StringVar(&o.seeds, "seeds", "42-51", `seeds, e.g. "42-51" or "42,43"`)
	flag.IntVar(&o.parallel, "parallel", runtime.NumCPU(), "replays run at once")
	flag.StringVar(&o.out, "out", "sim-results", "output directory; its "+resultsFile+" is kept and extended across runs")
	flag.StringVar(&o.plotFormat, "plot-format", "png", "plot file type: png, svg or pdf")
	flag.BoolVar(&o.reportOnly, "report-only", false, "only rewrite the table and plots from "+resultsFile+" (or "+departuresFile+")")
	flag.BoolVar(&o.departures, "departures", false, "tasks also leave, after their trace duration; the cluster starts in the steady state of --load and arrivals are a Poisson process holding it (task lists with creation and deletion times only)")
	flag.Float64Var(&o.load, "load", 1, "with --departures: the offered GPU load, as a fraction of capacity")
	flag.Float64Var(&o.fleet, "fleet", 1, "with --departures: the fraction of the GPU nodes replayed on, with the fleet's mix of nodes (a replay's cost grows with its square)")
	flag.Float64Var(&o.arrivals, "arrivals", sim.DeparturePadding, "with --departures: the GPU the arrivals ask, in multiples of the replayed fleet's capacity; more make a longer window, in which more tasks leave")
	flag.BoolVar(&o.links, "links", false, "run the topology churn simulation instead (pkg/linksim: multi-card pods on nodes with card topologies, every policy with and without topology and a HAMi-like baseline; --load defaults to 0.9 there) and write "+linksTableFile+" and a plot")
	flag.BoolVar(&o.bound, "bound", false, "compute instead, for every task list and seed, the distance to the best packing at arrived = 100 %: the lower bound on unallocated GPU (the lesser of two relaxations solved as linear programs, pkg/sim AllocationBound) and the offline packer's result (pkg/sim OfflinePack), and write "+boundTableFile)
	flag.Parse()
	if o.links && !isFlagSet("load") {
		o.load = 0.9
	}
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
	// load, fleet and arrivals are a departures replay's offered load,
	// fraction of the fleet and arrivals in multiples of its capacity, 0
	// otherwise.
	load, fleet, arrivals float64
}

// run replays what o asks for (or nothing, with --report-only) and writes the
// report; the table and file names go to out, progress to progress.
func run(ctx context.Context, o options, out, progress io.Writer) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	if o.links {
		return runLinks(o, out)
	}
	if o.bound {
		return runBound(o, out)
	}
	if o.departures {
		return departuresMode.run(ctx, o, out, progress)
	}
	return allocationMode.run(ctx, o, out, progress)
}

// mode is one kind of replay: its results file, how one job runs, and its
// report.
type mode[R any] struct {
	file      string
	read      func(io.Reader) ([]R, error)
	write     func(io.Writer, []R) error
	key       func(R) job
	replayOne func(context.Context, job, []trace.Node, []trace.Task, func(done, total int)) (R, string, error)
	report    func(options, []R, io.Writer) error
}

// run reads the mode's results file, replays the jobs o asks for into it
// (unless --report-only) and writes the report.
func (m mode[R]) run(ctx context.Context, o options, out, progress io.Writer) error {
	resultsPath := filepath.Join(o.out, m.file)
	runs, err := readRuns(resultsPath, m.read)
	if err != nil {
		return err
	}
	if !o.reportOnly {
		jobs, err := plan(o)
		if err != nil {
			return err
		}
		write := func(runs []R) error { return writeRuns(resultsPath, runs, m.key, m.write) }
		if runs, err = replay(ctx, o, jobs, runs, m.key, m.replayOne, write, progress); err != nil {
			return err
		}
	}
	return m.report(o, runs, out)
}

// allocationMode is the artifact's protocol: tasks arrive and never leave.
var allocationMode = mode[simreport.Run]{
	file: resultsFile, read: simreport.ReadCSV, write: simreport.WriteCSV,
	key: func(r simreport.Run) job { return job{workload: r.Trace, profile: r.Policy, seed: r.Seed} },
	replayOne: func(ctx context.Context, j job, nodes []trace.Node, tasks []trace.Task, update func(int, int)) (simreport.Run, string, error) {
		res, err := sim.Run(ctx, sim.Config{Nodes: nodes, Tasks: tasks, Seed: j.seed, Profile: j.profile, Progress: update})
		if err != nil {
			return simreport.Run{}, "", err
		}
		line := fmt.Sprintf("%.2f%% unallocated at arrived 100%%, %d/%d tasks placed, %s", res.Unallocated(), res.Placed, res.Tasks, res.Elapsed.Round(time.Second))
		if res.Errors > 0 {
			line += fmt.Sprintf(", %d tasks failed with scheduler errors", res.Errors)
		}
		return simreport.FromResult(j.workload, res), line, nil
	},
	report: report,
}

// departuresMode is --departures: tasks also leave.
var departuresMode = mode[simreport.DepartureRun]{
	file: departuresFile, read: simreport.ReadDeparturesCSV, write: simreport.WriteDeparturesCSV,
	key: func(r simreport.DepartureRun) job {
		return job{workload: r.Trace, profile: r.Policy, seed: r.Seed, load: r.Load, fleet: r.Fleet, arrivals: r.Arrivals}
	},
	replayOne: func(ctx context.Context, j job, nodes []trace.Node, tasks []trace.Task, update func(int, int)) (simreport.DepartureRun, string, error) {
		if len(tasks) > 0 && !tasks[0].HasDuration {
			return simreport.DepartureRun{}, "", fmt.Errorf("task list %s has no creation and deletion times, which a departures replay needs", j.workload)
		}
		res, err := sim.RunDepartures(ctx, sim.DeparturesConfig{Nodes: nodes, Tasks: tasks, Seed: j.seed, Profile: j.profile, Load: j.load, Fleet: j.fleet, Arrivals: j.arrivals, Progress: update})
		if err != nil {
			return simreport.DepartureRun{}, "", err
		}
		r := simreport.FromDepartures(j.workload, res)
		line := fmt.Sprintf("%.2f%% allocated in the second half (%.2f%% offered), %.1f%% of pods waited, p90 wait %.0f s, %d still waiting (%d for a full model), %s",
			r.MeanAllocation(), r.MeanOffered(), r.Waited, r.WaitP90, r.StillPending, r.PendingForFullModel, res.Elapsed.Round(time.Second))
		return r, line, nil
	},
	report: reportDepartures,
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
		if o.departures {
			profiles = append(profiles, sim.RandomProfile)
		}
	}
	load, fleet, arrivals := 0.0, 0.0, 0.0
	if o.departures {
		if !(o.load > 0) {
			return nil, fmt.Errorf("--load %v: want an offered load above 0", o.load)
		}
		if !(o.fleet > 0 && o.fleet <= 1) {
			return nil, fmt.Errorf("--fleet %v: want a fraction of the fleet in (0, 1]", o.fleet)
		}
		if !(o.arrivals > 0) {
			return nil, fmt.Errorf("--arrivals %v: want a multiple of the capacity above 0", o.arrivals)
		}
		load, fleet, arrivals = o.load, o.fleet, o.arrivals
	}
	seeds, err := parseSeeds(o.seeds)
	if err != nil {
		return nil, err
	}
	var jobs []job
	for _, w := range workloads {
		for _, p := range profiles {
			for _, s := range seeds {
				jobs = append(jobs, job{workload: w, profile: p, seed: s, load: load, fleet: fleet, arrivals: arrivals})
			}
		}
	}
	return jobs, nil
}

// replay runs the jobs o.parallel at a time with replayOne, saving the
// results with write after each so an interrupted run keeps what it
// finished. Results of the jobs run replace those in previous with the same
// key.
func replay[R any](ctx context.Context, o options, jobs []job, previous []R, key func(R) job,
	replayOne func(context.Context, job, []trace.Node, []trace.Task, func(done, total int)) (R, string, error),
	write func([]R) error, progress io.Writer) ([]R, error) {
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
	runs := slices.DeleteFunc(previous, func(r R) bool { return slices.Contains(jobs, key(r)) })
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
				for _, part := range setupParts(j.load, j.fleet, j.arrivals) {
					name += "/" + part
				}
				res, line, err := replayOne(ctx, j, nodes, tasks[j.workload], func(done, total int) { bar.update(name, done, total) })
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("%s: %w", name, err)
				}
				if err == nil {
					runs = append(runs, res)
					if err := write(runs); err != nil && firstErr == nil {
						firstErr = err
					}
				}
				bar.finish(name, line)
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
	artifactRuns, err := readRuns(filepath.Join(o.traces, artifactFile), simreport.ReadCSV)
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

// setupParts names a departures replay's setup: its load, and its fleet and
// arrivals where they are not the defaults ("load 0.95", "fleet 0.5"); none
// for an allocation replay (all 0).
func setupParts(load, fleet, arrivals float64) []string {
	var parts []string
	if load > 0 {
		parts = append(parts, fmt.Sprintf("load %.2f", load))
	}
	if fleet > 0 && fleet < 1 {
		parts = append(parts, fmt.Sprintf("fleet %g", fleet))
	}
	if arrivals > 0 && arrivals != sim.DeparturePadding {
		parts = append(parts, fmt.Sprintf("arrivals %g", arrivals))
	}
	return parts
}

// reportDepartures writes the departures table and a plot per setup.
func reportDepartures(o options, runs []simreport.DepartureRun, out io.Writer) error {
	means := simreport.DepartureMeans(runs)
	var policies []string
	var setups []simreport.DepartureSetup
	for _, m := range means {
		if !slices.Contains(policies, m.Policy) {
			policies = append(policies, m.Policy)
		}
		if !slices.Contains(setups, m.DepartureSetup) {
			setups = append(setups, m.DepartureSetup)
		}
	}
	// The random policy, a reference, goes last.
	if i := slices.Index(policies, sim.RandomProfile); i >= 0 {
		policies = append(slices.Delete(policies, i, i+1), sim.RandomProfile)
	}
	table := "Replays with departures: the cluster starts in the steady state of the offered load, tasks arrive as a Poisson process at that load, run their trace duration and leave; " +
		"allocated and offered GPU are means over the second half of the arrival window, waits are of the pods placed after the start (mean over seeds of each seed's percentile).\n\n" +
		simreport.DeparturesTable(means, policies)
	if err := os.WriteFile(filepath.Join(o.out, departuresTableFile), []byte(table), 0o644); err != nil {
		return err
	}
	fmt.Fprintln(out, table)
	for _, k := range setups {
		name := k.Trace + "-departures"
		for _, part := range setupParts(k.Load, k.Fleet, k.Arrivals) {
			name += "-" + strings.ReplaceAll(part, " ", "")
		}
		path := filepath.Join(o.out, name+"."+o.plotFormat)
		if err := simreport.PlotDepartures(path, k, means); err != nil {
			return fmt.Errorf("plotting %s: %w", k.Trace, err)
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
func readRuns[R any](path string, read func(io.Reader) ([]R, error)) ([]R, error) {
	runs, err := readFile(path, read)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return runs, err
}

// writeRuns replaces the results file with runs, sorted by key.
func writeRuns[R any](path string, runs []R, key func(R) job, write func(io.Writer, []R) error) error {
	sorted := slices.Clone(runs)
	slices.SortStableFunc(sorted, func(a, b R) int {
		ka, kb := key(a), key(b)
		return cmp.Or(strings.Compare(ka.workload, kb.workload), strings.Compare(ka.profile, kb.profile), cmp.Compare(ka.load, kb.load), cmp.Compare(ka.seed, kb.seed))
	})
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := write(f, sorted); err != nil {
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

// finish reports a replay done, with its summary line ("" when it failed).
func (b *progressBar) finish(name, summary string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.running, name)
	b.finished++
	if summary != "" {
		b.line(fmt.Sprintf("%s: %s (%d/%d replays)", name, summary, b.finished, b.total))
	}
	if b.live {
		b.draw()
	}
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

// isFlagSet reports whether the named flag was given.
func isFlagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
