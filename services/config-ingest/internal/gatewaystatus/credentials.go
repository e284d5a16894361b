package gatewaystatus

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"maps"
	"slices"
	"strings"

	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	runtimeschema "k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"sailplane.dev/shared/gatewayapi"
)

// credential is all the status keeps of a Secret or ConfigMap: whether it holds a TLS
// certificate and key, and whether it holds a CA bundle, as the error text istiod would give
// ("" when valid). The informers' transform replaces every object by one, so no certificate,
// and never a private key, stays in memory; the text names keys, never their values.
type credential struct {
	metav1.ObjectMeta
	pairErr, caErr string
}

// credential is a runtime.Object so that any part of client-go handling stored objects takes it.
var _ runtime.Object = (*credential)(nil)

func (c *credential) GetObjectKind() runtimeschema.ObjectKind { return runtimeschema.EmptyObjectKind }

func (c *credential) DeepCopyObject() runtime.Object {
	out := *c
	c.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	return &out
}

// The keys of the two layouts istiod reads, in any Secret type: generic (cert, key, cacert)
// first, then kubernetes.io/tls's (tls.crt, tls.key, ca.crt).
const (
	genericCert   = "cert"
	genericKey    = "key"
	genericCACert = "cacert"
	tlsCert       = "tls.crt"
	tlsKey        = "tls.key"
	tlsCACert     = "ca.crt"
)

// secretsFieldSelector leaves out the two kinds of Secret that are large, common and never a
// certificate (Helm releases, service-account tokens), as istiod's informer does.
var secretsFieldSelector = fields.AndSelectors(
	fields.OneTermNotEqualSelector("type", "helm.sh/release.v1"),
	fields.OneTermNotEqualSelector("type", string(corev1.SecretTypeServiceAccountToken))).String()

// toCredential is the informers' transform. An object already transformed comes back (client-go
// may pass one again), anything else unknown is kept as it is.
func toCredential(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Secret:
		c := &credential{ObjectMeta: trimmedMeta(o.ObjectMeta)}
		c.pairErr = errText(checkKeyPair(o.Data))
		c.caErr = errText(checkCA("secret", o.Data))
		return c, nil
	case *corev1.ConfigMap:
		data := make(map[string][]byte, len(o.Data))
		for k, v := range o.Data {
			data[k] = []byte(v)
		}
		c := &credential{ObjectMeta: trimmedMeta(o.ObjectMeta), pairErr: "a ConfigMap holds no private key"}
		c.caErr = errText(checkCA("configmap", data))
		return c, nil
	}
	return obj, nil
}

func trimmedMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// checkKeyPair is istiod's check of a listener's certificateRef (ExtractCertInfo, then
// tls.X509KeyPair): a certificate and key under cert/key or tls.crt/tls.key that parse and match.
func checkKeyPair(data map[string][]byte) error {
	var cert, key []byte
	switch {
	case len(data[genericCert]) > 0 && len(data[genericKey]) > 0:
		cert, key = data[genericCert], data[genericKey]
	case len(data[tlsCert]) > 0 && len(data[tlsKey]) > 0:
		cert, key = data[tlsCert], data[tlsKey]
	case hasKeys(data, genericCert, genericKey):
		return fmt.Errorf("found keys %q and %q, but they were empty", genericCert, genericKey)
	case hasKeys(data, tlsCert, tlsKey):
		return fmt.Errorf("found keys %q and %q, but they were empty", tlsCert, tlsKey)
	default:
		return fmt.Errorf("found secret, but didn't have expected keys (%s and %s) or (%s and %s); found: %s",
			genericCert, genericKey, tlsCert, tlsKey, keyList(data))
	}
	if _, err := tls.X509KeyPair(cert, key); err != nil {
		return fmt.Errorf("the certificate is malformed: %v", err)
	}
	return nil
}

// checkCA is istiod's check of a CA reference (ExtractRoot, then the PEM bundle must add at
// least one certificate to a pool): cacert, else ca.crt.
func checkCA(kind string, data map[string][]byte) error {
	var bundle []byte
	switch {
	case len(data[genericCACert]) > 0:
		bundle = data[genericCACert]
	case len(data[tlsCACert]) > 0:
		bundle = data[tlsCACert]
	case hasKeys(data, genericCACert):
		return fmt.Errorf("found key %q, but it was empty", genericCACert)
	case hasKeys(data, tlsCACert):
		return fmt.Errorf("found key %q, but it was empty", tlsCACert)
	default:
		return fmt.Errorf("found %s, but didn't have expected keys %s or %s; found: %s", kind, genericCACert, tlsCACert, keyList(data))
	}
	if !x509.NewCertPool().AppendCertsFromPEM(bundle) {
		return fmt.Errorf("the bundle is malformed")
	}
	return nil
}

