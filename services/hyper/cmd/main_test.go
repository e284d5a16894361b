package main

import (
	"testing"

	"github.com/spf13/pflag"
	"go.uber.org/goleak"

	"sailplane.dev/shared/cli"

	ca "sailplane.dev/services/ca"
	configingest "sailplane.dev/services/config-ingest"
	endpointwatcher "sailplane.dev/services/endpoint-watcher"
	"sailplane.dev/services/webhook"
	xdsserver "sailplane.dev/services/xds-server"
)

// TestFlagsOfLinkedServices: hyper takes every flag of the services it links, with the same
// default, so a flag added to a service cannot be forgotten in hyper.
func TestFlagsOfLinkedServices(t *testing.T) {
	hyper := newCommand().Flags()
	for _, svc := range []struct {
		name     string
		addFlags func(*pflag.FlagSet)
	}{
		{"logging", (&cli.LogOptions{}).AddFlags},
		{"config-ingest", (&configingest.Config{}).AddFlags},
		{"config source", (&configingest.SourceFlags{}).AddFlags},
		{"endpoint-watcher", (&endpointwatcher.Config{}).AddFlags},
		{"xds-server", (&xdsserver.Config{}).AddFlags},
		{"ca", (&ca.Config{}).AddFlags},
		{"webhook", (&webhook.Config{}).AddFlags},
	} {
		fs := pflag.NewFlagSet(svc.name, pflag.ContinueOnError)
		svc.addFlags(fs)
		if !fs.HasFlags() {
			t.Errorf("%s registers no flags", svc.name)
		}
		fs.VisitAll(func(f *pflag.Flag) {
			h := hyper.Lookup(f.Name)
			switch {
			case h == nil:
				t.Errorf("hyper has no --%s (%s)", f.Name, svc.name)
			case h.DefValue != f.DefValue:
				t.Errorf("hyper's --%s defaults to %q, %s's to %q", f.Name, h.DefValue, svc.name, f.DefValue)
			}
		})
	}
}

// TestSharedFlagSetsEveryService: a flag two linked services take (--namespace) sets both.
func TestSharedFlagSetsEveryService(t *testing.T) {
	var ingest configingest.Config
	var watcher endpointwatcher.Config
	fs := pflag.NewFlagSet("hyper", pflag.ContinueOnError)
	ingest.AddFlags(fs)
	watcher.AddFlags(fs)
	if err := fs.Parse([]string{"--namespace=mesh-cp", "--cluster-domain=example.local", "--consul=127.0.0.1:8500"}); err != nil {
		t.Fatal(err)
	}
	if ingest.Namespace != "mesh-cp" || watcher.Namespace != "mesh-cp" {
		t.Errorf("--namespace: config-ingest %q, endpoint-watcher %q", ingest.Namespace, watcher.Namespace)
	}
	if watcher.ClusterDomain != "example.local" {
		t.Errorf("--cluster-domain: %q", watcher.ClusterDomain)
	}
	if watcher.Consul == nil || watcher.Consul.Address != "127.0.0.1:8500" {
		t.Errorf("--consul: %+v", watcher.Consul)
	}
}

// klog (client-go's, in the Kubernetes tests) starts its flush daemon in init: process-global.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"))
}
