// Package cni is Sailplane's chained CNI plugin (the sailplane-cni binary, as Istio's
// istio-cni in sidecar mode): for an injected pod, it installs the pod's traffic capture in the
// pod's network namespace on CNI ADD — the rules `agent capture` installs from the injected
// istio-init container, computed from the same annotations by the same code — so that pods need
// no NET_ADMIN and can be kept at Pod Security "restricted". Its installer (Install) puts the
// binary on the node and the plugin at the end of the node's CNI configuration.
package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	agentcapture "sailplane.dev/services/agent/capture"
	"sailplane.dev/shared/capture"
	"sailplane.dev/shared/netns"
)

// PluginType is the plugin's type in the CNI configuration and its binary's name.
const PluginType = "sailplane-cni"

// NetConf is the plugin's entry in the network configuration list.
type NetConf struct {
	types.NetConf
	// PrevResultRaw is the previous plugin's result, echoed unchanged.
	PrevResultRaw json.RawMessage `json:"prevResult,omitempty"`
	// Kubeconfig is where the plugin finds the API server (written by the installer).
	Kubeconfig string `json:"kubeconfig"`
	// ExcludeNamespaces are never captured (Istio's exclude_namespaces).
	ExcludeNamespaces []string `json:"exclude_namespaces,omitempty"`
	// Backend is nftables, iptables or auto (nftables when the node has nft).
	Backend string `json:"backend,omitempty"`
	// LogLevel is the level of what the plugin writes to stderr (the runtime's log).
	LogLevel string `json:"log_level,omitempty"`
}

// k8sArgs are the CNI_ARGS a Kubernetes runtime passes (containerd, CRI-O).
type k8sArgs struct {
	types.CommonArgs
	K8S_POD_NAME      types.UnmarshallableString //nolint:revive // the runtime's key
	K8S_POD_NAMESPACE types.UnmarshallableString //nolint:revive
}

// Plugin answers the runtime's CNI commands.
type Plugin struct {
	Stdout io.Writer
	Stderr io.Writer
	// PodTimeout bounds how long ADD retries the API server for the pod when it cannot be
	// reached or answers 5xx/429 (default 30 s: the runtime retries a failed ADD, but a
	// control-plane blip should not fail pod starts); a refusal or a missing pod fails at once.
	PodTimeout time.Duration
}

// Funcs are the plugin's commands for skel.PluginMainFuncs.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check}
}

func parseConf(stdin []byte) (*NetConf, error) {
	var conf NetConf
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return nil, fmt.Errorf("sailplane-cni: the network configuration: %w", err)
	}
	return &conf, nil
}

func (p *Plugin) logger(conf *NetConf) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(conf.LogLevel)); err != nil {
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(p.Stderr, &slog.HandlerOptions{Level: level})).With("component", PluginType)
}

// Add installs the capture of an injected pod in CNI_NETNS, and echoes the previous result.
// A pod that is not injected, is in an excluded namespace, has interceptionMode NONE or
// carries its own capture (istio-init) is passed through untouched. A bad capture annotation
// fails the ADD, naming it: the pod never starts half captured.
func (p *Plugin) Add(args *skel.CmdArgs) error {
	start := time.Now()
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	log := p.logger(conf).With("container", args.ContainerID)
	cfg, why, err := p.podCapture(conf, args, log)
	if err != nil {
		log.Error("capture not installed", "error", err)
		return err
	}
	if cfg == nil {
		log.Debug("pod passed through", "reason", why)
		return p.result(conf)
	}
	log = log.With("pod", why)
	backend := agentcapture.Backend(conf.Backend)
	switch backend {
	case "", "auto":
		backend = agentcapture.DetectBackend()
	case agentcapture.NFTables, agentcapture.IPTables:
	default:
		return fmt.Errorf("sailplane-cni: backend %q: want nftables, iptables or auto", conf.Backend)
	}
	// The rules and routes are the pod's: nft, iptables-restore and ip run in its namespace.
	err = netns.Do(args.Netns, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		opts := agentcapture.Options{IPv6: agentcapture.HasIPv6()}
		in := agentcapture.Installer{Backend: backend, Log: log}
		if _, err := in.Apply(ctx, agentcapture.Build(*cfg, opts)); err != nil {
			return err
		}
		return agentcapture.RoutesFor(*cfg, opts).Apply(ctx)
	})
	if err != nil {
		err = fmt.Errorf("sailplane-cni: pod %s: %w", why, err)
		log.Error("capture not installed", "error", err)
		return err
	}
	log.Info("capture ready", "backend", backend, "mode", cfg.Mode, "took", time.Since(start))
	return p.result(conf)
}

