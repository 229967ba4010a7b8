package gpuinfo_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/topology"
)

func TestInventoryRoundTrip(t *testing.T) {
	whole := testutil.Inventory("n1", "NVIDIA A100-SXM4-80GB", 81920, 8)
	whole.Cards[3].Healthy = false
	linked := testutil.Inventory("n1", "NVIDIA H100 80GB HBM3", 81920, 8)
	topology.Apply(linked, topology.NVLinkQuads)
	for name, inv := range map[string]*gpuinfo.Inventory{"version 1": whole, "version 2, MIG": migInventory(), "version 2, topology": linked} {
		raw, err := inv.Encode()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := gpuinfo.DecodeInventory(raw)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if diff := cmp.Diff(inv, got); diff != "" {
			t.Errorf("%s: round trip (-want,+got):\n%s", name, diff)
		}
	}
}

func TestDecodeInventorySortsByIndex(t *testing.T) {
	got, err := gpuinfo.DecodeInventory(`{"version":1,"cards":[
		{"index":1,"uuid":"b","model":"T4","memoryMiB":16384,"cores":100,"numaNode":0,"healthy":true},
		{"index":0,"uuid":"a","model":"T4","memoryMiB":16384,"cores":100,"numaNode":-1,"healthy":true}]}`)
	if err != nil {
		t.Fatal(err)
	}
	if got.Cards[0].Index != 0 || got.Cards[1].Index != 1 {
		t.Errorf("cards not sorted by index: %+v", got.Cards)
	}
}

func TestDecodeInventoryErrors(t *testing.T) {
	card := func(fields string) string {
		return `{"version":1,"cards":[{"index":0,"uuid":"a","model":"T4","memoryMiB":16384,"cores":100,"healthy":true` + fields + `}]}`
	}
	twoCards := func(links string) string {
		return `{"version":2,"links":` + links + `,"cards":[
			{"index":0,"uuid":"a","model":"T4","memoryMiB":1,"cores":100},
			{"index":1,"uuid":"b","model":"T4","memoryMiB":1,"cores":100}]}`
	}
	tests := []struct {
		name, raw, wantErr string
	}{
		{"not JSON", `{"version":`, "invalid JSON"},
		{"wrong version", `{"version":3,"cards":[]}`, "version: unsupported version 3"},
		{"version 0", `{"version":0,"cards":[]}`, "version: unsupported version 0"},
		{"negative memory", card(`,"memoryMiB":-1`), "cards[0].memoryMiB: -1 is outside"},
		{"huge memory", card(`,"memoryMiB":99999999999`), "cards[0].memoryMiB"},
		{"index out of range", card(`,"index":64`), "cards[0].index: 64 is outside"},
		{"cores not 100", card(`,"cores":50`), "cards[0].cores: must be 100"},
		{"empty uuid", card(`,"uuid":""`), "cards[0].uuid"},
		{"empty model", card(`,"model":""`), "cards[0].model"},
		{"bad NUMA", card(`,"numaNode":-7`), "cards[0].numaNode"},
		{"duplicate index", `{"version":1,"cards":[
			{"index":0,"uuid":"a","model":"T4","memoryMiB":1,"cores":100},
			{"index":0,"uuid":"b","model":"T4","memoryMiB":1,"cores":100}]}`, "cards[1].index: index 0 appears twice"},
		{"duplicate uuid", `{"version":1,"cards":[
			{"index":0,"uuid":"a","model":"T4","memoryMiB":1,"cores":100},
			{"index":1,"uuid":"a","model":"T4","memoryMiB":1,"cores":100}]}`, `cards[1].uuid: "a" appears twice`},
		{"10,000 cards", testutil.EmptyCards(10000), "10000 cards is more than the 64 allowed"},
		{"links in version 1", `{"version":1,"links":"V","cards":[]}`, "links: needs inventory version 2"},
		{"links of the wrong length", `{"version":2,"links":"VV","cards":[]}`, "links: 2 letters for 0 cards, want one per pair of cards (0)"},
		{"unknown link letter", twoCards(`"X"`), `links: letter 0 is 'X', want one of "?SNHBPV"`},
		{"pcieRoot in version 1", card(`,"pcieRoot":"pci0000:00"`), "cards[0].pcieRoot: needs inventory version 2"},
		{"malformed pcieRoot", strings.Replace(card(`,"pcieRoot":"/sys/../pci0000:00"`), `"version":1`, `"version":2`, 1), `cards[0].pcieRoot: "/sys/../pci0000:00" is not a PCIe root`},
		{"oversized", `{"version":1,"cards":[],"pad":"` + strings.Repeat("x", gpuinfo.MaxAnnotationBytes) + `"}`, "larger than"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := gpuinfo.DecodeInventory(tc.raw)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), gpuinfo.InventoryAnnotation) {
				t.Errorf("error %q does not name the annotation", err)
			}
		})
	}
}

func TestAssignmentRoundTrip(t *testing.T) {
	a := &gpuinfo.Assignment{Version: gpuinfo.AssignmentVersion1, Containers: map[string][]gpuinfo.CardAssignment{
		"main":    {{Index: 0, UUID: "GPU-0", MemoryMiB: 4096, Cores: 30}, {Index: 5, UUID: "GPU-5", MemoryMiB: 4096, Cores: 30}},
		"sidecar": {{Index: 2, UUID: "GPU-2", MemoryMiB: 81920, Cores: 100}},
	}}
	raw, err := a.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := gpuinfo.DecodeAssignment(raw)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(a, got); diff != "" {
		t.Errorf("round trip (-want,+got):\n%s", diff)
	}
}

func TestDecodeAssignmentErrors(t *testing.T) {
	tests := []struct {
		name, raw, wantErr string
	}{
		{"not JSON", `[`, "invalid JSON"},
		{"wrong version", `{"version":0,"containers":{"c":[{"index":0,"uuid":"a","memoryMiB":1}]}}`, "unsupported version 0"},
		{"no containers", `{"version":1,"containers":{}}`, "must name at least one container"},
		{"no cards", `{"version":1,"containers":{"c":[]}}`, `containers["c"]: must list 1-64 cards`},
		{"card twice", `{"version":1,"containers":{"c":[{"index":1,"uuid":"a","memoryMiB":1},{"index":1,"uuid":"a","memoryMiB":1}]}}`, `containers["c"][1].index: card 1 is listed twice`},
		{"cores above 100", `{"version":1,"containers":{"c":[{"index":1,"uuid":"a","memoryMiB":1,"cores":101}]}}`, `containers["c"][0].cores`},
		{"zero memory", `{"version":1,"containers":{"c":[{"index":1,"uuid":"a","memoryMiB":0}]}}`, `containers["c"][0].memoryMiB`},
		{"negative index", `{"version":1,"containers":{"c":[{"index":-1,"uuid":"a","memoryMiB":1}]}}`, `containers["c"][0].index`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := gpuinfo.DecodeAssignment(tc.raw)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}
