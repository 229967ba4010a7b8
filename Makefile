# Tessera's build. Every target uses the same Go flags, so builds and tests
# share one build cache (a cold build of the Kubernetes code costs minutes).
GO       ?= go
BIN      ?= bin
# go-nvml's cgo code calls NVML functions the header marks deprecated; only
# that warning is silenced (a cold build printed ~180 lines of it), every
# other compiler warning and error still shows.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
# Images: docker build with the Dockerfiles below (not run in CI: the build
# machines have no container runtime).
REGISTRY ?= ghcr.io/tessera-gpu
VERSION  ?= v0.1.0
# Tessera's version in the binaries (internal/version), never in
# component-base's gitVersion: kube-scheduler resolves feature gates by that.
VERSION_LDFLAGS := -X github.com/tessera-gpu/tessera/internal/version.Version=$(VERSION)
# Packages run under the race detector: the plugin and everything it calls
# concurrently from the framework's parallel Filter.
RACE_PKGS := ./pkg/plugins/... ./pkg/ledger/... ./pkg/allocator/... ./pkg/gpuinfo/... ./pkg/workload/...
# Each fuzz target's budget, as a number of executions (about 10 s here):
# a duration races Go 1.26's fuzz coordinator at its deadline and fails with
# "context deadline exceeded" on a loaded machine (go.dev/issue/75804,
# fixed in Go 1.27); a count has no deadline to race.
FUZZTIME ?= 60000x
# Interleaved rounds of the throughput benchmark; task lists the simulator replays.
ROUNDS   ?= 1
TRACES   ?= default
FUZZ_TARGETS := FuzzDecodeInventory FuzzDecodeAssignment FuzzDecodeUseReport FuzzParsePodRequest
# make e2e-node: containerd and the test image are built here (from
# test/e2e-node/tools, a module of its own); runc comes from the host.
E2E_BIN  := $(CURDIR)/_output/e2e
# make test-kueue: Kueue's manager is built here (from test/kueue/tools). The
# in-process API server reports component-base's version, unset in a test
# binary ("v0.0.0-master+$Format:%H$"), which Kueue's manager cannot parse:
# the Kueue tests' binary is given the Kubernetes version it is built with.
KUEUE_BIN := $(CURDIR)/_output/kueue
KUEUE_TEST_LDFLAGS := -X k8s.io/component-base/version.gitVersion=v1.37.2 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37
# make gpu-check-build: the real-card check's folder.
GPU_CHECK_BIN := $(CURDIR)/_output/gpu-check
CONTAINERD_TAGS := no_btrfs no_devmapper no_zfs

.PHONY: all build release release-scheduler release-node-agent images chart demo test test-unit test-race fuzz test-monitoring test-helm test-kueue e2e-node gpu-check-build bench bench-throughput sim lint clean

all: build

## build: the scheduler, the node agent and the kubectl plugin into bin/
build:
	$(GO) build -ldflags='$(VERSION_LDFLAGS)' -o $(BIN)/tessera-scheduler ./cmd/scheduler
	$(GO) build -ldflags='$(VERSION_LDFLAGS)' -o $(BIN)/node-agent ./node-agent/cmd/node-agent
	$(GO) build -ldflags='$(VERSION_LDFLAGS)' -o $(BIN)/kubectl-tessera ./cmd/kubectl-tessera

## release-scheduler, release-node-agent: the binaries the images ship (the Dockerfiles run these).
## The scheduler is static (no cgo); the agent needs cgo and glibc to dlopen the driver's NVML.
release-scheduler:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w $(VERSION_LDFLAGS)' -o $(BIN)/tessera-scheduler ./cmd/scheduler
release-node-agent:
	CGO_ENABLED=1 $(GO) build -trimpath -ldflags='-s -w $(VERSION_LDFLAGS)' -o $(BIN)/node-agent ./node-agent/cmd/node-agent

## release: the three binaries for linux/amd64 and linux/arm64, SHA256SUMS and CycloneDX SBOMs into _output/release/$(VERSION)
release:
	VERSION=$(VERSION) GO=$(GO) hack/release.sh

## images: the scheduler and node-agent images (needs a container engine)
images:
	docker build --build-arg VERSION=$(VERSION) -f cmd/scheduler/Dockerfile -t $(REGISTRY)/tessera-scheduler:$(VERSION) .
	docker build --build-arg VERSION=$(VERSION) -f node-agent/Dockerfile -t $(REGISTRY)/tessera-node-agent:$(VERSION) .

## chart: regenerate charts/tessera from manifests/ (the chart is never edited by hand)
chart:
	$(GO) run ./hack/chartgen -o charts/tessera

## demo: an embedded control plane, simulated GPU nodes, the scheduler, the example pods and a placement table
## (make demo ARGS=--once prints the table once and exits)
demo:
	$(GO) run ./cmd/demo $(ARGS)

## test: every test; the race detector on the plugin and contract packages; each fuzz target briefly
test: test-unit test-race fuzz test-monitoring test-helm

test-unit:
	$(GO) test $$($(GO) list ./... | grep -v -e /pkg/plugins/ -e /pkg/ledger -e /pkg/allocator -e /pkg/gpuinfo -e /pkg/workload)

