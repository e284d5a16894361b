package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"

	"sailplane.dev/e2e/framework"
)

// conformanceKubelet stands in for what a cluster's kubelet, ReplicaSet, EndpointSlice and
// load balancer controllers would do for the Gateway API conformance suite, which the test
// environment (an API server alone) does not have:
//
//   - a Deployment of the suite's echo image gets its Pods, each a real echo-basic process in
//     its own test host (network namespace, 198.18.0.N), marked Running and Ready with that IP
//     once the process listens; Pods of any other image (coredns, …) are not made, so nothing
//     that does not run is reported ready;
//   - a Service with a selector gets an EndpointSlice of the ready Pods it selects;
//   - an echo Pod's log (pods/log) is its process's output, served through the suite's rest
//     config (withPodLogs);
//   - a gateway Deployment Sailplane generated counts one ready replica, and its LoadBalancer
//     Service gets an ingress address in 198.19.0.0/16 (as a load balancer controller would):
//     its proxy is the simulator (tools/xdssim/conformance), which fetches the xDS Sailplane
//     serves a router node of that Deployment, so "ready" means what Sailplane serves it.
type conformanceKubelet struct {
	kube    *framework.Kube
	echoBin string
	dir     string
	errf    func(format string, args ...any)

	mu       sync.Mutex
	logs     map[string]*containerLog // namespace/pod name, for podLogs; guarded by mu
	pods     map[string]*echoPod      // namespace/name
	slices   map[string]*discoveryv1.EndpointSlice
	lbByIP   map[string]string // gateway address -> namespace/deployment
	nextLB   int
	lastErrs map[string]string
}

type echoPod struct {
	host *framework.TestHost
	cmd  *exec.Cmd
	done chan struct{}
	ip   string
	log  *containerLog
}

const kubeletManager = "sailplane-e2e-kubelet"

func startConformanceKubelet(t *testing.T, kube *framework.Kube, echoBin string) *conformanceKubelet {
	k := &conformanceKubelet{kube: kube, echoBin: echoBin, dir: t.TempDir(), errf: t.Logf,
		pods: map[string]*echoPod{}, logs: map[string]*containerLog{}, slices: map[string]*discoveryv1.EndpointSlice{}, lbByIP: map[string]string{}, lastErrs: map[string]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			k.sync(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-stopped
		for key, p := range k.pods {
			if err := p.stop(); err != nil {
				t.Errorf("echo pod %s: %v", key, err)
			}
		}
	})
	return k
}

// report logs an error once per key until it changes: the loop retries every tick.
func (k *conformanceKubelet) report(key string, err error) {
	if err == nil {
		delete(k.lastErrs, key)
		return
	}
	if k.lastErrs[key] != err.Error() && !errors.Is(err, context.Canceled) {
		k.errf("kubelet: %s: %v", key, err)
	}
	k.lastErrs[key] = err.Error()
}

// gateway returns the namespace/name of the gateway Deployment served at a gateway address.
func (k *conformanceKubelet) gateway(ip string) (string, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	d, ok := k.lbByIP[ip]
	return d, ok
}

func conformanceNamespace(ns string) bool { return strings.HasPrefix(ns, "gateway-conformance") }

