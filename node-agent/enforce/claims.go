package enforce

import (
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// ClaimEnv is the variable the DRA driver's CDI spec sets to the claim's UID
// in every container that uses it: the containers of one claim hold its
// cards once.
const ClaimEnv = "TESSERA_CLAIM"

// ClaimGetter returns a ResourceClaim as the API server has it.
type ClaimGetter func(namespace, name string) (*resourceapi.ResourceClaim, error)

// claimHoldings are the Tessera cards on node that the container's resource
// claims hold for pod: those of claims allocated by Tessera's driver in this
// node's pool and reserved for this pod under uid. A claim of another driver,
// or one not allocated here or not reserved for the pod, holds none (its own
// driver's CDI devices still reach the container). An error means the
// container must not start yet: a claim it names cannot be read, or a
// Tessera claim names a card this node does not have.
func claimHoldings(pod *v1.Pod, uid types.UID, container string, node Node) ([]Holding, error) {
	names := containerClaims(pod, container)
	if len(names) == 0 {
		return nil, nil
	}
	var holdings []Holding
	for _, name := range names {
		claimName, err := claimObjectName(pod, name)
		if err != nil {
			return nil, err
		}
		if claimName == "" {
			continue // the pod needs no claim for this entry
		}
		if node.Claims == nil {
			return nil, fmt.Errorf("resource claim %s: the node agent cannot read resource claims", claimName)
		}
		claim, err := node.Claims(pod.Namespace, claimName)
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("resource claim %s/%s not found (kubelet will retry)", pod.Namespace, claimName)
		}
		if err != nil {
			return nil, fmt.Errorf("reading resource claim %s/%s (kubelet will retry): %w", pod.Namespace, claimName, err)
		}
		cards, err := tesseraCards(claim, node)
		if err != nil {
			return nil, fmt.Errorf("resource claim %s/%s: %w", pod.Namespace, claimName, err)
		}
		if len(cards) == 0 || !reservedFor(claim, pod, uid) {
			continue
		}
		if err := boundHere(pod, uid, node.Name); err != nil {
			return nil, err
		}
		holdings = append(holdings, Holding{Key: ClaimKey(claim.UID), Cards: cards})
	}
	return holdings, nil
}

// containerClaims are the names, in pod.spec.resourceClaims, of the claims
// the named container (or init container) uses.
func containerClaims(pod *v1.Pod, container string) []string {
	for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			if list[i].Name != container {
				continue
			}
			var names []string
			for _, c := range list[i].Resources.Claims {
				names = append(names, c.Name)
			}
			return names
		}
	}
	return nil
}

// claimObjectName is the ResourceClaim object behind the pod's claim entry:
// named in the spec, or generated from a template and recorded in the pod's
// status ("" when the status says none was needed).
func claimObjectName(pod *v1.Pod, entry string) (string, error) {
	for _, c := range pod.Spec.ResourceClaims {
		if c.Name != entry {
			continue
		}
		if c.ResourceClaimName != nil {
			return *c.ResourceClaimName, nil
		}
		for _, s := range pod.Status.ResourceClaimStatuses {
			if s.Name == entry {
				if s.ResourceClaimName == nil {
					return "", nil
				}
				return *s.ResourceClaimName, nil
			}
		}
		return "", fmt.Errorf("resource claim %q: the pod's status does not name the claim generated for it yet (kubelet will retry)", entry)
	}
	return "", fmt.Errorf("resource claim %q is not among the pod's spec.resourceClaims", entry)
}

// tesseraCards are the cards of node that claim's allocation gives out
// through Tessera's driver, each with the share the claim consumes.
func tesseraCards(claim *resourceapi.ResourceClaim, node Node) ([]gpuinfo.CardAssignment, error) {
	alloc := claim.Status.Allocation
	if alloc == nil {
		return nil, nil
	}
	var cards []gpuinfo.CardAssignment
	for _, r := range alloc.Devices.Results {
		if r.Driver != gpuinfo.DRADriver || r.Pool != node.Name {
			continue
		}
		if node.Cards == nil {
			return nil, errors.New("the node agent has not discovered this node's cards yet (kubelet will retry)")
		}
		index, isSlice, ok := gpuinfo.DRADeviceCard(r.Device)
		card, found := node.card(index)
		if !ok || !found {
			return nil, fmt.Errorf("request %q: device %s is not a card of node %s", r.Request, r.Device, node.Name)
		}
		if isSlice {
			entry, err := claimSlice(card, r.Device)
			if err != nil {
				return nil, fmt.Errorf("request %q: %w", r.Request, err)
			}
			cards = append(cards, entry)
			continue
		}
		memory, cores := gpuinfo.DRAShare(r.ConsumedCapacity, gpuinfo.Card{MemoryMiB: card.MemoryMiB})
		cards = append(cards, gpuinfo.CardAssignment{Index: card.Index, UUID: card.UUID, MemoryMiB: memory, Cores: cores})
	}
	return cards, nil
}

// reservedFor reports whether claim is reserved for pod under uid.
func reservedFor(claim *resourceapi.ResourceClaim, pod *v1.Pod, uid types.UID) bool {
	for _, r := range claim.Status.ReservedFor {
		if r.APIGroup == "" && r.Resource == "pods" && r.Name == pod.Name && r.UID == uid {
			return true
		}
	}
	return false
}

// claimSlice is the entry of a claim's MIG slice device on card, as the
// card has the slice now (the DRA driver made it when it prepared the
// claim); the container is then checked as one holding that slice.
func claimSlice(card discovery.Card, device string) (gpuinfo.CardAssignment, error) {
	profile, start, ok := gpuinfo.DRASliceOf(device, card.Index, card.MIG, card.MIGDynamic)
	if !ok {
		return gpuinfo.CardAssignment{}, fmt.Errorf("device %s is not a MIG slice of card %d (%s)", device, card.Index, card.UUID)
	}
	in, p := card.Slice(profile, start)
	if in == nil {
		return gpuinfo.CardAssignment{}, fmt.Errorf("card %d (%s) has no MIG slice %s at slot %d yet (kubelet will retry)", card.Index, card.UUID, profile, start)
	}
	return SliceEntry(card, p, in), nil
}

// SliceEntry is the assignment entry of a claim's MIG slice in on card, of
// profile p: held whole, all of the slice's memory and compute.
func SliceEntry(card discovery.Card, p *gpuinfo.MIGProfile, in *gpuinfo.MIGInstance) gpuinfo.CardAssignment {
	return gpuinfo.CardAssignment{
		Index: card.Index, UUID: card.UUID, MemoryMiB: p.MemoryMiB, Cores: gpuinfo.FullCores,
		MIG: &gpuinfo.MIGSlice{Profile: p.Name, Start: in.Start, UUID: in.UUID},
	}
}
