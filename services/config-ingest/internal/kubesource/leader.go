package kubesource

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// runLeaderElection campaigns for the Lease until ctx is done; while this replica holds it,
// it writes status. Every replica publishes regardless.
func (s *Source) runLeaderElection(ctx context.Context) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: s.cfg.Namespace, Name: LeaseName},
		Client:     s.clients.Kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: s.cfg.Identity},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:          lock,
			Name:          LeaseName,
			LeaseDuration: s.cfg.LeaseDuration,
			RenewDeadline: s.cfg.RenewDeadline,
			RetryPeriod:   s.cfg.RetryPeriod,
			// A replica shutting down hands over at once instead of after LeaseDuration.
			ReleaseOnCancel: true,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) {
					s.log.Info("elected to write config status", "lease", s.cfg.Namespace+"/"+LeaseName, "identity", s.cfg.Identity)
					s.leader.Store(true)
					s.enqueueAllStatus()
				},
				OnStoppedLeading: func() {
					if s.leader.Swap(false) {
						s.log.Info("no longer writing config status", "identity", s.cfg.Identity)
					}
				},
			},
		})
		if err != nil {
			s.log.Error("leader election misconfigured; not writing status", "error", err)
			return
		}
		le.Run(ctx)
	}
}

// enqueueAllStatus queues a status check of every resource, for a new leader to catch up.
func (s *Source) enqueueAllStatus() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, ks := range s.kinds {
		if ks.informer == nil || isGatewayAPI(ks.kind) {
			continue
		}
		for _, key := range ks.informer.GetIndexer().ListKeys() {
			ns, name, _ := cache.SplitMetaNamespaceKey(key)
			s.enqueueStatusLocked(statusKey{kind: i, ns: ns, name: name})
		}
	}
}