// sync is only called by the kubelet's goroutine; mu guards lbByIP alone, which Fetch reads.
func (k *conformanceKubelet) sync(ctx context.Context) {
	cs := k.kube.Clientset
	deps, err := cs.AppsV1().Deployments("").List(ctx, metav1.ListOptions{})
	k.report("list deployments", err)
	if err != nil {
		return
	}
	want := map[string]bool{}
	for i := range deps.Items {
		d := &deps.Items[i]
		if !conformanceNamespace(d.Namespace) {
			continue
		}
		key := d.Namespace + "/" + d.Name
		if d.Labels["gateway.networking.k8s.io/gateway-name"] != "" {
			k.report(key, k.gatewayDeployment(ctx, d))
			continue
		}
		if !runnable(d) {
			continue
		}
		replicas := int32(1)
		if d.Spec.Replicas != nil {
			replicas = *d.Spec.Replicas
		}
		var ready int32
		for i := range replicas {
			// Named as the ReplicaSet controller names them (<deployment>-<template>-<pod>): the
			// suite finds a request's backend by cutting the last two parts of the pod name. A
			// new generation replaces the pods, as a rollout would.
			name := fmt.Sprintf("%s-g%d-%d", d.Name, d.Generation, i)
			pkey := d.Namespace + "/" + name
			want[pkey] = true
			if _, ok := k.pods[pkey]; !ok {
				p, err := k.startPod(ctx, d, name)
				k.report(pkey, err)
				if err != nil {
					continue
				}
				k.pods[pkey] = p
				k.mu.Lock()
				k.logs[pkey] = p.log
				k.mu.Unlock()
			}
			ready++
		}
		if d.Status.ReadyReplicas != ready || d.Status.ObservedGeneration != d.Generation {
			d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: ready, UpdatedReplicas: ready, ReadyReplicas: ready, AvailableReplicas: ready}
			_, err := cs.AppsV1().Deployments(d.Namespace).UpdateStatus(ctx, d, metav1.UpdateOptions{})
			k.report(key+" status", err)
		}
	}
	// Pods of Deployments that are gone: stopped and deleted (no garbage collector here).
	for pkey, p := range k.pods {
		if want[pkey] {
			continue
		}
		ns, name, _ := strings.Cut(pkey, "/")
		err := cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
		k.report(pkey+" delete", errors.Join(ignoreNotFound(err), p.stop()))
		delete(k.pods, pkey)
		k.mu.Lock()
		delete(k.logs, pkey)
		k.mu.Unlock()
	}
	k.report("endpointslices", k.syncSlices(ctx))
}

// runnable: a Deployment of the suite's echo image serving HTTP, HTTPS or gRPC. Its TCP and
// UDP echo servers (the TCP and UDP profiles, not run) and other images (coredns) get no Pods,
// so nothing that does not run is reported ready.
func runnable(d *appsv1.Deployment) bool {
	cs := d.Spec.Template.Spec.Containers
	if len(cs) == 0 || !strings.Contains(cs[0].Image, "/gateway-api/echo-basic") {
		return false
	}
	return !slices.ContainsFunc(cs[0].Env, func(e corev1.EnvVar) bool {
		return e.Name == "TCP_ECHO_SERVER" || e.Name == "UDP_ECHO_SERVER"
	})
}

func ignoreNotFound(err error) error {
	if err != nil && strings.Contains(err.Error(), "not found") {
		return nil
	}
	return err
}

// gatewayDeployment marks a generated gateway Deployment ready and gives its LoadBalancer
// Service an address.
func (k *conformanceKubelet) gatewayDeployment(ctx context.Context, d *appsv1.Deployment) error {
	cs := k.kube.Clientset
	if d.Status.ReadyReplicas != 1 || d.Status.ObservedGeneration != d.Generation {
		d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1}
		if _, err := cs.AppsV1().Deployments(d.Namespace).UpdateStatus(ctx, d, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	svc, err := cs.CoreV1().Services(d.Namespace).Get(ctx, d.Name, metav1.GetOptions{})
	if err != nil {
		return ignoreNotFound(err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if in.IP != "" {
			k.lbByIP[in.IP] = d.Namespace + "/" + d.Name
		}
	}
	for _, cip := range svc.Spec.ClusterIPs {
		k.lbByIP[cip] = d.Namespace + "/" + d.Name
	}
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || len(svc.Status.LoadBalancer.Ingress) > 0 {
		return nil
	}
	k.nextLB++
	ip := fmt.Sprintf("198.19.%d.%d", k.nextLB/250, 1+k.nextLB%250)
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip}}
	if _, err := cs.CoreV1().Services(d.Namespace).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		return err
	}
	k.lbByIP[ip] = d.Namespace + "/" + d.Name
	return nil
}

