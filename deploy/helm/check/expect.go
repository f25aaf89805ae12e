package main

import (
	"encoding/json"
	"os"
	"regexp"
	"sort"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
)

func byKind(objects []object) map[string][]object {
	out := map[string][]object{}
	for _, o := range objects {
		out[o.head.Kind] = append(out[o.head.Kind], o)
	}
	return out
}

func deployment(objects []object, component string) *appsv1.Deployment {
	for _, o := range objects {
		if d, ok := o.typed.(*appsv1.Deployment); ok && d.Labels["app.kubernetes.io/component"] == component {
			return d
		}
	}
	return nil
}

// checkDefaults: with no values at all, the relay as an active/standby pair and nothing
// else that needs more than the core API.
func (c *checker) checkDefaults(objects []object) {
	kinds := byKind(objects)
	var got []string
	for k, list := range kinds {
		for range list {
			got = append(got, k)
		}
	}
	sort.Strings(got)
	want := []string{"ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "ServiceAccount"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		c.fail("default values: rendered %v, want %v", got, want)
	}
	d := deployment(objects, "relay")
	if d == nil {
		c.fail("default values: no relay Deployment")
		return
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		c.fail("default values: the relay's replicas are not 2 (active/standby)")
	}
	if args := d.Spec.Template.Spec.Containers[0].Args; len(args) != 1 || args[0] != "run" {
		c.fail("default values: the relay runs %q, not `walpost run`", args)
	}
}

// checkAllOn: every option on renders every kind the chart knows, both workloads and
// both jobs, and the ServiceMonitors label targets as the rules expect.
func (c *checker) checkAllOn(objects []object) {
	kinds := byKind(objects)
	for k := range kinds_() {
		if len(kinds[k]) == 0 {
			c.fail("all-on values: no %s rendered", k)
		}
	}
	for _, comp := range []string{"relay", "inbox"} {
		if deployment(objects, comp) == nil {
			c.fail("all-on values: no %s Deployment", comp)
		}
	}
	jobs := map[string]bool{}
	for _, o := range kinds["Job"] {
		jobs[o.head.Metadata.Labels["app.kubernetes.io/component"]] = true
	}
	if !jobs["migrate-outbox"] || !jobs["migrate-inbox"] {
		c.fail("all-on values: want the migrate-outbox and migrate-inbox Jobs, got %v", jobs)
	}
	jobLabels := map[string]bool{}
	for _, o := range kinds["ServiceMonitor"] {
		sm := o.typed.(*monitoringv1.ServiceMonitor)
		for _, ep := range sm.Spec.Endpoints {
			for _, r := range ep.RelabelConfigs {
				if r.TargetLabel == "job" && r.Replacement != nil {
					jobLabels[*r.Replacement] = true
				}
			}
		}
	}
	// deploy/prometheus/alerts.yml selects these jobs.
	if !jobLabels["walpost"] || !jobLabels["walpost-inbox"] {
		c.fail("all-on values: the ServiceMonitors do not set job=walpost and job=walpost-inbox (got %v)", jobLabels)
	}
}

// kinds_ lists the kinds of the decode table by kind name.
func kinds_() map[string]bool {
	out := map[string]bool{}
	for k := range kinds {
		out[k[strings.LastIndex(k, "/")+1:]] = true
	}
	return out
}

var secretishKey = regexp.MustCompile(`(?i)(password|passwd|secret|token|credential|pem)`)

// checkSchemaTakesNoSecret: no value of the chart can hold a secret. A property whose name
// looks like one must be a reference to a Secret (an object of name and key), or a
// Secret's name; never a string that would hold the secret itself.
func (c *checker) checkSchemaTakesNoSecret(file string) {
	text, err := os.ReadFile(file)
	if err != nil {
		c.fail("%v", err)
		return
	}
	var schema map[string]any
	if err := json.Unmarshal(text, &schema); err != nil {
		c.fail("%s: %v", file, err)
		return
	}
	var walk func(at string, node any)
	walk = func(at string, node any) {
		m, ok := node.(map[string]any)
		if !ok {
			return
		}
		if props, ok := m["properties"].(map[string]any); ok {
			for name, p := range props {
				pm, _ := p.(map[string]any)
				if secretishKey.MatchString(name) && name != "secretName" {
					ref, _ := pm["$ref"].(string)
					isRef := ref == "#/$defs/secretRef"
					isList := pm["type"] == "array"
					if !isRef && !isList {
						c.fail("%s: %s%s looks like a secret but is not a reference to one (#/$defs/secretRef)", file, at, name)
					}
				}
				walk(at+name+".", p)
			}
		}
		for _, k := range []string{"items", "$defs", "additionalProperties"} {
			switch v := m[k].(type) {
			case map[string]any:
				if k == "$defs" {
					for name, d := range v {
						walk("$defs."+name+".", d)
					}
				} else {
					walk(at, v)
				}
			}
		}
	}
	walk("", schema)
}