test-race:
	$(GO) test -race $(RACE_PKGS)

fuzz:
	@for target in $(FUZZ_TARGETS); do \
		echo "fuzzing $$target for $(FUZZTIME)"; \
		$(GO) test -run='^$$' -fuzz="^$$target\$$" -fuzztime=$(FUZZTIME) ./pkg/gpuinfo || exit 1; \
	done

## test-monitoring: the alerts, monitors and dashboard in manifests/monitoring (test/monitoring, a module of its own)
test-monitoring:
	cd test/monitoring && $(GO) test -count=1 ./...

## test-helm: charts/tessera rendered with Helm's library against kustomize's output (test/helm, a module of its own)
test-helm:
	cd test/helm && $(GO) test -count=1 ./...

## test-kueue: Tessera with a real Kueue (test/kueue, a module of its own): Kueue's manager, built from its
## own module (test/kueue/tools) into _output/kueue, against the in-process control plane; needs root (the
## manager reads a certificate under /etc/kueue). docs/queues.md
test-kueue:
	mkdir -p $(KUEUE_BIN)
	cd test/kueue/tools && CGO_ENABLED=0 $(GO) build -o $(KUEUE_BIN)/kueue sigs.k8s.io/kueue/cmd/kueue
	cd test/kueue && TESSERA_KUEUE_BIN=$(KUEUE_BIN)/kueue \
		TESSERA_KUEUE_DIR=$$(cd tools && $(GO) list -m -f '{{.Dir}}' sigs.k8s.io/kueue) \
		$(GO) test -count=1 -v -timeout=20m -ldflags='$(KUEUE_TEST_LDFLAGS)' ./...

## e2e-node: the node agent against a real containerd and runc (both built from their Go modules) with NRI;
## needs root and gcc (runc's nsenter is C). Builds them, ctr and the test image into _output/e2e.
e2e-node:
	@[ "$$(id -u)" = 0 ] || { echo "e2e-node: must run as root (runc creates namespaces, cgroups and device nodes)"; exit 1; }
	@command -v gcc >/dev/null || { echo "e2e-node: gcc is needed to build runc (apt-get install gcc)"; exit 1; }
	mkdir -p $(E2E_BIN)
	cd test/e2e-node/tools && CGO_ENABLED=0 $(GO) build -tags "$(CONTAINERD_TAGS)" -o $(E2E_BIN)/ \
		github.com/containerd/containerd/v2/cmd/containerd \
		github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
		github.com/containerd/containerd/v2/cmd/ctr ./workload ./e2e-image
	cd test/e2e-node/tools && CGO_ENABLED=1 $(GO) build -o $(E2E_BIN)/runc github.com/opencontainers/runc
	$(E2E_BIN)/e2e-image -binary $(E2E_BIN)/workload -o $(E2E_BIN)/e2e-image.tar
	$(GO) build -o $(E2E_BIN)/node-agent ./node-agent/cmd/node-agent
	TESSERA_E2E_BIN=$(E2E_BIN) $(GO) test -tags e2enode -count=1 -v -timeout=20m ./test/e2e-node/

## gpu-check-build: the node agent and tessera-gpu-check, for a lent GPU machine, into _output/gpu-check
## (stripped, the agent gzipped: 76 MB stripped is over the device tool's 64 MiB; docs/node-agent.md, "Checking a real card")
gpu-check-build:
	rm -rf $(GPU_CHECK_BIN) && mkdir -p $(GPU_CHECK_BIN)
	$(GO) build -ldflags='-s -w $(VERSION_LDFLAGS)' -o $(GPU_CHECK_BIN)/tessera-gpu-check ./node-agent/cmd/tessera-gpu-check
	$(GO) build -ldflags='-s -w $(VERSION_LDFLAGS)' -o $(GPU_CHECK_BIN)/node-agent ./node-agent/cmd/node-agent
	gzip -9 $(GPU_CHECK_BIN)/node-agent
	@size=$$(du -sm $(GPU_CHECK_BIN) | cut -f1); echo "$(GPU_CHECK_BIN): $$size MiB (the device tool carries 64)"; [ $$size -lt 64 ]

## bench: the plugin's per-node benchmarks (figures go to docs/performance.md)
bench:
	$(GO) test -run='^$$' -bench=. -benchmem ./pkg/plugins/gpushare/

## bench-throughput: pods/s of Tessera vs vanilla kube-scheduler, 1,000 and 5,000 nodes (about 6 minutes a round;
## ROUNDS=3 for three interleaved rounds; BENCH_ARGS for -throughput-sizes, -throughput-only, -throughput-process)
bench-throughput:
	$(GO) test -run='^$$' -bench=Throughput -benchtime=$(ROUNDS)x -timeout=120m ./test/integration/ $(if $(BENCH_ARGS),-args $(BENCH_ARGS))

## sim: replay the openb trace (TRACES=all for every task list; SIM_ARGS for more flags, see docs/performance.md)
sim:
	$(GO) run ./cmd/tessera-sim --workloads=$(TRACES) $(SIM_ARGS)

## lint: gofmt and go vet
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

clean:
	rm -rf $(BIN)
