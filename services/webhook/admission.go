package webhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MaxRequestBytes bounds an admission review's body. An UPDATE carries the object and its old
// version, each up to the API server's 1.5 MiB, in JSON that may be larger than what etcd
// stores; istiod reads up to the same 6 MiB.
const MaxRequestBytes = 6 << 20

// The AdmissionReview versions answered (the configurations ask for v1; v1beta1 has the same
// JSON shape).
var reviewVersions = map[string]bool{"admission.k8s.io/v1": true, "admission.k8s.io/v1beta1": true}

// admitFunc decides one admission request.
type admitFunc func(*admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse

// answeredFunc observes how an admission request was answered, after took: resp is nil and
// status the HTTP error for a body that is no admission review.
type answeredFunc func(resp *admissionv1.AdmissionResponse, status int, took time.Duration)

// admission serves admit over the AdmissionReview protocol. A body that is no admission review
// (wrong method or media type, too large, malformed, without a request) is refused with an HTTP
// error saying why: the API server never sends one, so it is a client to tell, not an object to
// judge. A panic in admit refuses that request and leaves the server running.
func (s *Server) admission(admit admitFunc, answered answeredFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		review, status, err := readReview(w, r)
		if err != nil {
			s.log.Info("bad admission request", "path", r.URL.Path, "from", r.RemoteAddr, "status", status, "error", err)
			http.Error(w, err.Error(), status)
			answered(nil, status, time.Since(start))
			return
		}
		resp := s.admitRecovered(admit, review.Request)
		defer func() { answered(resp, http.StatusOK, time.Since(start)) }()
		resp.UID = review.Request.UID
		out, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp})
		if err != nil {
			http.Error(w, "encoding the response: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out)
	})
}

// readReview reads and checks an AdmissionReview request; on error, the HTTP status to answer.
func readReview(w http.ResponseWriter, r *http.Request) (*admissionv1.AdmissionReview, int, error) {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return nil, http.StatusUnsupportedMediaType, fmt.Errorf("Content-Type %q: want application/json", r.Header.Get("Content-Type"))
	}
	var review admissionv1.AdmissionReview
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err := dec.Decode(&review); err != nil {
		if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
			return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("admission review larger than %d bytes", MaxRequestBytes)
		}
		return nil, http.StatusBadRequest, fmt.Errorf("malformed admission review: %w", err)
	}
	if dec.More() {
		return nil, http.StatusBadRequest, errors.New("malformed admission review: data after the JSON object")
	}
	switch {
	case review.Kind != "AdmissionReview" || !reviewVersions[review.APIVersion]:
		return nil, http.StatusBadRequest, fmt.Errorf("not an admission review: apiVersion %q, kind %q (want admission.k8s.io/v1 AdmissionReview)", review.APIVersion, review.Kind)
	case review.Request == nil:
		return nil, http.StatusBadRequest, errors.New("the admission review has no request")
	}
	return &review, 0, nil
}

// admitRecovered is admit(req), a refusal if admit panics or answers nothing.
func (s *Server) admitRecovered(admit admitFunc, req *admissionv1.AdmissionRequest) (resp *admissionv1.AdmissionResponse) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("admission handler panicked", "kind", req.Kind.Kind, "namespace", req.Namespace, "name", req.Name, "panic", r)
			resp = deny(fmt.Sprintf("internal error admitting %s %s/%s", req.Kind.Kind, req.Namespace, req.Name))
		}
	}()
	if resp = admit(req); resp == nil {
		return deny("internal error: no admission response")
	}
	return resp
}

// deny refuses a request with message, which the API server shows after `admission webhook
// "<name>" denied the request: `.
func deny(message string) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{Result: &metav1.Status{
		Status: metav1.StatusFailure, Message: message, Reason: metav1.StatusReasonInvalid, Code: http.StatusBadRequest,
	}}
}
