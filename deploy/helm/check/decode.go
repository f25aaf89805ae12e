package main

import (
	"encoding/json"
	"errors"
	"fmt"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// object is one rendered document: its template, its text, and once decoded its head and
// its typed value (a pointer to the API type).
type object struct {
	template string
	yaml     string
	head     head
	typed    any
}

type head struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
}

func (h head) String() string { return h.Kind + "/" + h.Metadata.Name }

// kinds are the only objects the chart may render, each with the type it decodes into.
var kinds = map[string]func() any{
	"v1/ConfigMap":                            func() any { return &corev1.ConfigMap{} },
	"v1/Service":                              func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                       func() any { return &corev1.ServiceAccount{} },
	"apps/v1/Deployment":                      func() any { return &appsv1.Deployment{} },
	"policy/v1/PodDisruptionBudget":           func() any { return &policyv1.PodDisruptionBudget{} },
	"batch/v1/Job":                            func() any { return &batchv1.Job{} },
	"batch/v1/CronJob":                        func() any { return &batchv1.CronJob{} },
	"networking.k8s.io/v1/NetworkPolicy":      func() any { return &networkingv1.NetworkPolicy{} },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &monitoringv1.ServiceMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule": func() any { return &monitoringv1.PrometheusRule{} },
}

// strictJSON turns YAML into JSON, refusing duplicate keys.
func strictJSON(text []byte) ([]byte, error) {
	return yaml.YAMLToJSONStrict(text)
}

// strictDecode decodes JSON into v as the API server's strict field validation does:
// an unknown field, a duplicate field or a field named in the wrong case is an error.
func strictDecode(data []byte, v any) error {
	strict, err := kjson.UnmarshalStrict(data, v)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

func (o *object) decode() error {
	data, err := strictJSON([]byte(o.yaml))
	if err != nil {
		return fmt.Errorf("not YAML: %w", err)
	}
	if err := json.Unmarshal(data, &o.head); err != nil {
		return fmt.Errorf("no apiVersion/kind/metadata: %w", err)
	}
	newObject, ok := kinds[o.head.APIVersion+"/"+o.head.Kind]
	if !ok {
		return fmt.Errorf("%s %s: a kind the chart must not render (or an API version no Kubernetes >= 1.27 serves)", o.head.APIVersion, o.head.Kind)
	}
	o.typed = newObject()
	if err := strictDecode(data, o.typed); err != nil {
		return fmt.Errorf("%s does not decode strictly into %s %s: %w", o.head, o.head.APIVersion, o.head.Kind, err)
	}
	return nil
}