// startPod runs the Deployment's echo container as a process in a new test host and publishes
// its Pod, Ready once the process accepts connections.
func (k *conformanceKubelet) startPod(ctx context.Context, d *appsv1.Deployment, name string) (*echoPod, error) {
	h, err := framework.OpenTestHost()
	if err != nil {
		return nil, err
	}
	p := &echoPod{host: h, ip: h.IP(), done: make(chan struct{}), log: &containerLog{}}
	fail := func(err error) (*echoPod, error) { return nil, errors.Join(err, p.stop()) }
	c := d.Spec.Template.Spec.Containers[0]
	env, err := k.containerEnv(ctx, d, c, name, p.ip)
	if err != nil {
		return fail(err)
	}
	logf, err := os.Create(filepath.Join(k.dir, d.Namespace+"-"+name+".log"))
	if err != nil {
		return fail(err)
	}
	bin, args := h.Command(k.echoBin)
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = env
	p.log.file = logf
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		return fail(err)
	}
	go func() { _ = p.cmd.Wait(); logf.Close(); close(p.done) }()
	port := "3000"
	for _, e := range c.Env {
		if e.Name == "HTTP_PORT" && e.Value != "" {
			port = e.Value
		}
	}
	if err := waitListening(ctx, h, p.ip+":"+port, p.done); err != nil {
		return fail(fmt.Errorf("echo-basic in %s: %w", h.Name, err))
	}
	cs := k.kube.Clientset
	spec := *d.Spec.Template.Spec.DeepCopy()
	spec.NodeName = "sailplane-e2e-node" // the node this stand-in kubelet is
	pod, err := cs.CoreV1().Pods(d.Namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: d.Namespace, Labels: maps.Clone(d.Spec.Template.Labels)},
		Spec:       spec,
	}, metav1.CreateOptions{FieldManager: kubeletManager})
	if err != nil {
		return fail(err)
	}
	now := metav1.Now()
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, HostIP: "198.18.0.1", PodIP: p.ip, PodIPs: []corev1.PodIP{{IP: p.ip}}, StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
	}
	if _, err := cs.CoreV1().Pods(d.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		return fail(err)
	}
	return p, nil
}

// containerEnv is the container's environment as the kubelet gives it: values, the downward
// API fields the suite's manifests use, and Secret volumes written to files (paths under a
// mount are rewritten to where the files are).
func (k *conformanceKubelet) containerEnv(ctx context.Context, d *appsv1.Deployment, c corev1.Container, pod, ip string) ([]string, error) {
	mounts := map[string]string{} // mount path -> local dir
	for _, m := range c.VolumeMounts {
		i := slices.IndexFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 || d.Spec.Template.Spec.Volumes[i].Secret == nil {
			continue
		}
		name := d.Spec.Template.Spec.Volumes[i].Secret.SecretName
		sec, err := k.kube.Clientset.CoreV1().Secrets(d.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("secret volume %s: %w", name, err)
		}
		dir := filepath.Join(k.dir, d.Namespace, pod, m.Name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		files := map[string]string{} // key -> path, as the volume's items map them
		for key := range sec.Data {
			files[key] = key
		}
		if items := d.Spec.Template.Spec.Volumes[i].Secret.Items; len(items) > 0 {
			files = map[string]string{}
			for _, it := range items {
				files[it.Key] = it.Path
			}
		}
		for key, path := range files {
			if err := os.WriteFile(filepath.Join(dir, path), sec.Data[key], 0o600); err != nil {
				return nil, err
			}
		}
		mounts[m.MountPath] = dir
	}
	env := []string{"PATH=" + os.Getenv("PATH")}
	for _, e := range c.Env {
		v := e.Value
		if f := e.ValueFrom; f != nil && f.FieldRef != nil {
			switch f.FieldRef.FieldPath {
			case "metadata.name":
				v = pod
			case "metadata.namespace":
				v = d.Namespace
			case "status.podIP":
				v = ip
			default:
				return nil, fmt.Errorf("env %s: field %s not provided", e.Name, f.FieldRef.FieldPath)
			}
		}
		for mp, dir := range mounts {
			if strings.HasPrefix(v, mp) {
				v = dir + strings.TrimPrefix(v, mp)
			}
		}
		env = append(env, e.Name+"="+v)
	}
	return env, nil
}

func waitListening(ctx context.Context, h *framework.TestHost, addr string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		conn, err := h.DialContext(ctx, addr)
		if err == nil {
			return conn.Close()
		}
		select {
		case <-exited:
			return errors.New("exited before listening")
		case <-ctx.Done():
			return fmt.Errorf("not listening on %s: %w", addr, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (p *echoPod) stop() error {
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	return p.host.Close()
}

// syncSlices writes, for each Service with a selector in the suite's namespaces, an
// EndpointSlice of the ready Pods it selects, as the EndpointSlice controller would.
func (k *conformanceKubelet) syncSlices(ctx context.Context) error {
	cs := k.kube.Clientset
	svcs, err := cs.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var errs []error
	for _, svc := range svcs.Items {
		if !conformanceNamespace(svc.Namespace) || len(svc.Spec.Selector) == 0 {
			continue
		}
		sel := labels.SelectorFromSet(svc.Spec.Selector)
		es := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: svc.Name + "-kubelet", Namespace: svc.Namespace, Labels: map[string]string{
				discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: kubeletManager,
			}},
			AddressType: discoveryv1.AddressTypeIPv4,
		}
		var selected []corev1.Pod
		for _, pod := range pods.Items {
			if pod.Namespace == svc.Namespace && pod.Status.PodIP != "" && sel.Matches(labels.Set(pod.Labels)) {
				selected = append(selected, pod)
			}
		}
		for _, sp := range svc.Spec.Ports {
			port := sp.TargetPort.IntVal
			if sp.TargetPort.StrVal != "" && len(selected) > 0 {
				for _, c := range selected[0].Spec.Containers {
					for _, cp := range c.Ports {
						if cp.Name == sp.TargetPort.StrVal {
							port = cp.ContainerPort
						}
					}
				}
			}
			if port == 0 {
				port = sp.Port
			}
			es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: ptr(sp.Name), Port: ptr(port), Protocol: ptr(sp.Protocol), AppProtocol: sp.AppProtocol})
		}
		for _, pod := range selected {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{pod.Status.PodIP},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name},
			})
		}
		key := svc.Namespace + "/" + svc.Name
		if old, ok := k.slices[key]; ok && reflect.DeepEqual(old.Ports, es.Ports) && reflect.DeepEqual(old.Endpoints, es.Endpoints) {
			continue
		}
		api := cs.DiscoveryV1().EndpointSlices(svc.Namespace)
		cur, err := api.Get(ctx, es.Name, metav1.GetOptions{})
		if err == nil {
			es.ResourceVersion = cur.ResourceVersion
			_, err = api.Update(ctx, es, metav1.UpdateOptions{})
		} else {
			_, err = api.Create(ctx, es, metav1.CreateOptions{})
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("endpointslice %s: %w", key, err))
			continue
		}
		k.slices[key] = es
	}
	return errors.Join(errs...)
}

