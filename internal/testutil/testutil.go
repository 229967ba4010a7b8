// Package testutil builds GPU inventories, nodes and pods for Tessera's tests.
package testutil

import (
	"fmt"
	"os"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	st "k8s.io/kubernetes/pkg/scheduler/testing"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Inventory returns a healthy inventory of n identical cards whose UUIDs
// start with prefix.
func Inventory(prefix, model string, memoryMiB int64, n int) *gpuinfo.Inventory {
	inv := &gpuinfo.Inventory{Version: gpuinfo.InventoryVersion1}
	for i := 0; i < n; i++ {
		inv.Cards = append(inv.Cards, gpuinfo.Card{
			Index: i, UUID: fmt.Sprintf("GPU-%s-%d", prefix, i), Model: model,
			MemoryMiB: memoryMiB, Cores: gpuinfo.FullCores, NUMANode: i * 2 / max(n, 1), Healthy: true,
		})
	}
	return inv
}

// MustEncode returns the annotation value of an inventory.
func MustEncode(inv *gpuinfo.Inventory) string {
	raw, err := inv.Encode()
	if err != nil {
		panic(err)
	}
	return raw
}

// CheckError fails the test unless err is what a table case wants: no error
// when want is empty, else an error containing want. It returns true when an
// error was wanted, so the case can stop there.
func CheckError(t testing.TB, err error, want string) bool {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return false
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error = %v, want one containing %q", err, want)
	}
	return true
}

// SocketDir returns a directory for unix sockets, removed when the test
// ends. It is short, unlike t.TempDir(): socket paths are limited to about
// 100 bytes.
func SocketDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// EmptyCards returns an inventory annotation of version 1 listing n empty
// card objects: hostile input, small enough for the API server to accept.
func EmptyCards(n int) string {
	return `{"version":1,"cards":[` + strings.TrimSuffix(strings.Repeat(`{},`, n), ",") + `]}`
}

// GPUNode returns a node with ample CPU and memory and the inventory annotation.
func GPUNode(name string, inv *gpuinfo.Inventory) *v1.Node {
	return st.MakeNode().Name(name).
		Capacity(map[v1.ResourceName]string{v1.ResourceCPU: "64", v1.ResourceMemory: "512Gi", v1.ResourcePods: "110"}).
		Annotation(gpuinfo.InventoryAnnotation, MustEncode(inv)).Obj()
}

// Share returns container limits asking for memoryMiB and cores on one card.
func Share(memoryMiB, cores int64) map[v1.ResourceName]string {
	return map[v1.ResourceName]string{
		"tessera.io/gpu-memory": fmt.Sprint(memoryMiB),
		"tessera.io/gpu-cores":  fmt.Sprint(cores),
	}
}

// Cards returns container limits asking for n whole cards.
func Cards(n int) map[v1.ResourceName]string {
	return map[v1.ResourceName]string{"tessera.io/gpu": fmt.Sprint(n)}
}

// a100MIGProfiles are the MIG profiles of an A100 40GB that tests use.
var a100MIGProfiles = []gpuinfo.MIGProfile{
	{Name: "1g.5gb", Slices: 1, Size: 1, MemoryMiB: 4864, Multiprocessors: 14, Starts: []int{0, 1, 2, 3, 4, 5, 6}},
	{Name: "2g.10gb", ID: 1, Slices: 2, Size: 2, MemoryMiB: 9856, Multiprocessors: 28, Starts: []int{0, 2, 4}},
	{Name: "1g.10gb", ID: 9, Slices: 1, Size: 2, MemoryMiB: 9856, Multiprocessors: 14, Starts: []int{0, 2, 4, 6}},
	{Name: "3g.20gb", ID: 2, Slices: 3, Size: 4, MemoryMiB: 19968, Multiprocessors: 42, Starts: []int{0, 4}},
	{Name: "4g.20gb", ID: 3, Slices: 4, Size: 4, MemoryMiB: 19968, Multiprocessors: 56, Starts: []int{0}},
	{Name: "7g.40gb", ID: 4, Slices: 7, Size: 8, MemoryMiB: 40192, Multiprocessors: 98, Starts: []int{0}},
}

// MIGInventory returns a version 2 inventory of A100 40GB cards whose UUIDs
// start with prefix: cards[i] lists card i's MIG slices, "PROFILE@START"
// each (1g.5gb, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb or 7g.40gb); nil leaves
// card i out of MIG mode.
// Slice UUIDs are "MIG-<prefix>-<card>-<start>".
func MIGInventory(prefix string, cards ...[]string) *gpuinfo.Inventory {
	inv := Inventory(prefix, "NVIDIA A100-SXM4-40GB", 40960, len(cards))
	inv.Version = gpuinfo.InventoryVersion2
	for i, slices := range cards {
		if slices == nil {
			continue
		}
		c := &inv.Cards[i]
		c.MIGEnabled = true
		c.MIG = &gpuinfo.MIG{Slots: 8, Profiles: a100MIGProfiles, Instances: []gpuinfo.MIGInstance{}}
		for _, s := range slices {
			profile, startText, _ := strings.Cut(s, "@")
			var start int
			if _, err := fmt.Sscan(startText, &start); err != nil {
				panic(fmt.Sprintf("slice %q: want PROFILE@START", s))
			}
			c.MIG.Instances = append(c.MIG.Instances, gpuinfo.MIGInstance{
				Profile: profile, Start: start, UUID: fmt.Sprintf("MIG-%s-%d-%d", prefix, i, start), Index: len(c.MIG.Instances), Healthy: true,
			})
		}
	}
	if err := inv.Validate(); err != nil {
		panic(err)
	}
	return inv
}
