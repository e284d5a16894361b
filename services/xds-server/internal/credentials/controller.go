package credentials

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/shared/spiffe"
)

// secretsFieldSelector leaves out the two kinds of Secret that are large, common and never
// certificates (Helm releases, legacy service-account tokens), as istiod's does: the rest may
// hold certificates under any type.
var secretsFieldSelector = fields.AndSelectors(
	fields.OneTermNotEqualSelector("type", "helm.sh/release.v1"),
	fields.OneTermNotEqualSelector("type", string(corev1.SecretTypeServiceAccountToken))).String()

// How long a SubjectAccessReview's answer is kept, as istiod keeps it: a grant longer, since
// there is no hurry to revoke it, a denial briefly, so that a new RoleBinding takes effect soon.
const (
	allowedTTL = 5 * time.Minute
	deniedTTL  = time.Minute
	reviewWait = 10 * time.Second
)

// Controller watches the cluster's Secrets (a field-selected informer: never the data of Helm
// releases or token Secrets) and builds SDS secrets from them for the proxies allowed to read
// them. Secrets never leave it but to the proxy they are for: not on the bus, not in logs, not
// in the problems it reports (which name the Secret and the key, never a value).
type Controller struct {
	client kubernetes.Interface
	log    *slog.Logger
	now    func() time.Time

	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
	lister   listersv1.SecretLister

	mu       sync.Mutex
	onChange []func(namespace string)
	reviews  map[string]review          // service account user name ->
	problems map[string][]model.Problem // proxy ID -> what its last request could not be served
}

type review struct {
	err     error // nil: allowed
	expires time.Time
}

// New returns a controller reading client; Run it.
func New(client kubernetes.Interface, log *slog.Logger) *Controller {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = secretsFieldSelector }))
	secrets := factory.Core().V1().Secrets()
	c := &Controller{client: client, log: log, now: time.Now, factory: factory,
		informer: secrets.Informer(), lister: secrets.Lister(),
		reviews: map[string]review{}, problems: map[string][]model.Problem{}}
	// Only what Envoy is given is kept: no managed fields or annotations (kubectl's
	// last-applied-configuration annotation holds a second copy of the data).
	_ = c.informer.SetTransform(func(o any) (any, error) {
		if s, ok := o.(*corev1.Secret); ok {
			s = s.DeepCopy()
			s.ManagedFields, s.Annotations = nil, nil
			return s, nil
		}
		return o, nil
	})
	notify := func(o any) {
		if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = d.Obj
		}
		if s, ok := o.(*corev1.Secret); ok {
			c.changed(s.Namespace)
		}
	}
	_, _ = c.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    notify,
		UpdateFunc: func(_, o any) { notify(o) },
		DeleteFunc: notify,
	})
	return c
}

// OnChange calls f with the namespace of every Secret that appears, changes or goes.
func (c *Controller) OnChange(f func(namespace string)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onChange = append(c.onChange, f)
}

func (c *Controller) changed(ns string) {
	c.mu.Lock()
	fs := slices.Clone(c.onChange)
	c.mu.Unlock()
	for _, f := range fs {
		f(ns)
	}
}

// Run watches the Secrets until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	c.factory.Start(ctx.Done())
	<-ctx.Done()
	c.factory.Shutdown()
	return nil
}

// HasSynced reports whether the first list of Secrets is in.
func (c *Controller) HasSynced() bool { return c.informer.HasSynced() }

// Secrets builds the SDS secrets named in names for proxy (its ID, for the problems) whose
// stream authenticated as peer (a SPIFFE ID; "" when it did not). As istiod does, a proxy gets
// a Secret only of its own namespace (its authenticated one), and a key pair only if its
// service account may list Secrets there (SubjectAccessReview); a "-cacert" CA is public
// within the namespace. A name it may not have, or whose Secret is missing or malformed, is
// left out (the proxy keeps waiting for it, nothing weaker is served) and reported.
//
// Secrets are read from one cluster; a proxy of another (proxyCluster, its CLUSTER_ID, not
// cluster) is refused: istiod reads such a proxy's Secrets, and reviews its account, in the
// proxy's own cluster, and this cluster's RBAC says nothing of that one's accounts.
func (c *Controller) Secrets(ctx context.Context, proxy, proxyCluster, cluster, peer string, names []string) []*tlsv3.Secret {
	var out []*tlsv3.Secret
	var problems []model.Problem
	// Problems are keyed by the Secret (kubernetes://<namespace>/<name>) where it is known, so
	// that proxies of two namespaces asking for "kubernetes://cert" are told apart.
	report := func(key, msg string) {
		problems = append(problems, model.Problem{Metric: model.MetricCredentialNotServed, Key: key, Proxy: proxy, Message: msg})
	}
	id, idErr := spiffe.Parse(peer)
	for _, name := range names {
		if peer == "" || idErr != nil {
			report(name+" ("+proxy+")", "credentialName secret "+name+" is not served: the proxy's stream is not authenticated "+
				"(secrets are served only to a client certificate or token of the TLS xDS port, as istiod serves them)")
			continue
		}
		if proxyCluster != cluster {
			report(name+" ("+proxy+")", "credentialName secret "+name+" is not served: the proxy is of cluster "+proxyCluster+
				", and Secrets are read only from this control plane's cluster, "+cluster)
			continue
		}
		ref, err := Parse(name, id.Namespace)
		if err != nil {
			report(name+" ("+proxy+")", "credentialName secret "+name+" is not served: "+err.Error())
			continue
		}
		key := KubernetesPrefix + ref.Key()
		if err := c.authorize(ctx, ref, id); err != nil {
			report(key, "credentialName secret "+name+" is not served to "+id.String()+": "+err.Error())
			continue
		}
		s, err := c.build(ref)
		if err != nil && !c.HasSynced() {
			continue // not known yet: sent when the first list is in (OnChange)
		}
		if err != nil {
			report(key, "credentialName secret "+name+" is not served: "+err.Error())
			continue
		}
		out = append(out, s)
	}
	for _, p := range problems {
		c.log.Warn("credentialName secret not served", "proxy", proxy, "resource", p.Key, "reason", p.Message)
	}
	c.mu.Lock()
	if len(problems) == 0 {
		delete(c.problems, proxy)
	} else {
		c.problems[proxy] = problems
	}
	c.mu.Unlock()
	return out
}

