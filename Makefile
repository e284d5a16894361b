# Sailplane. `make run` starts hyper on examples/; `make test` runs every test.
SHELL := /bin/bash
GO ?= go
BIN := bin
SERVICES := config-ingest endpoint-watcher xds-server ca webhook agent hyper
MODULES := proto shared $(addprefix services/,$(SERVICES)) e2e tools
PROTOC_GEN_GO := $(shell $(GO) env GOPATH)/bin/protoc-gen-go
# The version stamped into every binary (`<binary> version`); without git (or outside a clone) the
# binaries fall back to what the Go toolchain recorded.
VERSION ?= $(shell git describe --always --dirty 2>/dev/null)
LDFLAGS := $(if $(VERSION),-X sailplane.dev/shared/version.Version=$(VERSION))

.PHONY: build run run-kube testenv crds test test-unit test-fuzz test-e2e bench bench-go bench-start bench-xds bench-xds-10k bench-gateway-api proto tidy fmt vet clean

build:
	@mkdir -p $(BIN)
	@for s in $(SERVICES); do $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/$$s ./services/$$s/cmd || exit 1; done
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/sailplane-cni ./services/agent/cmd/sailplane-cni
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/sailplanectl ./tools/sailplanectl
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/demo ./tools/demo

# The README's quick start starts here (and e2e/quickstart_test.go runs it).
run: build
	@echo "xDS: 127.0.0.1:15010  bus: 127.0.0.1:15051  config: examples/etc/sailplane/  root: examples/etc/certs/"
	@echo "next: the quick start's demo services (README.md)"
	cd examples && ../$(BIN)/hyper --config-source files

# Builds (once) and caches etcd, kube-apiserver, kubectl, consul and Istio's pilot-agent, istioctl
# (test clients) and pilot-discovery (istiod, the differential tests' reference) outside the repo, under $${SAILPLANE_CACHE:-~/.cache/sailplane}; tests start them on
# 127.0.0.1. About 13 minutes with empty Go caches on 2 cores (README, "Tests"; docs/testing.md).
testenv:
	@for p in ip iptables nft; do command -v $$p >/dev/null || { echo "testenv: $$p is missing; the capture tests need it: apt-get install iproute2 iptables nftables"; exit 1; }; done
	$(GO) run ./tools/cmd/testenv build

# A real API server (with Istio's CRDs) and Consul on 127.0.0.1 to try Sailplane by hand; its
# kubeconfig in bin/kubeconfig and kubectl in bin/kubectl while it runs.
run-kube: testenv
	@mkdir -p $(BIN)
	$(GO) run ./tools/cmd/testenv up --kubeconfig $(CURDIR)/$(BIN)/kubeconfig --kubectl $(CURDIR)/$(BIN)/kubectl

# Rewrites deploy/crds from the istio.io/api module tools/testenv installs (testenv.IstioAPIVersion),
# deploy/crds/gateway-api from sigs.k8s.io/gateway-api (testenv.GatewayAPIVersion) and the schemas
# files mode validates the Gateway API with (shared/gatewayapi/validation/schemas.gen.json) from it;
# TestDeployCRDsMatchIstioAPI and TestDeployGatewayAPICRDsMatchModule fail until this is run after
# a version change.
crds:
	$(GO) run ./tools/cmd/testenv crds > deploy/crds/customresourcedefinitions.gen.yaml.tmp
	mv deploy/crds/customresourcedefinitions.gen.yaml.tmp deploy/crds/customresourcedefinitions.gen.yaml
	$(GO) run ./tools/cmd/testenv crds --gateway-api deploy/crds/gateway-api
	$(GO) run ./shared/gatewayapi/validation/gen deploy/crds/gateway-api > shared/gatewayapi/validation/schemas.gen.json.tmp
	mv shared/gatewayapi/validation/schemas.gen.json.tmp shared/gatewayapi/validation/schemas.gen.json

# Unit tests of every module (the fuzz tests' seeds among them), a short run of each fuzz test,
# then the end-to-end tests (which build the binaries they start).
test: testenv test-unit test-fuzz test-e2e

test-unit:
	$(GO) test -count=1 -timeout 30m $(addprefix ./,$(addsuffix /...,$(filter-out e2e,$(MODULES))))

