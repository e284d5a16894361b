package testenv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// AdminUser is the user the token in the kubeconfig authenticates as; it is
// in group system:masters.
const AdminUser = "sailplane-admin"

// Kube is a running etcd plus kube-apiserver on 127.0.0.1. There is no
// controller manager, scheduler or kubelet: objects are only stored.
type Kube struct {
	opts     options
	dir      string
	etcdBin  string
	apiBin   string
	etcdPort int
	peerPort int
	apiPort  int
	token    string
	caPEM    []byte
	apiArgs  []string
	kubecfg  string
	etcdLog  string
	apiLog   string

	mu   sync.Mutex
	etcd *proc
	api  *proc
}

// StartKube builds (if needed) and starts etcd and kube-apiserver, waits
// until the API server is ready, writes a kubeconfig and installs Istio's
// CRDs (and the Gateway API's, WithGatewayAPICRDs). ctx bounds the start only; the processes run until Stop.
func StartKube(ctx context.Context, opts ...Option) (k *Kube, err error) {
	o := buildOptions(opts)
	etcdBin, err := EnsureEtcd(ctx, o.log)
	if err != nil {
		return nil, err
	}
	apiBin, err := EnsureKubeAPIServer(ctx, o.log)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sailplane-kube-")
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	k = &Kube{
		opts:    o,
		dir:     dir,
		etcdBin: etcdBin,
		apiBin:  apiBin,
		kubecfg: filepath.Join(dir, "kubeconfig"),
		etcdLog: filepath.Join(dir, "etcd.log"),
		apiLog:  filepath.Join(dir, "kube-apiserver.log"),
	}
	defer func() {
		if err != nil {
			k.Stop()
		}
	}()
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	k.etcdPort, k.peerPort, k.apiPort = ports[0], ports[1], ports[2]
	if err := k.writeFiles(); err != nil {
		return nil, err
	}

	startCtx, cancel := context.WithTimeout(ctx, o.startTimeout)
	defer cancel()
	if err := k.startEtcd(startCtx); err != nil {
		return nil, err
	}
	if err := k.StartAPIServer(startCtx); err != nil {
		return nil, err
	}
	if o.istioCRDs {
		if err := k.installIstioCRDs(startCtx); err != nil {
			return nil, &StartError{Component: "istio CRDs", Logs: k.Logs(), Err: err}
		}
	}
	if o.gatewayCRDs {
		if err := k.InstallGatewayAPICRDs(startCtx); err != nil {
			return nil, &StartError{Component: "Gateway API CRDs", Logs: k.Logs(), Err: err}
		}
	}
	o.log.Info("testenv: kube ready", "host", k.Host(), "kubeconfig", k.kubecfg)
	return k, nil
}

