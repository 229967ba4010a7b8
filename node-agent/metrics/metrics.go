// Package metrics is the node agent's Prometheus endpoint: each card's
// identity, health, memory, utilisation, temperature and XID errors, and what
// each container on the node was assigned on each card and actually uses
// there. Everything is read when Prometheus scrapes, within a bounded time;
// a backend that fails or hangs never stops the agent, it only leaves its
// series out of that scrape.
package metrics

import (
	"fmt"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/version"
	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// DefaultTimeout bounds each scrape's reading of the backend.
const DefaultTimeout = 5 * time.Second

// PodLister lists the pods bound to the node (an informer's lister).
type PodLister func() ([]*v1.Pod, error)

// Collector is a prometheus.Collector reading the agent's cards, its pod
// cache and the backend's live statistics at every scrape.
type Collector struct {
	node    string
	backend discovery.Backend
	// ProcRoot is where /proc is read to find a process's container
	// ("/proc"; a temporary directory in tests).
	ProcRoot string
	// Stats reads the backend's live statistics at each scrape, within
	// DefaultTimeout and one reading at a time (nil: the backend has none).
	Stats *discovery.BoundedStats
	// Logger reports what a scrape could not read.
	Logger klog.Logger

	pods atomic.Pointer[PodLister]

	mu         sync.Mutex
	cards      []discovery.Card
	xids       map[string]map[uint64]uint64 // by card UUID, then XID
	unenforced [2]uint64                    // containers found unenforced: left, stopped

	cardInfo, memTotal, memUsed, util, temp, healthy, xidErrors *prometheus.Desc
	assignedMem, assignedCores, usedMem                         *prometheus.Desc
	unenforcedTotal                                             *prometheus.Desc
}

// New returns the collector of node's metrics, reading live statistics from
// backend when it is a discovery.StatsReader.
func New(node string, backend discovery.Backend) *Collector {
	node1 := prometheus.Labels{"node": node}
	card := []string{"card"}
	ctr := []string{"namespace", "pod", "container", "card"}
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc("tessera_agent_"+name, help, labels, node1)
	}
	return &Collector{
		node: node, backend: backend, ProcRoot: "/proc", Stats: discovery.NewBoundedStats(backend, DefaultTimeout), Logger: klog.Background(),
		xids:     map[string]map[uint64]uint64{},
		cardInfo: d("card_info", "A card of the node (always 1), with its UUID and model.", []string{"card", "uuid", "model"}),
		memTotal: d("card_memory_total_mib", "The card's memory, MiB.", card),
		memUsed:  d("card_memory_used_mib", "The card's memory in use, MiB (NVML).", card),
		util:     d("card_utilization_ratio", "The card's GPU utilisation over NVML's last sample period, 0-1.", card),
		temp:     d("card_temperature_celsius", "The card's GPU temperature, °C.", card),
		healthy:  d("card_healthy", "1 when the agent publishes the card healthy, 0 when it holds it out of service.", card),
		xidErrors: d("card_xid_errors_total", "XID errors the card raised since the agent started, by XID (critical or not).",
			[]string{"card", "xid"}),
		assignedMem:   d("container_memory_assigned_mib", "GPU memory the container was assigned on the card, MiB (its pod's tessera.io/gpu-assignment).", ctr),
		assignedCores: d("container_cores_assigned_percent", "Compute share the container was assigned on the card, percent (its pod's tessera.io/gpu-assignment).", ctr),
		unenforcedTotal: d("unenforced_containers_total", "Containers found running without enforcement when the agent connected to the runtime (created while it could not enforce), "+
			`by whether the agent stopped them ("true": they could see cards they were not given).`, []string{"stopped"}),
		usedMem: d("container_memory_used_mib", "GPU memory the container's processes use on the card, MiB (NVML's per-process accounting); "+
			`namespace, pod and container "" sum the processes of no known container.`, ctr),
	}
}

// Update records the cards as the agent last published them, health
// included; the agent calls it after every scan.
func (c *Collector) Update(cards []discovery.Card) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cards = append([]discovery.Card(nil), cards...)
}

// ObserveUnenforced counts a container found running without enforcement,
// stopped or not.
func (c *Collector) ObserveUnenforced(stopped bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if stopped {
		c.unenforced[1]++
	} else {
		c.unenforced[0]++
	}
}

// ObserveXID counts an XID error of the card with that UUID.
func (c *Collector) ObserveXID(uuid string, xid uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.xids[uuid] == nil {
		c.xids[uuid] = map[uint64]uint64{}
	}
	c.xids[uuid][xid]++
}

// SetPods gives the collector the pods bound to the node, once the agent's
// pod cache has synced; until then no container series are reported.
func (c *Collector) SetPods(list PodLister) { c.pods.Store(&list) }

// Describe sends every metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.cardInfo, c.memTotal, c.memUsed, c.util, c.temp, c.healthy, c.xidErrors, c.assignedMem, c.assignedCores, c.usedMem, c.unenforcedTotal} {
		ch <- d
	}
}