# Each fuzz target for a number of executions, about 10 s of this machine's rate (go test fuzzes
# one target per run). Counts, not durations: a -fuzztime duration can fail with a bare "context
# deadline exceeded" when it expires mid-execution (golang/go#75804, fixed in Go 1.27 only).
# FUZZTIME=<n>x or a duration overrides every target; docs/testing.md has the times. Longer:
# go test -run '^$$' -fuzz '^FuzzParseValidate$$' -fuzztime 5m ./shared/config
FUZZ := FuzzParseValidate:./shared/config:100000x FuzzDecodeMCP:./shared/bus:100000x \
	FuzzParseCSRFor:./shared/pki:500000x FuzzUnmarshalRequest:./services/xds-server/internal/xds:80000x
test-fuzz:
	for t in $(FUZZ); do \
		name=$${t%%:*}; rest=$${t#*:}; pkg=$${rest%%:*}; \
		$(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $${FUZZTIME:-$${rest#*:}} "$$pkg" || exit 1; \
	done

test-e2e: build
	SAILPLANE_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 30m ./e2e/...

# Every benchmark; figures and commands are in docs/benchmarks.md.
bench: bench-go bench-start bench-xds bench-gateway-api

bench-go:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 5x ./shared/bus/...
	$(GO) test -run '^$$' -bench . -benchmem ./services/endpoint-watcher/internal/serviceentry/...
	$(GO) test -run '^$$' -bench CreateCertificate -benchtime 3000x ./services/ca/
	$(GO) test -run '^$$' -bench Push -benchmem -benchtime 30x ./services/xds-server/internal/xds/
	$(GO) test -run '^$$' -bench Translate -benchmem ./shared/gatewayapi/
	$(GO) test -run '^$$' -bench GatewayAPISnapshot -benchmem ./services/xds-server/internal/model/
	SAILPLANE_BENCH_SERVICES=5000 SAILPLANE_BENCH_PODS=20000 \
		$(GO) test -run '^$$' -bench EndpointSliceUpdate -benchtime 1x -timeout 30m ./services/endpoint-watcher/internal/kube/

# hyper in files mode, from process start to its first xDS answer on the example config.
bench-start: build
	SAILPLANE_BIN=$(CURDIR)/$(BIN) $(GO) test -run '^$$' -bench HyperStartToServing -benchtime 20x ./e2e/

# xDS convergence at Istio's load-test size (2,000 sidecars, 1,000 services x 2 endpoints) and the
# 50 Gateways with 1,000 HTTPRoutes in files mode, 50 simulated gateway proxies: HTTPRoute edit to
# the gateway's ACK and hyper's memory; about 1.5 minutes. See docs/benchmarks.md.
bench-gateway-api: build
	$(GO) run ./tools/loadgen/cmd/loadgen --bin $(BIN) --topology hyper --protocol sotw,delta \
		--gateways 50 --routes 1000 --services 100 --endpoints 2 --changes 40 \
		--phase-timeout 2m --duration 5m --log-level warn

# sweep behind docs/bench-xds-convergence.svg; about 3 minutes. See docs/benchmarks.md.
bench-xds: build
	BIN=$(CURDIR)/$(BIN) tools/loadgen/bench.sh

# 10,000 sidecars at once on 1,000 services x 2 endpoints (hyper, state of the world): the connect
# storm under admission control, then 3 VirtualService and 3 endpoint changes; about 1.5 minutes
# on an idle 2-core machine. Writes docs/bench-xds-10k.json. See docs/benchmarks.md.
bench-xds-10k: build
	$(GO) run ./tools/loadgen/cmd/loadgen --bin $(BIN) --topology hyper --protocol sotw \
		--proxies 10000 --services 1000 --endpoints 2 --changes 3 \
		--phase-timeout 5m --duration 30m --json docs/bench-xds-10k.json --log-level warn

# Regenerates proto/**/*.pb.go. Needs protoc (Debian: protobuf-compiler) and protoc-gen-go.
proto:
	@test -x $(PROTOC_GEN_GO) || $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	cd proto && protoc --plugin=protoc-gen-go=$(PROTOC_GEN_GO) --go_out=. --go_opt=module=sailplane.dev/proto $$(find . -name '*.proto')

vet:
	$(GO) vet $(addprefix ./,$(addsuffix /...,$(MODULES)))

fmt:
	gofmt -l -w .

clean:
	rm -rf $(BIN)
