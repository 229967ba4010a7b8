// Package trace reads the openb GPU-sharing production trace (Alibaba
// cluster-trace-gpu-v2023, from "Beware of Fragmentation", Weng et al., USENIX
// ATC'23) and maps its nodes and tasks to Kubernetes nodes and to pods asking
// for Tessera's resources. It is the input side of trace replay.
package trace

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Node is one GPU node of the trace.
type Node struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	GPUs      int
	Model     string
}

// Task is one task (pod) of the trace.
type Task struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	// NumGPU is the number of cards, 0 for a CPU-only task.
	NumGPU int
	// GPUMilli is the share of each card in milli-GPU; below 1000 only for
	// single-card sharing tasks.
	GPUMilli int64
	// GPUSpec lists the models the task may run on; empty means any.
	GPUSpec []string
	// Duration is how long the task ran (deletion_time − creation_time),
	// when the list has both columns; HasDuration says it does.
	Duration    time.Duration
	HasDuration bool
}

// CardMemoryMiB is the memory assumed per card model. The trace does not give
// it; the public models use their product figures, and the undisclosed G2
// and G3 are assumed 32 GiB. Sharing tasks ask a percentage of the card, so
// the figure changes no fit decision.
var CardMemoryMiB = map[string]int64{
	"P100": 16 << 10, "T4": 16 << 10, "V100M16": 16 << 10, "V100M32": 32 << 10,
	"A10": 24 << 10, "G2": 32 << 10, "G3": 32 << 10,
}

// ReadNodes parses a node list (columns sn,cpu_milli,memory_mib,gpu,model).
func ReadNodes(r io.Reader) ([]Node, error) {
	rows, err := readCSV(r, "sn", "cpu_milli", "memory_mib", "gpu", "model")
	if err != nil {
		return nil, err
	}
	nodes := make([]Node, 0, len(rows))
	for i, row := range rows {
		var n Node
		n.Name, n.Model = row["sn"], row["model"]
		var gpus int64
		if err := parseInts(i, row, map[string]*int64{"cpu_milli": &n.CPUMilli, "memory_mib": &n.MemoryMiB, "gpu": &gpus}); err != nil {
			return nil, err
		}
		if _, ok := CardMemoryMiB[n.Model]; !ok && gpus > 0 {
			return nil, fmt.Errorf("row %d: unknown GPU model %q", i+2, n.Model)
		}
		n.GPUs = int(gpus)
		nodes = append(nodes, n)
	}
	return nodes, nil
}