func (k *Kube) writeFiles() error {
	certPEM, keyPEM, err := selfSigned()
	if err != nil {
		return err
	}
	saPriv, saPub, err := serviceAccountKey()
	if err != nil {
		return err
	}
	if k.token, err = randomToken(); err != nil {
		return err
	}
	k.caPEM = certPEM
	files := map[string][]byte{
		"serving.crt": certPEM,
		"serving.key": keyPEM,
		"sa.key":      saPriv,
		"sa.pub":      saPub,
		// token,user,uid,"group1,group2"
		"tokens.csv": fmt.Appendf(nil, "%s,%s,%s,\"system:masters\"\n", k.token, AdminUser, AdminUser),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(k.dir, name), data, 0o600); err != nil {
			return fmt.Errorf("testenv: %w", err)
		}
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["sailplane"] = &clientcmdapi.Cluster{Server: k.Host(), CertificateAuthorityData: certPEM}
	kc.AuthInfos["sailplane"] = &clientcmdapi.AuthInfo{Token: k.token}
	kc.Contexts["sailplane"] = &clientcmdapi.Context{Cluster: "sailplane", AuthInfo: "sailplane", Namespace: "default"}
	kc.CurrentContext = "sailplane"
	if err := clientcmd.WriteToFile(*kc, k.kubecfg); err != nil {
		return fmt.Errorf("testenv: kubeconfig: %w", err)
	}

	k.apiArgs = []string{
		"--etcd-servers=http://127.0.0.1:" + strconv.Itoa(k.etcdPort),
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(k.apiPort),
		// The API server refuses to derive an advertise address from a
		// loopback bind address; 127.0.0.1 given explicitly is accepted,
		// and with no endpoint reconciler it is never written anywhere.
		"--advertise-address=127.0.0.1",
		"--endpoint-reconciler-type=none",
		"--tls-cert-file=" + filepath.Join(k.dir, "serving.crt"),
		"--tls-private-key-file=" + filepath.Join(k.dir, "serving.key"),
		"--cert-dir=" + filepath.Join(k.dir, "certs"),
		"--token-auth-file=" + filepath.Join(k.dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(k.dir, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(k.dir, "sa.key"),
		// A config value only: nothing ever routes to this range.
		"--service-cluster-ip-range=10.96.0.0/16",
		// No controller manager creates "default" service accounts, so the
		// ServiceAccount admission plugin would reject every Pod.
		"--disable-admission-plugins=ServiceAccount",
		"--allow-privileged=true",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v=1",
	}
	return nil
}

func (k *Kube) startEtcd(ctx context.Context) error {
	client := "http://127.0.0.1:" + strconv.Itoa(k.etcdPort)
	peer := "http://127.0.0.1:" + strconv.Itoa(k.peerPort)
	p, err := startProc("etcd", k.etcdLog, k.etcdBin,
		"--name=sailplane",
		"--data-dir="+filepath.Join(k.dir, "etcd"),
		"--listen-client-urls="+client,
		"--advertise-client-urls="+client,
		"--listen-peer-urls="+peer,
		"--initial-advertise-peer-urls="+peer,
		"--initial-cluster=sailplane="+peer,
		// Test data need not survive a power cut; fsync dominates latency.
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	if err != nil {
		return err
	}
	k.mu.Lock()
	k.etcd = p
	k.mu.Unlock()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	err = waitFor(ctx, p, func(ctx context.Context) error {
		_, err := httpGet(ctx, hc, client+"/health", nil)
		return err
	})
	if err != nil {
		return &StartError{Component: "etcd", Logs: k.Logs(), Err: err}
	}
	return nil
}

// StartAPIServer starts kube-apiserver (again) on the same port and etcd and
// waits until it is ready. It is a no-op if it is running.
func (k *Kube) StartAPIServer(ctx context.Context) error {
	k.mu.Lock()
	if k.api != nil {
		if done, _ := k.api.exited(); !done {
			k.mu.Unlock()
			return nil
		}
	}
	p, err := startProc("kube-apiserver", k.apiLog, k.apiBin, k.apiArgs...)
	if err != nil {
		k.mu.Unlock()
		return err
	}
	k.api = p
	k.mu.Unlock()

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(k.caPEM)
	hc := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	defer hc.CloseIdleConnections()
	hdr := http.Header{"Authorization": {"Bearer " + k.token}}
	err = waitFor(ctx, p, func(ctx context.Context) error {
		_, err := httpGet(ctx, hc, k.Host()+"/readyz", hdr)
		return err
	})
	if err != nil {
		return &StartError{Component: "kube-apiserver", Logs: k.Logs(), Err: err}
	}
	return nil
}

// StopAPIServer stops kube-apiserver and waits for it to exit; etcd keeps
// the data for StartAPIServer.
func (k *Kube) StopAPIServer() {
	k.mu.Lock()
	p := k.api
	k.mu.Unlock()
	p.stop(15 * time.Second)
}

// Stop stops both processes and removes the temporary directory (with the
// kubeconfig). Safe to call more than once.
func (k *Kube) Stop() {
	k.mu.Lock()
	api, etcd := k.api, k.etcd
	k.mu.Unlock()
	api.stop(15 * time.Second)
	etcd.stop(10 * time.Second)
	if k.dir != "" {
		_ = os.RemoveAll(k.dir)
	}
}

// Host is the API server URL, https://127.0.0.1:<port>.
func (k *Kube) Host() string { return "https://127.0.0.1:" + strconv.Itoa(k.apiPort) }

// KubeconfigPath is a kubeconfig for the admin user (removed by Stop).
func (k *Kube) KubeconfigPath() string { return k.kubecfg }

// Token is the admin bearer token.
func (k *Kube) Token() string { return k.token }

// CAData is the PEM certificate the API server serves (its own CA).
func (k *Kube) CAData() []byte { return append([]byte(nil), k.caPEM...) }

// EtcdEndpoint is etcd's client URL.
func (k *Kube) EtcdEndpoint() string { return "http://127.0.0.1:" + strconv.Itoa(k.etcdPort) }

// RestConfig returns a new admin client config; callers may modify it.
func (k *Kube) RestConfig() *rest.Config {
	return &rest.Config{
		Host:            k.Host(),
		BearerToken:     k.token,
		TLSClientConfig: rest.TLSClientConfig{CAData: k.CAData()},
		// Tests create many objects quickly; client-go's default 5 QPS
		// would make them slow for no benefit.
		QPS:   200,
		Burst: 400,
	}
}

// Logs returns the tail of etcd's and kube-apiserver's logs.
func (k *Kube) Logs() string { return logsOf(k.etcdLog, k.apiLog) }
