package gatewaystatus

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Lease elects, among the replicas of one revision, the one writing the Gateway API status, as
// istiod's per-revision election of its gateway status controller: each revision has its own
// Lease, so that a canary's objects get their status while the default revision's leader writes
// its own (the revisions never write each other's objects: Writer keeps to its revision's).
// The default revision uses config-ingest's status Lease instead (no Lease of its own).
type Lease struct {
	kube      kubernetes.Interface
	namespace string
	name      string
	identity  string
	log       *slog.Logger
	// LeaseDuration, RenewDeadline, RetryPeriod as client-go's leader election takes them.
	timings [3]time.Duration
	leading atomic.Bool
	elected func()
}

// LeaseName is the Lease of a revision's Gateway API status writer.
func LeaseName(statusLease, revision string) string { return statusLease + "-" + revision }

// NewLease returns the election of revision's status writer; elected is called on each win.
func NewLease(kube kubernetes.Interface, namespace, name, identity string, leaseDuration, renewDeadline, retryPeriod time.Duration, log *slog.Logger, elected func()) *Lease {
	return &Lease{kube: kube, namespace: namespace, name: name, identity: identity, log: log,
		timings: [3]time.Duration{leaseDuration, renewDeadline, retryPeriod}, elected: elected}
}

// Leader reports whether this replica holds the Lease.
func (l *Lease) Leader() bool { return l.leading.Load() }

// Run campaigns until ctx is done, releasing the Lease then.
func (l *Lease) Run(ctx context.Context) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: l.namespace, Name: l.name},
		Client:     l.kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: l.identity},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, Name: l.name,
			LeaseDuration: l.timings[0], RenewDeadline: l.timings[1], RetryPeriod: l.timings[2],
			ReleaseOnCancel: true,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) {
					l.log.Info("elected to write the Gateway API status of this revision", "lease", l.namespace+"/"+l.name, "identity", l.identity)
					l.leading.Store(true)
					l.elected()
				},
				OnStoppedLeading: func() {
					if l.leading.Swap(false) {
						l.log.Info("no longer writing the Gateway API status", "identity", l.identity)
					}
				},
			},
		})
		if err != nil {
			l.log.Error("leader election misconfigured; not writing the Gateway API status", "error", err)
			return
		}
		le.Run(ctx)
	}
}
