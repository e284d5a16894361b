// Package xdssim answers, for one request, what an Envoy given a set of xDS resources would do
// with it: which listener and filter chain accept the connection, which network filter handles
// it, which virtual host and route match, what the route's action is (forward, redirect, direct
// response), with which header mutations and rewrites, to which cluster and endpoint, over
// which transport socket. It works on resources of any origin (our xds-server, istiod, a
// config dump) and implements Envoy's matching rules, not a control plane's intent, so a
// translation test can check the served config by its effect on traffic where no Envoy can run.
//
// Forward then builds the request Envoy would send upstream and sends it to the endpoint the
// simulation picked; redirects and direct responses are answered without a backend.
//
// What is not simulated is refused with ErrUnsupported naming the field, never guessed.
//
// The golden cases under testdata/<case>/ pair the snapshots envoygen serves for its own
// golden inputs (<proxy>.xds.json) with request cases (requests.yaml) and the expected
// outcomes (golden.yaml, rewritten with UPDATE_GOLDEN=1). The snapshots are regenerated, when
// envoygen's output changes, from the repository root with
//
//	E=services/xds-server/internal/envoygen/testdata
//	go run ./services/xds-server/internal/cmd/dumpxds -out tools/xdssim/testdata \
//	    $E/gateway-http $E/gateway-tls $E/gateway-https-redirect $E/vs-match $E/vs-actions \
//	    $E/vs-weighted-retries $E/vs-fault-mirror-cors-headers $E/vhost-domains \
//	    $E/tcp-routes $E/vs-tls-routes $E/serviceentry
//
// then UPDATE_GOLDEN=1 go test ./tools/xdssim/ and a review of golden.yaml's diff.
package xdssim