// Problems are what the last request of each of proxies could not be served.
func (c *Controller) Problems(proxies []string) []model.Problem {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []model.Problem
	for _, p := range proxies {
		out = append(out, c.problems[p]...)
	}
	return out
}

// Forget drops what was recorded of proxy (it disconnected).
func (c *Controller) Forget(proxy string) {
	c.mu.Lock()
	delete(c.problems, proxy)
	c.mu.Unlock()
}

// errOtherNamespace is a Secret of another namespace than the proxy's, which istiod never serves
// (its kubernetes-gateway:// references to another namespace, allowed by a ReferenceGrant, are
// the exception Sailplane does not serve yet; those of the proxy's namespace it serves).
var errOtherNamespace = errors.New("a proxy may read only Secrets of its own namespace")

func (c *Controller) authorize(ctx context.Context, ref Ref, id spiffe.ID) error {
	if ref.Namespace != id.Namespace {
		return fmt.Errorf("Secret %s: %w (%s)", ref.Key(), errOtherNamespace, id.Namespace)
	}
	if ref.CAOnly {
		return nil // a CA certificate is public within the namespace, as in istiod
	}
	return c.review(ctx, id)
}

// review asks the API server whether the service account may list Secrets in its own namespace,
// as istiod does, keeping the answer a while.
func (c *Controller) review(ctx context.Context, id spiffe.ID) error {
	user := "system:serviceaccount:" + id.Namespace + ":" + id.ServiceAccount
	now := c.now()
	c.mu.Lock()
	for k, r := range c.reviews {
		if now.After(r.expires) {
			delete(c.reviews, k)
		}
	}
	r, ok := c.reviews[user]
	c.mu.Unlock()
	if ok {
		return r.err
	}
	ctx, cancel := context.WithTimeout(ctx, reviewWait)
	defer cancel()
	resp, err := c.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: id.Namespace, Verb: "list", Resource: "secrets"}},
	}, metav1.CreateOptions{})
	if err != nil {
		// Not kept: the next request asks again.
		return fmt.Errorf("cannot check whether %s may read Secrets of %s: %w", user, id.Namespace, err)
	}
	r = review{expires: now.Add(allowedTTL)}
	if !resp.Status.Allowed {
		r = review{expires: now.Add(deniedTTL), err: fmt.Errorf("service account %s may not list Secrets in %s (SubjectAccessReview: %s)",
			user, id.Namespace, strings.TrimSpace("denied "+resp.Status.Reason))}
	}
	c.mu.Lock()
	c.reviews[user] = r
	c.mu.Unlock()
	return r.err
}

// build reads the Secret ref names and turns it into an SDS secret named as the proxy asked.
func (c *Controller) build(ref Ref) (*tlsv3.Secret, error) {
	if ref.CAOnly {
		// "<name>-cacert": a Secret of that name, else the CA of the Secret "<name>".
		s, err := c.lister.Secrets(ref.Namespace).Get(ref.Name)
		if err != nil {
			s, err = c.lister.Secrets(ref.Namespace).Get(strings.TrimSuffix(ref.Name, CASuffix))
		}
		if err != nil {
			return nil, fmt.Errorf("neither Secret %s nor %s/%s exists", ref.Key(), ref.Namespace, strings.TrimSuffix(ref.Name, CASuffix))
		}
		ca, err := extractCA(s.Namespace+"/"+s.Name, s.Data)
		if err != nil {
			return nil, err
		}
		vc := &tlsv3.CertificateValidationContext{TrustedCa: inline(ca.cert)}
		if len(ca.crl) > 0 {
			vc.Crl = inline(ca.crl)
		}
		return &tlsv3.Secret{Name: ref.Resource, Type: &tlsv3.Secret_ValidationContext{ValidationContext: vc}}, nil
	}
	s, err := c.lister.Secrets(ref.Namespace).Get(ref.Name)
	if err != nil {
		return nil, fmt.Errorf("Secret %s does not exist", ref.Key())
	}
	kp, err := extractKeyPair(ref.Key(), s.Data)
	if err != nil {
		return nil, err
	}
	cert := &tlsv3.TlsCertificate{CertificateChain: inline(kp.cert), PrivateKey: inline(kp.key)}
	if len(kp.staple) > 0 {
		cert.OcspStaple = inline(kp.staple)
	}
	return &tlsv3.Secret{Name: ref.Resource, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: cert}}, nil
}

func inline(b []byte) *corev3.DataSource {
	return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}}
}