// podCapture is the capture the pod gets, nil when it gets none (why says why; else it names
// the pod).
func (p *Plugin) podCapture(conf *NetConf, args *skel.CmdArgs, log *slog.Logger) (*capture.Config, string, error) {
	var ka k8sArgs
	ka.IgnoreUnknown = true
	if err := types.LoadArgs(args.Args, &ka); err != nil {
		return nil, "", fmt.Errorf("sailplane-cni: CNI_ARGS: %w", err)
	}
	ns, name := string(ka.K8S_POD_NAMESPACE), string(ka.K8S_POD_NAME)
	if ns == "" || name == "" {
		return nil, "not a Kubernetes pod (no K8S_POD_NAMESPACE, K8S_POD_NAME in CNI_ARGS)", nil
	}
	// Before asking the API server: the installer's own pod must start while no kubeconfig is
	// written yet.
	if slices.Contains(conf.ExcludeNamespaces, ns) {
		return nil, "namespace " + ns + " is excluded", nil
	}
	kube, err := newKubeClient(conf.Kubeconfig)
	if err != nil {
		return nil, "", fmt.Errorf("sailplane-cni: %w", err)
	}
	timeout := p.PodTimeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var pd *pod
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		pd, err = kube.getPod(ctx, ns, name)
		if err == nil {
			break
		}
		if errors.Is(err, errFinal) {
			return nil, "", fmt.Errorf("sailplane-cni: %w", err)
		}
		log.Debug("get pod", "error", err)
		select {
		case <-ctx.Done():
			return nil, "", fmt.Errorf("sailplane-cni: %w", err)
		case <-time.After(wait):
		}
	}
	cfg, why, err := forPod(pd)
	if err != nil {
		return nil, "", fmt.Errorf("sailplane-cni: pod %s/%s: %w", ns, name, err)
	}
	if cfg == nil {
		return nil, why, nil
	}
	return cfg, ns + "/" + name, nil
}

// Istio's names of the injected containers.
const (
	initContainer  = "istio-init"
	proxyContainer = "istio-proxy"
	agentContainer = "sailplane-agent"
	statusKey      = "sidecar.istio.io/status"
	injectKey      = "sidecar.istio.io/inject"
)

// forPod is the capture an injected pod gets in CNI mode, nil (and why) for a pod that gets
// none — Istio's plugin's rules: it has an Envoy sidecar (istio-proxy) and the injection status
// annotation, no istio-init of its own, injection not turned off, Envoy not disabled.
func forPod(pd *pod) (*capture.Config, string, error) {
	all := slices.Concat(pd.Spec.InitContainers, pd.Spec.Containers)
	has := func(name string) *container {
		for i := range all {
			if all[i].Name == name {
				return &all[i]
			}
		}
		return nil
	}
	proxy := has(proxyContainer)
	inject := pd.Metadata.Annotations[injectKey]
	if v, ok := pd.Metadata.Labels[injectKey]; ok {
		inject = v
	}
	env := map[string]string{}
	for _, name := range []string{agentContainer, proxyContainer} {
		if c := has(name); c != nil {
			for _, e := range c.Env {
				env[e.Name] = e.Value
			}
		}
	}
	switch {
	case has(initContainer) != nil:
		return nil, "the pod has its own capture (istio-init)", nil
	case proxy == nil:
		return nil, "no istio-proxy container (not injected, or proxyless)", nil
	case pd.Metadata.Annotations[statusKey] == "":
		return nil, "no " + statusKey + " annotation (not injected)", nil
	case inject == "false":
		return nil, injectKey + " is false", nil
	case isTrue(env["DISABLE_ENVOY"]):
		return nil, "DISABLE_ENVOY is set", nil
	case len(proxy.Args) >= 2 && proxy.Args[0] == "proxy" && proxy.Args[1] != "sidecar":
		return nil, "istio-proxy is a " + proxy.Args[1] + ", not a sidecar", nil
	}
	px := capture.Proxy{DNS: isTrue(env["ISTIO_META_DNS_CAPTURE"])}
	if sc := proxy.SecurityContext; sc != nil {
		if sc.RunAsUser != nil && *sc.RunAsUser > 0 {
			px.UID = uint32(*sc.RunAsUser)
		}
		if sc.RunAsGroup != nil && *sc.RunAsGroup > 0 {
			px.GID = uint32(*sc.RunAsGroup)
		}
	}
	// The agent's status port: the injected PROXY_CONFIG's.
	var pc struct {
		StatusPort int `json:"statusPort"`
	}
	if v := env["PROXY_CONFIG"]; v != "" && json.Unmarshal([]byte(v), &pc) == nil && pc.StatusPort > 0 && pc.StatusPort < 65536 {
		px.StatusPort = uint16(pc.StatusPort)
	}
	cfg, err := capture.ForPod(pd.Metadata.Annotations, px)
	if err != nil {
		return nil, "", err
	}
	if cfg.Mode == capture.None {
		return nil, "interceptionMode NONE", nil
	}
	// The pod's resolv.conf is not written yet: DNS to any server is captured (as Istio's CNI).
	cfg.CaptureAllDNS = cfg.DNS
	cfg.DropInvalid = isTrue(env["INVALID_DROP"])
	return &cfg, "", nil
}

func isTrue(s string) bool {
	b, _ := strconv.ParseBool(s)
	return b
}

// result echoes the previous plugin's result unchanged (a chained plugin that adds no
// interface or address), or an empty result of the configuration's version when there is none.
func (p *Plugin) result(conf *NetConf) error {
	out := []byte(conf.PrevResultRaw)
	if len(out) == 0 || string(out) == "null" {
		var err error
		if out, err = json.Marshal(map[string]string{"cniVersion": conf.CNIVersion}); err != nil {
			return err
		}
	}
	_, err := p.Stdout.Write(out)
	return err
}

// Del removes nothing: the rules live in the pod's network namespace, which goes with it.
func (p *Plugin) Del(args *skel.CmdArgs) error {
	if _, err := parseConf(args.StdinData); err != nil {
		return err
	}
	return nil
}

// Check succeeds: whether the rules are still in place is the validation init container's
// and the agent's to tell (Istio's plugin does the same).
func (p *Plugin) Check(args *skel.CmdArgs) error {
	_, err := parseConf(args.StdinData)
	return err
}
