package e2e

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// An xDS client whose bootstrap has "tls" channel credentials watches the root file;
		// the resolver built by xds.NewXDSResolverWithConfigForTesting never runs the bootstrap's
		// cleanups, so that watcher outlives the client (grpc-go, not Sailplane).
		goleak.IgnoreTopFunction("google.golang.org/grpc/credentials/tls/certprovider/pemfile.(*watcher).run"))
}
