package main

import (
	"path"
	"regexp"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// pod is a pod template of a rendered workload.
type pod struct {
	owner  string
	labels map[string]string
	spec   *corev1.PodSpec
	hook   bool
}

func podOf(o object) (pod, bool) {
	switch t := o.typed.(type) {
	case *appsv1.Deployment:
		return pod{owner: o.head.String(), labels: t.Spec.Template.Labels, spec: &t.Spec.Template.Spec}, true
	case *batchv1.Job:
		_, hook := t.Annotations["helm.sh/hook"]
		return pod{owner: o.head.String(), labels: t.Spec.Template.Labels, spec: &t.Spec.Template.Spec, hook: hook}, true
	case *batchv1.CronJob:
		tpl := &t.Spec.JobTemplate.Spec.Template
		return pod{owner: o.head.String(), labels: tpl.Labels, spec: &tpl.Spec}, true
	}
	return pod{}, false
}

// secretName: a variable whose plain value would be a secret.
var secretName = regexp.MustCompile(`(?i)(password|passwd|secret|token|credential|_pem$|private_key)`)

// passwordInText: a URL with user:password@, or a password= parameter.
var passwordInText = regexp.MustCompile(`(?i)([a-z][a-z0-9+.-]*://[^/@?#\s"',]*:[^/@?#\s"']*@|(^|[\s?&"';])password\s*=)`)

func allContainers(s *corev1.PodSpec) []corev1.Container {
	return append(slices.Clone(s.InitContainers), s.Containers...)
}

// checkPod holds a pod template to the chart's promises. doc: walpost's configuration
// reference.
func (c *checker) checkPod(where string, p pod, doc configDoc) {
	s := p.spec
	at := where + ": " + p.owner
	// Security: the pod and every container.
	sc := s.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		c.fail("%s: securityContext.runAsNonRoot is not true", at)
	}
	if sc != nil && sc.RunAsUser != nil && *sc.RunAsUser == 0 {
		c.fail("%s: securityContext.runAsUser is 0", at)
	}
	if sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		c.fail("%s: securityContext.seccompProfile is not RuntimeDefault", at)
	}
	if s.HostNetwork || s.HostPID || s.HostIPC {
		c.fail("%s: shares a host namespace", at)
	}
	if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken {
		c.fail("%s: automountServiceAccountToken is not false (walpost never calls the API)", at)
	}
	if p.hook && s.ServiceAccountName != "" {
		c.fail("%s: a hook Job names service account %q, which a pre-install hook runs before", at, s.ServiceAccountName)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range s.Volumes {
		if v.HostPath != nil {
			c.fail("%s: volume %s is a hostPath", at, v.Name)
		}
		if _, dup := volumes[v.Name]; dup {
			c.fail("%s: volume %s twice", at, v.Name)
		}
		volumes[v.Name] = v
	}
	mounted := map[string]bool{}
	for _, ct := range allContainers(s) {
		cat := at + " container " + ct.Name
		csc := ct.SecurityContext
		switch {
		case csc == nil:
			c.fail("%s: no securityContext", cat)
		default:
			if csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation {
				c.fail("%s: allowPrivilegeEscalation is not false", cat)
			}
			if csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem {
				c.fail("%s: readOnlyRootFilesystem is not true", cat)
			}
			if csc.Privileged != nil && *csc.Privileged {
				c.fail("%s: privileged", cat)
			}
			if csc.Capabilities == nil || !slices.Contains(csc.Capabilities.Drop, "ALL") || len(csc.Capabilities.Add) > 0 {
				c.fail("%s: capabilities are not drop [ALL] with nothing added", cat)
			}
			if csc.RunAsUser != nil && *csc.RunAsUser == 0 {
				c.fail("%s: runAsUser 0", cat)
			}
		}
		if ct.Image == "" {
			c.fail("%s: no image", cat)
		}
		if ct.Resources.Requests.Memory().IsZero() || ct.Resources.Limits.Memory().IsZero() {
			c.fail("%s: no memory request or limit", cat)
		}
		for _, m := range ct.VolumeMounts {
			// A mount inside another one fails at container start when the outer one is
			// read-only (the runtime cannot create the mount point); none is needed.
			for _, outer := range ct.VolumeMounts {
				if strings.HasPrefix(m.MountPath, strings.TrimSuffix(outer.MountPath, "/")+"/") {
					c.fail("%s: %s is mounted inside %s", cat, m.MountPath, outer.MountPath)
				}
			}
			if _, ok := volumes[m.Name]; !ok {
				c.fail("%s: mounts volume %s, which the pod does not have", cat, m.Name)
			}
			mounted[m.Name] = true
		}
		c.checkEnv(cat, ct, doc)
		c.checkProbes(cat, ct)
	}
	for name := range volumes {
		if !mounted[name] {
			c.fail("%s: volume %s is mounted by no container", at, name)
		}
	}
	if len(s.Containers) != 1 || s.Containers[0].Name != "walpost" {
		c.fail("%s: want one container named walpost", at)
		return
	}
	main := s.Containers[0]
	if len(main.Args) == 0 || !slices.Contains([]string{"run", "inbox", "retention", "migrate"}, main.Args[0]) {
		c.fail("%s: args %q do not start with a walpost command", at, main.Args)
	}
	c.checkPasswordFile(at, s, main, volumes)
	for _, ic := range s.InitContainers {
		if ic.Image != main.Image {
			c.fail("%s: init container %s runs %s, not walpost's image %s", at, ic.Name, ic.Image, main.Image)
		}
	}
}

