package nri

import (
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/nri/pkg/api"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/enforce"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// shares are the shares of cards that the containers the runtime runs now
// hold, as the runtime reports them (NRI's container list and events), not
// as the API has it: a terminating victim still holds its share while its
// preemptor is created. A share's MemoryMiB of 0 is the whole card.
type shares struct {
	mu sync.Mutex
	// containers are the holding keys of each live container, by ID: every
	// container the runtime runs, with no keys for one without cards.
	containers map[string][]string
	// owners name each live container, by ID.
	owners map[string]Owner
	// holdings are the live holdings by key, with how many live containers
	// hold each (the containers of one claim share it).
	holdings map[string]*heldShare
}

type heldShare struct {
	cards []gpuinfo.CardAssignment
	refs  int
}

// Owner names a running container as the runtime does.
type Owner struct {
	Namespace, Pod string
	PodUID         types.UID
	Container      string
	// Unrestricted is set for a container the agent left as it is (its
	// pod's service account is unrestricted).
	Unrestricted bool
}

// Running is a container the runtime runs, with the shares it holds.
type Running struct {
	// ID is the runtime's container ID.
	ID string
	Owner
	// Holdings are its shares; none for a container without cards. The
	// containers of one claim hold the same Holding.
	Holdings []enforce.Holding
}

// runningContainer is what reset learns of one listed container.
type runningContainer struct {
	owner    Owner
	holdings []enforce.Holding
}

// reset replaces what is known with the containers the runtime lists, by
// container ID.
func (s *shares) reset(live map[string]runningContainer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.containers = nil
	s.initLocked()
	for id, c := range live {
		s.addLocked(id, c.owner, c.holdings)
	}
}

// running lists the live containers and their holdings.
func (s *shares) running() []Running {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Running, 0, len(s.containers))
	for id, keys := range s.containers {
		r := Running{ID: id, Owner: s.owners[id]}
		for _, k := range keys {
			if h := s.holdings[k]; h != nil {
				r.Holdings = append(r.Holdings, enforce.Holding{Key: k, Cards: h.cards})
			}
		}
		out = append(out, r)
	}
	return out
}

// admit records container id's holdings, unless one of its cards (or MIG
// slices) would be over-committed: the shares held on it now, plus what id
// adds, exceed its memory or its compute. A holding already live (another
// container of the same claim) adds nothing.
func (s *shares) admit(id string, owner Owner, holdings []enforce.Holding, cards []discovery.Card) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	units := unitsOf(cards)
	adding := map[string]bool{}
	for _, h := range holdings {
		if s.holdings[h.Key] != nil {
			continue
		}
		for _, c := range h.Cards {
			adding[units.key(c)] = true
		}
	}
	for key := range adding {
		u, ok := units.byKey[key]
		if !ok {
			return fmt.Errorf("card %s is not a card of this node", key)
		}
		heldMemory, heldCores := s.heldLocked(key, units)
		var memory, cores int64
		for _, h := range holdings {
			if s.holdings[h.Key] != nil {
				continue
			}
			for _, c := range h.Cards {
				if units.key(c) == key {
					memory += u.memoryOf(c)
					cores += c.Cores
				}
			}
		}
		if heldMemory+memory > u.memoryMiB || heldCores+cores > gpuinfo.FullCores {
			return fmt.Errorf("card %d (%s) would be over-committed: the containers running on it hold %d of its %d MiB and %d %% of its compute, and this container adds %d MiB and %d %% (kubelet will retry: a container that is stopping frees its share)",
				u.index, key, heldMemory, u.memoryMiB, heldCores, memory, cores)
		}
	}
	s.addLocked(id, owner, holdings)
	return nil
}

// unit is a card, or a MIG slice of one, as shares are counted on it.
type unit struct {
	index     int
	memoryMiB int64
}

// memoryOf is the memory a share holds of the unit: its own, or the whole
// unit's for a share without a memory limit.
func (u unit) memoryOf(share gpuinfo.CardAssignment) int64 {
	if share.MemoryMiB == 0 {
		return u.memoryMiB
	}
	return share.MemoryMiB
}

// units are the node's cards and MIG slices by the key shares of them are
// counted under (gpuinfo.CardAssignment.Key), with the slices' keys by
// their MIG device UUIDs (what a running container's environment names).
type units struct {
	byKey  map[string]unit
	slices map[string]string
}