// containerLog is a container's output as the kubelet keeps it: lines with the time they were
// written (for sinceTime), copied to a file for the test's own debugging.
type containerLog struct {
	mu      sync.Mutex
	file    io.Writer
	partial []byte
	lines   []logLine
}

type logLine struct {
	at   time.Time
	text string
}

func (l *containerLog) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file != nil {
		if _, err := l.file.Write(b); err != nil {
			return 0, err
		}
	}
	l.partial = append(l.partial, b...)
	now := time.Now()
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.lines = append(l.lines, logLine{now, string(l.partial[:i+1])})
		l.partial = l.partial[i+1:]
	}
	return len(b), nil
}

// since returns the lines written at or after t.
func (l *containerLog) since(t time.Time) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, ln := range l.lines {
		if !ln.at.Before(t) {
			b.WriteString(ln.text)
		}
	}
	return b.String()
}

// withPodLogs returns cfg whose requests for pods/log are answered from the stand-in kubelet's
// container logs, as the API server would by asking the pod's kubelet; every other request
// goes to the API server. The suite reads a mirror backend's log to see that it got the
// mirrored request, and the API server cannot reach this kubelet itself (it only proxies to a
// Node's address, over TLS it verifies). The suite builds its clients from this config.
func (k *conformanceKubelet) withPodLogs(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(next http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			// /api/v1/namespaces/<ns>/pods/<name>/log
			parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
			if r.Method != http.MethodGet || len(parts) != 7 || parts[0] != "api" || parts[2] != "namespaces" || parts[4] != "pods" || parts[6] != "log" {
				return next.RoundTrip(r)
			}
			rec := httptest.NewRecorder()
			k.servePodLog(rec, r, parts[3], parts[5])
			return rec.Result(), nil
		})
	})
	return cfg
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (k *conformanceKubelet) servePodLog(w http.ResponseWriter, r *http.Request, ns, pod string) {
	k.mu.Lock()
	l, ok := k.logs[ns+"/"+pod]
	k.mu.Unlock()
	if !ok {
		http.Error(w, fmt.Sprintf("pod %s/%s has no container running here", ns, pod), http.StatusNotFound)
		return
	}
	var since time.Time
	if s := r.URL.Query().Get("sinceTime"); s != "" {
		var err error
		if since, err = time.Parse(time.RFC3339, s); err != nil {
			http.Error(w, "sinceTime: "+err.Error(), http.StatusBadRequest)
			return
		}
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = io.WriteString(w, l.since(since))
}