func hasKeys(data map[string][]byte, keys ...string) bool {
	for _, k := range keys {
		if _, ok := data[k]; !ok {
			return false
		}
	}
	return true
}

// keyList names the keys (never the values), the first three and how many more, as istiod.
func keyList(data map[string][]byte) string {
	keys := slices.Sorted(maps.Keys(data))
	if len(keys) < 3 {
		return strings.Join(keys, ", ")
	}
	return fmt.Sprintf("%s, and %d more...", strings.Join(keys[:3], ", "), len(keys)-3)
}

// watchCredentials starts watching Secrets (field-selected as istiod's) and ConfigMaps, both
// transformed to credentials, and returns their informers; a change of a verdict, an object
// added or deleted, recomputes the status.
func (w *Writer) watchCredentials() (secrets, configMaps cache.SharedIndexInformer, err error) {
	secretF := informers.NewSharedInformerFactoryWithOptions(w.kube, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = secretsFieldSelector }))
	cmF := informers.NewSharedInformerFactory(w.kube, 0)
	secrets, configMaps = secretF.Core().V1().Secrets().Informer(), cmF.Core().V1().ConfigMaps().Informer()
	for _, inf := range []cache.SharedIndexInformer{secrets, configMaps} {
		if err := inf.SetTransform(toCredential); err != nil {
			return nil, nil, fmt.Errorf("gatewaystatus: %w", err)
		}
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { w.markDirty() },
			DeleteFunc: func(any) { w.markDirty() },
			UpdateFunc: func(oldObj, newObj any) {
				o, ok1 := oldObj.(*credential)
				n, ok2 := newObj.(*credential)
				// A renewed certificate that stays valid changes no status.
				if !ok1 || !ok2 || o.pairErr != n.pairErr || o.caErr != n.caErr {
					w.markDirty()
				}
			},
		})
	}
	w.factories = append(w.factories, secretF, cmF)
	return secrets, configMaps, nil
}

// mayReadCredentials asks the API server whether this client may list and watch Secrets and
// ConfigMaps in every namespace (a self review every authenticated user may make): without it
// the informers would never sync and the status would wait forever.
func mayReadCredentials(ctx context.Context, kube kubernetes.Interface) (bool, string) {
	for _, resource := range []string{"secrets", "configmaps"} {
		for _, verb := range []string{"list", "watch"} {
			r, err := kube.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authzv1.SelfSubjectAccessReview{
				Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authzv1.ResourceAttributes{Verb: verb, Resource: resource}},
			}, metav1.CreateOptions{})
			switch {
			case err != nil:
				return false, fmt.Sprintf("cannot ask whether it may %s %s: %v", verb, resource, err)
			case !r.Status.Allowed:
				return false, fmt.Sprintf("may not %s %s in every namespace", verb, resource)
			}
		}
	}
	return true, ""
}

// credentialRegistry is a registry that also checks certificate references
// (gatewayapi.Secrets) against the credentials.
type credentialRegistry struct {
	*registry
	secrets, configMaps cache.Store
}

var _ gatewayapi.Secrets = credentialRegistry{}

// Certificate answers as istiod: a missing object, or one without a usable key pair (CA bundle
// with caOnly), makes the reference invalid, the error saying why.
func (r credentialRegistry) Certificate(kind, namespace, name string, caOnly bool) error {
	var store cache.Store
	switch kind {
	case "Secret":
		store = r.secrets
	case "ConfigMap":
		store = r.configMaps
	default:
		return fmt.Errorf("unsupported kind %s", kind)
	}
	obj, ok, _ := store.GetByKey(namespace + "/" + name)
	c, isCred := obj.(*credential)
	if !ok || !isCred {
		return fmt.Errorf("%s %s/%s not found", strings.ToLower(kind), namespace, name)
	}
	msg := c.pairErr
	if caOnly {
		msg = c.caErr
	}
	if msg != "" {
		return fmt.Errorf("%s", msg)
	}
	return nil
}