// ReadTasks parses a task list (columns name,cpu_milli,memory_mib,num_gpu,
// gpu_milli and optionally gpu_spec, creation_time and deletion_time; the
// others are ignored).
func ReadTasks(r io.Reader) ([]Task, error) {
	rows, err := readCSV(r, "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
	if err != nil {
		return nil, err
	}
	tasks := make([]Task, 0, len(rows))
	for i, row := range rows {
		t := Task{Name: row["name"]}
		var numGPU int64
		if err := parseInts(i, row, map[string]*int64{"cpu_milli": &t.CPUMilli, "memory_mib": &t.MemoryMiB, "num_gpu": &numGPU, "gpu_milli": &t.GPUMilli}); err != nil {
			return nil, err
		}
		t.NumGPU = int(numGPU)
		if spec := row["gpu_spec"]; spec != "" {
			t.GPUSpec = strings.Split(spec, "|")
		}
		if err := parseDuration(i, row, &t); err != nil {
			return nil, err
		}
		if t.NumGPU < 0 || t.NumGPU > gpuinfo.MaxCardsPerNode || t.GPUMilli < 0 || t.GPUMilli > 1000 || (t.GPUMilli < 1000 && t.NumGPU > 1) {
			return nil, fmt.Errorf("row %d (%s): num_gpu %d with gpu_milli %d is not a task the trace describes", i+2, t.Name, t.NumGPU, t.GPUMilli)
		}
		tasks = append(tasks, t)
	}
	return tasks, nil
}

// GPUMilliTotal is the task's GPU request in milli-GPU.
func (t Task) GPUMilliTotal() int64 { return int64(t.NumGPU) * t.GPUMilli }

// Limits returns the container limits of the task's pod: CPU and memory, and
// for a sharing task one card with ceil(gpu_milli/10) % of its compute and
// memory, for a whole-GPU task num_gpu exclusive cards.
func (t Task) Limits() v1.ResourceList {
	l := v1.ResourceList{
		v1.ResourceCPU:    *resource.NewMilliQuantity(t.CPUMilli, resource.DecimalSI),
		v1.ResourceMemory: *resource.NewQuantity(t.MemoryMiB<<20, resource.BinarySI),
	}
	names := gpuinfo.DefaultResourceNames()
	switch {
	case t.NumGPU == 0 || t.GPUMilli == 0:
	case t.GPUMilli < 1000:
		pct := (t.GPUMilli + 9) / 10
		l[names.MemoryPercent] = *resource.NewQuantity(pct, resource.DecimalSI)
		l[names.Cores] = *resource.NewQuantity(pct, resource.DecimalSI)
	default:
		l[names.GPU] = *resource.NewQuantity(int64(t.NumGPU), resource.DecimalSI)
	}
	return l
}

// Annotations returns the pod's model selector, if the task has one.
func (t Task) Annotations() map[string]string {
	if len(t.GPUSpec) == 0 {
		return nil
	}
	return map[string]string{gpuinfo.ModelAnnotation: strings.Join(t.GPUSpec, ",")}
}

// Inventory returns the node's cards as its agent would publish them.
func (n Node) Inventory() *gpuinfo.Inventory {
	inv := &gpuinfo.Inventory{Version: gpuinfo.InventoryVersion1, Cards: []gpuinfo.Card{}}
	for i := 0; i < n.GPUs; i++ {
		inv.Cards = append(inv.Cards, gpuinfo.Card{
			Index: i, UUID: fmt.Sprintf("GPU-%s-%d", n.Name, i), Model: n.Model,
			MemoryMiB: CardMemoryMiB[n.Model], Cores: gpuinfo.FullCores, NUMANode: -1, Healthy: true,
		})
	}
	return inv
}

// readCSV reads a CSV with a header row into maps by column name, checking
// that the required columns are there.
func readCSV(r io.Reader, required ...string) ([]map[string]string, error) {
	records, err := csv.NewReader(r).ReadAll()
	if err != nil {
		return nil, err
	}
	if len(records) == 0 {
		return nil, fmt.Errorf("empty file")
	}
	header := records[0]
	have := map[string]bool{}
	for _, h := range header {
		have[h] = true
	}
	for _, c := range required {
		if !have[c] {
			return nil, fmt.Errorf("missing column %q (have %v)", c, header)
		}
	}
	rows := make([]map[string]string, 0, len(records)-1)
	for _, rec := range records[1:] {
		row := make(map[string]string, len(header))
		for i, h := range header {
			if i < len(rec) {
				row[h] = rec[i]
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// parseDuration sets the task's duration from its creation and deletion
// times (seconds), when the row has both.
func parseDuration(i int, row map[string]string, t *Task) error {
	if row["creation_time"] == "" || row["deletion_time"] == "" {
		return nil
	}
	var created, deleted int64
	if err := parseInts(i, row, map[string]*int64{"creation_time": &created, "deletion_time": &deleted}); err != nil {
		return err
	}
	if deleted < created {
		return fmt.Errorf("row %d (%s): deletion_time %d is before creation_time %d", i+2, t.Name, deleted, created)
	}
	t.Duration, t.HasDuration = time.Duration(deleted-created)*time.Second, true
	return nil
}

func parseInts(i int, row map[string]string, dst map[string]*int64) error {
	for col, p := range dst {
		v, err := strconv.ParseInt(row[col], 10, 64)
		if err != nil {
			return fmt.Errorf("row %d: column %s: %w", i+2, col, err)
		}
		*p = v
	}
	return nil
}
