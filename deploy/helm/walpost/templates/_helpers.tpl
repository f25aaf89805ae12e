{{/*
Names, labels and the pieces every walpost pod shares. Components pass a dict:
  root: the top context ($), component: relay | inbox | retention | migrate-outbox | migrate-inbox,
  c: the component's values (postgres, kafka, extraEnv, ...).
*/}}

{{- define "walpost.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "walpost.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* <fullname>-<component>, short enough for a CronJob (52) and its Jobs' pods. */}}
{{- define "walpost.componentName" -}}
{{- printf "%s-%s" (include "walpost.fullname" .root | trunc 36 | trimSuffix "-") .component }}
{{- end }}

{{- define "walpost.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "walpost.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: walpost
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "walpost.componentLabels" -}}
{{ include "walpost.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "walpost.selectorLabels" -}}
app.kubernetes.io/name: {{ include "walpost.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "walpost.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "walpost.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "walpost.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
The secret guard. Helm values end up in the release record and the rendered manifests
(ConfigMaps, the pod spec), readable by whoever can read those: a password there is a
leaked password. walpost.refuseSecretText fails the render when a text carries one: a
URL with user:password@, a password=... parameter, or a secret librdkafka property. The
message names where, never the value. Takes: where (a values path), text.
*/}}
{{- define "walpost.refuseSecretText" -}}
{{- $text := toString .text }}
{{- if regexMatch "[a-zA-Z][a-zA-Z0-9+.-]*://[^/@?#\\s\"',]*:[^/@?#\\s\"']*@" $text }}
{{- fail (printf "%s holds a URL with a password (user:password@host): put the password in a Secret and name it (postgres.passwordSecret for PostgreSQL; registry.passwordSecret for the schema registry)" .where) }}
{{- end }}
{{- if regexMatch "(?i)(^|[\\s?&\"';])password\\s*=" $text }}
{{- fail (printf "%s holds a password= parameter: put the password in a Secret and name it (postgres.passwordSecret)" .where) }}
{{- end }}
{{- if regexMatch "(sasl\\.password|sasl\\.oauthbearer\\.client\\.secret|ssl\\.key\\.password|ssl\\.keystore\\.password|ssl\\.key\\.pem)[\"']?\\s*=" $text }}
{{- fail (printf "%s sets a secret Kafka property: give it from a Secret with kafka.secretProperties (a WALPOST_KAFKA_* variable) instead" .where) }}
{{- end }}
{{- end }}

{{/* Every text a component's values can carry into the manifests, checked. Takes: where, c. */}}
{{- define "walpost.refuseSecrets" -}}
{{- $c := .c }}
{{- with $c.postgres }}{{ include "walpost.refuseSecretText" (dict "where" (printf "%s.postgres.url" $.where) "text" .url) }}{{ end }}
{{- if hasKey $c "config" }}{{ include "walpost.refuseSecretText" (dict "where" (printf "%s.config" .where) "text" $c.config) }}{{ end }}
{{- range $i, $a := $c.extraArgs }}
{{- include "walpost.refuseSecretText" (dict "where" (printf "%s.extraArgs[%d]" $.where $i) "text" $a) }}
{{- end }}
{{- range $i, $e := $c.extraEnv }}
{{- if hasKey $e "value" }}
{{- if regexMatch "(?i)(password|passwd|secret|token|credential|_pem$|private_key)" $e.name }}
{{- fail (printf "%s.extraEnv[%d] (%s) looks like a secret and has a plain value: use valueFrom.secretKeyRef" $.where $i $e.name) }}
{{- end }}
{{- include "walpost.refuseSecretText" (dict "where" (printf "%s.extraEnv[%d] (%s)" $.where $i $e.name) "text" $e.value) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Where the password file is copied to, and read from (WALPOST_POSTGRES_PASSWORD_FILE). */}}
{{- define "walpost.passwordFile" -}}/run/walpost/secrets/postgres-password{{- end }}

{{/*
The PostgreSQL password from a Secret, as the owner-only file walpost requires: walpost
refuses a password file that group or others may read, and the kubelet makes Secret files
root's (unreadable to uid 10001) or, with fsGroup, group-readable. So an init container
copies the key into an in-memory emptyDir, owned by the pod's user, mode 0400.
Takes: root, secret ({name, key}). Renders an init container (list item) when set.
*/}}
{{- define "walpost.passwordInit" -}}
{{- if .secret.name }}
- name: password-file
  image: {{ include "walpost.image" .root }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command: ["install", "-m", "0400", "/run/walpost/secret-src/password", {{ include "walpost.passwordFile" . | quote }}]
  securityContext:
    {{- toYaml .root.Values.containerSecurityContext | nindent 4 }}
  resources:
    requests:
      cpu: 10m
      memory: 8Mi
    limits:
      memory: 16Mi
  volumeMounts:
    - name: password-src
      mountPath: /run/walpost/secret-src
      readOnly: true
    - name: secrets
      mountPath: /run/walpost/secrets
{{- end }}
{{- end }}

{{/* The volumes behind walpost.passwordInit. Takes: secret. */}}
{{- define "walpost.passwordVolumes" -}}
{{- if .secret.name }}
- name: password-src
  secret:
    secretName: {{ .secret.name }}
    defaultMode: 0440
    items:
      - key: {{ .secret.key }}
        path: password
- name: secrets
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end }}
{{- end }}

{{- define "walpost.passwordMount" -}}
{{- if .secret.name }}
- name: secrets
  mountPath: /run/walpost/secrets
  readOnly: true
{{- end }}
{{- end }}

{{/*
The variables every walpost container gets. Takes: root, c (component values with
postgres, kafka?, registry?, logFormat?, logLevel?), password ({name, key}: the secret in
use, which may come from another component), url (the PostgreSQL URL in use).
*/}}
{{- define "walpost.env" -}}
{{- if .url }}
- name: WALPOST_POSTGRES
  value: {{ .url | quote }}
{{- end }}
{{- if .password.name }}
- name: WALPOST_POSTGRES_PASSWORD_FILE
  value: {{ include "walpost.passwordFile" . | quote }}
{{- end }}
{{- with .c.logFormat }}
- name: WALPOST_LOG_FORMAT
  value: {{ . | quote }}
{{- end }}
{{- with .c.logLevel }}
- name: WALPOST_LOG
  value: {{ . | quote }}
{{- end }}
{{- with .c.kafka }}
{{- with .brokers }}
- name: WALPOST_KAFKA_BROKERS
  value: {{ . | quote }}
{{- end }}
{{- range .secretProperties }}
- name: {{ printf "WALPOST_KAFKA_%s" (.property | upper | replace "." "_") }}
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .key }}
{{- end }}
{{- end }}
{{- with .c.registry }}
{{- if .passwordSecret.name }}
- name: WALPOST_REGISTRY_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .passwordSecret.name }}
      key: {{ .passwordSecret.key }}
{{- end }}
{{- if .tokenSecret.name }}
- name: WALPOST_REGISTRY_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .tokenSecret.name }}
      key: {{ .tokenSecret.key }}
{{- end }}
{{- end }}
{{- end }}

{{/* Secret files (TLS material): read-only, group-readable for fsGroup. Takes: mounts. */}}
{{- define "walpost.secretMountVolumes" -}}
{{- range .mounts }}
- name: {{ .name }}
  secret:
    secretName: {{ .secretName }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{- define "walpost.secretMountMounts" -}}
{{- range .mounts }}
- name: {{ .name }}
  mountPath: {{ .mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{/* Probes on the metrics listener. Takes: path, p (periodSeconds, ...). */}}
{{- define "walpost.probe" -}}
httpGet:
  path: {{ .path }}
  port: metrics
periodSeconds: {{ .p.periodSeconds }}
timeoutSeconds: {{ .p.timeoutSeconds }}
failureThreshold: {{ .p.failureThreshold }}
{{- end }}