// unitsOf lists the node's cards and their MIG slices.
func unitsOf(cards []discovery.Card) units {
	u := units{byKey: make(map[string]unit, len(cards)), slices: map[string]string{}}
	for _, c := range cards {
		u.byKey[c.UUID] = unit{c.Index, c.MemoryMiB}
		if c.MIG == nil {
			continue
		}
		for _, in := range c.MIG.Instances {
			key := gpuinfo.SliceKey(c.UUID, in.Profile, in.Start)
			u.byKey[key] = unit{c.Index, c.MIG.Profile(in.Profile).MemoryMiB}
			u.slices[in.UUID] = key
		}
	}
	return u
}

// key is the unit a share holds part of: its slice, named by the assignment
// or by its MIG device's UUID, else its card.
func (u units) key(share gpuinfo.CardAssignment) string {
	if share.MIG != nil {
		return share.Key()
	}
	if key, ok := u.slices[share.UUID]; ok {
		return key
	}
	return share.UUID
}

// admitUnrestricted records a container left as it is.
func (s *shares) admitUnrestricted(id string, owner Owner) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	owner.Unrestricted = true
	s.addLocked(id, owner, nil)
}

// release forgets container id: it stopped or was removed.
func (s *shares) release(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, key := range s.containers[id] {
		if h := s.holdings[key]; h != nil {
			if h.refs--; h.refs <= 0 {
				delete(s.holdings, key)
			}
		}
	}
	delete(s.containers, id)
	delete(s.owners, id)
}

// heldLocked is what the live holdings hold of the unit under key.
func (s *shares) heldLocked(key string, units units) (memory, cores int64) {
	u := units.byKey[key]
	for _, h := range s.holdings {
		for _, c := range h.cards {
			if units.key(c) == key {
				memory += u.memoryOf(c)
				cores += c.Cores
			}
		}
	}
	return memory, cores
}

// initLocked makes the maps, when there are none.
func (s *shares) initLocked() {
	if s.containers == nil {
		s.containers, s.owners, s.holdings = map[string][]string{}, map[string]Owner{}, map[string]*heldShare{}
	}
}

func (s *shares) addLocked(id string, owner Owner, holdings []enforce.Holding) {
	if _, ok := s.containers[id]; ok {
		return
	}
	s.owners[id] = owner
	keys := make([]string, 0, len(holdings))
	for _, h := range holdings {
		keys = append(keys, h.Key)
		if held := s.holdings[h.Key]; held != nil {
			held.refs++
			continue
		}
		s.holdings[h.Key] = &heldShare{cards: h.Cards, refs: 1}
	}
	s.containers[id] = keys
}

// runningHoldings are the cards a running container holds, read from its
// environment as the runtime reports it — what it runs with: the cards (or
// MIG devices) it sees (NVIDIA_VISIBLE_DEVICES, by UUID) and, for a share, the library's
// limits; the whole card without them. The containers of one claim (the
// driver's TESSERA_CLAIM) share one holding. None for a container that sees
// no card by UUID.
func runningHoldings(ctr *api.Container) []enforce.Holding {
	env := map[string]string{}
	for _, kv := range ctr.GetEnv() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v // the last one wins, as in the process
		}
	}
	visible := env["NVIDIA_VISIBLE_DEVICES"]
	if !strings.HasPrefix(visible, "GPU-") && !strings.HasPrefix(visible, "MIG-") {
		return nil
	}
	var cards []gpuinfo.CardAssignment
	for i, uuid := range strings.Split(visible, ",") {
		share := gpuinfo.CardAssignment{Index: -1, UUID: uuid, Cores: gpuinfo.FullCores}
		if limit, ok := env["CUDA_DEVICE_MEMORY_LIMIT_"+strconv.Itoa(i)]; ok {
			share.MemoryMiB = parseMiB(limit)
			share.Cores = parseCores(env["CUDA_DEVICE_SM_LIMIT_"+strconv.Itoa(i)])
		}
		cards = append(cards, share)
	}
	key := enforce.ContainerKey(ctr.GetId())
	if claim := env[enforce.ClaimEnv]; claim != "" {
		key = enforce.ClaimKey(types.UID(claim))
	}
	return []enforce.Holding{{Key: key, Cards: cards}}
}

// parseMiB reads a limit the agent writes ("4096m"); 0 (the whole card)
// for anything else.
func parseMiB(v string) int64 {
	n, err := strconv.ParseInt(strings.TrimSuffix(v, "m"), 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// parseCores reads a compute limit; no limit is the whole card's compute.
func parseCores(v string) int64 {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > gpuinfo.FullCores {
		return gpuinfo.FullCores
	}
	return n
}

// resize sets the shares of the cards holding key holds (a resize: the same
// cards, other shares), so that admission and over-use detection count the
// new share. It reports whether key is held.
func (s *shares) resize(key string, cards []gpuinfo.CardAssignment) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.holdings[key]
	if h == nil {
		return false
	}
	h.cards = cards
	return true
}