// checkEnv: no secret as a plain value; every WALPOST_* variable one walpost reads (named
// in docs/configuration.md, which tests/configuration.rs holds to the code); the password
// file where an init container wrote it, owner-only, on an in-memory volume.
func (c *checker) checkEnv(at string, ct corev1.Container, doc configDoc) {
	seen := map[string]bool{}
	for _, e := range ct.Env {
		if seen[e.Name] {
			c.fail("%s: variable %s twice (the last one wins, silently)", at, e.Name)
		}
		seen[e.Name] = true
		if e.Value != "" && secretName.MatchString(e.Name) && !strings.HasSuffix(e.Name, "_FILE") {
			c.fail("%s: %s has a plain value; a secret must come from valueFrom.secretKeyRef", at, e.Name)
		}
		if passwordInText.MatchString(e.Value) || strings.Contains(e.Value, sentinel) {
			c.fail("%s: %s holds a password", at, e.Name)
		}
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef == nil && secretName.MatchString(e.Name) {
			c.fail("%s: %s takes its value from something other than a Secret", at, e.Name)
		}
		if strings.HasPrefix(e.Name, "WALPOST_") && !doc.reads(e.Name) {
			c.fail("%s: %s is not a variable walpost reads (docs/configuration.md does not name it)", at, e.Name)
		}
	}
}

// checkPasswordFile: WALPOST_POSTGRES_PASSWORD_FILE names a file that an init container
// of the pod wrote owner-only (walpost refuses any other) into an in-memory volume.
func (c *checker) checkPasswordFile(at string, s *corev1.PodSpec, main corev1.Container, volumes map[string]corev1.Volume) {
	file := ""
	for _, e := range main.Env {
		if e.Name == "WALPOST_POSTGRES_PASSWORD_FILE" {
			file = e.Value
		}
	}
	if file == "" {
		return
	}
	dir := path.Dir(file)
	volumeAt := func(ct corev1.Container) string {
		for _, m := range ct.VolumeMounts {
			if m.MountPath == dir {
				return m.Name
			}
		}
		return ""
	}
	name := volumeAt(main)
	v, ok := volumes[name]
	if !ok || v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory {
		c.fail("%s: WALPOST_POSTGRES_PASSWORD_FILE=%s is not on an in-memory emptyDir", at, file)
		return
	}
	for _, ic := range s.InitContainers {
		cmd := ic.Command
		if volumeAt(ic) == name && len(cmd) > 0 && cmd[0] == "install" && slices.Contains(cmd, "0400") && cmd[len(cmd)-1] == file {
			return
		}
	}
	c.fail("%s: no init container writes %s with mode 0400", at, file)
}

func (c *checker) checkProbes(at string, ct corev1.Container) {
	if ct.Name != "walpost" {
		return
	}
	ports := map[string]bool{}
	for _, p := range ct.Ports {
		ports[p.Name] = true
	}
	for _, pr := range []struct {
		name  string
		probe *corev1.Probe
	}{{"liveness", ct.LivenessProbe}, {"readiness", ct.ReadinessProbe}} {
		if pr.probe == nil {
			continue
		}
		if pr.probe.HTTPGet == nil {
			c.fail("%s: %s probe is not an HTTP GET", at, pr.name)
			continue
		}
		port := pr.probe.HTTPGet.Port
		if port.StrVal == "" || !ports[port.StrVal] {
			c.fail("%s: %s probe's port %s is not a named port of the container", at, pr.name, port.String())
		}
	}
}
