package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"golang.org/x/time/rate"
)

// ValidationContainer is the init container of an injected pod in CNI mode that checks the
// plugin captured its traffic (`agent capture --validate`), as Istio's.
const ValidationContainer = "istio-validation"

// statusAnnotation marks a pod the webhook injected.
const statusAnnotation = "sidecar.istio.io/status"

// Repairer deletes the pods on its node whose validation init container failed, so that their
// controller creates them again, through the plugin. This is Istio's race on node restart
// (istio/istio#14327): the kubelet may start pods before the DaemonSet has put the plugin back,
// and such a pod's network namespace is never captured; its validation fails, and retrying it
// cannot help, since CNI ADD runs once per pod sandbox. As Istio's repair controller in its
// default mode, it deletes them (with a UID precondition, so a new pod of the same name is
// never hit), at most QPS a second, and records a Warning event on each.
type Repairer struct {
	// NodeName is this node: only its pods are watched (field selector spec.nodeName).
	NodeName string
	// Container is the validation container's name (ValidationContainer when empty).
	Container string
	// QPS and Burst bound the deletions (1 a second, burst 5, when zero).
	QPS   float64
	Burst int
	Log   *slog.Logger

	kube *kubeClient
}

// NewRepairer is a repair loop with the node agent's own account (it may list, watch and delete
// pods and create events).
func NewRepairer(server, tokenFile, caFile, nodeName string, log *slog.Logger) (*Repairer, error) {
	if nodeName == "" {
		return nil, errors.New("repair: the node name is empty (set NODE_NAME from spec.nodeName)")
	}
	kube, err := newInClusterClient(server, tokenFile, caFile)
	if err != nil {
		return nil, fmt.Errorf("repair: %w", err)
	}
	return &Repairer{NodeName: nodeName, Log: log, kube: kube}, nil
}

