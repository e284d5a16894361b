package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sailplane.dev/e2e/framework"
)

// canaryYAML routes to a subset the DestinationRule lacks: valid resource by resource, a problem
// only analyze sees.
const canaryYAML = `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: demo}
spec:
  host: echo.demo.svc.cluster.local
  subsets: [{name: v1, labels: {version: v1}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: demo}
spec:
  hosts: [echo.demo.svc.cluster.local]
  http:
    - route:
        - {destination: {host: echo.demo.svc.cluster.local, subset: v1}, weight: 90}
        - {destination: {host: echo.demo.svc.cluster.local, subset: v3}, weight: 10}
`

// TestSailplanectl runs the built sailplanectl against a running hyper: version reaches each of
// its servers (plaintext xDS, bus, and TLS verified with the ca's root) and reads the same build's
// version; bus list and analyze read the live config.
func TestSailplanectl(t *testing.T) {
	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
	framework.WriteFile(t, dir, "etc/sailplane/conf/service.yaml", echoServiceEntry)
	framework.WriteFile(t, dir, "etc/sailplane/conf/traffic.yaml", canaryYAML)
	xds, busAddr, tlsAddr := framework.FreeAddr(t), framework.FreeAddr(t), framework.FreeAddr(t)
	framework.Start(t, dir, framework.Binary(t, "hyper"), "--xds-listen", xds, "--bus-listen", busAddr, "--xds-tls-listen", tlsAddr)
	ctl := framework.Binary(t, "sailplanectl")
	run := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var out, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, ctl, args...)
		cmd.Stdout, cmd.Stderr = &out, &stderr
		err := cmd.Run()
		if err != nil {
			err = fmt.Errorf("%w: %s", err, stderr.String())
		}
		return out.String(), err
	}

	framework.Eventually(t, 2*time.Minute, func() error {
		out, err := run("bus", "list", "--bus", busAddr)
		if err != nil {
			return err
		}
		if !strings.Contains(out, "VirtualService   networking.istio.io/v1/VirtualService   1\n") {
			return fmt.Errorf("bus list:\n%s", out)
		}
		return nil
	})

	out, err := run("version", "-o", "json", "--xds-address", xds, "--bus", busAddr, "--ca-address", tlsAddr,
		"--root-cert", filepath.Join(dir, "etc/certs/root-cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Client  struct{ Component, Version string }
		Servers []struct {
			Role, Address, Component, Version, Error string
			Reachable, Unverified                    bool
		}
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("version -o json: %v\n%s", err, out)
	}
	if v.Client.Component != "sailplanectl" || v.Client.Version == "" || len(v.Servers) != 3 {
		t.Fatalf("version = %s", out)
	}
	for _, s := range v.Servers {
		if !s.Reachable || s.Error != "" || s.Unverified || s.Component != "hyper" || s.Version != v.Client.Version {
			t.Errorf("%s %s: %+v, want hyper at the client's version %s", s.Role, s.Address, s, v.Client.Version)
		}
	}

	out, err = run("analyze", "--bus", busAddr)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("analyze: err = %v, want exit code 1", err)
	}
	if want := `Referenced host+subset in destinationrule not found: "echo.demo.svc.cluster.local+v3"`; !strings.Contains(out, want) {
		t.Errorf("analyze output lacks %q:\n%s", want, out)
	}
	if strings.Contains(out, "Referenced host not found") {
		t.Errorf("analyze: the ServiceEntry's host is reported missing:\n%s", out)
	}
}
