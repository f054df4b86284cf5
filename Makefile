# liken's build. `make lab` runs the main job; `make test` runs every test.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -o errexit -o nounset -o pipefail -c
.DEFAULT_GOAL := build

OUT      := $(CURDIR)/_output
BIN      := $(OUT)/bin
GO       ?= go
KUBE_VERSION := v1.37.2
KUBE_LDFLAGS := -s -w \
	-X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 \
	-X k8s.io/component-base/version.gitMinor=37 \
	-X k8s.io/component-base/version.gitTreeState=clean \
	-X k8s.io/component-base/version.gitCommit=liken-pinned \
	-X k8s.io/client-go/pkg/version.gitVersion=$(KUBE_VERSION) \
	-X k8s.io/client-go/pkg/version.gitMajor=1 \
	-X k8s.io/client-go/pkg/version.gitMinor=37
LIKEN_VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X liken.sh/liken/version.Version=$(LIKEN_VERSION)

COMMANDS := ./cli/cmd/liken ./controllers/cmd/cluster-operator ./node/cmd/liken-node

# The lab and the tests run the kubectl make build writes (a link to the
# kube binary, of the control plane's own version), whatever else is
# installed.
export PATH := $(BIN):$(PATH)

.PHONY: build
build: kube ## Build liken, cluster-operator, liken-node and the control plane into _output/bin.
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ $(COMMANDS)

# The control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok) and kubectl are one multi-call binary built from the
# pinned sources in hack/kube. It is rebuilt only when those pins change.
# kubectl is a link to it, which liken's programs and tests run by path
# (srctree.Binary) and make lab finds first on PATH.
.PHONY: kube
kube: $(BIN)/kube $(BIN)/kubectl

$(BIN)/kubectl: $(BIN)/kube
	ln -sf kube $@

$(BIN)/kube: hack/kube/go.mod hack/kube/go.sum $(wildcard hack/kube/*.go)
	@mkdir -p $(BIN)
	cd hack/kube && $(GO) build -ldflags '$(KUBE_LDFLAGS)' -o $(BIN)/kube.tmp .
	mv $(BIN)/kube.tmp $(BIN)/kube

# The OS image (docs/design/image.md): a Debian kernel, liken's initramfs and
# a squashfs root with systemd, kubelet, containerd and liken-node. Needs
# root; the Debian root and the node agent are cached under _output/image.
IMAGE_VERSION ?= $(shell date -u +%Y.%m.%d)-001

.PHONY: image
image: ## Build liken's OS image into _output/image (root needed).
	$(GO) run ./image/build --out $(OUT)/image --version $(IMAGE_VERSION)

.PHONY: generate
generate: ## Regenerate clientset, listers, informers and deepcopy.
	hack/update-codegen.sh

.PHONY: verify
verify: ## Formatting, vet, the dependency rules (hack/verify-deps.sh) and generated code.
	hack/verify.sh

.PHONY: deps-lab deps-test
deps-lab deps-test: ## Install the Debian packages make lab or make test needs (as root), or name them and stop.
	hack/install-deps.sh $(@:deps-%=%)

.PHONY: test
test: deps-test verify build image ## Every test: unit, fuzz smoke, e2e on the real control plane, the lab, QEMU boot, the OS image in VMs.
	LIKEN_BIN=$(BIN) $(GO) test -count=1 -timeout 20m $$($(GO) list ./... | grep -v '/e2e/')
	@# End-to-end packages run one at a time: each starts real control planes,
	@# labs or QEMU, and two at once on 2 cores would distort their timings.
	@# e2e/vm upgrades one virtual machine here; make test-vm runs three.
	LIKEN_BIN=$(BIN) LIKEN_VM_MACHINES=1 $(GO) test -count=1 -p 1 -timeout 40m ./e2e/...
	hack/fuzz-smoke.sh

# Kubernetes' own network end-to-end suite from the pinned sources
# (hack/e2e, a module of its own), agnhost and the images the suite's
# tests pull, built from Debian's packages into the folder the VM lab's
# registry serves. Needs root (mmdebstrap); the Debian root is cached.
E2E := $(OUT)/e2e

.PHONY: e2e-network
e2e-network: ## Build Kubernetes' network e2e suite and the images its tests pull into _output/e2e (root needed).
	@mkdir -p $(E2E)/bin
	cd hack/e2e && $(GO) vet . && $(GO) test -c -o $(E2E)/e2e-network.test .
	cd hack/e2e && CGO_ENABLED=0 $(GO) build -ldflags '-s -w' -o $(E2E)/bin/agnhost k8s.io/kubernetes/test/images/agnhost
	install -m 0644 $$(cd hack/e2e && $(GO) list -f '{{.Dir}}' k8s.io/kubernetes/test/images/agnhost/porter)/localhost.{crt,key} $(E2E)/bin/
	cd hack/coredns && CGO_ENABLED=0 $(GO) build -ldflags '-s -w' -o $(E2E)/bin/coredns .
	CGO_ENABLED=0 $(GO) build -ldflags '-s -w' -o $(E2E)/bin/pause ./image/containers/pause
	rm -rf $(E2E)/images
	$(GO) run ./image/testimages --bin $(E2E)/bin --cache $(OUT)/image/cache --out $(E2E)/images

# make test-vm takes about 3.5 hours on 2 cores; its two halves run the same
# image and can be run one after the other, on the same commit.
.PHONY: test-vm
test-vm: ## The virtual machine scenarios make test leaves out (both halves below, one after the other).
	$(MAKE) test-vm-faults
	$(MAKE) test-vm-conformance

.PHONY: test-vm-faults
test-vm-faults: deps-test build image ## Three machines upgrading, a hung trial, power losses, a kubelet that never starts, a leader running its own control plane, liken lab up --vm, pods across machines (about 2 hours: 121 minutes on 2026-12-07).
	LIKEN_BIN=$(BIN) LIKEN_VM_MACHINES=3 $(GO) test -count=1 -p 1 -timeout 150m -tags vmfaults -v ./e2e/vm/

.PHONY: test-vm-conformance
test-vm-conformance: deps-test build image e2e-network ## Kubernetes' own [sig-network] [Conformance] tests on a VM lab of two liken machines (about 85 minutes).
	LIKEN_BIN=$(BIN) $(GO) test -count=1 -p 1 -timeout 150m -tags vmconformance -run TestUpstreamNetworkConformance -v ./e2e/vm/

.PHONY: test-vm-leaders
test-vm-leaders: deps-test build image ## Three leaders running their own datastore behind one endpoint, one losing power, and a 5-machine fleet upgraded under the API probe: needs 6 or more host cores (docs/design/controlplane.md).
	LIKEN_BIN=$(BIN) $(GO) test -count=1 -p 1 -timeout 180m -tags vmleaders -run 'TestThreeLeadersKeepTheirQuorum|TestSelfHostedFleet' -v ./e2e/vm/

.PHONY: bench
bench: build ## Benchmarks; figures go to docs/benchmarks.md.
	@# One package at a time (-p 1): two at once on 2 cores would measure
	@# each other. Each benchmark runs its own baseline in the same run.
	LIKEN_BIN=$(BIN) LIKEN_BENCH=full $(GO) test -count=1 -p 1 -run '^$$' -bench . -benchtime 1x -timeout 90m ./... 2>&1 | tee $(OUT)/bench.txt

.PHONY: lab
lab: deps-lab build ## Bring up a lab fleet and upgrade it to a new release.
	hack/lab-demo.sh

.PHONY: clean
clean:
	rm -rf $(OUT)
