package simreport

import (
	"cmp"
	"encoding/csv"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tessera-gpu/tessera/pkg/sim"
)

// DepartureRun is one departures replay, as a row of the departures CSV.
type DepartureRun struct {
	Trace, Policy string
	Seed          uint64
	Load          float64
	// Fleet is the fraction of the fleet replayed on (sim.ScaledFleet),
	// TotalGPUs its cards; Arrivals the GPU the arrivals asked, in
	// multiples of its capacity.
	Fleet, Arrivals float64
	TotalGPUs       int
	// Tasks, Initial, Placed, Departed, StillPending and
	// PendingForFullModel are the replay's counts (sim.DeparturesResult);
	// PendingForFullModel is -1 in files written before it was counted.
	Tasks, Initial, Placed, Departed, StillPending, PendingForFullModel int
	// Window is the arrival window, in seconds of the trace's time.
	Window float64
	// WaitP50, WaitP90 and WaitP99 are percentiles of the placed pods'
	// waits, MultiCardWaitP90 that of pods asking two cards or more, all
	// in seconds; Waited is the percentage of placed pods that waited at
	// all.
	WaitP50, WaitP90, WaitP99, MultiCardWaitP90, Waited float64
	// Allocation and Offered are sampled at sim.DepartureSamples+1 equal
	// steps of the window, in percent of capacity.
	Allocation, Offered []float64
}

// FromDepartures summarizes a departures replay.
func FromDepartures(trace string, r *sim.DeparturesResult) DepartureRun {
	waited := 0
	for _, w := range r.Waits {
		if w > 0 {
			waited++
		}
	}
	return DepartureRun{
		Trace: trace, Policy: r.Profile, Seed: r.Seed, Load: r.Load, Fleet: r.Fleet, Arrivals: r.Arrivals, TotalGPUs: r.TotalGPUs,
		Tasks: r.Tasks, Initial: r.Initial, Placed: r.Placed, Departed: r.Departed, StillPending: r.StillPending,
		PendingForFullModel: r.PendingForFullModel,
		Window:              r.Window.Seconds(),
		WaitP50:             percentile(r.Waits, 50), WaitP90: percentile(r.Waits, 90), WaitP99: percentile(r.Waits, 99),
		MultiCardWaitP90: percentile(r.MultiCardWaits, 90),
		Waited:           100 * float64(waited) / float64(max(len(r.Waits), 1)),
		Allocation:       r.Allocation, Offered: r.Offered,
	}
}

// percentile is the nearest-rank p-th percentile of the waits in seconds,
// 0 when there are none.
func percentile(waits []time.Duration, p float64) float64 {
	if len(waits) == 0 {
		return 0
	}
	sorted := slices.Sorted(slices.Values(waits))
	rank := int(float64(len(sorted))*p/100+0.999999) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)].Seconds()
}

// MeanAllocation is the mean allocation over the second half of the window,
// once the cluster has filled.
func (r DepartureRun) MeanAllocation() float64 { return secondHalfMean(r.Allocation) }

// MeanOffered is the mean offered load over the second half of the window.
func (r DepartureRun) MeanOffered() float64 { return secondHalfMean(r.Offered) }

func secondHalfMean(samples []float64) float64 {
	half := samples[len(samples)/2:]
	var sum float64
	for _, v := range half {
		sum += v
	}
	return sum / float64(len(half))
}

// departureColumns are the departures CSV's columns before the samples.
var departureColumns = []string{"workload", "sc_policy", "seed", "load", "fleet", "arrivals", "total_gpus", "tasks", "initial", "placed", "departed", "still_pending",
	"window_s", "wait_p50_s", "wait_p90_s", "wait_p99_s", "multi_card_wait_p90_s", "waited_pct"}

func departureHeader() []string {
	h := slices.Clone(departureColumns)
	for i := 0; i <= sim.DepartureSamples; i++ {
		h = append(h, "alloc_"+strconv.Itoa(i))
	}
	for i := 0; i <= sim.DepartureSamples; i++ {
		h = append(h, "offered_"+strconv.Itoa(i))
	}
	return append(h, pendingForFullModelColumn)
}

// pendingForFullModelColumn is the last column: files written before it
// was counted end at the samples, and are read with it unknown.
const pendingForFullModelColumn = "still_pending_full_model"

