package translate

import (
	"slices"
	"strconv"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	commonfaultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/common/fault/v3"
	faultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	previoushostsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	previousprioritiesv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/priority/previous_priorities/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"
)

// FaultFilter is the HTTP filter fault injection is configured on, per route, for Envoy and
// gRPC alike (gRFC A33).
const FaultFilter = "envoy.filters.http.fault"

// defaultRetryOn is istiod's retry policy for routes whose VirtualService sets none. gRPC
// clients retry the gRPC codes of it (unavailable, cancelled) and ignore the rest (gRFC A44).
const defaultRetryOn = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"

// previousHostsConfig cannot fail to pack: the message is empty.
var previousHostsConfig, _ = anypb.New(&previoushostsv3.PreviousHostsPredicate{})

// previousPrioritiesConfig moves a retry to the next priority (other localities) after each
// two attempts, as istiod's retryRemoteLocalities does.
var previousPrioritiesConfig, _ = anypb.New(&previousprioritiesv3.PreviousPrioritiesConfig{UpdateFrequency: 2})

// FractionalPercent converts a percentage to Envoy's parts per million, as istiod does.
func FractionalPercent(pct float64) *typev3.FractionalPercent {
	pct = min(max(pct, 0), 100)
	return &typev3.FractionalPercent{Numerator: uint32(pct * 10000), Denominator: typev3.FractionalPercent_MILLION}
}

// DefaultRetryPolicy is istiod's retry policy for routes that set none: two retries on another
// host, on connection failures and unavailability.
func DefaultRetryPolicy() *routev3.RetryPolicy {
	return &routev3.RetryPolicy{
		RetryOn:                       defaultRetryOn,
		NumRetries:                    wrapperspb.UInt32(2),
		RetryHostPredicate:            []*routev3.RetryPolicy_RetryHostPredicate{previousHosts()},
		HostSelectionRetryMaxAttempts: 5,
	}
}

func previousHosts() *routev3.RetryPolicy_RetryHostPredicate {
	return &routev3.RetryPolicy_RetryHostPredicate{Name: "envoy.retry_host_predicates.previous_hosts",
		ConfigType: &routev3.RetryPolicy_RetryHostPredicate_TypedConfig{TypedConfig: previousHostsConfig}}
}

// RetryPolicy: none for zero attempts, istiod's default when unset; numeric retryOn entries
// are status codes to retry.
func RetryPolicy(r *networking.HTTPRetry) *routev3.RetryPolicy {
	if r == nil {
		return DefaultRetryPolicy()
	}
	if r.GetAttempts() <= 0 {
		return nil
	}
	p := DefaultRetryPolicy()
	p.NumRetries = wrapperspb.UInt32(uint32(r.GetAttempts()))
	if t := r.GetPerTryTimeout(); t != nil && t.AsDuration() > 0 {
		p.PerTryTimeout = t
	}
	if on := r.GetRetryOn(); on != "" {
		var kinds []string
		for part := range strings.SplitSeq(on, ",") {
			part = strings.TrimSpace(part)
			if part == "" {
				continue
			}
			if code, err := strconv.ParseUint(part, 10, 32); err == nil {
				p.RetriableStatusCodes = append(p.RetriableStatusCodes, uint32(code))
				continue
			}
			kinds = append(kinds, part)
		}
		if len(p.RetriableStatusCodes) > 0 && !slices.Contains(kinds, "retriable-status-codes") {
			kinds = append(kinds, "retriable-status-codes")
		}
		p.RetryOn = strings.Join(kinds, ",")
	}
	if r.GetRetryRemoteLocalities().GetValue() {
		p.RetryPriority = &routev3.RetryPolicy_RetryPriority{Name: "envoy.retry_priorities.previous_priorities",
			ConfigType: &routev3.RetryPolicy_RetryPriority_TypedConfig{TypedConfig: previousPrioritiesConfig}}
	}
	if b := r.GetBackoff(); b != nil {
		p.RetryBackOff = &routev3.RetryPolicy_RetryBackOff{BaseInterval: b}
	}
	return p
}

// Fault is the route's fault filter configuration; nil when it injects nothing usable.
func Fault(f *networking.HTTPFaultInjection, log interface{ Debug(string, ...any) }) *faultv3.HTTPFault {
	out := &faultv3.HTTPFault{}
	if d := f.GetDelay(); d != nil && d.GetFixedDelay() != nil {
		pct := 100.0
		if d.GetPercentage() != nil {
			pct = d.GetPercentage().GetValue()
		} else if d.GetPercent() != 0 { //nolint:staticcheck // still honoured by Istio
			pct = float64(d.GetPercent()) //nolint:staticcheck
		}
		out.Delay = &commonfaultv3.FaultDelay{
			FaultDelaySecifier: &commonfaultv3.FaultDelay_FixedDelay{FixedDelay: d.GetFixedDelay()},
			Percentage:         FractionalPercent(pct),
		}
	}
	if a := f.GetAbort(); a != nil {
		pct := 100.0
		if a.GetPercentage() != nil {
			pct = a.GetPercentage().GetValue()
		}
		abort := &faultv3.FaultAbort{Percentage: FractionalPercent(pct)}
		switch e := a.GetErrorType().(type) {
		case *networking.HTTPFaultInjection_Abort_HttpStatus:
			if e.HttpStatus >= 200 && e.HttpStatus < 600 {
				abort.ErrorType = &faultv3.FaultAbort_HttpStatus{HttpStatus: uint32(e.HttpStatus)}
			}
		case *networking.HTTPFaultInjection_Abort_GrpcStatus:
			if code, ok := grpcCodes[e.GrpcStatus]; ok {
				abort.ErrorType = &faultv3.FaultAbort_GrpcStatus{GrpcStatus: code}
			}
		}
		if abort.ErrorType != nil {
			out.Abort = abort
		} else {
			log.Debug("skipping fault abort with an invalid or unsupported status")
		}
	}
	if out.Delay == nil && out.Abort == nil {
		return nil
	}
	return out
}

var grpcCodes = map[string]uint32{
	"OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4, "NOT_FOUND": 5,
	"ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8, "FAILED_PRECONDITION": 9,
	"ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12, "INTERNAL": 13, "UNAVAILABLE": 14,
	"DATA_LOSS": 15, "UNAUTHENTICATED": 16,
}
