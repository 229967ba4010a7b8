// Command node-agent runs on every GPU node: it discovers the cards (through
// NVML, or simulated ones), publishes the node's tessera.io/gpu-inventory
// annotation when it changes (or, with --dra, serves the cards as DRA
// devices instead), and renews a heartbeat Lease.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/version"
	"github.com/tessera-gpu/tessera/node-agent/agent"
	"github.com/tessera-gpu/tessera/node-agent/deviceplugin"
	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/discovery/nvidia"
	"github.com/tessera-gpu/tessera/node-agent/dra"
	"github.com/tessera-gpu/tessera/node-agent/enforce"
	"github.com/tessera-gpu/tessera/node-agent/health"
	"github.com/tessera-gpu/tessera/node-agent/metrics"
	"github.com/tessera-gpu/tessera/node-agent/nri"
	"github.com/tessera-gpu/tessera/node-agent/overuse"
	"github.com/tessera-gpu/tessera/node-agent/publish"
	"github.com/tessera-gpu/tessera/node-agent/resize"
	"github.com/tessera-gpu/tessera/node-agent/rightsize"
	"github.com/tessera-gpu/tessera/node-agent/serving"
	configv1 "github.com/tessera-gpu/tessera/pkg/apis/config/v1"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

func main() {
	klog.InitFlags(nil)
	nodeName := flag.String("node-name", os.Getenv("NODE_NAME"), "this node's name (set NODE_NAME from the downward API)")
	namespace := flag.String("namespace", envOr("POD_NAMESPACE", "tessera-system"), "namespace of the heartbeat Lease")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file; in-cluster configuration when empty")
	simulated := flag.String("simulated-gpus", "", "simulate cards instead of using NVML, e.g. 8xA100-80GB or 4xT4-16GB,2xL4-24GB")
	rescan := flag.Duration("rescan-interval", 30*time.Second, "how often to rescan cards (hot-plug, driver reload)")
	heartbeat := flag.Duration("heartbeat-interval", 10*time.Second, "how often to renew the heartbeat Lease")
	leaseDuration := flag.Duration("lease-duration", 40*time.Second, "lease duration written into the Lease")
	pluginDir := flag.String("device-plugin-dir", "/var/lib/kubelet/device-plugins", "kubelet's device-plugin directory; empty disables the device plugin")
	resourceName := flag.String("resource-name", "", "resource the device plugin advertises (default: the gpu name of --resource-names)")
	resourceNames := flag.String("resource-names", "", "the resource names pods ask for GPUs with, as the scheduler's GPUShare args give them: gpu=NAME,memory=NAME,memoryPercent=NAME,cores=NAME (default: Tessera's, gpu=tessera.io/gpu,memory=tessera.io/gpu-memory,memoryPercent=tessera.io/gpu-memory-percent,cores=tessera.io/gpu-cores)")
	split := flag.Int("split-count", gpuinfo.DefaultSplitCount, "units of the GPU resource advertised to kubelet per card: kubelet admits pods asking for that resource against cards × this, and the scheduler counts the same (pods asking only memory or compute shares use none)")
	nriSocket := flag.String("nri-socket", "/var/run/nri/nri.sock", "the container runtime's NRI socket; empty disables enforcement")
	enforcement := enforce.DefaultConfig()
	paths := &enforcement.Paths
	flag.StringVar(&paths.HostLibrary, "vgpu-library", paths.HostLibrary, "host path of HAMi-core's libvgpu.so")
	flag.StringVar(&paths.HostPreload, "vgpu-preload", paths.HostPreload, "host path of the ld.so.preload file naming the library")
	flag.StringVar(&paths.HostCacheDir, "vgpu-cache-dir", paths.HostCacheDir, "host directory of the interception library's shared regions: the agent creates one file per shared container (per claim with --dra) and mounts each into its own container alone")
	highTaskPriority := flag.Int("high-task-priority", enforce.DefaultHighTaskPriority, "pod priority (spec.priority) from which a container sharing a card computes first there (HAMi-core's CUDA_TASK_PRIORITY=0; below it, 1); the default is the value of the PriorityClass tessera-critical; the pod annotation tessera.io/gpu-task-priority overrides it")
	flag.StringVar(&enforcement.CDIKind, "cdi-kind", enforcement.CDIKind, "CDI kind the assigned cards are handed over as, besides NVIDIA_VISIBLE_DEVICES (the node's CDI spec must define it: nvidia-ctk cdi generate); empty hands them over by the variable alone, which a container toolkit refusing it from unprivileged containers ignores")
	cdiNames := flag.String("cdi-device-names", string(enforcement.CDINames), "how the node's CDI spec names the cards: index (nvidia-ctk's default) or uuid")
	quiet := flag.Duration("recovery-quiet-period", 10*time.Minute, "how long an unhealthy card must stay trouble-free before it returns to service")
	var metricsPort endpoint
	flag.StringVar(&metricsPort.address, "metrics-address", ":9402", "address of the HTTPS port serving /metrics (the cards' and the containers' GPU metrics, docs/node-agent.md) to callers the API server authenticates and authorizes to get /metrics, and /healthz to anyone; empty disables it")
	flag.StringVar(&metricsPort.certFile, "tls-cert-file", "", "the metrics port's serving certificate (PEM); without it and --tls-private-key-file, a self-signed one is generated at start")
	flag.StringVar(&metricsPort.keyFile, "tls-private-key-file", "", "the private key of --tls-cert-file (PEM)")
	serviceAccount := flag.String("service-account", envOr("SERVICE_ACCOUNT", "tessera-node-agent"), "the agent's own service account, in --namespace: its pods' containers are left as they are (set SERVICE_ACCOUNT from the downward API)")
	unrestricted := flag.String("unrestricted-service-accounts", "", "comma-separated service accounts, namespace:name, whose pods' containers keep the cards their image asks for (monitoring such as the GPU Operator's DCGM exporter, gpu-operator:nvidia-dcgm-exporter); every other container without an assignment sees no card. Name only accounts in namespaces that exist and in which tenants cannot create pods")
	overUseInterval := flag.Duration("over-use-check-interval", 15*time.Second, "how often the memory each container's processes use on each card (NVML) is compared with its share; a container over it on two checks in a row gets a Warning Event GPUShareExceeded on its pod; 0 turns the check off")
	stopOverUse := flag.Bool("stop-over-use", false, "also kill the processes of a container over its share on a card (they were matched to it by their cgroup); the container's restart policy decides what follows")
	claims := flag.Bool("dra", false, "serve the cards as DRA devices (driver tessera.io, resource.k8s.io/v1 ResourceSlices that many claims share) instead of the extended resources: no device plugin, and the node's inventory annotation is removed, so no card is counted twice")
	draPluginDir := flag.String("dra-plugin-dir", "/var/lib/kubelet/plugins/"+gpuinfo.DRADriver, "with --dra: the driver's directory for its kubelet socket")
	draRegistrarDir := flag.String("dra-registrar-dir", "/var/lib/kubelet/plugins_registry", "with --dra: kubelet's plugin registration directory")
	cdiDir := flag.String("cdi-dir", "/var/run/cdi", "the container runtime's CDI spec directory: with --dra each prepared claim's spec is written there, and with --dynamic-mig-cards and --cdi-kind the spec of the dynamic cards' MIG slices (kind tessera.io/mig), which the toolkit's spec lacks")
	migCaps := flag.String("mig-capabilities", enforce.MIGMinorsPath, "the driver's list of MIG capability devices (name and minor number of each): a container gets only its own MIG slices' capability devices (/dev/nvidia-caps/)")
	dynamicMIG := flag.String("dynamic-mig-cards", "", "cards in MIG mode whose slices Tessera creates and destroys as the pods placed there need them: all, or comma-separated card indices; empty (the default) leaves every card's slices as the operator made them. Never name a card NVIDIA's MIG manager or DRA driver also manages (docs/mig.md)")
	inventoryVersion := flag.Int("inventory-version", gpuinfo.InventoryVersion, "the newest inventory version published: 2 publishes version 2 on nodes with cards in MIG mode, whose slices need it, or with the links between two or more cards known, and version 1 elsewhere; 1 keeps every node readable by schedulers from before MIG support (cards in MIG mode then take no pods, multi-card pods get cards without topology). Upgrade the scheduler first (docs/install.md)")
	printVersion := flag.Bool("version", false, "print Tessera's version and exit")
	flag.Parse()
	if *printVersion {
		fmt.Println(version.String())
		return
	}
	klog.InfoS("Tessera node agent", "version", version.Version, "revision", version.Revision())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	names, err := configv1.ParseResourceNames(*resourceNames)
	if err != nil {
		klog.ErrorS(err, "Bad --resource-names")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	if int(int32(*highTaskPriority)) != *highTaskPriority {
		klog.ErrorS(nil, "--high-task-priority must be a pod priority (a 32-bit integer)", "value", *highTaskPriority)
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	switch enforce.CDINaming(*cdiNames) {
	case enforce.CDIByIndex, enforce.CDIByUUID:
		enforcement.CDINames = enforce.CDINaming(*cdiNames)
	default:
		klog.ErrorS(nil, "--cdi-device-names must be index or uuid", "value", *cdiNames)
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	if *inventoryVersion < gpuinfo.InventoryVersion1 || *inventoryVersion > gpuinfo.InventoryVersion {
		klog.ErrorS(nil, "--inventory-version must be 1 or 2", "value", *inventoryVersion)
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	dynamicCards, err := parseDynamicMIG(*dynamicMIG)
	if err != nil {
		klog.ErrorS(err, "Bad --dynamic-mig-cards")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	if *resourceName == "" {
		*resourceName = string(names.GPU)
	}
	readCaps := func() (enforce.MIGCaps, error) { return enforce.ReadMIGCaps(*migCaps, enforce.DevicesPath) }
	var sliceSpec *enforce.MIGSpecWriter
	if dynamicCards != nil && enforcement.CDIKind != "" {
		// The toolkit's spec lacks the slices made after it was generated.
		enforcement.MIGSpec = true
		sliceSpec = &enforce.MIGSpecWriter{Dir: *cdiDir, ToolkitKind: enforcement.CDIKind, ToolkitDirs: []string{"/etc/cdi", *cdiDir}, Caps: readCaps}
	}
	var driver *dra.Driver
	if *claims {
		*pluginDir = ""
		enforcement.Names, enforcement.HighTaskPriority = names, int32(*highTaskPriority)
		driver = &dra.Driver{Node: *nodeName, Enforce: enforcement, CDIDir: *cdiDir}
	}
	var plugin *deviceplugin.Plugin
	if *pluginDir != "" {
		plugin = &deviceplugin.Plugin{Dir: *pluginDir, ResourceName: *resourceName, Split: *split, CheckInterval: time.Second}
	}
	var enforcer *nri.Plugin
	if *nriSocket != "" {
		enforcement.Names, enforcement.HighTaskPriority = names, int32(*highTaskPriority)
		enforcer = &nri.Plugin{Node: *nodeName, Enforce: enforcement, PodWait: time.Second,
			MIGCaps: readCaps}
		if enforcer.Unrestricted, err = unrestrictedAccounts(*namespace+":"+*serviceAccount, *unrestricted); err != nil {
			klog.ErrorS(err, "Invalid --unrestricted-service-accounts")
			klog.FlushAndExit(klog.ExitFlushTimeout, 1)
		}
	}
	services := services{plugin: plugin, enforcer: enforcer, nriSocket: *nriSocket, driver: driver, draOptions: dra.Options{PluginDataDir: *draPluginDir, RegistrarDir: *draRegistrarDir},
		overUseInterval: *overUseInterval, stopOverUse: *stopOverUse, inventoryVersion: *inventoryVersion, dynamicMIG: dynamicCards, sliceSpec: sliceSpec}
	if err := run(ctx, *nodeName, *namespace, *kubeconfig, *simulated, *rescan, *heartbeat, *leaseDuration, *quiet, services, metricsPort); err != nil {
		klog.ErrorS(err, "Node agent failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	klog.Flush()
}

// services are what the agent serves on the node besides publishing: each
// nil when disabled.
type services struct {
	plugin     *deviceplugin.Plugin
	enforcer   *nri.Plugin
	nriSocket  string
	driver     *dra.Driver
	draOptions dra.Options
	// sliceSpec, when set, writes the CDI spec of the dynamic cards' slices.
	sliceSpec *enforce.MIGSpecWriter
	// overUseInterval is how often over-use is checked (0: never);
	// stopOverUse kills what is over.
	overUseInterval time.Duration
	stopOverUse     bool
	// inventoryVersion is the inventory version published.
	inventoryVersion int
	// dynamicMIG reports the cards whose MIG slices Tessera makes; nil:
	// none.
	dynamicMIG func(index int) bool
}

func run(ctx context.Context, nodeName, namespace, kubeconfig, simulated string, rescan, heartbeat, leaseDuration, quiet time.Duration, svc services, metricsPort endpoint) error {
	plugin, enforcer, nriSocket := svc.plugin, svc.enforcer, svc.nriSocket
	if nodeName == "" {
		return errors.New("--node-name (or NODE_NAME) is required")
	}
	if plugin != nil && plugin.Split < 1 {
		return fmt.Errorf("--split-count must be at least 1, got %d", plugin.Split)
	}
	if rescan <= 0 || heartbeat <= 0 || leaseDuration < heartbeat {
		return fmt.Errorf("intervals must be positive and --lease-duration (%v) at least --heartbeat-interval (%v)", leaseDuration, heartbeat)
	}
	var backend discovery.Backend
	var err error
	if simulated != "" {
		backend, err = discovery.NewSimulated(nodeName, simulated)
	} else {
		backend, err = nvidia.New(nvml.New())
	}
	if err != nil {
		return err
	}
	defer backend.Close()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("API client configuration: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	a := &agent.Agent{
		Backend:           backend,
		Health:            health.NewTracker(quiet, time.Now),
		Publisher:         &publish.Publisher{Client: client, NodeName: nodeName, Namespace: namespace, LeaseDuration: leaseDuration},
		RescanInterval:    rescan,
		HeartbeatInterval: heartbeat,
		InventoryVersion:  svc.inventoryVersion,
		DynamicMIG:        svc.dynamicMIG,
	}
	if svc.dynamicMIG != nil {
		controller, ok := backend.(dra.MIGBackend)
		switch {
		case !ok:
			return fmt.Errorf("--dynamic-mig-cards: the %s backend cannot create MIG slices", backend.Name())
		case svc.driver != nil:
			// Claims hold the slices: the driver makes them when it
			// prepares a claim and unmakes them when it unprepares it.
			svc.driver.MIG = controller
		default:
			a.ServeSlices(ctx, controller)
		}
		if svc.sliceSpec != nil {
			a.SliceSpec = svc.sliceSpec.Write
			if svc.driver != nil {
				svc.driver.SliceSpec = svc.sliceSpec.Write
			}
		}
	}
	if svc.driver != nil {
		a.Devices = append(a.Devices, svc.driver)
		a.Publisher.WithoutInventory = true
		if err := svc.driver.Start(ctx, client, svc.draOptions); err != nil {
			return err
		}
	}
	if plugin != nil {
		a.Devices = append(a.Devices, plugin)
		go func() {
			if err := plugin.Run(ctx); err != nil {
				klog.ErrorS(err, "Device plugin stopped")
			}
		}()
	}
	stats := discovery.NewBoundedStats(backend, metrics.DefaultTimeout)
	var collector *metrics.Collector
	if metricsPort.address != "" {
		collector = metrics.New(nodeName, backend)
		collector.Stats = stats
		collector.Logger = klog.FromContext(ctx)
		a.Metrics = collector
	}
	if enforcer != nil {
		if err := enforcer.Enforce.Paths.WritePreload(); err != nil {
			return fmt.Errorf("writing %s: %w", enforcer.Enforce.Paths.HostPreload, err)
		}
		// Registered with the runtime first, so that containers created
		// while the pod cache syncs fail (and are retried) instead of
		// starting without enforcement.
		go enforcer.Run(ctx, nriSocket)
		a.Enforcement = enforcer
		a.Devices = append(a.Devices, enforcer)
		enforcer.Refused = func(pod *v1.Pod, container, reason string) {
			go func() {
				ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				if err := a.Publisher.ReportRefusal(ctx, pod, container, reason); err != nil {
					klog.ErrorS(err, "Recording a refusal on the pod failed", "pod", klog.KObj(pod), "container", container)
				}
			}()
		}
		enforcer.Claims = func(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
			return client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
		}
	}
	if enforcer == nil {
		a.Enforcement = enforcementOff{}
	} else {
		enforcer.Unenforced = func(u nri.Unenforced) {
			if collector != nil {
				collector.ObserveUnenforced(u.Stopped)
			}
			if u.Pod == nil {
				return
			}
			go func() {
				ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				if err := a.Publisher.ReportUnenforced(ctx, u.Pod, u.Container, u.Reason, u.Stopped); err != nil {
					klog.ErrorS(err, "Recording an unenforced container on the pod failed", "pod", klog.KObj(u.Pod), "container", u.Container)
				}
			}()
		}
	}
	if enforcer != nil || collector != nil || a.Slices != nil {
		go func() {
			// The pods bound to this node, as the API server has them: one
			// watch for enforcement, metrics and the MIG slices.
			var changed func(*v1.Pod)
			if a.Slices != nil {
				changed = a.Slices.PodChanged
			}
			pods, err := nri.PodsOnNode(ctx, client, nodeName, changed)
			if err != nil {
				klog.ErrorS(err, "No pod cache: GPU containers on this node cannot start, and no container metrics")
				return
			}
			if a.Slices != nil {
				a.Slices.SetPods(func() ([]*v1.Pod, error) { return pods.List(labels.Everything()) })
			}
			if enforcer != nil {
				enforcer.SetPods(func(namespace, name string) (*v1.Pod, error) { return pods.Pods(namespace).Get(name) })
			}
			if collector != nil {
				collector.SetPods(func() ([]*v1.Pod, error) { return pods.List(labels.Everything()) })
			}
		}()
	}
	if enforcer != nil && stats != nil {
		detector := &overuse.Detector{Stats: stats, Running: enforcer.Running, ProcRoot: "/proc", Stop: svc.stopOverUse,
			Report: func(e overuse.Exceeded) { go reportExceeded(ctx, a.Publisher, e) }}
		if svc.overUseInterval > 0 {
			go wait.UntilWithContext(ctx, detector.Check, svc.overUseInterval)
		}
		// Resizes of the shares of this node's containers (docs/resize.md).
		dyn, err := dynamic.NewForConfig(cfg)
		if err != nil {
			return err
		}
		applier := &resize.Applier{Node: nodeName, Client: dyn, RegionDir: enforcer.Enforce.Paths.HostCacheDir,
			Running: enforcer.Running, Resized: enforcer.Resized, Use: detector.Use, Pod: enforcer.Pod,
			ReconcileInterval: resize.DefaultReconcileInterval}
		go applier.Run(ctx)
		// The use of the containers opted in to right-sizing, reported on
		// the Lease for the scheduler's resize controller.
		meter := &rightsize.Meter{Running: enforcer.Running, Pod: enforcer.Pod, Uses: detector.Uses,
			Invalid: func(pod *v1.Pod, err error) {
				go func() {
					if err := a.Publisher.ReportRightSizeInvalid(ctx, pod, err); err != nil {
						klog.ErrorS(err, "Recording an invalid right-sizing annotation", "pod", klog.KObj(pod))
					}
				}()
			}}
		a.Publisher.Use = meter.Report
		go wait.UntilWithContext(ctx, meter.Read, heartbeat)
	}
	if collector != nil {
		// Served once the agent is wired: the probes read it.
		if err := serveMetrics(ctx, metricsPort, client, nodeName, collector, serving.Probes{Live: a.Live, Ready: a.Ready}); err != nil {
			return err
		}
	}
	a.Run(ctx)
	return nil
}

// reportExceeded records over-use on each pod concerned.
func reportExceeded(ctx context.Context, publisher *publish.Publisher, e overuse.Exceeded) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	outcome := "the processes keep running (the agent's --stop-over-use is off)"
	switch {
	case e.Stopped:
		outcome = "the agent killed those processes"
	case e.StopErr != nil:
		outcome = "the agent could not kill them: " + e.StopErr.Error()
	}
	told := map[types.UID]bool{}
	for _, c := range e.Containers {
		if told[c.PodUID] {
			continue
		}
		told[c.PodUID] = true
		note := fmt.Sprintf("container %q (with the others sharing its share) uses %d MiB of GPU %d (%s) on node %s, which holds %d MiB for it (processes %v); %s",
			c.Container, e.UsedMiB, e.Card, e.UUID, publisher.NodeName, e.HeldMiB, e.PIDs, outcome)
		if err := publisher.ReportExceeded(ctx, c.Namespace, c.Pod, c.PodUID, note); err != nil {
			klog.ErrorS(err, "Recording over-use on the pod failed", "pod", klog.KRef(c.Namespace, c.Pod))
		}
	}
}

// enforcementOff is the enforcement of an agent started without NRI: never
// ready, so the scheduler places no GPU pod on its node — nothing there would
// give a container its cards and limits, or hide the others'.
type enforcementOff struct{}

// NotReady says that assignments are not enforced.
func (enforcementOff) NotReady() string {
	return "enforcement disabled: the agent runs without an NRI socket (--nri-socket is empty)"
}

// Changes is never signalled.
func (enforcementOff) Changes() <-chan struct{} { return nil }

// endpoint is where and with which certificate the metrics port serves.
type endpoint struct {
	address, certFile, keyFile string
}

// serveMetrics serves the collector's metrics on the endpoint until ctx
// ends, guarded by the API server's reviews (node-agent/serving), and the
// probes to anyone. A certificate it cannot load, a guard it cannot build or
// an address it cannot listen on is an error: kubelet's probes need the
// port.
func serveMetrics(ctx context.Context, at endpoint, client kubernetes.Interface, nodeName string, collector *metrics.Collector, probes serving.Probes) error {
	cert, err := serving.Certificate(at.certFile, at.keyFile, nodeName)
	if err != nil {
		return fmt.Errorf("metrics port certificate: %w", err)
	}
	guard, err := serving.NewGuard(client)
	if err != nil {
		return fmt.Errorf("metrics port authentication: %w", err)
	}
	ln, err := net.Listen("tcp", at.address)
	if err != nil {
		return fmt.Errorf("metrics and probe port: %w", err)
	}
	klog.InfoS("Serving metrics over HTTPS", "address", ln.Addr().String(), "selfSignedCertificate", at.certFile == "")
	handler := guard.Handler(metrics.Handler(klog.FromContext(ctx), metrics.NewRegistry(collector)), probes)
	go func() {
		if err := serving.Serve(ctx, ln, cert, handler); err != nil {
			klog.ErrorS(err, "Metrics endpoint stopped", "address", at.address)
		}
	}()
	return nil
}

// unrestrictedAccounts parses --unrestricted-service-accounts; the agent's
// own account comes first.
func unrestrictedAccounts(own, flagValue string) ([]string, error) {
	accounts := []string{own}
	for _, a := range strings.Split(flagValue, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		namespace, name, ok := strings.Cut(a, ":")
		if !ok || namespace == "" || name == "" || strings.Contains(name, ":") {
			return nil, fmt.Errorf("%q: want namespace:name", a)
		}
		accounts = append(accounts, a)
	}
	return accounts, nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// parseDynamicMIG reads --dynamic-mig-cards: "" (none, nil), "all", or
// comma-separated card indices.
func parseDynamicMIG(value string) (func(index int) bool, error) {
	switch strings.TrimSpace(value) {
	case "":
		return nil, nil
	case "all":
		return func(int) bool { return true }, nil
	}
	cards := map[int]bool{}
	for _, part := range strings.Split(value, ",") {
		i, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || i < 0 || i >= gpuinfo.MaxCardsPerNode {
			return nil, fmt.Errorf("%q: want all or card indices 0-%d separated by commas", value, gpuinfo.MaxCardsPerNode-1)
		}
		cards[i] = true
	}
	return func(index int) bool { return cards[index] }, nil
}