// WriteDeparturesCSV writes departures replays, one row each.
func WriteDeparturesCSV(w io.Writer, runs []DepartureRun) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(departureHeader()); err != nil {
		return err
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
	for _, r := range runs {
		row := []string{TracePrefix + r.Trace, r.Policy, strconv.FormatUint(r.Seed, 10), strconv.FormatFloat(r.Load, 'f', -1, 64),
			strconv.FormatFloat(r.Fleet, 'f', -1, 64), strconv.FormatFloat(r.Arrivals, 'f', -1, 64), strconv.Itoa(r.TotalGPUs), strconv.Itoa(r.Tasks), strconv.Itoa(r.Initial), strconv.Itoa(r.Placed), strconv.Itoa(r.Departed), strconv.Itoa(r.StillPending),
			f(r.Window), f(r.WaitP50), f(r.WaitP90), f(r.WaitP99), f(r.MultiCardWaitP90), f(r.Waited)}
		for _, v := range r.Allocation {
			row = append(row, f(v))
		}
		for _, v := range r.Offered {
			row = append(row, f(v))
		}
		row = append(row, strconv.Itoa(r.PendingForFullModel))
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// ReadDeparturesCSV reads what WriteDeparturesCSV wrote.
func ReadDeparturesCSV(r io.Reader) ([]DepartureRun, error) {
	records, err := csv.NewReader(r).ReadAll()
	if err != nil {
		return nil, err
	}
	want := departureHeader()
	if len(records) > 0 && slices.Equal(records[0], want[:len(want)-1]) {
		want = want[:len(want)-1]
	}
	if len(records) == 0 || !slices.Equal(records[0], want) {
		return nil, fmt.Errorf("not a departures file: want columns %s, then alloc_0..%d, offered_0..%d and %s", strings.Join(departureColumns, ","), sim.DepartureSamples, sim.DepartureSamples, pendingForFullModelColumn)
	}
	runs := make([]DepartureRun, 0, len(records)-1)
	for i, rec := range records[1:] {
		row := i + 2
		if len(rec) != len(want) {
			return nil, fmt.Errorf("row %d: %d columns, want %d", row, len(rec), len(want))
		}
		var errs []error
		num := func(col int) float64 {
			v, err := strconv.ParseFloat(rec[col], 64)
			if err != nil {
				errs = append(errs, fmt.Errorf("row %d: %s: %w", row, want[col], err))
			}
			return v
		}
		run := DepartureRun{
			Trace: strings.TrimPrefix(rec[0], TracePrefix), Policy: rec[1], Load: num(3), Fleet: num(4), Arrivals: num(5),
			TotalGPUs: int(num(6)), Tasks: int(num(7)), Initial: int(num(8)), Placed: int(num(9)), Departed: int(num(10)), StillPending: int(num(11)),
			Window: num(12), WaitP50: num(13), WaitP90: num(14), WaitP99: num(15), MultiCardWaitP90: num(16), Waited: num(17),
		}
		run.Seed = uint64(num(2))
		run.PendingForFullModel = -1
		if len(want) == len(departureHeader()) {
			run.PendingForFullModel = int(num(len(want) - 1))
		}
		first := len(departureColumns)
		for s := 0; s <= sim.DepartureSamples; s++ {
			run.Allocation = append(run.Allocation, num(first+s))
			run.Offered = append(run.Offered, num(first+sim.DepartureSamples+1+s))
		}
		if len(errs) > 0 {
			return nil, errs[0]
		}
		runs = append(runs, run)
	}
	return runs, nil
}

// DepartureSetup is what a departures replay was run on: a trace, an
// offered load, a fraction of the fleet (sim.ScaledFleet) and arrivals
// asking that many times its capacity.
type DepartureSetup struct {
	Trace                 string
	Load, Fleet, Arrivals float64
}

// FleetName says which fleet: "the whole fleet" or "25% of the fleet".
func (s DepartureSetup) FleetName() string {
	if s.Fleet == 1 {
		return "the whole fleet"
	}
	return strconv.FormatFloat(100*s.Fleet, 'f', -1, 64) + "% of the fleet"
}

// Setup is what the replay was run on.
func (r DepartureRun) Setup() DepartureSetup {
	return DepartureSetup{r.Trace, r.Load, r.Fleet, r.Arrivals}
}

// DepartureMean is the seed-averaged departures replays of one setup and
// policy.
type DepartureMean struct {
	DepartureSetup
	Policy    string
	TotalGPUs int
	Seeds     int
	// The fields below are means over the seeds of DepartureRun's.
	MeanAllocation, MeanOffered, WaitP50, WaitP90, WaitP99, MultiCardWaitP90, Waited, StillPending, Window float64
	// PendingForFullModel is the mean of the runs' PendingForFullModel,
	// -1 when a run does not know it.
	PendingForFullModel float64
	Allocation, Offered []float64
}

// DepartureMeans averages runs over seeds per setup and policy, in
// first-seen order.
func DepartureMeans(runs []DepartureRun) []DepartureMean {
	type key struct {
		setup  DepartureSetup
		policy string
	}
	var out []DepartureMean
	index := map[key]int{}
	for _, r := range runs {
		k := key{r.Setup(), r.Policy}
		i, ok := index[k]
		if !ok {
			i = len(out)
			index[k] = i
			out = append(out, DepartureMean{DepartureSetup: k.setup, Policy: r.Policy, TotalGPUs: r.TotalGPUs,
				Allocation: make([]float64, len(r.Allocation)), Offered: make([]float64, len(r.Offered))})
		}
		m := &out[i]
		m.Seeds++
		m.MeanAllocation += r.MeanAllocation()
		m.MeanOffered += r.MeanOffered()
		m.WaitP50 += r.WaitP50
		m.WaitP90 += r.WaitP90
		m.WaitP99 += r.WaitP99
		m.MultiCardWaitP90 += r.MultiCardWaitP90
		m.Waited += r.Waited
		m.StillPending += float64(r.StillPending)
		if r.PendingForFullModel < 0 || m.PendingForFullModel < 0 {
			m.PendingForFullModel = -1
		} else {
			m.PendingForFullModel += float64(r.PendingForFullModel)
		}
		m.Window += r.Window
		for s := range r.Allocation {
			m.Allocation[s] += r.Allocation[s]
			m.Offered[s] += r.Offered[s]
		}
	}
	for i := range out {
		m := &out[i]
		n := float64(m.Seeds)
		for _, v := range []*float64{&m.MeanAllocation, &m.MeanOffered, &m.WaitP50, &m.WaitP90, &m.WaitP99, &m.MultiCardWaitP90, &m.Waited, &m.StillPending, &m.Window} {
			*v /= n
		}
		if m.PendingForFullModel > 0 {
			m.PendingForFullModel /= n
		}
		for s := range m.Allocation {
			m.Allocation[s] /= n
			m.Offered[s] /= n
		}
	}
	return out
}

// DeparturesTable is a Markdown table of departures replays: a row per
// setup and policy, traces, loads and fleets sorted, policies in the order
// given.
func DeparturesTable(means []DepartureMean, policies []string) string {
	sorted := slices.Clone(means)
	slices.SortStableFunc(sorted, func(a, b DepartureMean) int {
		return cmp.Or(strings.Compare(a.Trace, b.Trace), cmp.Compare(a.Load, b.Load), cmp.Compare(a.Fleet, b.Fleet), cmp.Compare(a.Arrivals, b.Arrivals),
			slices.Index(policies, a.Policy)-slices.Index(policies, b.Policy))
	})
	var b strings.Builder
	b.WriteString("| trace | load | GPUs | arrivals (× capacity) | window | policy | seeds | GPU allocated % | GPU offered % | pods that waited % | wait p50 | wait p90 | wait p99 | multi-card wait p90 | still waiting at the end | of them for a full model |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, m := range sorted {
		fullModel := "–"
		if m.PendingForFullModel >= 0 {
			fullModel = fmt.Sprintf("%.1f", m.PendingForFullModel)
		}
		fmt.Fprintf(&b, "| %s | %.2f | %d | %g | %s | %s | %d | %.2f | %.2f | %.1f | %s | %s | %s | %s | %.1f | %s |\n",
			m.Trace, m.Load, m.TotalGPUs, m.Arrivals, seconds(m.Window), m.Policy, m.Seeds, m.MeanAllocation, m.MeanOffered, m.Waited,
			seconds(m.WaitP50), seconds(m.WaitP90), seconds(m.WaitP99), seconds(m.MultiCardWaitP90), m.StillPending, fullModel)
	}
	return b.String()
}

// seconds writes a wait briefly: "0", "42 s", "3.5 min", "2.1 h".
func seconds(s float64) string {
	switch {
	case s < 0.5:
		return "0"
	case s < 120:
		return fmt.Sprintf("%.0f s", s)
	case s < 7200:
		return fmt.Sprintf("%.1f min", s/60)
	default:
		return fmt.Sprintf("%.1f h", s/3600)
	}
}
