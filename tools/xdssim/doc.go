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
package xdssim
