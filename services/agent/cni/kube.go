package cni

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// kubeconfig is the part of a kubeconfig file the plugin reads: the current context's server,
// its CA, and a bearer token (inline, or a file read at each use, so a rotated token is taken).
// The plugin links no Kubernetes client: it asks for one pod, and client-go would add most of
// its size and start-up time (CNI ADD runs once per pod, on the pod's start path).
type kubeconfig struct {
	CurrentContext string `json:"current-context"`
	Clusters       []struct {
		Name    string `json:"name"`
		Cluster struct {
			Server                   string `json:"server"`
			CertificateAuthority     string `json:"certificate-authority"`
			CertificateAuthorityData string `json:"certificate-authority-data"`
		} `json:"cluster"`
	} `json:"clusters"`
	Users []struct {
		Name string `json:"name"`
		User struct {
			Token     string `json:"token"`
			TokenFile string `json:"tokenFile"`
		} `json:"user"`
	} `json:"users"`
	Contexts []struct {
		Name    string `json:"name"`
		Context struct {
			Cluster string `json:"cluster"`
			User    string `json:"user"`
		} `json:"context"`
	} `json:"contexts"`
}

// kubeClient gets pods from the API server.
type kubeClient struct {
	server    string
	token     string
	tokenFile string
	http      *http.Client
}

// newKubeClient reads the kubeconfig at path.
func newKubeClient(path string) (*kubeClient, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	var kc kubeconfig
	if err := yaml.Unmarshal(data, &kc); err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	clusterName, userName := "", ""
	for _, c := range kc.Contexts {
		if c.Name == kc.CurrentContext || kc.CurrentContext == "" && len(kc.Contexts) == 1 {
			clusterName, userName = c.Context.Cluster, c.Context.User
		}
	}
	if clusterName == "" {
		return nil, fmt.Errorf("kubeconfig %s: no context %q", path, kc.CurrentContext)
	}
	c := &kubeClient{}
	pool := x509.NewCertPool()
	for _, cl := range kc.Clusters {
		if cl.Name != clusterName {
			continue
		}
		c.server = strings.TrimSuffix(cl.Cluster.Server, "/")
		ca := []byte(nil)
		switch {
		case cl.Cluster.CertificateAuthorityData != "":
			if ca, err = base64.StdEncoding.DecodeString(cl.Cluster.CertificateAuthorityData); err != nil {
				return nil, fmt.Errorf("kubeconfig %s: cluster %s: certificate-authority-data: %w", path, clusterName, err)
			}
		case cl.Cluster.CertificateAuthority != "":
			f := cl.Cluster.CertificateAuthority
			if !filepath.IsAbs(f) {
				f = filepath.Join(filepath.Dir(path), f)
			}
			if ca, err = os.ReadFile(f); err != nil {
				return nil, fmt.Errorf("kubeconfig %s: cluster %s: %w", path, clusterName, err)
			}
		}
		if len(ca) > 0 && !pool.AppendCertsFromPEM(ca) {
			return nil, fmt.Errorf("kubeconfig %s: cluster %s: the certificate authority holds no PEM certificate", path, clusterName)
		}
	}
	if c.server == "" {
		return nil, fmt.Errorf("kubeconfig %s: cluster %q has no server", path, clusterName)
	}
	for _, u := range kc.Users {
		if u.Name == userName {
			c.token, c.tokenFile = u.User.Token, u.User.TokenFile
		}
	}
	if c.token == "" && c.tokenFile == "" {
		return nil, fmt.Errorf("kubeconfig %s: user %q has neither token nor tokenFile", path, userName)
	}
	c.http = &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
	}
	return c, nil
}

