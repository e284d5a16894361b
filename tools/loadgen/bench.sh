#!/usr/bin/env bash
# xDS benchmark at Istio's load-test size (2,000 sidecars, 1,000 services × 2 endpoints, no
# Sidecar scoping), against hyper and the microservices, state of the world and delta, at
# 100/500/1,000/2,000 proxies. Needs the binaries: `make build` first. Writes the results as
# JSON and the convergence plot into docs/ (override with OUT=...). Bounded: every run stops
# by itself, the whole invocation within --duration.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-bin}
OUT=${OUT:-docs}
exec go run ./tools/loadgen/cmd/loadgen \
	--bin "$BIN" \
	--topology hyper,microservices \
	--protocol sotw,delta \
	--proxies-list "${PROXIES:-100,500,1000,2000}" \
	--services 1000 --endpoints 2 \
	--changes 3 \
	--phase-timeout 3m --duration 40m \
	--json "$OUT/bench-xds.json" \
	--plot "$OUT/bench-xds-convergence.svg" \
	--log-level warn \
	"$@"
