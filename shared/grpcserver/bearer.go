package grpcserver

import (
	"context"
	"strings"

	"google.golang.org/grpc/metadata"
)

// BearerToken is the token of the call's "authorization: Bearer <token>" metadata (the first
// such value), as Istio's clients send a service-account JWT; false when there is none.
func BearerToken(ctx context.Context) (string, bool) {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if t, ok := strings.CutPrefix(v, "Bearer "); ok && t != "" {
			return t, true
		}
	}
	return "", false
}