// Run lists and watches this node's pods until ctx ends, deleting the broken ones; API errors
// are logged and retried with backoff.
func (r *Repairer) Run(ctx context.Context) error {
	if r.Container == "" {
		r.Container = ValidationContainer
	}
	if r.QPS <= 0 {
		r.QPS = 1
	}
	if r.Burst <= 0 {
		r.Burst = 5
	}
	lim := rate.NewLimiter(rate.Limit(r.QPS), r.Burst)
	r.Log.Info("repairing pods whose validation failed", "node", r.NodeName, "container", r.Container)
	backoff := time.Second
	for {
		err := r.listAndWatch(ctx, lim)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil { // the watch ended normally (server timeout): list again at once
			backoff = time.Second
			continue
		}
		r.Log.Error("repair: list/watch pods", "node", r.NodeName, "error", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// listAndWatch lists the node's pods, repairs the broken ones, then follows the watch from the
// list's version.
func (r *Repairer) listAndWatch(ctx context.Context, lim *rate.Limiter) error {
	sel := "/api/v1/pods?fieldSelector=" + url.QueryEscape("spec.nodeName="+r.NodeName)
	body, err := r.kube.do(ctx, r.kube.http, http.MethodGet, sel, nil)
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	var list struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Items []pod `json:"items"`
	}
	err = json.NewDecoder(body).Decode(&list)
	body.Close()
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	for i := range list.Items {
		if err := r.reconcile(ctx, lim, &list.Items[i]); err != nil {
			return err
		}
	}
	// No client timeout on the stream: the server ends it after timeoutSeconds.
	stream := &http.Client{Transport: r.kube.http.Transport}
	body, err = r.kube.do(ctx, stream, http.MethodGet, sel+"&watch=true&allowWatchBookmarks=true&timeoutSeconds=300&resourceVersion="+url.QueryEscape(list.Metadata.ResourceVersion), nil)
	if err != nil {
		return fmt.Errorf("watch pods: %w", err)
	}
	defer body.Close()
	dec := json.NewDecoder(body)
	for {
		var ev struct {
			Type   string          `json:"type"`
			Object json.RawMessage `json:"object"`
		}
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("watch pods: %w", err)
		}
		switch ev.Type {
		case "ADDED", "MODIFIED":
			var p pod
			if err := json.Unmarshal(ev.Object, &p); err != nil {
				return fmt.Errorf("watch pods: %w", err)
			}
			if err := r.reconcile(ctx, lim, &p); err != nil {
				return err
			}
		case "ERROR": // typically 410 Gone: the version is too old; list again
			var st struct{ Message string }
			_ = json.Unmarshal(ev.Object, &st)
			r.Log.Debug("repair: watch ended", "message", st.Message)
			return nil
		}
	}
}

// broken says why the pod's validation failed, or "" when it did not (or is still running).
func (r *Repairer) broken(p *pod) string {
	if p.Metadata.DeletionTimestamp != nil || p.Metadata.Annotations[statusAnnotation] == "" {
		return ""
	}
	for _, cs := range p.Status.InitContainerStatuses {
		if cs.Name != r.Container {
			continue
		}
		if t := cs.State.Terminated; t != nil {
			if t.ExitCode == 0 {
				return "" // passed
			}
			return fmt.Sprintf("exited with code %d: %s", t.ExitCode, t.Message)
		}
		// Restarted after a failure (running again, or waiting in CrashLoopBackOff): the retry
		// runs in the same uncaptured network namespace, so it fails too.
		if t := cs.LastTerminationState.Terminated; t != nil && t.ExitCode != 0 {
			reason := "restarting"
			if w := cs.State.Waiting; w != nil && w.Reason != "" {
				reason = w.Reason
			}
			return fmt.Sprintf("%s after exiting with code %d: %s", reason, t.ExitCode, t.Message)
		}
	}
	return ""
}

// reconcile deletes p when its validation failed. Only ctx ending is an error: a failed
// deletion is logged and recorded as an event, and the pod's next change tries again.
func (r *Repairer) reconcile(ctx context.Context, lim *rate.Limiter, p *pod) error {
	why := r.broken(p)
	if why == "" {
		return nil
	}
	ns, name := p.Metadata.Namespace, p.Metadata.Name
	if res := lim.Reserve(); res.Delay() > 0 {
		r.Log.Info("repair: rate limited, waiting", "pod", ns+"/"+name, "wait", res.Delay())
		t := time.NewTimer(res.Delay())
		select {
		case <-ctx.Done():
			t.Stop()
			res.Cancel()
			return ctx.Err()
		case <-t.C:
		}
	}
	opts, _ := json.Marshal(map[string]any{"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": map[string]string{"uid": p.Metadata.UID}})
	body, err := r.kube.do(ctx, r.kube.http, http.MethodDelete, "/api/v1/namespaces/"+url.PathEscape(ns)+"/pods/"+url.PathEscape(name), opts)
	var apiErr *apiError
	switch {
	case err == nil:
		body.Close()
		r.Log.Warn("repair: deleted a pod whose traffic capture failed; its controller creates it again", "pod", ns+"/"+name, "node", r.NodeName, "validation", why)
		r.event(ctx, p, "pod's traffic capture validation "+why+": deleted, so that it is created again with the CNI plugin in place")
	case errors.As(err, &apiErr) && (apiErr.Code == http.StatusNotFound || apiErr.Code == http.StatusConflict):
		// Already gone, or another pod now has that name.
	case ctx.Err() != nil:
		return ctx.Err()
	default:
		r.Log.Error("repair: delete pod", "pod", ns+"/"+name, "error", err)
		r.event(ctx, p, "pod's traffic capture validation "+why+", but deleting it failed: "+err.Error())
	}
	return nil
}

// event records a Warning event on the pod (reason DeleteBrokenPod, as Istio's); failing to is
// only logged.
func (r *Repairer) event(ctx context.Context, p *pod, msg string) {
	now := time.Now().UTC().Format(time.RFC3339)
	ev, _ := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Event",
		"metadata": map[string]any{"generateName": p.Metadata.Name + ".", "namespace": p.Metadata.Namespace},
		"involvedObject": map[string]any{
			"apiVersion": "v1", "kind": "Pod", "namespace": p.Metadata.Namespace, "name": p.Metadata.Name, "uid": p.Metadata.UID,
		},
		"reason": "DeleteBrokenPod", "message": msg, "type": "Warning", "count": 1,
		"firstTimestamp": now, "lastTimestamp": now,
		"source":             map[string]any{"component": PluginType, "host": r.NodeName},
		"reportingComponent": "sailplane.dev/" + PluginType, "reportingInstance": r.NodeName,
	})
	body, err := r.kube.do(ctx, r.kube.http, http.MethodPost, "/api/v1/namespaces/"+url.PathEscape(p.Metadata.Namespace)+"/events", ev)
	if err != nil {
		r.Log.Error("repair: record event", "pod", p.Metadata.Namespace+"/"+p.Metadata.Name, "error", err)
		return
	}
	body.Close()
}