// newInClusterClient is the node agent's own client: server, the token file (re-read at each
// use) and the CA of its service account.
func newInClusterClient(server, tokenFile, caFile string) (*kubeClient, error) {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("the API server's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("the API server's CA %s holds no PEM certificate", caFile)
	}
	return &kubeClient{
		server: strings.TrimSuffix(server, "/"), tokenFile: tokenFile,
		http: &http.Client{
			Timeout:   10 * time.Second,
			Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
		},
	}, nil
}

// pod is what the plugin reads of a Pod.
type pod struct {
	Metadata struct {
		Name              string            `json:"name"`
		Namespace         string            `json:"namespace"`
		UID               string            `json:"uid"`
		DeletionTimestamp *string           `json:"deletionTimestamp"`
		Labels            map[string]string `json:"labels"`
		Annotations       map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		NodeName       string      `json:"nodeName"`
		InitContainers []container `json:"initContainers"`
		Containers     []container `json:"containers"`
	} `json:"spec"`
	Status struct {
		InitContainerStatuses []containerStatus `json:"initContainerStatuses"`
	} `json:"status"`
}

// containerStatus is what the repair loop reads of a container's status.
type containerStatus struct {
	Name                 string         `json:"name"`
	State                containerState `json:"state"`
	LastTerminationState containerState `json:"lastState"`
}

type containerState struct {
	Waiting *struct {
		Reason string `json:"reason"`
	} `json:"waiting"`
	Running    *struct{} `json:"running"`
	Terminated *struct {
		ExitCode int32  `json:"exitCode"`
		Reason   string `json:"reason"`
		Message  string `json:"message"`
	} `json:"terminated"`
}

type container struct {
	Name string   `json:"name"`
	Args []string `json:"args"`
	Env  []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"env"`
	SecurityContext *struct {
		RunAsUser  *int64 `json:"runAsUser"`
		RunAsGroup *int64 `json:"runAsGroup"`
	} `json:"securityContext"`
}

// errFinal is an answer asking again will not change (refused, not found): ADD fails at once.
var errFinal = errors.New("the API server's answer is final")

// getPod asks the API server for namespace/name.
func (c *kubeClient) getPod(ctx context.Context, namespace, name string) (*pod, error) {
	body, err := c.do(ctx, c.http, http.MethodGet, "/api/v1/namespaces/"+url.PathEscape(namespace)+"/pods/"+url.PathEscape(name), nil)
	if err != nil {
		return nil, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	defer body.Close()
	var p pod
	if err := json.NewDecoder(io.LimitReader(body, 8<<20)).Decode(&p); err != nil {
		return nil, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	return &p, nil
}

// do sends one request with the bearer token; a non-2xx answer is an error quoting the
// Status message, wrapping errFinal unless asking again may help (unreachable, 5xx, 429).
// The caller closes the body.
func (c *kubeClient) do(ctx context.Context, client *http.Client, method, path string, reqBody []byte) (io.ReadCloser, error) {
	token := c.token
	if c.tokenFile != "" {
		b, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig token: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	var rd io.Reader
	if reqBody != nil {
		rd = bytes.NewReader(reqBody)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.server+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "application/json")
	if reqBody != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 == 2 {
		return resp.Body, nil
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	// A refusal is a Status whose message says why.
	msg := strings.TrimSpace(string(body))
	var status struct{ Message string }
	if json.Unmarshal(body, &status) == nil && status.Message != "" {
		msg = status.Message
	}
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 {
		return nil, &apiError{Code: resp.StatusCode, Message: resp.Status + ": " + msg}
	}
	// 401, 403, 404, 409, 410: the token, the RBAC or the object is wrong
	return nil, &apiError{Code: resp.StatusCode, Message: resp.Status + ": " + msg, final: true}
}

// apiError is the API server's refusal.
type apiError struct {
	Code    int
	Message string
	final   bool
}

func (e *apiError) Error() string {
	if e.final {
		return e.Message + " (" + errFinal.Error() + ")"
	}
	return e.Message
}

func (e *apiError) Unwrap() error {
	if e.final {
		return errFinal
	}
	return nil
}
