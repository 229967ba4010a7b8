package main

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// The node agents' metrics endpoint, reached over HTTPS through the API
// server's pod proxy, and the identity top reads it as.
const (
	agentSelector    = "app.kubernetes.io/name=tessera-node-agent"
	agentMetricsPort = "9402"
	memoryUsedMetric = "tessera_agent_container_memory_used_mib"
	// metricsReader is the ServiceAccount, in the agents' namespace, whose
	// short-lived token top presents to the agents: the pod proxy forwards
	// no credentials of the caller's.
	metricsReader = "tessera-metrics-reader"
	// tokenLifetime is the shortest a TokenRequest may ask for.
	tokenLifetime = 10 * time.Minute
	// scrapeTimeout bounds each agent's scrape.
	scrapeTimeout = 5 * time.Second
)

// usageKey identifies one container on one card as the agent labels it.
// card is the label's value: the card's index or UUID.
type usageKey struct {
	namespace, pod, container, card string
}

// memoryUsage is what the reachable agents measure, and why the others
// could not tell.
type memoryUsage struct {
	// used maps a container on a card to its memory in use, MiB.
	used map[usageKey]float64
	// nodes are the nodes whose agent answered with the metric.
	nodes map[string]bool
	// unavailable says why usage is missing, node by node or altogether.
	unavailable []string
}

// lookup returns the memory in use of a container on a card of node, if its
// agent reported it.
func (m *memoryUsage) lookup(node, namespace, pod, container string, index int, uuid string) (float64, bool) {
	if !m.nodes[node] {
		return 0, false
	}
	for _, card := range []string{strconv.Itoa(index), uuid} {
		if v, ok := m.used[usageKey{namespace, pod, container, card}]; ok {
			return v, true
		}
	}
	return 0, false
}

// scrapeAgents reads the memory in use from the agents (in tesseraNamespace)
// on nodes, through the API server's pod proxy.
func scrapeAgents(ctx context.Context, client kubernetes.Interface, tesseraNamespace string, nodes map[string]bool) *memoryUsage {
	m := &memoryUsage{used: map[usageKey]float64{}, nodes: map[string]bool{}}
	agents, err := client.CoreV1().Pods(tesseraNamespace).List(ctx, metav1.ListOptions{LabelSelector: agentSelector})
	if err != nil {
		m.unavailable = append(m.unavailable, fmt.Sprintf("listing the node agent pods (%s) in namespace %s: %v", agentSelector, tesseraNamespace, err))
		return m
	}
	if len(agents.Items) == 0 {
		m.unavailable = append(m.unavailable, fmt.Sprintf("no node agent pods (%s) in namespace %s", agentSelector, tesseraNamespace))
		return m
	}
	token, err := client.CoreV1().ServiceAccounts(tesseraNamespace).CreateToken(ctx, metricsReader, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(tokenLifetime.Seconds()))},
	}, metav1.CreateOptions{})
	if err != nil {
		m.unavailable = append(m.unavailable, fmt.Sprintf("requesting a token of ServiceAccount %s/%s to read the agents' metrics (bind the Role tessera-top): %v", tesseraNamespace, metricsReader, err))
		return m
	}
	byNode := map[string]*v1.Pod{}
	for i := range agents.Items {
		p := &agents.Items[i]
		if prev := byNode[p.Spec.NodeName]; prev == nil || (prev.Status.Phase != v1.PodRunning && p.Status.Phase == v1.PodRunning) {
			byNode[p.Spec.NodeName] = p
		}
	}
	for _, node := range sortedKeys(nodes) {
		agent := byNode[node]
		if agent == nil {
			m.unavailable = append(m.unavailable, fmt.Sprintf("node %s: no node agent pod", node))
			continue
		}
		if agent.Status.Phase != v1.PodRunning {
			m.unavailable = append(m.unavailable, fmt.Sprintf("node %s: agent pod %s is %s", node, agent.Name, agent.Status.Phase))
			continue
		}
		if err := m.scrape(ctx, client, agent, token.Status.Token); err != nil {
			m.unavailable = append(m.unavailable, fmt.Sprintf("node %s: agent pod %s: %v", node, agent.Name, err))
			continue
		}
		m.nodes[node] = true
	}
	return m
}

// scrape reads one agent's metrics, presenting token.
func (m *memoryUsage) scrape(ctx context.Context, client kubernetes.Interface, agent *v1.Pod, token string) error {
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	raw, err := client.CoreV1().RESTClient().Get().
		Namespace(agent.Namespace).Resource("pods").Name("https:"+agent.Name+":"+agentMetricsPort).
		SubResource("proxy").Suffix("metrics").
		SetHeader(gpuinfo.AgentMetricsTokenHeader, "Bearer "+token).
		DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("fetching metrics on port %s: %w", agentMetricsPort, err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("parsing metrics: %w", err)
	}
	family := families[memoryUsedMetric]
	if family == nil {
		return fmt.Errorf("does not export %s (an older agent?)", memoryUsedMetric)
	}
	for _, metric := range family.GetMetric() {
		labels := map[string]string{}
		for _, l := range metric.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		var value float64
		switch {
		case metric.GetGauge() != nil:
			value = metric.GetGauge().GetValue()
		case metric.GetUntyped() != nil:
			value = metric.GetUntyped().GetValue()
		default:
			continue
		}
		m.used[usageKey{labels["namespace"], labels["pod"], labels["container"], labels["card"]}] = value
	}
	return nil
}