// Collect reads the cards, the pods and the backend's statistics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	c.mu.Lock()
	cards := c.cards
	uuidIndex := map[string]int{}
	for _, card := range cards {
		uuidIndex[card.UUID] = card.Index
	}
	type xidCount struct {
		uuid  string
		xid   uint64
		count uint64
	}
	var xids []xidCount
	for uuid, counts := range c.xids {
		for xid, n := range counts {
			xids = append(xids, xidCount{uuid, xid, n})
		}
	}
	unenforced := c.unenforced
	c.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.unenforcedTotal, prometheus.CounterValue, float64(unenforced[0]), "false")
	ch <- prometheus.MustNewConstMetric(c.unenforcedTotal, prometheus.CounterValue, float64(unenforced[1]), "true")

	for _, card := range cards {
		index := strconv.Itoa(card.Index)
		gauge(c.cardInfo, 1, index, card.UUID, card.Model)
		gauge(c.memTotal, float64(card.MemoryMiB), index)
		gauge(c.healthy, boolValue(card.Healthy), index)
	}

	stats := c.readStats()
	for _, st := range stats {
		if _, known := uuidIndex[st.UUID]; !known && st.UUID != "" {
			uuidIndex[st.UUID] = st.Index
		}
		index := strconv.Itoa(st.Index)
		if st.MemoryUsedMiB >= 0 {
			gauge(c.memUsed, float64(st.MemoryUsedMiB), index)
		}
		if st.Utilization >= 0 {
			gauge(c.util, st.Utilization, index)
		}
		if st.TemperatureC >= 0 {
			gauge(c.temp, st.TemperatureC, index)
		}
	}
	for _, x := range xids {
		index, ok := uuidIndex[x.uuid]
		if !ok {
			continue // a card no longer on the node
		}
		ch <- prometheus.MustNewConstMetric(c.xidErrors, prometheus.CounterValue, float64(x.count), strconv.Itoa(index), strconv.FormatUint(x.xid, 10))
	}

	pods := c.listPods()
	type series struct{ namespace, pod, container, card string }
	assignedMem, assignedCores := map[series]float64{}, map[series]float64{}
	for _, pod := range pods {
		raw, ok := pod.Annotations[gpuinfo.AssignmentAnnotation]
		if !ok || pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
			continue
		}
		a, err := gpuinfo.DecodeAssignment(raw)
		if err != nil {
			c.Logger.V(4).Info("Pod's assignment left out of the metrics", "pod", klog.KObj(pod), "err", err)
			continue
		}
		for container, assigned := range a.Containers {
			for _, ca := range assigned {
				s := series{pod.Namespace, pod.Name, container, strconv.Itoa(ca.Index)}
				assignedMem[s] += float64(ca.MemoryMiB)
				assignedCores[s] += float64(ca.Cores)
			}
		}
	}
	for s, v := range assignedMem {
		gauge(c.assignedMem, v, s.namespace, s.pod, s.container, s.card)
		gauge(c.assignedCores, assignedCores[s], s.namespace, s.pod, s.container, s.card)
	}

	containers := containerIDs(pods)
	for _, st := range stats {
		if !st.ProcessesKnown {
			continue
		}
		index := strconv.Itoa(st.Index)
		used := map[series]float64{{card: index}: 0} // the unattributed series, always
		for _, p := range st.Processes {
			id := p.ContainerID
			if id == "" && p.PID != 0 {
				id = discovery.ContainerOfProcess(c.ProcRoot, p.PID, func(id string) bool { _, ok := containers[id]; return ok })
			}
			ref, ok := containers[id]
			if !ok {
				used[series{card: index}] += float64(p.MemoryUsedMiB)
				continue
			}
			used[series{ref.namespace, ref.pod, ref.container, index}] += float64(p.MemoryUsedMiB)
		}
		for s, v := range used {
			gauge(c.usedMem, v, s.namespace, s.pod, s.container, s.card)
		}
	}
}

// readStats reads the backend's live statistics, bounded; nil when it has
// none, failed entirely, or took too long.
func (c *Collector) readStats() []discovery.CardStats {
	if c.Stats == nil {
		return nil
	}
	stats, err := c.Stats.Read()
	if err != nil {
		c.Logger.Error(err, "Some GPU statistics left out of the metrics")
	}
	return stats
}

func (c *Collector) listPods() []*v1.Pod {
	list := c.pods.Load()
	if list == nil {
		return nil
	}
	pods, err := (*list)()
	if err != nil {
		c.Logger.Error(err, "Container GPU metrics left out: listing the node's pods failed")
		return nil
	}
	bound := pods[:0:0]
	for _, p := range pods {
		if p.Spec.NodeName == c.node {
			bound = append(bound, p)
		}
	}
	return bound
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// NewRegistry returns a registry of the collector's metrics and of the
// agent process's own (Go runtime, process).
func NewRegistry(c *Collector) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "tessera_build_info",
		Help:        "1, labelled with the Tessera version, VCS revision and Go version of this binary.",
		ConstLabels: prometheus.Labels{"version": version.Version, "revision": version.Revision(), "go_version": runtime.Version()},
	})
	buildInfo.Set(1)
	reg.MustRegister(c, buildInfo, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Handler serves g's metrics (the agent guards it: node-agent/serving).
func Handler(logger klog.Logger, g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      promLogger{logger},
		Timeout:       2 * DefaultTimeout,
	}))
	return mux
}

// promLogger passes promhttp's errors to klog.
type promLogger struct{ logger klog.Logger }

func (l promLogger) Println(v ...any) { l.logger.Error(nil, fmt.Sprint(v...)) }
